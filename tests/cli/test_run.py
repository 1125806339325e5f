"""`lmcore run`: output format, a finite loss, gradients everywhere, and its errors."""

from __future__ import annotations

import io
import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lmcore import Component, ModelInputError, parse_spec, scoped_registry
from lmcore.cli.main import main
from lmcore.interfaces import PositionalEncodingBase
from lmcore.model.nn import cross_entropy
from lmcore.train.smoke import ProgressBar, gradient_problems, run_steps

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


def test_run_steps_reaches_every_parameter_and_is_seeded() -> None:
    result = run_steps("cs336-tiny, pos=learned", steps=2, batch=2, seq_len=16, device="cpu")
    assert result.ok and result.gradient_problems == ()
    assert result.param_tensors == 31  # cs336-tiny's 30 plus the learned position table
    assert result.timed_steps == 1 and result.tokens_per_second > 0
    again = run_steps("cs336-tiny, pos=learned", steps=2, batch=2, seq_len=16, device="cpu")
    other = run_steps("cs336-tiny, pos=learned", steps=2, batch=2, seq_len=16, device="cpu", seed=1)
    assert again.losses == result.losses != other.losses


def test_default_sequence_is_the_shorter_of_128_and_the_context() -> None:
    assert run_steps("cs336-tiny", steps=1, batch=1, device="cpu").seq_len == 16
    assert (
        run_steps("cs336-tiny, context_length=300", steps=1, batch=1, device="cpu").seq_len == 128
    )


def test_cross_entropy_matches_torch_and_survives_large_logits() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g)
    targets = torch.randint(0, 11, (3, 5), generator=g)
    expected = F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1))
    torch.testing.assert_close(cross_entropy(logits, targets), expected)
    torch.testing.assert_close(cross_entropy(logits * 1000 + 100, targets), F.cross_entropy(
        (logits * 1000 + 100).reshape(-1, 11), targets.reshape(-1)
    ))  # fmt: skip
    bf16 = cross_entropy(logits.bfloat16(), targets)
    assert bf16.dtype == torch.float32
    torch.testing.assert_close(bf16, expected, atol=0.05, rtol=0.0)


def test_gradient_problems_names_each_parameter_and_why() -> None:
    module = nn.Module()
    module.used = nn.Parameter(torch.ones(2))
    module.unused = nn.Parameter(torch.ones(2))
    module.nan = nn.Parameter(torch.ones(2))
    module.flat = nn.Parameter(torch.ones(2))
    module.frozen = nn.Parameter(torch.ones(2), requires_grad=False)
    loss = (module.used * 2).sum() + (module.nan * float("nan")).sum() + module.flat.sum() * 0
    loss.backward()
    assert gradient_problems(module) == [
        "unused: no gradient",
        "nan: non-finite gradient",
        "flat: zero gradient",
    ]


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


def test_run_steps_rejects_a_sequence_beyond_the_context() -> None:
    with pytest.raises(
        ModelInputError, match=r"sequence length 17 does not fit context_length=16; use 1\.\.16"
    ):
        run_steps("cs336-tiny", seq_len=17, device="cpu")


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


def test_progress_bar_redraws_one_line_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    bar = ProgressBar(stream, width=4)
    for step in range(1, 3):
        bar(step, 2, 9.5 - step)
    drawn = stream.getvalue()
    assert re.fullmatch(
        r"\r\[##\.\.\] 1/2  loss 8\.5000  \d+\.\d s\r\[####\] 2/2  loss 7\.5000  \d+\.\d s\n", drawn
    )
