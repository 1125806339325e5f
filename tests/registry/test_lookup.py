"""Looking a component or preset up: neither of two providers of one name wins, a qualifier
chooses, every qualified name lmcore suggests can be typed; did-you-mean, and failed plugins
named where a name is unknown."""

from __future__ import annotations

import re

import pytest
import torch

from lmcore import (
    AmbiguousComponentError,
    Component,
    ComponentNotFoundError,
    Preset,
    Registry,
    SpecError,
    build_model,
    parse_spec,
)
from tests.helpers.errors import raises_naming
from tests.helpers.plugins import BROKEN_IMPORT, OTHER_RMSNORM

Module = torch.nn.Module


def test_an_unknown_name_mentions_failed_plugins(make_dist, registry: Registry) -> None:
    make_dist(
        "lmcore-flash",
        entry_points={"flash": "flash_broken2"},
        modules={"flash_broken2": BROKEN_IMPORT},
    )
    with raises_naming(
        ComponentNotFoundError,
        "no installed plugin provides attn 'flash2'",
        "plugins that failed to load: 'flash' (lmcore-flash 1.0",
    ):
        registry.get("attn", "flash2")


def test_two_providers_of_one_name_neither_wins(make_dist, registry: Registry) -> None:
    make_dist(
        "other-norms",
        version="2.0",
        entry_points={"other": "other_norms_a"},
        modules={"other_norms_a": OTHER_RMSNORM},
    )
    entries = [e for e in registry.entries("norm") if e.name == "rmsnorm"]
    assert sorted(e.provenance.dist for e in entries) == ["lmcore-registry", "other-norms"]
    assert {e.status for e in entries} == {"shadowed"}
    both = (
        "norm 'rmsnorm' is provided by 2 plugins: lmcore-registry ",
        re.compile(r"; other-norms 2\.0 .*Neither is chosen for you"),
        "write one of lmcore-registry:rmsnorm, other-norms:rmsnorm",
    )
    with raises_naming(AmbiguousComponentError, *both):
        registry.get("norm", "rmsnorm")
    with raises_naming(SpecError, *both):
        parse_spec("tinystories, norm=rmsnorm")
    with raises_naming(SpecError, "default norm 'rmsnorm' is unavailable: ", *both):
        parse_spec("tinystories")

    model = build_model("tinystories, norm=other-norms:rmsnorm", device="meta")
    assert type(model.layers[0].ln1).__name__ == "OtherRMSNorm"
    assert str(model.spec).endswith(
        "norm=other-norms:rmsnorm,ffn=swiglu,pos=rope(theta=10000.0),attn=sdpa"
    )
    assert parse_spec(str(model.spec)) == model.spec
    # The qualifier is matched after PEP 503 normalisation.
    assert parse_spec("tinystories, norm=Other_Norms:rmsnorm") == model.spec
    builtin = build_model("tinystories, norm=lmcore-registry:rmsnorm", device="meta")
    assert type(builtin.layers[0].ln1).__name__ == "RMSNorm"


def test_qualifier_that_provides_nothing_lists_the_real_providers(
    make_dist, registry: Registry
) -> None:
    make_dist(
        "other-norms",
        entry_points={"other": "other_norms_b"},
        modules={"other_norms_b": OTHER_RMSNORM},
    )
    with raises_naming(
        ComponentNotFoundError,
        "'other-norm' does not provide norm 'rmsnorm'",
        "(did you mean 'other-norms'?)",
        "it is provided by lmcore-registry, other-norms",
    ):
        registry.get("norm", "rmsnorm", provider="other-norm")


def test_a_programmatic_duplicate_of_a_builtin_is_a_conflict(registry: Registry) -> None:
    registry.add(Component(kind="pos", name="rope", build=Module), name="my-rope")
    with pytest.raises(
        AmbiguousComponentError, match=r"write one of lmcore-registry:rope, my-rope:rope"
    ):
        registry.get("pos", "rope")
    assert registry.get("pos", "rope", provider="my-rope").provenance.plugin == "my-rope"


def test_a_preset_from_two_plugins_is_ambiguous(registry: Registry) -> None:
    small = "vocab_size=8, context_length=4, d_model=8, num_layers=1, num_heads=2"
    registry.add(Preset("tinystories", small), name="my-presets")
    with raises_naming(
        SpecError,
        "preset 'tinystories' is provided by 2 plugins",
        "write one of lmcore-registry:tinystories, my-presets:tinystories",
    ):
        parse_spec("tinystories", registry)
    assert parse_spec("my-presets:tinystories", registry) == parse_spec(small, registry)


@pytest.mark.parametrize("dist", ["2norms", "my norms"])
def test_every_qualified_name_lmcore_suggests_can_be_typed(make_dist, dist: str) -> None:
    module = "norms_" + dist.replace(" ", "_")
    make_dist(dist, entry_points={"theirs": module}, modules={module: OTHER_RMSNORM})
    registry = Registry()
    with pytest.raises(SpecError, match=r"write one of (.*), or disable one") as info:
        parse_spec("cs336-tiny", registry)
    suggested = re.search(r"write one of (.*), or disable", str(info.value))[1].split(", ")
    assert f'"{dist}":rmsnorm' in suggested and "lmcore-registry:rmsnorm" in suggested
    for name in suggested:  # each one, pasted into a spec, resolves to its provider
        spec = parse_spec(f"cs336-tiny, norm={name}", registry)
        assert parse_spec(str(spec), registry) == spec
    spec = parse_spec(f'cs336-tiny, norm="{dist}":rmsnorm', registry)
    assert f',norm="{dist}":rmsnorm,ffn=swiglu,' in str(spec)  # quoted when canonical


def test_did_you_mean_for_components_and_presets(registry: Registry) -> None:
    with raises_naming(
        ComponentNotFoundError,
        "no installed plugin provides ffn 'swigl'",
        "(did you mean 'swiglu'?)",
        re.compile(r"available ffn: .*swiglu"),
    ):
        registry.get("ffn", "swigl")
    with pytest.raises(
        ComponentNotFoundError, match=r"preset 'gpt2-smal' \(did you mean 'gpt2-small'\?\)"
    ):
        registry.get_preset("gpt2-smal")
