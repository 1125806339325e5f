"""The training runner behind `lmcore train`: AdamW, a cosine schedule, evaluation, checkpoints.

    from lmcore.train.trainer import TrainConfig, resume, train

    result = train("cs336-tiny, vocab_size=2048", "data/stdlib", "runs/tiny",
                   TrainConfig(steps=300, batch_size=16, lr=1e-3))
    result = resume("runs/tiny")              # after Ctrl-C: continues bit for bit
    result = resume("runs/tiny", steps=600)   # or trains on, at the schedule's floor

One step `t` (1, 2, ..., steps) draws batch `t - 1` of the train split (a pure function of the
seed and the step, `lmcore.data.BatchSampler`), runs forward and next-token cross-entropy
plus the recipe's loss terms (`lmcore.train.losses`: `--z-loss`, the model's auxiliary loss;
under bf16 autocast if asked), backward, clips the gradients to a global norm, and applies
the run's optimizer (`--optimizer`, a registry kind: default `adamw`) at the run's schedule's
learning rate for step t (`--schedule`: default `cosine`, CS336's), each parameter group's
scaled by its role's multiplier. The recipe is resolved once (`lmcore.train.recipe.Recipe`),
before the run directory exists, and its plugins are recorded in run.json and every checkpoint.

Every `eval_every` steps (and before the first, and after the last) the mean loss over a fixed
set of `eval_batches` validation batches is recorded with its perplexity. Every `log_every`
steps a train record is written; every `save_every` steps, at the end and on Ctrl-C or SIGTERM
a checkpoint (`lmcore.train.state`). A non-finite loss ends the run as "diverged at step S":
recorded in the metrics and `run.json`, not raised. `lmcore.train.runs` describes the directory.

The loop knows one process; the hooks for more are in one place, `Parallel`: its `rank` and
`world_size` pick each process's rows of every batch, `wrap` wraps the model (DDP, FSDP),
`mean` averages what is logged, `any` agrees on stopping, and only the `is_writer` process
writes metrics, plots and checkpoints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import math
import os
import random
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from lmcore.atomic import atomic_path
from lmcore.blueprint import Blueprint, resolve
from lmcore.checkpoint import CheckpointInfo, base_identity, read_info
from lmcore.data.bytecount import bytes_per_token
from lmcore.data.packing import DocumentEvalBatches, document_sampler, packed_sampler, packing_of
from lmcore.data.tokens import TokenData
from lmcore.errors import TrainError
from lmcore.model.inputs import resolve_device
from lmcore.model.nn import IGNORE, cross_entropy
from lmcore.model.parametrization import check_optimizer
from lmcore.model.recompute import apply_recompute
from lmcore.registry import Registry
from lmcore.sources import Source, source_of
from lmcore.spec import ModelSpec
from lmcore.train.accumulate import micro_batches, micro_steps, micro_weights, weighted
from lmcore.train.config import RESUMABLE, ResolvedConfig, TrainConfig, cosine_lr, decay_roles
from lmcore.train.finetune import adapted_blueprint, check_tokenizer, initial_model, tokenizer_files
from lmcore.train.losses import logged, window_means
from lmcore.train.optim import clip_gradients, make_optimizer
from lmcore.train.options import replaced
from lmcore.train.recipe import Recipe, build_optimizer, build_schedule, role_table, takes
from lmcore.train.runs import (
    METRICS_FILE,
    PLOT_FILE,
    RUN_FILE,
    RUN_FORMAT,
    RUN_VERSION,
    TOKENIZER_FILE,
    Checkpoint,
    MetricsWriter,
    claim,
    claim_new_run,
    is_run,
    latest_checkpoint,
    lock_run,
    memory_error,
    read_metrics,
    read_run,
    remove_stale,
    remove_stub,
    spec_hash,
    spec_tag,
    truncate_metrics,
    write_json,
)
from lmcore.train.state import load_checkpoint, save_checkpoint
from lmcore.train.trackers import Trackers, check_trackers, open_trackers
from lmcore.version import versions

__all__ = [
    "RESUMABLE",
    "Parallel",
    "TrainConfig",
    "TrainResult",
    "cosine_lr",
    "evaluate",
    "resume",
    "train",
]


Opt = TypeVar("Opt", bound=torch.optim.Optimizer)


class Parallel:
    """How the loop runs across processes; this base is one process.

    A distributed runner (torchrun; `lmcore.train.parallel.Distributed`) subclasses it: `rank` and
    `world_size` from the process group, `place` picks the rank's device, `wrap` returns
    DDP(model) or the FSDP-sharded model with an optimizer over its shards, `full_state` what
    a checkpoint writes (gathered to the writer), `mean` all-reduces (average), `any`
    all-reduces a flag (max), `barrier` waits for every rank. Only the `is_writer` process
    writes metrics, plots and checkpoints.
    """

    rank: int = 0
    world_size: int = 1
    mode: str | None = None  # "ddp" or "fsdp" under torchrun

    @property
    def is_writer(self) -> bool:
        return self.rank == 0

    # distributed hooks (lmcore.train.parallel): place, wrap(model, optimizer, names), full_state
    def place(self, device: torch.device) -> torch.device:
        return device

    def wrap(
        self,
        model: nn.Module,
        optimizer: Opt,
        names: list[list[str]],
        rebuild: Callable[[list[dict[str, Any]]], Opt] | None = None,
    ) -> tuple[nn.Module, Opt]:
        return model, optimizer

    def full_state(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, names: list[list[str]]
    ) -> tuple[nn.Module, torch.optim.Optimizer | dict[str, Any]]:
        return model, optimizer

    def mean(self, value: Tensor) -> Tensor:
        return value

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Backward inside it accumulates gradients without synchronising them (a micro-batch
        before the last; DDP's `no_sync`, FSDP2's gradient sync off)."""
        return contextlib.nullcontext()

    def any(self, flag: bool) -> bool:
        return flag

    def barrier(self) -> None:
        return None


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[tuple[Tensor, ...]],
    *,
    autocast: str | None = None,
    parallel: Parallel | None = None,
    stop: Callable[[], bool] | None = None,
) -> float:
    """Mean next-token cross-entropy over `batches` (equal sizes, so the mean of the batch means
    is the mean over every token), averaged across processes. NaN when `stop()` cut it short.
    A batch of `(inputs, targets, documents)` runs the model with `documents=` (`--doc-mask`).

    Batches with a loss mask (`batches.masked`: chat data, targets `IGNORE` where the prompt
    is, or where a target crosses a document under `--doc-mask`) hold unequal numbers of kept
    targets: the mean is then over every kept target of every batch (and process), each
    batch's mean weighed by its count."""
    total = torch.zeros((), dtype=torch.float64)
    kept = torch.zeros((), dtype=torch.float64)
    count = 0
    weighed = bool(getattr(batches, "masked", False))
    was_training = model.training
    model.eval()
    try:
        for x, y, *docs in batches:
            if stop is not None and stop():
                return math.nan
            with _autocast(x.device, autocast):
                logits = model(x, documents=docs[0]) if docs else model(x)
                loss = cross_entropy(logits, y)
            if weighed:
                n = (y != IGNORE).sum().double()
                total = total.to(loss.device) + loss.double() * n
                kept = kept.to(n.device) + n
            else:
                total = total.to(loss.device) + loss.double()
            count += 1
    finally:
        model.train(was_training)
    par = parallel or Parallel()
    if weighed:  # the means of the sums: their ratio is the mean over every kept target
        both = par.mean(torch.stack([total, kept.to(total.device)]))
        return float(both[0] / both[1].clamp(min=1))
    mean = par.mean(total / max(count, 1))
    return float(mean)


