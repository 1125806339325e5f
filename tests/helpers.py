"""Plain helpers and constants the tests import (`from tests.helpers import TINY_SPEC`).

Fixtures live in the conftest.py of the directory that needs them; what is here is imported.
Add to the end of this file, in a section headed with your area.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from lmcore import Arg, Component, Registry
from lmcore.interfaces import PositionalEncodingBase
from lmcore.model.nn import scaled_dot_product_attention

# ---------------------------------------------------------------------------------------------
# Errors: assert the facts a message exists to carry, not its glue words
# ---------------------------------------------------------------------------------------------


def _missing(message: str, facts: tuple[str | re.Pattern[str], ...]) -> list[str | re.Pattern[str]]:
    for fact in facts:
        if not isinstance(fact, (str, re.Pattern)):
            raise TypeError(f"a fact is a str or a compiled regex, not {type(fact).__name__}")
    return [
        fact
        for fact in facts
        if (fact.search(message) is None if isinstance(fact, re.Pattern) else fact not in message)
    ]


def assert_naming(message: str, *facts: str | re.Pattern[str]) -> None:
    """`message` (a report, a reason, an output) names every fact, as `raises_naming` checks."""
    missing = _missing(message, facts)
    if missing:
        shown = ", ".join(repr(fact) for fact in missing)
        raise AssertionError(f"the text does not name {shown}; it reads:\n{message}")


@contextmanager
def raises_naming(
    exc_type: type[BaseException] | tuple[type[BaseException], ...],
    *facts: str | re.Pattern[str],
) -> Iterator[pytest.ExceptionInfo[BaseException]]:
    """Like `pytest.raises(exc_type)`, and the message names every fact.

    A fact is a plain substring of `str(excinfo.value)` (the offending token, its position, the
    valid choices, the suggestion, the file) or a compiled regex searched in it. A missing fact
    fails the test, naming the fact and the whole message:

        with raises_naming(SpecError, "unknown key 'd_modle'", "did you mean 'd_model'"):
            parse_spec("tinystories, d_modle=512")
    """
    _missing("", facts)  # a malformed fact is refused before the block runs
    with pytest.raises(exc_type) as excinfo:
        yield excinfo
    message = str(excinfo.value)
    missing = _missing(message, facts)
    if missing:
        shown = ", ".join(repr(fact) for fact in missing)
        raise AssertionError(
            f"{type(excinfo.value).__name__} does not name {shown}; its message:\n{message}"
        )


@contextmanager
def warns_naming(
    category: type[Warning], *facts: str | re.Pattern[str]
) -> Iterator[pytest.WarningsRecorder]:
    """Like `pytest.warns(category)`, and one warning of that category names every fact."""
    _missing("", facts)
    with pytest.warns(category) as record:
        yield record
    messages = [str(w.message) for w in record if issubclass(w.category, category)]
    if not any(not _missing(message, facts) for message in messages):
        shown = ", ".join(repr(fact) for fact in facts)
        raise AssertionError(
            f"no {category.__name__} names all of {shown}; the warnings:\n" + "\n".join(messages)
        )


# ---------------------------------------------------------------------------------------------
# Plugins: modules of fake distributions (installed with the `make_dist` fixture)
# ---------------------------------------------------------------------------------------------

# A third-party norm: the same maths as RMSNorm, so a model built with it is a real model.
OTHER_RMSNORM = """
from lmcore import Component, hookimpl
from lmcore_rmsnorm import RMSNorm

class OtherRMSNorm(RMSNorm):
    pass

@hookimpl
def lmcore_components():
    return [Component(kind="norm", name="rmsnorm", build=OtherRMSNorm, params=lambda d_model: d_model)]
