"""The weight-format kind's contracts (`quant=`, `lmcore.model.quant`), on one stored matrix of
random weights and on a small model stored in the format:

- `quantized_matmul`: ``x @ dequantize().T`` in float64 is the reference; the module's output
  lies within `MATMUL_TOL` of the reference's largest value, for one row (decoding: a
  quantized kernel) and for 24 (a prefill), and `rows(ids)` is `dequantize()[ids]` exactly;
- `quantized_rounding`: `quantize_(w)` then `dequantize()` is within `ROUND_TOL` of `w` (the
  format keeps the weights it is given);
- `stored_bytes`: the `stored` declaration is the bytes the module holds once it has run (its
  parameters and, where it keeps one, what its kernel keeps: `kernel_bytes()`);
- `quantized_state`: a model stored in the format, through safetensors, loads into a freshly
  built one, which then gives the same logits.

Every failure message names the component, the distribution it comes from and what is wrong.
"""

from __future__ import annotations

from typing import Any, Final

import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes
from torch import Tensor

from lmcore.errors import LmcoreError
from lmcore.testing.core import Settings, Target, check, fail, first_line, model_buildable
from lmcore.testing.recipe_checks import spec_text, who

IN, OUT = 64, 96  # one matrix: rows in blocks of 32, 96 rows (not a multiple of 64)
# Relative to the reference's largest value: a kernel may round x and its scales to bfloat16
# (8 bits of mantissa) on the way, as torch's fast CPU kernels do.
MATMUL_TOL: Final = 3e-2
# Of the weights' largest magnitude: 4-bit codes in groups have steps of range / 15.
ROUND_TOL: Final = 0.2
SPEC: Final = "vocab_size=97, context_length=16, d_model=64, num_layers=2, num_heads=2, d_ff=128"


def _matrix(target: Target) -> Any:
    part_kwargs = dict(target.overrides)
    try:
        return target.component.create(in_features=IN, out_features=OUT, role="matrix",
                                       **part_kwargs)  # fmt: skip
    except LmcoreError as e:
        fail(f"{who(target)}: cannot store a {OUT} x {IN} matrix: {first_line(e)}")


def _weights() -> Tensor:
    return torch.randn(OUT, IN, generator=torch.Generator().manual_seed(1234))


@check("quantized_matmul", ("quant",))
def quantized_matmul(target: Target, variant: str, settings: Settings) -> None:
    """Its matmul is x @ dequantize().T within MATMUL_TOL; rows() is dequantize()'s rows."""
    m = _matrix(target)
    m.quantize_(_weights())
    w = m.dequantize().double()
    for rows in (1, 24):
        x = torch.randn(rows, IN, generator=torch.Generator().manual_seed(rows))
        ref = x.double() @ w.T
        with torch.no_grad():
            got = m(x)
        if tuple(got.shape) != (rows, OUT) or got.dtype != x.dtype:
            fail(f"{who(target)}: for x of shape ({rows}, {IN}) float32 it gives "
                 f"{tuple(got.shape)} {got.dtype}; a weight format maps (..., in) to (..., out) "
                 "in x's dtype")  # fmt: skip
        worst = ((got.double() - ref).abs().max() / ref.abs().max()).item()
        if not worst <= MATMUL_TOL:
            fail(f"{who(target)}: its matmul of {rows} row(s) is {worst:.3g} of the largest "
                 f"value away from x @ dequantize().T (tolerance {MATMUL_TOL}): the kernel and "
                 "dequantize() disagree on the stored weights")  # fmt: skip
    ids = torch.tensor([0, 33, OUT - 1])
    if not torch.equal(m.rows(ids), m.dequantize()[ids]):
        fail(f"{who(target)}: rows(ids) differs from dequantize()[ids]; an embedding's lookup "
             "must give the stored matrix's rows")  # fmt: skip


@check("quantized_rounding", ("quant",))
def quantized_rounding(target: Target, variant: str, settings: Settings) -> None:
    """quantize_(w) then dequantize() gives w back within ROUND_TOL of its largest value."""
    m = _matrix(target)
    w = _weights()
    m.quantize_(w)
    back = m.dequantize()
    if tuple(back.shape) != (OUT, IN):
        fail(f"{who(target)}: dequantize() gives shape {tuple(back.shape)}, not ({OUT}, {IN})")
    worst = ((back - w).abs().max() / w.abs().max()).item()
    if not worst <= ROUND_TOL:
        fail(f"{who(target)}: quantize_(w) then dequantize() is {worst:.3g} of w's largest "
             f"value away from w (tolerance {ROUND_TOL}): it does not keep what it is "
             "given")  # fmt: skip


@check("stored_bytes", ("quant",))
def stored_bytes(target: Target, variant: str, settings: Settings) -> None:
    """The stored declaration is the bytes the module holds once it has run."""
    m = _matrix(target)
    m.quantize_(_weights())
    with torch.no_grad():
        m(torch.zeros(1, IN))
    held = sum(p.numel() * p.element_size() for p in m.parameters())
    held += sum(b.numel() * b.element_size() for b in m.buffers())
    held += int(getattr(m, "kernel_bytes", lambda: 0)())
    kwargs = {"in_features": IN, "out_features": OUT, "role": "matrix", **dict(target.overrides)}
    declared = target.entry.count("stored", kwargs)
    if declared != held:
        fail(f"{who(target)}: declares stored={declared} bytes for a {OUT} x {IN} matrix, but "
             f"its module holds {held:,} once it has run; fix its stored= declaration")  # fmt: skip


@check("quantized_state", ("quant",), needs=model_buildable)
def quantized_state(target: Target, variant: str, settings: Settings) -> None:
    """A model stored in the format round-trips through safetensors to the same logits."""
    from lmcore.model.transformer import build_model
    from lmcore.quantizing import quantize_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        try:
            plain = build_model(SPEC, registry=target.registry)
            model = quantize_model(plain, spec_text(target))
            fresh = build_model(str(model.spec), registry=target.registry)
        except LmcoreError as e:
            fail(f"{who(target)}: a model with quant={spec_text(target)} cannot be built: "
                 f"{first_line(e)}")  # fmt: skip
    fresh.load_state_dict(load_bytes(save_bytes({k: v.contiguous() for k, v in
                                                 model.state_dict().items()})))  # fmt: skip
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(5678))
    with torch.no_grad():
        a, b = model(ids), fresh(ids)
    if not torch.equal(a, b):
        fail(f"{who(target)}: a model loaded from its state dict gives other logits (max "
             f"|diff| {(a - b).abs().max().item():.3g}); the module's tensors must be all it "
             "needs")  # fmt: skip