def _autocast(device: torch.device, autocast: str | None) -> contextlib.AbstractContextManager[Any]:
    if autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, autocast))


# ------------------------------------------------------------------------------ results


@dataclass(frozen=True)
class TrainResult:
    """How a run (or one session of it) ended."""

    run: Path
    tag: str
    status: str  # "done", "diverged" or "interrupted"
    step: int  # steps done in all
    steps: int  # the budget
    tokens: int  # trained on, in all
    val_loss: float | None  # the last evaluation
    first_val_loss: float | None  # the evaluation before the first step
    train_loss: float | None  # the last train record
    diverged_at: int | None
    reason: str | None  # for "interrupted": SIGINT, SIGTERM or stop_after
    checkpoint: Checkpoint | None  # the newest on disk
    train_seconds: float  # in steps, every session together
    elapsed_seconds: float  # wall time, every session together
    records: tuple[dict[str, Any], ...] = field(repr=False, default=())  # this session's

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.train_seconds if self.train_seconds > 0 else 0.0

    @property
    def ok(self) -> bool:
        return self.status == "done"


Echo = Callable[[str], None]


# ------------------------------------------------------------------------------ entry points


def train(
    source: Source | Blueprint | ModelSpec | str | CheckpointInfo | os.PathLike[str],
    data: str | os.PathLike[str] | TokenData,
    out: str | os.PathLike[str],
    config: TrainConfig | None = None,
    *,
    init: CheckpointInfo | None = None,
    parallel: Parallel | None = None,
    echo: Echo | None = print,
    progress: bool | None = None,
    registry: Registry | None = None,
    stop_after: int | None = None,
) -> TrainResult:
    """Train a model from `source` (a spec, a blueprint, a checkpoint whose weights it starts
    from, or a `lmcore.sources.Source`: `source_of`) on prepared `data` into the new run
    directory `out`. `init`: start from this checkpoint's weights, `source` being its blueprint
    (`resolve_checkpoint(init)`).

    `echo` gets the report's lines (None: silent); `progress` shows a tqdm bar on stderr
    (None: when stderr is a terminal). `stop_after` stops, with a checkpoint, after that many
    steps in all, as Ctrl-C would. Returns how the run ended; bad options, data that does not
    fit the model and an `out` that holds a run raise `TrainError` or `DataError`.
    """
    config = config or TrainConfig()
    par = parallel or Parallel()
    src = source_of(source, registry)  # resolved once, here or by the caller (lmcore train)
    bp, init = src.blueprint, init if src.info is None else src.info
    if bp.spec.quant is not None:  # its matrices are frozen blocks: only the norms would train
        raise TrainError(
            f"{init.path if init is not None else 'the model'} is quantized (quant="
            f"{bp.spec.quant}), and its stored matrices take no gradients: train the float "
            "checkpoint it came from, then quantize the result (lmcore quantize)"
        )
    if config.adapter is not None:  # the checkpoint's model with an adapter, its base frozen
        bp = adapted_blueprint(bp, init, config.adapter)
    cfg = config.resolved(bp.spec.context_length, init.dtype if init is not None else "float32")
    check_trackers(cfg.loggers)
    recipe = Recipe.of(cfg.optimizer, cfg.schedule, registry, z_loss=cfg.z_loss)  # in run.json
    recipe.check_parallel(par.mode)
    check_optimizer(bp.spec.parametrization, recipe.optimizer)  # before the run directory
    cfg = dataclasses.replace(
        cfg, optimizer=str(recipe.optimizer.spec), schedule=str(recipe.schedule.spec)
    )
    if cfg.context is not None and cfg.context > bp.spec.context_length:
        raise TrainError(
            f"--context {cfg.context}: longer than the model's context_length "
            f"{bp.spec.context_length}; give at most {bp.spec.context_length}"
        )
    tokens = data if isinstance(data, TokenData) else TokenData.open(data)
    tokens.check(context_length=cfg.context or bp.spec.context_length,
                 vocab_size=bp.spec.vocab_size)  # fmt: skip
    _check_documents(cfg, tokens, bp)
    if init is not None:  # fine-tuning: the data must be in the checkpoint's own tokens
        check_tokenizer(init, tokens)
    if cfg.eval_bpb and tokens.masked:
        raise TrainError(
            f"--eval-bpb: {tokens.path} is chat data with a loss mask, whose bits per byte would "
            "count the prompt's bytes too; leave out --eval-bpb (val_loss is the masked loss)"
        )
    run = Path(out)
    lock, created = claim(par, lambda: claim_new_run(run), f"--out {run}")
    info = {
        "format": RUN_FORMAT,
        "version": RUN_VERSION,
        "tag": spec_tag(bp.spec),
        "spec": str(bp.spec),
        "spec_hash": spec_hash(bp.spec),
        "init": None if init is None else str(Path(init.path).resolve()),
        **({} if config.adapter is None or init is None else {
            "adapter": str(bp.spec.adapter), "base": base_identity(init.path)}),
        "data": _data_json(tokens),
        "config": cfg.to_json(),
        "recipe": recipe.record(),
        "tokenizer": TOKENIZER_FILE,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": versions("torch"),
        "status": {"state": "starting", "step": 0},
    }
    try:
        if par.is_writer:
            with atomic_path(run / TOKENIZER_FILE) as tmp:
                shutil.copyfile(tokens.path / tokens.meta.tokenizer_file, tmp)
            for name, text in tokenizer_files(init).items():  # its chat template, its ids
                with atomic_path(run / name) as tmp:
                    tmp.write_text(text, encoding="utf-8")
            write_json(run / RUN_FILE, info)
        par.barrier()
        loop = _Loop(run, info, bp, recipe, tokens, par, echo, progress, init, None, stop_after)
        return _run(loop)
    except BaseException:
        if par.is_writer and info["status"] == {"state": "starting", "step": 0}:
            remove_stub(run, created)  # it never took a step: leave no run to trip over
        raise
    finally:
        if lock is not None:
            lock.release()