"""

# A plugin module whose import fails.
BROKEN_IMPORT = "raise ImportError('flash kernels need triton')\n"


def plugin_source(body: str) -> str:
    """A plugin module: `body` (dedented) after the imports a declaration needs."""
    header = "from torch.nn import Module\nfrom lmcore import Arg, Component, Preset, hookimpl\n"
    return header + textwrap.dedent(body)


def scale_norm() -> Component:
    """A norm component declared in-process (no distribution): an identity, "scale"."""
    return Component(
        kind="norm", name="scale", build=lambda d_model: torch.nn.Identity(), help="test-only"
    )


def plain_kernel(features: frozenset[str], **declared: Any) -> Component:
    """lmcore's sdpa module declared as attn 'plain' with only `features` (and what `declared`
    adds): what it does not declare, lmcore works around or refuses."""
    from lmcore_sdpa import SDPA

    return Component(kind="attn", name="plain", build=SDPA, features=features, **declared)


# ---------------------------------------------------------------------------------------------
# Built-in plugins: a component's declarations against its module, and in a model
# ---------------------------------------------------------------------------------------------

# d_model, d_ff, num_heads, num_kv_heads, context_length, seq_len, kv_len
COUNT_SHAPES = [
    (64, 128, 4, 4, 16, 16, 16),
    (48, 200, 6, 2, 32, 5, 11),
]


def _dims(shape: tuple[int, ...]) -> dict[str, int]:
    d_model, d_ff, heads, kv_heads, ctx, _, _ = shape
    return {
        "d_model": d_model,
        "d_ff": d_ff,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": d_model // heads,
        "context_length": ctx,
    }


def _forward(kind: str, module: torch.nn.Module, shape: tuple[int, ...]) -> Any:
    """One forward of `module` for one sequence of `seq_len` queries over `kv_len` keys."""
    d_model, _, heads, kv_heads, _, seq, kv = shape
    x = torch.randn(1, seq, d_model)
    if kind in ("norm", "ffn"):
        return module(x)
    if kind == "pos":
        positions = torch.arange(seq)[None]
        return module.embed(x, positions), module.attention_bias(positions, positions)
    hd = d_model // heads
    q, k, v = (
        torch.randn(1, heads, seq, hd),
        torch.randn(1, kv_heads, kv, hd),
        torch.randn(1, kv_heads, kv, hd),
    )
    return module(q, k, v, causal=True)


def assert_declared_counts(
    kind: str, name: str, args: dict[str, Any], shape: tuple[int, ...]
) -> None:
    """The registered component's declared parameters and FLOPs equal its built module's."""
    from torch.utils.flop_counter import FlopCounterMode

    from lmcore import get_registry

    comp = get_registry().get(kind, name).component
    dims = {**_dims(shape), **args}
    module = comp.create(**dims)
    assert comp.count_params(**dims) == sum(p.numel() for p in module.parameters())
    with FlopCounterMode(display=False) as counter:
        _forward(kind, module, shape)
    seq, kv = shape[5], shape[6]
    assert comp.count_flops(**dims, seq_len=seq, kv_len=kv) == counter.get_total_flops()


def assert_compile_traces_the_whole_module(kind: str, name: str, args: dict[str, Any]) -> None:
    """The component has help, declares 'compile', and traces with fullgraph to the eager output."""
    from lmcore import get_registry

    comp = get_registry().get(kind, name).component
    assert comp.help
    assert "compile" in comp.features
    shape = COUNT_SHAPES[1]
    dims = {**_dims(shape), **args}
    module = comp.create(**dims)
    torch.manual_seed(0)
    eager = _forward(kind, module, shape)
    torch._dynamo.reset()
    if kind == "pos":
        module.embed = torch.compile(module.embed, fullgraph=True, backend="aot_eager")
        module.attention_bias = torch.compile(
            module.attention_bias, fullgraph=True, backend="aot_eager"
        )
        compiled = module
    else:
        compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    torch.manual_seed(0)
    torch.testing.assert_close(_forward(kind, compiled, shape), eager)


def assert_model_runs_counts_and_is_causal(spec: str) -> None:
    """A model of `spec` counts its declared parameters, gives finite logits and stays causal."""
    from lmcore import build_model, get_registry

    torch.manual_seed(0)
    model = build_model(spec)
    reg = get_registry()
    declared = 0
    for kind in ("norm", "ffn", "pos", "attn"):
        c = model.spec.component(kind)
        count = reg.get(kind, c.name).component.count_params(**model.spec.dims(kind), **c.kwargs)
        declared += count * {
            "norm": 2 * model.spec.num_layers + 1,
            "ffn": model.spec.num_layers,
        }.get(kind, 1)
    modules = {"norm": ("ln1", "ln2", "ln_final"), "ffn": (".ffn.",), "pos": ("pos.",)}
    actual = sum(
        p.numel()
        for n, p in model.named_parameters()
        if any(m in n for ms in modules.values() for m in ms)
    )
    assert declared == actual
    ids = torch.randint(0, 10000, (3, 16))
    base = model(ids)
    assert base.shape == (3, 16, 10000) and torch.isfinite(base).all()
    for t in (0, 5, 14):
        changed = ids.clone()
        changed[:, t + 1 :] = torch.randint(0, 10000, changed[:, t + 1 :].shape)
        out = model(changed)
        torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], rtol=0, atol=1e-5)
        assert not torch.allclose(out[:, t + 1 :], base[:, t + 1 :])


def assert_logits_depend_on_positions(spec: str) -> None:
    """Shifting every position changes the logits (an absolute encoding is in use)."""
    from lmcore import build_model

    torch.manual_seed(0)
    model = build_model(spec)
    ids = torch.randint(0, 10000, (1, 8))
    a = model(ids, torch.arange(8)[None])
    b = model(ids, torch.arange(8)[None] + 5)
    assert not torch.allclose(a, b, atol=1e-3)


# ---------------------------------------------------------------------------------------------
# The conformance kit: healthy components, planted bugs, and the kit run in-process (pytester)
# ---------------------------------------------------------------------------------------------

# healthy components


class Norm(nn.Module):
    """A correct RMS-style norm; the planted norms below break it one way each."""

    def __init__(self, d_model: int, device: Any = None, dtype: Any = None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def normalise(self, x: Tensor, dim: int = -1) -> Tensor:
        x32 = x.float()
        return x32 / torch.sqrt(x32.pow(2).mean(dim=dim, keepdim=True) + 1e-5) * self.weight

    def forward(self, x: Tensor) -> Tensor:
        return self.normalise(x).to(x.dtype)


class Attention(nn.Module):
    """A correct kernel: the reference with an end-aligned causal mask and k, v per group."""

    offset = 0  # planted: how many future keys leak
    start_aligned = False  # planted: queries aligned to the start of the keys

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, mask: Any = None, bias: Any = None
    ) -> Tensor:
        k, v = self.expand(k, q.shape[1]), self.expand(v, q.shape[1])
        sq, sk = q.shape[-2], k.shape[-2]
        if causal:
            shift = 0 if self.start_aligned else sk - sq
            visible = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + shift + self.offset
            mask = visible if mask is None else self.combine(mask, visible)
        return scaled_dot_product_attention(q, k, v, mask=mask, bias=self.bias_of(bias))

    def expand(self, t: Tensor, heads: int) -> Tensor:
        return t.repeat_interleave(heads // t.shape[1], dim=1)

    def combine(self, mask: Tensor, visible: Tensor) -> Tensor:
        return mask & visible

    def bias_of(self, bias: Tensor | None) -> Tensor | None:
        return bias


class Rotary(PositionalEncodingBase):
    """A correct rotary encoding over the two halves of the head dimension."""

    def __init__(self, head_dim: int, device: Any = None):
        super().__init__()
        self.inv_freq = 1.0 / 10000 ** (torch.arange(0, head_dim, 2, device=device) / head_dim)

    def angle(self, positions: Tensor) -> Tensor:
        return positions.float()[..., None] * self.inv_freq  # (B, T, D/2)

    def rotation(self, token_positions: Tensor) -> Any:
        a = self.angle(token_positions)[:, None]  # (B, 1, T, D/2)
        cos, sin = torch.cos(a), torch.sin(a)

        def rotate(x: Tensor) -> Tensor:
            x1, x2 = x.float().chunk(2, dim=-1)
            return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).to(x.dtype)

        return rotate


def attn_flops(num_heads: int, head_dim: int, seq_len: int, kv_len: int) -> int:
    return 4 * num_heads * seq_len * kv_len * head_dim


def norm(name: str, build: Any, **kw: Any) -> Component:
    kw.setdefault("params", lambda d_model: d_model)
    kw.setdefault("features", frozenset({"compile"}))
    return Component(kind="norm", name=name, build=build, **kw)


def attn(name: str, build: Any, **kw: Any) -> Component:
    kw.setdefault("features", frozenset({"gqa", "mask", "bias", "compile"}))
    kw.setdefault("flops", attn_flops)
    return Component(kind="attn", name=name, build=build, **kw)


def rotary(name: str, build: Any, **kw: Any) -> Component:
    kw.setdefault("features", frozenset({"rotary", "relative", "compile"}))
    return Component(kind="pos", name=name, build=build, **kw)


# planted bugs


class DtypeNorm(Norm):
    def forward(self, x: Tensor) -> Tensor:
        return self.normalise(x)  # planted: forgets .to(x.dtype), so bf16 comes back float32


class NaNNorm(Norm):
    def forward(self, x: Tensor) -> Tensor:
        return torch.log(x) * self.weight  # planted: log of negative inputs is NaN


class MixingNorm(Norm):
    def forward(self, x: Tensor) -> Tensor:
        return self.normalise(x, dim=-2).to(x.dtype)  # planted: statistics over the sequence


class DetachedNorm(Norm):
    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        rms = torch.sqrt(x32.pow(2).mean(dim=-1, keepdim=True) + 1e-5)
        return (x32 / rms * self.weight.detach()).to(x.dtype)  # planted: the gain never learns


class UnsavedNorm(Norm):
    def __init__(self, d_model: int, device: Any = None, dtype: Any = None):
        super().__init__(d_model, device, dtype)
        self.scale = torch.rand(d_model, device=device)  # planted: not a parameter or buffer

    def forward(self, x: Tensor) -> Tensor:
        return (self.normalise(x) * self.scale).to(x.dtype)


class CpuNorm(Norm):
    def __init__(self, d_model: int, device: Any = None, dtype: Any = None):
        super().__init__(d_model, device, dtype)
        self.register_buffer("eps", torch.full((1,), 1e-5))  # planted: ignores device


class CompileNorm(Norm):
    def forward(self, x: Tensor) -> Tensor:
        y = self.normalise(x).to(x.dtype)
        return y * 2 if torch.compiler.is_compiling() else y  # planted: compiled ≠ eager


class ArgNorm(Norm):
    def __init__(self, d_model: int, unused: float, device: Any = None, dtype: Any = None):
        super().__init__(d_model, device, dtype)


class LeakyAttention(Attention):
    offset = 1


class StartAlignedAttention(Attention):
    start_aligned = True


class InvertedMaskAttention(Attention):
    def combine(self, mask: Tensor, visible: Tensor) -> Tensor:
        return ~mask & visible  # planted: True read as "masked out"

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, mask: Any = None, bias: Any = None
    ) -> Tensor:
        if mask is not None and not causal:
            mask = ~mask  # the same bug without causal
        return super().forward(q, k, v, causal=causal, mask=mask, bias=bias)


class BiaslessAttention(Attention):
    def bias_of(self, bias: Tensor | None) -> Tensor | None:
        return None  # planted: declares 'bias' but drops it


class TiledGQAAttention(Attention):
    def expand(self, t: Tensor, heads: int) -> Tensor:
        return t.repeat(1, heads // t.shape[1], 1, 1)  # planted: head h uses kv head h % Hkv


class UnstableAttention(Attention):
    """Right on ordinary inputs: the textbook softmax, exp(s) / sum exp(s), without subtracting
    the row's maximum first; planted: scores beyond ~88 overflow float32 to inf, then NaN."""

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, mask: Any = None, bias: Any = None
    ) -> Tensor:
        k, v = self.expand(k, q.shape[1]), self.expand(v, q.shape[1])
        sq, sk = q.shape[-2], k.shape[-2]
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        if bias is not None:
            scores = scores + bias
        keep = torch.ones(sq, sk, dtype=torch.bool)
        if causal:
            keep = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + (sk - sq)
        if mask is not None:
            keep = keep & mask
        weights = torch.where(keep, scores.exp(), 0.0)
        return (weights / weights.sum(dim=-1, keepdim=True)) @ v


