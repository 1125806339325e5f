"""The errors lmcore raises.

Each one names the offending value, where it is, the valid choices and a fix.
"""

from __future__ import annotations

import difflib
import traceback
from collections.abc import Iterable

# Characters of a spec shown either side of the offending token (and carets at most).
WINDOW = 60


class LmcoreError(Exception):
    """Base class of every error lmcore raises on purpose."""


class SpecError(LmcoreError, ValueError):
    """A spec string (or a `ModelSpec` built by hand) is not valid.

    `str()` shows the message and, when the position is known, the spec with a caret under the
    offending token.
    """

    def __init__(
        self, message: str, spec: str | None = None, start: int = 0, end: int | None = None
    ):
        self.message = message
        self.spec = spec
        self.start = start
        self.end = start + 1 if end is None else max(end, start + 1)
        super().__init__(self._render())

    def _render(self) -> str:
        if self.spec is None:
            return self.message
        # Show only the line holding the token, so multi-line specs stay readable.
        line_start = self.spec.rfind("\n", 0, self.start) + 1
        line_end = self.spec.find("\n", self.start)
        line_end = len(self.spec) if line_end == -1 else line_end
        width = max(1, min(self.end, line_end) - self.start)
        # A long line is shown as a window around the token, so the message stays short.
        left = max(line_start, self.start - WINDOW)
        right = min(line_end, self.start + min(width, WINDOW) + WINDOW)
        before = "..." if left > line_start else ""
        line = before + self.spec[left:right] + ("..." if right < line_end else "")
        col, width = self.start - left + len(before), min(width, WINDOW)
        where = f"at position {self.start}"
        return f"{self.message} ({where})\n  {line}\n  {' ' * col}{'^' * width}"


class SpecTypeError(SpecError, TypeError):
    """Something other than a spec string (or `ModelSpec`, `Blueprint`) was given as a spec."""


class ValueProblem(LmcoreError, ValueError):
    """What is wrong with one value, said as the end of a sentence ("must be > 0, got -1").

    Raised where a value is checked (`Arg.check`, a layer range's `select`), which does not know
    where the value was written, and caught by the caller, which does: it raises the user's error
    from it (a `SpecError` with a caret under the value, an `InvalidComponentError` naming the
    declaration). It never reaches a user on its own.
    """


class ValueTypeProblem(ValueProblem, TypeError):
    """A `ValueProblem` with the value's type ("expects int, got str 'x'")."""


class ConfigError(LmcoreError, ValueError):
    """An environment variable or option holds a value lmcore cannot read."""


class LmcoreKeyError(LmcoreError, KeyError):
    """A name is not in one of lmcore's tables. `str()` is the plain message (KeyError's quotes
    it)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class RegistryError(LmcoreError, LookupError):
    """A component or preset lookup cannot be answered."""


class ComponentNotFoundError(RegistryError):
    """No enabled, loaded plugin provides the requested kind and name."""


class AmbiguousComponentError(RegistryError):
    """Two or more providers offer the same kind and name; a qualified `dist:name` is needed."""


class PluginFailedError(RegistryError):
    """The requested component belongs to a plugin that failed to load."""


class PluginNameError(RegistryError, ValueError):
    """`Registry.register` / `add` was given a plugin name that is already taken."""


class PluginNotFoundError(RegistryError, LmcoreKeyError):
    """`Registry.unregister` was given a name no registered plugin has."""


class PluginLoadError(LmcoreError):
    """A plugin failed to load while the registry is strict (`LMCORE_STRICT_PLUGINS=1`)."""


class InvalidComponentError(LmcoreError, TypeError):
    """A plugin declared a component or preset that breaks the declaration rules."""


class ModelInputError(LmcoreError, ValueError):
    """Bad input to a model: ids out of range, a sequence longer than the context, ..."""


class ModelInputTypeError(ModelInputError, TypeError):
    """Input to a model of the wrong type: not a tensor, float token ids, ..."""


class PluginError(LmcoreError, RuntimeError):
    """A plugin's code failed, or broke its contract, when lmcore called it: a factory that raised
    or returned something other than a module, a declaration that raised or gave a count that is
    not a whole number, a module whose output has the wrong shape. The message names the
    component, its distribution and what went wrong."""


class ModelTooLargeError(SpecError):
    """A build would need more memory than the limit (or than torch can index); the message names
    the total and the largest part."""


class BuildOptionError(LmcoreError, ValueError):
    """`build_model` (or a command) was given a device, dtype or limit it cannot use."""


class StateDictError(LmcoreError, RuntimeError):
    """A state dict cannot be loaded into the model as it is (e.g. two different matrices for the
    one that tied embeddings share)."""


class CheckpointError(LmcoreError, ValueError):
    """A checkpoint cannot be read, or does not fit the model it describes. The message names the
    file, what is wrong with it and what to do."""


class ConversionError(CheckpointError):
    """A model cannot be converted to or from another library's format without losing something;
    the message names every field or component that does not carry over."""


class DataError(LmcoreError, ValueError):
    """Token data cannot be prepared or read: missing or undecodable text, a bad option, an
    output directory that already holds data, files that do not match their metadata, ..."""


class TrainError(LmcoreError, ValueError):
    """Training cannot start or continue: a bad option, a run directory that already holds a
    run (or holds none), a resumed run whose options or data changed, ..."""


class TrainMemoryError(TrainError):
    """Training ran out of memory; the message names the batch and what to lower. A sweep
    records it as that variant's failure and goes on."""


