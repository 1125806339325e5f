"""The conformance kit's tests: healthy components, planted bugs, the kit run in-process."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from lmcore import Arg, Component, Registry
from lmcore.interfaces import PositionalEncodingBase
from lmcore.model.nn import scaled_dot_product_attention
from lmcore.model.roles import GAIN, MATRIX, Role
from tests.helpers.errors import raises_naming

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

    def parameter_roles(self) -> dict[str, Role]:
        return {"weight": GAIN}


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


class RolelessNorm(Norm):
    def parameter_roles(self) -> dict[str, Role]:
        return {}  # planted: declares no role for its gain


class MatrixGainNorm(Norm):
    def parameter_roles(self) -> dict[str, Role]:
        return {"weight": MATRIX}  # planted: a vector declared a matrix


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
    norm("roleless", RolelessNorm),
    norm("matrix-gain", MatrixGainNorm),
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
    """Takes the query scale, soft-capping, the sliding window and sinks; ignores the one
    `ignored` names."""

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
        s = s.masked_fill(~keep, -torch.inf)
        sinks = None if self.ignored == "sinks" else kw.get("sinks")
        if sinks is not None:  # one more column per row, dropped after the softmax
            sink = sinks.view(1, -1, 1, 1).expand(*s.shape[:-1], 1)
            return torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1] @ v
        return torch.softmax(s, dim=-1) @ v


class NoScale(OptionsAttention):
    ignored = "scale"


class NoSoftcap(OptionsAttention):
    ignored = "softcap"


class NoWindow(OptionsAttention):
    ignored = "window"


class NoSinks(OptionsAttention):
    ignored = "sinks"


class DocumentBlindAttention(OptionsAttention):
    """Declares 'documents' but ignores them: every query sees every earlier key of the row."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, **kw: Any) -> Tensor:
        kw.pop("documents", None)  # planted: the document mask is dropped
        return super().forward(q, k, v, causal=causal, **kw)


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


KIT_OPTIONS = frozenset(
    {"gqa", "mask", "bias", "scale", "softcap", "window", "sinks", "compile"}
)


# (check, component, the facts its failure names): checks that need lmcore's built-ins.
PLANTED_BESIDE_BUILTINS = [
    ("scale", attn("no-scale", NoScale, features=KIT_OPTIONS),
     ("with scale=0.05 (causal=False, Sq=8, Sk=8)", "the output differs from the float64 reference")),
    ("softcap", attn("no-softcap", NoSoftcap, features=KIT_OPTIONS),
     ("with softcap=5.0 (causal=False, Sq=8, Sk=8)", "the output differs from the float64 reference")),
    ("window", attn("no-window", NoWindow, features=KIT_OPTIONS),
     ("with window=1 (causal=False, Sq=8, Sk=8)", "the output differs from the float64 reference")),
    ("sinks", attn("no-sinks", NoSinks, features=KIT_OPTIONS),
     ("with sinks=[-30.0, -10.0, 10.0, 30.0] (causal=False, Sq=8, Sk=8)",
      "the output differs from the float64 reference")),
    ("documents", attn("document-blind", DocumentBlindAttention, features=KIT_OPTIONS | {"documents"}),
     ("attn=document-blind", "changing the tokens of document 1 changed the logits of document 2",
      "information crosses a document boundary")),
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
    "roleless": {
        "test_roles[norm:roleless]": r"parameter 'weight' has no role: RolelessNorm should declare it in parameter_roles\(\) \(\{'weight': \.\.\.\}; roles are bias, conv, .*; the optimizer, weight decay and learning-rate multipliers go by roles",
    },
    "matrix-gain": {
        "test_roles[norm:matrix-gain]": r"a matrix needs a tensor of at least 2 dimensions, got shape \(64,\)",
    },
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
