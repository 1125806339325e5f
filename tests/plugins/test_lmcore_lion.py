"""optimizer=lion against the paper's pseudo-code (Chen et al., 2023, Program 1) written out
here per tensor, and against lion-pytorch's Lion: equal updates over several steps with groups
of their own lr and weight decay; its own betas; its state dict resumes exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import lmcore
from lmcore.errors import SpecError
from lmcore.train.recipe import build_optimizer, resolve_recipe
from tests.helpers.models import TINY_SPEC
from tests.helpers.optim import assert_resumes_bit_for_bit, grads, twin
from tests.helpers.runs import one_line_error

OFFER = {"lr": 3e-4, "weight_decay": 0.5, "betas": (0.9, 0.95), "eps": 1e-8}


def _groups(model: torch.nn.Module) -> list[dict[str, Any]]:
    params = list(model.parameters())
    return [
        {"params": params[::2], "lr": 3e-4, "weight_decay": 0.5},
        {"params": params[1::2], "lr": 1e-4, "weight_decay": 0.0},
    ]


def _paper_step(groups: list[dict[str, Any]], state: dict[int, torch.Tensor], beta1: float,
                beta2: float) -> None:  # fmt: skip
    """Program 1 of the paper, one tensor at a time, in float64."""
    with torch.no_grad():
        for g in groups:
            lr, wd = g["lr"], g["weight_decay"]
            for p in g["params"]:
                grad = p.grad.double()
                m = state.setdefault(id(p), torch.zeros_like(grad))
                update = (beta1 * m + (1 - beta1) * grad).sign()
                p.copy_(p.double() - lr * (update + wd * p.double()))
                state[id(p)] = beta2 * m + (1 - beta2) * grad


@pytest.mark.parametrize(("spec", "betas"), [("lion", (0.9, 0.99)),
                                             ("lion(beta1=0.95, beta2=0.98)", (0.95, 0.98))])
def test_updates_follow_the_papers_program(spec: str, betas: tuple[float, float]) -> None:
    ours = lmcore.build_model("cs336-tiny")
    ref = twin(ours)
    start = twin(ours)
    opt = build_optimizer(resolve_recipe("optimizer", spec), _groups(ours), **OFFER)
    ref_groups, state = _groups(ref), {}
    for step in range(5):
        grads(ours, step)
        grads(ref, step)
        opt.step()
        _paper_step(ref_groups, state, *betas)
    for (n, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=n)
    for p, q in zip(ours.parameters(), ref.parameters(), strict=True):  # the momentum too
        torch.testing.assert_close(opt.state[p]["exp_avg"], state[id(q)].float())
    # without decay every coordinate moves by exactly ±lr a step: at most 5 lr, an odd multiple
    # of lr after 5 steps, so never 0
    undecayed = list(ours.parameters())[1::2], list(start.parameters())[1::2]
    for a, b in zip(*undecayed, strict=True):
        moved = (a - b).abs().detach()
        assert moved.max() <= 5 * 1e-4 * (1 + 1e-3) and moved.min() >= 1e-4 * (1 - 1e-2)


def test_updates_equal_lion_pytorchs() -> None:
    lion_pytorch = pytest.importorskip(
        "lion_pytorch", reason="needs the test extra's lion-pytorch: pip install -e '.[test]'"
    )
    ours = lmcore.build_model("cs336-tiny")
    ref = twin(ours)
    opt = build_optimizer(resolve_recipe("optimizer", "lion"), _groups(ours), **OFFER)
    peer = lion_pytorch.Lion(_groups(ref), betas=(0.9, 0.99))
    for step in range(5):
        grads(ours, step)
        grads(ref, step)
        opt.step()
        peer.step()
    for (n, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=n)


def test_a_reloaded_state_continues_bit_for_bit() -> None:
    assert_resumes_bit_for_bit("lion", _groups, OFFER)


def test_a_parameter_without_a_gradient_is_left_alone() -> None:
    p, q = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt = build_optimizer(resolve_recipe("optimizer", "lion"), [{"params": [p, q]}], **OFFER)
    p.grad = torch.ones(3)
    opt.step()
    assert torch.equal(q, torch.ones(3)) and not torch.equal(p, torch.ones(3))
    assert q not in opt.state and set(opt.state[p]) == {"exp_avg"}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("lion(beta1=1.0)", "beta1 must be in [0, 1), got 1.0"),
        ("lion(beta2=1.5)", "beta2 must be in [0, 1), got 1.5"),
        ("lion(beta2=-0.5)", "must be >= 0.0, got -0.5"),
        ("lion(betas=0.9)", "has no argument 'betas' (did you mean 'beta2'?); it takes: beta1, beta2"),
    ],
)
def test_bad_arguments_are_refused(spec: str, message: str) -> None:
    with pytest.raises(SpecError) as e:
        resolve_recipe("optimizer", spec)
    assert message in str(e.value)


@pytest.mark.usefixtures("single_thread")
def test_lmcore_train_refuses_the_runs_betas_for_lion(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    argv = ["train", TINY_SPEC, "--data", str(tiny_data), "--out", str(run), "--steps", "2",
            "--optimizer", "lion", "--betas", "0.9", "0.99", "--device", "cpu"]  # fmt: skip
    assert one_line_error(capsys, argv) == (
        "lmcore train: error: --betas 0.9 0.99: optimizer 'lion' takes no betas; its own "
        "arguments are beta1, beta2\n"
    )
    assert not run.exists()
