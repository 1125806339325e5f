"""Data, training, evaluation, the command line and the benchmarks: texts, tokenizers, runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest
import torch

from tests.helpers.models import TINY_SPEC

# ---------------------------------------------------------------------------------------------
# Data, training, evaluation, the command line and the benchmarks
# ---------------------------------------------------------------------------------------------


if TYPE_CHECKING:
    import torch
    from hypothesis.strategies import SearchStrategy
    from tokenizers import Tokenizer

    from lmcore.data.meta import DataMeta
    from lmcore.model.transformer import TransformerLM
    from lmcore.train.config import TrainConfig
    from lmcore.train.sweep import SweepResult

PNG = b"\x89PNG\r\n\x1a\n"  # the first bytes of every PNG file (a loss curve, a sweep's plot)

# Text for small tokenizers: words, code, whitespace runs and non-Latin scripts.
SAMPLE = (
    "Once upon a time there was a little robot. It liked to count: 1, 22, 333.\n\n"
    "def f(x):\n    return x * 2  # double\r\n\tindent\n"
    "Ünïcödé, 日本語のテキスト, Ελληνικά, emoji 🙂🚀 and  double  spaces.\n"
)


def write(path: Path, text: str | bytes) -> Path:
    """Write `text` (UTF-8 if a str) to `path`, creating its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def prepare_small(sources: list[Path], out: Path, **kwargs: object) -> DataMeta:
    """`lmcore.data.prepare` with a small vocabulary (400 unless given) and no progress bars."""
    from lmcore.data.preparing import prepare

    kwargs.setdefault("vocab_size", 400)
    return prepare(sources, out, progress=False, **kwargs).meta  # type: ignore[arg-type]


def byte_level_bpe(texts: list[str], vocab_size: int) -> Tokenizer:
    """A GPT-2-style byte-level BPE trained on `texts`, <|endoftext|> its first id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from lmcore.data import EOT

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


# The evaluation tests' model and text (`lmcore eval --text`, the windows, the scoring).
EVAL_SPEC = "vocab_size=300, context_length=16, d_model=32, num_layers=2, num_heads=4, d_ff=64"
EVAL_TEXT = "def größe(x):\n    return x * 2  # ünïcode, 日本語\n\nclass Stack:\n    pass\n"


def eval_tokenizer() -> Tokenizer:
    return byte_level_bpe([EVAL_TEXT] * 20, 300)


def eval_model(extra: str = "") -> TransformerLM:
    """The random tiny model of EVAL_SPEC (with `extra` items added), seeded, in eval mode."""
    import torch

    import lmcore

    torch.manual_seed(0)
    return lmcore.build_model(f"{EVAL_SPEC}, {extra}" if extra else EVAL_SPEC).eval()


def write_eval_checkpoint(root: Path) -> Path:
    """`root` holding the random tiny model (seed 0) with a byte-level BPE beside it, and two
    text files, a.py and b.py."""
    import torch

    import lmcore

    torch.manual_seed(0)
    lmcore.save(lmcore.build_model(EVAL_SPEC), root / "model.safetensors")
    eval_tokenizer().save(str(root / "tokenizer.json"))
    (root / "a.py").write_text(EVAL_TEXT * 3, encoding="utf-8")
    (root / "b.py").write_text("x = 1\n" * 7 + EVAL_TEXT, encoding="utf-8")
    return root


def latest_weights(run: Path) -> dict[str, torch.Tensor]:
    """The model tensors of a run's newest checkpoint."""
    from safetensors.torch import load_file

    from lmcore.train.runs import latest_checkpoint

    ckpt = latest_checkpoint(run)
    assert ckpt is not None
    return load_file(str(ckpt.model))