def resume(
    run: str | os.PathLike[str],
    *,
    data: str | os.PathLike[str] | TokenData | None = None,
    parallel: Parallel | None = None,
    echo: Echo | None = print,
    progress: bool | None = None,
    registry: Registry | None = None,
    stop_after: int | None = None,
    **changes: Any,
) -> TrainResult:
    """Continue the run in `run` from its newest checkpoint, exactly where it stopped: the same
    weights, optimizer state, RNG states and next batch, so the steps that follow are those an
    uninterrupted run would have taken (on the same device and software).

    `changes` may set the options in `RESUMABLE`: `steps` or `tokens` to train longer (past
    `decay_steps` the schedule stays at `min_lr`), `device`, and how often to evaluate, log
    and save. `data` points to the data when it moved (its contents must be the same).
    """
    par = parallel or Parallel()
    root = Path(run)
    lock, _ = claim(par, lambda: (lock_run(root) if is_run(root) else None, False), str(root))
    try:
        return _resume(root, par, data, echo, progress, registry, stop_after, changes)
    finally:
        if lock is not None:
            lock.release()


def _check_recipe_plugins(
    root: Path, saved: dict[str, Any] | None, now: dict[str, Any]
) -> None:
    """A resumed run continues with the optimizer and schedule plugins it started with: another
    distribution or version of one could step differently, so it is refused, naming both."""
    for kind in ("optimizer", "schedule"):
        row, have = (saved or {}).get(kind), now[kind]
        if row is None:
            continue
        was = (row.get("dist"), row.get("version"))
        if was != (have.get("dist"), have.get("version")):
            raise TrainError(
                f"{root} trained with {kind} {row.get('name')!r} from {was[0]} {was[1]}, but "
                f"{have.get('dist')} {have.get('version')} provides it now: resuming would not "
                f"continue the same run; install {was[0]}=={was[1]}, or start a new run"
            )


