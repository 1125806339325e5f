"""The random-token smoke runner behind `lmcore run`: every parameter reached, seeded, the
sequence length, gradient problems named, its progress bar; from a checkpoint's weights."""

from __future__ import annotations

import io
import re
from pathlib import Path

import torch
from torch import nn

import lmcore
from lmcore import ModelInputError
from lmcore.model.nn import cross_entropy
from lmcore.train.smoke import ProgressBar, gradient_problems, random_tokens, run_steps
from tests.helpers.errors import raises_naming
from tests.helpers.runs import CHECKPOINT_SPEC


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


def test_run_steps_rejects_a_sequence_beyond_the_context() -> None:
    with raises_naming(ModelInputError, "sequence length 17", "context_length=16", "use 1..16"):
        run_steps("cs336-tiny", seq_len=17, device="cpu")


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


def test_run_starts_from_the_checkpoints_weights(tmp_path: Path) -> None:
    checkpoint = lmcore.build_model(CHECKPOINT_SPEC).save(tmp_path / "m.safetensors")
    result = run_steps(lmcore.checkpoint.resolve_checkpoint(checkpoint), steps=1, batch=2,
                       seq_len=8, device="cpu", weights=checkpoint)  # fmt: skip
    model = lmcore.load(checkpoint)
    inputs, targets = random_tokens(10_000, 2, 8, torch.Generator().manual_seed(0))
    assert result.losses[0] == float(cross_entropy(model(inputs), targets))