class BufferNorm(Norm):
    def __init__(self, d_model: int, device: Any = None, dtype: Any = None):
        super().__init__(d_model, device, dtype)
        self.register_buffer("scale", torch.ones(d_model, device=device))  # float32: 4 bytes each


class QuadraticRotary(Rotary):
    def angle(self, positions: Tensor) -> Tensor:
        return positions.float()[..., None] ** 2 / 32 * self.inv_freq  # planted: not relative


class UndeclaredBias(PositionalEncodingBase):
    def attention_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        return -(q_positions[:, None, :, None] - k_positions[:, None, None, :]).abs().float()


PLANTED = [
    norm("good-norm", Norm),
    attn("good-attn", Attention),
    rotary("good-rotary", Rotary),
    norm("wrong-dtype", DtypeNorm),
    norm("nan", NaNNorm),
    norm("mixing", MixingNorm),
    norm("detached", DetachedNorm),
    norm("unsaved", UnsavedNorm),
    norm("cpu-only", CpuNorm),
    norm("miscounted", Norm, params=lambda d_model: d_model + 1),
    norm("coincidence", Norm, params=lambda d_model: 64),  # right at one shape only
    norm("flop-claim", Norm, flops=lambda d_model, seq_len: 2 * seq_len * d_model),
    norm("compile-changes", CompileNorm),
    norm("needs-arg", ArgNorm, args=(Arg("unused", float, help="required, no default"),)),
    Component(kind="ffn", name="bool-arg", build=lambda d_model, gated=True: Norm(d_model),
              args=(Arg("gated", bool, True),), params=lambda d_model, gated: d_model + gated),
    attn("leaky", LeakyAttention),
    attn("start-aligned", StartAlignedAttention),
    attn("inverted-mask", InvertedMaskAttention),
    attn("biasless", BiaslessAttention),
    attn("tiled-gqa", TiledGQAAttention),
    attn("slow-flops", Attention, flops=lambda num_heads, head_dim, seq_len, kv_len: 4 * num_heads * seq_len**2 * head_dim),
    rotary("quadratic", QuadraticRotary),
    attn("unstable", UnstableAttention),
    norm("wrong-buffers", BufferNorm, buffers=lambda d_model: 2 * d_model),  # float32 is 4 bytes
    Component(kind="pos", name="undeclared-bias", build=UndeclaredBias, features=frozenset({"relative"})),
]  # fmt: skip


