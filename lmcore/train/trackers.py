"""Experiment trackers beside `metrics.jsonl`: TensorBoard, MLflow and Weights & Biases, each
through its own library (an optional extra of the same name).

    lmcore train SPEC --data DIR --out runs/a --logger tensorboard --logger mlflow

Every tracker gets the same series as `metrics.jsonl`: each number of a train record as
`train/<field>` and of an eval record as `eval/<field>` (`eval/val_loss`, `eval/val_bpb`, ...)
at the record's step; the experiment as hyperparameters (the canonical spec and its tag, every
component with the distribution, version, plugin and module that provided it, every training
option as `config.<name>`, the data and the versions); how the run ended, and the path of the
final checkpoint.

- `tensorboard`: event files in `RUN/tensorboard/` through `torch.utils.tensorboard`, the
  hyperparameters for TensorBoard's HParams tab, the spec and the checkpoint as text;
  `tensorboard --logdir RUN` (or the sweep's directory, showing every variant).
- `mlflow`: a run named after the run directory in the experiment `log_group` (default
  `lmcore`), in the store `MLFLOW_TRACKING_URI` names, else a local SQLite file beside the run
  directory, `sqlite:///<RUN's parent>/mlflow.db` (`mlflow ui --backend-store-uri` it).
- `wandb`: a run in project `WANDB_PROJECT` (default `lmcore`), group `log_group`, files under
  `RUN/wandb/`; offline (`wandb sync` uploads it later) unless W&B credentials are set up
  (`wandb login`, or `WANDB_API_KEY`) or `WANDB_MODE` says otherwise.

Before the run directory is written, `check_trackers` checks where they write: an HTTP tracking
server answers within the connect timeout (`lmcore.train.endpoints`), a SQLite or file store
can be written, W&B's server answers when logging online. A tracker that fails as it opens is
one `TrainError` naming it and where it writes.

A resumed run continues the same tracker runs (their ids are kept in `RUN/trackers.json`);
TensorBoard drops what an interrupted session logged after the checkpoint it resumes from.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import netrc
import os
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from lmcore.components import KINDS
from lmcore.errors import TrainError
from lmcore.train import endpoints
from lmcore.train.config import TRACKERS, TrainConfig
from lmcore.train.endpoints import connect, host_port, probe_http
from lmcore.train.runs import write_json

if TYPE_CHECKING:
    from lmcore.blueprint import Blueprint
    from lmcore.train.runs import Checkpoint

__all__ = [
    "STATE_FILE",
    "TB_DIR",
    "TRACKERS",
    "Trackers",
    "check_trackers",
    "hyperparameters",
    "open_trackers",
    "series",
]

TB_DIR: Final = "tensorboard"
STATE_FILE: Final = "trackers.json"
DEFAULT_GROUP: Final = "lmcore"
_MODULE = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
WANDB_URL: Final = "https://api.wandb.ai"  # W&B's server unless WANDB_BASE_URL says another

Scalar = str | int | float | bool


def check_trackers(names: tuple[str, ...] | list[str], timeout: float | None = None) -> None:
    """`TrainError` before any run directory is written: naming the extra to install for the
    first tracker whose library is missing; the store `MLFLOW_TRACKING_URI` names when it is
    read-only or its server does not answer; the W&B server when logging online and it does
    not answer. A server gets a connect and a first answer within `timeout` seconds each
    (default `lmcore.train.endpoints.CONNECT_TIMEOUT_S`)."""
    for name in names:
        if name not in TRACKERS:
            raise TrainError(f"--logger {name}: must be one of {', '.join(TRACKERS)}")
        if importlib.util.find_spec(_MODULE[name]) is None:
            raise TrainError(
                f"--logger {name} needs the '{name}' extra: pip install 'lmcore-registry[{name}]'"
            )
    if "mlflow" in names and os.environ.get("MLFLOW_TRACKING_URI"):
        check_mlflow_store(os.environ["MLFLOW_TRACKING_URI"], timeout)
    if "wandb" in names and _wandb_mode() == "online":
        url = os.environ.get("WANDB_BASE_URL") or WANDB_URL
        probe_http(url, f"--logger wandb: the W&B server {url}", "check the network (or "
                   "WANDB_BASE_URL), or log offline with WANDB_MODE=offline and `wandb sync` "
                   "later", timeout)  # fmt: skip


_DB_PORTS: Final = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}


def check_mlflow_store(uri: str, timeout: float | None = None) -> None:
    """`TrainError` naming `uri` when MLflow could not write there: an HTTP server that does
    not answer (MLflow itself retries for minutes), a SQLite file or a directory that cannot
    be written, a database server that takes no connection."""
    what = f"--logger mlflow: MLFLOW_TRACKING_URI {uri}"
    fix = ("start the tracking server, or give another MLFLOW_TRACKING_URI (unset: a SQLite "
           "file beside the run)")  # fmt: skip
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else "file"
    if scheme in ("http", "https"):
        probe_http(uri, what, fix, timeout)
    elif scheme == "sqlite":
        path = uri.split("://", 1)[1]
        path = path[1:] if path.startswith("/") else path  # sqlite:///rel.db, sqlite:////abs.db
        if path and path != ":memory:" and not path.startswith("file:"):
            _writable(Path(path), what)
    elif scheme == "file":  # a directory of files, made when missing
        path = urllib.parse.unquote(urllib.parse.urlparse(uri).path) if "://" in uri else uri
        _writable(Path(path) / "meta.yaml", what)
    elif scheme.split("+")[0] in _DB_PORTS:  # postgresql+psycopg2://user@host:port/db
        rest = uri.split("://", 1)[1].split("/", 1)[0].rsplit("@", 1)[-1]
        port = _DB_PORTS[scheme.split("+")[0]]
        if not rest.rsplit("]", 1)[-1].count(":"):
            rest = f"{rest}:{port}"
        host, port = host_port(rest, what, "HOST[:PORT]")
        connect(host, port, what, fix, timeout).close()


def _writable(file: Path, what: str) -> None:
    """That `file` can be written (or made): its directory, or the nearest one of its parents
    that exists, tried with a temporary file, so the reason is the file system's own
    (read-only, permission denied)."""
    if file.exists() and not os.access(file, os.W_OK):
        raise TrainError(f"{what}: {file} is not writable; give a store this user can write")
    folder = file.parent if str(file.parent) else Path(".")
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise TrainError(f"{what}: {folder} is not a directory; give another store")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise TrainError(
            f"{what}: cannot write in {folder} ({e.strerror}); give a store on a writable "
            "file system (unset MLFLOW_TRACKING_URI: a SQLite file beside the run)"
        ) from None


def hyperparameters(info: Mapping[str, Any], bp: Blueprint) -> dict[str, Scalar]:
    """The experiment as flat scalars: spec, components and their provenance, options, data."""
    hp: dict[str, Scalar] = {"spec": info["spec"], "tag": info["tag"]}
    hp["spec_hash"] = info["spec_hash"]
    if info.get("parameters") is not None:
        hp["parameters"] = int(info["parameters"])
    for kind in KINDS:
        prov = bp.provenance(kind)
        hp[kind] = str(bp.spec.component(kind))
        hp[f"{kind}.dist"] = prov.dist or "registered in-process"
        hp[f"{kind}.version"] = prov.version or ""
        hp[f"{kind}.plugin"] = prov.plugin
        hp[f"{kind}.module"] = prov.module
    for key, value in info["config"].items():
        ok = isinstance(value, str | int | float | bool)
        hp[f"config.{key}"] = value if ok else json.dumps(value)
    hp["data"] = str(info["data"]["path"])
    for key, value in info.get("versions", {}).items():
        hp[f"versions.{key}"] = str(value)
    return hp


def series(record: Mapping[str, Any]) -> dict[str, float]:
    """A train or eval record's numbers as `train/<field>` or `eval/<field>`; {} otherwise."""
    kind = record.get("kind")
    if kind not in ("train", "eval"):
        return {}
    return {
        f"{kind}/{k}": float(v)
        for k, v in record.items()
        if k not in ("kind", "step") and isinstance(v, int | float) and not isinstance(v, bool)
    }


