"""The optimizer's pieces: clipping to the global norm, weight decay on matrices only."""

from __future__ import annotations

import pytest
import torch

import lmcore
from lmcore.train.optim import clip_gradients, param_groups


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


def test_weight_decay_applies_to_matrices_only() -> None:
    model = lmcore.build_model("cs336-tiny, tie_embeddings=true")
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decay["params"])
    assert all(
        n.endswith(("ln1.weight", "ln2.weight", "ln_final.weight")) for n in no_decay["names"]
    )
    names = decay["names"] + no_decay["names"]
    assert len(names) == len(set(names)) == len(list(model.parameters()))  # tied: once
