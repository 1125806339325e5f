"""What a prepared data directory holds, and `meta.json`, the file that describes it.

One schema, written by `prepare` and read by `TokenData.open`:

    DIR/train.bin       token ids, a flat little-endian array of `dtype`, no header
    DIR/val.bin         the same for the validation split
    DIR/train.starts.bin  the document index: int64 little-endian offsets into train.bin of
                        each document's first token (`STARTS_RULE`), ascending, 0 first
    DIR/val.starts.bin  the same for val.bin
    DIR/tokenizer.json  the Hugging Face `tokenizers` byte-level BPE that produced the ids
    DIR/meta.json       this module's `DataMeta`: vocabulary, dtype, token counts, sources, rules

Chat data (`lmcore data prepare --chat`, `lmcore.data.chat`) holds two more files per split,
named in meta.json: `masks` (DIR/train.mask.bin: one uint8 per token, 1 where the token is a
trained target, an assistant's, 0 where it is left out of the loss) and `documents`
(DIR/train.docs.bin: int64, each conversation's first token offset); `chat` records where the
tokenizer and template came from. Directories without them load as before and have none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmcore.errors import DataError
from lmcore.jsonfile import read_versioned
from lmcore.runfiles import TOKENIZER_FILE

if TYPE_CHECKING:
    import numpy as np

FORMAT = "lmcore-tokens"
VERSION = 1
EOT = "<|endoftext|>"  # the end-of-text token: CS336's and GPT-2's spelling
SPLITS = ("train", "val")
META_FILE = "meta.json"
STARTS_SUFFIX = ".starts.bin"  # a split's document index: train.starts.bin beside train.bin
STARTS_DTYPE = "<i8"  # its offsets: int64, little-endian
# What shows a directory holds prepared data (its document index comes with them).
DATA_FILES = (*(f"{s}.bin" for s in SPLITS), TOKENIZER_FILE, META_FILE)
BYTES = 256  # a byte-level BPE starts from every byte value
MIN_VOCAB = BYTES + 1  # ... plus <|endoftext|>
DEFAULT_VOCAB_SIZE = 10_000  # the `tinystories` preset's vocabulary, as in CS336
DEFAULT_VAL_FRACTION = 0.1
DEFAULT_SPLIT_BLOCK = 8192  # tokens

DOCUMENT_RULE = (
    f"each file is a document and ends with {EOT} (unless its text already ends with it); "
    f"inside a file the literal text {EOT} is the end-of-text token too, so one file can hold "
    "many documents"
)
SPLIT_RULE = (
    f"the token stream is cut into blocks: a document (up to and including its {EOT}), or "
    "split_block consecutive tokens of a longer one; a block goes to val when val holds less "
    "than val_fraction of the tokens so far, else to train"
)
STARTS_RULE = (
    "a split's document index holds the offset of every token that begins a document in it: "
    "the split's first token, each token after an end-of-text, and the first token of a block "
    "that does not continue the split's previous block (a piece of a long document whose "
    "previous block went to the other split); so each entry begins a run of tokens that were "
    "consecutive in one document"
)


def dtype_for(vocab_size: int) -> str:
    """uint16 while every id fits (vocab_size ≤ 65,536), else uint32."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


def file_dtype(dtype: str) -> np.dtype[Any]:
    """The numpy dtype of the .bin files: `dtype`, little-endian whatever the machine."""
    import numpy as np  # here, so that the CLI's parser can read the defaults above cheaply

    little: np.dtype[Any] = np.dtype(dtype).newbyteorder("<")
    return little


@dataclass(frozen=True)
class SplitInfo:
    """One split's file, its length in tokens and its number of end-of-text tokens; and its
    document index (`STARTS_RULE`): the file and its number of entries (None in a directory
    prepared before lmcore wrote one)."""

    file: str
    tokens: int
    documents: int
    starts_file: str | None = None
    starts: int | None = None


@dataclass(frozen=True)
class SourceInfo:
    """One SOURCE argument: how many files it contributed and their size in bytes."""

    path: str
    files: int
    bytes: int


