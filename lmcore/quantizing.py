"""Quantizing a float model: `quantize_model(model, "int8")`, what `lmcore quantize` runs."""

from __future__ import annotations

from typing import Any

from lmcore.blueprint import resolve
from lmcore.errors import SpecError
from lmcore.model.empty import parameters_on_meta
from lmcore.model.quant import quantize_from
from lmcore.model.transformer import TransformerLM

__all__ = ["quantize_model"]


def quantize_model(model: Any, text: str) -> Any:
    """A new model: `model` (a float `TransformerLM`) with its matrices stored in the format
    `text` names (``int8``, ``q4_1(embedding=q8_0)``), resolved in the model's registry; its
    tokenizer kept. A model that is quantized already, or has an adapter, is refused."""
    bp = model.blueprint
    if bp.spec.quant is not None:
        raise SpecError(f"this model is quantized already (quant={bp.spec.quant}); quantize "
                        "the float model it came from")  # fmt: skip
    if bp.spec.adapter is not None:
        raise SpecError(f"this model has an adapter (adapter={bp.spec.adapter}); merge it "
                        "first (lmcore convert --merge)")  # fmt: skip
    new = resolve(f"{bp.spec},quant={text}", bp.registry)
    weight = model.lm_head.weight
    with parameters_on_meta():  # nothing allocated that the rounding replaces
        out = TransformerLM(new, device=weight.device, dtype=weight.dtype)
    quantize_from(out, model)
    out.tokenizer = model.tokenizer
    return out
