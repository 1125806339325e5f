"""Reading prepared data: `TokenData.open` checks the files against their metadata (and refuses
files outside the data directory, metadata that does not fit its files, with advice that works),
and the batch samplers, pure functions of seed and step, split across ranks."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lmcore.data import TokenData, get_batch, step_seed
from lmcore.data.packing import document_val_batches, packed_sampler
from lmcore.data.tokens import BatchSampler, EvalBatches
from lmcore.errors import DataError
from tests.helpers.errors import raises_naming
from tests.helpers.runs import prepare_small, without_document_index


def test_open_checks_the_files_against_the_metadata(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    meta = prepare_small([corpus], out)
    data = TokenData.open(out)
    assert (
        data.vocab_size == 400 and data.eot_id == 0 and len(data.val) == meta.splits["val"].tokens
    )
    assert repr(data).startswith(f"TokenData({str(out)!r}: train ")
    assert isinstance(data.train, np.memmap) and not data.train.flags.writeable
    with pytest.raises(DataError, match=re.escape("no split 'valid' (did you mean 'val'?)")):
        data.split("valid")
    with raises_naming(DataError, f"data directory {str(tmp_path / 'nope')!r} does not exist"):
        TokenData.open(tmp_path / "nope")
    with open(out / "train.bin", "ab") as f:
        f.write(b"\0")  # one byte too many
    train = meta.splits["train"].tokens
    with raises_naming(DataError, f"{out / 'train.bin'} holds {2 * train + 1:,} bytes",
                       f"{train:,} tokens × 2 bytes = {2 * train:,}",
                       "do not belong together"):  # fmt: skip
        TokenData.open(out)
    raw = json.loads((out / "meta.json").read_text())
    raw["vocab_size"] = "many"
    (out / "meta.json").write_text(json.dumps(raw))
    with raises_naming(DataError, f"{out / 'meta.json'}", "vocab_size should be an integer",
                       "found 'many'"):  # fmt: skip
        TokenData.open(out)


def test_check_context_and_vocabulary(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    meta = prepare_small([corpus], out)
    data = TokenData.open(out)
    val = meta.splits["val"].tokens
    data.check(context_length=val - 1, vocab_size=400)
    with raises_naming(DataError, f"val.bin of {out} holds {val:,} tokens",
                       f"context_length + 1 = {val + 1:,}",
                       "use a shorter context_length"):  # fmt: skip
        data.check(context_length=val)
    with raises_naming(DataError, "vocab_size=300", "smaller than the data's 400 tokens"):
        data.check(context_length=8, vocab_size=300)


def counting(n: int) -> np.ndarray:
    """Ids equal to their position (mod 2**16), so a window shows where it came from."""
    return (np.arange(n) % 2**16).astype(np.uint16)


def test_get_batch_shapes_bounds_and_shift() -> None:
    data = counting(100)
    g = torch.Generator().manual_seed(0)
    starts: set[int] = set()
    for _ in range(300):
        x, y = get_batch(data, 8, 10, "cpu", generator=g)
        assert x.shape == y.shape == (8, 10) and x.dtype == y.dtype == torch.int64
        assert torch.equal(y, x + 1)  # targets are the inputs shifted by one
        assert torch.equal(x, x[:, :1] + torch.arange(10))  # contiguous windows
        assert int(x[:, 0].min()) >= 0 and int(y[:, -1].max()) <= 99  # inside the data
        starts.update(x[:, 0].tolist())
    assert starts == set(range(90))  # every start that fits, and only those
    x, y = get_batch(counting(11), 4, 10)  # exactly one window fits
    assert x[:, 0].tolist() == [0] * 4
    with raises_naming(DataError, "holds 10 tokens", "context_length + 1 = 11"):
        get_batch(counting(10), 4, 10)


def test_get_batch_is_deterministic_per_seed() -> None:
    data = counting(10_000)

    def draw(seed: int) -> torch.Tensor:
        return get_batch(data, 16, 32, generator=torch.Generator().manual_seed(seed))[0]

    assert torch.equal(draw(1), draw(1)) and not torch.equal(draw(1), draw(2))
    torch.manual_seed(5)
    a = get_batch(data, 4, 8)[0]
    torch.manual_seed(5)
    assert torch.equal(a, get_batch(data, 4, 8)[0])  # no generator: torch's global one


def test_sampler_batches_are_pure_functions_of_seed_and_step() -> None:
    data = counting(5_000)
    s = BatchSampler(data, batch_size=8, context_length=16, seed=3)
    x3, _ = s.batch(3)
    fresh = BatchSampler(data, batch_size=8, context_length=16, seed=3)
    assert torch.equal(fresh.batch(3)[0], x3)  # no state: resuming needs only the step
    it = s.iterate(start=3)
    assert torch.equal(next(it)[0], x3) and torch.equal(next(it)[0], s.batch(4)[0])
    assert not torch.equal(s.batch(4)[0], x3)
    other = BatchSampler(data, batch_size=8, context_length=16, seed=4)
    assert not torch.equal(other.batch(3)[0], x3)
    # Batch `step` is CS336's get_batch with the generator seeded by step_seed(seed, step).
    g = torch.Generator().manual_seed(step_seed(3, 3))
    assert torch.equal(get_batch(data, 8, 16, generator=g)[0], x3)
    assert step_seed(0, 1) != step_seed(1, 0) and 0 <= step_seed(2**40, 2**40) < 2**63


def test_rank_streams_are_disjoint_slices_of_the_global_batch() -> None:
    data = counting(5_000)
    whole = BatchSampler(data, batch_size=8, context_length=16, seed=7)
    ranks = [
        BatchSampler(data, batch_size=8, context_length=16, seed=7, rank=r, world_size=4)
        for r in range(4)
    ]
    for step in (0, 1, 99):
        parts = [r.batch(step) for r in ranks]
        assert all(p[0].shape == (2, 16) for p in parts)
        assert torch.equal(torch.cat([p[0] for p in parts]), whole.batch(step)[0])
        assert torch.equal(torch.cat([p[1] for p in parts]), whole.batch(step)[1])
    with raises_naming(DataError, "batch_size 6", "not divisible by world_size 4", "e.g. 8"):
        BatchSampler(data, batch_size=6, context_length=16, world_size=4)
    with pytest.raises(DataError, match=re.escape("rank 4 is not in 0..world_size-1")):
        BatchSampler(data, batch_size=8, context_length=16, rank=4, world_size=4)
    with pytest.raises(DataError, match=re.escape("seed and step must be ≥ 0, got seed=-1")):
        BatchSampler(data, batch_size=8, context_length=16, seed=-1)


def test_eval_batches_are_fixed_and_cover_the_split() -> None:
    data = counting(1_000)
    ev = EvalBatches(data, batch_size=4, context_length=10)
    # By default: as many non-overlapping windows as fit (99), in whole batches of 4.
    assert len(ev) == 24 and ev.predicted_tokens == 96 * 10
    starts = np.concatenate([ev.starts(i) for i in range(len(ev))])
    assert starts[0] == 0 and starts[-1] == 1_000 - 11  # first token to the last window
    assert np.diff(starts).min() >= 10  # no window overlaps the next
    first = [x.clone() for x, _ in ev]
    assert all(torch.equal(a, x) for a, (x, _) in zip(first, ev, strict=True))  # same each time
    for x, y in ev:
        assert torch.equal(y, x + 1) and int(y.max()) <= 999
    few = EvalBatches(data, batch_size=4, context_length=10, num_batches=2)
    assert len(few) == 2 and few.starts(1)[-1] == 989
    halves = [
        EvalBatches(data, batch_size=4, context_length=10, rank=r, world_size=2) for r in (0, 1)
    ]
    assert torch.equal(torch.cat([h[3][0] for h in halves]), ev[3][0])
    with pytest.raises(IndexError):
        ev.starts(len(ev))
    tiny = EvalBatches(counting(12), batch_size=4, context_length=10)
    assert len(tiny) == 1  # windows overlap when fewer than a batch fit side by side


def test_token_data_samplers(corpus: Path, tmp_path: Path) -> None:
    prepare_small([corpus], tmp_path / "out")
    data = TokenData.open(tmp_path / "out")
    x, y = data.sampler("val", batch_size=4, context_length=8, seed=1).batch(0)
    assert x.shape == (4, 8) and torch.equal(x[:, 1:], y[:, :-1])
    val = torch.from_numpy(data.val.astype(np.int64))
    for row in x:  # each row is a window of val.bin
        assert any(torch.equal(val[s : s + 8], row) for s in range(len(val) - 8))
    batches = data.val_batches(batch_size=2, context_length=8, num_batches=3)
    assert len(batches) == 3
    with pytest.raises(DataError, match=re.escape(f"val.bin of {tmp_path / 'out'} holds")):
        data.sampler("val", batch_size=1, context_length=len(data.val))
    assert isinstance(data.decode(x[0]), str)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_batches_on_cuda() -> None:
    x, y = BatchSampler(counting(1_000), batch_size=4, context_length=8, device="cuda").batch(0)
    assert x.device.type == y.device.type == "cuda" and torch.equal(y.cpu(), x.cpu() + 1)


def test_ranks_draw_disjoint_rows_of_the_one_process_batch(tiny_data: Path) -> None:
    data = TokenData.open(tiny_data)
    one = data.sampler("train", batch_size=8, context_length=16, seed=3)
    ranks = [data.sampler("train", batch_size=8, context_length=16, seed=3, rank=r,
                          world_size=2) for r in (0, 1)]  # fmt: skip
    for step in (0, 5):
        x, _ = one.batch(step)
        parts = [s.batch(step)[0] for s in ranks]
        assert torch.equal(torch.cat(parts), x)
        assert not torch.equal(parts[0], parts[1])


def copy_with_meta(data: Path, out: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of prepared data whose meta.json `change` edits."""
    out.mkdir()
    for p in data.iterdir():
        (out / p.name).write_bytes(p.read_bytes())
    meta = json.loads((out / "meta.json").read_text())
    change(meta)
    (out / "meta.json").write_text(json.dumps(meta))
    return out


