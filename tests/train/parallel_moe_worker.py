"""Run by tests/train/test_parallel_moe.py under torchrun (2 CPU processes, gloo); not a test
module.

    torchrun --nproc-per-node 2 tests/train/parallel_moe_worker.py DATA OUT

Trains a mixture-of-experts model with DDP and with FSDP2, without the load-balancing loss (so
that two ranks must reproduce one process exactly) and with it (each rank balances its own
tokens, as a data-parallel run does).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from lmcore.train.config import TrainConfig
from lmcore.train.parallel import Distributed, distributed
from lmcore.train.trainer import train

BASE = "vocab_size=300, context_length=16, d_model=32, num_layers=2, num_heads=2, d_ff=32"
SPEC = f"{BASE}, ffn=moe(num_experts=4, top_k=2, aux_loss_coef=0.0)"
AUX = f"{BASE}, ffn=moe(num_experts=4, top_k=2, renormalize=true, aux_loss_coef=0.1)"
CONFIG = TrainConfig(steps=3, batch_size=8, eval_batches=1, eval_every=0, log_every=1,
                     save_every=0, keep=0, device="cpu", lr=3e-3, warmup=1)  # fmt: skip


def main(data: Path, out: Path) -> None:
    for mode in ("ddp", "fsdp"):
        train(SPEC, data, out / mode, CONFIG, parallel=Distributed(mode), echo=None)
        train(AUX, data, out / f"{mode}-aux", CONFIG, parallel=Distributed(mode), echo=None)


if __name__ == "__main__":
    torch.set_num_threads(1)
    with distributed("ddp"):  # joins torchrun's process group; each run makes its own Parallel
        main(Path(sys.argv[1]), Path(sys.argv[2]))
