"""The runner with a mixture of experts: it adds the load-balancing loss and logs it."""

from __future__ import annotations

from pathlib import Path


def test_lmcore_train_adds_and_logs_the_aux_loss(tiny_data: Path, tmp_path: Path) -> None:
    from lmcore.train.runs import read_metrics
    from lmcore.train.trainer import TrainConfig, train

    spec = "vocab_size=300, context_length=16, d_model=32, num_layers=2, num_heads=2"
    config = TrainConfig(steps=4, batch_size=4, eval_batches=1, eval_every=0, log_every=2,
                         save_every=0, device="cpu", lr=3e-3, warmup=1)  # fmt: skip
    with_aux = train(f"{spec}, ffn=moe(num_experts=4, top_k=2, aux_loss_coef=0.5)", tiny_data,
                     tmp_path / "aux", config, echo=None)  # fmt: skip
    without = train(f"{spec}, ffn=moe(num_experts=4, top_k=2, aux_loss_coef=0.0)", tiny_data,
                    tmp_path / "none", config, echo=None)  # fmt: skip
    train_records = [r for r in read_metrics(with_aux.run) if r["kind"] == "train"]
    assert [r["step"] for r in train_records] == [2, 4]
    # two layers at the balanced value top_k = 2 or above, times the coefficient
    assert all(r["aux_loss"] >= 0.5 * 2 * 2 * 0.99 for r in train_records)
    # the term beside the cross-entropy `loss`, and their sum, what the optimizer minimised
    assert all(r["loss_total"] == r["loss"] + r["aux_loss"] for r in train_records)
    others = read_metrics(without.run)
    assert not any("aux_loss" in r or "loss_total" in r for r in others)
    # the same first batch and initial weights: only the added loss makes the runs differ
    assert train_records[0]["loss"] != next(r for r in others if r["kind"] == "train")["loss"]
