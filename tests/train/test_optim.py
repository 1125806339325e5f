"""The optimizer's pieces: clipping to the global norm, groups by parameter role, the checks on
what an optimizer takes and covers."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import lmcore
from lmcore import Component, Registry
from lmcore.errors import PluginError, TrainError
from lmcore.parts import Part
from lmcore.train.config import TrainConfig
from lmcore.train.optim import clip_gradients, make_optimizer, role_groups
from lmcore.train.recipe import resolve_recipe


def test_clipping_scales_to_the_global_norm() -> None:
    a = torch.nn.Parameter(torch.zeros(2))
    b = torch.nn.Parameter(torch.zeros(1, 1))
    a.grad = torch.tensor([3.0, 4.0])
    b.grad = torch.tensor([[12.0]])  # global norm sqrt(9 + 16 + 144) = 13
    norm = clip_gradients([a, b], max_norm=1.0)
    assert norm.item() == pytest.approx(13.0)
    scale = 1.0 / (13.0 + 1e-6)
    torch.testing.assert_close(a.grad, torch.tensor([3.0, 4.0]) * scale)
    torch.testing.assert_close(b.grad, torch.tensor([[12.0]]) * scale)
    # below the threshold nothing changes; without clipping the norm is still reported
    assert clip_gradients([a, b], max_norm=5.0).item() == pytest.approx(1.0, rel=1e-5)
    torch.testing.assert_close(a.grad, torch.tensor([3.0, 4.0]) * scale)
    assert clip_gradients([a, b], max_norm=None).item() == pytest.approx(1.0, rel=1e-5)


def test_weight_decay_follows_the_roles() -> None:
    model = lmcore.build_model("cs336-tiny")
    groups, names = role_groups(model, TrainConfig(weight_decay=0.1))
    by_role = {g["role"]: (g, n) for g, n in zip(groups, names, strict=True)}
    assert set(by_role) == {"embedding", "gain", "matrix", "head"}
    assert {r: g["weight_decay"] for r, (g, _) in by_role.items()} == {
        "embedding": 0.0, "gain": 0.0, "matrix": 0.1, "head": 0.1,
    }  # fmt: skip
    assert by_role["head"][1] == ["lm_head.weight"]
    assert by_role["embedding"][1] == ["token_embeddings.weight"]
    assert all(n.endswith(("ln1.weight", "ln2.weight", "ln_final.weight"))
               for n in by_role["gain"][1])  # fmt: skip
    flat = [n for ns in names for n in ns]
    assert len(flat) == len(set(flat)) == len(list(model.parameters()))


def test_decay_roles_and_learning_rate_multipliers() -> None:
    model = lmcore.build_model("cs336-tiny, tie_embeddings=true")
    config = TrainConfig(lr=0.01, weight_decay=0.1, decay="gain", role_lr=("embedding=3.0",))
    groups, names = role_groups(model, config)
    by_role = {g["role"]: g for g in groups}
    assert set(by_role) == {"embedding", "gain", "matrix"}  # tied: the head is the embedding
    assert by_role["gain"]["weight_decay"] == 0.1 and by_role["matrix"]["weight_decay"] == 0.0
    assert by_role["embedding"]["lr"] == pytest.approx(0.03)
    assert by_role["embedding"]["lr_scale"] == 3.0 and by_role["matrix"]["lr_scale"] == 1.0


def test_an_optimizer_option_the_optimizer_does_not_take_is_refused() -> None:
    model = lmcore.build_model("cs336-tiny")
    with pytest.raises(TrainError, match=r"--betas 0.8 0.9: optimizer 'constant_lr' takes no"):
        make_optimizer(model, TrainConfig(betas=(0.8, 0.9)), _fixed_part())


def test_an_optimizer_that_leaves_parameters_out_is_refused() -> None:
    model = lmcore.build_model("cs336-tiny")
    with pytest.raises(PluginError, match=r"leaves \d+ parameter\(s\) without an update rule"):
        make_optimizer(model, TrainConfig(), _fixed_part(only_first=True))


def _fixed_part(only_first: bool = False) -> Part:
    """An optimizer taking no betas (plain SGD), optionally over the first group alone."""

    def build(groups: list[dict[str, Any]], lr: float) -> torch.optim.Optimizer:
        return torch.optim.SGD(groups[:1] if only_first else groups, lr=lr)

    registry = Registry(autoload=False)
    registry.add(Component(kind="optimizer", name="constant_lr", build=build), name="test")
    return resolve_recipe("optimizer", "constant_lr", registry)
