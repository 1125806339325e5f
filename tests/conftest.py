"""Shared fixtures: real fake distributions on sys.path, and isolated registries."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lmcore.registry import Registry, use_registry
from tests.helpers.compiling import GraphRecorder
from tests.helpers.models import tiny_corpus

MakeDist = Callable[..., Path]


@pytest.fixture(autouse=True)
def _clean_plugin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start without the user's plugin switches."""
    for var in (
        "LMCORE_DISABLE_PLUGINS",
        "LMCORE_DISABLE_PLUGIN_AUTOLOAD",
        "LMCORE_STRICT_PLUGINS",
    ):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def make_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeDist]:
    """Install a distribution into a temporary site directory on sys.path.

    make_dist("lmcore-flash", entry_points={"flash": "flash_mod"}, modules={"flash_mod": src})
    writes `lmcore_flash-1.0.dist-info/{METADATA,entry_points.txt}` and the modules, exactly as
    pip would, so `importlib.metadata` finds it with no mocking.
    """
    created: list[str] = []

    def make(
        name: str,
        *,
        version: str = "1.0",
        entry_points: dict[str, str],
        modules: dict[str, str] | None = None,
        group: str = "lmcore",
    ) -> Path:
        site = tmp_path / f"site-{name}"
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8"
        )
        lines = [f"[{group}]"] + [f"{k} = {v}" for k, v in entry_points.items()]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        for mod, source in (modules or {}).items():
            (site / f"{mod}.py").write_text(textwrap.dedent(source), encoding="utf-8")
            created.append(mod)
        monkeypatch.syspath_prepend(str(site))
        importlib.invalidate_caches()
        return site

    yield make
    for mod in created:
        sys.modules.pop(mod, None)


@pytest.fixture
def registry() -> Iterator[Registry]:
    """A fresh registry (entry points loaded anew) in use for the test only."""
    reg = Registry()
    with use_registry(reg):
        yield reg


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Prepared token data of `tiny_corpus` (vocabulary 300), shared by the training tests."""
    from lmcore.data.preparing import prepare

    root = tmp_path_factory.mktemp("tiny-data")
    prepare([tiny_corpus(root / "text")], root / "data", vocab_size=300, val_fraction=0.2,
            split_block=64, context_length=16, progress=False)  # fmt: skip
    return root / "data"


@pytest.fixture
def single_thread() -> Iterator[None]:
    """One intra-op thread for tiny training runs: on a shared 2-core machine, two OpenMP threads
    spin-waiting for each other make a step of a tiny model several times slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def traced() -> Iterator[GraphRecorder]:
    """A `GraphRecorder`, with dynamo's caches reset before and after the test."""
    import torch

    torch.compiler.reset()
    try:
        yield GraphRecorder()
    finally:
        torch.compiler.reset()


# ------------------------------------------------------------------ checkpoints


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A checkpoint of `SMALL_SPEC`, every weight perturbed: the checkpoint tests (here and in
    tests/model) load it, or damage a copy of it."""
    from tests.helpers.models import SMALL_SPEC, perturbed

    path: Path = perturbed(SMALL_SPEC).save(tmp_path / "m.safetensors")
    return path


# --- evaluation -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def eval_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding a random tiny model (tests.helpers.EVAL_SPEC) with a byte-level BPE
    beside it, and two text files, a.py and b.py; shared by the evaluation tests."""
    from tests.helpers.runs import write_eval_checkpoint

    return write_eval_checkpoint(tmp_path_factory.mktemp("eval"))


@pytest.fixture
def resolutions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every spec text resolved while the test runs, in order (each run of the resolver)."""
    import lmcore.blueprint

    seen: list[str] = []
    real = lmcore.blueprint._Resolver.resolve

    def counting(self: lmcore.blueprint._Resolver) -> lmcore.blueprint.Blueprint:
        seen.append(self.text)
        return real(self)

    monkeypatch.setattr(lmcore.blueprint._Resolver, "resolve", counting)
    return seen
