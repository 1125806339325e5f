"""Resolution, done once: a blueprint is never resolved again, by the model, the accounting,
`describe`, each command or the kit; what is not a spec is refused."""

from __future__ import annotations

import pytest

from lmcore import (
    Registry,
    build_model,
    parse_spec,
    resolve,
)
from lmcore.cli.main import main
from lmcore.describe import describe
from lmcore.model.counting import account


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


def test_resolve_rejects_what_is_not_a_spec() -> None:
    with pytest.raises(TypeError, match="expected a spec string, ModelSpec or Blueprint, got int"):
        resolve(5)  # type: ignore[arg-type]


def test_parse_spec_rejects_non_strings() -> None:
    with pytest.raises(TypeError, match="parse_spec expects a spec string, got int"):
        parse_spec(5)  # type: ignore[arg-type]
