"""Checkpoint paths wherever the command line takes a spec: build (--save), describe, run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import lmcore
import lmcore.blueprint
from lmcore import parse_spec
from lmcore.blueprint import Blueprint
from lmcore.cli.main import main
from lmcore.model.nn import cross_entropy
from lmcore.train.smoke import random_tokens, run_steps

SPEC = "cs336-tiny, pos=nope"


def mib(path: Path) -> str:
    return f"{path.stat().st_size / 2**20:.2f} MiB"


@pytest.fixture
def checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp_path / "m.safetensors"
    assert main(["build", SPEC, "--save", str(path)]) == 0
    capsys.readouterr()
    return path


def test_build_save_writes_a_seeded_model_that_loads_with_the_same_logits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.safetensors"
    assert main(["build", SPEC, "--save", str(path), "--seed", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [str(parse_spec(SPEC)), "parameters: 1,403,328"]
    assert out[2] == f"saved: {path} ({mib(path)}, float32)"
    torch.manual_seed(3)
    fresh = lmcore.build_model(SPEC)
    ids = torch.randint(0, 10_000, (2, 16))
    assert torch.equal(lmcore.load(path)(ids), fresh(ids))


def test_build_from_a_checkpoint_can_convert_its_dtype(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    half = checkpoint.with_name("bf16.safetensors")
    assert main(["build", str(checkpoint), "--dtype", "bfloat16", "--save", str(half)]) == 0
    assert capsys.readouterr().out.splitlines()[2].endswith(", bfloat16)")
    assert lmcore.read_info(half).dtype == "bfloat16"
    before, after = lmcore.load(checkpoint), lmcore.load(half)
    assert torch.equal(after.lm_head.weight, before.lm_head.weight.bfloat16())


def test_describe_shows_the_embedded_spec_and_provenance(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["describe", str(checkpoint)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        f"checkpoint: {checkpoint} ({mib(checkpoint)}, 30 tensors, float32; lmcore checkpoint format 1, "
        f"written by lmcore {lmcore.__version__} with torch {torch.__version__})"
    )
    version = lmcore.__version__
    assert lines[1:7] == [
        f"  norm   rmsnorm  lmcore-registry {version} (entry point 'rmsnorm', module lmcore_rmsnorm)",
        f"  ffn    swiglu   lmcore-registry {version} (entry point 'swiglu', module lmcore_ffn:swiglu)",
        f"  pos    nope     lmcore-registry {version} (entry point 'nope', module lmcore_nope)",
        f"  attn   sdpa     lmcore-registry {version} (entry point 'sdpa', module lmcore_sdpa)",
        f"  block  prenorm  lmcore-registry {version} (entry point 'prenorm', module lmcore_blocks:prenorm)",
        "  checksums: crc32 of each of the 30 tensors, verified on load",
    ]
    assert lines[7] == ""
    assert lines[8] == f"spec: {parse_spec(SPEC)}"
    assert lines[9] == "input: batch 1 × seq 16 tokens, float32"
    assert "total" in "\n".join(lines)


def test_describe_json_has_the_checkpoint(checkpoint: Path, capsys) -> None:
    lmcore.build_model(SPEC).save(checkpoint, metadata={"note": "hello"})
    assert main(["describe", str(checkpoint), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["checkpoint"]["spec"] == data["spec"] == str(parse_spec(SPEC))
    assert data["checkpoint"]["components"]["pos"]["dist"] == "lmcore-registry"
    assert data["checkpoint"]["metadata"] == {"note": "hello"}
    assert data["dtype"] == "float32" and data["total"]["params"] == 1_403_328


def test_describe_uses_the_checkpoints_dtype(checkpoint: Path, capsys) -> None:
    half = lmcore.build_model(SPEC, dtype=torch.bfloat16).save(
        checkpoint.with_name("h.safetensors")
    )
    assert main(["describe", str(half)]) == 0
    assert "input: batch 1 × seq 16 tokens, bfloat16" in capsys.readouterr().out


def test_run_starts_from_the_checkpoints_weights(checkpoint: Path) -> None:
    result = run_steps(lmcore.checkpoint.resolve_checkpoint(checkpoint), steps=1, batch=2,
                       seq_len=8, device="cpu", weights=checkpoint)  # fmt: skip
    model = lmcore.load(checkpoint)
    inputs, targets = random_tokens(10_000, 2, 8, torch.Generator().manual_seed(0))
    assert result.losses[0] == float(cross_entropy(model(inputs), targets))


def test_run_accepts_a_checkpoint(checkpoint: Path, capsys) -> None:
    assert main(["run", str(checkpoint), "--steps", "2", "--seq", "8", "--device", "cpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"spec: {parse_spec(SPEC)}"


@pytest.mark.parametrize("command", ["build", "describe", "run"])
def test_a_bad_checkpoint_path_exits_2(command: str, tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nope.safetensors"
    assert main([command, str(missing)]) == 2
    assert capsys.readouterr().err == f"lmcore {command}: error: {missing}: no such file\n"


@pytest.fixture
def resolutions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = lmcore.blueprint._Resolver.resolve

    def counting(self: lmcore.blueprint._Resolver) -> Blueprint:
        seen.append(self.text)
        return real(self)

    monkeypatch.setattr(lmcore.blueprint._Resolver, "resolve", counting)
    return seen


@pytest.mark.parametrize(
    "argv",
    [["describe"], ["build"], ["build", "--device", "meta"], ["run", "--steps", "1", "--seq", "4"]],
)
def test_each_command_resolves_a_checkpoint_once(
    argv: list[str], checkpoint: Path, resolutions: list[str], capsys
) -> None:
    assert main([argv[0], str(checkpoint), *argv[1:]]) == 0
    assert resolutions == [lmcore.read_info(checkpoint).spec]


def test_a_version_warning_goes_to_stderr(checkpoint: Path, capsys) -> None:
    with safe_open(str(checkpoint), "pt") as f:
        meta = dict(f.metadata())
    table = json.loads(meta["lmcore.components"])
    table["pos"]["version"] = "0.0.9"
    meta["lmcore.components"] = json.dumps(table)
    save_file(load_file(str(checkpoint)), str(checkpoint), metadata=meta)
    assert main(["describe", str(checkpoint)]) == 0
    err = capsys.readouterr().err
    assert err == (
        f"lmcore describe: warning: {checkpoint}: pos 'nope' was saved with lmcore-registry "
        f"0.0.9, and lmcore-registry {lmcore.__version__} is installed. Loading it anyway; if its "
        "tensors no longer fit, or to reproduce it exactly, pip install lmcore-registry==0.0.9\n"
    )


def test_convert_needs_one_direction(capsys) -> None:
    assert main(["convert"]) == 2  # usage errors: one line, status 2 (issue 11)
    assert (
        "one of the arguments --from-hf --to-hf --from-gguf --to-gguf is required"
        in capsys.readouterr().err
    )


def test_the_console_script_round_trip(tmp_path: Path) -> None:
    """The README's path, as a new user types it."""
    script = str(Path(sys.executable).with_name("lmcore"))
    path = tmp_path / "m.safetensors"
    subprocess.run([script, "build", SPEC, "--save", str(path)], check=True, capture_output=True)
    described = subprocess.run(
        [script, "describe", str(path)], check=True, capture_output=True, text=True
    )
    assert described.stdout.startswith(f"checkpoint: {path} (")
