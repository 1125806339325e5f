"""A ladder's sizes: each rung's measure is the one below's times the factor (by `lmcore
describe`'s numbers and by the textbook count of the default components), every rung's
dimensions build, the tokens and steps follow the budget, and what no ladder can be is refused
with its reason."""

from __future__ import annotations

import math

import pytest

from lmcore.blueprint import resolve
from lmcore.describe import describe
from lmcore.ladder.sizing import (
    MIN_RUNGS,
    TOLERANCE,
    LadderError,
    check_memory,
    plan_markdown,
    size_ladder,
)
from lmcore.model.transformer import build_model

BASE = "vocab_size=300, context_length=16, d_model=32, num_layers=2, num_heads=2"


def non_embedding(spec: object) -> int:
    """Kaplan's N of a default model (RMSNorm, SwiGLU, RoPE, no biases), counted by hand: per
    layer the q/k/v/output projections, the three SwiGLU matrices and two norm gains; then
    the final norm."""
    s = resolve(str(spec)).spec
    attn = s.d_model * s.head_dim * (2 * s.num_heads + 2 * s.num_kv_heads)
    return s.num_layers * (attn + 3 * s.d_model * s.d_ff + 2 * s.d_model) + s.d_model


def described(bp: object, by: str) -> float:
    """The measure as `lmcore describe` reports it: its accounting's non-embedding rows, or
    three times its forward FLOPs per token."""
    acc = describe(bp).accounting  # type: ignore[arg-type]
    if by == "params":
        return sum(r.params for r in acc.rows if r.part not in ("embeddings", "lm_head"))
    return 3 * acc.flops / acc.seq_len


@pytest.mark.parametrize(("by", "factor"), [("params", 2.0), ("flops", 3.0)])
def test_each_rung_is_the_one_below_times_the_factor(by: str, factor: float) -> None:
    plan = size_ladder(BASE, ["pos=nope"], rungs=4, factor=factor, by=by, tokens_per_param=1,
                       batch_size=4)  # fmt: skip
    first = described(plan.rungs[0].baseline.blueprint, by)
    assert plan.rungs[0].baseline.blueprint.spec == resolve(BASE).spec  # rung 0: the base
    for k, rung in enumerate(plan.rungs):
        bp = rung.baseline.blueprint
        value = described(bp, by)
        assert value == pytest.approx(first * factor**k, rel=TOLERANCE)
        assert rung.target == pytest.approx(first * factor**k)
        assert rung.baseline.params == non_embedding(bp.spec) == described(bp, "params")
        assert rung.baseline.flops_per_token == described(bp, "flops")


def test_every_rung_keeps_the_bases_proportions_and_builds() -> None:
    base = (
        "vocab_size=300, context_length=16, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2"
    )
    plan = size_ladder(base, ["norm=layernorm"], rungs=5, factor=2.5, tokens_per_param=1,
                       batch_size=4)  # fmt: skip
    depths = []
    for rung in plan.rungs:
        for m in rung.models:
            s = m.blueprint.spec
            assert s.head_dim == 16 and s.d_model == 16 * s.num_heads  # the head's width kept
            assert s.num_heads == 2 * s.num_kv_heads  # two query heads per key/value head
            assert 2 <= s.d_ff / s.d_model <= 4  # around the base's 3
            model = build_model(m.blueprint, device="meta")
            total = sum(p.numel() for p in model.parameters())
            assert total == m.total
            embeddings = model.token_embeddings.weight.numel() + model.lm_head.weight.numel()
            assert total - embeddings == m.params
        depths.append(rung.baseline.blueprint.spec.num_layers)
    assert depths == sorted(depths) and depths[-1] > depths[0]  # deeper as well as wider
    aspect = [r.baseline.blueprint.spec.d_model / r.baseline.blueprint.spec.num_layers
              for r in plan.rungs]  # fmt: skip
    assert max(aspect) / min(aspect) < 2.5  # d_model / num_layers stays near the base's 32


def test_an_explicit_head_dim_is_kept() -> None:
    plan = size_ladder(f"{BASE}, head_dim=8", ["pos=nope"], rungs=3, factor=2, tokens_per_param=1)
    for rung in plan.rungs:
        s = rung.baseline.blueprint.spec
        assert s.head_dim == 8 and s.d_model == 16 * s.num_heads


def test_tokens_and_steps_follow_the_budget() -> None:
    plan = size_ladder(BASE, ["pos=nope"], rungs=3, factor=2, tokens_per_param=20, batch_size=4)
    for rung in plan.rungs:
        assert rung.steps == math.ceil(20 * rung.baseline.params / (4 * 16))
        assert rung.tokens == rung.steps * 4 * 16
        assert rung.compute == rung.baseline.flops_per_token * rung.tokens
    fixed = size_ladder(BASE, ["pos=nope"], rungs=3, factor=2, compute=1e10, batch_size=4)
    for rung in fixed.rungs:
        assert rung.steps == math.ceil(1e10 / rung.baseline.flops_per_token / (4 * 16))
        assert rung.compute == pytest.approx(
            1e10, rel=4 * 16 * rung.baseline.flops_per_token / 1e10
        )