class PlantedRegistry:
    """A pytest plugin that hands the kit a registry of the planted components only."""

    def __init__(self, *components: Component):
        self.registry = Registry(autoload=False)
        self.registry.add(*(components or PLANTED), name="planted")

    def pytest_lmcore_registry(self, config: pytest.Config) -> Registry:
        return self.registry


def norm_activations(batch: int, seq_len: int, d_model: int) -> int:
    """What `Norm` keeps: float32 x, x / rms (both (..., d_model)) and rms."""
    return 4 * batch * seq_len * (2 * d_model + 1)


class WithBuiltins(PlantedRegistry):
    """The planted components next to lmcore's built-ins, which the activations check needs to
    build a model around the component under test."""

    def __init__(self, *components: Component):
        self.registry = Registry()
        self.registry.add(*components, name="planted")


class OptionsAttention(Attention):
    """Takes the query scale, soft-capping and the sliding window; ignores the one `ignored`
    names."""

    ignored = ""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, **kw: Any) -> Tensor:
        scale, softcap, window = (None if self.ignored == n else kw.get(n)
                                  for n in ("scale", "softcap", "window"))  # fmt: skip
        k, v = self.expand(k, q.shape[1]), self.expand(v, q.shape[1])
        sq, sk = q.shape[-2], k.shape[-2]
        s = (q @ k.transpose(-2, -1)) * (scale or q.shape[-1] ** -0.5)
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        position = torch.arange(sq)[:, None] + sk - sq
        keep = torch.ones(sq, sk, dtype=torch.bool)
        if causal:
            keep &= torch.arange(sk)[None, :] <= position
        if window:
            keep &= torch.arange(sk)[None, :] > position - window
        if kw.get("mask") is not None:
            keep = keep & kw["mask"]
        if kw.get("bias") is not None:
            s = s + kw["bias"]
        return torch.softmax(s.masked_fill(~keep, -torch.inf), dim=-1) @ v


class NoScale(OptionsAttention):
    ignored = "scale"


class NoSoftcap(OptionsAttention):
    ignored = "softcap"


class NoWindow(OptionsAttention):
    ignored = "window"


class _Block(nn.Module):
    def __init__(self, *, attn: nn.Module, ffn: nn.Module, norm: Any):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.ffn = norm(), attn, norm(), ffn

    def forward(self, x: Tensor, context: Any) -> Tensor:
        y = x + self.attn(self.ln1(x), context)
        return y + self.ffn(self.ln2(y))


class PeekingBlock(_Block):
    """Adds the mean over every position, later ones included."""

    def forward(self, x: Tensor, context: Any) -> Tensor:
        return super().forward(x, context) + x.mean(dim=1, keepdim=True)


class DoublingBlock(_Block):
    """Declares 'residual' but doubles the stream."""

    def forward(self, x: Tensor, context: Any) -> Tensor:
        return super().forward(x, context) + x


class TwiceHeldBlock(_Block):
    """Holds its attention a second time, in a list."""

    def __init__(self, *, attn: nn.Module, ffn: nn.Module, norm: Any):
        super().__init__(attn=attn, ffn=ffn, norm=norm)
        self.again = nn.ModuleList([self.attn])


def block(name: str, build: Any, **kw: Any) -> Component:
    kw.setdefault("norms", lambda: ("ln1", "ln2"))
    kw.setdefault("activations", lambda: 0)
    return Component(kind="block", name=name, build=build, **kw)


KIT_OPTIONS = frozenset({"gqa", "mask", "bias", "scale", "softcap", "window", "compile"})


# (check, component, the facts its failure names): checks that need lmcore's built-ins.
PLANTED_BESIDE_BUILTINS = [
    ("scale", attn("no-scale", NoScale, features=KIT_OPTIONS),
     ("with scale=0.05 (causal=False, Sq=8, Sk=8)", "the output differs from the float64 reference")),
    ("softcap", attn("no-softcap", NoSoftcap, features=KIT_OPTIONS),
     ("with softcap=5.0 (causal=False, Sq=8, Sk=8)", "the output differs from the float64 reference")),
    ("window", attn("no-window", NoWindow, features=KIT_OPTIONS),
     ("with window=1 (causal=False, Sq=8, Sk=8)", "the output differs from the float64 reference")),
    ("residual", block("peeking", PeekingBlock),  # a future leak: the cache check fails too
     ("changing the inputs from position 4 on changed the output before it",
      "a block mixes tokens only through its attention sub-layer")),
    ("residual", block("doubling", DoublingBlock, features=frozenset({"residual"})),
     ("declares 'residual'", "with attn and ffn giving zeros the output is not its input")),
    ("keys", block("twice-held", TwiceHeldBlock),
     ("it holds its parts a second time, as ['again']", "each of attn, ffn and the norms appears once")),
]  # fmt: skip


# Plugins the inner runs do without: hypothesis would be imported anew by each run.
QUIET = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")


def run_kit(pytester: pytest.Pytester, *args: str, plugin: object | None = None) -> dict[str, str]:
    """Run the kit in-process; return {nodeid: outcome or failure text} of every check."""
    rec = pytester.inline_run(
        "--lmcore-conformance", "--lmcore-compile-backend", "eager", *QUIET, *args,
        plugins=[plugin or PlantedRegistry()],
    )  # fmt: skip
    outcomes: dict[str, str] = {}
    for report in rec.getreports("pytest_runtest_logreport"):
        if report.when == "call" or report.outcome != "passed":
            outcomes[report.nodeid] = report.longreprtext if report.failed else report.outcome
    return outcomes


def failures(outcomes: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in outcomes.items() if v not in ("passed", "skipped")}


NODE = "lmcore-conformance::"


