"""`lmcore eval --text/--data`: windows that predict each token once, bits per byte from the
tokenizer's bytes, numbers that match an independent computation and do not depend on the batch
size, and scoring through the KV cache that matches whole-sequence scoring."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import lmcore
from lmcore.cli.main import main
from lmcore.errors import EvalError
from lmcore.eval.bpb import bits_per_byte, token_bytes
from lmcore.eval.scoring import loglikelihoods
from lmcore.eval.windows import evaluate_stream, plan_windows, text_stream

SPEC = "vocab_size=300, context_length=16, d_model=32, num_layers=2, num_heads=4, d_ff=64"
EOT = "<|endoftext|>"
pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread is faster

TEXT = "def größe(x):\n    return x * 2  # ünïcode, 日本語\n\nclass Stack:\n    pass\n"


def make_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT] * 20, trainer)
    return tok


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny model saved with a byte-level BPE beside it, and two text files."""
    root = tmp_path_factory.mktemp("eval")
    torch.manual_seed(0)
    lmcore.save(lmcore.build_model(SPEC), root / "model.safetensors")
    make_tokenizer().save(str(root / "tokenizer.json"))
    (root / "a.py").write_text(TEXT * 3, encoding="utf-8")
    (root / "b.py").write_text("x = 1\n" * 7 + TEXT, encoding="utf-8")
    return root


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


def test_token_bytes_add_up_to_the_texts_bytes_across_split_characters() -> None:
    tok = make_tokenizer()
    table = token_bytes(tok)
    ids = tok.encode(TEXT + EOT + "日本", add_special_tokens=False).ids
    assert tok.token_to_id(EOT) in ids and table[tok.token_to_id(EOT)] == 0
    assert int(table[ids].sum()) == len((TEXT + "日本").encode("utf-8"))
    # a character split across tokens: each token alone decodes to U+FFFD, the sum stays exact
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    assert bits_per_byte(math.log(2) * 10, 5) == pytest.approx(2.0)
    assert math.isnan(bits_per_byte(1.0, 0))


def _model() -> lmcore.TransformerLM:
    torch.manual_seed(0)
    return lmcore.build_model(SPEC).eval()


def test_loss_matches_cross_entropy_of_each_window_and_bpb_the_files_bytes(
    checkpoint: Path,
) -> None:
    model, tok = _model(), make_tokenizer()
    files = [checkpoint / "a.py", checkpoint / "b.py"]
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


def test_stride_one_gives_every_token_the_full_context_before_it(checkpoint: Path) -> None:
    model, tok = _model(), make_tokenizer()
    stream = text_stream([checkpoint / "b.py"], tok)
    ids = torch.tensor(stream.tokens[:40])
    stream = type(stream)(stream.tokens[:40], stream.bytes, "x", "y")
    result = evaluate_stream(model, stream, batch_size=4, stride=1)
    nats = 0.0
    with torch.no_grad():
        for j in range(1, len(ids)):
            ctx = ids[max(0, j - 16) : j]
            nats -= float(model(ctx[None])[0, -1].log_softmax(-1)[ids[j]])
    assert result.nats == pytest.approx(nats, rel=1e-5)


