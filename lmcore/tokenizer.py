"""A model's own tokenizer, kept with its weights: the `tokenizers` tokenizer.json, the special
token ids (beginning of text, end of text, end of turn) and the chat template.

    tok = SavedTokenizer.from_directory("SmolLM2/")  # tokenizer.json (+ tokenizer_config.json)
    lmcore.save(model, "m.safetensors", tokenizer=tok)
    lmcore.load("m.safetensors").tokenizer          # the same, back from the file
    ids = tok.encode(tok.render_chat([{"role": "user", "content": "Hi"}]))

A checkpoint stores it in its safetensors metadata (`METADATA_KEY`: tokenizer.json as text;
`CONFIG_KEY`: JSON of the rest), covered by the file's checksums, so the model and its tokenizer
are written (atomically) and verified as one file. Generation stops at `stop_token_ids` by
default: the end-of-text and end-of-turn tokens (`<|im_end|>` for a ChatML model, not only
`<|endoftext|>`).

Chat templates are rendered as the ecosystem renders them: Jinja in
`jinja2.sandbox.ImmutableSandboxedEnvironment` (a template is data from a file, so it may not
reach Python objects), with `trim_blocks`, `lstrip_blocks`, the loop controls, `raise_exception`
and `strftime_now`. jinja2 comes with the `chat` extra.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from lmcore.errors import CheckpointError, GenerationError
from lmcore.runfiles import TOKENIZER_FILE

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = [
    "CONFIG_KEY",
    "END_TOKENS",
    "METADATA_KEY",
    "TOKENIZER_FILE",
    "SavedTokenizer",
]

METADATA_KEY: Final = "lmcore.tokenizer"  # tokenizer.json, as text
CONFIG_KEY: Final = "lmcore.tokenizer_config"  # JSON: ids, chat template, add_bos_token
# Spellings of end-of-text and end-of-turn tokens across model families (llama.cpp ends
# generation at the same ones): a special token spelled so stops generation.
END_TOKENS: Final = (
    "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|end|>",
    "<end_of_turn>", "<|return|>", "<|call|>", "<EOT>", "</s>",
)  # fmt: skip
_MAX_IDS: Final = 64  # stop ids a file may list


@dataclass(frozen=True)
class SavedTokenizer:
    """A tokenizer.json and what a model needs beside it to talk: the ids of its beginning
    (`bos_token_id`, prepended when `add_bos_token`), of its end (`eos_token_id`), the ids that
    end generation (`stop_token_ids`: end of text, end of turn) and the chat template."""

    json: str = field(repr=False)
    chat_template: str | None = field(default=None, repr=False)
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    add_bos_token: bool = False

    # ---------------------------------------------------------------- building

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer, **config: Any) -> SavedTokenizer:
        """From a `tokenizers.Tokenizer`; `config`: the other fields. Stop ids default to the
        eos id and every special token spelled as an end token (`END_TOKENS`)."""
        saved = cls(json=tokenizer.to_str(), **config)
        if not saved.stop_token_ids:
            saved = replace(saved, stop_token_ids=saved.default_stops(tokenizer))
        return saved

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> SavedTokenizer:
        """A tokenizer.json, with what `tokenizer_config.json`, `chat_template.jinja` and
        `generation_config.json` beside it say (a Hugging Face model directory's)."""
        from tokenizers import Tokenizer

        p = Path(path)
        try:
            tok = Tokenizer.from_file(str(p))
        except Exception as e:  # tokenizers raises a bare Exception for unparsable files
            raise CheckpointError(f"{p}: is not a Hugging Face tokenizer.json ({e})") from None
        folder = p.parent
        config = _read_json(folder / "tokenizer_config.json")
        template = config.get("chat_template")
        jinja = folder / "chat_template.jinja"
        if jinja.is_file():
            template = jinja.read_text(encoding="utf-8")
        if not isinstance(template, str):
            template = None  # a list of named templates: not kept

        def token_id(name: str) -> int | None:
            value = config.get(name)
            text = value.get("content") if isinstance(value, dict) else value
            return tok.token_to_id(text) if isinstance(text, str) else None

        stops: list[int] = []
        eos = _read_json(folder / "generation_config.json").get("eos_token_id")
        for i in eos if isinstance(eos, list) else [eos]:
            if isinstance(i, int) and not isinstance(i, bool):
                stops.append(i)
        saved = cls(
            json=tok.to_str(),
            chat_template=template,
            bos_token_id=token_id("bos_token"),
            eos_token_id=token_id("eos_token"),
            add_bos_token=config.get("add_bos_token") is True,
        )
        found = [*stops, *saved.default_stops(tok)]
        return replace(saved, stop_token_ids=tuple(dict.fromkeys(found)))

    @classmethod
    def from_directory(cls, directory: str | os.PathLike[str]) -> SavedTokenizer | None:
        """`from_file` of the directory's tokenizer.json; None when it has none."""
        path = Path(directory) / TOKENIZER_FILE
        return cls.from_file(path) if path.is_file() else None

    def default_stops(self, tokenizer: Tokenizer) -> tuple[int, ...]:
        """The eos id, then each special token spelled as an end token."""
        ids = [] if self.eos_token_id is None else [self.eos_token_id]
        special = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items()
                   if t.special}  # fmt: skip
        ids += [special[name] for name in END_TOKENS if name in special]
        return tuple(dict.fromkeys(ids))

    # ---------------------------------------------------------------- the checkpoint's metadata

    def to_metadata(self) -> dict[str, str]:
        """The two metadata entries a checkpoint stores it as."""
        config = {
            "chat_template": self.chat_template,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "stop_token_ids": list(self.stop_token_ids),
            "add_bos_token": self.add_bos_token,
        }
        return {METADATA_KEY: self.json, CONFIG_KEY: json.dumps(config, sort_keys=True)}

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str], where: object) -> SavedTokenizer | None:
        """The tokenizer a checkpoint's metadata holds; None when it holds none.
        `CheckpointError` naming the key when it is damaged."""
        text = metadata.get(METADATA_KEY)
        if text is None:
            return None

        def bad(problem: str) -> CheckpointError:
            return CheckpointError(
                f"{where}: has damaged lmcore metadata: {CONFIG_KEY} {problem}; the file was "
                "edited or damaged after lmcore saved it"
            )

        try:
            config = json.loads(metadata.get(CONFIG_KEY, "{}"))
        except (json.JSONDecodeError, RecursionError) as e:
            raise bad(f"is not JSON ({e})") from None
        if not isinstance(config, dict):
            raise bad("is not a JSON object")
        ids = {k: config.get(k) for k in ("bos_token_id", "eos_token_id")}
        stops = config.get("stop_token_ids", [])
        template = config.get("chat_template")
        if (
            not all(v is None or _is_id(v) for v in ids.values())
            or not isinstance(stops, list)
            or len(stops) > _MAX_IDS
            or not all(_is_id(v) for v in stops)
        ):
            raise bad("holds token ids that are not non-negative integers")
        if template is not None and not isinstance(template, str):
            raise bad("has a chat_template that is not a string")
        return cls(
            json=text,
            chat_template=template,
            bos_token_id=ids["bos_token_id"],
            eos_token_id=ids["eos_token_id"],
            stop_token_ids=tuple(stops),
            add_bos_token=config.get("add_bos_token") is True,
        )

    # ---------------------------------------------------------------- using it

    def tokenizer(self) -> Tokenizer:
        """The `tokenizers.Tokenizer` (built anew on each call: keep it)."""
        from tokenizers import Tokenizer

        try:
            return Tokenizer.from_str(self.json)
        except Exception as e:  # tokenizers raises a bare Exception
            raise CheckpointError(f"the stored tokenizer.json cannot be read ({e})") from None

    def write(self, path: str | os.PathLike[str]) -> None:
        """The tokenizer.json, as a file (atomically)."""
        from lmcore.atomic import atomic_write

        with atomic_write(Path(path), "w") as f:
            f.write(self.json)

    def hf_files(self) -> dict[str, str]:
        """What `from_file` reads, as a Hugging Face model directory holds it: file name ->
        text (tokenizer.json, tokenizer_config.json and generation_config.json's stop ids)."""
        tok = self.tokenizer()

        def spelled(i: int | None) -> str | None:
            return None if i is None else tok.id_to_token(i)

        config: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": self.add_bos_token,
            "bos_token": spelled(self.bos_token_id),
            "eos_token": spelled(self.eos_token_id),
        }
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        files = {
            TOKENIZER_FILE: self.json,
            "tokenizer_config.json": json.dumps(config, indent=2, sort_keys=True) + "\n",
        }
        if self.stop_token_ids:
            stops = {"eos_token_id": list(self.stop_token_ids)}
            files["generation_config.json"] = json.dumps(stops, indent=2) + "\n"
        return files

    def render_chat(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        add_generation_prompt: bool = True,
        tokenizer: Tokenizer | None = None,
    ) -> str:
        """The chat template applied to `messages` (`{"role": ..., "content": ...}` each), as
        transformers' `apply_chat_template` renders it; the text holds the template's special
        tokens, so encode it with `add_special_tokens=False`. `GenerationError` when there is
        no template, or it fails."""
        if self.chat_template is None:
            raise GenerationError(
                "this model's tokenizer has no chat template; give a plain prompt (--prompt)"
            )
        template = _environment().from_string(self.chat_template)
        tok = tokenizer or self.tokenizer()

        def spelled(i: int | None) -> str:
            return "" if i is None else (tok.id_to_token(i) or "")

        try:
            text: str = template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=spelled(self.bos_token_id),
                eos_token=spelled(self.eos_token_id),
            )
        except Exception as e:  # the template's own errors, raise_exception's included
            raise GenerationError(f"the chat template fails: {type(e).__name__}: {e}") from None
        return text

    def check_vocab(self, vocab_size: int, where: object) -> None:
        """`CheckpointError` when an id of the tokenizer lies outside the model's vocabulary."""
        ids = [self.bos_token_id, self.eos_token_id, *self.stop_token_ids]
        bad = sorted({i for i in ids if i is not None and i >= vocab_size})
        if bad:
            raise CheckpointError(
                f"{where}: its tokenizer's special token ids {bad} lie outside the model's "
                f"vocabulary (vocab_size={vocab_size}); the tokenizer is not this model's"
            )


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _environment() -> Any:
    try:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise GenerationError(
            "chat templates need jinja2, which comes with the 'chat' extra: pip install "
            "'lmcore-registry[chat]'"
        ) from None
    import datetime

    def raise_exception(message: str) -> None:
        raise GenerationError(message)

    def strftime_now(fmt: str) -> str:
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, **kw: Any) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, **kw)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env
