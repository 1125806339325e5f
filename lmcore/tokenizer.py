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
and `strftime_now`. jinja2 comes with the `chat` extra. The sandbox bounds what a template may
touch, not how long it runs or how much it writes, so each rendering also has a budget
(`TEMPLATE_SECONDS` of time, `TEMPLATE_CHARS` characters of output and of any one value it
makes): every loop iteration, output and call is counted by the template's own compiled code
(no thread, no signal), and a template past either budget stops with `GenerationError` naming
it. A template with a syntax error is refused naming its line (`check_chat_template`).
"""

from __future__ import annotations

import functools
import json
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
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
    "TEMPLATE_CHARS",
    "TEMPLATE_SECONDS",
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
# A chat template's budget per rendering: real templates take milliseconds and write a
# conversation (which the context bounds); one looping 10**10 times or writing gigabytes stops.
TEMPLATE_SECONDS: Final = 5.0
TEMPLATE_CHARS: Final = 4_000_000
_MAX_BITS: Final = 1_000_000  # an integer a template computes (2 ** 10**12 would never end)


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

    def check_chat_template(self) -> None:
        """`GenerationError` naming the line of a syntax error in the chat template (or saying
        there is none), before a conversation starts."""
        if self.chat_template is None:
            raise GenerationError(
                "this model's tokenizer has no chat template; give a plain prompt (--prompt)"
            )
        _compile(self.chat_template)

    def render_chat(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        add_generation_prompt: bool = True,
        tokenizer: Tokenizer | None = None,
        seconds: float = TEMPLATE_SECONDS,
        chars: int = TEMPLATE_CHARS,
    ) -> str:
        """The chat template applied to `messages` (`{"role": ..., "content": ...}` each), as
        transformers' `apply_chat_template` renders it, within a budget of `seconds` and
        `chars` characters; the text holds the template's special tokens, so encode it with
        `add_special_tokens=False`. `GenerationError` when there is no template, it fails, it
        runs past its budget, or a message is not text (lone surrogates: bytes that were not
        UTF-8)."""
        if self.chat_template is None:
            self.check_chat_template()  # raises, saying so
        assert self.chat_template is not None
        for i, m in enumerate(messages):
            for key, value in m.items():
                if isinstance(value, str) and _SURROGATE.search(value):
                    at = _SURROGATE.search(value)
                    assert at is not None
                    raise GenerationError(
                        f"message {i + 1} ({m.get('role', '?')}) holds {at.group()!r} at "
                        f"position {at.start()} of its {key}, which is not text (bytes that were "
                        "not UTF-8?); give UTF-8 text"
                    )
        template = _compile(self.chat_template, seconds, chars)
        env = template.environment
        tok = tokenizer or self.tokenizer()

        def spelled(i: int | None) -> str:
            return "" if i is None else (tok.id_to_token(i) or "")

        env.start()
        try:
            text: str = template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=spelled(self.bos_token_id),
                eos_token=spelled(self.eos_token_id),
            )
        except _OverBudget as e:
            raise GenerationError(str(e)) from None
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


_SURROGATE: Final = re.compile("[\ud800-\udfff]")


class _OverBudget(GenerationError):
    """A chat template past its budget (re-raised as a plain `GenerationError`)."""


def _compile(template: str, seconds: float = TEMPLATE_SECONDS, chars: int = TEMPLATE_CHARS) -> Any:
    """The template compiled in a budgeted sandbox of its own (its counters are per
    rendering); `GenerationError` naming the line of a syntax error."""
    from jinja2 import TemplateSyntaxError

    env = _environment_class()(seconds, chars)
    try:
        return env.from_string(template)
    except TemplateSyntaxError as e:
        lines = template.splitlines()
        line = lines[e.lineno - 1].strip() if 0 < e.lineno <= len(lines) else ""
        shown = f" ({line[:80]!r})" if line else ""
        message = (e.message or "").rstrip(".")
        raise GenerationError(
            f"the chat template has a syntax error at line {e.lineno}{shown}: {message}; "
            "the template stored with the model is broken: fix it, or give a plain prompt "
            "(lmcore generate --prompt)"
        ) from None


def _format_widths(text: str, limit: int) -> int | None:
    """The largest number in a format string's fields, when it is above `limit` (a width or
    precision that big asks for that many characters)."""
    big = [int(n) for n in re.findall(r"\d+", text) if len(n) > 6 and int(n) > limit]
    return max(big) if big else None


@functools.cache
def _environment_class() -> Any:
    """The budgeted sandbox (built on first use: jinja2 is an optional extra)."""
    try:
        from jinja2 import nodes
        from jinja2.compiler import CodeGenerator
        from jinja2.ext import loopcontrols
        from jinja2.runtime import LoopContext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise GenerationError(
            "chat templates need jinja2, which comes with the 'chat' extra: pip install "
            "'lmcore-registry[chat]'"
        ) from None
    import datetime

    class Generator(CodeGenerator):  # type: ignore[misc]
        """Jinja's code generator, with every loop's iterable counted per item, every output
        and every `~` join measured, by calls into the environment."""

        def visit_For(self, node: Any, frame: Any) -> None:
            if not getattr(node, "counted", False):
                node.iter = nodes.Call(
                    nodes.EnvironmentAttribute("counted"), [node.iter], [], None, None
                ).set_lineno(node.lineno)
                node.counted = True
            super().visit_For(node, frame)

        def _output_const_repr(self, group: Iterable[Any]) -> str:
            return f"environment.wrote({super()._output_const_repr(group)})"

        def _output_child_pre(self, node: Any, frame: Any, finalize: Any) -> None:
            self.write("environment.wrote(")
            super()._output_child_pre(node, frame, finalize)

        def _output_child_post(self, node: Any, frame: Any, finalize: Any) -> None:
            super()._output_child_post(node, frame, finalize)
            self.write(")")

        def visit_Concat(self, node: Any, frame: Any) -> None:
            self.write("environment.joined(")
            super().visit_Concat(node, frame)
            self.write(")")

    class Budgeted(ImmutableSandboxedEnvironment):  # type: ignore[misc]
        """The sandbox, with a budget of time and characters per rendering (`start`)."""

        code_generator_class = Generator
        intercepted_binops = frozenset({"*", "**", "%", "+"})

        def __init__(self, seconds: float, chars: int) -> None:
            super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
            self.seconds, self.chars = seconds, chars
            self.start()
            self.filters["tojson"] = tojson
            for name in _SIZED_FILTERS:
                self.filters[name] = self._bounded(self.filters[name], f"the {name} filter")
            self.globals["raise_exception"] = raise_exception
            self.globals["strftime_now"] = strftime_now

        def start(self) -> None:
            self.deadline = time.monotonic() + self.seconds
            self.loops = 0
            self.written = 0

        def over(self, what: str) -> _OverBudget:
            return _OverBudget(
                f"the chat template {what} (its budget per rendering: {self.seconds:g} s and "
                f"{self.chars:,} characters; stopped after {self.loops:,} loop iterations and "
                f"{self.written:,} characters written): the template stored with the model is "
                "broken or hostile; give a plain prompt (lmcore generate --prompt)"
            )

        def tick(self) -> None:
            if time.monotonic() > self.deadline:
                raise self.over(f"ran past {self.seconds:g} s")

        def counted(self, iterable: Any) -> Any:
            return _Counted(self, iterable)

        def wrote(self, text: str) -> str:
            self.written += len(text)
            if self.written > self.chars:
                raise self.over(f"wrote past {self.chars:,} characters")
            self.tick()
            return text

        def size(self, n: int, what: str) -> None:
            if n > self.chars:
                raise self.over(f"asks for {n:,} characters or items in {what}")

        def sized(self, value: Any, what: str = "a value it makes") -> Any:
            if isinstance(value, (str, list, tuple)):
                self.size(len(value), what)
            return value

        def joined(self, value: Any) -> Any:
            return self.sized(value, "a ~ join")

        def _bounded(self, f: Any, what: str) -> Any:
            skip = 1 if hasattr(f, "jinja_pass_arg") else 0  # the context jinja passes first

            @functools.wraps(f)
            def bounded(*args: Any, **kwargs: Any) -> Any:
                data = args[skip:]
                self.tick()
                if what in _WIDTH_FILTERS:
                    self._check_ints(data[1:], kwargs, what)
                if what == "the format filter" and data:
                    self._check_format(data[0], data[1:], what)
                elif what == "the join filter" and data:
                    sep = kwargs.get("d", data[1] if len(data) > 1 else "")
                    self._check_join(data[0], sep, what)
                elif what == "the replace filter" and len(data) >= 3:
                    self._check_replace(data[0], data[1], data[2], what)
                elif what in ("the indent filter", "the wordwrap filter") and data:
                    extra = [a for a in (*data[1:], *kwargs.values()) if isinstance(a, str)]
                    if isinstance(data[0], str) and extra:
                        lines = data[0].count("\n") + 1 if "indent" in what else len(data[0])
                        self.size(len(data[0]) + lines * max(map(len, extra)), what)
                return self.sized(f(*args, **kwargs))

            return bounded

        def _check_ints(self, args: Sequence[Any], kwargs: Mapping[str, Any], what: str) -> None:
            """Integers above the budget, given to a call whose result is that wide."""
            for a in (*args, *kwargs.values()):
                if isinstance(a, int) and not isinstance(a, bool):
                    self.size(a, what)

        def _check_format(self, fmt: Any, values: Sequence[Any], what: str) -> None:
            """A format string's widths and precisions above the budget, and the values given
            as widths (`%*d`, `{:>{w}}`)."""
            if not isinstance(fmt, str):
                return
            width = _format_widths(fmt, self.chars)
            if width is not None:
                self.size(width, what)
            if "*" in fmt or re.search(r"\{[^{}]*\{", fmt):
                self._check_ints(values, {}, what)

        def _check_join(self, items: Any, sep: Any, what: str) -> None:
            if isinstance(items, (list, tuple)):
                total = sum(len(x) for x in items if isinstance(x, str))
                self.size(total + len(items) * len(str(sep)), what)

        def _check_replace(self, text: Any, old: Any, new: Any, what: str) -> None:
            if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
                hits = text.count(old) if old else len(text) + 1
                self.size(len(text) + hits * len(new), what)

        # jinja's own argument names: they keep `self` and `context` out of **kwargs
        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            inner = getattr(__obj, "__wrapped__", __obj)
            owner = getattr(inner, "__self__", None)
            __self.tick()
            if isinstance(owner, str):
                name = getattr(inner, "__name__", "")
                what = f"str.{name}"
                if name in ("center", "ljust", "rjust", "zfill", "expandtabs"):
                    __self._check_ints(args, kwargs, what)
                elif name in ("format", "format_map"):
                    __self._check_format(owner, (*args, *kwargs.values()), what)
                elif what == "str.join" and args:
                    __self._check_join(args[0], owner, what)
                elif what == "str.replace" and len(args) >= 2:
                    __self._check_replace(owner, args[0], args[1], what)
            if isinstance(__obj, LoopContext) and args:  # a recursive loop's next level
                args = (__self.counted(args[0]), *args[1:])
            return __self.sized(super().call(__context, __obj, *args, **kwargs))

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            self.tick()
            sized = (str, list, tuple)
            if operator == "*":
                for a, b in ((left, right), (right, left)):
                    if isinstance(a, sized) and isinstance(b, int):
                        self.size(len(a) * b, "a repetition")
                if isinstance(left, int) and isinstance(right, int):
                    if abs(left).bit_length() + abs(right).bit_length() > _MAX_BITS:
                        raise self.over(f"multiplies integers of more than {_MAX_BITS:,} bits")
            elif operator == "**" and isinstance(left, int) and isinstance(right, int):
                if right > 0 and abs(left) > 1 and right * abs(left).bit_length() > _MAX_BITS:
                    raise self.over(f"raises {left} to the power {right}")
            elif operator == "+" and isinstance(left, sized) and isinstance(right, sized):
                self.size(len(left) + len(right), "a sum")
            elif operator == "%" and isinstance(left, str):
                values = right if isinstance(right, tuple) else (right,)
                self._check_format(left, values, "%")
            return self.sized(super().call_binop(context, operator, left, right))

    def raise_exception(message: str) -> None:
        raise GenerationError(message)

    def strftime_now(fmt: str) -> str:
        return datetime.datetime.now().strftime(fmt)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, **kw: Any) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, **kw)

    return Budgeted


# Filters that can make a value much larger than their input: their arguments are checked
# against the budget before they run, and their results after.
_SIZED_FILTERS: Final = (
    "batch", "center", "format", "indent", "join", "replace", "slice", "tojson", "wordwrap",
    "list", "sum", "map", "string",
)  # fmt: skip
# ... of which an integer argument is the width (or count) of what they make
_WIDTH_FILTERS: Final = tuple(
    f"the {name} filter" for name in ("batch", "center", "indent", "slice", "tojson", "wordwrap")
)


class _Counted:
    """An iterable whose every item counts against its environment's time budget (its
    length, when it has one, is the iterable's: `loop.length` stays cheap)."""

    def __init__(self, env: Any, iterable: Any) -> None:
        self.env, self.iterable = env, iterable

    def __len__(self) -> int:
        return len(self.iterable)

    def __iter__(self) -> Iterator[Any]:
        env = self.env
        for item in self.iterable:
            env.loops += 1
            if env.loops & 1023 == 0:
                env.tick()
            yield item
