"""The example third-party plugin, examples/lmcore-dyt, end to end as its users would meet it:
pip-installed (offline) into a temporary directory, then used by fresh processes with that
directory on PYTHONPATH: `lmcore plugins` lists it, a spec builds a model with it, pytest's
`--lmcore-conformance` passes on it; and once removed, it is gone.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lmcore-dyt"
# tinystories with RMSNorm has 22,696,448 parameters; each of its 9 norms (2 per layer, plus
# ln_final) grows from 512 gains to DyT's 1 + 512 + 512.
TINYSTORIES_DYT_PARAMS = 22_696_448 + 9 * (1 + 512 + 512 - 512)

pytestmark = pytest.mark.skipif(
    any(d.metadata["Name"] == "lmcore-dyt" for d in md.distributions()),
    reason="lmcore-dyt is installed in this environment (tox's dyt envs); the install / remove "
    "round trip needs an environment without it",
)


def install(tmp: Path) -> Path:
    """`pip install --no-deps --target` a copy of the example (the build happens outside the
    checkout), offline: setuptools comes from lmcore's test extra."""
    src, site = tmp / "src", tmp / "site"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", ".*"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--no-build-isolation", "--target", str(site), str(src)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return site


def run(
    site: Path, *args: str, cwd: Path | None = None, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `args` in a fresh process that sees the plugins installed in `site`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMCORE_")}
    env.update(env_extra or {})
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(list(args), cwd=cwd or site, env=env, capture_output=True, text=True)


def lmcore_cli(
    site: Path, *args: str, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The `lmcore` console script beside this Python, as a user would type it."""
    script = shutil.which("lmcore", path=str(Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "lmcore"]
    return run(site, *command, *args, env_extra=env_extra)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install(tmp_path_factory.mktemp("lmcore-dyt"))


def test_lmcore_plugins_lists_it_with_its_distribution_and_version(site: Path) -> None:
    table = lmcore_cli(site, "plugins", "--kind", "norm")
    assert table.returncode == 0, table.stderr
    [row] = [line for line in table.stdout.splitlines() if line.split()[:2] == ["norm", "dyt"]]
    assert row.split()[2:5] == ["lmcore-dyt", "0.1.0", "ok"]
    assert row.endswith("alpha_init: float = 0.5, bias: bool = true")
    data = json.loads(lmcore_cli(site, "plugins", "--json").stdout)
    [dyt] = [r for r in data["components"] if r["name"] == "dyt"]
    assert (dyt["kind"], dyt["dist"], dyt["version"], dyt["module"]) == (
        "norm", "lmcore-dyt", "0.1.0", "lmcore_dyt",
    )  # fmt: skip


def test_a_spec_builds_a_model_with_it(site: Path) -> None:
    code = (
        "import torch, lmcore\n"
        "m = lmcore.build_model('tinystories, norm=dyt')\n"
        "print(m.spec)\n"
        "print(sum(p.numel() for p in m.parameters()), type(m.layers[0].ln1).__module__)\n"
        "print(tuple(m(torch.randint(0, 10_000, (2, 8))).shape))\n"
    )
    used = run(site, sys.executable, "-c", code)
    assert used.returncode == 0, used.stderr
    spec, size, shape = used.stdout.splitlines()
    assert spec.endswith(
        "norm=dyt(alpha_init=0.5,bias=true),ffn=swiglu,pos=rope(theta=10000.0),attn=sdpa"
    )
    assert size == f"{TINYSTORIES_DYT_PARAMS} lmcore_dyt"
    assert shape == "(2, 8, 10000)"


def test_the_conformance_kit_passes_on_it(site: Path, tmp_path: Path) -> None:
    """What the plugin author runs: its own tests, whose addopts add the conformance kit."""
    src = tmp_path / "src"
    shutil.copytree(EXAMPLE / "tests", src / "tests")
    shutil.copy(EXAMPLE / "pyproject.toml", src)
    result = run(
        site, sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "--rootdir", str(src),
        "-c", str(src / "pyproject.toml"), str(src / "tests"), "--lmcore-compile-backend", "aot_eager",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    out = result.stdout
    assert (
        "lmcore conformance: kinds all; components lmcore-dyt:dyt; compile backend aot_eager" in out
    )
    for test in (
        "test_forward[norm:dyt-bfloat16]", "test_params[norm:dyt(bias=false)]",
        "test_compile[norm:dyt]", "test_per_token[norm:dyt]", "test_meta[norm:dyt]",
        "test_activations[norm:dyt]", "test_activations[norm:dyt(bias=false)]",
        "test_cache[norm:dyt]",
    ):  # fmt: skip
        assert f"lmcore-conformance::{test} PASSED" in out, out
    # 14 checks with the defaults, 11 with bias=false (no compile, cache or coordinates), 6 unit
    # tests.
    assert "test_coordinates[norm:dyt] PASSED" in out, out
    assert "31 passed" in out.splitlines()[-1]


def test_once_removed_it_is_gone(tmp_path: Path) -> None:
    site = install(tmp_path)
    assert "lmcore-dyt" in lmcore_cli(site, "plugins", "--kind", "norm").stdout
    shutil.rmtree(site / "lmcore_dyt-0.1.0.dist-info")
    (site / "lmcore_dyt.py").unlink()

    listed = lmcore_cli(site, "plugins", "--kind", "norm")
    assert listed.returncode == 0 and "dyt" not in listed.stdout
    built = lmcore_cli(site, "build", "tinystories, norm=dyt")
    assert built.returncode == 2
    assert "no installed plugin provides norm 'dyt'" in built.stderr
    code = "import lmcore\nlmcore.build_model('tinystories, norm=dyt')"
    failed = run(site, sys.executable, "-c", code)
    assert "lmcore.errors.SpecError: no installed plugin provides norm 'dyt'" in failed.stderr


SAVE_AND_LOAD = """
import sys, torch, lmcore
torch.manual_seed(0)
model = lmcore.build_model("cs336-tiny, norm=dyt(alpha_init=0.7)")
with torch.no_grad():
    for p in model.parameters():
        p.add_(0.1 * torch.randn_like(p))
model.save(sys.argv[1])
loaded = lmcore.load(sys.argv[1])
ids = torch.randint(0, 10_000, (2, 16))
print(torch.equal(loaded(ids), model(ids)), type(loaded.layers[0].ln1).__module__)
"""
LOAD = """
import sys, warnings, lmcore
warnings.simplefilter("error")
try:
    lmcore.load(sys.argv[1])
except Exception as e:
    print(type(e).__name__, e, sep=": ")
"""


@pytest.mark.slow  # six fresh processes, each importing torch: ~20 s on 2 cores
def test_a_checkpoint_made_with_it_needs_it_and_says_so(tmp_path: Path) -> None:
    """Save with the plugin installed (bitwise-equal logits after load); upgrade it (a warning
    naming both versions, an error when strict); uninstall it (the error names what to install)."""
    site = install(tmp_path)
    path = tmp_path / "dyt.safetensors"
    saved = run(site, sys.executable, "-c", SAVE_AND_LOAD, str(path))
    assert saved.returncode == 0, saved.stderr
    assert saved.stdout.split() == ["True", "lmcore_dyt"]
    described = lmcore_cli(site, "describe", str(path))
    assert described.returncode == 0, described.stderr
    assert "  norm   dyt        lmcore-dyt 0.1.0 (entry point 'dyt', module lmcore_dyt)" in (
        described.stdout.splitlines()
    )

    info = site / "lmcore_dyt-0.1.0.dist-info"
    (info / "METADATA").write_text((info / "METADATA").read_text().replace("0.1.0", "0.2.0"))
    info.rename(site / "lmcore_dyt-0.2.0.dist-info")
    upgraded = run(site, sys.executable, "-c", LOAD, str(path))
    assert upgraded.stdout.strip() == (
        f"CheckpointWarning: {path}: norm 'dyt' was saved with lmcore-dyt 0.1.0, and lmcore-dyt "
        "0.2.0 is installed. Loading it anyway; if its tensors no longer fit, or to reproduce it "
        "exactly, pip install lmcore-dyt==0.1.0"
    )
    strict = lmcore_cli(site, "describe", str(path), env_extra={"LMCORE_STRICT_PLUGINS": "1"})
    assert strict.returncode == 2
    assert strict.stderr.startswith(
        f"lmcore describe: error: {path}: norm 'dyt' was saved with lmcore-dyt 0.1.0, and "
        "lmcore-dyt 0.2.0 is installed. LMCORE_STRICT_PLUGINS is set, so this is an error"
    )

    shutil.rmtree(site / "lmcore_dyt-0.2.0.dist-info")
    (site / "lmcore_dyt.py").unlink()
    missing = run(site, sys.executable, "-c", LOAD, str(path))
    assert missing.stdout.startswith(
        f"CheckpointError: {path}: needs norm 'dyt', provided by lmcore-dyt 0.1.0 (entry point "
        "'dyt', module lmcore_dyt) when it was saved, and no installed plugin provides it"
    )
    assert missing.stdout.strip().endswith("; install it: pip install lmcore-dyt==0.1.0")
    cli = lmcore_cli(site, "describe", str(path))
    assert cli.returncode == 2 and "install it: pip install lmcore-dyt==0.1.0" in cli.stderr
