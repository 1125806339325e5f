"""A sweep in one TOML file: `lmcore sweep sweep.toml`, and `SWEEP/sweep.toml` it writes.

    base = "vocab_size=2048, context_length=128, d_model=128, num_layers=4, num_heads=4"
    variants = ["pos=nope", "pos=alibi"]   # or the recipe's keys: "schedule=wsd", ...
    data = "data/stdlib-2k"
    out = "sweeps/pos"
    seeds = 3
    match = "params"            # or "flops"; leave out for none

    [train]                     # TrainConfig's fields, as lmcore train's options
    steps = 300
    batch_size = 16
    lr = 3e-3

    [launcher]
    name = "local"              # or "submitit", "ray"
    threads = 1                 # torch threads per run
    cpus_per_run = 1
    gpus_per_run = 0

    [launcher.slurm]            # with name = "submitit"
    partition = "gpu"
    time = "1:00:00"
    extra = { account = "cs336" }
    cluster = "slurm"           # or "local": submitit's local executor

    [launcher.ray]
    address = "auto"            # leave out for a local Ray

Every key is checked (an unknown one is an error with a suggestion); the command line's
options, given too, override the file's. The sweep writes its whole definition back as
`SWEEP/sweep.toml`, so `lmcore sweep SWEEP/sweep.toml` (or `lmcore sweep --resume SWEEP`) runs
it again from its own directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from lmcore.errors import TrainError, did_you_mean
from lmcore.train.config import CLI_OPTIONS, TrainConfig
from lmcore.train.launch import MAX_GPUS, MAX_THREADS, LauncherOptions
from lmcore.train.options import to_flags

MAX_SEEDS: Final = 1000  # seeds per variant: more is a typo, not an experiment
TOP: Final = ("base", "variants", "data", "out", "seeds", "match", "train", "launcher")
LAUNCHER: Final = ("name", "threads", "cpus_per_run", "gpus_per_run", "slurm", "ray")
SLURM: Final = ("partition", "time", "extra", "cluster")
RAY: Final = ("address",)


@dataclass(frozen=True)
class SweepDefinition:
    """Everything a sweep is: what it trains, how long, how it compares, where it runs."""

    base: str | None = None
    variants: tuple[str, ...] = ()
    data: str | None = None
    out: str | None = None
    seeds: int = 1
    match: str | None = None
    train: Mapping[str, Any] = field(default_factory=dict)  # TrainConfig fields given
    launcher: LauncherOptions = field(default_factory=LauncherOptions)

    def to_toml(self) -> str:
        lines = []
        for key in ("base", "variants", "data", "out", "seeds", "match"):
            value = getattr(self, key)
            if value is not None and value != ():
                lines.append(f"{key} = {_value(value)}")
        train = train_table(self.train)
        lines += ["", "[train]"]
        lines += [f"{k} = {_value(v)}" for k, v in train.items() if v is not None]
        opts = self.launcher
        lines += ["", "[launcher]", f"name = {_value(opts.name)}"]
        for key in ("threads", "cpus_per_run", "gpus_per_run"):
            if getattr(opts, key) is not None:
                lines.append(f"{key} = {_value(getattr(opts, key))}")
        slurm = {"partition": opts.slurm_partition, "time": opts.slurm_time,
                 "extra": dict(opts.slurm_extra) or None,
                 "cluster": opts.slurm_cluster}  # fmt: skip
        if opts.name == "submitit" or any(
            slurm[k] is not None for k in ("partition", "time", "extra")
        ):
            lines += ["", "[launcher.slurm]"]
            lines += [f"{k} = {_value(v)}" for k, v in slurm.items() if v is not None]
        if opts.ray_address is not None:
            lines += ["", "[launcher.ray]", f"address = {_value(opts.ray_address)}"]
        return "\n".join(lines) + "\n"


def _value(v: Any) -> str:
    """A TOML value: strings and keys through JSON's escapes (a subset of TOML's)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_value(x)}" for k, x in v.items()) + " }"
    raise TrainError(f"no TOML for {v!r}")