@dataclass(frozen=True)
class DataMeta:
    """The contents of `meta.json`."""

    vocab_size: int
    dtype: str
    eot_id: int
    splits: dict[str, SplitInfo]
    val_fraction: float
    split_block: int
    sources: tuple[SourceInfo, ...]
    extensions: tuple[str, ...]
    exclude: tuple[str, ...]
    skipped: tuple[str, ...] = ()  # "path: why", for files left out by --skip-undecodable
    tokenizer_from: str | None = None  # the file a reused tokenizer came from; None: trained
    eot_token: str = EOT
    tokenizer_file: str = TOKENIZER_FILE
    document_rule: str = DOCUMENT_RULE
    split_rule: str = SPLIT_RULE
    starts_rule: str | None = STARTS_RULE  # None: no document index (an older directory)
    versions: dict[str, str] = field(default_factory=dict)  # lmcore, tokenizers, numpy
    masks: dict[str, str] | None = None  # split -> its loss mask file (uint8); None: no mask
    documents: dict[str, str] | None = None  # split -> its document starts (int64); None: none
    chat: dict[str, Any] | None = None  # chat data's provenance and counts (lmcore.data.chat)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.splits.values())

    @property
    def has_documents(self) -> bool:
        """Whether every split has a document index (directories prepared before it have none)."""
        return all(s.starts_file is not None for s in self.splits.values())

    @property
    def files(self) -> int:
        return sum(s.files for s in self.sources)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.sources)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, **asdict(self)}

    def write(self, path: Path) -> None:
        """Write `meta.json` atomically."""
        from lmcore.atomic import atomic_write
        from lmcore.jsonfile import dumps

        with atomic_write(path, "w") as f:
            f.write(dumps(self.to_json()) + "\n")

    @classmethod
    def read(cls, path: Path) -> DataMeta:
        """Parse `meta.json`, naming the file and the field when anything is off."""
        fix = "prepare the directory again: lmcore data prepare SOURCE... --out DIR --force"
        raw = read_versioned(
            path,
            format=FORMAT,
            version=VERSION,
            what="lmcore token-data metadata",
            error=DataError,
            fix=fix,
        )
        get = _Fields(raw, path, fix)
        splits = get.mapping("splits")
        missing = [s for s in SPLITS if s not in splits]
        if missing:
            raise DataError(f"{path}: splits lacks {', '.join(missing)}; {fix}")
        return cls(
            vocab_size=get.integer("vocab_size"),
            dtype=get.string("dtype"),
            eot_id=get.integer("eot_id"),
            splits={s: _Fields(splits[s], path, fix, f"splits.{s}.").split() for s in SPLITS},
            val_fraction=get.number("val_fraction"),
            split_block=get.integer("split_block"),
            sources=tuple(
                _Fields(s, path, fix, "sources[].").source() for s in get.sequence("sources")
            ),
            extensions=tuple(get.strings("extensions")),
            exclude=tuple(get.strings("exclude")),
            skipped=tuple(get.strings("skipped")),
            tokenizer_from=get.optional_string("tokenizer_from"),
            eot_token=get.string("eot_token"),
            tokenizer_file=get.string("tokenizer_file"),
            document_rule=get.string("document_rule"),
            split_rule=get.string("split_rule"),
            starts_rule=get.optional_string("starts_rule"),
            versions={str(k): str(v) for k, v in get.mapping("versions").items()},
            masks=get.split_files("masks"),
            documents=get.split_files("documents"),
            chat=None if raw.get("chat") is None else dict(get.mapping("chat")),
        )


class _Fields:
    """Typed access to one JSON object of meta.json, with errors that name the field."""

    def __init__(self, raw: Any, path: Path, fix: str, prefix: str = ""):
        if not isinstance(raw, dict):
            raise DataError(f"{path}: {prefix.rstrip('.') or 'the top level'} is not an object")
        self.raw, self.path, self.fix, self.prefix = raw, path, fix, prefix

    def _get(self, key: str, types: type | tuple[type, ...], what: str) -> Any:
        value = self.raw.get(key)
        if not isinstance(value, types) or isinstance(value, bool):
            raise DataError(
                f"{self.path}: {self.prefix}{key} should be {what}, found {value!r}; {self.fix}"
            )
        return value

    def integer(self, key: str) -> int:
        value: int = self._get(key, int, "an integer")
        if value < 0:
            raise DataError(f"{self.path}: {self.prefix}{key} is negative ({value}); {self.fix}")
        return value

    def number(self, key: str) -> float:
        return float(self._get(key, (int, float), "a number"))

    def string(self, key: str) -> str:
        value: str = self._get(key, str, "a string")
        return value

    def optional_string(self, key: str) -> str | None:
        return None if self.raw.get(key) is None else self.string(key)

    def mapping(self, key: str) -> Mapping[str, Any]:
        value: Mapping[str, Any] = self._get(key, dict, "an object")
        return value

    def sequence(self, key: str) -> list[Any]:
        value: list[Any] = self._get(key, list, "a list")
        return value

    def strings(self, key: str) -> list[str]:
        values = self.sequence(key)
        if not all(isinstance(v, str) for v in values):
            raise DataError(f"{self.path}: {self.prefix}{key} should hold strings; {self.fix}")
        return values

    def split_files(self, key: str) -> dict[str, str] | None:
        """An optional object naming one file per split (`masks`, `documents`)."""
        if self.raw.get(key) is None:
            return None
        files = self.mapping(key)
        if set(files) != set(SPLITS) or not all(isinstance(v, str) for v in files.values()):
            raise DataError(
                f"{self.path}: {self.prefix}{key} should name a file for each of "
                f"{', '.join(SPLITS)}, found {dict(files)!r}; {self.fix}"
            )
        return {s: str(files[s]) for s in SPLITS}

    def split(self) -> SplitInfo:
        starts_file = self.optional_string("starts_file")  # absent before the document index
        return SplitInfo(
            file=self.string("file"),
            tokens=self.integer("tokens"),
            documents=self.integer("documents"),
            starts_file=starts_file,
            starts=None if starts_file is None else self.integer("starts"),
        )

    def source(self) -> SourceInfo:
        return SourceInfo(
            path=self.string("path"), files=self.integer("files"), bytes=self.integer("bytes")
        )
