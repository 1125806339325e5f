"""Experiment trackers and bits per byte in training: what TensorBoard, MLflow and W&B hold,
read back with each library's own reader, is what metrics.jsonl holds; val_bpb is the
validation loss over the bytes its targets stand for; a sweep logs each variant as a run."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lmcore.data.tokens import TokenData
from lmcore.train.config import TRACKERS, TrainConfig
from lmcore.train.runs import read_metrics
from lmcore.train.trackers import STATE_FILE, TB_DIR
from lmcore.train.trainer import train
from tests.helpers.models import TINY_SPEC

pytestmark = pytest.mark.usefixtures("single_thread")


INSTALLED = [t for t in TRACKERS if importlib.util.find_spec(t) is not None]


def extra(name: str) -> str:
    return f"needs the '{name}' extra: pip install -e '.[{name}]'"


@pytest.fixture(scope="module")
def tracked(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One short run logging to every installed tracker (MLflow to a store of its own: a file
    store, which opens in a second where a new SQLite store migrates its schema for many; W&B
    offline), with --eval-bpb."""
    root = tmp_path_factory.mktemp("tracked")
    mp = pytest.MonkeyPatch()
    uri = (root / "mlruns").as_uri()
    mp.setenv("MLFLOW_TRACKING_URI", uri)
    mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    config = TrainConfig(steps=12, batch_size=4, eval_every=6, eval_batches=2, log_every=3,
                         save_every=0, eval_bpb=True, loggers=tuple(INSTALLED),
                         log_group="tracked-test")  # fmt: skip
    try:
        result = train(TINY_SPEC, tiny_data, root / "run", config, echo=None)
    finally:
        mp.undo()
    return {"run": root / "run", "uri": uri, "result": result}


def _series(run: Path, kind: str, field: str) -> list[tuple[int, float]]:
    return [(r["step"], r[field]) for r in read_metrics(run) if r.get("kind") == kind]


def test_val_bpb_is_the_loss_over_the_bytes_of_the_validation_targets(
    tracked: dict[str, Any], tiny_data: Path
) -> None:
    data = TokenData.open(tiny_data)
    val = data.val_batches(batch_size=4, context_length=16, num_batches=2)
    text = "".join(data.decode(y) for _, y in val).replace("<|endoftext|>", "")
    tokens = val.predicted_tokens
    evals = [r for r in read_metrics(tracked["run"]) if r.get("kind") == "eval"]
    assert [r["step"] for r in evals] == [0, 6, 12]
    for r in evals:
        want = r["val_loss"] * tokens / (math.log(2) * len(text.encode("utf-8")))
        assert r["val_bpb"] == pytest.approx(want, rel=1e-9)


