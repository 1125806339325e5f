"""The plugins a checkpoint needs (`lmcore.checkpoint`): the provenance each component was saved
with, and what loading does when the plugin is missing, disabled, another version, another
distribution, ambiguous or registered in-process only.

Plugins that come and go are real distributions (a `*.dist-info` beside the module, see
conftest's `make_dist`), installed, upgraded and removed on disk between save and load.
"""

from __future__ import annotations

import importlib
import json
import sys
import warnings
from pathlib import Path

import pytest

import lmcore
from lmcore import CheckpointError, CheckpointWarning, Registry
from lmcore.checkpoint import read_info
from tests.helpers.errors import raises_naming, warns_naming
from tests.helpers.models import SMALL_SPEC as SMALL
from tests.helpers.models import perturbed, rewrite


def test_an_lmcore_upgrade_is_one_sentence_for_all_its_components(saved: Path) -> None:
    def older(meta: dict[str, str]) -> dict[str, str]:
        table = json.loads(meta["lmcore.components"])
        for row in table.values():
            row["version"] = "0.0.9"
        return {**meta, "lmcore.components": json.dumps(table)}

    rewrite(saved, metadata=older)
    with pytest.warns(CheckpointWarning) as caught:
        lmcore.load(saved)
    [warning] = caught
    assert str(warning.message) == (
        f"{saved}: norm 'rmsnorm', ffn 'swiglu', pos 'rope', attn 'sdpa', block 'prenorm' and mixer 'attention' were "
        "saved with "
        f"lmcore-registry 0.0.9, and lmcore-registry {lmcore.__version__} is installed. Loading "
        "it anyway; if its tensors no longer fit, or to reproduce it exactly, pip install "
        "lmcore-registry==0.0.9"
    )


# ------------------------------------------------------------------ plugins that come and go

SCALE = """
import torch
from torch import nn
from lmcore import Arg, Component, hookimpl

class Scale(nn.Module):
    def __init__(self, d_model, init=1.0, device=None, dtype=None):
        super().__init__()
        self.gain = nn.Parameter(torch.full((d_model,), init, device=device, dtype=dtype))

    def forward(self, x):
        return x * self.gain

@hookimpl
def lmcore_components():
    return [Component(kind="norm", name="scale", build=Scale,
                      args=(Arg("init", float, 1.0, "initial gain"),),
                      params=lambda d_model: d_model)]
"""


def forget(site: Path, module: str) -> None:
    """Uninstall a distribution made by `make_dist`: take its site off sys.path."""
    sys.path.remove(str(site))
    sys.modules.pop(module, None)
    importlib.invalidate_caches()


def set_version(site: Path, dist: str, old: str, new: str) -> None:
    """What `pip install dist==new` leaves on disk: a renamed dist-info with the new version."""
    info = site / f"{dist.replace('-', '_')}-{old}.dist-info"
    meta = info / "METADATA"
    meta.write_text(meta.read_text().replace(f"Version: {old}", f"Version: {new}"))
    info.rename(site / f"{dist.replace('-', '_')}-{new}.dist-info")
    importlib.invalidate_caches()


@pytest.fixture
def scale_checkpoint(make_dist, tmp_path: Path) -> tuple[Path, Path]:
    site = make_dist("lmcore-scale", version="1.2", entry_points={"scale": "scale_norm"},
                     modules={"scale_norm": SCALE})  # fmt: skip
    model = perturbed(f"{SMALL}, norm=scale(init=0.5)", registry=Registry())
    return site, model.save(tmp_path / "scale.safetensors")


def test_a_missing_plugin_names_the_distribution_to_install(scale_checkpoint) -> None:
    site, path = scale_checkpoint
    assert read_info(path).components["norm"].requirement == "lmcore-scale==1.2"
    assert lmcore.load(path, registry=Registry()).spec.norm.name == "scale"
    forget(site, "scale_norm")
    with raises_naming(
        CheckpointError,
        "scale.safetensors: ",
        "needs norm 'scale'",
        "lmcore-scale 1.2 (entry point 'scale', module scale_norm)",
        "no installed plugin provides norm 'scale'",
        "pip install lmcore-scale==1.2",
    ):
        lmcore.load(path, registry=Registry())