# component: {failing test: a regex its message must match}. Every other check must pass.
EXPECTED: dict[str, dict[str, str]] = {
    "wrong-dtype": {
        "test_forward[norm:wrong-dtype-bfloat16]": r"the output is shape \(2, 3, 8, 64\) float32 for bfloat16 input; return the input's dtype",
    },
    "nan": {
        "test_forward[norm:nan-float32]": r"the output has \d+ NaN/inf values on random normal input",
        "test_forward[norm:nan-bfloat16]": r"NaN/inf",
        "test_gradients[norm:nan]": r"the gradient of parameter 'weight' has NaN or inf values on random input",
    },
    "mixing": {
        "test_per_token[norm:mixing]": r"changing the input vector at index \(1, 2, 5\) changed the output at \(1, 2, \d\): a norm maps each \(\.\.\., d_model\) vector on its own",
    },
    "detached": {
        "test_gradients[norm:detached]": r"parameter 'weight' gets no gradient: the forward does not use it, or uses it detached",
    },
    "unsaved": {
        "test_state_dict[norm:unsaved]": r"after a state-dict round trip, output differs .*: the output depends on state the state dict does not hold",
    },
    "cpu-only": {
        "test_meta[norm:cpu-only]": r"built with device='meta', buffer 'eps' is on cpu; pass device= to every tensor",
    },
    "miscounted": {
        "test_params[norm:miscounted]": r"declares params\(d_model=64\) = 65, but the built module has 64 parameters \(weight \(64,\)\); fix the params function",
    },
    "coincidence": {
        "test_params[norm:coincidence]": r"declares params\(d_model=48\) = 64, but the built module has 48 parameters",
    },
    "flop-claim": {
        "test_flops[norm:flop-claim]": r"declares flops\(d_model=64, seq_len=8\) = 1,024, but one forward of a single sequence does 0 matmul FLOPs \(torch.utils.flop_counter.FlopCounterMode\)",
    },
    "compile-changes": {
        "test_compile[norm:compile-changes]": r"compiled with backend='eager', output differs from eager",
    },
    "leaky": {
        "test_causal[attn:leaky]": r"causal=True leaks future tokens: with Sq=8, Sk=8, query 0 \(position 0\) changed by .* when keys/values from position 1 on were perturbed",
        "test_reference[attn:leaky-float32]": r"causal=True, Sq=8, Sk=8, float32: the output differs from the kit's float64 reference, softmax\(q kᵀ / sqrt\(D\)\) v",
        "test_reference[attn:leaky-bfloat16]": r"causal=True",
        "test_mask[attn:leaky]": r"causal=True",
        "test_stability[attn:leaky]": r"with q and k scaled by 30 \(causal=True, Sq=8, Sk=8\), the output differs from the float64 reference",
        "test_bias[attn:leaky]": r"causal=True",
        "test_gqa[attn:leaky]": r"causal=True",
    },
    "start-aligned": {
        "test_causal[attn:start-aligned]": r"causal=True hides visible tokens: with Sq=3, Sk=8, query 0 \(position 5\) did not change",
        "test_reference[attn:start-aligned-float32]": r"causal=True, Sq=3, Sk=8",
        "test_reference[attn:start-aligned-bfloat16]": r"causal=True, Sq=3, Sk=8",
        "test_mask[attn:start-aligned]": r"causal=True, Sq=3, Sk=8",
        "test_stability[attn:start-aligned]": r"causal=True, Sq=3, Sk=8",
        "test_bias[attn:start-aligned]": r"causal=True, Sq=3, Sk=8",
        "test_gqa[attn:start-aligned]": r"causal=True, Sq=3, Sk=8",
    },
    "inverted-mask": {
        "test_mask[attn:inverted-mask]": r"with a \(Sq, Sk\) boolean mask, causal=False, Sq=8, Sk=8: the output differs from the reference: .* lmcore masks are True where a query MAY attend",
        "test_gqa[attn:inverted-mask]": r"per-head mask",
    },
    "biasless": {
        "test_bias[attn:biasless]": r"with a bias of shape \(8, 8\), causal=False, Sq=8, Sk=8: the output differs from softmax\(q kᵀ / sqrt\(D\) \+ bias\) v",
        "test_gqa[attn:biasless]": r"per-head bias",
    },
    "tiled-gqa": {
        "test_gqa[attn:tiled-gqa]": r"with 4 query heads and 2 kv heads .*query head h uses kv head h // 2, as repeat_interleave",
        # The kit runs every check of a 'gqa' kernel with fewer kv heads, so all see the bug.
        "test_reference[attn:tiled-gqa-float32]": r"differs",
        "test_reference[attn:tiled-gqa-bfloat16]": r"differs",
        "test_mask[attn:tiled-gqa]": r"differs",
        "test_stability[attn:tiled-gqa]": r"differs",
        "test_bias[attn:tiled-gqa]": r"differs",
    },
    "slow-flops": {
        "test_flops[attn:slow-flops]": r"declares flops\(num_heads=4, head_dim=16, seq_len=3, kv_len=16\) = 2,304, but one forward of a single sequence does 12,288 matmul FLOPs",
    },
    "quadratic": {
        "test_relative[pos:quadratic]": r"declares 'relative', but q·k after rotation\(positions\) changes when every position is shifted by a constant",
    },
    "unstable": {
        "test_stability[attn:unstable]": r"with q and k scaled by 30 \(causal=False, Sq=8, Sk=8\), \d+ of 1024 outputs are NaN or inf where the float64 reference is finite: subtract each row's maximum score before exp",
    },
    "wrong-buffers": {
        "test_params[norm:wrong-buffers]": r"declares buffers\(d_model=64\) = 128 bytes, but the module built in torch.float32 holds 256 bytes of buffers \(\{'scale': 256\}\); fix the buffers function",
    },
    "undeclared-bias": {
        "test_features[pos:undeclared-bias]": r"attention_bias returns a tensor, but the Component does not declare 'bias'; add it to features",
    },
}


def _module_of_check(test: str) -> str:
    """`lmcore.testing.<module>` holding the check a generated test (`test_params[...]`) runs."""
    import lmcore.testing.checks  # noqa: F401  (importing it registers every check)
    from lmcore.testing import CHECKS

    name = test.split("[")[0].removeprefix("test_")
    [check] = [c for c in CHECKS if c.name == name]
    return check.fn.__module__.rsplit(".", 1)[-1]


def planted_bugs_caught_by(module: str) -> list[str]:
    """The planted components of EXPECTED whose failing checks are all in `lmcore.testing.<module>`."""
    return sorted(
        name
        for name, tests in EXPECTED.items()
        if {_module_of_check(test) for test in tests} == {module}
    )