class _Tracker(Protocol):
    def log(self, step: int, values: Mapping[str, float]) -> None: ...
    def status(self, state: str, step: int) -> None: ...
    def close(self, checkpoint: Checkpoint | None, state: str) -> None: ...


class Trackers:
    """The trackers of one run: each record goes to every one of them."""

    def __init__(self, trackers: list[_Tracker]):
        self.trackers = trackers
        self.state = "running"
        self.closed = False

    def log(self, record: Mapping[str, Any]) -> None:
        values = series(record)
        step = int(record.get("step", 0))
        for t in self.trackers:
            if values:
                t.log(step, values)
            elif record.get("kind") == "event":
                self.state = str(record.get("event"))
                t.status(self.state, step)

    def close(self, checkpoint: Checkpoint | None) -> None:
        if self.closed:
            return
        self.closed = True
        for t in self.trackers:
            t.close(checkpoint, self.state)


def open_trackers(
    config: TrainConfig, run: Path, info: Mapping[str, Any], bp: Blueprint, step: int
) -> Trackers | None:
    """The trackers `config.loggers` names for the run in `run` (starting or resuming at
    `step`), None when there are none."""
    if not config.loggers:
        return None
    check_trackers(config.loggers)
    hp = hyperparameters(info, bp)
    group = config.log_group or DEFAULT_GROUP
    state_file = run / STATE_FILE
    state: dict[str, Any] = {}
    if step and state_file.is_file():
        with contextlib.suppress(ValueError):
            state = json.loads(state_file.read_text(encoding="utf-8"))
    made: list[_Tracker] = []
    for name in dict.fromkeys(config.loggers):
        saved = state.get(name, {})
        try:
            if name == "tensorboard":
                made.append(_TensorBoard(run, hp, group, step))
            elif name == "mlflow":
                made.append(_Mlflow(run, hp, group, saved.get("run_id")))
                state[name] = {"run_id": made[-1].run_id, "tracking_uri": made[-1].uri}  # type: ignore[attr-defined]
            else:
                made.append(_Wandb(run, hp, group, saved.get("id")))
                state[name] = {"id": made[-1].run.id}  # type: ignore[attr-defined]
        except Exception as e:  # the library's own error, as one line naming where
            for tracker in made:  # those already open end as failed
                with contextlib.suppress(Exception):
                    tracker.close(None, "failed")
            raise TrainError(f"--logger {name}: {_where(name, run)}: {_first_line(e)}") from None
    if state:
        write_json(state_file, state)
    return Trackers(made)


