"""The output check every built component gets: a factory that returns no module, or a module
that returns the wrong shape or dtype (under autocast, the autocast dtype is right), is named
with its plugin."""

from __future__ import annotations

import pytest
import torch

from lmcore import Component, build_model, scoped_registry
from lmcore.describe import describe
from lmcore.errors import PluginError
from lmcore_sdpa import SDPA
from tests.helpers.errors import raises_naming


class Squash(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., :1]


class Halve(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float16)


@pytest.mark.parametrize(
    "component, where, facts",
    [
        (Component(kind="norm", name="void", build=lambda d_model: None), "build",
         ("its factory returned None", "not a torch.nn.Module implementing lmcore.interfaces.Norm")),
        (Component(kind="norm", name="listy", build=lambda d_model: [1]), "build",
         ("its factory returned a list, not a torch.nn.Module",)),
        (Component(kind="norm", name="squash", build=Squash), "forward",
         ("returned shape (2, 8, 1) torch.float32", "for an input of shape (2, 8, 64) torch.float32",
          "a norm must return its input's shape and dtype")),
        (Component(kind="norm", name="squash", build=Squash), "measure",
         ("returned shape (1, 16, 1) torch.float32", "for an input of shape (1, 16, 64)")),
        (Component(kind="norm", name="halve", build=Halve), "forward",
         ("returned shape (2, 8, 64) torch.float16", "for an input of shape (2, 8, 64) torch.float32")),
    ],
    ids=["factory-none", "factory-list", "norm-changes-shape", "describe-measure-names-it",
         "norm-changes-dtype"],
)  # fmt: skip
def test_every_plugin_fault_names_the_component_and_its_plugin(
    component: Component, where: str, facts: tuple[str, ...]
) -> None:
    """The faults of the module a factory returns; those of the factory and the declarations
    are in tests/test_components.py."""
    with scoped_registry() as reg:
        reg.add(component, name="faulty")
        spec = f"cs336-tiny, norm={component.name}"
        named = f"norm '{component.name}' from registered in-process (plugin 'faulty', module "
        with raises_naming(PluginError, named, *facts):
            if where == "build":
                build_model(spec, device="meta")
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
            raises_naming(
                PluginError, "norm 'halve' from ", "returned shape (2, 8, 64) torch.float16"
            ),
        ):
            halving(torch.zeros(2, 8, dtype=torch.long))


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
        with raises_naming(
            PluginError,
            "attn 'first-head' from ",
            "returned shape (1, 1, 4, 16) torch.float32",
            "for q of shape (1, 4, 4, 16) torch.float32",
            "a attn must return q's shape and dtype",
        ):
            model(torch.zeros(1, 4, dtype=torch.long))