def test_tensorboard_holds_the_series_hyperparameters_and_checkpoint(
    tracked: dict[str, Any],
) -> None:
    pytest.importorskip("tensorboard", reason=extra("tensorboard"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tracked["run"]
    acc = EventAccumulator(str(run / TB_DIR), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    for kind, field in [("train", "loss"), ("train", "lr"), ("train", "grad_norm"),
                        ("eval", "val_loss"), ("eval", "val_bpb"), ("eval", "val_ppl")]:  # fmt: skip
        logged = [(e.step, e.value) for e in acc.Scalars(f"{kind}/{field}")]
        want = _series(run, kind, field)
        assert [s for s, _ in logged] == [s for s, _ in want]
        assert np.allclose([v for _, v in logged], [v for _, v in want], rtol=1e-6)
    text = {
        t: acc.Tensors(t)[-1].tensor_proto.string_val[0].decode()
        for t in ("checkpoint/text_summary", "spec/text_summary")
    }
    assert text["checkpoint/text_summary"] == str(tracked["result"].checkpoint.model.resolve())
    assert json.loads((run / "run.json").read_text())["spec"] in text["spec/text_summary"]
    hparams = acc.PluginTagToContent("hparams")
    assert "_hparams_/session_start_info" in hparams
    start = hparams["_hparams_/session_start_info"].decode("latin-1")
    assert "norm.dist" in start and "lmcore-registry" in start and "config.lr" in start


def test_mlflow_holds_the_series_hyperparameters_and_checkpoint(tracked: dict[str, Any]) -> None:
    pytest.importorskip("mlflow", reason=extra("mlflow"))
    from mlflow.tracking import MlflowClient

    run = tracked["run"]
    state = json.loads((run / STATE_FILE).read_text())["mlflow"]
    client = MlflowClient(tracked["uri"])
    info = client.get_run(state["run_id"])
    assert info.info.run_name == "run" and info.info.status == "FINISHED"
    assert client.get_experiment(info.info.experiment_id).name == "tracked-test"
    for kind, field in [("train", "loss"), ("eval", "val_loss"), ("eval", "val_bpb")]:
        logged = [
            (m.step, m.value) for m in client.get_metric_history(state["run_id"], f"{kind}/{field}")
        ]
        want = _series(run, kind, field)
        assert [s for s, _ in sorted(logged)] == [s for s, _ in want]
        assert [v for _, v in sorted(logged)] == pytest.approx([v for _, v in want])
    params = info.data.params
    saved = json.loads((run / "run.json").read_text())
    assert params["spec"] == saved["spec"] and params["norm.dist"] == "lmcore-registry"
    assert params["config.lr"] == str(saved["config"]["lr"]) and params["config.eval_bpb"] == "True"
    assert info.data.tags["lmcore.checkpoint"] == str(tracked["result"].checkpoint.model.resolve())


def _wandb_records(path: Path) -> list[Any]:
    """The records of a W&B transaction log (.wandb): LevelDB-log framing (32 KiB blocks,
    7-byte chunk headers) around W&B's own protobuf `Record`s."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, out, pending = 7, [], b""
    while pos + 7 <= len(data):
        room = 32768 - pos % 32768
        if room < 7:  # the rest of a block is padding
            pos += room
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def test_wandb_offline_run_holds_the_series_config_and_checkpoint(tracked: dict[str, Any]) -> None:
    pytest.importorskip("wandb", reason=extra("wandb"))
    run = tracked["run"]
    (log,) = run.glob("wandb/offline-run-*/run-*.wandb")
    records = _wandb_records(log)
    history: dict[str, list[tuple[int, float]]] = {}
    config: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    group = None
    for r in records:
        which = r.WhichOneof("record_type")
        if which == "history":
            items = {
                ("/".join(i.nested_key) or i.key): json.loads(i.value_json) for i in r.history.item
            }
            for k, v in items.items():
                if "/" in k:
                    history.setdefault(k, []).append((items["_step"], v))
        elif which == "config":
            config.update({i.key: json.loads(i.value_json) for i in r.config.update})
        elif which == "summary":
            summary.update(
                {
                    ("/".join(i.nested_key) or i.key): json.loads(i.value_json)
                    for i in r.summary.update
                }
            )
        elif which == "run":  # the run's first record holds its config too
            group = r.run.run_group
            config.update({i.key: json.loads(i.value_json) for i in r.run.config.update})
    for kind, field in [("train", "loss"), ("eval", "val_loss"), ("eval", "val_bpb")]:
        want = _series(run, kind, field)
        assert [s for s, _ in history[f"{kind}/{field}"]] == [s for s, _ in want]
        assert [v for _, v in history[f"{kind}/{field}"]] == pytest.approx([v for _, v in want])
    saved = json.loads((run / "run.json").read_text())
    assert config["spec"] == saved["spec"] and config["ffn.dist"] == "lmcore-registry"
    assert summary["checkpoint"] == str(tracked["result"].checkpoint.model.resolve())
    assert group == "tracked-test"


def test_a_sweep_logs_each_variant_as_its_own_run_grouped_under_the_sweep(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow", reason=extra("mlflow"))
    from mlflow.tracking import MlflowClient

    from lmcore.train.sweep import sweep

    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    config = TrainConfig(steps=2, batch_size=4, eval_batches=1, save_every=0, loggers=("mlflow",))
    result = sweep(
        TINY_SPEC, ["pos=nope", "schedule=wsd"], tiny_data, tmp_path / "ablation", config,
        echo=None,
    )  # fmt: skip
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("ablation")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    assert sorted(r.info.run_name for r in runs) == sorted(Path(r.run).name for r in result.rows)
    by_name = {r.info.run_name: r.data.params for r in runs}
    assert sorted((p["pos"], p["config.schedule"]) for p in by_name.values()) == [
        ("nope", "cosine"),
        ("rope(theta=10000.0)", "cosine"),
        ("rope(theta=10000.0)", "wsd(decay=0.2,shape=sqrt)"),  # a recipe variant: its own run
    ]


# ------------------------------------------------------------------ endpoints that fail (issue 32)


def test_an_mlflow_server_that_does_not_answer_fails_before_the_run_directory(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow", reason=extra("mlflow"))
    import time

    from lmcore.errors import TrainError
    from lmcore.train import endpoints
    from lmcore.train.trackers import check_trackers
    from tests.helpers.errors import raises_naming
    from tests.helpers.net import closed_port, http_server, silent_port

    monkeypatch.setattr(endpoints, "CONNECT_TIMEOUT_S", 1.0)
    uri = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    config = TrainConfig(steps=1, batch_size=2, eval_batches=1, loggers=("mlflow",))
    with raises_naming(TrainError, f"--logger mlflow: MLFLOW_TRACKING_URI {uri}",
                       "cannot connect", "refused", "start the tracking server"):  # fmt: skip
        train(TINY_SPEC, tiny_data, tmp_path / "run", config, echo=None)
    assert not (tmp_path / "run").exists()
    with silent_port() as port:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
        start = time.monotonic()
        with raises_naming(TrainError, f"MLFLOW_TRACKING_URI http://127.0.0.1:{port}",
                           "does not answer within 1 s", "connect timeout"):  # fmt: skip
            check_trackers(["mlflow"])
        assert time.monotonic() - start < 5
    with http_server(404) as port:  # a server that answers is there, whatever it says
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
        check_trackers(["mlflow"])


def test_a_read_only_mlflow_store_is_one_line_at_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow", reason=extra("mlflow"))
    import errno
    import types

    from lmcore.errors import TrainError
    from lmcore.train import trackers
    from tests.helpers.errors import raises_naming

    def read_only(**_: Any) -> Any:
        raise OSError(errno.EROFS, "Read-only file system")

    store = tmp_path / "store"
    store.mkdir()
    uri = f"sqlite:///{store / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    trackers.check_trackers(["mlflow"])  # writable: nothing to say
    # a read-only mount, as the file system answers (root writes anywhere else)
    monkeypatch.setattr(trackers, "tempfile", types.SimpleNamespace(TemporaryFile=read_only))
    with raises_naming(TrainError, f"MLFLOW_TRACKING_URI {uri}", f"cannot write in {store}",
                       "Read-only file system", "unset MLFLOW_TRACKING_URI"):  # fmt: skip
        trackers.check_trackers(["mlflow"])
    monkeypatch.undo()
    (tmp_path / "file").write_text("")
    uri = f"sqlite:///{tmp_path / 'file' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with raises_naming(TrainError, f"{tmp_path / 'file'} is not a directory"):
        trackers.check_trackers(["mlflow"])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "new" / "mlruns").as_uri())
    trackers.check_trackers(["mlflow"])  # a file store is made where it is missing


def test_wandb_online_probes_its_server_and_offline_needs_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("wandb", reason=extra("wandb"))
    from lmcore.errors import TrainError
    from lmcore.train.trackers import check_trackers
    from tests.helpers.errors import raises_naming
    from tests.helpers.net import closed_port

    url = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("WANDB_BASE_URL", url)
    monkeypatch.setenv("WANDB_MODE", "online")
    with raises_naming(TrainError, f"--logger wandb: the W&B server {url}", "cannot connect",
                       "WANDB_MODE=offline"):  # fmt: skip
        check_trackers(["wandb"], timeout=1.0)
    monkeypatch.setenv("WANDB_MODE", "offline")
    check_trackers(["wandb"], timeout=1.0)  # offline: no server to reach


def test_an_mlflow_server_failing_as_the_run_opens_is_one_line_not_minutes_of_retries(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow", reason=extra("mlflow"))
    import os
    import time

    from lmcore.errors import TrainError
    from tests.helpers.errors import raises_naming
    from tests.helpers.net import http_server

    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    config = TrainConfig(steps=1, batch_size=2, eval_batches=1, loggers=("mlflow",))
    with http_server(503) as port:  # it answers (the probe passes), then every call fails
        uri = f"http://127.0.0.1:{port}"
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        start = time.monotonic()
        with raises_naming(TrainError, f"--logger mlflow: the store {uri} failed", "503"):
            train(TINY_SPEC, tiny_data, tmp_path / "run", config, echo=None)
        assert time.monotonic() - start < 20  # MLflow's own retries: 7, for minutes
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # bounded only while opening


def test_a_tracker_failing_as_it_opens_is_one_line_naming_it_and_where(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("tensorboard", reason=extra("tensorboard"))
    import errno

    from lmcore.errors import TrainError
    from lmcore.train import trackers
    from tests.helpers.errors import raises_naming

    def read_only(*_: Any) -> None:  # as SummaryWriter fails on a read-only file system
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(trackers, "_TensorBoard", read_only)
    config = TrainConfig(steps=1, batch_size=2, eval_batches=1, loggers=("tensorboard",))
    run = tmp_path / "run"
    with raises_naming(TrainError, f"--logger tensorboard: cannot write {run / TB_DIR}",
                       "Read-only file system"):  # fmt: skip
        train(TINY_SPEC, tiny_data, run, config, echo=None)
