"""parametrization=mup: the init std of every role against Tensor Programs V's formulas at two
widths, the per-role learning rates in the run's parameter groups, the output multiplier and
the 1/d attention (against the standard model with those multipliers written out), the tied
rule, the spec's canonical form, a checkpoint round trip, and the optimizer it refuses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import lmcore
from lmcore import parse_spec
from lmcore.errors import SpecError, TrainError
from lmcore.model import transformer
from lmcore.model.parametrization import parametrize
from lmcore.model.roles import roles_of
from lmcore.train.config import TrainConfig
from lmcore.train.optim import make_optimizer, role_groups
from lmcore.train.recipe import resolve_recipe
from tests.helpers.errors import raises_naming

BASE = 64
SPEC = "vocab_size=512, context_length=16, d_model={w}, num_layers=2, num_heads=4, d_ff={f}"
# The std of a normal truncated at ±3σ, as a multiple of σ (scipy.stats.truncnorm(-3, 3).std()).
TRUNCATED = math.sqrt(1 - 6 * math.exp(-4.5) / math.sqrt(2 * math.pi) / math.erf(3 / math.sqrt(2)))


def mup(
    width: int, extra: str = "", rules: str = f"mup(base_width={BASE})"
) -> lmcore.TransformerLM:
    torch.manual_seed(0)
    return lmcore.TransformerLM(
        f"{SPEC.format(w=width, f=2 * width)}{extra}, parametrization={rules}"
    )


def expected_std(role: str, shape: tuple[int, ...], width: int, vocab: int, tied: bool) -> float:
    """Tensor Programs V, Table 8, scaled so that width BASE is the standard parametrization."""
    m = width / BASE
    if role == "matrix":  # hidden: var ∝ 1/fan_in, the standard σ at the base width
        out, fan_in = shape
        return math.sqrt(2 / (fan_in / m + out / m)) / math.sqrt(m)
    if role == "router":  # output-like (experts fixed): σ ∝ 1/fan_in
        experts, fan_in = shape
        return math.sqrt(2 / (fan_in / m + experts)) / m
    if role == "embedding":
        return math.sqrt(2 / (BASE + vocab)) if tied else 1.0
    assert role == "head"
    return math.sqrt(2 / (BASE + vocab))


@pytest.mark.parametrize("width", [64, 256])
@pytest.mark.parametrize("extra", ["", ", tie_embeddings=true", ", ffn=moe(num_experts=8)"])
def test_init_std_of_every_role_is_the_formula(width: int, extra: str) -> None:
    model = mup(width, extra)
    tied = "tie" in extra
    for name, role in roles_of(model).items():
        p = model.get_parameter(name)
        if role.name == "gain":
            assert torch.equal(p, torch.ones_like(p)), name  # as the norm built it
            continue
        shape = tuple(p.shape[-2:])
        want = expected_std(role.name, shape, width, 512, tied) * TRUNCATED
        assert p.std().item() == pytest.approx(want, rel=0.1), (name, role.name)
        assert p.abs().max().item() <= want / TRUNCATED * 3 + 1e-6, name  # truncated at ±3σ


def test_zero_head_starts_the_head_at_zeros() -> None:
    head = mup(128, rules=f"mup(base_width={BASE},zero_head=true)").lm_head.weight
    assert torch.equal(head, torch.zeros_like(head))


@pytest.mark.parametrize("width", [64, 256])
def test_learning_rates_by_role_are_base_width_over_width_for_hidden_matrices(width: int) -> None:
    model = mup(width, ", ffn=moe(num_experts=4)")
    config = TrainConfig(lr=1e-3, role_lr=("gain=2.0",))
    groups, _ = role_groups(model, config)
    for g in groups:
        hidden = g["role"] in ("matrix", "packed", "router")
        want = (BASE / width if hidden else 1.0) * (2.0 if g["role"] == "gain" else 1.0)
        assert g["lr_scale"] == pytest.approx(want), g["role"]
        assert g["lr"] == pytest.approx(1e-3 * want), g["role"]
    assert {g["role"] for g in groups} >= {"matrix", "router", "embedding", "head", "gain"}


def test_output_multiplier_and_attention_scale_are_the_standard_model_with_them_written_out() -> (
    None
):
    # width 256, base 64: m = 4; logits × 1/4, and q·k × 1/sqrt(4) of 1/sqrt(head_dim 64) = 1/16
    ours = mup(256)
    plain = lmcore.TransformerLM(
        SPEC.format(w=256, f=512) + ", logit_scale=0.25, query_scale=0.0625"
    )
    plain.load_state_dict(ours.state_dict())
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(ours(ids), plain(ids), rtol=1e-6, atol=1e-6)
    assert ours.logit_scale == 0.25


def test_at_the_base_width_every_multiplier_is_the_standard_one() -> None:
    ours = mup(BASE)
    assert ours.logit_scale == 1.0
    groups, _ = role_groups(ours, TrainConfig(lr=1e-3))
    assert all(g["lr_scale"] == 1.0 for g in groups)


def test_without_the_key_the_model_is_todays_byte_for_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    text = SPEC.format(w=128, f=256) + ", logit_scale=2.0"  # Falcon-H1's multiplier kept too
    assert "parametrization" not in str(parse_spec(text))
    assert parse_spec(f"{text}, parametrization=none") == parse_spec(text)
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    model = lmcore.TransformerLM(text)
    assert model.parametrization is None and model.logit_scale == 2.0
    state = torch.random.get_rng_state()
    assert parametrize(model) == 1.0  # draws nothing
    assert torch.equal(torch.random.get_rng_state(), state)
    # the model as it was before parametrizations: their two hooks taken out
    monkeypatch.setattr(transformer, "parametrize", lambda model: 1.0)
    monkeypatch.setattr(transformer, "query_factor", lambda bp: 1.0)
    torch.manual_seed(0)
    before = lmcore.TransformerLM(text)
    for (n, a), (_, b) in zip(model.state_dict().items(), before.state_dict().items(), strict=True):
        assert torch.equal(a, b), n
    assert torch.equal(model(ids), before(ids))


def test_canonical_form_round_trips_and_names_its_errors() -> None:
    spec = parse_spec("cs336-tiny, parametrization=mup(base_width=32)")
    assert str(spec).endswith(",parametrization=mup(base_width=32,zero_head=false)")
    assert parse_spec(str(spec)) == spec
    with raises_naming(SpecError, "mupp", "did you mean 'mup'"):
        parse_spec("cs336-tiny, parametrization=mupp")
    with raises_naming(SpecError, "base_widht", "did you mean 'base_width'"):
        parse_spec("cs336-tiny, parametrization=mup(base_widht=32)")
    with raises_naming(SpecError, "base_width", ">= 1"):
        parse_spec("cs336-tiny, parametrization=mup(base_width=0)")


def test_a_checkpoint_keeps_the_parametrization(tmp_path: Path) -> None:
    model = mup(128)
    model.save(tmp_path / "m.safetensors")
    again = lmcore.load(tmp_path / "m.safetensors")
    assert again.spec == model.spec and again.logit_scale == model.logit_scale
    ids = torch.randint(0, 512, (1, 16))
    torch.testing.assert_close(again(ids), model(ids), rtol=0, atol=0)


def test_an_optimizer_without_entrywise_updates_is_refused() -> None:
    model = mup(128)
    with raises_naming(TrainError, "--optimizer sgd", "parametrization=mup(base_width=64",
                       "'entrywise'", "adamw or lion"):  # fmt: skip
        make_optimizer(model, TrainConfig(optimizer="sgd"), resolve_recipe("optimizer", "sgd"))
    make_optimizer(model, TrainConfig(optimizer="lion"), resolve_recipe("optimizer", "lion"))


def test_a_run_records_the_parametrization_and_resumes_with_it(
    tiny_data: Path, tmp_path: Path
) -> None:
    from lmcore.train.trainer import resume, train

    spec = "vocab_size=300, context_length=16, d_model=64, num_layers=1, num_heads=2, parametrization=mup(base_width=32)"
    config = TrainConfig(steps=4, batch_size=2, lr=1e-3, eval_every=2, eval_batches=1, save_every=2)
    train(spec, tiny_data, tmp_path / "run", config, echo=None, stop_after=2)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["spec"] == str(parse_spec(spec))
    assert info["roles"]["matrix"]["lr_scale"] == 0.5 and info["roles"]["head"]["lr_scale"] == 1.0
    result = resume(tmp_path / "run", echo=None)
    assert result.status == "done" and result.step == 4
    model = lmcore.load(tmp_path / "run")
    assert model.logit_scale == 0.5 and model.spec == parse_spec(spec)
    with raises_naming(TrainError, "--optimizer sgd", "'entrywise'"):
        train(spec, tiny_data, tmp_path / "sgd", TrainConfig(steps=1, optimizer="sgd"), echo=None)
    assert not (tmp_path / "sgd").exists()  # refused before the run directory
