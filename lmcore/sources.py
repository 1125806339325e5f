"""Where models live: what a command's model argument may be, opened once and passed on.

    src = open_model("runs/quickstart", directories=True)  # a spec, a checkpoint, a HF config
    src.kind, src.path, src.info        # "checkpoint", its newest model.safetensors, its header
    src.blueprint                       # resolved once: everything downstream takes it
    model = src.model(device="cpu")     # the checkpoint's weights (a spec's: fresh ones)
    search = src.tokenizer_search()     # where its tokenizer.json is, and where it looked
    model = lmcore.load("runs/quickstart")  # open_checkpoint(path).model()

A source is one of

- a spec string (`"tinystories, pos=nope"`): fresh weights, no tokenizer;
- a checkpoint: a model file (`.safetensors`), or, where a command takes directories
  (`directories=True`: generate, chat, eval, `lmcore.load`), a checkpoint directory holding
  `model.safetensors` or a run directory of `lmcore train` (its newest checkpoint); build,
  describe, run and train take the file;
- a Hugging Face model directory or its config.json: the architecture its config gives (the
  weights come with `lmcore convert --from-hf`).

An argument names a checkpoint rather than spelling a spec when it ends in `.safetensors` or holds
a path separator and no `=` (`is_checkpoint_path`). What a directory may be, and the error for one
that is none of these, is `lmcore.runfiles.find_checkpoint`'s; a file that is no checkpoint is
refused by `lmcore.checkpoint.read_info`, a spec by `lmcore.resolve`. `locate` says what an
argument names without reading anything; `Location.open` reads and resolves it.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

from lmcore.blueprint import Blueprint, resolve
from lmcore.checkpoint import CheckpointInfo, build_from_checkpoint, read_info, resolve_checkpoint
from lmcore.model.saving import SUFFIX
from lmcore.model.transformer import TransformerLM, build_model
from lmcore.runfiles import TokenizerSearch, find_checkpoint, find_tokenizer

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer

    from lmcore.errors import LmcoreError
    from lmcore.registry import Registry
    from lmcore.spec import ModelSpec
    from lmcore.tokenizer import SavedTokenizer

__all__ = [
    "Kind",
    "Location",
    "Source",
    "could_be_path",
    "is_checkpoint_path",
    "load",
    "locate",
    "open_checkpoint",
    "open_model",
    "read_tokenizer",
    "source_of",
]

Kind = Literal["spec", "checkpoint", "hf"]


@dataclass(frozen=True)
class Source:
    """A model to build: its blueprint, resolved once, and where it came from. `info` is the
    checkpoint's header when it is one (`kind == "checkpoint"`); `path` its model file, or a
    Hugging Face directory's config.json."""

    kind: Kind
    blueprint: Blueprint
    info: CheckpointInfo | None = None
    path: Path | None = None

    def model(
        self,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        max_bytes: int | None = None,
        *,
        verify: bool = True,
        nonfinite: str = "warn",
    ) -> TransformerLM:
        """The model: a checkpoint's with its weights (`build_from_checkpoint`; `dtype` defaults
        to the file's, `verify` and `nonfinite` as `load`'s); any other built with fresh weights
        from torch's global generator (seed it first) in `dtype` (default float32)."""
        if self.info is None:
            return build_model(self.blueprint, device, dtype, max_bytes=max_bytes)
        return build_from_checkpoint(
            self.info, self.blueprint, device, dtype, max_bytes, verify=verify, nonfinite=nonfinite
        )

    @property
    def saved_tokenizer(self) -> SavedTokenizer | None:
        """The tokenizer saved in the checkpoint, when it has one."""
        return None if self.info is None else self.info.tokenizer

    def tokenizer_search(self) -> TokenizerSearch:
        """Where a checkpoint's tokenizer.json is: the one its metadata names, beside it, up to
        its run directory, in the run's data (`lmcore.runfiles.find_tokenizer`). A spec or a
        Hugging Face config has none to look for."""
        if self.info is None:
            return TokenizerSearch(None, ())
        return find_tokenizer(self.info.path, self.info.metadata)


@dataclass(frozen=True)
class Location:
    """What a model argument names, before anything is read: its kind and, for a checkpoint,
    the model file (found, for a directory), for a Hugging Face directory its config.json."""

    text: str
    kind: Kind
    path: Path | None = None

    def open(self, registry: Registry | None = None) -> Source:
        """Read and resolve it: the checkpoint's header and its spec with the providers that
        saved it (`resolve_checkpoint`), the spec a Hugging Face config gives, or the spec."""
        if self.kind == "checkpoint":
            return open_checkpoint(self.path or self.text, find=False, registry=registry)
        if self.kind == "hf":
            from lmcore.hf.convert import hf_reading  # Hugging Face's tables, for its sources only

            return Source("hf", resolve(hf_reading(self.text).spec, registry), path=self.path)
        return Source("spec", resolve(self.text, registry))


