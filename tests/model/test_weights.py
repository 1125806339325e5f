"""A file's tensors into a model (`lmcore.model.weights`), strictly: every missing, unexpected and
misshapen tensor listed at once, no dtype changed silently (integers never become floats, floats
are widened but never narrowed), and non-finite weights reported."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import lmcore
from lmcore import CheckpointError
from lmcore.errors import NonFiniteWeightsWarning
from tests.helpers.errors import raises_naming, warns_naming
from tests.helpers.models import SMALL_SPEC as SMALL
from tests.helpers.models import non_finite_checkpoint, rewrite


def test_missing_unexpected_and_misshapen_tensors_are_all_listed(saved: Path) -> None:
    def damage(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        del state["layers.1.ffn.w3.weight"]
        del state["ln_final.weight"]
        state["layers.0.attn.bias"] = torch.zeros(32)
        state["lm_head.weight"] = torch.zeros(96, 32)
        return state

    rewrite(saved, tensors=damage)
    with raises_naming(
        CheckpointError,
        "m.safetensors: ",
        "the model its spec builds (vocab_size=97,",
        "missing (2): layers.1.ffn.w3.weight, ln_final.weight",
        "unexpected (1): layers.0.attn.bias",
        "wrong shape (1): lm_head.weight (file (96, 32), model (97, 32))",
        "changed after it was saved",
        "a plugin's parameters changed between versions",
    ):
        lmcore.load(saved)


def test_integer_tensors_are_refused_unless_a_dtype_is_asked_for(
    saved: Path, tmp_path: Path
) -> None:
    # The probe: int32 tensors were cast to float silently.
    def ints(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {**state, "ln_final.weight": torch.full((32,), 2, dtype=torch.int32)}

    bad = rewrite(saved, tensors=ints, out=tmp_path / "int.safetensors")
    with raises_naming(
        CheckpointError,
        f"{bad}: ",
        "another dtype than the model's",
        "ln_final.weight (int32, model float32)",
        "never changes a dtype silently",
        "dtype= (--dtype)",
        "or fix the file",
    ):
        lmcore.load(bad)
    asked = lmcore.load(bad, dtype=torch.float32)
    assert torch.equal(asked.ln_final.weight, torch.full((32,), 2.0))


def test_floats_are_widened_but_never_narrowed_silently(saved: Path, tmp_path: Path) -> None:
    def half(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {**state, "ln_final.weight": state["ln_final.weight"].to(torch.bfloat16)}

    widened = lmcore.load(rewrite(saved, tensors=half, out=tmp_path / "w.safetensors"))  # exact
    assert widened.ln_final.weight.dtype == torch.float32

    # A bfloat16 model with one float32 tensor: loading it would round that tensor.
    bf16 = lmcore.build_model(SMALL, dtype=torch.bfloat16).save(tmp_path / "bf16.safetensors")

    def wide(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {**state, "ln_final.weight": torch.full((32,), 1 + 2**-12)}  # not a bfloat16 value

    narrowed = rewrite(bf16, tensors=wide, out=tmp_path / "n.safetensors")
    with pytest.raises(CheckpointError, match=r"ln_final.weight \(float32, model bfloat16\)"):
        lmcore.load(narrowed)
    assert lmcore.load(narrowed, dtype=torch.bfloat16).ln_final.weight.dtype == torch.bfloat16


def test_non_finite_weights_warn_naming_the_tensor_or_fail_when_asked(tmp_path: Path) -> None:
    # The probe: a NaN in ln_final made greedy `generate` exit 0 with empty output, unannounced.
    path = non_finite_checkpoint(tmp_path)
    facts = (
        f"{path}: ",
        "weights that are not finite",
        "lm_head.weight (2 inf), ln_final.weight (1 NaN)",
        "outputs will not be finite either",
        "a run that diverged? a damaged file?",
    )
    with warns_naming(NonFiniteWeightsWarning, *facts) as caught:
        lmcore.load(path)
    with raises_naming(CheckpointError, *facts) as refused:
        lmcore.load(path, nonfinite="error")
    [warning] = [w for w in caught if w.category is NonFiniteWeightsWarning]
    assert str(refused.value) == str(warning.message)  # one message, warned or raised
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lmcore.load(path, nonfinite="ignore")
