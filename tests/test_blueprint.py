"""The resolved blueprint: one resolution per path, one rule for what components receive."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import lmcore.blueprint
from lmcore import Component, Registry, build_model, parse_spec, resolve, scoped_registry
from lmcore.accounting import account, describe
from lmcore.blueprint import Blueprint
from lmcore.cli import main
from lmcore.components import KINDS
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
        c for c in cases(Registry(), components=["rmsnorm"]) if c.check.name == "activations"
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
        assert bp.kwargs("attn") == {"num_heads": 4, "num_kv_heads": 4, "head_dim": 16}
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


def test_spec_module_is_grammar_only() -> None:
    source = (ROOT / "lmcore" / "spec.py").read_text(encoding="utf-8")
    imported = {
        node.module
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert "lmcore.registry" not in imported and "lmcore.blueprint" not in imported
    assert len(source.splitlines()) < 400


def test_resolve_rejects_what_is_not_a_spec() -> None:
    with pytest.raises(TypeError, match="expected a spec string, ModelSpec or Blueprint, got int"):
        resolve(5)  # type: ignore[arg-type]