def is_checkpoint_path(text: str) -> bool:
    """Whether a command-line argument names a checkpoint rather than spelling a spec: it ends in
    `.safetensors`, or it holds a path separator and no `=` (a spec holds a `/` only inside a
    quoted value, which needs a `key=`)."""
    return text.endswith(SUFFIX) or (("/" in text or os.sep in text) and "=" not in text)


# The longest file name and path the system takes (Linux's); a longer string is no path.
NAME_MAX: Final = 255
PATH_MAX: Final = 4096


def could_be_path(text: str) -> bool:
    """Whether `text` could name a file at all: no NUL, no name of it over `NAME_MAX` bytes,
    not over `PATH_MAX` in all. A spec string (a canonical one runs to hundreds of bytes) that
    cannot be a path is never looked up as one."""
    if "\0" in text:
        return False
    raw = os.fsencode(text)
    if len(raw) >= PATH_MAX:
        return False
    return all(len(name) <= NAME_MAX for name in raw.split(b"/"))


def _is_dir(p: Path) -> bool:
    """`p.is_dir()`, False where the system says the name is too long (a limit below ours)."""
    try:
        return p.is_dir()
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            return False
        raise


def locate(text: str, *, directories: bool = False) -> Location:
    """What the model argument `text` names (see the module's docstring). `directories`: a
    directory is a checkpoint or run directory (`find_checkpoint` finds its model file, or says
    why there is none), and any path a checkpoint; else a directory (or `.json` file) holding a
    Hugging Face config is that architecture."""
    p = Path(text)
    is_dir = could_be_path(text) and _is_dir(p)
    if directories and (is_dir or is_checkpoint_path(text)):
        return Location(text, "checkpoint", find_checkpoint(p))
    if (text.endswith(".json") and could_be_path(text)) or is_dir:
        from lmcore.hf.convert import config_path  # Hugging Face's tables, for its sources only

        config = config_path(text)
        if config is not None:
            return Location(text, "hf", config)
    if is_checkpoint_path(text):
        return Location(text, "checkpoint", p)
    return Location(text, "spec")


def open_model(text: str, *, directories: bool = False, registry: Registry | None = None) -> Source:
    """The model a command's SPEC|CHECKPOINT argument names, read and resolved:
    `locate(text, directories=...).open(registry)`."""
    return locate(text, directories=directories).open(registry)


def open_checkpoint(
    path: str | os.PathLike[str], *, find: bool = True, registry: Registry | None = None
) -> Source:
    """An lmcore checkpoint, read and resolved: `path` is its model file, or (with `find`) a
    checkpoint or run directory (`lmcore.runfiles.find_checkpoint`)."""
    info = read_info(find_checkpoint(path) if find else path)
    return _opened(info, registry)


def _opened(info: CheckpointInfo, registry: Registry | None) -> Source:
    return Source("checkpoint", resolve_checkpoint(info, registry), info, info.path)


def source_of(
    value: Source | Blueprint | ModelSpec | str | CheckpointInfo | os.PathLike[str],
    registry: Registry | None = None,
) -> Source:
    """A model given in Python: a `Source` as it is; a checkpoint's `CheckpointInfo` or path
    (an `os.PathLike`, the model file) read and resolved; a spec (a string, `ModelSpec` or
    `Blueprint`) resolved (`lmcore.resolve`)."""
    if isinstance(value, Source):
        return value
    if isinstance(value, CheckpointInfo):
        return _opened(value, registry)
    if isinstance(value, os.PathLike):
        return open_checkpoint(value, find=False, registry=registry)
    return Source("spec", resolve(value, registry))


def load(
    path: str | os.PathLike[str],
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    registry: Registry | None = None,
    *,
    verify: bool = True,
    nonfinite: str = "warn",
) -> TransformerLM:
    """Rebuild the model a checkpoint describes and load its weights, strictly and without pickle.

    `path` is a model file, a checkpoint directory or a run directory (`find_checkpoint`).
    The model is built from the embedded spec through `registry` (default: the one in use) on
    `device` (default CPU) in `dtype` (default: the dtype it was saved in; giving one converts
    every tensor to it). Raises `CheckpointError` naming the file and what to do: an unreadable
    or damaged file, a component whose plugin is not installed, tensors that are missing,
    unexpected, misshapen or of another kind (integers where the model holds floats), a tie the
    stored tensors contradict.

    `verify` (default on) first checks each tensor's bytes against the CRC-32 saved with it
    (`verify_checksums`; about the cost of copying the file once); files saved before lmcore
    wrote checksums have none to check. `nonfinite`: what a NaN or infinite weight does:
    "warn" (a `NonFiniteWeightsWarning` naming the tensors), "error" (a `CheckpointError`) or
    "ignore".
    """
    source = open_checkpoint(path, registry=registry)
    return source.model(device, dtype, verify=verify, nonfinite=nonfinite)


def read_tokenizer(path: Path, error: type[LmcoreError]) -> Tokenizer:
    """The tokenizer in a tokenizer.json; `error` (the command's own) when the file is not one."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for unparsable files
        raise error(f"{str(path)!r} is not a Hugging Face tokenizer.json ({e})") from None