FIX = "run: lmcore data prepare SOURCE... --out {} --force"


@pytest.mark.parametrize("how", ["absolute", "relative", "symlink"])
def test_split_files_outside_the_directory_are_refused(
    tiny_data: Path, tmp_path: Path, how: str
) -> None:
    # The probe: a meta.json whose split file was an absolute path outside the data directory
    # was trained on.
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes((tiny_data / "train.bin").read_bytes())
    name = {"absolute": str(outside), "relative": "../elsewhere.bin", "symlink": "link.bin"}[how]

    def point(meta: dict) -> None:
        meta["splits"]["train"]["file"] = name

    out = copy_with_meta(tiny_data, tmp_path / "d", point)
    if how == "symlink":
        (out / "link.bin").symlink_to(outside)
    with raises_naming(DataError, f"{out / 'meta.json'}: splits.train.file is {name!r}",
                       f"resolves to {str(outside)!r}", f"outside the data directory {str(out)!r}",
                       FIX.format(out)):  # fmt: skip
        TokenData.open(out)


def test_metadata_that_does_not_fit_its_tokenizer_is_named(tiny_data: Path, tmp_path: Path) -> None:
    # The probe: meta vocab 100 with a 300-token tokenizer trained and reported "vocabulary 100";
    # eot_id ≥ vocab_size was said "not to fit dtype uint16".
    real = TokenData.open(tiny_data).vocab_size

    def small(meta: dict) -> None:
        meta["vocab_size"] = 100

    out = copy_with_meta(tiny_data, tmp_path / "a", small)
    with raises_naming(DataError, f"{out / 'meta.json'} says vocab_size 100",
                       f"tokenizer.json has {real} tokens", "do not belong together",
                       FIX.format(out)):  # fmt: skip
        TokenData.open(out)

    def eot(meta: dict) -> None:
        meta["eot_id"] = meta["vocab_size"]

    out = copy_with_meta(tiny_data, tmp_path / "b", eot)
    with raises_naming(DataError, f"{out / 'meta.json'}: eot_id {real}", "not an id of the vocabulary",
                       f"ids 0 to {real - 1}", FIX.format(out)):  # fmt: skip
        TokenData.open(out)


