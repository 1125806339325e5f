"""Evaluation windows: each token predicted once with the context the stride leaves, a loss
that matches an independent computation and bits per byte over the files' bytes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lmcore.data import EOT
from lmcore.errors import EvalError
from lmcore.eval.windows import (
    Stream,
    evaluate_stream,
    plan_windows,
    streamed_windows,
    text_stream,
)
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
    ids = torch.tensor(np.concatenate(list(stream.chunks())))
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
    ids = torch.tensor(np.concatenate(list(stream.chunks()))[:40])
    stream = Stream(ids.numpy(), stream.bytes, "x", "y")
    result = evaluate_stream(model, stream, batch_size=4, stride=1)
    nats = 0.0
    with torch.no_grad():
        for j in range(1, len(ids)):
            ctx = ids[max(0, j - 16) : j]
            nats -= float(model(ctx[None])[0, -1].log_softmax(-1)[ids[j]])
    assert result.nats == pytest.approx(nats, rel=1e-5)


def test_windows_planned_as_chunks_arrive_are_those_planned_for_the_whole_stream() -> None:
    rng = np.random.default_rng(0)
    for n in (2, 3, 17, 18, 19, 40, 101):
        for L, stride, batch in ((16, 16, 3), (16, 5, 2), (4, 1, 8), (1, 1, 1)):
            cuts = np.sort(rng.integers(0, n, size=5))
            ids = np.arange(n, dtype=np.int64) * 7
            chunks = iter(np.split(ids, cuts))
            seen = []
            for wins, tokens, offset, width in streamed_windows(chunks, L, stride, batch):
                assert len(wins) <= batch
                assert width == min(L, n - 1)  # the first window's length, in every batch
                for w in wins:  # what each window reads is in the tokens handed with it
                    assert offset <= w.start
                    part = tokens[w.start - offset : w.start - offset + w.length + 1]
                    assert list(part) == list(ids[w.start : w.start + w.length + 1])
                seen += wins
            assert seen == plan_windows(n, L, stride), (n, L, stride)


def test_a_streamed_text_gives_the_numbers_of_the_whole_text_tokenised_at_once(
    tmp_path: Path,
) -> None:
    # ~200 KB cut every ~600 characters, read 7 bytes at a time: the result is the one of the
    # whole file read and tokenised at once (how `lmcore eval --text` read it before), exactly
    from tests.eval.test_chunking import hostile_text

    model, tok = eval_model(), eval_tokenizer()
    files = [tmp_path / "a.txt", tmp_path / "b.txt"]
    files[0].write_bytes(hostile_text(200_000).encode("utf-8"))
    files[1].write_bytes(hostile_text(3_000, seed=1).encode("utf-8"))
    whole = np.array([i for f in files for i in [tok.token_to_id(EOT), *tok.encode(
        f.read_text(encoding="utf-8"), add_special_tokens=False).ids]], dtype=np.int64)  # fmt: skip
    size = sum(len(f.read_text(encoding="utf-8").encode("utf-8")) for f in files)
    streamed = text_stream(files, tok, "tok", chunk=600, block=7)
    assert np.array_equal(np.concatenate(list(streamed.chunks())), whole)
    at_once = evaluate_stream(model, Stream(whole, streamed.bytes, streamed.source, "tok"),
                              batch_size=512, stride=12)  # fmt: skip
    result = evaluate_stream(model, streamed, batch_size=512, stride=12)
    assert (result.nats, result.tokens, result.bytes, result.windows) == (
        at_once.nats, at_once.tokens, at_once.bytes, at_once.windows)  # fmt: skip
    assert result.tokens == len(whole) - 1 and streamed.source == f"2 files ({size:,} bytes)"
    table = streamed.bytes
    assert result.bytes == int(table[whole[1:]].sum()) == size  # byte-level: the text's bytes


def test_the_batch_reported_is_the_one_used() -> None:
    model = eval_model()
    ids = np.arange(1, 40, dtype=np.int64)
    stream = Stream(ids, np.ones(300, dtype=np.int64), "x", "y")
    assert evaluate_stream(model, stream, batch_size=8).batch_size == 3  # 39 tokens: 3 windows
    assert evaluate_stream(model, stream, batch_size=2).batch_size == 2


def _masked_reference(model: torch.nn.Module, ids: np.ndarray, mask: np.ndarray, L: int) -> float:
    """Summed nats over non-overlapping windows of `L`, targets the mask leaves out `IGNORE`."""
    nats = 0.0
    with torch.no_grad():
        for s in range(0, len(ids) - 1, L):
            x = torch.from_numpy(ids[s : s + L]).long()
            y = torch.from_numpy(np.where(mask[s + 1 : s + L + 1] != 0, ids[s + 1 : s + L + 1],
                                          -100)).long()  # fmt: skip
            x = x[: len(y)]
            nats += float(F.cross_entropy(model(x[None])[0], y, ignore_index=-100,
                                          reduction="sum"))  # fmt: skip
    return nats


def test_a_loss_mask_scores_only_the_targets_it_keeps() -> None:
    model = eval_model()
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 256, size=101).astype(np.int64)
    mask = (rng.random(101) < 0.4).astype(np.uint8)
    table = np.arange(300, dtype=np.int64) % 5 + 1  # bytes per token id: distinct, known
    result = evaluate_stream(model, Stream(ids, table, "x", "y", mask), batch_size=3)
    kept = mask[1:] != 0
    assert result.tokens == int(kept.sum()) and result.masked == int((~kept).sum())
    assert result.bytes == int(table[ids[1:][kept]].sum())
    assert result.nats == pytest.approx(_masked_reference(model, ids, mask, 16), rel=1e-5)
    assert result.loss == pytest.approx(result.nats / kept.sum())
    # an all-ones mask is no mask at all, to the last bit
    ones = evaluate_stream(model, Stream(ids, table, "x", "y", np.ones(101, np.uint8)))
    plain = evaluate_stream(model, Stream(ids, table, "x", "y"))
    assert (ones.nats, ones.tokens, ones.bytes, ones.masked) == (
        plain.nats, plain.tokens, plain.bytes, 0)  # fmt: skip


def test_a_mask_travels_with_its_ids_through_overlapping_streamed_windows() -> None:
    # stride < context: each scored target is the one the whole-stream plan scores, with its mask
    model = eval_model()
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 256, size=75).astype(np.int64)
    mask = (rng.random(75) < 0.5).astype(np.uint8)
    result = evaluate_stream(model, Stream(ids, np.ones(300, np.int64), "x", "y", mask),
                             batch_size=2, stride=5)  # fmt: skip
    nats = 0.0
    with torch.no_grad():
        for w in plan_windows(75, 16, 5):
            x = torch.from_numpy(ids[w.start : w.start + w.length])
            logp = model(x[None])[0].log_softmax(-1)
            for t in range(w.length - w.scored, w.length):
                if mask[w.start + t + 1]:
                    nats -= float(logp[t, ids[w.start + t + 1]])
    assert result.tokens == int(mask[1:].sum()) and result.nats == pytest.approx(nats, rel=1e-5)


def test_a_mask_that_leaves_out_every_target_is_refused() -> None:
    ids = np.arange(1, 40, dtype=np.int64)
    stream = Stream(ids, np.ones(300, np.int64), "val split of d (loss-masked)", "y",
                    np.zeros(39, np.uint8))  # fmt: skip
    with pytest.raises(EvalError) as e:
        evaluate_stream(eval_model(), stream)
    assert str(e.value) == (
        "val split of d (loss-masked): its loss mask leaves out all 38 targets, so nothing is "
        "scored; evaluate a split with assistant tokens in it"
    )
    with pytest.raises(EvalError, match="the loss mask holds 3 entries for 39 tokens"):
        Stream(ids, np.ones(300, np.int64), "x", "y", np.zeros(3, np.uint8))


def test_shorter_windows_than_the_models_context_are_those_asked_for() -> None:
    model = eval_model()  # context_length 16
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 256, size=60).astype(np.int64)
    mask = (rng.random(60) < 0.6).astype(np.uint8)
    stream = Stream(ids, np.ones(300, np.int64), "x", "y", mask)
    result = evaluate_stream(model, stream, batch_size=4, context=6)
    assert (result.context_length, result.windows) == (6, math.ceil(59 / 6))
    assert result.nats == pytest.approx(_masked_reference(model, ids, mask, 6), rel=1e-5)
    for bad in (0, 17):
        with pytest.raises(EvalError) as e:
            evaluate_stream(model, stream, context=bad)
        assert str(e.value) == f"--context {bad}: must be in 1..16 (the model's context_length)"
