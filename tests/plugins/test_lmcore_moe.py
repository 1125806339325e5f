"""ffn=moe, the declaration of lmcore.model.moe's layer: accounting of total and active
parameters, describe, spec errors, the kit on its variants, and the model around it: the cache
and save/load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import lmcore
from lmcore import build_model, get_registry
from lmcore.errors import SpecError
from lmcore.model.counting import account
from lmcore.model.generate import GREEDY
from lmcore.testing import CHECKS, Case, Settings, Target

BASE = "vocab_size=97, context_length=16, d_model=32, num_heads=2, d_ff=48"


SMALL = f"{BASE}, num_layers=2"


def test_total_and_active_parameters_and_flops_per_token() -> None:
    spec = f"{SMALL}, ffn=moe(num_experts=8, top_k=2, shared=swiglu(d_ff=16), shared_gate=sigmoid)"
    acc = account(spec, seq_len=8)
    model = build_model(spec)
    d, f = 32, 48
    expert, shared = 3 * d * f, 3 * d * 16
    row = acc.row("layers.*.ffn")
    assert row.params_each == 8 * d + 8 * expert + shared + d
    assert row.active_params == 2 * (8 * d + 2 * expert + shared + d)
    assert acc.params == sum(p.numel() for p in model.parameters())
    assert acc.params - acc.active_params == 2 * 6 * expert
    # per token: the router, two experts, the shared expert and its gate
    assert row.flops_each == 8 * (2 * d * 8 + 2 * 2 * expert + 2 * shared + 2 * d)
    assert acc.flops_per_token == acc.flops / 8


def test_describe_prints_total_and_active_parameters() -> None:
    from lmcore.cli.describe import describe_lines
    from lmcore.describe import describe

    lines = describe_lines(describe(f"{SMALL}, ffn=moe(num_experts=8, top_k=2, renormalize=true)"))
    acc = account(f"{SMALL}, ffn=moe(num_experts=8, top_k=2, renormalize=true)")
    line = next(x for x in lines if x.startswith("active parameters:"))
    assert f"{acc.active_params:,} of {acc.params:,}" in line and "FLOPs per token" in line
    assert not any(x.startswith("active parameters:") for x in describe_lines(describe(SMALL)))


@pytest.mark.parametrize(
    ("ffn", "message"),
    [
        ("moe(num_experts=4, top_k=5)", r"top_k=5 exceeds num_experts=4"),
        ("moe(softmax=after, renormalize=true)", r"softmax=after already gives top-k weights"),
        ("moe(shared_gate=sigmoid)", r"shared_gate=sigmoid gates the shared expert; give one"),
        ("moe(expert=swiglo)", r"swiglo.*did you mean 'swiglu'"),
        ("moe(expert=moe)", r"expert=moe.*: an expert is a plain feed-forward network"),
        ("moe(expert=swiglu(d_ff=64))", r"the experts' width is the moe's d_ff .*moe\(d_ff=64\)"),
        ("moe(softmax=later)", r"'softmax' of ffn 'moe' must be one of .*before"),
        ("moe(score=relu)", r"'score' of ffn 'moe' must be one of sigmoid, softmax, got 'relu'"),
        ("moe(score=sigmoid, softmax=after)", r"score=sigmoid has no softmax: drop softmax"),
        ("moe(softmax=after, score_bias=true)", r"score_bias=true chooses experts by their sc"),
        ("moe(softmax=after, n_group=2)", r"n_group=2, topk_group=0 chooses experts by th"),
        ("moe(num_experts=6, n_group=4)", r"n_group=4 does not divide num_experts=6; the ex"),
        ("moe(num_experts=8, n_group=8)", r"n_group=8 leaves 1 expert per group; a group's"),
        ("moe(n_group=2, topk_group=3)", r"topk_group=3 must lie within 0..n_group=2 \(0: all"),
        ("moe(n_group=4, topk_group=1, top_k=3)", r"top_k=3 exceeds the 2 experts of the topk_g"),
        ("moe(n_group=0)", r"'n_group' of ffn 'moe' must be >= 1"),
        ("moe(scale=0)", r"'scale' of ffn 'moe' must be > 0"),
    ],
)
def test_spec_errors_name_the_problem(ffn: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        lmcore.parse_spec(f"{SMALL}, ffn={ffn}")


def test_the_frontier_routing_is_accounted_exactly() -> None:
    """The router's bias is a parameter (active for every token), the score bias a persistent
    buffer (saved, not a parameter, as transformers' e_score_correction_bias); the spec of a
    model that does not use the new arguments is written as before."""
    ffn = ("moe(num_experts=8, top_k=2, score=sigmoid, n_group=4, topk_group=2, "
           "score_bias=true, router_bias=true, renormalize=true, scale=2.5, shared=swiglu)")  # fmt: skip
    acc = account(f"{SMALL}, ffn={ffn}", seq_len=8)
    model = build_model(f"{SMALL}, ffn={ffn}")
    d, f = 32, 48
    row = acc.row("layers.*.ffn")
    assert row.params_each == 8 * d + 8 + 9 * 3 * d * f
    assert row.active_params == 2 * (8 * d + 8 + 3 * 3 * d * f)
    assert acc.params == sum(p.numel() for p in model.parameters())
    assert "layers.0.ffn.score_bias" in model.state_dict()
    assert "layers.0.ffn.score_bias" not in dict(model.named_parameters())
    assert row.flops_each == 8 * (2 * d * 8 + 3 * 2 * 3 * d * f)
    assert "score" not in str(lmcore.parse_spec(f"{SMALL}, ffn=moe(num_experts=4)"))
    assert "score=sigmoid" in str(model.spec) and "scale=2.5" in str(model.spec)


KIT_VARIANTS = [
    (("softmax", "after"), ("top_k", 3)),
    (
        ("score", "sigmoid"),
        ("n_group", 2),
        ("topk_group", 1),
        ("score_bias", True),
        ("renormalize", True),
        ("scale", 2.5),
        ("shared", "swiglu"),
    ),
    (("shared", "gelu"), ("shared_gate", "sigmoid")),
    (("expert", "geglu"), ("num_experts", 3), ("top_k", 1)),
]


@pytest.mark.parametrize("overrides", KIT_VARIANTS, ids=[str(v) for v in KIT_VARIANTS])
def test_variants_pass_the_conformance_kit(overrides: tuple[tuple[str, Any], ...]) -> None:
    target = Target(get_registry().get("ffn", "moe"), overrides)
    for check in CHECKS:
        if check.applies_to(target):
            for variant in check.variants:
                Case(check, target, variant).run(Settings(compile_backend="aot_eager"))


MODELS = [
    f"{SMALL}, ffn=moe(num_experts=4, top_k=2, renormalize=true)",
    f"{SMALL}, num_kv_heads=1, ffn=moe(num_experts=3, top_k=1, softmax=after, shared=gelu(d_ff=16))",
]


@pytest.mark.parametrize("spec", MODELS)
def test_cached_greedy_decoding_equals_recomputing(spec: str) -> None:
    torch.manual_seed(0)
    model = build_model(spec).eval()
    prompt = torch.randint(0, 97, (2, 4))
    seq = prompt
    with torch.no_grad():
        for _ in range(8):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(model.generate(prompt, 8, GREEDY), seq[:, 4:])


@pytest.mark.parametrize("spec", MODELS)
def test_save_and_load_are_bitwise(spec: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_model(spec)
    path = model.save(tmp_path / "m.safetensors")
    torch.manual_seed(1)
    loaded = lmcore.load(path)
    x = torch.randint(0, 97, (2, 16))
    assert str(loaded.spec) == str(model.spec)
    assert torch.equal(loaded(x), model(x))


@pytest.mark.parametrize(
    "ffn, over",
    [
        ("moe(num_experts=3, top_k=1)", 0),
        ("moe(num_experts=5, shared=swiglu, shared_gate=sigmoid)", 0),
        # the FFN rows declare their modules (the layer and its Linears: three ungated)
        ("moe(num_experts=2, expert=gelu, shared=swiglu)", 0),
        ("moe(num_experts=4, shared=gelu, shared_gate=sigmoid)", 0),
    ],
)
def test_the_modules_declaration_is_what_the_build_makes(ffn: str, over: int) -> None:
    """What the size check counts for a mixture (host memory and build time grow with the
    experts, meta included) is the number of modules its build really makes, never fewer."""
    acc = account(f"cs336-tiny, num_layers=1, ffn={ffn}")
    model = build_model(acc.blueprint, device="meta")
    built = sum(1 for _ in model.layers[0].ffn.modules())
    assert acc.row("layers.*.ffn").modules_each == built + over


def test_a_million_experts_are_described_from_the_declarations() -> None:
    """No per-expert work in counting, and describe builds no probe of two million experts:
    it says so (was: killed at 120 s, 1.3 GB)."""
    import time

    from lmcore.describe import describe

    start = time.perf_counter()
    found = describe("tinystories, ffn=moe(num_experts=1000000)")
    assert time.perf_counter() - start < 5
    d, d_ff, e = 512, 1344, 10**6
    layer = 4 * d * d + 2 * d + d * e + e * 3 * d * d_ff  # the router, then each expert
    assert found.accounting.params == 4 * layer + 2 * 10_000 * d + d
    assert "not checked against a meta-device build" in found.unchecked
    assert f"{2 * (9 + 3 + 4 * e):,} module objects" in found.unchecked  # 9: the rest of a layer
    assert describe("tinystories, ffn=moe").unchecked == ""