def test_a_model_vocabulary_too_small_for_the_data_gets_advice_that_works(tiny_data: Path) -> None:
    # The probe: a spec vocab of 200 was told to prepare the data with --vocab-size 200, which
    # prepare rejects (it needs at least 257).
    tokens = TokenData.open(tiny_data)
    with raises_naming(DataError, f"use vocab_size={tokens.vocab_size} in the spec",
                       f'"tinystories, vocab_size={tokens.vocab_size}"',
                       "a prepared vocabulary has at least 257 tokens") as e:  # fmt: skip
        tokens.check(context_length=8, vocab_size=200)
    assert "--vocab-size 200" not in str(e.value)  # prepare refuses it
    with pytest.raises(DataError, match=r"or prepare the data with --vocab-size 260$"):
        tokens.check(context_length=8, vocab_size=260)


# ------------------------------------------------------------------------------ document index


def test_a_directory_from_before_the_document_index_loads_and_says_it_has_none(
    tiny_data: Path, tmp_path: Path
) -> None:
    old = without_document_index(tiny_data, tmp_path / "old")
    data = TokenData.open(old)
    assert data.documents is None and not data.meta.has_documents
    new = TokenData.open(tiny_data)
    assert np.array_equal(data.train, new.train)  # the tokens, batches as before
    x, _ = data.sampler(batch_size=4, context_length=16).batch(3)
    assert torch.equal(x, new.sampler(batch_size=4, context_length=16).batch(3)[0])
    fix = f"lmcore data prepare SOURCE... --out {old} --force"
    for call in (
        lambda: data.document_starts("train", "--doc-mask"),
        lambda: packed_sampler(data, batch_size=4, context_length=16),
        lambda: document_val_batches(data, batch_size=4, context_length=16),
    ):
        with raises_naming(DataError, str(old), "has none", fix) as e:
            call()
        assert "\n" not in str(e.value)
    with raises_naming(DataError, "--doc-mask needs the document index"):
        data.document_starts("train", "--doc-mask")


@pytest.mark.parametrize(
    "damage, facts",
    [
        (lambda f: f.write_bytes(f.read_bytes()[:-8]), ["holds", "document starts × 8 bytes"]),
        (lambda f: f.unlink(), ["is missing"]),
        (lambda f: f.write_bytes(np.array([0, 5, 5], "<i8").tobytes() + f.read_bytes()[24:]),
         ["must begin at 0, rise"]),
        (lambda f: f.write_bytes(np.array([1], "<i8").tobytes() + f.read_bytes()[8:]),
         ["must begin at 0"]),
    ],
)
def test_a_damaged_document_index_is_refused_by_name(
    tiny_data: Path, tmp_path: Path, damage: Callable[[Path], Any], facts: list[str]
) -> None:
    import shutil

    copy = tmp_path / "data"
    shutil.copytree(tiny_data, copy)
    damage(copy / "train.starts.bin")
    with raises_naming(DataError, "train.starts.bin", *facts, "--force"):
        TokenData.open(copy)
