"""Fine-tuning from a checkpoint (`lmcore.train.finetune`): the checkpoint's spec and weights, its
tokenizer required of the data and its chat template carried into the run's checkpoints, and
chat data's masked loss, in training and in evaluation (checked against torch's ignore_index)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import lmcore
from lmcore.data.chat import prepare_chat
from lmcore.data.tokens import IGNORE, TokenData
from lmcore.errors import TrainError
from lmcore.sources import open_checkpoint
from lmcore.train.config import TrainConfig
from lmcore.train.finetune import initial_model, tokenizer_files
from lmcore.train.runs import read_run
from lmcore.train.trainer import evaluate, train
from tests.helpers.chat import chat_checkpoint, conversations, write_chats
from tests.helpers.errors import raises_naming
from tests.helpers.gguf import CHATML

pytest.importorskip("jinja2", reason="needs the 'chat' extra: pip install -e '.[chat]'")
pytestmark = pytest.mark.usefixtures("single_thread")

FAST = {"batch_size": 4, "eval_batches": 3, "eval_every": 0, "log_every": 1, "device": "cpu",
        "lr": 3e-3, "warmup": 0}  # fmt: skip


@pytest.fixture
def chat(tmp_path: Path) -> tuple[Path, Path]:
    """A chat checkpoint and chat data prepared with its tokenizer."""
    ckpt = chat_checkpoint(tmp_path)
    saved = lmcore.read_info(ckpt).tokenizer
    assert saved is not None
    chats = write_chats(tmp_path / "c.jsonl", conversations(48))
    prepare_chat(chats, tmp_path / "data", tokenizer=saved, tokenizer_from=ckpt,
                 val_fraction=0.25, context_length=32)  # fmt: skip
    return ckpt, tmp_path / "data"


def _masked_mean(model: torch.nn.Module, data: TokenData) -> float:
    """The mean loss over every kept target of the fixed val batches, by torch's own op."""
    total, kept = 0.0, 0
    with torch.no_grad():
        for x, y in data.val_batches(batch_size=4, context_length=32, num_batches=3):
            logits = model(x)
            total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(),
                                           y.reshape(-1), ignore_index=IGNORE, reduction="sum"))
            kept += int((y != IGNORE).sum())  # fmt: skip
    return total / kept


def test_fine_tuning_starts_from_the_checkpoint_and_trains_on_the_replies(
    chat: tuple[Path, Path], tmp_path: Path
) -> None:
    ckpt, data_dir = chat
    data = TokenData.open(data_dir)
    base = lmcore.load(ckpt)
    before = _masked_mean(base, data)
    result = train(ckpt, data, tmp_path / "run", TrainConfig(steps=40, **FAST), echo=None)  # type: ignore[arg-type]
    assert result.status == "done"
    run = read_run(tmp_path / "run")
    assert run["init"] == str(ckpt.resolve()) and run["spec"] == str(base.spec)  # unchanged
    assert result.first_val_loss == pytest.approx(before, rel=1e-5)  # weighed by kept targets
    assert result.val_loss is not None and result.val_loss < before - 1.0  # the replies learnt
    assert result.checkpoint is not None
    tuned = lmcore.load(result.checkpoint.model)
    assert result.val_loss == pytest.approx(_masked_mean(tuned, data), rel=1e-5)
    assert tuned.tokenizer is not None and tuned.tokenizer.chat_template == CHATML  # kept
    assert tuned.tokenizer.eos_token_id == base.tokenizer.eos_token_id
    assert lmcore.load(ckpt).state_dict().keys() == tuned.state_dict().keys()


def test_evaluate_of_unmasked_batches_is_the_mean_of_the_batch_means(tiny_data: Path) -> None:
    data = TokenData.open(tiny_data)
    torch.manual_seed(0)
    model = lmcore.build_model("vocab_size=300,context_length=16,d_model=32,num_layers=1,"
                               "num_heads=2")  # fmt: skip
    batches = data.val_batches(batch_size=2, context_length=16, num_batches=3)
    with torch.no_grad():
        means = [lmcore.model.nn.cross_entropy(model(x), y).double() for x, y in batches]
    assert evaluate(model, batches) == float(sum(means, torch.zeros((), dtype=torch.float64)) / 3)


def test_data_in_another_tokenizer_is_refused(chat: tuple[Path, Path], tiny_data: Path,
                                              tmp_path: Path) -> None:  # fmt: skip
    ckpt, _ = chat
    with raises_naming(TrainError, f"--data {tiny_data}", "was tokenised with",
                       f"not with the tokenizer stored in {ckpt}", "--tokenizer-from"):  # fmt: skip
        train(ckpt, tiny_data, tmp_path / "run", TrainConfig(steps=1, **FAST), echo=None)  # type: ignore[arg-type]
    assert not (tmp_path / "run").exists()


def test_initial_model_is_the_checkpoints_weights_and_the_files_carry_its_template(
    chat: tuple[Path, Path]
) -> None:
    ckpt, _ = chat
    info = lmcore.read_info(ckpt)
    base = lmcore.load(ckpt)
    model = initial_model(open_checkpoint(ckpt).blueprint, info,
                          device=torch.device("cpu"), dtype=torch.float32)  # fmt: skip
    for (name, a), (_, b) in zip(base.state_dict().items(), model.state_dict().items(),
                                 strict=True):  # fmt: skip
        assert torch.equal(a, b), name
    files = tokenizer_files(info)
    assert "tokenizer.json" not in files
    assert json.loads(files["tokenizer_config.json"])["chat_template"] == CHATML
    assert tokenizer_files(None) == {}


