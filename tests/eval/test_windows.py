"""Evaluation windows: each token predicted once with the context the stride leaves, a loss
that matches an independent computation and bits per byte over the files' bytes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lmcore.data import EOT
from lmcore.errors import EvalError
from lmcore.eval.windows import evaluate_stream, plan_windows, text_stream
from tests.helpers.runs import eval_model, eval_tokenizer

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread is faster


def test_windows_predict_every_token_once_with_the_context_the_stride_leaves() -> None:
    for n in (2, 3, 16, 17, 40, 101):
        for L in (1, 4, 16):
            for stride in sorted({1, max(1, L // 2), L}):
                wins = plan_windows(n, L, stride)
                scored = [
                    t
                    for w in wins
                    for t in range(w.start + w.length - w.scored + 1, w.start + w.length + 1)
                ]
                assert scored == list(range(1, n)), (n, L, stride)
                for w in wins:
                    assert 1 <= w.length <= L and 1 <= w.scored <= w.length
                    if w.start:  # every scored target sees at least L - stride tokens
                        assert w.length - w.scored >= min(L - stride, w.start)


def test_bad_windows_are_refused_by_name() -> None:
    with pytest.raises(EvalError, match=r"--stride 17: must be in 1\.\.16"):
        plan_windows(100, 16, 17)
    with pytest.raises(EvalError, match="holds 1 token: nothing to predict"):
        plan_windows(1, 16)


def test_loss_matches_cross_entropy_of_each_window_and_bpb_the_files_bytes(
    eval_checkpoint: Path,
) -> None:
    model, tok = eval_model(), eval_tokenizer()
    files = [eval_checkpoint / "a.py", eval_checkpoint / "b.py"]
    stream = text_stream(files, tok)
    result = evaluate_stream(model, stream, batch_size=3)
    ids = torch.tensor(stream.tokens)
    assert ids[0] == tok.token_to_id(EOT) and (ids == ids[0]).sum() == 2  # one before each file
    nats = 0.0
    with torch.no_grad():
        for s in range(0, len(ids) - 1, 16):
            x, y = ids[s : s + 16], ids[s + 1 : s + 17]
            x = x[: len(y)]
            nats += float(F.cross_entropy(model(x[None])[0], y, reduction="sum"))
    assert result.tokens == len(ids) - 1 and result.windows == math.ceil((len(ids) - 1) / 16)
    assert result.nats == pytest.approx(nats, rel=1e-5)
    assert result.bytes == sum(len(f.read_bytes()) for f in files)
    assert result.bits_per_byte == pytest.approx(nats / (math.log(2) * result.bytes), rel=1e-5)
    assert result.perplexity == pytest.approx(math.exp(nats / result.tokens), rel=1e-5)


def test_stride_one_gives_every_token_the_full_context_before_it(eval_checkpoint: Path) -> None:
    model, tok = eval_model(), eval_tokenizer()
    stream = text_stream([eval_checkpoint / "b.py"], tok)
    ids = torch.tensor(stream.tokens[:40])
    stream = type(stream)(stream.tokens[:40], stream.bytes, "x", "y")
    result = evaluate_stream(model, stream, batch_size=4, stride=1)
    nats = 0.0
    with torch.no_grad():
        for j in range(1, len(ids)):
            ctx = ids[max(0, j - 16) : j]
            nats -= float(model(ctx[None])[0, -1].log_softmax(-1)[ids[j]])
    assert result.nats == pytest.approx(nats, rel=1e-5)
