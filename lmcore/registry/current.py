"""The registry in use: the process default, made on first use, or the one a `use_registry`
block (a context variable, so threads and tasks each see their own) puts in place."""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from typing import Any

from lmcore.registry.lookup import Registry

_default: Registry | None = None
_default_lock = threading.Lock()
_current: contextvars.ContextVar[Registry | None] = contextvars.ContextVar(
    "lmcore_registry", default=None
)


def get_registry() -> Registry:
    """The registry in use: the innermost `use_registry` block's, else the process default."""
    current = _current.get()
    if current is not None:
        return current
    global _default
    if _default is None:
        with _default_lock:  # threads asking first at once share one registry
            if _default is None:
                _default = Registry()
    return _default


@contextlib.contextmanager
def use_registry(registry: Registry) -> Iterator[Registry]:
    """Make `registry` the one `build_model`, `parse_spec` and the CLI use inside the block."""
    token = _current.set(registry)
    try:
        yield registry
    finally:
        _current.reset(token)


@contextlib.contextmanager
def scoped_registry(**options: Any) -> Iterator[Registry]:
    """A fresh `Registry(**options)` in use for the block; its registrations vanish on exit."""
    with use_registry(Registry(**options)) as registry:
        yield registry