def _load_toml(path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TrainError(f"sweep file {str(path)!r} does not exist") from None
    except OSError as e:
        raise TrainError(f"sweep file {str(path)!r}: cannot read it: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:  # TOML is UTF-8: say where, not tomllib's traceback
        line = raw.count(b"\n", 0, e.start) + 1
        raise TrainError(
            f"{path}: not UTF-8 at byte {e.start} (line {line}: byte 0x{raw[e.start]:02x}); a "
            "TOML file is UTF-8 text: save it as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None
    try:
        doc: dict[str, Any] = tomllib.loads(text)
        return doc
    except tomllib.TOMLDecodeError as e:
        raise TrainError(f"{path}: not a TOML file: {e}") from None


def _known(table: Mapping[str, Any], keys: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in keys:
            raise TrainError(
                f"{where}: unknown key {key!r}{did_you_mean(key, keys)}; the keys are "
                f"{', '.join(keys)}"
            )


def _typed(value: Any, kind: type | tuple[type, ...], where: str, what: str) -> Any:
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise TrainError(f"{where}: must be {what}, got {value!r}")
    return value


def _count(value: Any, where: str, low: int, high: int, what: str) -> int | None:
    """An integer count of the file in [low, high] (None when left out): a float token such as
    `1e9` or a number past `high` is refused before it sizes anything."""
    if value is None:
        return None
    _typed(value, int, where, f"an integer from {low} to {high} ({what})")
    if not low <= value <= high:
        raise TrainError(f"{where}: {value} is out of range: must be from {low} to {high} ({what})")
    return int(value)


def read_definition(path: str | os.PathLike[str]) -> SweepDefinition:
    """The sweep file at `path`, checked key by key."""
    file = Path(path)
    doc = _load_toml(file)
    _known(doc, TOP, str(file))
    variants = _typed(doc.get("variants", []), list, f"{file}: variants", "a list of strings")
    for v in variants:
        _typed(v, str, f"{file}: variants", 'a list of strings such as ["pos=nope"]')
    train = _typed(doc.get("train", {}), dict, f"{file}: [train]", "a table")
    _known(train, CLI_OPTIONS, f"{file}: [train]")
    train = train_table(train)
    launcher = _typed(doc.get("launcher", {}), dict, f"{file}: [launcher]", "a table")
    _known(launcher, LAUNCHER, f"{file}: [launcher]")
    slurm = _typed(launcher.get("slurm", {}), dict, f"{file}: [launcher.slurm]", "a table")
    _known(slurm, SLURM, f"{file}: [launcher.slurm]")
    ray = _typed(launcher.get("ray", {}), dict, f"{file}: [launcher.ray]", "a table")
    _known(ray, RAY, f"{file}: [launcher.ray]")
    extra = _typed(slurm.get("extra", {}), dict, f"{file}: [launcher.slurm] extra", "a table")
    time = slurm.get("time")
    where = f"{file}: launcher."
    options = LauncherOptions(
        name=_typed(launcher.get("name", "local"), str, f"{file}: launcher.name", "a string"),
        threads=_count(launcher.get("threads"), where + "threads", 1, MAX_THREADS,
                       "torch threads per run"),
        cpus_per_run=_count(launcher.get("cpus_per_run"), where + "cpus_per_run", 1, MAX_THREADS,
                            "CPUs per run"),
        gpus_per_run=_count(launcher.get("gpus_per_run", 0), where + "gpus_per_run", 0, MAX_GPUS,
                            "GPUs per run") or 0,
        slurm_partition=slurm.get("partition"),
        slurm_time=None if time is None else str(time),
        slurm_extra={str(k): str(v) for k, v in extra.items()},
        slurm_cluster=slurm.get("cluster", "slurm"),
        ray_address=_typed(ray.get("address"), str, f"{file}: [launcher.ray] address",
                           'a string such as "auto" or "10.0.0.5:6379"')
        if "address" in ray else None,
    )
    seeds = _count(doc.get("seeds", 1), f"{file}: seeds", 1, MAX_SEEDS, "seeds per variant") or 1
    match = doc.get("match")
    if match is not None:
        _typed(match, str, f"{file}: match", '"params" or "flops"')
    for key in ("base", "data", "out"):
        if key in doc:
            _typed(doc[key], str, f"{file}: {key}", "a string")
    return SweepDefinition(base=doc.get("base"), variants=tuple(variants), data=doc.get("data"),
                           out=doc.get("out"), seeds=seeds, match=match, train=train,
                           launcher=options)  # fmt: skip


def train_table(values: Mapping[str, Any]) -> dict[str, Any]:
    """Training options as a sweep file's `[train]` holds them, as `lmcore train`'s flags take
    them: `grad_clip = 0` for no clipping, lists for several values."""
    return to_flags(values, TrainConfig)


def train_config(train: Mapping[str, Any]) -> TrainConfig:
    """The `TrainConfig` of a definition's `train` table (`grad_clip = 0`: no clipping)."""
    return TrainConfig.from_flags(train)


def merged(file: SweepDefinition, **given: Any) -> SweepDefinition:
    """`file` with the values `given` (not None) in place of its own; `train` and `launcher`
    are merged key by key (`given["train"]`: a dict, `given["launcher"]`: a dict of
    `LauncherOptions` fields)."""
    values: dict[str, Any] = {k: v for k, v in given.items()
                              if v is not None and k not in ("train", "launcher")}  # fmt: skip
    train = {**file.train, **(given.get("train") or {})}
    launcher = dataclasses.replace(file.launcher, **(given.get("launcher") or {}))
    return dataclasses.replace(file, **values, train=train, launcher=launcher)


def write_definition(
    definition: SweepDefinition, path: str | os.PathLike[str], source: str | None = None
) -> None:
    """`definition` as TOML at `path`, atomically; its first line names `source`."""
    from lmcore.atomic import atomic_write

    head = "# lmcore sweep's definition of this sweep"
    head += f", from {source}" if source else ""
    head += "; `lmcore sweep --resume DIR` continues it\n"
    with atomic_write(Path(path), "w") as f:
        f.write(head + definition.to_toml())
