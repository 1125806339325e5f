"""The recipe's loss terms: the z-loss against PaLM's formula (torch's own logsumexp) and its
gradient, the model's auxiliary loss, and a run that logs each term."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import lmcore
from lmcore.errors import TrainError
from lmcore.train.losses import TERMS, Losses, Objective, logged, window_means, z_loss
from lmcore.train.recipe import Recipe

pytestmark = pytest.mark.usefixtures("single_thread")

SPEC = "vocab_size=300, context_length=16, d_model=32, num_layers=2, num_heads=2"
MOE = f"{SPEC}, ffn=moe(num_experts=4, top_k=2, aux_loss_coef=0.5)"


def _logits(seed: int = 0, scale: float = 4.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(3, 5, 11, generator=g, dtype=torch.float64) * scale).float()
    targets = torch.randint(0, 11, (3, 5), generator=g)
    return logits, targets


def test_the_z_loss_is_palms_formula_and_its_gradient_autograds() -> None:
    logits, targets = _logits()
    ours = logits.clone().requires_grad_(True)
    losses = Objective(z_loss=1e-4)(ours, targets, None)
    ref_logits = logits.double().requires_grad_(True)
    ref = 1e-4 * torch.logsumexp(ref_logits, dim=-1).pow(2).mean()
    assert set(losses.terms) == {"z_loss"}
    torch.testing.assert_close(losses.terms["z_loss"].double(), ref, rtol=1e-6, atol=0)
    torch.testing.assert_close(losses.cross_entropy.double(),
                               F.cross_entropy(logits.double().flatten(0, 1), targets.flatten()),
                               rtol=1e-6, atol=0)  # fmt: skip
    losses.terms["z_loss"].backward()
    ref.backward()
    assert ours.grad is not None and ref_logits.grad is not None
    torch.testing.assert_close(ours.grad.double(), ref_logits.grad, rtol=1e-5, atol=1e-12)
    # the gradient in closed form: 2 · coef / N · log Z · softmax(logits)
    log_z = torch.logsumexp(logits.double(), -1, keepdim=True)
    closed = 2e-4 / 15 * log_z * logits.double().softmax(-1)
    torch.testing.assert_close(ours.grad.double(), closed, rtol=1e-5, atol=1e-12)


def test_the_total_is_the_cross_entropy_plus_the_terms() -> None:
    logits, targets = _logits(1)
    losses = Objective(z_loss=0.5)(logits, targets, None)
    expected = losses.cross_entropy + 0.5 * torch.logsumexp(logits, -1).pow(2).mean()
    torch.testing.assert_close(losses.total, expected)
    assert z_loss(torch.tensor([1.0, 3.0]), 0.1).item() == pytest.approx(0.1 * (1 + 9) / 2)


def test_off_the_loss_is_the_cross_entropy_itself() -> None:
    from lmcore.model.nn import cross_entropy

    logits, targets = _logits(2)
    losses = Objective()(logits, targets, None)
    assert losses.terms == {}
    assert losses.total is losses.cross_entropy  # nothing added: today's loss, bit for bit
    assert torch.equal(losses.cross_entropy, cross_entropy(logits, targets))


def test_the_models_auxiliary_loss_is_a_term() -> None:
    torch.manual_seed(0)
    model = lmcore.build_model(MOE)
    model.train()
    x = torch.randint(0, 300, (2, 16))
    losses = Objective(z_loss=1e-3)(model(x), x, model)
    assert list(losses.terms) == ["z_loss", "aux_loss"]  # TERMS' order
    aux = model.aux_loss()
    assert aux is not None and torch.equal(losses.terms["aux_loss"], aux)
    assert losses.detached()["aux_loss"].requires_grad is False
    assert TERMS == ("z_loss", "aux_loss")


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_a_bad_coefficient_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match=rf"^z_loss={bad!r}: the z-loss coefficient must be a "
                       r"number ≥ 0 \(0: off\), e.g. 1e-4$"):  # fmt: skip
        Objective(z_loss=bad)
    with pytest.raises(TrainError, match=rf"^--z-loss {bad!r}: must be a number ≥ 0"):
        Recipe.of("adamw", "cosine", z_loss=bad)


def test_the_recipe_records_the_loss_terms() -> None:
    assert Recipe.of("adamw", "cosine").record()["loss"] == {
        "cross_entropy": 1.0, "z_loss": 0.0, "aux_loss": "spec"}  # fmt: skip
    assert Recipe.of("adamw", "cosine", z_loss=1e-4).record()["loss"]["z_loss"] == 1e-4


def test_a_windows_means_and_the_logged_fields() -> None:
    rows = [
        {"z_loss": torch.tensor(1.0)},
        {"z_loss": torch.tensor(2.0), "aux_loss": torch.tensor(4.0)},
    ]
    means = window_means(rows, lambda t: t)
    assert means == {"z_loss": 1.5, "aux_loss": 4.0}
    assert logged(3.0, means) == {"z_loss": 1.5, "aux_loss": 4.0, "loss_total": 8.5}
    assert logged(3.0, {}) == {}
    assert window_means([{}, {}], lambda t: t) == {}
    assert Losses(torch.tensor(1.0)).total.item() == 1.0


# ------------------------------------------------------------------------------ in a run


def _config(**changes: object):  # type: ignore[no-untyped-def]
    from lmcore.train.trainer import TrainConfig

    return TrainConfig(steps=4, batch_size=4, eval_batches=1, eval_every=0, log_every=1,
                       save_every=0, device="cpu", lr=3e-3, warmup=1, **changes)  # fmt: skip


def _train_records(run: Path) -> list[dict[str, object]]:
    from lmcore.train.runs import read_metrics

    return [r for r in read_metrics(run) if r["kind"] == "train"]


def test_a_run_with_the_z_loss_logs_it_each_step(tiny_data: Path, tmp_path: Path) -> None:
    from lmcore.train.runs import read_run
    from lmcore.train.trainer import train

    plain = train(SPEC, tiny_data, tmp_path / "plain", _config(), echo=None)
    zero = train(SPEC, tiny_data, tmp_path / "zero", _config(z_loss=0.0), echo=None)
    lines: list[str] = []
    z = train(SPEC, tiny_data, tmp_path / "z", _config(z_loss=0.01), echo=lines.append)
    base, records = _train_records(plain.run), _train_records(z.run)
    # off (absent or 0): the same records as a run before loss terms, no term fields
    strip = ("elapsed_s", "tokens_per_s")
    assert [{k: v for k, v in r.items() if k not in strip} for r in _train_records(zero.run)] == [
        {k: v for k, v in r.items() if k not in strip} for r in base]  # fmt: skip
    assert not any(k in r for r in base for k in ("z_loss", "aux_loss", "loss_total"))
    # on: every step logs its term, and the total the optimizer minimised
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for r in records:
        assert isinstance(r["z_loss"], float) and r["z_loss"] > 0
        assert r["loss_total"] == pytest.approx(r["loss"] + r["z_loss"], rel=1e-12)
        assert "aux_loss" not in r
    # the same initial weights and first batch: the first cross-entropy is the same, then the
    # z-loss's gradient makes the steps differ
    assert records[0]["loss"] == base[0]["loss"]
    assert records[1]["loss"] != base[1]["loss"]
    info = read_run(z.run)
    assert info["config"]["z_loss"] == 0.01 and info["recipe"]["loss"]["z_loss"] == 0.01
    assert read_run(plain.run)["config"]["z_loss"] == 0.0
    assert "loss: cross-entropy + z-loss × 0.01" in lines
    from lmcore.train.trackers import series  # what TensorBoard, MLflow and W&B are given

    assert {"train/loss", "train/z_loss", "train/loss_total"} <= set(series(records[0]))


def test_a_run_with_the_z_loss_resumes_bit_for_bit(tiny_data: Path, tmp_path: Path) -> None:
    from lmcore.train.trainer import resume, train

    whole = train(SPEC, tiny_data, tmp_path / "whole", _config(z_loss=0.01), echo=None)
    cut = train(SPEC, tiny_data, tmp_path / "cut", _config(z_loss=0.01), echo=None,
                stop_after=2)  # fmt: skip
    assert cut.status == "interrupted"
    resume(cut.run, echo=None)
    strip = ("elapsed_s", "tokens_per_s")
    assert [{k: v for k, v in r.items() if k not in strip} for r in _train_records(cut.run)] == [
        {k: v for k, v in r.items() if k not in strip} for r in _train_records(whole.run)]  # fmt: skip
    with pytest.raises(TrainError, match=r"^--z-loss 0.1 \(the run has 0.01\): cannot change"):
        resume(cut.run, echo=None, z_loss=0.1)


def test_a_moe_run_logs_its_aux_loss_and_the_total(tiny_data: Path, tmp_path: Path) -> None:
    from lmcore.train.trainer import train

    run = train(MOE, tiny_data, tmp_path / "moe", _config(z_loss=1e-3), echo=None)
    for r in _train_records(run.run):
        assert r["aux_loss"] >= 0.5 * 2 * 2 * 0.99  # two layers, at least top_k each, × coef
        assert r["loss_total"] == pytest.approx(r["loss"] + r["z_loss"] + r["aux_loss"],
                                                rel=1e-12)  # fmt: skip


def test_the_z_loss_averages_over_kept_targets_only_and_is_unchanged_when_none_is_ignored() -> None:
    from lmcore.model.nn import IGNORE

    logits, targets = _logits()
    plain = Objective(z_loss=1e-2)(logits, targets, None)
    log_z = torch.logsumexp(logits, dim=-1)
    assert torch.equal(plain.terms["z_loss"], log_z.square().mean() * 1e-2)  # bit for bit
    targets[0] = IGNORE
    masked = Objective(z_loss=1e-2)(logits, targets, None)
    kept = targets != IGNORE
    torch.testing.assert_close(masked.terms["z_loss"], log_z[kept].square().mean() * 1e-2)
    ce = F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1), ignore_index=IGNORE)
    torch.testing.assert_close(masked.cross_entropy, ce)
    torch.testing.assert_close(z_loss(log_z, 1.0, kept), log_z[kept].square().mean())
