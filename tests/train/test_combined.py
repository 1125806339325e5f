"""Several optimizers as one: their groups (the same dicts, marked with the part that updates
them), one state dict in torch's form that reloads into a fresh combination exactly."""

from __future__ import annotations

import copy

import pytest
import torch

from lmcore.train.combined import UPDATE, Combined


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(4, 3, generator=gen)) for _ in range(3)]


def _combined(ps: list[torch.nn.Parameter]) -> Combined:
    sgd = torch.optim.SGD([{"params": ps[:1], "lr": 0.1}], momentum=0.9)
    adam = torch.optim.AdamW([{"params": ps[1:2], "lr": 0.01}, {"params": ps[2:], "lr": 0.02}])
    return Combined([("sgd", sgd), ("adam", adam)])


def _step(opt: torch.optim.Optimizer, ps: list[torch.nn.Parameter], step: int) -> None:
    gen = torch.Generator().manual_seed(100 + step)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=gen)
    opt.step()


def test_groups_are_the_parts_groups_marked_with_their_part() -> None:
    ps = _params()
    opt = _combined(ps)
    assert [g[UPDATE] for g in opt.param_groups] == ["sgd", "adam", "adam"]
    assert opt.param_groups[0] is opt.parts["sgd"].param_groups[0]
    opt.param_groups[2]["lr"] = 0.5  # the runner's schedule reaches the part
    assert opt.parts["adam"].param_groups[1]["lr"] == 0.5


def test_it_steps_as_its_parts_alone() -> None:
    ps, qs = _params(), _params()
    opt = _combined(ps)
    sgd = torch.optim.SGD([{"params": qs[:1], "lr": 0.1}], momentum=0.9)
    adam = torch.optim.AdamW([{"params": qs[1:2], "lr": 0.01}, {"params": qs[2:], "lr": 0.02}])
    for step in range(3):
        _step(opt, ps, step)
        _step(sgd, qs[:1], step)  # the same gradients: one generator per step, in order
        gen = torch.Generator().manual_seed(100 + step)
        for q in qs:
            q.grad = torch.randn(q.shape, generator=gen)
        adam.step()
    for p, q in zip(ps, qs, strict=True):
        assert torch.equal(p, q)


def test_its_state_dict_reloads_and_continues_bit_for_bit() -> None:
    ps = _params()
    opt = _combined(ps)
    for step in range(3):
        _step(opt, ps, step)
    saved = copy.deepcopy(opt.state_dict())
    assert sorted(saved["state"]) == [0, 1, 2]  # torch's form: one index over all groups
    assert [g[UPDATE] for g in saved["param_groups"]] == ["sgd", "adam", "adam"]
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    again = _combined(qs)
    again.load_state_dict(saved)
    assert again.parts["adam"].param_groups == again.param_groups[1:]
    assert again.parts["adam"].state is again.state
    for step in range(3, 6):
        _step(opt, ps, step)
        _step(again, qs, step)
    for p, q in zip(ps, qs, strict=True):
        assert torch.equal(p, q)


def test_misuse_is_refused() -> None:
    ps = _params()
    with pytest.raises(ValueError, match=r"some parameters appear in more than one"):
        Combined([("a", torch.optim.SGD(ps[:2], lr=0.1)), ("b", torch.optim.SGD(ps[1:], lr=0.1))])
    used = torch.optim.SGD(ps[:1], lr=0.1, momentum=0.9)
    _step(used, ps[:1], 0)
    with pytest.raises(ValueError, match=r"part 'a' has taken steps already"):
        Combined([("a", used)])
    with pytest.raises(TypeError, match=r"part 'a' is a list, not an optimizer"):
        Combined([("a", [])])  # type: ignore[list-item]
    opt = _combined(_params())
    with pytest.raises(TypeError, match=r"add a group to one of the parts"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(1))]})