def test_the_numbers_do_not_depend_on_the_batch_size(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = []
    for batch in (1, 3, 8, 64):
        for stride in (16, 5):
            args = ["eval", str(checkpoint), "--text", str(checkpoint / "a.py"),
                    str(checkpoint / "b.py"), "--json", "--batch-size", str(batch),
                    "--stride", str(stride)]  # fmt: skip
            assert main(args) == 0
            out = json.loads(capsys.readouterr().out)
            seen.append((stride, out["nats"], out["bits_per_byte"], out["tokens"], out["bytes"]))
    assert len(set(seen)) == 2  # one result per stride, bit for bit, whatever the batch


def test_the_report_shows_loss_perplexity_and_bits_per_byte(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", str(checkpoint), "--text", str(checkpoint / "a.py")]) == 0
    out = capsys.readouterr().out
    assert f"model: {checkpoint / 'model.safetensors'}" in out
    assert "windows: " in out and "stride 16 (non-overlapping), batch 8" in out
    assert "nats/token" in out and "perplexity" in out and "bits per byte" in out
    assert len(out.splitlines()) <= 8


def test_data_split_is_evaluated_with_the_datas_tokenizer(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lmcore.data.tokens import TokenData

    torch.manual_seed(0)
    lmcore.save(lmcore.build_model(SPEC), tmp_path / "m.safetensors")
    assert main(["eval", str(tmp_path / "m.safetensors"), "--data", str(tiny_data), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    data = TokenData.open(tiny_data)
    val = np.asarray(data.val)
    assert out["tokens"] == len(val) - 1 and out["source"] == f"val split of {tiny_data}"
    assert out["bytes"] == len(data.decode(val[1:]).replace(EOT, "").encode("utf-8"))


def test_eval_errors_are_one_line_with_the_fix(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lone = tmp_path / "lone"
    lone.mkdir()
    lmcore.save(_model(), lone / "model.safetensors")
    assert main(["eval", str(lone), "--text", str(checkpoint / "a.py")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmcore eval: error: no tokenizer found for") and "--tokenizer" in err
    assert len(err.splitlines()) == 1
    argv = ["eval", str(checkpoint), "--text", str(checkpoint / "a.py"), "--stride", "40"]
    assert main(argv) == 2
    assert "--stride 40: must be in 1..16" in capsys.readouterr().err
    assert main(["eval", str(checkpoint), "--text", "nope.txt"]) == 2
    assert "--text 'nope.txt' is not a file" in capsys.readouterr().err
    assert main(["eval", str(checkpoint), "--text", str(checkpoint / "a.py"), "--limit", "3"]) == 2
    assert "--limit applies to --tasks only" in capsys.readouterr().err


def test_shared_prefixes_through_the_cache_score_as_whole_sequences() -> None:
    model = _model()
    rng = random.Random(0)
    pairs: list[tuple[list[int], list[int]]] = []
    for _ in range(6):  # questions with four choices, contexts beyond the context length too
        ctx = [rng.randrange(300) for _ in range(rng.randrange(1, 24))]
        pairs += [(ctx, [rng.randrange(300) for _ in range(rng.randrange(1, 6))]) for _ in range(4)]
    pairs += [([rng.randrange(300)], [rng.randrange(300) for _ in range(16)]) for _ in range(3)]
    expected = []
    with torch.no_grad():
        for ctx, cont in pairs:
            inp = torch.tensor((ctx + cont)[-17:][:-1])
            logp = model(inp[None])[0, -len(cont) :].log_softmax(-1)
            picked = logp.gather(-1, torch.tensor(cont)[:, None])
            greedy = bool((logp.argmax(-1) == torch.tensor(cont)).all())
            expected.append((float(picked.double().sum()), greedy))
    for batch in (1, 3, 8):
        for cache in (True, False):
            got = loglikelihoods(model, pairs, batch_size=batch, cache=cache)
            assert [g for _, g in got] == [g for _, g in expected]
            assert max(abs(a - b) for (a, _), (b, _) in zip(got, expected, strict=True)) < 1e-4
    with pytest.raises(EvalError, match="request 0: its continuation of 17 tokens does not fit"):
        loglikelihoods(model, [([1], [2] * 17)])


def test_tasks_without_lm_eval_name_the_extra(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, "lmcore.eval.harness", raising=False)
    assert main(["eval", str(checkpoint), "--tasks", "hellaswag"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "lmcore eval: error: --tasks needs the 'eval' extra (lm-evaluation-harness): "
        "pip install 'lmcore-registry[eval]' (no module named 'lm_eval')"
    )
    assert len(err.splitlines()) == 1