def test_a_disabled_plugin_is_named_with_the_reason(scale_checkpoint) -> None:
    _, path = scale_checkpoint
    with raises_naming(
        CheckpointError,
        "disabled plugins, not loaded (LMCORE_DISABLE_PLUGINS): 'scale' (lmcore-scale 1.2)",
        "pip install lmcore-scale==1.2",
    ):
        lmcore.load(path, registry=Registry(disabled=["scale"]))


def test_another_installed_version_warns_naming_both(
    scale_checkpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    site, path = scale_checkpoint
    set_version(site, "lmcore-scale", "1.2", "1.3")
    with warns_naming(
        CheckpointWarning,
        "scale.safetensors: ",
        "norm 'scale' was saved with lmcore-scale 1.2",
        "lmcore-scale 1.3 is installed",
        "Loading it anyway",
        "pip install lmcore-scale==1.2",
    ):
        model = lmcore.load(path, registry=Registry())
    assert model.blueprint.provenance("norm").version == "1.3"

    monkeypatch.setenv("LMCORE_STRICT_PLUGINS", "1")
    with raises_naming(
        CheckpointError,
        "saved with lmcore-scale 1.2",
        "lmcore-scale 1.3 is installed",
        "LMCORE_STRICT_PLUGINS is set",
        "pip install lmcore-scale==1.2",
        "unset LMCORE_STRICT_PLUGINS",
    ):
        lmcore.load(path, registry=Registry())
    with pytest.raises(CheckpointError, match="LMCORE_STRICT_PLUGINS is set"):
        lmcore.load(path, registry=Registry(strict=True))


def test_another_distribution_providing_the_name_warns(
    scale_checkpoint, make_dist, tmp_path: Path
) -> None:
    site, path = scale_checkpoint
    forget(site, "scale_norm")
    make_dist("other-scale", version="3.0", entry_points={"scale": "scale_norm2"},
              modules={"scale_norm2": SCALE})  # fmt: skip
    with warns_naming(
        CheckpointWarning,
        "norm 'scale' was saved with lmcore-scale 1.2 (entry point 'scale', module scale_norm)",
        "other-scale 3.0 (plugin 'scale', module scale_norm2) is installed",
        "Loading it anyway",
        "pip install lmcore-scale==1.2",
    ):
        lmcore.load(path, registry=Registry())


def test_two_providers_one_of_them_the_saved_one(scale_checkpoint, make_dist) -> None:
    """The name is ambiguous now; the checkpoint picks the distribution that saved it."""
    _, path = scale_checkpoint
    make_dist("other-scale", version="3.0", entry_points={"scale2": "scale_norm3"},
              modules={"scale_norm3": SCALE})  # fmt: skip
    registry = Registry()
    assert registry.is_ambiguous("norm", "scale")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = lmcore.load(path, registry=registry)
    assert model.blueprint.provenance("norm").dist == "lmcore-scale"
    assert "norm=lmcore-scale:scale(init=0.5)" in str(model.spec)


def test_an_in_process_component_must_be_registered_again(tmp_path: Path) -> None:
    from lmcore import Component
    from lmcore_rmsnorm import RMSNorm

    registry = Registry()
    registry.add(Component(kind="norm", name="mine", build=RMSNorm, params=lambda d_model: d_model),
                 name="my-norms")  # fmt: skip
    path = perturbed(f"{SMALL}, norm=mine", registry=registry).save(tmp_path / "m.safetensors")
    assert str(read_info(path).components["norm"]) == (
        "registered in-process (entry point 'my-norms', module lmcore_rmsnorm)"
    )
    assert lmcore.load(path, registry=registry).spec.norm.name == "mine"
    with raises_naming(
        CheckpointError,
        "no installed plugin provides it",
        "register it before loading (Registry.register / Registry.add",
        "plugin 'my-norms' from module lmcore_rmsnorm",
    ):
        lmcore.load(path, registry=Registry())
