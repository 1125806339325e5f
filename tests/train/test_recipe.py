"""Resolving the recipe's kinds: canonical specs, errors with their place and choices, the
provenance a run keeps, parameter groups by role."""

from __future__ import annotations

import pytest

import lmcore
from lmcore.errors import SpecError, TrainError
from lmcore.model.roles import roles_of
from lmcore.train.recipe import Recipe, param_groups, resolve_recipe, role_table


def test_canonical_specs_fill_in_defaults() -> None:
    assert str(resolve_recipe("schedule", "wsd").spec) == "wsd(decay=0.2,shape=sqrt)"
    assert str(resolve_recipe("schedule", " wsd( shape = linear ) ").spec) == (
        "wsd(decay=0.2,shape=linear)"
    )
    assert str(resolve_recipe("optimizer", "adamw").spec) == "adamw"


def test_unknown_names_and_arguments_say_what_there_is() -> None:
    with pytest.raises(SpecError, match=r"no installed plugin provides optimizer 'adamm' "
                       r"\(did you mean 'adamw'\?\)") as e:  # fmt: skip
        resolve_recipe("optimizer", "adamm")
    assert "^^^^^" in str(e.value)
    with pytest.raises(SpecError, match=r"schedule 'cosine' has no argument 'decay'"):
        resolve_recipe("schedule", "cosine(decay=0.1)")
    with pytest.raises(ValueError, match=r"'norm' is not a recipe kind; those are optimizer"):
        resolve_recipe("norm", "rmsnorm")


def test_a_model_component_is_not_a_recipe_one() -> None:
    with pytest.raises(SpecError, match=r"no installed plugin provides optimizer 'rmsnorm'"):
        resolve_recipe("optimizer", "rmsnorm")


def test_recipe_names_the_option_and_records_provenance() -> None:
    with pytest.raises(TrainError, match=r"^--schedule wsd\(decay=0\): argument 'decay' of "
                       r"schedule 'wsd' must be > 0.0"):  # fmt: skip
        Recipe.of("adamw", "wsd(decay=0)")
    record = Recipe.of("adamw", "constant").record()
    assert record["optimizer"]["spec"] == "adamw"
    version = record["schedule"].pop("version")
    assert isinstance(version, str) and version
    assert record["schedule"] == {"spec": "constant", "name": "constant", "plugin": "schedules",
                                  "dist": "lmcore-registry", "module": "lmcore_schedules"}


def test_groups_and_the_role_table() -> None:
    model = lmcore.build_model("cs336-tiny")
    groups, names = param_groups(model, roles_of(model), decay=("matrix",), weight_decay=0.1,
                                 lr=1e-3, multipliers={"gain": 0.5})  # fmt: skip
    table = role_table(groups)
    assert table["gain"]["lr_scale"] == 0.5 and table["gain"]["weight_decay"] == 0.0
    assert table["matrix"]["tensors"] == 3 * 7  # q, k, v, out, w1, w2, w3 in 3 layers
    assert table["matrix"]["weight_decay"] == 0.1 and table["head"]["weight_decay"] == 0.0
    total = sum(row["parameters"] for row in table.values())
    assert total == sum(p.numel() for p in model.parameters())
    assert sum(len(n) for n in names) == len(list(model.parameters()))