def _where(name: str, run: Path) -> str:
    """Where tracker `name` writes for the run in `run`, as its error names it."""
    if name == "tensorboard":
        return f"cannot write {run / TB_DIR}"
    if name == "mlflow":
        return f"the store {os.environ.get('MLFLOW_TRACKING_URI') or _default_store(run)} failed"
    return f"W&B ({_wandb_mode()}, files under {run / 'wandb'}) failed"


def _first_line(e: BaseException) -> str:
    text = next((x.strip() for x in str(e).splitlines() if x.strip()), "")
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _default_store(run: Path) -> str:
    """MLflow's store when MLFLOW_TRACKING_URI is unset: a SQLite file beside the run."""
    return f"sqlite:///{(run.resolve().parent / 'mlflow.db').as_posix()}"


# ------------------------------------------------------------------------------ TensorBoard


class _TensorBoard:
    def __init__(self, run: Path, hp: dict[str, Scalar], group: str, step: int):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        # Resuming from step S: events of an earlier session after S are dropped on reading.
        self.writer = SummaryWriter(str(run / TB_DIR), purge_step=step + 1 if step else None)
        metrics = {"eval/val_loss": 0.0, "train/loss": 0.0}
        if hp.get("config.eval_bpb"):
            metrics["eval/val_bpb"] = 0.0
        if not step:
            writer = self.writer._get_file_writer()  # type: ignore[no-untyped-call]
            for summary in hparams({**hp, "group": group}, metrics):  # type: ignore[no-untyped-call]
                writer.add_summary(summary)
            self.writer.add_text("spec", f"`{hp['spec']}`", 0)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def status(self, state: str, step: int) -> None:
        self.writer.add_text("status", f"{state} at step {step}", step)

    def close(self, checkpoint: Checkpoint | None, state: str) -> None:
        if checkpoint is not None:
            self.writer.add_text("checkpoint", str(checkpoint.model.resolve()), checkpoint.step)
        self.writer.close()