def test_bits_per_byte_of_masked_data_is_refused(chat: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, data = chat
    with raises_naming(TrainError, "--eval-bpb", "loss mask", "leave out --eval-bpb"):
        train(ckpt, data, tmp_path / "run", TrainConfig(steps=1, eval_bpb=True, **FAST),  # type: ignore[arg-type]
              echo=None)  # fmt: skip
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ --adapter: LoRA on a checkpoint


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_adapter_trains_alone_and_its_checkpoints_hold_it_with_the_bases_identity(
    chat: tuple[Path, Path], tmp_path: Path
) -> None:
    from lmcore.checkpoint import base_identity

    ckpt, data_dir = chat
    data, sha = TokenData.open(data_dir), _sha(ckpt)
    base = lmcore.load(ckpt)
    before = _masked_mean(base, data)
    cfg = TrainConfig(steps=30, adapter="lora(rank=4)", **{**FAST, "lr": 1e-2})
    result = train(ckpt, data, tmp_path / "run", cfg, echo=None)  # type: ignore[arg-type]
    assert result.status == "done" and result.checkpoint is not None
    run = read_run(tmp_path / "run")
    assert run["init"] == str(ckpt.resolve()) and run["base"] == base_identity(ckpt)
    assert run["adapter"].startswith("lora(rank=4,") and run["config"]["adapter"] == "lora(rank=4)"
    assert run["spec"] == f"{base.spec},adapter={run['adapter']}"  # canonical, the base's own
    info = lmcore.read_info(result.checkpoint.model)
    assert info.base is not None and info.base["checksum"] == base_identity(ckpt)["checksum"]
    from safetensors import safe_open

    with safe_open(str(result.checkpoint.model), "pt") as f:
        keys = list(f.keys())
    assert keys and all(".adapter.lora_" in k for k in keys)  # the adapter alone
    tuned = lmcore.load(result.checkpoint.model)  # the base, checked, with the adapter
    plain = {k: v for k, v in tuned.state_dict().items() if ".adapter." not in k}
    for name, t in base.state_dict().items():
        assert torch.equal(plain[name], t), name  # the base frozen
    assert result.first_val_loss == pytest.approx(before, rel=1e-5)  # B = 0: the base's loss
    assert result.val_loss is not None and result.val_loss < before - 0.5
    assert result.val_loss == pytest.approx(_masked_mean(tuned, data), rel=1e-5)
    assert tuned.tokenizer is not None and tuned.tokenizer.chat_template == CHATML
    assert _sha(ckpt) == sha  # the base file untouched


def test_an_adapter_run_resumes_bit_for_bit(chat: tuple[Path, Path], tmp_path: Path) -> None:
    from lmcore.train.trainer import resume

    ckpt, data_dir = chat
    cfg = TrainConfig(steps=6, adapter="lora(rank=2, alpha=4)", save_every=3, **FAST)
    whole = train(ckpt, data_dir, tmp_path / "whole", cfg, echo=None)  # type: ignore[arg-type]
    first = train(ckpt, data_dir, tmp_path / "split", cfg, echo=None, stop_after=3)  # type: ignore[arg-type]
    assert first.status == "interrupted" and first.step == 3
    again = resume(tmp_path / "split", echo=None)
    assert again.status == "done" and again.checkpoint is not None
    assert whole.checkpoint is not None
    a, b = lmcore.load(whole.checkpoint.model), lmcore.load(again.checkpoint.model)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
    assert again.val_loss == whole.val_loss


def test_an_adapter_run_refuses_to_resume_on_a_changed_base(
    chat: tuple[Path, Path], tmp_path: Path
) -> None:
    from lmcore.errors import CheckpointError
    from lmcore.train.trainer import resume

    ckpt, data_dir = chat
    cfg = TrainConfig(steps=4, adapter="lora(rank=2)", save_every=2, **FAST)
    train(ckpt, data_dir, tmp_path / "run", cfg, echo=None, stop_after=2)  # type: ignore[arg-type]
    changed = lmcore.load(ckpt)
    with torch.no_grad():
        next(changed.parameters()).add_(1.0)
    changed.save(ckpt)
    with raises_naming(CheckpointError, "is an adapter of the base checkpoint",
                       "its weights changed"):  # fmt: skip
        resume(tmp_path / "run", echo=None)


def test_adapter_is_for_a_checkpoint_and_names_a_known_one(
    chat: tuple[Path, Path], tmp_path: Path
) -> None:
    from tests.helpers.chat import CHAT_SPEC

    ckpt, data_dir = chat
    with raises_naming(TrainError, "--adapter lora(rank=8): fine-tunes a checkpoint",
                       "its key adapter=", "'SPEC, adapter=lora(rank=8)'"):  # fmt: skip
        train(CHAT_SPEC, data_dir, tmp_path / "a", TrainConfig(steps=1, adapter="lora(rank=8)",
              **FAST), echo=None)  # fmt: skip
    with raises_naming(TrainError, "--adapter lorra(rank=8): ", "lora"):
        train(ckpt, data_dir, tmp_path / "b", TrainConfig(steps=1, adapter="lorra(rank=8)",
              **FAST), echo=None)  # type: ignore[arg-type]  # fmt: skip
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
