"""The trainer with documents: `--pack` (rows packed with whole documents) and `--doc-mask`
(the model's `documents=`, targets that cross a document left out), on the command line too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import Tensor

from lmcore.data import TokenData
from lmcore.data.packing import (
    document_sampler,
    document_val_batches,
    packed_sampler,
    packing_of,
)
from lmcore.errors import DataError, TrainError
from lmcore.model.transformer import TransformerLM
from lmcore.train.config import RESUMABLE, TrainConfig
from lmcore.train.runs import RUN_FILE, latest_checkpoint, read_metrics
from lmcore.train.trainer import resume, train
from tests.helpers.errors import raises_naming
from tests.helpers.models import TINY_SPEC
from tests.helpers.runs import one_line_error, without_document_index

pytestmark = pytest.mark.usefixtures("single_thread")

FAST = {"batch_size": 8, "eval_batches": 2, "eval_every": 5, "log_every": 1, "device": "cpu"}


def config(**kw: object) -> TrainConfig:
    return TrainConfig(**{**FAST, **kw})  # type: ignore[arg-type]


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[bool, Tensor | None]]]:
    """A forward that records the documents it was given, then runs with them. Yields
    (training, documents) per call."""
    calls: list[tuple[bool, Tensor | None]] = []
    forward = TransformerLM.forward

    def recording(self: TransformerLM, ids: Tensor, *args: Any, documents: Tensor | None = None,
                  **kw: Any) -> Tensor:  # fmt: skip
        calls.append((self.training, documents))
        return forward(self, ids, *args, documents=documents, **kw)

    monkeypatch.setattr(TransformerLM, "forward", recording)
    yield calls


@pytest.mark.parametrize("pack", [False, True])
def test_doc_mask_gives_the_model_each_batch_s_documents(
    tiny_data: Path, tmp_path: Path, seen: list[tuple[bool, Tensor | None]], pack: bool
) -> None:
    cfg = config(steps=3, doc_mask=True, pack=pack, micro_batch=4, eval_every=0)
    result = train(TINY_SPEC, tiny_data, tmp_path / "run", cfg, echo=None)
    assert result.status == "done"
    data = TokenData.open(tiny_data)
    sample = packed_sampler if pack else document_sampler
    sampler = sample(data, batch_size=8, context_length=16, seed=0, mask_boundaries=True)
    trained = [d for training, d in seen if training]
    assert len(trained) == 3 * 2  # two micro-batches a step, each with its rows' documents
    for step in range(3):
        _, _, documents = sampler.batch(step)
        got = torch.cat([trained[2 * step], trained[2 * step + 1]])  # type: ignore[list-item]
        assert torch.equal(got, documents)
    evals = [d for training, d in seen if not training]
    val = document_val_batches(data, batch_size=8, context_length=16, num_batches=2,
                                    mask_boundaries=True)  # fmt: skip
    assert len(evals) == 2 * 2  # before the first step and after the last
    assert all(torch.equal(d, val[i % 2][2]) for i, d in enumerate(evals))  # type: ignore[arg-type]
    info = json.loads((tmp_path / "run" / RUN_FILE).read_text())
    assert info["config"]["doc_mask"] is True and info["config"]["pack"] is pack


def test_pack_alone_trains_one_stream_of_packed_rows(
    tiny_data: Path, tmp_path: Path, seen: list[tuple[bool, Tensor | None]]
) -> None:
    lines: list[str] = []
    result = train(TINY_SPEC, tiny_data, tmp_path / "run", config(steps=2, pack=True),
                   echo=lines.append)  # fmt: skip
    assert result.status == "done"
    assert all(d is None for _, d in seen)  # no documents= without --doc-mask
    packing = packing_of(TokenData.open(tiny_data), "train", 16)
    assert packing.summary() in lines
    assert f"{packing.efficiency:.2%} document tokens, the rest padding" in packing.summary()


def test_a_packed_run_resumes_bit_for_bit(
    tiny_data: Path, tmp_path: Path, seen: list[tuple[bool, Tensor | None]]
) -> None:
    cfg = config(steps=6, pack=True, doc_mask=True, lr=3e-3)
    train(TINY_SPEC, tiny_data, tmp_path / "whole", cfg, echo=None)
    train(TINY_SPEC, tiny_data, tmp_path / "split", cfg, echo=None, stop_after=3)
    assert resume(tmp_path / "split", echo=None).status == "done"
    a, b = latest_checkpoint(tmp_path / "whole"), latest_checkpoint(tmp_path / "split")
    assert a is not None and b is not None
    ta, tb = load_file(str(a.path / "model.safetensors")), load_file(str(b.path / "model.safetensors"))
    assert all(torch.equal(ta[k], tb[k]) for k in ta)

    def losses(run: str) -> list[Any]:
        return [r.get("loss", r.get("val_loss")) for r in read_metrics(tmp_path / run)
                if r["kind"] in ("train", "eval")]  # fmt: skip

    assert losses("whole") == losses("split")


def test_pack_and_doc_mask_are_fixed_for_a_run(tiny_data: Path, tmp_path: Path) -> None:
    assert "pack" not in RESUMABLE and "doc_mask" not in RESUMABLE
    run = tmp_path / "run"
    train(TINY_SPEC, tiny_data, run, config(steps=2), echo=None, stop_after=1)
    for change in ({"pack": True}, {"doc_mask": True}):
        with raises_naming(TrainError, "cannot change when resuming"):
            resume(run, echo=None, **change)
    assert TrainConfig(pack=True, doc_mask=True).cli_args() == ["--pack", "--doc-mask"]


def test_old_data_without_an_index_is_refused_by_name(tiny_data: Path, tmp_path: Path) -> None:
    old = without_document_index(tiny_data, tmp_path / "old")
    for option, change in (("--pack", {"pack": True}), ("--doc-mask", {"doc_mask": True})):
        with raises_naming(DataError, f"{option} needs the document index", str(old),
                           f"lmcore data prepare SOURCE... --out {old} --force"):  # fmt: skip
            train(TINY_SPEC, old, tmp_path / "run", config(steps=1, **change), echo=None)
        assert not (tmp_path / "run").exists()
    # a run of the old data trains as before
    assert train(TINY_SPEC, old, tmp_path / "run", config(steps=1), echo=None).status == "done"


@pytest.mark.parametrize("flag", ["--pack", "--doc-mask"])
def test_the_command_line_refuses_them_on_old_data_in_one_line(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    old = without_document_index(tiny_data, tmp_path / "old")
    err = one_line_error(capsys, ["train", TINY_SPEC, "--data", str(old), "--out",
                                  str(tmp_path / "run"), "--steps", "1", flag])  # fmt: skip
    assert f"{flag} needs the document index" in err and f"--out {old} --force" in err
    err = one_line_error(capsys, ["train", TINY_SPEC, "--data", str(tiny_data), f"{flag}=yes"])
    assert f"argument {flag}: ignored explicit argument 'yes'" in err  # a switch takes no value


# ------------------------------------------------------------------------------ end to end


@pytest.mark.parametrize("pack", [False, True])
def test_doc_mask_trains_end_to_end(tiny_data: Path, tmp_path: Path, pack: bool) -> None:
    result = train(TINY_SPEC, tiny_data, tmp_path / "run",
                   config(steps=20, lr=3e-3, doc_mask=True, pack=pack), echo=None)  # fmt: skip
    assert result.status == "done"
    assert result.val_loss is not None and result.val_loss < result.first_val_loss  # type: ignore[operator]


def test_pack_trains_end_to_end(tiny_data: Path, tmp_path: Path) -> None:
    result = train(TINY_SPEC, tiny_data, tmp_path / "run", config(steps=20, lr=3e-3, pack=True),
                   echo=None)  # fmt: skip
    assert result.status == "done"
    assert result.val_loss is not None and result.val_loss < result.first_val_loss  # type: ignore[operator]


def test_doc_mask_refuses_a_kernel_that_cannot_keep_documents_apart(
    tiny_data: Path, tmp_path: Path
) -> None:
    from lmcore import Component, scoped_registry
    from lmcore.errors import TrainError
    from lmcore.model.nn import scaled_dot_product_attention

    class Plain(torch.nn.Module):  # takes no documents
        def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool) -> Tensor:
            return scaled_dot_product_attention(q, k, v, causal=causal)

    with scoped_registry() as registry:
        registry.add(Component(kind="attn", name="plain", build=Plain), name="plain")
        with pytest.raises(TrainError, match=r"--doc-mask: attn 'plain' does not declare "
                           r"'documents' .*use one that does: chunked, sdpa"):  # fmt: skip
            train(f"{TINY_SPEC}, attn=plain", tiny_data, tmp_path / "run",
                  config(steps=1, doc_mask=True), echo=None)  # fmt: skip
    assert not (tmp_path / "run").exists()
