"""Parameter roles: `Role`'s shape checks and `roles_of`'s walk, overrides and errors."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from lmcore.errors import PluginError
from lmcore.model.nn import Embedding, Linear
from lmcore.model.roles import BIAS, EMBEDDING, GAIN, HEAD, MATRIX, Role, packed, roles_of


class _Head(nn.Module):
    def __init__(self, tied: bool = False):
        super().__init__()
        self.embed = Embedding(10, 4)
        self.proj = Linear(4, 4, bias=True)
        self.out = Linear(4, 10)
        if tied:
            self.embed.weight = self.out.weight

    def parameter_roles(self) -> dict[str, Role]:
        return {"out.weight": HEAD}


def test_primitives_and_an_ancestors_declaration() -> None:
    roles = roles_of(_Head())
    assert roles == {
        "embed.weight": EMBEDDING,
        "proj.weight": MATRIX,
        "proj.bias": BIAS,
        "out.weight": HEAD,
    }


def test_a_tied_parameter_is_named_once_with_the_ancestors_role() -> None:
    roles = roles_of(_Head(tied=True))
    assert list(roles) == ["embed.weight", "proj.weight", "proj.bias"]
    assert roles["embed.weight"] == HEAD


def test_a_parameter_without_a_role_names_its_module() -> None:
    class Bare(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(3))

    holder = nn.Sequential(Linear(3, 3), Bare())
    with pytest.raises(PluginError, match=r"parameter '1.scale' has no role: Bare should declare"):
        roles_of(holder)


def test_a_declaration_naming_no_parameter() -> None:
    class Typo(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(3))

        def parameter_roles(self) -> dict[str, Role]:
            return {"wieght": GAIN}

    with pytest.raises(PluginError, match=r"declares 'wieght', which is not one of its"):
        roles_of(Typo())


@pytest.mark.parametrize(
    ("role", "shape", "message"),
    [
        (MATRIX, (4,), "at least 2 dimensions"),
        (packed(2, 3), (4, 4), r"splits \[2, 3\] must be positive and add up to the 4 rows"),
        (packed(2, 2), (4, 4), None),
        (Role("matrix", 0, 0), (4, 4), "the same axis"),
        (Role("gain", splits=(1,)), (4,), "only a packed tensor has splits"),
    ],
)
def test_role_shapes(role: Role, shape: tuple[int, ...], message: str | None) -> None:
    problem = role.problem(shape)
    if message is None:
        assert problem is None
    else:
        assert problem is not None and re.search(message, problem), problem


def test_unknown_role_name_suggests() -> None:
    with pytest.raises(ValueError, match=r"unknown parameter role 'gian'.*did you mean 'gain'"):
        Role("gian")
