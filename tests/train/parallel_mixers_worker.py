"""Run by tests/train/test_parallel_mixers.py under torchrun (2 CPU processes, gloo); not a test
module.

    torchrun --nproc-per-node 2 tests/train/parallel_mixers_worker.py DATA OUT

Trains a model whose layers hold every built-in mixer with DDP and with FSDP2; two ranks must
reproduce one process.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from lmcore.train.config import TrainConfig
from lmcore.train.parallel import Distributed, distributed
from lmcore.train.trainer import train

# One layer of each built-in mixer.
SPEC = (
    "vocab_size=300, context_length=16, d_model=32, num_layers=6, num_heads=2, d_ff=32, "
    "mixer=short_conv, mixer[1]=attention, mixer[2]=gated_deltanet, mixer[3]=mla, "
    "mixer[4]=mamba2(d_state=16), mixer[5]=attention_mamba2(d_state=16)"
)
CONFIG = TrainConfig(steps=3, batch_size=8, eval_batches=1, eval_every=0, log_every=1,
                     save_every=0, keep=0, device="cpu", lr=3e-3, warmup=1)  # fmt: skip


def main(data: Path, out: Path) -> None:
    for mode in ("ddp", "fsdp"):
        train(SPEC, data, out / mode, CONFIG, parallel=Distributed(mode), echo=None)


if __name__ == "__main__":
    torch.set_num_threads(1)
    with distributed("ddp"):  # joins torchrun's process group; each run makes its own Parallel
        main(Path(sys.argv[1]), Path(sys.argv[2]))
