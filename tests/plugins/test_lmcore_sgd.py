"""optimizer=sgd against torch.optim.SGD with the same options: equal updates over several steps
with groups of their own lr and (L2) weight decay; its state dict resumes exactly; its
arguments' ranges, and `lmcore train` refusing the betas it has none of."""

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

OFFER = {"lr": 0.05, "weight_decay": 0.1, "betas": (0.9, 0.95), "eps": 1e-8}


def _groups(model: torch.nn.Module) -> list[dict[str, Any]]:
    params = list(model.parameters())
    return [
        {"params": params[::2], "lr": 0.05, "weight_decay": 0.1},
        {"params": params[1::2], "lr": 0.02, "weight_decay": 0.0},
    ]


@pytest.mark.parametrize(
    ("spec", "options"),
    [
        ("sgd", {"momentum": 0.9}),
        ("sgd(momentum=0.0)", {"momentum": 0.0}),
        ("sgd(momentum=0.8, dampening=0.5)", {"momentum": 0.8, "dampening": 0.5}),
        ("sgd(nesterov=true)", {"momentum": 0.9, "nesterov": True}),
    ],
)
def test_updates_equal_torchs(spec: str, options: dict[str, Any]) -> None:
    ours = lmcore.build_model("cs336-tiny")
    ref = twin(ours)
    start = twin(ours)
    opt = build_optimizer(resolve_recipe("optimizer", spec), _groups(ours), **OFFER)
    torch_opt = torch.optim.SGD(_groups(ref), **options)
    for step in range(5):
        grads(ours, step)
        grads(ref, step)
        opt.step()
        torch_opt.step()
    for (n, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=n)
    moved = sum((a - b).abs().sum() for a, b in zip(ours.parameters(), start.parameters(),
                                                    strict=True))  # fmt: skip
    assert moved > 0.01


def test_weight_decay_is_l2_added_to_the_gradient() -> None:
    """One step without momentum: θ - lr (g + λ θ), and the gradient left as it was."""
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    p.grad = torch.tensor([0.5, 0.5])
    groups = [{"params": [p], "lr": 0.1, "weight_decay": 0.1}]
    build_optimizer(resolve_recipe("optimizer", "sgd(momentum=0.0)"), groups, **OFFER).step()
    torch.testing.assert_close(p.detach(), torch.tensor([1.0 - 0.1 * 0.6, -2.0 - 0.1 * 0.3]))
    assert torch.equal(p.grad, torch.tensor([0.5, 0.5]))


def test_a_reloaded_state_continues_bit_for_bit() -> None:
    assert_resumes_bit_for_bit("sgd(nesterov=true)", _groups, OFFER)


def test_a_parameter_without_a_gradient_is_left_alone() -> None:
    p, q = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt = build_optimizer(resolve_recipe("optimizer", "sgd"), [{"params": [p, q]}], **OFFER)
    p.grad = torch.ones(3)
    opt.step()
    assert torch.equal(q, torch.ones(3)) and not torch.equal(p, torch.ones(3))
    assert q not in opt.state and "momentum_buffer" in opt.state[p]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("sgd(momentum=1.0)", "momentum must be < 1, got 1.0"),
        ("sgd(momentum=-0.1)", "must be >= 0.0, got -0.1"),
        ("sgd(dampening=1.5)", "dampening must be at most 1, got 1.5"),
        ("sgd(nesterov=true, dampening=0.1)",
         "nesterov needs momentum > 0 and dampening 0; got momentum=0.9, dampening=0.1"),
        ("sgd(nesterov=true, momentum=0.0)", "nesterov needs momentum > 0 and dampening 0"),
        ("sgd(momentun=0.5)", "did you mean 'momentum'"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused(spec: str, message: str) -> None:
    with pytest.raises(SpecError) as e:
        resolve_recipe("optimizer", spec)
    assert message in str(e.value)


@pytest.mark.usefixtures("single_thread")
def test_lmcore_train_refuses_betas_for_sgd(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    argv = ["train", TINY_SPEC, "--data", str(tiny_data), "--out", str(run), "--steps", "2",
            "--optimizer", "sgd", "--betas", "0.8", "0.9", "--device", "cpu"]  # fmt: skip
    assert one_line_error(capsys, argv) == (
        "lmcore train: error: --betas 0.8 0.9: optimizer 'sgd' takes no betas; its own "
        "arguments are dampening, momentum, nesterov\n"
    )
    assert not run.exists()


@pytest.mark.usefixtures("single_thread")
def test_lmcore_train_trains_with_sgd(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lmcore.cli.main import main
    from lmcore.train.runs import read_metrics, read_run

    run = tmp_path / "run"
    argv = ["train", TINY_SPEC, "--data", str(tiny_data), "--out", str(run), "--steps", "6",
            "--optimizer", "sgd(nesterov=true)", "--lr", "0.05", "--log-every", "1",
            "--batch-size", "4", "--eval-batches", "1", "--device", "cpu"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    spec = "sgd(momentum=0.9,dampening=0.0,nesterov=true)"
    header = [x for x in capsys.readouterr().out.splitlines() if x.startswith("optimizer:")]
    assert header == [f"optimizer: {spec}, weight decay 0.1 on matrix, packed, head, router, conv, "
                      "clip 1"]  # no betas: SGD takes none
    recipe = read_run(run)["recipe"]["optimizer"]
    assert (recipe["spec"], recipe["module"]) == (spec, "lmcore_sgd")
    losses = [r["loss"] for r in read_metrics(run) if r["kind"] == "train"]
    assert len(losses) == 6 and all(loss == loss for loss in losses)