def beside_builtins_caught_by(module: str) -> list[Any]:
    """The rows of PLANTED_BESIDE_BUILTINS whose check is in `lmcore.testing.<module>`, as params."""
    return [
        pytest.param(check, component, facts, id=f"{check}:{component.name}")
        for check, component, facts in PLANTED_BESIDE_BUILTINS
        if _module_of_check(check) == module
    ]


def assert_planted_bug_fails_its_check(pytester: pytest.Pytester, component: str) -> None:
    """The kit run on `component` fails exactly the tests EXPECTED names, each with its message,
    naming the component and its plugin; every other check passes."""
    outcomes = run_kit(pytester, "--lmcore-component", component)
    assert outcomes, "the kit generated no tests"
    failed = failures(outcomes)
    expected = {NODE + test: pattern for test, pattern in EXPECTED[component].items()}
    assert set(failed) == set(expected), f"unexpected failures: {failed}"
    for nodeid, pattern in expected.items():
        assert re.search(pattern, failed[nodeid]), f"{nodeid}:\n{failed[nodeid]}"
        assert (
            "component: " in failed[nodeid]
            and "registered in-process (plugin 'planted'" in failed[nodeid]
        )


def assert_planted_bug_beside_the_builtins_fails(
    check: str, component: Component, facts: tuple[str, ...]
) -> None:
    """`component`, registered beside lmcore's built-ins, fails `check` naming `facts`; every
    other check passes."""
    from lmcore.testing import ConformanceError, cases

    found = cases(WithBuiltins(component).registry, components=[component.name])
    [case] = [c for c in found if c.check.name == check]
    assert case.skip_reason is None
    with raises_naming(ConformanceError, *facts):
        case.run()
    also = {"residual": {"cache"}}.get(check, set()) if component.name == "peeking" else set()
    for other in found:  # every other check passes
        if other.check.name not in {check, "compile", *also} and other.skip_reason is None:
            other.run()


# ---------------------------------------------------------------------------------------------
# Training: a tiny model and a tiny corpus
# ---------------------------------------------------------------------------------------------

TINY_SPEC = "vocab_size=300, context_length=16, d_model=32, num_layers=2, num_heads=2"


def tiny_corpus(root: Path) -> Path:
    """A small text with structure a tiny model learns in a few hundred steps: a few "functions"
    repeated with small variations, one per document."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(24):
        lines = [
            f"def f{(i + k) % 5}(x):\n    return x * {k % 3} + {(i * k) % 4}\n" for k in range(12)
        ]
        (root / f"doc{i:02d}.py").write_text("".join(lines), encoding="utf-8")
    return root


# ---------------------------------------------------------------------------------------------
# Models and checkpoints: small specs, perturbed weights, files edited on disk
# ---------------------------------------------------------------------------------------------
# (imports here, not at the top: each area appends its own section)

import json  # noqa: E402
import struct  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

import lmcore  # noqa: E402

# A small model: two layers, four heads of 8 dimensions (room for num_kv_heads=2 or 1).
SMALL_SPEC = "vocab_size=97, context_length=16, d_model=32, num_layers=2, num_heads=4, d_ff=64"
# The same with room for a prompt and the tokens generated after it.
DECODING_SPEC = "vocab_size=97, context_length=24, d_model=32, num_layers=2, num_heads=4, d_ff=64"


def decoding_model(spec: str = "", seed: int = 0, registry: Any = None) -> Any:
    """A model of `DECODING_SPEC` with `spec` added ("pos=alibi, num_kv_heads=2"), seeded."""
    torch.manual_seed(seed)
    return lmcore.build_model(
        f"{DECODING_SPEC}, {spec}" if spec else DECODING_SPEC, registry=registry
    )


def perturb(model: torch.nn.Module, scale: float = 0.1) -> Any:
    """`model` with every parameter moved by `scale` times a standard normal (norm gains and
    biases too), so a weight that is not saved, loaded or converted changes the logits."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))
    return model


def perturbed(spec: str, seed: int = 0, **kwargs: Any) -> Any:
    """`lmcore.build_model(spec, **kwargs)`, seeded and perturbed."""
    torch.manual_seed(seed)
    return perturb(lmcore.build_model(spec, **kwargs))


def token_ids(vocab: int = 97, seq: int = 16, seed: int = 1) -> torch.Tensor:
    """Two rows of `seq` token ids, the same at every call."""
    return torch.randint(0, vocab, (2, seq), generator=torch.Generator().manual_seed(seed))


def rewrite(
    path: Path,
    *,
    metadata: Callable[[dict[str, str]], dict[str, str]] | None = None,
    tensors: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
    out: Path | None = None,
) -> Path:
    """Save a copy of a safetensors file (over it unless `out`) with its metadata and/or its
    tensors changed; changed tensors get checksums of their own, so the file is consistent in
    itself and the checks after the integrity check see the change."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from lmcore.model.saving import checksums_json

    with safe_open(str(path), "pt") as f:
        meta = dict(f.metadata())
    state = load_file(str(path))
    meta = metadata(meta) if metadata else meta
    if tensors:
        state = tensors(state)
        if "lmcore.checksums" in meta:
            meta["lmcore.checksums"] = checksums_json(state)
    out = out or path
    save_file(state, str(out), metadata=meta)
    return out


def edit(
    path: Path,
    out: Path,
    *,
    header: Callable[[dict[str, Any]], None] | None = None,
    data: Callable[[dict[str, Any], bytearray], None] | None = None,
) -> Path:
    """A copy of a safetensors file with its JSON header and/or its data bytes changed in
    place, the way a damaged disk or a hand edit changes them (checksums untouched)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    parsed, body = json.loads(raw[8 : 8 + n]), bytearray(raw[8 + n :])
    if header:
        header(parsed)
    if data:
        data(parsed, body)
    text = json.dumps(parsed).encode()
    text += b" " * (-len(text) % 8)
    out.write_bytes(struct.pack("<Q", len(text)) + text + bytes(body))
    return out


# The components and a norm of the tests' own, for the declarations of every component