def torchrun(*args: str | os.PathLike[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`torchrun --nproc-per-node 2 ARGS` (as `python -m torch.distributed.run`), CPU only."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--standalone", *map(str, args)]  # fmt: skip
    with subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:  # fmt: skip
        try:
            out, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.terminate()  # torchrun stops its workers (they run in sessions of their own)
            out, err = proc.communicate()
            pytest.fail(f"torchrun timed out: {' '.join(cmd)}\n{err[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def sweep_config() -> TrainConfig:
    """The sweeps' training budget: 20 steps of batch 8, evaluated at 0, 10 and 20."""
    from lmcore.train.config import TrainConfig

    return TrainConfig(steps=20, batch_size=8, eval_every=10, eval_batches=2, device="cpu",
                       lr=3e-3)  # fmt: skip


def sweep_val_losses(result: SweepResult) -> dict[str, list[float]]:
    """Every finished run's validation losses, evaluation by evaluation, by run directory."""
    from lmcore.train.runs import read_metrics

    return {
        Path(r.run).name: [m["val_loss"] for m in read_metrics(r.run) if m["kind"] == "eval"]
        for r in result.rows
        if r.state == "done"
    }


def interrupted_sweep(
    data: Path, out: Path, changes: list[str], monkeypatch: pytest.MonkeyPatch
) -> SweepResult:
    """The sweep of TINY_SPEC and `changes` started here and stopped (as by Ctrl-C) at step 7
    of its first run."""
    from lmcore.train import trainer
    from lmcore.train.sweep import sweep

    real = trainer.train
    monkeypatch.setattr(trainer, "train", lambda *a, **kw: real(*a, **{**kw, "stop_after": 7}))
    first = sweep(TINY_SPEC, changes, data, out, sweep_config(), echo=None)
    assert first.interrupted == "stop_after" and first.rows[0].step == 7
    monkeypatch.setattr(trainer, "train", real)
    return first


# What the command-line tests save with `lmcore build --save` (tests/cli/conftest.py's checkpoint).
CHECKPOINT_SPEC = "cs336-tiny, pos=nope"

# The hostile probe's model: small enough to save, describe and generate from in milliseconds.
PROBE_SPEC = "vocab_size=97, context_length=16, d_model=32, num_layers=1, num_heads=2, d_ff=64"


def disk_full_after(monkeypatch: pytest.MonkeyPatch, writes: int) -> None:
    """safetensors' writes fail with ENOSPC after `writes` good ones, as on a full disk."""
    from safetensors import SafetensorError

    import lmcore.model.saving as saving

    real, done = saving.save_file, [0]

    def save_file(*args: object, **kwargs: object) -> None:
        done[0] += 1
        if done[0] > writes:
            raise SafetensorError(
                "Error while serializing: I/O error: No space left on device (os error 28)"
            )
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(saving, "save_file", save_file)


def mib(path: Path) -> str:
    """A file's size as the command line prints it."""
    return f"{path.stat().st_size / 2**20:.2f} MiB"


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/NAME.py, imported as the module `NAME_benchmark`."""
    import importlib.util

    script = Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def unicode_text() -> SearchStrategy[str]:
    """Hypothesis: any text of up to 200 characters a file can hold (no lone surrogates)."""
    from hypothesis import strategies as st

    return st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=200)


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """`lmcore ARGV` exits 2 with one line on stderr, `lmcore COMMAND: error: ...`: that line."""
    from lmcore.cli.main import main

    code = main(argv)
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.err.startswith(f"lmcore {argv[0]}: error: ")
    assert captured.err.count("\n") == 1, captured.err
    return captured.err


def pruned_on_first_read(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The first checkpoint read is removed as it is read, the run having saved the next step
    (`step-000011` beside it, as `lmcore train --keep 1` does); the reads, in order, are
    returned. Later reads are real."""
    import shutil

    import lmcore.checkpoint

    real, calls = lmcore.checkpoint.read_tensors, []

    def pruned_meanwhile(path: Path, device: torch.device) -> dict[str, torch.Tensor]:
        calls.append(path)
        if len(calls) == 1:  # the run saves step 11, then removes step 10
            shutil.copytree(path.parent, path.parent.with_name("step-000011"))
            shutil.rmtree(path.parent)
            raise FileNotFoundError(f"No such file or directory: {path}")  # as safetensors says
        return real(path, device)

    monkeypatch.setattr(lmcore.checkpoint, "read_tensors", pruned_meanwhile)
    return calls


def without_document_index(data: Path, out: Path) -> Path:
    """A copy of the prepared directory `data` at `out` as lmcore wrote it before the document
    index: no *.starts.bin, and no mention of them in meta.json."""
    import json
    import shutil

    shutil.copytree(data, out)
    for index in out.glob("*.starts.bin"):
        index.unlink()
    meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    meta.pop("starts_rule")
    for split in meta["splits"].values():
        del split["starts_file"], split["starts"]
    (out / "meta.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return out
