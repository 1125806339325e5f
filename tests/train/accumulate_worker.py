"""Run by tests/train/test_accumulate.py under torchrun (2 CPU processes, gloo); not a test module.

    torchrun --nproc-per-node 2 tests/train/accumulate_worker.py DATA OUT

Under DDP and FSDP2: the whole batch, 4 micro-batches a step, 4 micro-batches with every layer
recomputed, and 4 micro-batches synchronising after each (the no_sync hook off: the control of
the count). Each run's gradient reductions are counted (DDP's all-reduce buckets through a comm
hook, FSDP2's reduce-scatters) and rank 0 writes them to OUT/reductions.json.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lmcore.train.config import TrainConfig
from lmcore.train.parallel import Distributed, distributed
from lmcore.train.trainer import train

SPEC = "vocab_size=300, context_length=16, d_model=32, num_layers=2, num_heads=2"
CONFIG = TrainConfig(steps=4, batch_size=8, eval_batches=2, eval_every=2, log_every=1,
                     save_every=0, keep=0, device="cpu", lr=3e-3, warmup=1)  # fmt: skip
COUNT = {"n": 0}


class Counting(Distributed):
    """Distributed, counting the gradient reductions; `sync_always`: no accumulation without
    synchronisation (the control)."""

    def __init__(self, mode: str, sync_always: bool = False):
        super().__init__(mode)
        self.sync_always = sync_always

    def wrap(self, model: Any, optimizer: Any, names: Any, rebuild: Any = None) -> Any:
        wrapped, opt = super().wrap(model, optimizer, names, rebuild)
        if self.mode == "ddp":
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            # unannotated: DDP checks the annotations, which this module's are strings
            def counted(state, bucket):  # type: ignore[no-untyped-def]
                COUNT["n"] += 1
                return allreduce_hook(state, bucket)

            wrapped.register_comm_hook(None, counted)
        return wrapped, opt

    def no_sync(self, model: Any) -> Any:
        return contextlib.nullcontext() if self.sync_always else super().no_sync(model)


def main(data: Path, out: Path) -> None:
    reduce_scatter = dist.reduce_scatter_single

    def counted(*args: Any, **kwargs: Any) -> Any:
        COUNT["n"] += 1
        return reduce_scatter(*args, **kwargs)

    dist.reduce_scatter_single = counted  # FSDP2 calls it through the module, at call time
    counts = {}
    micro = dataclasses.replace(CONFIG, micro_batch=2)
    runs = {
        "full": (CONFIG, False),
        "micro": (micro, False),
        "recompute": (dataclasses.replace(micro, recompute="layers"), False),
        "synced-every-micro-batch": (micro, True),
    }
    for mode in ("ddp", "fsdp"):
        for name, (config, always) in runs.items():
            COUNT["n"] = 0
            train(SPEC, data, out / f"{mode}-{name}", config,
                  parallel=Counting(mode, sync_always=always), echo=None)  # fmt: skip
            counts[f"{mode}-{name}"] = COUNT["n"]
    if dist.get_rank() == 0:
        (out / "reductions.json").write_text(json.dumps(counts))


if __name__ == "__main__":
    torch.set_num_threads(1)
    with distributed("ddp"):  # joins torchrun's process group; each run makes its own Parallel
        main(Path(sys.argv[1]), Path(sys.argv[2]))