def components() -> list[tuple[str, str]]:
    """Every registered component, so newly installed plugins are tested without editing this."""
    return sorted({(e.kind, e.name) for e in lmcore.get_registry().entries()})


def spec_for(kind: str, name: str) -> str:
    """cs336-tiny with the component `kind` `name`; skips one that has no default to build."""
    entry = next(e for e in lmcore.get_registry().entries(kind) if e.name == name)
    required = [a.name for a in entry.component.args if a.required]
    if required:
        pytest.skip(f"{kind} {name!r} needs argument(s) {', '.join(required)}: no default to build")
    qualified = f"{entry.provenance.qualifier}:{name}" if entry.status == "shadowed" else name
    return f"cs336-tiny, {kind}={qualified}"


class PlainNorm(torch.nn.Module):
    """An RMS norm in float32 for the tests' own components."""

    def __init__(
        self, d_model: int, device: torch.device | None = None, dtype: torch.dtype | None = None
    ):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 / torch.sqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight).to(
            x.dtype
        )


@contextmanager
def warns_naming(
    warning_type: type[Warning], *facts: str | re.Pattern[str]
) -> Iterator[pytest.WarningsRecorder]:
    """`raises_naming` for a warning: like `pytest.warns(warning_type)`, and one of the warnings
    of that type names every fact (a plain substring or a compiled regex)."""
    with pytest.warns(warning_type) as record:
        yield record
    messages = [str(w.message) for w in record if issubclass(w.category, warning_type)]

    def names(message: str, fact: str | re.Pattern[str]) -> bool:
        return fact.search(message) is not None if isinstance(fact, re.Pattern) else fact in message

    if not any(all(names(m, f) for f in facts) for m in messages):
        shown = "\n".join(messages)
        raise AssertionError(
            f"no {warning_type.__name__} names all of {facts!r}; they say:\n{shown}"
        )


def non_finite_checkpoint(directory: Path) -> Path:
    """A checkpoint of `SMALL_SPEC` whose ln_final holds a NaN and lm_head two infs, saved so
    (its checksums agree): loading it warns, naming them."""
    model = lmcore.build_model(SMALL_SPEC)
    with torch.no_grad():
        model.ln_final.weight[3] = float("nan")
        model.lm_head.weight[0, :2] = float("inf")
    path: Path = model.save(directory / "nan.safetensors")
    return path


def nest_components(parsed: dict[str, Any]) -> None:
    """For `edit`'s header: a components table nested 50,000 deep, more than Python's JSON
    parser follows."""
    parsed["__metadata__"]["lmcore.components"] = "[" * 50_000 + "]" * 50_000


# ---------------------------------------------------------------------------------------------
# Hugging Face interop: tiny random transformers models, saved as model directories
# ---------------------------------------------------------------------------------------------


def quiet_transformers() -> Any:
    """transformers (a test-only dependency; a module that calls this at import is skipped
    without it), its logging and progress bars silenced."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


# The lmcore spec of `random_llama`'s model, and the logits both must give (float32).
HF_SPEC = "vocab_size=97, context_length=32, d_model=32, num_layers=2, num_heads=4, d_ff=48"
HF_TOLERANCE = 1e-5  # max abs logit difference

LLAMA_V4 = {  # a transformers 4 config.json
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 97,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32,
    "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1,
    "eos_token_id": 2, "pretraining_tp": 1, "transformers_version": "4.45.0",
}  # fmt: skip


def random_llama(
    directory: Path, *, kv_heads: int = 2, tie: bool = False, shard: bool = False, **config: Any
) -> Any:
    """A small random Llama, every weight perturbed (RMSNorm gains too), saved to `directory`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=32,
        rms_norm_eps=1e-5, rope_theta=500.0, tie_word_embeddings=tie, **config,
    )  # fmt: skip
    model = perturb(LlamaForCausalLM(cfg).eval())
    model.save_pretrained(directory, max_shard_size="20KB" if shard else "5GB")
    return model


def hf_logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits: torch.Tensor = model(ids).logits
    return logits


def lm_logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits: torch.Tensor = model(ids)
    return logits


# One tiny config per family lmcore converts, each using what sets the family apart.
HF_VOCAB = 97
_SIZES: dict[str, Any] = dict(
    vocab_size=HF_VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
)  # fmt: skip
_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 16}  # fmt: skip
FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": dict(_SIZES, rope_scaling=_LLAMA3, rope_theta=500.0),
    "mistral": dict(_SIZES, sliding_window=6),
    "qwen2": dict(_SIZES, use_sliding_window=True, sliding_window=6, max_window_layers=1),
    "qwen3": dict(_SIZES, head_dim=16, tie_word_embeddings=True),
    "gemma": dict(_SIZES, head_dim=8),
    "gemma2": dict(_SIZES, head_dim=8, sliding_window=6, query_pre_attn_scalar=8,
                   attn_logit_softcapping=5.0, final_logit_softcapping=3.0),
    "olmo2": dict(_SIZES),
    "phi3": dict(_SIZES, partial_rotary_factor=0.5, pad_token_id=0),
    "gpt2": dict(vocab_size=HF_VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                 scale_attn_by_inverse_layer_idx=True),
    "gpt_neox": dict(vocab_size=HF_VOCAB, hidden_size=32, intermediate_size=64,
                     num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
                     rotary_pct=0.5),
    "mixtral": dict(_SIZES, num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(_SIZES, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                      head_dim=8, norm_topk_prob=True, mlp_only_layers=[1]),
}  # fmt: skip


