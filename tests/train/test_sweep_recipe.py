"""`lmcore.train.sweep` varying the recipe: variants that change the optimizer or the schedule
(not the model) planned, named and refused as model variants are, trained on the same tokens
under paired seeds, with the recipe in the tables and in every run directory."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from lmcore.errors import SpecError, TrainError
from lmcore.train.runs import read_metrics, read_run, spec_hash
from lmcore.train.summary import summary_markdown
from lmcore.train.sweep import plan, sweep, table_markdown
from lmcore.train.variants import recipe_text
from tests.helpers.errors import raises_naming
from tests.helpers.models import TINY_SPEC
from tests.helpers.runs import sweep_config

pytestmark = pytest.mark.usefixtures("single_thread")

WSD = "wsd(decay=0.2,shape=sqrt)"  # `schedule=wsd` written canonically


def test_a_recipe_variant_is_planned_named_and_refused_like_a_model_variant() -> None:
    runs = plan(TINY_SPEC, ["schedule=wsd", "optimizer=torch_adamw, lr=3e-3", "norm=none"])
    base, wsd, adam, nonorm = runs
    assert [r.label for r in runs] == ["baseline", "schedule=wsd", "optimizer=torch_adamw, lr=3e-3",
                                       "norm=none"]  # fmt: skip
    assert wsd.blueprint.spec == base.blueprint.spec == adam.blueprint.spec  # the same model
    assert (base.recipe, wsd.recipe, adam.recipe) == ("adamw · cosine", f"adamw · {WSD}",
                                                      "torch_adamw · cosine")  # fmt: skip
    assert wsd.train == {"schedule": "wsd"} and adam.train == {"optimizer": "torch_adamw",
                                                               "lr": 3e-3}  # fmt: skip
    assert nonorm.train == {} and nonorm.name == f"norm-none-{spec_hash(nonorm.blueprint.spec)}"
    assert wsd.name.startswith("schedule-wsd-") and adam.name.startswith(
        "optimizer-torch_adamw-lr-3e-3-"
    )
    assert len({r.name for r in runs}) == 4  # the recipe is in the hash too
    cfg = adam.config(sweep_config())
    assert (cfg.optimizer, cfg.lr, cfg.steps) == ("torch_adamw", 3e-3, 20)
    with raises_naming(TrainError, "--vary 'optimizer=adamw'",
                       "trains the same model with the same recipe as the baseline"):  # fmt: skip
        plan(TINY_SPEC, ["optimizer=adamw"])  # the default
    with raises_naming(TrainError, "--vary 'schedule = wsd(decay=0.2)'",
                       "the same model with the same recipe as --vary 'schedule=wsd'"):  # fmt: skip
        plan(TINY_SPEC, ["schedule=wsd", "schedule = wsd(decay=0.2)"])
    # a recipe that the sweep's own options already give is the baseline's too
    with raises_naming(TrainError, "as the baseline"):
        plan(TINY_SPEC, ["lr=3e-3"], config=sweep_config())
    with pytest.raises(SpecError, match=r"--vary 'optimizer=adamx': optimizer 'adamx'"):
        plan(TINY_SPEC, ["pos=nope", "optimizer=adamx"])  # before anything trains


def test_a_recipe_variant_keeps_the_baselines_model_under_match() -> None:
    runs = plan(TINY_SPEC, ["schedule=wsd", "ffn=silu"], match="params")
    assert runs[1].matched is not None and runs[1].matched.note.endswith("(as is, +0.00%)")
    assert runs[1].blueprint.spec == runs[0].blueprint.spec
    assert runs[2].matched is not None and runs[2].matched.changed


def test_recipe_variants_train_the_same_tokens_under_paired_seeds(
    tiny_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "recipes"
    config = replace(sweep_config(), steps=6, eval_every=3)
    lines: list[str] = []
    changes = ["schedule=wsd", "optimizer=torch_adamw"]
    result = sweep(TINY_SPEC, changes, tiny_data, out, config, seeds=2, echo=lines.append)
    assert result.failed == [] and len(result.rows) == 6
    by_label = {r.label: r for r in result.rows}
    for seed in (0, 1):
        base, wsd, adam = (by_label[f"{v}, seed {seed}"]
                           for v in ("baseline", "schedule=wsd", "optimizer=torch_adamw"))  # fmt: skip
        infos = [read_run(r.run) for r in (base, wsd, adam)]
        assert [i["config"]["seed"] for i in infos] == [seed] * 3
        assert [(i["config"]["optimizer"], i["config"]["schedule"]) for i in infos] == [
            ("adamw", "cosine"), ("adamw", WSD), ("torch_adamw", "cosine")]  # fmt: skip
        assert [i["recipe"]["schedule"]["spec"] for i in infos] == ["cosine", WSD, "cosine"]
        assert base.tokens == wsd.tokens == adam.tokens == 6 * 8 * 16  # the same budget
        assert (base.recipe, wsd.recipe, adam.recipe) == ("adamw · cosine", f"adamw · {WSD}",
                                                          "torch_adamw · cosine")  # fmt: skip
        # one seed, one model: the same initial weights and batches, so the untrained model's
        # evaluation is the same number in every variant (the pair differs by the recipe alone)
        first = [next(m["val_loss"] for m in read_metrics(r.run) if m.get("kind") == "eval")
                 for r in (base, wsd, adam)]  # fmt: skip
        assert first[0] == first[1] == first[2]
        assert wsd.val_loss != base.val_loss  # the schedule changed what was learnt
    _, wsd_s, adam_s = result.summaries
    assert wsd_s.delta is not None and wsd_s.delta.n == 2 and wsd_s.delta.low is not None
    assert adam_s.delta is not None and adam_s.delta.n == 2
    assert wsd_s.recipe == f"adamw · {WSD}"
    table = summary_markdown(result.summaries).splitlines()
    assert (
        table[0]
        == "| variant | recipe | non-embedding params | val loss | Δ val [95% CI] | status |"
    )
    assert table[3].startswith(f"| `schedule=wsd` | `adamw · {WSD}` | 20,640 | ")
    assert table[4].startswith("| `optimizer=torch_adamw` | `torch_adamw · cosine` | ")
    runs = table_markdown(result.rows).splitlines()
    assert runs[0].startswith("| run | recipe | parameters |")
    assert runs[2].startswith("| `baseline, seed 0` | `adamw · cosine` | ")
    data = json.loads((out / "compare.json").read_text())
    assert [v["recipe"] for v in data["variants"]] == [r.recipe for r in plan(
        TINY_SPEC, changes, config=config)]  # fmt: skip
    assert data["runs"][2]["recipe"] == f"adamw · {WSD}"
    assert (
        'variants = ["schedule=wsd", "optimizer=torch_adamw"]' in (out / "sweep.toml").read_text()
    )
    # the same sweep again: every run is found under its name, none is trained twice
    again = sweep(TINY_SPEC, changes, tiny_data, out, config, seeds=2, echo=lines.append)
    assert [r.val_loss for r in again.rows] == [r.val_loss for r in result.rows]
    assert "\n".join(lines).count("before, kept") == 6


def test_recipe_text_is_the_canonical_specs() -> None:
    from lmcore.train.recipe import Recipe

    assert recipe_text(Recipe.of("torch_adamw", "wsd")) == f"torch_adamw · {WSD}"
