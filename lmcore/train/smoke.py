"""Forward+backward smoke runs on random tokens, as `lmcore run` does them.

`run_steps` builds the model from a spec, feeds it random token ids, computes the next-token
cross-entropy (`lmcore.model.nn.cross_entropy`, the loss training uses too) and back-propagates;
it applies no update. It reports throughput, peak memory and which parameters, if any, the
gradient did not reach: a smoke test for any spec, including one made of third-party
components. Training on real data, with an optimizer, is `lmcore.train.trainer` (`lmcore train`).
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

import torch
from jaxtyping import Int
from torch import Tensor, nn

from lmcore.blueprint import Blueprint, resolve
from lmcore.errors import LmcoreError, ModelInputError, ModelTooLargeError
from lmcore.model.counting import account, format_bytes, memory_limit
from lmcore.model.inputs import resolve_device
from lmcore.model.nn import cross_entropy
from lmcore.model.transformer import build_model
from lmcore.registry import Registry
from lmcore.sources import Source
from lmcore.spec import ModelSpec

if TYPE_CHECKING:
    from lmcore.checkpoint import CheckpointInfo


class RunError(LmcoreError, ValueError):
    """A run cannot start: an unknown or unavailable device, a bad step count, ..."""


def random_tokens(
    vocab_size: int, batch: int, seq_len: int, generator: torch.Generator
) -> tuple[Int[Tensor, "B S"], Int[Tensor, "B S"]]:
    """`(inputs, targets)` from one random stream of `seq_len + 1` ids per row, on the CPU."""
    ids = torch.randint(0, vocab_size, (batch, seq_len + 1), generator=generator)
    return ids[:, :-1], ids[:, 1:]


def gradient_problems(model: nn.Module) -> list[str]:
    """`name: why` for every parameter whose gradient is missing, non-finite or all zero."""
    problems = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.grad is None:
            problems.append(f"{name}: no gradient")
        elif not bool(torch.isfinite(p.grad).all()):
            problems.append(f"{name}: non-finite gradient")
        elif not bool(p.grad.ne(0).any()):
            problems.append(f"{name}: zero gradient")
    return problems


@dataclass(frozen=True)
class RunResult:
    """What `run_steps` measured."""

    spec: ModelSpec
    device: str
    dtype: str
    params: int
    param_tensors: int
    batch: int
    seq_len: int
    losses: tuple[float, ...]
    timed_steps: int  # the first of several steps warms up and is not timed
    timed_seconds: float
    peak_memory: int | None  # bytes; None where the platform cannot say
    peak_memory_kind: str
    gradient_problems: tuple[str, ...]

    @property
    def steps(self) -> int:
        return len(self.losses)

    @property
    def tokens_per_second(self) -> float:
        return self.timed_steps * self.batch * self.seq_len / max(self.timed_seconds, 1e-9)

    @property
    def ok(self) -> bool:
        return all(math.isfinite(x) for x in self.losses) and not self.gradient_problems


Progress = Callable[[int, int, float], None]  # (step done, steps, loss)


def run_steps(
    spec: Source | Blueprint | ModelSpec | str,
    *,
    steps: int = 10,
    batch: int = 2,
    seq_len: int | None = None,
    device: str = "auto",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    progress: Progress | None = None,
    registry: Registry | None = None,
    weights: CheckpointInfo | str | os.PathLike[str] | None = None,
    max_bytes: int | None = None,
) -> RunResult:
    """Build the model and run `steps` forward+backward passes on random tokens.

    `seq_len` defaults to the shorter of 128 and the context length. `weights`: start from this
    lmcore checkpoint's weights (`lmcore.checkpoint.load_weights`) instead of random ones; a
    checkpoint's `Source` (`lmcore.sources`) brings its own.
    Before anything is allocated, the memory of the model and of one step (weights, buffers,
    gradients, declared activations, token ids) is checked against `max_bytes` (default: what
    the device has available), as `build_model` checks the model's.
    """
    if steps < 1 or batch < 1:
        raise RunError(f"steps and batch must be at least 1, got steps={steps}, batch={batch}")
    if not 0 <= seed < 2**64:
        raise RunError(f"seed must lie in 0 .. 2**64-1, got {seed}")
    dev = resolve_device(device)
    if isinstance(spec, Source):  # resolved already
        bp, weights = spec.blueprint, spec.info if weights is None else weights
    else:
        bp = resolve(spec, registry)
    ctx = bp.spec.context_length
    seq = min(128, ctx) if seq_len is None else seq_len
    if not 1 <= seq <= ctx:
        raise ModelInputError(
            f"sequence length {seq} does not fit context_length={ctx}; use 1..{ctx} "
            f"or raise context_length in the spec (e.g. '..., context_length={seq}')"
        )
    check_step_size(bp, batch=batch, seq_len=seq, device=dev, dtype=dtype, max_bytes=max_bytes)
    torch.manual_seed(seed)  # the weights come from the global generator
    model = build_model(bp, device=dev, dtype=dtype, max_bytes=max_bytes)
    if weights is not None:
        from lmcore.checkpoint import load_weights

        load_weights(model, weights)
    tokens = torch.Generator().manual_seed(seed)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)

    losses: list[float] = []
    start = time.perf_counter()
    for step in range(steps):
        if step == 1:  # the first step pays for lazy initialisation: time the rest
            _sync(dev)
            start = time.perf_counter()
        inputs, targets = random_tokens(model.spec.vocab_size, batch, seq, tokens)
        model.zero_grad(set_to_none=True)
        loss = cross_entropy(model(inputs.to(dev)), targets.to(dev))
        torch.autograd.backward(loss)
        losses.append(float(loss.detach()))  # also waits for the device
        if progress is not None:
            progress(step + 1, steps, losses[-1])
    _sync(dev)
    seconds = time.perf_counter() - start
    peak, kind = _peak_memory(dev)
    return RunResult(
        spec=model.spec,
        device=str(dev),
        dtype=str(dtype).removeprefix("torch."),
        params=sum(p.numel() for p in model.parameters()),
        param_tensors=len(list(model.parameters())),
        batch=batch,
        seq_len=seq,
        losses=tuple(losses),
        timed_steps=steps - 1 if steps > 1 else 1,
        timed_seconds=seconds,
        peak_memory=peak,
        peak_memory_kind=kind,
        gradient_problems=tuple(gradient_problems(model)),
    )


def check_step_size(
    bp: Blueprint,
    *,
    batch: int,
    seq_len: int,
    device: torch.device,
    dtype: torch.dtype,
    max_bytes: int | None,
) -> None:
    """Refuse (`ModelTooLargeError`, naming the total and the largest part) a run whose model
    and one forward+backward step need more than `max_bytes` (default: what `device` has
    available; activations a component does not declare are left out)."""
    acc = account(bp, batch=batch, seq_len=seq_len, dtype=dtype)
    size = dtype.itemsize
    parts = {
        "weights and buffers": acc.params * size + sum(r.buffers or 0 for r in acc.rows),
        "gradients": acc.params * size,
        "activations": acc.activations or 0,
        "token ids": 2 * batch * (seq_len + 1) * 8,  # inputs and targets, int64
    }
    total = sum(parts.values())
    limit, what = memory_limit(device, max_bytes)
    if limit is not None and total > limit:
        name, largest = max(parts.items(), key=lambda item: item[1])
        raise ModelTooLargeError(
            f"a step of batch {batch:,} × seq {seq_len:,} needs {format_bytes(total)} "
            f"({total:,} bytes), more than {what}; the largest part is {name} "
            f"({format_bytes(largest)}). Lower --batch or --seq, shrink the spec, or raise "
            "the limit with --max-bytes"
        )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_memory(device: torch.device) -> tuple[int | None, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "torch.cuda.max_memory_allocated"
    try:
        import resource
    except ImportError:  # Windows
        return None, "peak RSS (unavailable on this platform)"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kilobytes, macOS bytes.
    return (peak if sys.platform == "darwin" else peak * 1024), "peak RSS of this process"


class ProgressBar:
    """`[#########...........]  4/10  loss 9.2631  2.1 s` on one redrawn line of `stream`.

    Redrawn on every step when `stream` is a terminal; otherwise written once, when done, so
    logs do not fill with carriage returns.
    """

    def __init__(self, stream: TextIO | None = None, width: int = 24):
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.start = time.perf_counter()
        self.live = self.stream.isatty()

    def __call__(self, done: int, total: int, loss: float) -> None:
        if not self.live and done < total:
            return
        filled = self.width * done // total
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.perf_counter() - self.start
        line = f"[{bar}] {done:>{len(str(total))}}/{total}  loss {loss:.4f}  {elapsed:.1f} s"
        end = "\n" if done == total else ""
        self.stream.write(("\r" if self.live else "") + line + end)
        self.stream.flush()
