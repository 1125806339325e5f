"""`lmcore sweep` and `lmcore compare`: variants, the table, the plot, divergence, continuing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import lmcore
from lmcore import Component, scoped_registry
from lmcore.cli.main import main
from lmcore.errors import SpecError, TrainError
from lmcore.train.config import TrainConfig
from lmcore.train.runs import read_metrics, read_run, spec_hash
from lmcore.train.summary import summary_markdown
from lmcore.train.sweep import compare_runs, plan, sweep, table_markdown, variant_spec
from tests.helpers import TINY_SPEC

pytestmark = pytest.mark.usefixtures("single_thread")

CONFIG = TrainConfig(steps=20, batch_size=8, eval_every=10, eval_batches=2, device="cpu", lr=3e-3)
PNG = b"\x89PNG\r\n\x1a\n"


class NanNorm(nn.Module):
    """A norm whose output is NaN: a variant that diverges at its first step."""

    def __init__(self, d_model: int, device: Any = None, dtype: Any = None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight * float("nan")


@pytest.fixture
def nan_norm() -> Iterator[None]:
    with scoped_registry() as registry:
        registry.add(
            Component(kind="norm", name="nan", build=NanNorm, params=lambda d_model: d_model)
        )
        yield


def test_a_variant_replaces_or_adds_items() -> None:
    assert variant_spec("tinystories", "norm=none") == "tinystories, norm=none"
    assert variant_spec("tinystories, norm=layernorm, pos=nope", "norm=none") == (
        "tinystories, pos=nope, norm=none"
    )
    assert variant_spec("cs336-tiny,d_model=32", "d_model=64, num_layers=2") == (
        "cs336-tiny, d_model=64, num_layers=2"
    )
    with pytest.raises(
        SpecError, match=r"--vary 'gpt2-small': 'gpt2-small' is not a key=value item"
    ):
        variant_spec("tinystories", "gpt2-small")
    with pytest.raises(SpecError, match=r"--vary 'norm=': "):
        variant_spec("tinystories", "norm=")


def test_the_plan_names_runs_by_change_and_model() -> None:
    runs = plan("cs336-tiny", ["norm=none", "pos=nope, num_layers=2"])
    assert [r.label for r in runs] == ["baseline", "norm=none", "pos=nope, num_layers=2"]
    spec = runs[2].blueprint.spec
    assert runs[2].name == f"pos-nope-num_layers-2-{spec_hash(spec)}"
    assert runs[2].run_name(3) == f"pos-nope-num_layers-2-{spec_hash(spec)}-seed3"
    assert spec.num_layers == 2 and spec.pos.name == "nope"
    with pytest.raises(
        TrainError, match=r"--vary 'norm=rmsnorm' builds the same model as the baseline"
    ):
        plan("cs336-tiny", ["norm=rmsnorm"])
    with pytest.raises(
        TrainError, match=r"--vary 'pos = nope' builds the same model as --vary 'pos=nope'"
    ):
        plan("cs336-tiny", ["pos=nope", "pos = nope"])
    with pytest.raises(SpecError, match=r"no installed plugin provides norm 'nonorm'"):
        plan("cs336-tiny", ["pos=nope", "norm=nonorm"])  # before anything trains


def test_sweep_writes_table_json_and_plot_and_survives_divergence(
    tiny_data: Path, tmp_path: Path, nan_norm: None
) -> None:
    out = tmp_path / "sweep"
    lines: list[str] = []
    result = sweep(TINY_SPEC, ["pos=nope", "norm=nan"], tiny_data, out, CONFIG, echo=lines.append)
    assert result.interrupted is None and result.failed == []
    base, nope, nan = result.rows
    assert (base.label, base.state, base.delta_val) == ("baseline", "done", 0.0)
    assert nope.state == "done" and nope.delta_val == pytest.approx(nope.val_loss - base.val_loss)  # type: ignore[operator]
    assert nan.state == "diverged" and nan.diverged_at == 1 and nan.status == "diverged at step 1"
    assert (
        base.parameters
        == nope.parameters
        == sum(p.numel() for p in lmcore.build_model(TINY_SPEC).parameters())
    )
    assert base.tokens == nope.tokens == 20 * 8 * 16 and base.tokens_per_s > 0  # type: ignore[operator]
    # every run saw the same batches: the same seed and budget
    for row in (base, nope):
        assert (
            read_run(row.run)["config"]["seed"] == 0 and read_run(row.run)["config"]["steps"] == 20
        )
    md = (out / "compare.md").read_text()
    table = md.splitlines()
    assert table[2] == "| variant | non-embedding params | val loss | Δ val [95% CI] | status |"
    assert table[6] == "| `norm=nan` | 20,640 | – | – | 0/1 done; seed 0: diverged at step 1 |"
    runs = table.index("Every run:") + 2
    assert (
        table[runs]
        == "| run | parameters | train loss | val loss | Δ val | tokens/s | wall time | status |"
    )
    assert table[runs + 3].startswith("| `pos=nope` | ") and table[runs + 3].endswith(" | done |")
    assert table[runs + 4].startswith("| `norm=nan` | ") and table[runs + 4].endswith(
        " | diverged at step 1 |"
    )
    assert md == (
        f"{TINY_SPEC} (2 variants, 1 seed)\n\n{summary_markdown(result.summaries)}\n"
        f"Every run:\n\n{table_markdown(result.rows)}"
    )
    data = json.loads((out / "compare.json").read_text())
    assert [r["label"] for r in data["runs"]] == ["baseline", "pos=nope", "norm=nan"]
    assert data["runs"][2]["diverged_at"] == 1 and data["sweep"]["variants"] == [
        "pos=nope",
        "norm=nan",
    ]
    assert (out / "val_loss.png").read_bytes()[:8] == PNG
    assert "[3/3] norm=nan, seed 0: " in "\n".join(lines)

    # the same command again keeps what is done
    lines.clear()
    again = sweep(TINY_SPEC, ["pos=nope", "norm=nan"], tiny_data, out, CONFIG, echo=lines.append)
    assert [r.status for r in again.rows] == ["done", "done", "diverged at step 1"]
    assert sum("before, kept" in line for line in lines) == 3
    with pytest.raises(TrainError, match=r"holds another sweep \(its variants differ\)"):
        sweep(TINY_SPEC, ["pos=nope"], tiny_data, out, CONFIG, echo=None)


def test_an_interrupted_sweep_continues(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lmcore.train import trainer

    real = trainer.train

    def stopped(*args: Any, **kw: Any) -> Any:  # as if Ctrl-C came at step 7 of the first run
        return real(*args, **{**kw, "stop_after": 7})

    monkeypatch.setattr(trainer, "train", stopped)
    out = tmp_path / "sweep"
    first = sweep(TINY_SPEC, ["pos=nope"], tiny_data, out, CONFIG, echo=None)
    assert first.interrupted == "stop_after" and len(first.rows) == 1
    assert first.rows[0].status == "interrupted at step 7/20"
    monkeypatch.setattr(trainer, "train", real)
    second = sweep(TINY_SPEC, ["pos=nope"], tiny_data, out, CONFIG, echo=None)
    assert [r.status for r in second.rows] == ["done", "done"]
    steps = [r["step"] for r in read_metrics(second.rows[0].run) if r["kind"] == "train"]
    assert steps == [7, 10, 20]  # one record at the stop, then the usual every log_every=10


def test_compare_existing_runs(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lmcore.train.trainer import train

    a, b = tmp_path / "a", tmp_path / "b"
    train(TINY_SPEC, tiny_data, a, CONFIG, echo=None)
    train(TINY_SPEC + ", ffn=silu", tiny_data, b, CONFIG, echo=None)
    rows = compare_runs([a, b])
    assert [r.label for r in rows] == ["a", "b"] and rows[1].spec.endswith(
        "ffn=silu,pos=rope(theta=10000.0),attn=sdpa"
    )
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(table_markdown(rows))
    assert (
        f"table: {tmp_path / 'cmp' / 'compare.md'} (and compare.json), validation curves: " in out
    )
    assert (tmp_path / "cmp" / "val_loss.png").read_bytes()[:8] == PNG


def test_sweep_on_the_command_line(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "s"
    argv = ["sweep", TINY_SPEC, "--vary", "ffn=silu", "--data", str(tiny_data), "--out", str(out),
            "--steps", "10", "--batch-size", "8", "--eval-batches", "2", "--device", "cpu"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| `baseline` |" in printed and "| `ffn=silu` |" in printed
    assert f"validation curves: {out / 'val_loss.png'}" in printed


def test_seeds_are_paired_and_the_table_shows_their_intervals(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stats = pytest.importorskip("scipy.stats", reason="needs scipy (a dependency of lmcore)")
    out = tmp_path / "seeds"
    cfg = TrainConfig(steps=10, batch_size=8, eval_every=5, eval_batches=2, device="cpu",
                      lr=3e-3, seed=4)  # fmt: skip
    result = sweep(TINY_SPEC, ["ffn=silu"], tiny_data, out, cfg, seeds=3, match="params",
                   echo=None)  # fmt: skip
    base_rows, silu_rows = result.rows[:3], result.rows[3:]
    assert [r.seed for r in result.rows] == [4, 5, 6, 4, 5, 6]
    assert result.rows[4].label == "ffn=silu, seed 5"  # its Δ: against the baseline's seed 5
    assert result.rows[4].delta_val == result.rows[4].val_loss - result.rows[1].val_loss  # type: ignore[operator]
    for b, v in zip(base_rows, silu_rows, strict=True):  # a pair: the same seed, so batches
        assert read_run(b.run)["config"] == read_run(v.run)["config"]
        assert Path(v.run).name.endswith(f"-seed{v.seed}") and v.state == "done"
    assert read_run(silu_rows[0].run)["spec"].count("d_ff=96,") == 1  # 3·32·64 = 2·32·96
    base, silu = result.summaries
    assert base.val_loss == pytest.approx(sum(r.val_loss for r in base_rows) / 3)  # type: ignore[misc]
    ref = stats.ttest_rel([r.val_loss for r in silu_rows], [r.val_loss for r in base_rows])
    ci = ref.confidence_interval(0.95)
    assert silu.delta is not None and silu.delta.n == 3
    assert (silu.delta.low, silu.delta.high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert silu.delta.distinguishable == (ref.pvalue < 0.05)
    assert silu.matched == "d_ff 128→96 (+0.00%)" and base.matched == "d_ff 64 (the target)"
    row = summary_markdown(result.summaries).splitlines()[3]
    low, high = silu.delta.low, silu.delta.high
    assert row.startswith(f"| `ffn=silu` | d_ff 128→96 (+0.00%) | 20,640 | {silu.val_loss:.3f} | "
                          f"{silu.delta.mean:+.3f} [{low:+.3f}, {high:+.3f}]")  # fmt: skip
    assert row.endswith(" | 3/3 done |")
    data = json.loads((out / "compare.json").read_text())
    assert data["variants"][1]["delta_val"]["low"] == pytest.approx(ci.low)
    assert (out / "val_loss.png").read_bytes()[:8] == PNG
    toml = (out / "sweep.toml").read_text()
    assert 'variants = ["ffn=silu"]\n' in toml and "seeds = 3\n" in toml and "seed = 4\n" in toml

    # the sweep's own file, and --resume, continue it: nothing is trained again
    capsys.readouterr()
    assert main(["sweep", str(out / "sweep.toml")]) == 0
    printed = capsys.readouterr().out
    assert printed.count("before, kept") == 6 and "| `ffn=silu` | d_ff 128→96" in printed
    assert main(["sweep", "--resume", str(out), "--launcher", "local"]) == 0
    assert capsys.readouterr().out.count("before, kept") == 6
    assert main(["sweep", "--resume", str(out), "--seeds", "4"]) == 2
    assert "lmcore sweep: error: --resume " in capsys.readouterr().err


class BoomNorm(NanNorm):
    """A norm whose forward raises: a run that fails with an exception."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom in the norm")