class GenerationError(LmcoreError, ValueError):
    """Generation cannot run as asked: a sampling option out of range, a component that cannot
    work with a KV cache, prompts that need a mask the kernel lacks, or no room in the context."""


class EvalError(LmcoreError, ValueError):
    """An evaluation cannot run as asked: no tokenizer for the model, text that encodes to too
    few tokens, a bad window option, an optional extra (lm-eval, a tracker) not installed, ..."""


class FitError(LmcoreError, ValueError):
    """A scaling law cannot be fitted as asked: too few rungs or points, a variant missing rungs
    the baseline has, a non-finite or non-positive loss or compute, a loss a law never reaches.
    The message names the variant, rung and seed, and how many are needed."""


class LmcoreWarning(UserWarning):
    """Something is off but nothing failed, e.g. LMCORE_DISABLE_PLUGINS names no plugin."""


class SlowPluginWarning(LmcoreWarning):
    """A plugin is taking long to import; the message names it."""


class CheckpointWarning(LmcoreWarning):
    """A checkpoint loaded, but a component now comes from another version (or distribution) than
    the one that saved it. `LMCORE_STRICT_PLUGINS=1` makes this a `CheckpointError`."""


class NonFiniteWeightsWarning(CheckpointWarning):
    """A checkpoint's weights hold NaN or infinite values; the message names the tensors.
    `lmcore.load(..., nonfinite="error")` makes this a `CheckpointError` (LMCORE_STRICT_PLUGINS
    does not: it concerns plugins)."""


def clip(text: str, limit: int = 60, *, quote: bool = True) -> str:
    """`repr(text)` (`text` itself without `quote`), cut in the middle when longer than
    `limit`: user input echoed in a message never makes the message long."""
    shown = repr(text) if quote else text
    if len(shown) <= limit:
        return shown
    return f"{shown[: limit // 2]}...{shown[-limit // 2 :]} ({len(text):,} characters)"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the closest choice, or an empty string when none is close."""
    close = difflib.get_close_matches(word, sorted(set(choices)), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def one_of(choices: Iterable[str]) -> str:
    """Comma-separated, sorted choices, or 'none' when there are none."""
    names = sorted(set(choices))
    return ", ".join(names) if names else "none"


def describe_exception(e: BaseException) -> str:
    """`Type: message` plus the innermost frame, so a failure can be traced to a line."""
    frames = traceback.extract_tb(e.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    message = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
    if len(message) > 300:
        message = f"{message[:150]}...{message[-150:]}"
    return f"{type(e).__name__}: {message}{where}" if message else f"{type(e).__name__}{where}"
