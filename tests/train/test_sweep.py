"""`lmcore.train.sweep`: variants, the plan, the table, the plot, divergence, continuing, seeds
paired and their intervals."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import lmcore
from lmcore import Component, scoped_registry
from lmcore.cli.main import main
from lmcore.errors import SpecError, TrainError
from lmcore.model.roles import GAIN, Role
from lmcore.train.config import TrainConfig
from lmcore.train.runs import read_metrics, read_run, spec_hash
from lmcore.train.summary import summary_markdown
from lmcore.train.sweep import plan, sweep, table_markdown, variant_spec
from tests.helpers.errors import raises_naming
from tests.helpers.models import TINY_SPEC
from tests.helpers.runs import PNG, interrupted_sweep, sweep_config

CONFIG = sweep_config()

pytestmark = pytest.mark.usefixtures("single_thread")


class NanNorm(nn.Module):
    """A norm whose output is NaN: a variant that diverges at its first step."""

    def __init__(self, d_model: int, device: Any = None, dtype: Any = None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def parameter_roles(self) -> dict[str, Role]:
        return {"weight": GAIN}

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
    with raises_naming(SpecError, "--vary 'gpt2-small'", "not a key=value item"):
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
    with raises_naming(TrainError, "--vary 'norm=rmsnorm'", "the same model as the baseline"):
        plan("cs336-tiny", ["norm=rmsnorm"])
    with raises_naming(TrainError, "--vary 'pos = nope'", "the same model as --vary 'pos=nope'"):
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
    assert table[8] == "Every variant: optimizer `adamw`, schedule `cosine`."  # one recipe
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
        f"Every run:\n\n{table_markdown(result.rows, recipe_line=False)}"
    )
    assert table_markdown(result.rows).endswith(
        "\n\nEvery run: optimizer `adamw`, schedule `cosine`.\n"
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
    out = tmp_path / "sweep"
    first = interrupted_sweep(tiny_data, out, ["pos=nope"], monkeypatch)  # Ctrl-C at step 7
    assert first.interrupted == "stop_after" and len(first.rows) == 1
    assert first.rows[0].status == "interrupted at step 7/20"
    second = sweep(TINY_SPEC, ["pos=nope"], tiny_data, out, CONFIG, echo=None)
    assert [r.status for r in second.rows] == ["done", "done"]
    steps = [r["step"] for r in read_metrics(second.rows[0].run) if r["kind"] == "train"]
    assert steps == [7, 10, 20]  # one record at the stop, then the usual every log_every=10


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


def test_a_long_variant_gets_a_run_directory_a_file_system_takes(tmp_path: Path) -> None:
    from lmcore.blueprint import resolve
    from lmcore.train.runs import slug

    # a canonical spec as lmcore prints it, given whole as a --vary (issue 32: 298 bytes)
    change = str(resolve("cs336-tiny, ffn=moe(num_experts=4), pos=nope").spec)
    other = change.replace("aux_loss_coef=0.01", "aux_loss_coef=0.02")
    assert len(slug(change)) > 255  # as a name, it would not fit
    runs = plan("cs336-tiny", [change, other])
    names = [r.run_name(10**6) for r in runs[1:]]
    assert names[0] != names[1] and all(len(n.encode()) <= 255 for n in names)
    assert names[0].startswith(slug(change)[:100])  # readable: the change's own first words
    for name in names:
        (tmp_path / name).mkdir()


def test_bad_input_fails_before_the_sweep_directory_exists(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tracemalloc

    out = tmp_path / "sw"
    tracemalloc.start()
    try:
        with raises_naming(TrainError, "--seeds 1000000000", "from 1 to 1000"):
            sweep(TINY_SPEC, ["pos=nope"], tiny_data, out, CONFIG, seeds=10**9, echo=None)
        assert tracemalloc.get_traced_memory()[1] < 50 * 2**20  # nothing sized by the seeds
    finally:
        tracemalloc.stop()
    with pytest.raises(SpecError, match="norm 'nonorm'"):
        sweep(TINY_SPEC, ["norm=nonorm"], tiny_data, out, CONFIG, echo=None)
    if importlib.util.find_spec("mlflow") is not None:  # a tracker that cannot be reached
        from tests.helpers.net import closed_port

        uri = f"http://127.0.0.1:{closed_port()}"
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        with raises_naming(TrainError, f"MLFLOW_TRACKING_URI {uri}", "cannot connect"):
            sweep(TINY_SPEC, ["pos=nope"], tiny_data, out,
                  replace(CONFIG, loggers=("mlflow",)), echo=None)  # fmt: skip
    assert not out.exists()


def test_a_sweep_json_edited_by_hand_names_the_file_and_where(
    tiny_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "sw"
    out.mkdir()
    edited = '  "base": "x, edited'  # a string left open: the newline after it stops JSON
    (out / "sweep.json").write_text(f'{{\n  "format": "lmcore-sweep",\n{edited}\n}}')
    column = len(edited) + 1
    with raises_naming(TrainError, str(out / "sweep.json"), f"not JSON at line 3, column {column}",
                       "undo the edit", "another --out"):  # fmt: skip
        sweep(TINY_SPEC, ["pos=nope"], tiny_data, out, CONFIG, echo=None)
    (out / "sweep.json").write_text("[1, 2]")
    with raises_naming(TrainError, "not a sweep's description"):
        sweep(TINY_SPEC, ["pos=nope"], tiny_data, out, CONFIG, echo=None)
    assert sorted(p.name for p in out.iterdir()) == [".lock", "sweep.json"]  # nothing else