def test_each_variant_is_matched_to_its_rung_or_its_mismatch_reported() -> None:
    matched = size_ladder(BASE, ["ffn=gelu"], rungs=3, factor=2, tokens_per_param=1)
    for rung in matched.rungs:
        base, variant = rung.models
        assert abs(variant.params / base.params - 1) <= 0.01  # --match's tolerance
        assert variant.relative == pytest.approx(variant.params / base.params - 1)
        assert variant.note.startswith("d_ff ")
    unmatched = size_ladder(BASE, ["ffn=gelu"], rungs=3, factor=2, tokens_per_param=1,
                            match=False)  # fmt: skip
    for rung in unmatched.rungs:
        base, variant = rung.models
        assert variant.blueprint.spec.d_ff == base.blueprint.spec.d_ff
        s = base.blueprint.spec  # GELU's two matrices where SwiGLU has three
        assert variant.params == base.params - s.num_layers * s.d_model * s.d_ff
        assert variant.relative == pytest.approx(variant.params / base.params - 1)
    learned = size_ladder(BASE, ["pos=learned"], rungs=3, factor=2, tokens_per_param=1)
    base, variant = learned.rungs[0].models
    assert variant.params == base.params  # its table is an embedding: not in N ...
    assert variant.total - base.total == 16 * 32  # ... but in every parameter


def test_the_plan_table_names_every_model_of_every_rung() -> None:
    plan = size_ladder(BASE, ["pos=nope"], rungs=3, factor=2, tokens_per_param=20, batch_size=4)
    plan = check_memory(plan, "cpu")
    text = plan_markdown(plan)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) == 6 and sum("`pos=nope`" in r for r in rows) == 3
    for rung in plan.rungs:
        assert (
            f"| {rung.index} | `baseline` | {rung.baseline.shape} | {rung.baseline.params:,} |"
            in text
        )
        assert f"| {rung.steps:,} |" in text
        assert rung.memory is not None and rung.memory > 0
    span = plan.rungs[-1].compute / plan.rungs[0].compute
    assert f"compute spans {span:.3g}×" in text


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"factor": 1.0}, r"--factor 1.0: must be a number above 1"),
        ({"factor": 0.5}, r"--factor 0.5: must be a number above 1"),
        ({"factor": math.nan}, r"--factor nan: must be a number above 1"),
        (
            {"rungs": MIN_RUNGS - 1},
            rf"--rungs {MIN_RUNGS - 1}: must be an integer from {MIN_RUNGS}",
        ),
        (
            {"rungs": 10, "factor": 100.0},
            r"the top rung would have 2.06e\+22 non-embedding .* lower --rungs or --factor",
        ),
        (
            {"by": "param"},
            r"--by 'param': must be one of params, flops \(did you mean 'params'\?\)",
        ),
        ({"tokens_per_param": None}, r"give one of --tokens-per-param R .* or --compute C"),
        ({"tokens_per_param": -1.0}, r"--tokens-per-param -1.0: must be a finite number above 0"),
        ({"changes": ["poss=nope"]}, r"unknown key 'poss' \(did you mean 'pos'\?\)"),
        ({"changes": ["pos=nope, d_model=64"]}, r"sets d_model, which the ladder chooses"),
        ({"changes": []}, r"--vary ITEMS is needed"),
        ({"base": f"{BASE}, window[0::2]=8"}, r"the base sets window per layer"),
    ],
)
def test_what_no_ladder_can_be_is_refused(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"base": BASE, "changes": ["pos=nope"], "rungs": 3, "factor": 2.0,
                               "tokens_per_param": 1.0}  # fmt: skip
    args.update(kwargs)
    base, changes = args.pop("base"), args.pop("changes")
    with pytest.raises(LadderError, match=match):
        size_ladder(base, changes, **args)  # type: ignore[arg-type]


def test_a_rung_that_does_not_fit_in_memory_is_refused() -> None:
    plan = size_ladder(BASE, ["pos=nope"], rungs=3, factor=4, tokens_per_param=1, batch_size=4)
    sized = check_memory(plan, "cpu", max_bytes=10**12)
    need = [r.memory for r in sized.rungs]
    assert need == sorted(need)
    limit = (need[1] + need[2]) // 2  # type: ignore[operator]
    with pytest.raises(
        LadderError,
        match=r"rung 2 \(d_model .* needs about .* to train \(AdamW, "
        r"batch 4 × 16\), more than the .* available on cpu; lower --rungs",
    ):
        check_memory(plan, "cpu", max_bytes=limit)