def _resume(
    root: Path,
    par: Parallel,
    data: str | os.PathLike[str] | TokenData | None,
    echo: Echo | None,
    progress: bool | None,
    registry: Registry | None,
    stop_after: int | None,
    changes: dict[str, Any],
) -> TrainResult:
    info = read_run(root)
    refused = sorted(set(changes) - set(RESUMABLE))
    if refused:
        saved = info["config"]
        shown = ", ".join(
            f"--{k.replace('_', '-')} {_shown(changes[k])} (the run has {_shown(saved.get(k))})"
            for k in refused
        )
        raise TrainError(
            f"{shown}: cannot change when resuming {root}: the run continues exactly as it "
            f"started (see {root / RUN_FILE}); options a resumed run takes: "
            + ", ".join(f"--{k.replace('_', '-')}" for k in RESUMABLE)
            + "; for other options start a new run with another --out"
        )
    updates = {k: v for k, v in changes.items() if v is not None}
    config = replaced(TrainConfig.from_json(info["config"]), updates)  # --steps: no more tokens
    bp = resolve(info["spec"], registry)
    cfg = config.resolved(bp.spec.context_length)
    check_trackers(cfg.loggers)
    recipe = Recipe.of(cfg.optimizer, cfg.schedule, registry, z_loss=cfg.z_loss)  # installed
    _check_recipe_plugins(root, info.get("recipe"), recipe.record())
    recipe.check_parallel(par.mode)
    status = info.get("status", {})
    if status.get("state") == "diverged":
        raise TrainError(
            f"{root} diverged at step {status.get('diverged_at')}; resuming would repeat the "
            "same steps from its last checkpoint: start a new run with a lower --lr or a longer "
            "--warmup"
        )
    last = latest_checkpoint(root)
    step = 0 if last is None else last.step
    if cfg.steps < step:
        raise TrainError(
            f"--steps {cfg.steps} is below the {step} steps {root} has done; give more steps "
            "to train on, or use its checkpoint as it is"
        )
    if last is not None and step == cfg.steps and status.get("state") == "done":
        raise TrainError(
            f"{root} has done all its {step:,} steps; to train on, give the new total: "
            f"lmcore train --resume {root} --steps N (past step {cfg.decay_steps} the learning "
            f"rate stays at min_lr={cfg.min_lr:g})"
        )
    tokens = _open_data(root, info, data)
    _check_documents(cfg, tokens, bp)
    init = None
    if last is None and info.get("init") is not None:
        init = read_info(info["init"])  # restarting from step 0: the weights it began with
    info = {**info, "config": cfg.to_json(), "recipe": recipe.record(), "data": _data_json(tokens)}
    if par.is_writer:
        remove_stale(root)
        write_json(root / RUN_FILE, info)
    par.barrier()
    loop = _Loop(root, info, bp, recipe, tokens, par, echo, progress, init, last, stop_after)
    return _run(loop)


def _run(loop: _Loop) -> TrainResult:
    """`loop.run()`, running out of memory reported as a `TrainMemoryError` naming the batch."""
    try:
        return loop.run()
    except (MemoryError, RuntimeError) as e:
        error = memory_error(e, loop.cfg.batch_size, loop.seq_len, loop.device)
        if error is None:
            raise
        raise error from None


def _shown(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, list | tuple) else str(value)


def _data_json(data: TokenData) -> dict[str, Any]:
    import hashlib

    digest = hashlib.sha256((data.path / data.meta.tokenizer_file).read_bytes()).hexdigest()
    return {
        "path": str(data.path.resolve()),
        "vocab_size": data.vocab_size,
        "train_tokens": data.meta.splits["train"].tokens,
        "val_tokens": data.meta.splits["val"].tokens,
        "tokenizer_sha256": digest,
    }


def _check_documents(cfg: TrainConfig, data: TokenData, bp: Blueprint) -> None:
    """`--pack` and `--doc-mask` need the data's document index (a `DataError` naming the
    directory and how to prepare it again when it has none), and `--doc-mask` a model whose
    every mixer and attention kernel takes documents (a `TrainError` naming the first that
    does not and those that do)."""
    for name, on in (("--pack", cfg.pack), ("--doc-mask", cfg.doc_mask)):
        if on:
            data.document_starts("train", name)
    unable = bp.documents() if cfg.doc_mask else None
    if unable is not None:
        kind, name, able = unable
        raise TrainError(
            f"--doc-mask: {kind} {name!r} does not declare 'documents' (it cannot keep the "
            f"documents of a row apart); use one that does: {', '.join(able) or 'none installed'}"
        )


def _open_data(
    run: Path, info: Mapping[str, Any], data: str | os.PathLike[str] | TokenData | None
) -> TokenData:
    saved = info["data"]
    if isinstance(data, TokenData):
        tokens = data
    else:
        tokens = TokenData.open(saved["path"] if data is None else data)
    now = _data_json(tokens)
    changed = [k for k in ("vocab_size", "train_tokens", "val_tokens", "tokenizer_sha256")
               if now[k] != saved[k]]  # fmt: skip
    if changed:
        detail = ", ".join(f"{k} {saved[k]} then, {now[k]} now" for k in changed)
        raise TrainError(
            f"the data in {tokens.path} is not what {run} was trained on ({detail}); point "
            "--data to the run's data, or start a new run"
        )
    return tokens


# ------------------------------------------------------------------------------ stopping


class _Stop:
    """A stop request from SIGINT/SIGTERM (or `stop_after`), honoured between steps so that a
    checkpoint always holds a whole step. A second Ctrl-C aborts at once, without one."""

    def __init__(self, say: Echo):
        self.reason: str | None = None
        self.say = say

    def __call__(self) -> bool:
        return self.reason is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.reason is not None:
            raise KeyboardInterrupt
        self.reason = signal.Signals(signum).name
        self.say(
            f"{self.reason}: stopping after this step with a checkpoint (Ctrl-C again aborts "
            "without one)"
        )

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach the main thread only; a caller elsewhere stops us otherwise
            return
        previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


# ------------------------------------------------------------------------------ the loop


