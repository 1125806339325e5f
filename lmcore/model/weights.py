"""A file's tensors into a model, strictly: every name, shape and dtype checked, every problem
listed at once; a model whose parameters wait on the meta device gets the tensors themselves.

    check_dtypes(tensors, model.state_dict(), path)  # no silent narrowing or int -> float
    load_strict(model, tensors, path, "the model of ...")
    check_finite(tensors, path)                      # NaN or inf: a warning, or an error

Shared by every loader: lmcore checkpoints (`lmcore.checkpoint`), CS336 state dicts, Hugging
Face directories and GGUF files.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from lmcore.errors import CheckpointError, ConfigError, NonFiniteWeightsWarning
from lmcore.model.empty import assign
from lmcore.model.reading import listed

__all__ = ["check_dtypes", "check_finite", "device_of", "load_strict"]


def device_of(model: nn.Module) -> torch.device:
    """Where a model's weights go: its parameters' device, or its buffers' when the parameters
    are on meta awaiting their tensors (a model built empty for a file's tensors)."""
    tensors = [*model.parameters(), *model.buffers()]
    real = next((t.device for t in tensors if not t.is_meta), None)
    built = getattr(model, "build_device", None)
    return real or (built if isinstance(built, torch.device) else torch.device("cpu"))


def check_dtypes(
    tensors: Mapping[str, Tensor],
    expected: Mapping[str, Tensor],
    path: Path,
    error: type[CheckpointError] = CheckpointError,
) -> None:
    """`CheckpointError` naming each tensor whose dtype would change in a way that loses
    something: integers, booleans or complex numbers into floats, or a float narrowed (float32
    into bfloat16). Widening a float (bfloat16 into float32) is exact and allowed."""
    changed = []
    for name, t in tensors.items():
        want = expected.get(name)
        if want is None or t.dtype == want.dtype:
            continue
        exact = (
            t.is_floating_point()
            and want.is_floating_point()
            and torch.promote_types(t.dtype, want.dtype) == want.dtype
            and t.element_size() < want.element_size()
        )
        if not exact:
            changed.append(f"{name} ({_short(t.dtype)}, model {_short(want.dtype)})")
    if changed:
        raise error(
            f"{path}: tensors of another dtype than the model's, which loading would convert "
            f"without asking: {listed(changed)}; lmcore never changes a dtype silently: load "
            "with dtype= (--dtype) to convert every tensor, or fix the file"
        )


def check_finite(tensors: Mapping[str, Tensor], path: Path, nonfinite: str = "warn") -> None:
    """Report floating tensors holding NaN or infinite values: `NonFiniteWeightsWarning`
    ("warn"), `CheckpointError` ("error"), nothing ("ignore")."""
    if nonfinite not in ("warn", "error", "ignore"):
        raise ConfigError(f"nonfinite must be 'warn', 'error' or 'ignore', not {nonfinite!r}")
    if nonfinite == "ignore":
        return
    bad = []
    for name, t in tensors.items():
        # A finite sum means every value is finite (NaN and inf propagate), and costs no
        # temporaries as large as the tensor; only a sum that is not (an overflow, or a true
        # NaN/inf) is looked at element by element.
        if (
            t.is_floating_point()
            and not bool(torch.isfinite(t.sum()))
            and not bool(torch.isfinite(t).all())
        ):
            nan = int(torch.isnan(t).sum())
            inf = int(torch.isinf(t).sum())
            counts = ", ".join(f"{n:,} {w}" for n, w in ((nan, "NaN"), (inf, "inf")) if n)
            bad.append(f"{name} ({counts})")
    if not bad:
        return
    message = (
        f"{path}: holds weights that are not finite: {listed(bad)}; the model's outputs will "
        "not be finite either (a run that diverged? a damaged file?)"
    )
    if nonfinite == "error":
        raise CheckpointError(message)
    warnings.warn(message, NonFiniteWeightsWarning, stacklevel=4)


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def load_strict(model: nn.Module, tensors: Mapping[str, Tensor], path: Path, what: str) -> None:
    """`model.load_state_dict(tensors, strict=True)`, after a check that lists every missing,
    unexpected and misshapen tensor in one `CheckpointError` about `path` and `what` it feeds.
    A model whose parameters wait on the meta device (built empty for them) gets the tensors
    themselves (`lmcore.model.empty.assign`, moved to its device and dtype)."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in tensors]
    unexpected = [k for k in tensors if k not in expected]
    misshapen = [
        f"{k} (file {tuple(tensors[k].shape)}, model {tuple(expected[k].shape)})"
        for k in expected
        if k in tensors and tensors[k].shape != expected[k].shape
    ]
    problems = [
        f"{label} ({len(names)}): {listed(names)}"
        for label, names in (
            ("missing", missing),
            ("unexpected", unexpected),
            ("wrong shape", misshapen),
        )
        if names
    ]
    if problems:
        raise CheckpointError(
            f"{path}: its tensors do not fit {what}: " + "; ".join(problems) + ". The file was "
            "changed after it was saved, or a plugin's parameters changed between versions "
            "(`lmcore describe` on the file shows the versions that saved it)"
        )
    if any(p.is_meta for p in model.parameters()):
        assign(model, tensors, device_of(model))
    else:
        model.load_state_dict(tensors, strict=True)
