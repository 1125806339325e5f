"""The resolved blueprint: one resolution per path, one rule for what components receive."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import lmcore.blueprint
from lmcore import Component, Registry, build_model, parse_spec, resolve, scoped_registry
from lmcore.blueprint import Blueprint, divisors_near
from lmcore.cli.main import main
from lmcore.components import KINDS
from lmcore.describe import describe
from lmcore.errors import PluginError, SpecError
from lmcore.model.counting import account
from lmcore_sdpa import SDPA

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def resolutions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every spec text resolved while the test runs, in order."""
    seen: list[str] = []
    real = lmcore.blueprint._Resolver.resolve

    def counting(self: lmcore.blueprint._Resolver) -> Blueprint:
        seen.append(self.text)
        return real(self)

    monkeypatch.setattr(lmcore.blueprint._Resolver, "resolve", counting)
    return seen


def test_resolve_holds_the_canonical_spec_and_one_entry_per_kind() -> None:
    bp = resolve("tinystories, pos=nope")
    assert bp.spec == parse_spec("tinystories, pos=nope")
    assert str(bp) == str(bp.spec)
    assert set(bp.entries) == set(KINDS)
    assert bp.component("pos").name == "nope"
    assert bp.provenance("norm").dist == "lmcore-registry"


def test_a_blueprint_is_not_resolved_again(resolutions: list[str]) -> None:
    bp = resolve("cs336-tiny")
    assert resolve(bp) is bp
    model = build_model(bp, device="meta")
    acc = account(bp)
    assert model.blueprint is bp and acc.blueprint is bp
    assert resolutions == ["cs336-tiny"]