# ------------------------------------------------------------------------------ MLflow


@contextlib.contextmanager
def _bounded_start() -> Iterator[None]:
    """MLflow's HTTP calls bounded while a run opens (one retry, the connect timeout per
    request), where the environment does not set them: its defaults retry for minutes. The
    run's later calls get MLflow's own (or the environment's) settings."""
    timeout = str(math.ceil(endpoints.CONNECT_TIMEOUT_S))
    given = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": timeout}
    unset = [k for k in given if k not in os.environ]
    os.environ.update({k: given[k] for k in unset})
    try:
        yield
    finally:
        for k in unset:
            os.environ.pop(k, None)


class _Mlflow:
    def __init__(self, run: Path, hp: dict[str, Scalar], group: str, run_id: str | None):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.uri = os.environ.get("MLFLOW_TRACKING_URI") or _default_store(run)
        self.client = MlflowClient(self.uri)
        with _bounded_start():  # a server that fails at the start: one line, not minutes
            if run_id is None:
                found = self.client.get_experiment_by_name(group)
                exp = found.experiment_id if found else self.client.create_experiment(group)
                tags = {"lmcore.run": str(run.resolve()), "lmcore.tag": str(hp["tag"])}
                made = self.client.create_run(exp, run_name=run.name, tags=tags)
                self.run_id: str = made.info.run_id
                params = [Param(k, str(v)[:6000]) for k, v in hp.items()]
                for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
                    self.client.log_batch(self.run_id, params=params[i : i + 100])
            else:
                self.run_id = run_id
                self.client.update_run(run_id, status="RUNNING")

    def log(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def status(self, state: str, step: int) -> None:
        self.client.set_tag(self.run_id, "lmcore.status", f"{state} at step {step}")

    def close(self, checkpoint: Checkpoint | None, state: str) -> None:
        if checkpoint is not None:
            self.client.set_tag(self.run_id, "lmcore.checkpoint", str(checkpoint.model.resolve()))
        ended = {"done": "FINISHED", "interrupted": "KILLED"}.get(state, "FAILED")
        self.client.set_terminated(self.run_id, status=ended)


# ------------------------------------------------------------------------------ W&B


def _wandb_mode() -> str:
    """W&B's mode: WANDB_MODE, else online when logged in, else offline."""
    return os.environ.get("WANDB_MODE") or ("online" if _wandb_logged_in() else "offline")


def _wandb_logged_in() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


class _Wandb:
    def __init__(self, run: Path, hp: dict[str, Scalar], group: str, run_id: str | None):
        import wandb

        mode: Any = _wandb_mode()
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "lmcore"),
            group=group,
            name=run.name,
            dir=str(run),
            config=hp,
            id=run_id,
            resume="allow" if run_id else None,
            mode=mode,
            settings=wandb.Settings(console="off", silent=True),
        )

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log({k: v for k, v in values.items() if math.isfinite(v)}, step=step)

    def status(self, state: str, step: int) -> None:
        self.run.summary["status"] = f"{state} at step {step}"

    def close(self, checkpoint: Checkpoint | None, state: str) -> None:
        if checkpoint is not None:
            self.run.summary["checkpoint"] = str(checkpoint.model.resolve())
        self.run.finish(exit_code=0 if state == "done" else 1)
