"""`lmcore.train.variants`: a `--vary` split into the model's items and the recipe's options by
one rule, each recipe value read as its flag reads it, checked before any run starts, and the
errors that say which key and token are wrong."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lmcore import Component, scoped_registry
from lmcore.errors import SpecError, TrainError
from lmcore.spec import ALL_KEYS
from lmcore.train.config import CLI_OPTIONS, TrainConfig
from lmcore.train.options import flagged
from lmcore.train.variants import (
    RECIPE_KEYS,
    SHARED_KEYS,
    check_recipe,
    recipe_text,
    split_change,
)
from tests.helpers.errors import raises_naming


def test_a_key_is_the_models_or_the_recipes_never_both() -> None:
    assert not set(RECIPE_KEYS) & set(ALL_KEYS)  # the rule needs no tie-break today
    flags = {o.name for o, _ in flagged(TrainConfig)}
    assert set(RECIPE_KEYS) <= flags  # a run elsewhere is an `lmcore train` command
    assert set(RECIPE_KEYS) | set(SHARED_KEYS) == set(CLI_OPTIONS)
    assert not set(RECIPE_KEYS) & set(SHARED_KEYS)
    # the budget, the batches and the seed are the sweep's: variants stay paired
    assert {"steps", "tokens", "batch_size", "seed", "eval_batches"} <= set(SHARED_KEYS)


def test_a_change_splits_into_model_items_and_recipe_options() -> None:
    change = split_change("optimizer=torch_adamw, norm=none, lr=3e-3, pos = nope")
    assert change.spec == "norm=none, pos = nope"
    assert change.train == {"optimizer": "torch_adamw", "lr": 3e-3}
    cfg = change.config(TrainConfig(steps=7))
    assert (cfg.optimizer, cfg.lr, cfg.steps, cfg.schedule) == ("torch_adamw", 3e-3, 7, "cosine")
    assert split_change("norm=none").train == {} and split_change("schedule=wsd").spec == ""


def test_recipe_values_read_as_their_flags_read_them() -> None:
    change = split_change('betas="0.9 0.99", decay="matrix,gain", role_lr="embedding=2 head=0.5", '
                          "grad_clip=0, warmup=5, schedule=wsd(decay=0.1)")  # fmt: skip
    cfg = change.config(TrainConfig())
    assert cfg.betas == (0.9, 0.99) and cfg.decay == "matrix,gain"
    assert cfg.role_lr == ("embedding=2.0", "head=0.5") and cfg.grad_clip is None  # 0: off
    assert cfg.warmup == 5 and cfg.schedule == "wsd(decay=0.1)"
    base = TrainConfig(role_lr=("embedding=2.0",), decay="matrix")
    cfg = split_change("role_lr=none, decay=none").config(base)
    assert cfg.role_lr == () and cfg.decay == "none"
    assert split_change('optimizer="torch_adamw"').train == {"optimizer": "torch_adamw"}


@pytest.mark.parametrize(
    ("change", "facts"),
    [
        ("optimiser=adamw", ("--vary 'optimiser=adamw'", "unknown key 'optimiser'",
                             "(did you mean 'optimizer'?)", "the recipe's (lr, min_lr")),
        ("d_modle=64", ("unknown key 'd_modle'", "(did you mean 'd_model'?)", "model's keys")),
        ("steps=10", ("--vary 'steps=10'", "steps is a training option every variant shares",
                      "give it to the sweep as --steps")),
        ("batch_size=4", ("batch_size is a training option every variant shares",
                          "--batch-size")),
        ("loggers=mlflow", ("loggers is a training option every variant shares", "--logger")),
        ("lr[0]=1e-3", ("lr is a training option: one value for the whole run",)),
        ("lr=1e-3, lr=2e-3", ("lr is given twice",)),
        ("lr=fast", ("--vary 'lr=fast'", "lr takes a number, as --lr does; got 'fast'")),
        ("warmup=1.5", ("warmup takes an integer, as --warmup does",)),
        ("betas=0.9", ("betas takes 2 values separated by a space", 'betas="0.9 0.95"')),
        ("decay=mtrix", ("decay=mtrix: 'mtrix' is not a parameter role",
                         "(did you mean 'matrix'?)")),
        ('role_lr="embedding"', ("'embedding' is not ROLE=MULT",)),
        ("gpt2", ("'gpt2' is not a key=value item", "--vary optimizer=torch_adamw")),
    ],
)  # fmt: skip
def test_a_bad_change_names_its_key_and_what_it_may_be(change: str, facts: tuple[str, ...]) -> None:
    with raises_naming(SpecError, *facts):
        split_change(change)


def test_the_recipe_is_resolved_and_checked_before_any_run() -> None:
    cfg = TrainConfig(steps=10)
    resolved, recipe = check_recipe(split_change("schedule=wsd, lr=2e-3"), cfg, 16)
    assert recipe_text(recipe) == "adamw · wsd(decay=0.2,shape=sqrt)"
    assert (resolved.lr, resolved.min_lr, resolved.warmup, resolved.steps) == (2e-3, 2e-4, 1, 10)
    _, base = check_recipe(None, cfg, 16)
    assert recipe_text(base) == "adamw · cosine"
    # an optimizer the registry does not have: the caret under it, in the --vary token
    with pytest.raises(SpecError) as e:
        check_recipe(split_change("norm=none, optimizer=adamx"), cfg, 16)
    assert e.value.message.startswith("--vary 'norm=none, optimizer=adamx': optimizer 'adamx': "
                                      "no installed plugin provides optimizer 'adamx' "
                                      "(did you mean 'adamw'?)")  # fmt: skip
    assert (e.value.start, e.value.end) == (21, 26)
    with pytest.raises(SpecError, match=r"decay is a fraction of the steps") as e:
        check_recipe(split_change('schedule="wsd(decay=2)"'), cfg, 16)
    assert e.value.spec == 'schedule="wsd(decay=2)"' and e.value.start == 10  # inside the quotes
    with raises_naming(TrainError, "--vary 'lr=-1': --lr -1.0: must be a number > 0"):
        check_recipe(split_change("lr=-1"), cfg, 16)
    with raises_naming(TrainError, "--vary 'warmup=50': --warmup 50: must be at most"):
        check_recipe(split_change("warmup=50"), cfg, 16)  # past the 10 steps
    with raises_naming(TrainError, "--schedule cosin:", "did you mean 'cosine'?"):
        check_recipe(None, TrainConfig(schedule="cosin"), 16)  # the sweep's own option


def test_an_option_the_varied_optimizer_does_not_take_is_refused_up_front() -> None:
    def build(groups: list[dict[str, Any]], lr: float) -> torch.optim.Optimizer:
        return torch.optim.SGD(groups, lr=lr)

    with scoped_registry() as registry:
        registry.add(Component(kind="optimizer", name="plain_sgd", build=build), name="test")
        cfg = TrainConfig(betas=(0.8, 0.9))
        check_recipe(None, cfg, 16)  # AdamW takes them
        with raises_naming(TrainError, "--vary 'optimizer=plain_sgd': --betas 0.8 0.9: "
                           "optimizer 'plain_sgd' takes no betas"):  # fmt: skip
            check_recipe(split_change("optimizer=plain_sgd"), cfg, 16)
