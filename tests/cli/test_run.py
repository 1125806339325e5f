"""`lmcore run`: output format, a finite loss, gradients everywhere, from a checkpoint, and its
errors."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from lmcore import Component, parse_spec, scoped_registry
from lmcore.cli.main import main
from lmcore.interfaces import PositionalEncodingBase
from tests.helpers.runs import CHECKPOINT_SPEC

SMALL = ["cs336-tiny", "--steps", "3", "--batch", "2", "--seq", "8", "--device", "cpu"]


def test_output_format_finite_loss_and_gradients(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *SMALL]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0] == f"spec: {parse_spec('cs336-tiny')}"
    assert lines[1] == "model: 1,403,328 parameters, float32 on cpu"
    assert lines[2] == (
        "run: 3 steps × batch 2 × seq 8 = 48 random tokens, "
        "forward + backward of next-token cross-entropy, no weight update"
    )
    loss = re.fullmatch(r"loss: first (\S+), last (\S+) \(ln vocab_size = 9\.2103\)", lines[3])
    assert loss is not None
    first, last = float(loss[1]), float(loss[2])
    # A fresh model is close to uniform over 10,000 tokens: ln(10000) = 9.21.
    assert abs(first - math.log(10000)) < 0.5 and abs(last - math.log(10000)) < 0.5
    assert re.fullmatch(r"throughput: [\d,]+ tokens/s \(steps 2-3; step 1 warms up\)", lines[4])
    assert re.fullmatch(r"peak memory: \d+\.\d\d [KMG]iB \(peak RSS of this process\)", lines[5])
    assert lines[6] == "gradients: all 30 parameter tensors received a finite, non-zero gradient"
    assert len(lines) == 7
    # stderr is not a terminal here: the bar is written once, complete.
    assert re.fullmatch(r"\[#{24}\] 3/3  loss \d+\.\d{4}  \d+\.\d s\n", captured.err)


class IdlePosition(PositionalEncodingBase):
    """Holds a parameter its hooks never use, so no gradient can reach it."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(3))


def test_a_parameter_the_gradient_misses_fails_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    idle = Component(kind="pos", name="idle", build=IdlePosition, params=lambda: 3)
    with scoped_registry() as registry:
        registry.add(idle, name="idle-plugin")
        assert main(["run", "cs336-tiny, pos=idle", *SMALL[1:]]) == 1
    captured = capsys.readouterr()
    assert "gradients: 1 parameter(s) without a usable gradient: pos.unused: no gradient" in (
        captured.out
    )
    assert captured.err.splitlines()[-1] == (
        "lmcore run: error: 1 parameter tensor(s) got no usable gradient (pos.unused: no "
        "gradient); a component holds parameters its forward does not use, or its backward is "
        "broken"
    )


def test_seq_beyond_the_context_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "cs336-tiny", "--seq", "17"]) == 2
    assert capsys.readouterr().err == (
        "lmcore run: error: --seq 17 exceeds context_length=16 of this spec; use --seq 16 or "
        'less, or raise the context in the spec: "cs336-tiny, context_length=17"\n'
    )


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("nonsense", "unknown device 'nonsense'; use auto, cpu, cuda or cuda:N"),
        ("meta", "device 'meta' holds no numbers to train on; use cpu or cuda"),
        pytest.param(
            "cuda",
            "device 'cuda': CUDA is not available in this torch build",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available"),
        ),
    ],
)
def test_bad_devices_exit_2(capsys: pytest.CaptureFixture[str], device: str, message: str) -> None:
    assert main(["run", "cs336-tiny", "--steps", "1", "--device", device]) == 2
    assert capsys.readouterr().err.startswith(f"lmcore run: error: {message}")


def test_bad_step_count_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "cs336-tiny", "--steps", "0"]) == 2
    assert capsys.readouterr().err == (
        "lmcore run: error: argument --steps: expected a positive integer, got '0' "
        "(see lmcore run --help)\n"
    )


def test_run_accepts_a_checkpoint(checkpoint: Path, capsys) -> None:
    assert main(["run", str(checkpoint), "--steps", "2", "--seq", "8", "--device", "cpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"spec: {parse_spec(CHECKPOINT_SPEC)}"


def test_a_canonical_spec_longer_than_a_file_name_runs(capsys: pytest.CaptureFixture[str]) -> None:
    long = str(parse_spec("vocab_size=300, context_length=32, d_model=32, num_layers=1, "
                          "num_heads=2, ffn=moe(num_experts=4, shared=swiglu)"))  # fmt: skip
    assert len(long) > 255
    assert main(["run", long, "--steps", "1", "--batch", "1", "--seq", "4"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"spec: {long}"
