"""What a plugin declares, invoked: a factory, validate or declaration that raises, or a count
that is not a whole number, names the component and the plugin (and its distribution)."""

from __future__ import annotations

import re

import pytest
import torch

from lmcore import Component, build_model, resolve, scoped_registry
from lmcore.describe import describe
from lmcore.errors import PluginError, SpecError
from tests.helpers.errors import raises_naming


def boom(d_model: int) -> torch.nn.Module:
    raise RuntimeError("factory exploded")


def picky(d_model: int) -> None:
    raise TypeError("validate tripped over its own feet")


@pytest.mark.parametrize(
    "component, where, facts",
    [
        (Component(kind="norm", name="boom", build=boom), "build",
         ("module tests.test_components)", "its factory raised RuntimeError: factory exploded",
          re.compile(r"at .*test_components\.py:\d+"))),
        (Component(kind="norm", name="picky", build=torch.nn.Identity, validate=picky), "resolve",
         ("its validate raised TypeError: validate tripped over its own feet",)),
        (Component(kind="norm", name="countless", build=torch.nn.Identity, params=lambda d_model: 1 / 0), "describe",
         ("its params declaration raised ZeroDivisionError: division by zero",)),
        (Component(kind="norm", name="fractional", build=torch.nn.Identity, params=lambda d_model: d_model / 3), "describe",
         (re.compile(r"its params declaration gives params\(d_model=64\) = 21\.33+\d"),
          "it must give a whole number >= 0")),
    ],
    ids=["factory-raises", "validate-typeerror", "params-raises", "params-fraction"],
)  # fmt: skip
def test_every_plugin_fault_names_the_component_and_its_plugin(
    component: Component, where: str, facts: tuple[str | re.Pattern[str], ...]
) -> None:
    """The faults of the factory and the declarations; those of the module it returns are in
    tests/test_parts.py."""
    with scoped_registry() as reg:
        reg.add(component, name="faulty")
        spec = f"cs336-tiny, norm={component.name}"
        error = SpecError if where == "resolve" else PluginError
        named = f"norm '{component.name}' from registered in-process (plugin 'faulty', module "
        with raises_naming(error, named, *facts):
            if where == "resolve":
                resolve(spec)
            elif where == "build":
                build_model(spec, device="meta")
            else:
                describe(spec)


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
        raises_naming(
            PluginError,
            "its factory raised RuntimeError: factory exploded",
            re.compile(r"at .*faults_factory\.py:3$"),
        ) as e,
    ):
        build_model("cs336-tiny, norm=boom", device="meta")
    assert str(e.value).startswith(
        "norm 'boom' from lmcore-faults 2.1 (plugin 'faults', module faults_factory): "
    )