@pytest.mark.parametrize(
    "argv",
    [
        ["describe", "gpt2-xl"],
        ["describe", "cs336-tiny", "--measure", "--json"],
        ["build", "tinystories, pos=nope", "--device", "meta"],
        ["run", "cs336-tiny", "--steps", "1"],
    ],
)
def test_each_command_resolves_its_spec_once(
    argv: list[str], resolutions: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 0
    assert resolutions == [argv[1]], resolutions


def test_describe_from_a_string_resolves_once(resolutions: list[str]) -> None:
    found = describe("cs336-tiny, ffn=gelu", measure=True)
    assert found.accounting.spec.ffn.name == "gelu"
    assert resolutions == ["cs336-tiny, ffn=gelu"]


def test_the_kits_model_checks_resolve_each_model_once(resolutions: list[str]) -> None:
    from lmcore.testing import cases

    (case,) = [
        c
        for c in cases(Registry(), components=["rmsnorm"])
        if c.check.name == "activations" and not c.target.overrides
    ]
    case.run()
    # Two shapes × two dtypes × two batch shapes, each model resolved once.
    assert len(resolutions) == 8 and len(set(resolutions)) == 2


def plain_kernel() -> Component:
    """sdpa without the gqa feature: lmcore must repeat k and v for it."""
    return Component(
        kind="attn",
        name="plain",
        build=SDPA,
        flops=lambda num_heads, head_dim, seq_len, kv_len: (
            4 * num_heads * seq_len * kv_len * head_dim
        ),
        features=frozenset({"bias", "mask"}),
    )


def test_a_kernel_without_gqa_is_built_and_counted_for_num_heads() -> None:
    received: list[dict[str, int]] = []

    def build(num_heads: int, num_kv_heads: int, head_dim: int) -> SDPA:
        received.append({"num_heads": num_heads, "num_kv_heads": num_kv_heads})
        return SDPA()

    def flops(num_heads: int, num_kv_heads: int, head_dim: int, seq_len: int, kv_len: int) -> int:
        received.append({"num_heads": num_heads, "num_kv_heads": num_kv_heads})
        return 4 * num_heads * seq_len * kv_len * head_dim

    kernel = Component(kind="attn", name="plain", build=build, flops=flops)
    with scoped_registry() as reg:
        reg.add(kernel)
        bp = resolve("cs336-tiny, num_kv_heads=1, attn=plain")
        assert bp.kwargs("attn") == {"num_heads": 4, "num_kv_heads": 4, "head_dim": 16, "window": 0}
        assert resolve("cs336-tiny, num_kv_heads=1").kwargs("attn")["num_kv_heads"] == 1
        build_model(bp, device="meta")
        account(bp)
    assert received and all(r == {"num_heads": 4, "num_kv_heads": 4} for r in received)


@pytest.mark.parametrize("kv_heads", [1, 2])  # multi-query and grouped-query
def test_a_kernel_without_gqa_gives_the_logits_of_the_gqa_path(kv_heads: int) -> None:
    spec = f"cs336-tiny, num_kv_heads={kv_heads}"
    torch.manual_seed(0)
    gqa = build_model(spec)
    with scoped_registry() as reg:
        reg.add(plain_kernel())
        plain = build_model(f"{spec}, attn=plain")
    plain.load_state_dict(gqa.state_dict(), strict=True)
    ids = torch.randint(0, 10_000, (2, 16), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(plain(ids), gqa(ids), rtol=1e-5, atol=1e-5)
    assert not plain.blueprint.kernel_gqa and gqa.blueprint.kernel_gqa


@pytest.mark.parametrize("module", ["spec.py", "syntax.py"])
def test_spec_modules_are_grammar_only(module: str) -> None:
    source = (ROOT / "lmcore" / module).read_text(encoding="utf-8")
    imported = {
        node.module
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not {m for m in imported if m.startswith(("lmcore.registry", "lmcore.blueprint"))}
    # The grammar of keys, nested components and layer selections, and the canonical form.
    assert len(source.splitlines()) < 600


def test_resolve_rejects_what_is_not_a_spec() -> None:
    with pytest.raises(TypeError, match="expected a spec string, ModelSpec or Blueprint, got int"):
        resolve(5)  # type: ignore[arg-type]


# ------------------------------------------------------------------ bounded work (issue 11)


def test_the_divisor_suggestion_does_not_grow_with_d_model() -> None:
    """`describe "gpt2-small, d_model=1099511627776"` looped over every integer up to d_model
    (about 16 h); the suggestion now looks at a window around num_heads."""
    with pytest.raises(
        SpecError,
        match=r"d_model=1099511627776 is not divisible by num_heads=12; num_heads that divide it: 2, 4, 8, 16",
    ):
        parse_spec("gpt2-small, d_model=1099511627776")
    assert divisors_near(2**62, 7) == [1, 2, 4, 8]
    assert divisors_near(2**61 - 1, 12) == [1, 2**61 - 1]  # a prime: only 1 and itself
    assert divisors_near(512, 7) == [1, 2, 4, 8]
    assert divisors_near(3 * 5 * 7 * 11 * 13, 1000) == [715, 1001, 1155, 1365]


# ------------------------------------------------------------------ plugin faults (issue 11)


def ffn_with_default(width: object) -> Component:
    return Component(
        kind="ffn",
        name="odd",
        build=lambda d_model, d_ff: None,
        default_d_ff=lambda d_model: width,
    )


@pytest.mark.parametrize(
    "width, message",
    [
        (0, r"its default_d_ff gives default_d_ff\(d_model=64\) = 0; it must give a whole number >= 1"),
        (1382.4, r"its default_d_ff gives default_d_ff\(d_model=64\) = 1382.4; it must give a whole number >= 1"),
        ("wide", r"its default_d_ff gives default_d_ff\(d_model=64\) = 'wide'; it must give a whole number"),
        (2**63, r"default_d_ff of ffn 'odd' from registered in-process .* gives d_ff=9,223,372,036,854,775,808, beyond the largest integer a spec can hold \(2\*\*63 - 1\); give d_ff=... explicitly"),
    ],
)  # fmt: skip
def test_a_plugins_default_width_is_checked(width: object, message: str) -> None:
    with scoped_registry() as reg:
        reg.add(ffn_with_default(width), name="odd-ffns")
        with pytest.raises(
            SpecError, match=r"ffn 'odd' from registered in-process \(plugin 'odd-ffns'.*"
        ):
            parse_spec("cs336-tiny, ffn=odd")
        with pytest.raises(SpecError, match=message):
            parse_spec("cs336-tiny, ffn=odd")


def test_a_whole_float_default_width_is_taken_and_round_trips() -> None:
    with scoped_registry() as reg:
        reg.add(ffn_with_default(1344.0), name="odd-ffns")
        spec = parse_spec("cs336-tiny, ffn=odd")
        assert spec.d_ff == 1344 and type(spec.d_ff) is int
        assert parse_spec(str(spec)) == spec


class Squash(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., :1]


class Halve(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float16)


def picky(d_model: int) -> None:
    raise TypeError("validate tripped over its own feet")


def boom(d_model: int) -> torch.nn.Module:
    raise RuntimeError("factory exploded")


@pytest.mark.parametrize(
    "component, where, message",
    [
        (Component(kind="norm", name="boom", build=boom), "build",
         r"norm 'boom' from registered in-process \(plugin 'faulty', module test_blueprint\): its factory raised RuntimeError: factory exploded at .*test_blueprint.py:\d+"),
        (Component(kind="norm", name="void", build=lambda d_model: None), "build",
         r"norm 'void' from .*: its factory returned None, not a torch.nn.Module implementing lmcore.interfaces.Norm"),
        (Component(kind="norm", name="listy", build=lambda d_model: [1]), "build",
         r"norm 'listy' from .*: its factory returned a list, not a torch.nn.Module"),
        (Component(kind="norm", name="picky", build=torch.nn.Identity, validate=picky), "resolve",
         r"norm 'picky' from .*: its validate raised TypeError: validate tripped over its own feet"),
        (Component(kind="norm", name="countless", build=torch.nn.Identity, params=lambda d_model: 1 / 0), "describe",
         r"norm 'countless' from .*: its params declaration raised ZeroDivisionError: division by zero"),
        (Component(kind="norm", name="fractional", build=torch.nn.Identity, params=lambda d_model: d_model / 3), "describe",
         r"norm 'fractional' from .*: its params declaration gives params\(d_model=64\) = 21.33+\d; it must give a whole number >= 0"),
        (Component(kind="norm", name="squash", build=Squash), "forward",
         r"norm 'squash' from .* returned shape \(2, 8, 1\) torch.float32 for an input of shape \(2, 8, 64\) torch.float32; a norm must return its input's shape and dtype"),
        (Component(kind="norm", name="squash", build=Squash), "measure",
         r"norm 'squash' from .* returned shape \(1, 16, 1\) torch.float32 for an input of shape \(1, 16, 64\)"),
        (Component(kind="norm", name="halve", build=Halve), "forward",
         r"norm 'halve' from .* returned shape \(2, 8, 64\) torch.float16 for an input of shape \(2, 8, 64\) torch.float32"),
    ],
    ids=["factory-raises", "factory-none", "factory-list", "validate-typeerror", "params-raises",
         "params-fraction", "norm-changes-shape", "describe-measure-names-it", "norm-changes-dtype"],
)  # fmt: skip
def test_every_plugin_fault_names_the_component_and_its_plugin(
    component: Component, where: str, message: str
) -> None:
    with scoped_registry() as reg:
        reg.add(component, name="faulty")
        spec = f"cs336-tiny, norm={component.name}"
        error = SpecError if where == "resolve" else PluginError
        with pytest.raises(error, match=message):
            if where == "resolve":
                resolve(spec)
            elif where == "build":
                build_model(spec, device="meta")
            elif where == "describe":
                describe(spec)
            elif where == "measure":
                describe(spec, measure=True)
            else:
                build_model(spec)(torch.zeros(2, 8, dtype=torch.long))


def test_under_autocast_the_autocast_dtype_is_a_right_output_dtype() -> None:
    """bf16 autocast makes an FFN's matmuls return bfloat16 for float32 input: not a fault."""
    model = build_model("cs336-tiny")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(torch.zeros(2, 8, dtype=torch.long)).shape == (2, 8, 10000)
    with scoped_registry() as reg:
        reg.add(Component(kind="norm", name="halve", build=Halve), name="faulty")
        halving = build_model("cs336-tiny, norm=halve")
        with (
            torch.autocast("cpu", dtype=torch.bfloat16),
            pytest.raises(
                PluginError, match=r"norm 'halve' from .* returned shape \(2, 8, 64\) torch.float16"
            ),
        ):
            halving(torch.zeros(2, 8, dtype=torch.long))


def test_a_distributions_faulty_factory_names_the_distribution(make_dist) -> None:
    """The reproduction with an installed plugin: its name and version are in the message."""
    make_dist(
        "lmcore-faults",
        version="2.1",
        entry_points={"faults": "faults_factory"},
        modules={
            "faults_factory": "from lmcore import Component, hookimpl\n"
            "def boom(d_model):\n    raise RuntimeError('factory exploded')\n"
            "@hookimpl\ndef lmcore_components():\n"
            "    return [Component(kind='norm', name='boom', build=boom)]\n"
        },
    )
    with (
        scoped_registry(),
        pytest.raises(
            PluginError,
            match=r"^norm 'boom' from lmcore-faults 2.1 \(plugin 'faults', module faults_factory\): its factory raised RuntimeError: factory exploded at .*faults_factory.py:3$",
        ),
    ):
        build_model("cs336-tiny, norm=boom", device="meta")


def test_an_attention_kernel_returning_the_wrong_shape_is_named() -> None:
    class FirstHead(torch.nn.Module):
        def forward(self, q, k, v, *, causal, mask=None, bias=None):  # type: ignore[no-untyped-def]
            return SDPA()(q, k, v, causal=causal, mask=mask, bias=bias)[:, :1]

    kernel = Component(
        kind="attn", name="first-head", build=FirstHead, features=frozenset({"gqa", "bias", "mask"})
    )
    with scoped_registry() as reg:
        reg.add(kernel, name="faulty")
        model = build_model("cs336-tiny, attn=first-head")
        with pytest.raises(
            PluginError,
            match=r"attn 'first-head' from .* returned shape \(1, 1, 4, 16\) torch.float32 for q of shape \(1, 4, 4, 16\) torch.float32; a attn must return q's shape and dtype",
        ):
            model(torch.zeros(1, 4, dtype=torch.long))


def test_a_derived_width_beyond_the_integer_range_is_refused() -> None:
    text = "vocab_size=1, context_length=1, num_layers=1, num_heads=1, d_model=4611686018427387904, ffn=silu"
    with pytest.raises(
        SpecError, match=r"the default d_ff = 4·d_model gives d_ff=18,446,744,073,709,551,616"
    ):
        parse_spec(text)
