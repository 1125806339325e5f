"""A component resolved for its place in a model (`Part`), and the output check every built
component gets (`checked_module`). `lmcore.blueprint` resolves specs into parts."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lmcore.components import Component
from lmcore.errors import PluginError
from lmcore.registry import Entry, Provenance
from lmcore.spec import ComponentSpec


@dataclass(frozen=True)
class Part:
    """A component resolved for its place in a model: its canonical spec, the registry entry
    that provides it, and the value of every argument it declares (defaults filled in, nested
    components as `Part`s, an optional component left out as None).

    A component whose argument takes a component (``Arg("expert", "ffn", ...)``) receives that
    argument as a `Part` and builds it with `create`, accounting for it with `count`.
    """

    spec: ComponentSpec
    entry: Entry
    values: tuple[tuple[str, Any], ...] = ()

    @property
    def kind(self) -> str:
        return self.entry.kind

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def component(self) -> Component:
        return self.entry.component

    @property
    def provenance(self) -> Provenance:
        return self.entry.provenance

    def kwargs(self) -> dict[str, Any]:
        """Every argument's value, as the factory and the declarations receive them."""
        return dict(self.values)

    def create(self, *, device: Any = None, dtype: Any = None, **dims: Any) -> Any:
        """Build the module for `dims` (e.g. ``d_model=64``), checked like every component's
        (`checked_module`)."""
        kwargs = {**dims, **self.kwargs(), "device": device, "dtype": dtype}
        module = self.entry.invoke("build", kwargs)
        return checked_module(self.entry, module)

    def count(self, what: str, **dims: Any) -> int | None:
        """A declared count (`params`, `flops`, `activations`, `buffers`) for `dims`, or None
        when the component declares none."""
        return self.entry.count(what, {**dims, **self.kwargs()})

    def check_shape(self, **dims: Any) -> None:
        """The component's `validate` for `dims`: ValueError (its own sentence) when the shape
        cannot work."""
        self.entry.invoke("validate", {**dims, **self.kwargs()}, allow=(ValueError,))

    def attention_paths(self) -> tuple[str, ...]:
        """A mixer's `attention` declaration: where it keeps each attention sub-layer it builds
        with `attention()` (``""``: itself); none for a mixer that declares none. A mixer whose
        arguments are mixers (`parallel(first=attention, ...)`) gives its parts' paths below
        its own attributes (``"first"``)."""
        paths = self.entry.invoke("attention", self.kwargs())
        if paths is None:
            return ()
        if not isinstance(paths, tuple | list) or not all(isinstance(p, str) for p in paths):
            raise PluginError(
                f"mixer {self.name!r} from {self.provenance}: its attention declaration gives "
                f"{paths!r}; it must give a sequence of attribute paths ('' for the mixer itself)"
            )
        return tuple(paths)

    def walk(self) -> Iterator[Part]:
        """This part and every component nested in its arguments."""
        yield self
        for _, value in self.values:
            if isinstance(value, Part):
                yield from value.walk()

    def __str__(self) -> str:
        return str(self.spec)


def checked_module(entry: Entry, module: Any) -> Any:
    """`module` once it is a `torch.nn.Module` implementing its kind's protocol, with a forward
    hook that checks its output (norm, ffn, block: the input's shape and dtype; attn: q's), so
    a plugin that gets them wrong is named at its first call instead of failing somewhere later.
    """
    from torch import nn

    from lmcore.interfaces import PROTOCOLS

    where = f"{entry.kind} {entry.name!r} from {entry.provenance}"
    protocol = PROTOCOLS[entry.kind]
    if not isinstance(module, nn.Module) or not isinstance(module, protocol):
        got = "None" if module is None else f"a {type(module).__name__}"
        raise PluginError(
            f"{where}: its factory returned {got}, not a torch.nn.Module implementing "
            f"lmcore.interfaces.{protocol.__name__}"
        )
    if entry.kind not in ("pos", "adapter", "quant"):  # W's output shape, not x's
        module.register_forward_hook(_OutputCheck(where, entry.kind))
    return module


@dataclass(frozen=True)
class _OutputCheck:
    """A forward hook: the output has the shape and dtype of the first input (x, or q); under
    `torch.autocast` the autocast dtype is right too (a matmul of float32 input gives it)."""

    where: str
    kind: str

    def __call__(self, module: Any, args: tuple[Any, ...], out: Any) -> None:
        import torch
        from torch import Tensor

        x = args[0]
        if isinstance(out, Tensor) and out.shape == x.shape:
            if out.dtype == x.dtype:
                return
            device = x.device.type
            if torch.is_autocast_enabled(device) and out.dtype == torch.get_autocast_dtype(device):
                return
        what = "q's" if self.kind == "attn" else "its input's"
        got = f"shape {tuple(out.shape)} {out.dtype}" if isinstance(out, Tensor) else type(out)
        raise PluginError(
            f"{self.where} returned {got} for {'q' if self.kind == 'attn' else 'an input'} of "
            f"shape {tuple(x.shape)} {x.dtype}; a {self.kind} must return {what} shape and dtype"
        )