def random_family_model(name: str, directory: Path) -> Any:
    """A tiny random model of family `name` (`FAMILY_CONFIGS`), eager attention, every weight
    perturbed (norm gains and biases too, so they matter), saved to `directory`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(name, **FAMILY_CONFIGS[name])
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    perturb(model)
    model.save_pretrained(directory)
    return model


# ---------------------------------------------------------------------------------------------
# GGUF interop: files written as llama.cpp's converter writes them, by code here, not lmcore
# ---------------------------------------------------------------------------------------------


def needs_gguf() -> Any:
    """The `gguf` package; a module that calls this at import is skipped without the extra."""
    reason = "needs the 'gguf' extra: pip install -e '.[gguf]'"
    pytest.importorskip("jinja2", reason=reason)
    return pytest.importorskip("gguf", reason=reason)


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "Hello world, the cat sat on the mat.",
    "Numbers 12345 and 3.14159; emoji 🙂 and accents: café naïve.",
    "  leading spaces\n\nnew lines\ttabs   and trailing ",
    "<|im_start|>user\nHi there<|im_end|>\n",
    "don't won't it's WE'LL THEY'RE",
]
GGUF_IDS = torch.tensor([[1, 5, 9, 2, 77, 31, 4, 100, 64, 12, 3, 8]])


def perturb_norms(model: Any) -> Any:
    """`model` with norm gains that are not all ones and biases that are not all zeros."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def hf_llama(d: int = 64, ff: int = 128, vocab: int = 128, tied: bool = False) -> Any:
    """A random transformers Llama, norms perturbed, two layers of 4 heads and 2 k/v heads."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=ff,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    return perturb_norms(transformers.LlamaForCausalLM(config).eval())


def hf_qwen(model_type: str, head_dim: int | None = None) -> Any:
    """A tiny random Qwen 2 (q/k/v biases) or Qwen 3 (q/k norms), norms and biases perturbed."""
    import transformers

    config = transformers.AutoConfig.for_model(
        model_type,
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        **({} if head_dim is None else {"head_dim": head_dim}),
    )
    torch.manual_seed(0)
    return perturb_norms(transformers.AutoModelForCausalLM.from_config(config).eval())


def _add_shape(w: Any, c: Any, rope_theta: float = 10000.0) -> None:
    """The architecture's metadata of config `c`, as llama.cpp's converter writes it."""
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(rope_theta)
    w.add_rope_dimension_count(
        getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    )
    w.add_vocab_size(c.vocab_size)


def _permute(w: Any, heads: int) -> Any:
    """llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _k_quant(rows: int, cols: int, qtype: Any, rng: Any) -> Any:
    """Random blocks of a K-quant (gguf's Python cannot quantize them), with sane f16 scales."""
    import gguf
    import numpy as np

    T = gguf.GGMLQuantizationType
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    scale = np.array([0.0004], dtype=np.float16).view(np.uint8)
    at = {T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (size - 2,)}[qtype]
    for offset in at:
        raw[..., offset : offset + 2] = scale
    return raw.reshape(rows, -1)


_GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _gguf_name(hf: str) -> str:
    if hf in _GGUF_NAMES:
        return _GGUF_NAMES[hf]
    _, _, i, module, *rest = hf.split(".")
    key = f"{module}.{rest[0]}" if module in ("self_attn", "mlp") else module
    return f"blk.{i}.{_GGUF_NAMES[key]}.weight"


def write_llama(
    path: Path,
    model: Any,
    qtype: Any = None,
    *,
    tokenizer: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, torch.Tensor]:
    """`model` as llama.cpp writes a Llama (`qtype`: a `gguf.GGMLQuantizationType`, F32 unless
    given); returns the weights the file holds, dequantized, in Hugging Face's names and row
    order (the reference)."""
    import gguf
    import numpy as np

    T = gguf.GGMLQuantizationType
    qtype = T.F32 if qtype is None else qtype
    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    _add_shape(w, c)  # rope_theta as hf_llama sets it
    w.add_name("tiny")
    for key, value in (extra or {}).items():
        w.add_uint32(key, value)
    for key, value in (tokenizer or {}).items():
        if isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_string(key, value)
    rng = np.random.default_rng(0)
    held = {}
    for name, p in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        x = p.detach().numpy().astype(np.float32)
        if "q_proj" in name:
            x = _permute(x, c.num_attention_heads)
        elif "k_proj" in name:
            x = _permute(x, c.num_key_value_heads)
        kind = qtype if x.ndim == 2 else T.F32
        if kind in (T.Q4_K, T.Q5_K, T.Q6_K):
            raw = _k_quant(*x.shape, kind, rng)
        else:
            raw = gguf.quants.quantize(x, kind)
        w.add_tensor(_gguf_name(name), raw, raw_dtype=None if kind in (T.F32, T.F16) else kind)
        back = gguf.quants.dequantize(raw, kind).reshape(x.shape).astype(np.float32)
        if "q_proj" in name or "k_proj" in name:  # undo the permutation: rows move whole
            heads = c.num_attention_heads if "q_proj" in name else c.num_key_value_heads
            inverse = np.argsort(_permute(np.arange(x.shape[0]), heads))
            back = back[inverse]
        held[name] = torch.from_numpy(back.copy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


def write_by_gguf_map(path: Path, model: Any, arch: Any) -> None:
    """`model` in float32 under the tensor names gguf's own map gives (llama.cpp's converter
    uses it), rows as Hugging Face holds them: Qwen's converters do not permute q and k."""
    import gguf
    import numpy as np

    c = model.config
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    _add_shape(w, c)  # rope_theta as hf_qwen sets it
    if arch == gguf.MODEL_ARCH.QWEN3:
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    names = gguf.get_tensor_name_map(arch, c.num_hidden_layers)
    for name, p in model.state_dict().items():
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert target is not None, name
        w.add_tensor(target, p.detach().numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def reference_logits(model: Any, held: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    """The transformers model's logits with the weights a GGUF file holds (`write_llama`)."""
    model.load_state_dict(held, strict=False)
    if model.config.tie_word_embeddings:
        model.tie_weights()
    with torch.no_grad():
        logits: torch.Tensor = model(ids).logits
    return logits


def byte_level_bpe() -> Any:
    """A SmolLM-style tokenizer: digits split one by one, then GPT-2's byte-level BPE."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    return tok


def ggml_tokenizer(tok: Any) -> dict[str, Any]:
    """`tokenizer.ggml.*` as llama.cpp's converter writes them for a byte-level BPE."""
    config = json.loads(tok.to_str())
    vocab = tok.get_vocab()
    by_id = sorted(vocab, key=vocab.__getitem__)
    special = {t["content"] for t in config["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in config["model"]["merges"]]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": by_id,
        "tokenizer.ggml.token_type": [3 if t in special else 1 for t in by_id],
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": vocab["<|im_start|>"],
        "tokenizer.ggml.eos_token_id": vocab["<|im_end|>"],
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHATML,
    }
