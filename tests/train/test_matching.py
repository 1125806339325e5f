"""`--match params|flops`: a variant's d_ff chosen to match the baseline's size."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

import lmcore
from lmcore import Component, scoped_registry
from lmcore.errors import TrainError
from lmcore.train.matching import MatchError, match_width, measure, sets_d_ff
from lmcore.train.sweep import plan
from tests.helpers.errors import raises_naming

BASE = "vocab_size=256, context_length=32, d_model=64, num_layers=2, num_heads=4"


def built_non_embedding(spec: str) -> int:
    """Parameters of the built model outside the token embeddings and lm_head."""
    model = lmcore.build_model(spec)
    skip = ("token_embeddings.", "lm_head.")
    return sum(p.numel() for n, p in model.named_parameters() if not n.startswith(skip))


def test_an_ungated_ffn_gets_the_gated_ones_parameters() -> None:
    base = lmcore.resolve(BASE)  # swiglu, d_ff 192: 3 · 64 · 192 = 2 · 64 · 288
    m = match_width(base, lmcore.resolve(BASE + ", ffn=silu"), "params")
    assert (m.d_ff_before, m.d_ff, m.changed) == (256, 288, True)
    assert m.value == m.target == built_non_embedding(BASE)
    assert built_non_embedding(str(m.blueprint.spec)) == built_non_embedding(BASE)
    assert m.note == "d_ff 256→288 (+0.00%)"


def test_flops_per_token_match_within_one_percent() -> None:
    base = lmcore.resolve(BASE)
    variant = lmcore.resolve(BASE.replace("num_layers=2", "num_layers=3"))
    m = match_width(base, variant, "flops")
    assert abs(m.value / m.target - 1) <= 0.01 and m.d_ff < 192
    # 3 × forward FLOPs per token: the matmuls by 2·m·n·p, counted here independently
    d, T, V, L = 64, 32, 256, 3
    ffn = 3 * 2 * d * m.d_ff
    attn = 4 * 2 * d * d + 2 * 2 * T * d  # projections; QKᵀ and AV over a full context
    assert m.value == pytest.approx(3 * (L * (attn + ffn) + 2 * d * V))


def test_a_variant_within_one_percent_keeps_its_width() -> None:
    m = match_width(lmcore.resolve(BASE), lmcore.resolve(BASE + ", norm=none"), "params")
    assert not m.changed and m.note.startswith("d_ff 192 (as is, -0.")


def test_no_width_can_match() -> None:
    big = lmcore.resolve(BASE.replace("num_layers=2", "num_layers=12"))
    # 2 layers × (4·64·64 attention + 3·64·192 swiglu + 2·64 norms) + 64 for ln_final
    assert 2 * (4 * 64 * 64 + 3 * 64 * 192 + 2 * 64) + 64 == 106_816
    with raises_naming(MatchError, "--match params", "no d_ff makes 'deep' match",
                       "106,816 non-embedding parameters within 1%",
                       "even at d_ff=1 the rest of the model is larger"):  # fmt: skip
        match_width(lmcore.resolve(BASE), big, "params", label="'deep'")


class Fixed(nn.Module):
    def __init__(self, d_model: int, device: object = None, dtype: object = None):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


@pytest.fixture
def fixed_ffn() -> Iterator[None]:
    with scoped_registry() as registry:
        registry.add(
            Component(kind="ffn", name="fixed", build=Fixed, params=lambda d_model: d_model)
        )
        yield


def test_an_ffn_without_d_ff_cannot_be_matched(fixed_ffn: None) -> None:
    with pytest.raises(MatchError, match=r"its ffn 'fixed' does not grow with d_ff"):
        match_width(lmcore.resolve(BASE), lmcore.resolve(BASE + ", ffn=fixed"), "params")


def test_the_plan_matches_every_variant_and_refuses_a_given_d_ff() -> None:
    runs = plan(BASE, ["ffn=silu", "pos=nope"], match="params")
    assert [r.matched.d_ff for r in runs[1:]] == [288, 192]  # type: ignore[union-attr]
    assert runs[1].blueprint.spec.d_ff == 288 and runs[0].matched is None
    assert measure(runs[1].blueprint, "params") == measure(runs[0].blueprint, "params")
    assert sets_d_ff("ffn=silu(d_ff=100)") and sets_d_ff("d_ff=100") and not sets_d_ff("ffn=silu")
    with raises_naming(TrainError, "--vary 'ffn=silu, d_ff=300' sets d_ff",
                       "the width --match params chooses"):  # fmt: skip
        plan(BASE, ["ffn=silu, d_ff=300"], match="params")
    with pytest.raises(TrainError, match=r"--match 'size': must be one of params, flops"):
        plan(BASE, ["ffn=silu"], match="size")


@pytest.mark.parametrize(
    "mixer",
    ["mixer=short_conv", "mixer=short_conv, mixer[1]=attention", "mixer=gated_deltanet", "mixer=mla"],
)
@pytest.mark.parametrize("what", ["params", "flops"])
def test_a_mixer_variant_is_matched_by_its_declarations(mixer: str, what: str) -> None:
    """A mixer's declared parameters and FLOPs decide the matched width: the built variant has
    the baseline's non-embedding parameters (within 1%)."""
    base = lmcore.resolve(BASE)
    m = match_width(base, lmcore.resolve(f"{BASE}, {mixer}"), what)  # type: ignore[arg-type]
    assert abs(m.value / m.target - 1) <= 0.01
    if what == "params":
        assert m.value == built_non_embedding(str(m.blueprint.spec))
        assert abs(built_non_embedding(str(m.blueprint.spec)) / built_non_embedding(BASE) - 1) <= 0.01
