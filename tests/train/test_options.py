"""Training options are declared once (`lmcore.train.options`, `TrainConfig`'s fields): each
declared option is a flag of `lmcore train` and `lmcore sweep`, goes through `cli_args`, the
parsers and back to the same config, is a key of a sweep file's `[train]`, and is checked; a
new declaration needs nothing else."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from lmcore.errors import TrainError
from lmcore.train.config import CLI_OPTIONS, RESUMABLE, ResolvedConfig, TrainConfig
from lmcore.train.options import (
    Flag,
    Option,
    add_flags,
    check,
    cli_args,
    count,
    flagged,
    from_flags,
    given,
    option,
    options,
    positive,
    resumable,
)
from tests.helpers.errors import raises_naming

FLAGGED = [opt for opt, _ in flagged(TrainConfig)]


def sample(opt: Option, flag: Flag) -> Any:
    """A value of `opt` other than its default, made from its flag alone (so a new option needs
    no entry here)."""
    if flag.action == "store_true":
        return True
    if flag.action == "store_const":
        return flag.const
    parse = flag.type or str
    if flag.example is not None:
        value = parse(flag.example)
        return (value,) if flag.action == "append" else value
    if flag.action == "append":
        return (flag.choices[0] if flag.choices else parse("3"),)
    if flag.choices:
        return next(c for c in flag.choices if c != opt.default)
    if flag.nargs is not None:
        return tuple(parse("0.5" if parse is float else "3") for _ in range(flag.nargs))
    return next(v for v in (parse("3"), parse("5")) if v != opt.default)


def parsers() -> dict[str, argparse.ArgumentParser]:
    from lmcore.cli.main import _parser

    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {"train": sub.choices["train"], "sweep": sub.choices["sweep"]}


@pytest.mark.parametrize("command", ["train", "sweep"])
@pytest.mark.parametrize("opt", FLAGGED, ids=lambda o: o.name)
def test_each_declared_option_is_a_flag_that_round_trips_to_the_same_config(
    opt: Option, command: str
) -> None:
    from lmcore.cli.train import train_config

    assert opt.flag is not None
    cfg = TrainConfig(**{opt.name: sample(opt, opt.flag)})
    args = cfg.cli_args()
    parser = parsers()[command]
    assert any(opt.name == a.dest for a in parser._actions)
    assert opt.help_text.split()[0] in parser.format_help()
    head = ["cs336-tiny"] if command == "train" else ["base"]
    assert train_config(parser.parse_args([*head, *args])) == cfg


@pytest.mark.parametrize("opt", FLAGGED, ids=lambda o: o.name)
def test_each_declared_option_is_a_sweep_file_key(opt: Option, tmp_path: Path) -> None:
    from lmcore.train.sweepfile import SweepDefinition, read_definition, train_config

    assert opt.flag is not None
    cfg = TrainConfig(**{opt.name: sample(opt, opt.flag)})
    path = tmp_path / "sweep.toml"
    path.write_text(SweepDefinition(base="cs336-tiny", train=cfg.given()).to_toml())
    assert f"{opt.name} = " in path.read_text()
    assert train_config(read_definition(path).train) == cfg


def test_grad_clip_zero_is_no_clipping_on_the_command_line_and_in_a_sweep_file(
    tmp_path: Path,
) -> None:
    from lmcore.train.sweepfile import SweepDefinition, read_definition, train_config

    cfg = TrainConfig(grad_clip=None)
    assert cfg.cli_args() == ["--grad-clip", "0"]
    path = tmp_path / "sweep.toml"
    path.write_text(SweepDefinition(base="cs336-tiny", train=cfg.given()).to_toml())
    assert "grad_clip = 0\n" in path.read_text()
    assert train_config(read_definition(path).train) == cfg


def test_the_derived_tables_are_those_the_command_line_and_resume_knew() -> None:
    assert CLI_OPTIONS == (
        "steps", "tokens", "batch_size", "context", "micro_batch", "pack", "doc_mask", "lr", "min_lr",
        "warmup", "weight_decay",
        "optimizer", "schedule", "decay", "role_lr", "grad_clip", "z_loss",
        "eval_every", "eval_batches", "log_every", "save_every", "keep", "seed", "device", "betas",
        "dtype", "autocast", "compile", "recompute", "adapter", "eval_bpb", "loggers", "log_group",
    )  # fmt: skip
    assert set(RESUMABLE) == {"steps", "tokens", "micro_batch", "device", "eval_every",
                              "save_every", "log_every", "keep", "recompute", "eval_bpb", "loggers",
                              "log_group"}  # fmt: skip
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    assert [o.name for o in options(TrainConfig)] == names  # every field is a declared option
    assert [o.name for o in options(ResolvedConfig)] == names
    TrainConfig().check()


def test_steps_yield_to_tokens_and_options_without_a_flag_are_refused() -> None:
    assert TrainConfig(steps=7, tokens=4096).cli_args() == ["--tokens", "4096"]
    with raises_naming(TrainError, re.compile(r"^eps=1e-06: "), "lmcore train has no option for it",
                       re.compile(r"takes steps, tokens, .*log_group"),
                       re.compile(r"leave it at its default 1e-08$")):  # fmt: skip
        TrainConfig(eps=1e-6).cli_args()


@dataclasses.dataclass(frozen=True)
class Extended(TrainConfig):
    """What the next option looks like: one declaration."""

    micro_batches: int = option(
        1,
        "micro-batches per step (default: {default})",
        Flag(type=positive, metavar="N", after="batch_size"),
        resumable=True,
        checks=(count(1),),
    )


def test_a_new_declaration_is_all_an_option_needs() -> None:
    parser = argparse.ArgumentParser(prog="lmcore train")
    add_flags(parser, Extended)
    assert "--micro-batches N     micro-batches per step (default: 1)" in parser.format_help()
    names = [o.name for o, _ in flagged(Extended)]
    assert names.index("micro_batches") == names.index("batch_size") + 1
    cfg = Extended(micro_batches=4, lr=0.01)
    args = cli_args(cfg)
    assert args == ["--lr", "0.01", "--micro-batches", "4"]
    assert Extended(**from_flags(given(parser.parse_args(args), Extended), Extended)) == cfg
    assert "micro_batches" in resumable(Extended)
    with pytest.raises(TrainError, match=r"^--micro-batches 0: must be a positive integer$"):
        check(Extended(micro_batches=0))


def test_giving_steps_to_a_run_that_had_tokens_drops_the_tokens() -> None:
    from lmcore.train.options import replaced

    run = TrainConfig(tokens=4096, keep=3)
    assert replaced(run, {"steps": 10}) == TrainConfig(steps=10, keep=3)
    assert replaced(run, {"tokens": 8192}) == TrainConfig(tokens=8192, keep=3)
    assert replaced(run, {"keep": 1}) == TrainConfig(tokens=4096, keep=1)


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