class _Loop:
    def __init__(
        self,
        run: Path,
        info: dict[str, Any],
        bp: Blueprint,
        recipe: Recipe,
        data: TokenData,
        parallel: Parallel,
        echo: Echo | None,
        progress: bool | None,
        init: CheckpointInfo | None,
        start: Checkpoint | None,
        stop_after: int | None,
    ):
        self.run_dir, self.info, self.bp, self.data, self.par = run, info, bp, data, parallel
        self.cfg = cfg = ResolvedConfig.from_json(info["config"])
        self.recipe = recipe
        self.lr_at = build_schedule(recipe.schedule, lr=cfg.lr, min_lr=cfg.min_lr,
                                    warmup=cfg.warmup, decay_steps=cfg.decay_steps,
                                    steps=cfg.steps)  # fmt: skip
        self.echo = echo if parallel.is_writer else None
        self.show_bar = parallel.is_writer and (
            sys.stderr.isatty() if progress is None else progress
        )
        self.init, self.start, self.stop_after = init, start, stop_after
        self.spec = bp.spec
        self.tag: str = info["tag"]
        self.seq_len = cfg.context or bp.spec.context_length  # the tokens of one sequence
        self.tokens_per_step = cfg.batch_size * self.seq_len
        self.device = parallel.place(resolve_device(cfg.device))  # this rank's device
        self.dtype: torch.dtype = getattr(torch, cfg.dtype)
        self.stop = _Stop(self.say)
        self.bar: Any = None
        self.records: list[dict[str, Any]] = []
        self.metrics: MetricsWriter | None = None
        # time: wall clock of earlier sessions + this one; steps only, likewise
        self.elapsed_before = 0.0
        self.train_before = 0.0
        self.session_start = time.perf_counter()
        self.train_time = 0.0
        self.window: list[tuple[int, Tensor, Tensor]] = []
        self.term_window: list[dict[str, Tensor]] = []  # the loss terms of the window's steps
        self.window_time = 0.0
        self.mark: float | None = None
        self.first_val: float | None = None
        self.last_val: float | None = None
        self.last_train: float | None = None
        self.last_checkpoint: Checkpoint | None = start
        self.tps = 0.0  # tokens/s of the last train record
        self.val_bpt: float | None = None  # bytes per validation target token (--eval-bpb)
        self.trackers: Trackers | None = None

    # ---------------------------------------------------------------- output

    def say(self, line: str) -> None:
        if self.echo is None:
            return
        if self.bar is not None:
            from tqdm import tqdm

            with tqdm.external_write_mode(file=sys.stdout):
                self.echo(line)
        else:
            self.echo(line)

    def record(self, **fields: Any) -> None:
        self.records.append(fields)
        if self.metrics is not None:
            self.metrics.write(fields)
        if self.trackers is not None:
            self.trackers.log(fields)

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.session_start

    # ---------------------------------------------------------------- set-up

    def build(self) -> int:
        """Model, optimizer and data streams; returns the step to start from."""
        cfg = self.cfg
        torch.manual_seed(cfg.seed)  # the initial weights; also numpy's and Python's RNGs,
        np.random.seed(cfg.seed % 2**32)  # for components that draw from them (numpy: 32 bits)
        random.seed(cfg.seed)
        # the hook for what changes a pretrained model before its optimizer (an adapter)
        init = self.init if self.start is None else None  # a resumed run loads its own below
        base = self.info.get("base") if self.start is not None else None  # adapter-only saves
        self.model = initial_model(self.bp, init, device=self.device, dtype=self.dtype,
                                   base=base)  # fmt: skip
        if cfg.recompute is not None:  # inside any distributed wrapper, which goes outside
            apply_recompute(self.model, cfg.recompute)
        self.micro_steps = micro_steps(cfg.batch_size, cfg.micro_batch, self.par.world_size)
        self.optimizer, self.names, _ = make_optimizer(self.model, cfg, self.recipe.optimizer)
        self.info["roles"] = role_table(self.optimizer.param_groups)
        step = 0
        if self.start is not None:
            state = load_checkpoint(self.start, self.model, self.optimizer, self.names)
            step = int(state["step"])
            self.elapsed_before = float(state["elapsed_s"])
            self.train_before = float(state["train_s"])
            self.first_val = state.get("first_val_loss")
            self.last_val = state.get("val_loss")
            self.last_train = state.get("train_loss")
        # One place for what runs the steps: the distributed wrapper, then the compiler.
        # DDP, or FSDP shards with an optimizer over them (holding its state)
        self.forward, self.optimizer = self.par.wrap(
            self.model, self.optimizer, self.names, rebuild=self.rebuild_optimizer
        )
        if cfg.compile:
            self.forward = torch.compile(self.forward)  # type: ignore[assignment]
        rank, world, T = self.par.rank, self.par.world_size, self.seq_len
        # Windows across the stream (today's), the same windows with document ids, or packed
        # rows (lmcore.data.packing); evaluation keeps its fixed windows, with ids under
        # --doc-mask, so val losses compare with and without --pack.
        sample: Callable[..., Any] = (
            functools.partial(packed_sampler, self.data, mask_boundaries=cfg.doc_mask)
            if cfg.pack else
            functools.partial(document_sampler, self.data, mask_boundaries=True)
            if cfg.doc_mask else self.data.sampler
        )  # fmt: skip
        self.sampler: Any = sample(
            "train", batch_size=cfg.batch_size, context_length=T, seed=cfg.seed, rank=rank,
            world_size=world, device=self.device,
        )  # fmt: skip
        windows = self.data.val_batches(
            batch_size=cfg.batch_size, context_length=T, num_batches=cfg.eval_batches,
            rank=rank, world_size=world, device=self.device,
        )  # fmt: skip
        self.val: Any = windows
        if cfg.doc_mask:
            starts = self.data.document_starts("val", "--doc-mask")
            self.val = DocumentEvalBatches(windows, starts, mask_boundaries=True)
        if cfg.eval_bpb:  # the bytes the fixed validation targets stand for, counted once
            local = bytes_per_token(windows, self.data.tokenizer())
            self.val_bpt = float(self.par.mean(torch.tensor(local, device=self.device)))
        return step

    def rebuild_optimizer(self, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
        """The run's optimizer over other tensors of the same groups (FSDP's shards)."""
        cfg = self.cfg
        return build_optimizer(self.recipe.optimizer, groups, lr=cfg.lr,
                               weight_decay=cfg.weight_decay, betas=cfg.betas,
                               eps=cfg.eps)  # fmt: skip

    def header(self, step: int) -> None:
        cfg, spec, data = self.cfg, self.spec, self.data
        params = sum(p.numel() for p in self.model.parameters())
        self.info["parameters"] = params
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        tokens = cfg.steps * self.tokens_per_step
        self.say(f"run: {self.run_dir}  (tag {self.tag})")
        self.say(f"spec: {spec}")
        start = f", weights from {self.init.path}" if self.init is not None else ""
        self.say(
            f"model: {params:,} parameters"
            + (f" ({trainable:,} trainable)" if trainable != params else "")
            + f", {cfg.dtype}"
            + (f" with {cfg.autocast} autocast" if cfg.autocast else "")
            + f" on {self.device}{', compiled' if cfg.compile else ''}{start}"
        )
        train_t, val_t = (data.meta.splits[s].tokens for s in ("train", "val"))
        note = ""
        if spec.vocab_size > data.vocab_size:
            unused = spec.vocab_size - data.vocab_size
            note = f"; the model's vocab_size {spec.vocab_size:,} leaves {unused:,} ids unused"
        self.say(
            f"data: {data.path}: train {train_t:,} tokens, val {val_t:,}, vocabulary "
            f"{data.vocab_size:,}{note}"
        )
        clip = f"clip {cfg.grad_clip:g}" if cfg.grad_clip is not None else "no clipping"
        self.say(
            f"budget: {cfg.steps:,} steps × batch {cfg.batch_size} × {self.seq_len} "
            f"tokens = {tokens:,} tokens ({tokens / max(train_t, 1):.2f} epochs), seed {cfg.seed}"
        )
        decayed = ", ".join(decay_roles(cfg.decay)) or "no role"
        part = self.recipe.optimizer
        betas = f", betas {cfg.betas[0]:g} {cfg.betas[1]:g}" if takes(part, "betas") else ""
        self.say(
            f"optimizer: {part.spec}{betas}, weight decay {cfg.weight_decay:g} on {decayed}, "
            f"{clip}" + (f", lr × {', '.join(cfg.role_lr)}" if cfg.role_lr else "")
        )
        self.say(
            f"schedule: {self.recipe.schedule.spec}, lr {cfg.lr:g} → {cfg.min_lr:g}, warmup "
            f"{cfg.warmup}, decay_steps {cfg.decay_steps}"
        )
        if cfg.pack:
            self.say(packing_of(self.data, "train", self.seq_len).summary())
        if cfg.doc_mask:
            self.say("documents: masked (each token sees its own document; no target crosses one)")
        if self.recipe.loss.z_loss:
            self.say(f"loss: cross-entropy + z-loss × {self.recipe.loss.z_loss:g}")
        if step:
            self.say(f"resumed: from {self.start.path if self.start else '?'} at step {step:,}")

    # ---------------------------------------------------------------- timing

    def pause(self) -> None:
        """Stop the step clock (waiting for the device first): eval and saving do not count."""
        if self.mark is not None:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            spent = time.perf_counter() - self.mark
            self.train_time += spent
            self.window_time += spent
            self.mark = None

    def go(self) -> None:
        self.mark = time.perf_counter()

    # ---------------------------------------------------------------- the run

    def run(self) -> TrainResult:
        step = self.build()
        if self.par.is_writer:
            if step:
                truncate_metrics(self.run_dir / METRICS_FILE, step)
            elif (self.run_dir / METRICS_FILE).exists():  # restarted before any checkpoint
                truncate_metrics(self.run_dir / METRICS_FILE, -1)
            self.metrics = MetricsWriter(self.run_dir / METRICS_FILE)
        try:
            self.header(step)
            if self.par.is_writer:
                self.trackers = open_trackers(self.cfg, self.run_dir, self.info, self.bp, step)
            with self.stop.installed(), self._bar(step):
                status, reason, diverged = self.loop(step)
            return self.finish(status, reason, diverged)
        finally:
            if self.metrics is not None:
                self.metrics.close()
            if self.trackers is not None:
                self.trackers.close(self.last_checkpoint)

    @contextlib.contextmanager
    def _bar(self, step: int) -> Iterator[None]:
        if not self.show_bar:
            yield
            return
        from tqdm import tqdm

        self.bar = tqdm(
            total=self.cfg.steps, initial=step, unit="step", file=sys.stderr, dynamic_ncols=True
        )
        try:
            yield
        finally:
            self.bar.close()
            self.bar = None

    def loop(self, step: int) -> tuple[str, str | None, int | None]:
        cfg = self.cfg
        self.record(kind="event", event="resume" if step else "start", step=step,
                    tokens=step * self.tokens_per_step, elapsed_s=self.elapsed())  # fmt: skip
        self.set_status("running", step)
        if step == 0:
            self.eval(0)
        self.forward.train()
        self.go()
        while step < cfg.steps:
            loss, norm = self.step(step)
            step += 1
            self.window.append((step, loss, norm))
            if self.bar is not None:
                self.bar.update(1)
            if step % cfg.log_every == 0 or step == cfg.steps:
                diverged = self.flush(step)
                if diverged is not None:
                    return "diverged", None, diverged
            if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
                self.eval(step)
            if cfg.save_every and step % cfg.save_every == 0 and step < cfg.steps:
                self.save(step)
            if self.stop_after is not None and step >= self.stop_after and step < cfg.steps:
                self.stop.reason = self.stop.reason or "stop_after"
            if self.par.any(self.stop()):
                diverged = self.flush(step)
                if diverged is not None:
                    return "diverged", None, diverged
                self.save(step)
                return "interrupted", self.stop.reason or "stopped on another rank", None
        self.pause()
        if self.window:
            diverged = self.flush(step)
            if diverged is not None:
                return "diverged", None, diverged
        self.eval(step)
        self.save(step)
        return "done", None, None

    def step(self, step: int) -> tuple[Tensor, Tensor]:
        """Update number `step + 1`, on batch `step`; the loss and the gradients' norm (on the
        device, unsynchronised)."""
        cfg = self.cfg
        lr = self.lr_at(step + 1)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group["lr_scale"]
        x, y, *docs = self.sampler.batch(step)  # (x, y, documents) from a document sampler
        documents = docs[0] if docs and cfg.doc_mask else None  # --pack alone: one stream
        n = self.micro_steps  # gradients summed over n micro-batches, synchronised on the last
        # Each micro-batch weighs by its share of the kept targets (a loss mask keeps more in
        # one than another), so the summed gradient is the whole batch's mean's.
        w = micro_weights(y, n)
        ces: list[Tensor] = []
        terms: list[dict[str, Tensor]] = []
        for i, (xm, ym, dm) in enumerate(micro_batches(x, y, n, documents)):
            with self.par.no_sync(self.forward) if i < n - 1 else contextlib.nullcontext():
                with _autocast(self.device, cfg.autocast):  # cross-entropy + the recipe's terms
                    logits = self.forward(xm) if dm is None else self.forward(xm, documents=dm)
                    losses = self.recipe.loss(logits, ym, self.model)
                torch.autograd.backward(losses.total if w is None else losses.total * w[i])
            ces.append(losses.cross_entropy.detach())
            terms.append(losses.detached())
        self.term_window.append({k: weighted([t[k] for t in terms], w) for k in terms[0]})
        norm = clip_gradients(self.model.parameters(), cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return weighted(ces, w), norm.detach()

    def flush(self, step: int) -> int | None:
        """Write the train record of the steps since the last one (one device sync); the step
        whose loss was not finite, if one was."""
        if not self.window:
            return None
        self.pause()
        losses = self.par.mean(torch.stack([w[1].float() for w in self.window]))
        norms = torch.stack([w[2].float() for w in self.window])
        values: list[list[float]] = torch.stack([losses, norms.to(losses.device)]).tolist()
        steps = [w[0] for w in self.window]
        self.window = []
        terms, self.term_window = self.term_window, []
        term_means = window_means(terms, self.par.mean)  # each term's, across processes
        window_time, self.window_time = self.window_time, 0.0
        cfg = self.cfg
        for s, loss in zip(steps, values[0], strict=True):
            if not math.isfinite(loss):
                self.record(kind="event", event="diverged", step=s, loss=loss,
                            tokens=s * self.tokens_per_step, elapsed_s=self.elapsed())  # fmt: skip
                self.say(f"step {s:>{len(str(cfg.steps))}}  diverged: the loss is {loss}")
                return s
        mean = sum(values[0]) / len(values[0])
        tps = len(steps) * self.tokens_per_step / window_time if window_time > 0 else 0.0
        self.last_train = mean
        # Beside the cross-entropy `loss`, which stays comparable with val_loss: each term's
        # mean and loss_total, what the optimizer minimised (nothing when no term was on).
        extra = logged(mean, term_means)
        lr = self.lr_at(step)
        self.record(kind="train", step=step, tokens=step * self.tokens_per_step, loss=mean,
                    **extra, lr=lr, grad_norm=values[1][-1], tokens_per_s=tps,
                    elapsed_s=self.elapsed())  # fmt: skip
        if self.bar is not None:
            self.bar.set_postfix_str(f"loss {mean:.4f}, {tps:,.0f} tok/s", refresh=False)
        self.tps = tps
        self.go()
        return None

    def eval(self, step: int) -> None:
        self.pause()
        t0 = time.perf_counter()
        loss = evaluate(
            self.forward, self.val, autocast=self.cfg.autocast, parallel=self.par, stop=self.stop
        )
        if math.isnan(loss) and self.stop():
            self.go()
            return  # cut short by Ctrl-C: the run stops after this step anyway
        ppl = math.exp(loss) if loss < 700 else math.inf
        if step == 0:
            self.first_val = loss
        self.last_val = loss
        bpb = {} if self.val_bpt is None else {"val_bpb": loss / (math.log(2) * self.val_bpt)}
        self.record(kind="eval", step=step, tokens=step * self.tokens_per_step, val_loss=loss,
                    val_ppl=ppl, **bpb, eval_s=time.perf_counter() - t0,
                    elapsed_s=self.elapsed())  # fmt: skip
        width = len(str(self.cfg.steps))
        shown = f"{ppl:,.1f}" if ppl < 1e6 else f"{ppl:.3g}"  # an untrained model's can be huge
        line = f"step {step:>{width}}  val {loss:.4f}  ppl {shown}"
        line += f"  bpb {bpb['val_bpb']:.4f}" if bpb else ""
        if step:
            line += f"  train {self.last_train:.4f}" if self.last_train is not None else ""
            line += f"  {self.tps:,.0f} tok/s" if self.tps else ""  # none before a record
            line += f"  {self.elapsed():.1f} s"
        self.say(line)
        self.go()

    def state(self, step: int) -> dict[str, Any]:
        return {
            "tokens": step * self.tokens_per_step,
            "elapsed_s": self.elapsed(),
            "train_s": self.train_before + self.train_time,
            "data": {"seed": self.cfg.seed, "next_batch": step},
            "first_val_loss": self.first_val,
            "val_loss": self.last_val,
            "train_loss": self.last_train,
            "recipe": self.recipe.record(),
        }

    def save(self, step: int) -> None:
        """Checkpoint `step` (the writer saves; every rank waits), then the plot and run.json."""
        self.pause()
        # under FSDP every rank helps gather the full state to the writer
        model, optimizer = self.par.full_state(self.model, self.optimizer, self.names)
        if self.par.is_writer:
            self.last_checkpoint = save_checkpoint(
                self.run_dir,
                step=step,
                model=model,
                optimizer=optimizer,
                param_names=self.names,
                state=self.state(step),
                tag=self.tag,
                tokens=step * self.tokens_per_step,
                keep=self.cfg.keep,
            )
            self.plot()
            self.set_status("running", step)
        self.par.barrier()
        self.go()

    def plot(self) -> None:
        from lmcore.train.plots import plot_run

        plot_run(read_metrics(self.run_dir / METRICS_FILE), self.run_dir / PLOT_FILE, self.tag)

    def set_status(self, state: str, step: int, **extra: Any) -> None:
        if not self.par.is_writer:
            return
        self.info["status"] = {
            "state": state,
            "step": step,
            "steps": self.cfg.steps,
            "tokens": step * self.tokens_per_step,
            "train_loss": self.last_train,
            "val_loss": self.last_val,
            "first_val_loss": self.first_val,
            "train_s": self.train_before + self.train_time,
            "elapsed_s": self.elapsed(),
            "checkpoint": None
            if self.last_checkpoint is None
            else str(self.last_checkpoint.path.relative_to(self.run_dir)),
            **extra,
        }
        write_json(self.run_dir / RUN_FILE, self.info)

    def finish(self, status: str, reason: str | None, diverged: int | None) -> TrainResult:
        self.pause()
        step = self.records[-1]["step"] if self.records else 0
        if status == "diverged":
            assert diverged is not None
            step = diverged
        elif self.last_checkpoint is not None:
            step = self.last_checkpoint.step
        self.record(kind="event", event=status, step=step, tokens=step * self.tokens_per_step,
                    elapsed_s=self.elapsed(), **({"reason": reason} if reason else {}))  # fmt: skip
        if self.par.is_writer:
            self.set_status(status, step, diverged_at=diverged, reason=reason)
            self.plot()
        train_s = self.train_before + self.train_time
        result = TrainResult(
            run=self.run_dir,
            tag=self.tag,
            status=status,
            step=step,
            steps=self.cfg.steps,
            tokens=step * self.tokens_per_step,
            val_loss=self.last_val,
            first_val_loss=self.first_val,
            train_loss=self.last_train,
            diverged_at=diverged,
            reason=reason,
            checkpoint=self.last_checkpoint,
            train_seconds=train_s,
            elapsed_seconds=self.elapsed(),
            records=tuple(self.records),
        )
        for line in summary_lines(result):
            self.say(line)
        return result


def summary_lines(r: TrainResult) -> list[str]:
    """The report's last lines: how the run ended, and where its files are."""
    lines = []
    if r.status == "done":
        first = f"{r.first_val_loss:.4f} → " if r.first_val_loss is not None else ""
        val = f"; val loss {first}{r.val_loss:.4f}" if r.val_loss is not None else ""
        lines.append(
            f"done: {r.step:,} steps, {r.tokens:,} tokens in {r.elapsed_seconds:.1f} s "
            f"({r.tokens_per_second:,.0f} tokens/s while training){val}"
        )
    elif r.status == "diverged":
        lines.append(
            f"diverged at step {r.diverged_at}: the loss is not finite; the run stops there "
            "(a lower --lr, a longer --warmup or --grad-clip may help)"
        )
    else:
        lines.append(
            f"interrupted ({r.reason}) at step {r.step:,} of {r.steps:,}; continue with: "
            f"lmcore train --resume {r.run}"
        )
    if r.checkpoint is not None:
        lines.append(f"checkpoint: {r.checkpoint.path} (model: {r.checkpoint.model})")
    lines.append(f"metrics: {r.run / METRICS_FILE}, loss curve: {r.run / PLOT_FILE}")
    return lines
