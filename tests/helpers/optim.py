"""The optimizer plugins' tests: a tiny model's two parameter groups, its twin, seeded
gradients, and the resume-equality check each built-in optimizer is held to."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import torch

import lmcore
from lmcore.train.recipe import build_optimizer, resolve_recipe


def twin(model: torch.nn.Module) -> torch.nn.Module:
    """A second cs336-tiny with `model`'s weights."""
    other = lmcore.build_model("cs336-tiny")
    other.load_state_dict(model.state_dict())
    return other


def grads(model: torch.nn.Module, step: int) -> None:
    """Gradients drawn from `step`'s seed, the same for every model of the same shapes."""
    gen = torch.Generator().manual_seed(step)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)


def assert_resumes_bit_for_bit(
    spec: str,
    groups: Callable[[torch.nn.Module], list[dict[str, Any]]],
    offer: Mapping[str, Any],
) -> None:
    """Three steps, a state-dict round trip into a fresh optimizer over a twin, three more
    steps on both: the parameters are equal bit for bit."""
    a = lmcore.build_model("cs336-tiny")
    b = twin(a)
    part = resolve_recipe("optimizer", spec)
    opt_a = build_optimizer(part, groups(a), **offer)
    for step in range(3):
        grads(a, step)
        opt_a.step()
    b.load_state_dict(a.state_dict())
    opt_b = build_optimizer(part, groups(b), **offer)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    for step in range(3, 6):
        grads(a, step)
        grads(b, step)
        opt_a.step()
        opt_b.step()
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(x, y)