def test_a_failed_run_is_reported_and_the_others_go_on(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with scoped_registry() as registry:
        registry.add(
            Component(kind="norm", name="boom", build=BoomNorm, params=lambda d_model: d_model)
        )
        argv = ["sweep", TINY_SPEC, "--vary", "norm=boom", "--vary", "pos=nope", "--data",
                str(tiny_data), "--out", str(tmp_path / "s"), "--steps", "5", "--batch-size",
                "8", "--eval-batches", "1", "--device", "cpu"]  # fmt: skip
        assert main(argv) == 1
    captured = capsys.readouterr()
    assert "lmcore sweep: error: norm=boom, seed 0: RuntimeError: boom in the norm" in captured.err
    assert "| `norm=boom` | 20,640 | – | – | 0/1 done; seed 0: failed: RuntimeError: boom" in (
        captured.out
    )
    assert "| `pos=nope` | 20,640 | " in captured.out and captured.out.count(" | 1/1 done |") == 2


def test_the_sweep_file_is_checked_key_by_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "s.toml"
    file.write_text('base = "cs336-tiny"\nvariants = ["pos=nope"]\nseed = 3\n')
    assert main(["sweep", str(file)]) == 2
    assert (
        f"lmcore sweep: error: {file}: unknown key 'seed' (did you mean 'seeds'?); the keys are "
        "base, variants, data, out, seeds, match, train, launcher" in capsys.readouterr().err
    )
    file.write_text('base = "cs336-tiny"\nvariants = ["pos=nope"]\n[train]\nlearning_rate = 1\n')
    assert main(["sweep", str(file)]) == 2
    assert "[train]: unknown key 'learning_rate'" in capsys.readouterr().err
    file.write_text('base = "cs336-tiny"\nvariants = ["pos=nope"]\n')
    assert main(["sweep", str(file)]) == 2
    assert (
        f"lmcore sweep: error: --data DIR, --out SWEEP are needed (neither on the command line nor in {file})"
        in capsys.readouterr().err
    )
    assert main(["sweep", "cs336-tiny", "--vary", "pos=nope", "--data", "d", "--out", "o",
                 "--slurm-extra", "account"]) == 2  # fmt: skip
    assert "--slurm-extra 'account': expected KEY=VALUE" in capsys.readouterr().err


def test_the_manuals_sweep_file_is_the_one_it_shows() -> None:
    from lmcore.train.sweepfile import read_definition

    docs = Path(__file__).resolve().parents[2] / "docs"
    page = (docs / "sweeps.md").read_text(encoding="utf-8")
    shown = page.split("```toml\n", 1)[1].split("```", 1)[0]
    assert shown == (docs / "positions.toml").read_text(encoding="utf-8")
    defn = read_definition(docs / "positions.toml")
    assert (defn.variants, defn.seeds, defn.match) == (("pos=nope", "pos=alibi"), 3, "params")
    assert defn.train["tokens"] == 409_600 and defn.launcher.threads == 1


def test_a_band_is_the_mean_and_range_of_the_seeds_at_each_evaluation(tmp_path: Path) -> None:
    from lmcore.train.plots import Band, band_points, plot_bands

    def evals(*losses: float) -> list[dict[str, Any]]:
        return [{"kind": "eval", "tokens": 100 * i, "val_loss": v} for i, v in enumerate(losses)]

    runs = [evals(7.0, 5.0, 4.0), evals(7.2, 5.3, 4.3), evals(7.1, 5.2)]  # the last still running
    xs, mean, low, high = band_points(runs)
    assert xs == [0.0, 100.0, 200.0]
    assert mean == pytest.approx([7.1, 15.5 / 3, 4.15])
    assert (low, high) == ([7.0, 5.0, 4.0], [7.2, 5.3, 4.3])
    plot_bands([Band("baseline", runs)], tmp_path / "b.png", "t")
    assert (tmp_path / "b.png").read_bytes()[:8] == PNG


def test_tracker_and_bpb_options_reach_a_launched_run_as_train_flags() -> None:
    cfg = TrainConfig(steps=5, eval_bpb=True, loggers=("tensorboard", "mlflow"), log_group="g")
    args = cfg.cli_args()
    assert args == [
        "--steps", "5", "--eval-bpb", "--logger", "tensorboard", "--logger", "mlflow",
        "--log-group", "g",
    ]  # fmt: skip
    from lmcore.cli.main import _parser

    parsed = _parser().parse_args(["train", "cs336-tiny", *args])
    from lmcore.cli.train import train_config

    assert train_config(parsed) == cfg


def test_a_sweeps_variants_rank_by_their_mean_loss_or_bpb() -> None:
    from lmcore.train.summary import Summary, ranked_summaries

    def variant(label: str, loss: float | None, bpb: float | None = None) -> Summary:
        return Summary(label, "", None, None, 3, 3, loss, None, val_bpb=bpb)

    rows = [variant("baseline", 4.2, 2.1), variant("nope", 4.3), variant("alibi", 4.1, 2.2)]
    assert [s.label for s in ranked_summaries(rows, "val_loss")] == ["alibi", "baseline", "nope"]
    assert [s.label for s in ranked_summaries(rows, "val_bpb")] == ["baseline", "alibi", "nope"]
    with pytest.raises(TrainError, match=r"--sort 'tokens_per_s': a sweep's table ranks its "):
        ranked_summaries(rows, "tokens_per_s")


def test_a_value_toml_cannot_hold_is_a_train_error(tmp_path: Path) -> None:
    from lmcore.errors import TrainError
    from lmcore.train.sweepfile import read_definition

    path = tmp_path / "s.toml"
    path.write_text('base = "cs336-tiny"\n[launcher.slurm]\npartition = 1979-05-27\n')
    with pytest.raises(TrainError, match=r"no TOML for datetime.date\(1979, 5, 27\)"):
        read_definition(path).to_toml()
