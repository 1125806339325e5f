"""The conformance kit catches bugs: each planted-bug component fails exactly the check for its
bug, with a message that names it. Runs pytest in-process (pytester) with `--lmcore-conformance`
and a registry holding only the planted components.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from lmcore import Arg, Component, Registry
from lmcore.interfaces import PositionalEncodingBase
from lmcore.model.nn import scaled_dot_product_attention

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True, scope="module")
def _kit_warmed_up() -> None:
    """pytester's in-process runs unload every module first imported inside them, and torch's
    compiler cannot be imported twice: run the kit once here first, so that every module it
    needs is loaded for good (and is not re-imported by each run)."""
    from lmcore.testing import Settings, cases

    for case in cases(PlantedRegistry(*PLANTED[:3]).registry):
        if case.skip_reason is None:
            case.run(Settings(compile_backend="eager"))


# ------------------------------------------------------------------ healthy components


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


# ------------------------------------------------------------------ planted bugs


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


@pytest.mark.parametrize("component", sorted(EXPECTED))
def test_each_planted_bug_fails_its_check_and_names_it(
    pytester: pytest.Pytester, component: str
) -> None:
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


@pytest.mark.parametrize("component", ["good-norm", "good-attn", "good-rotary"])
def test_correct_components_pass_every_check(pytester: pytest.Pytester, component: str) -> None:
    outcomes = run_kit(pytester, "--lmcore-component", component)
    # The activations check needs a declaration, which these components leave out (optional);
    # the cache check a model around them, which the planted-only registry cannot build.
    skipped = {k for k, v in outcomes.items() if v == "skipped"}
    assert sorted(k.split("[")[0] for k in skipped) == [
        NODE + "test_activations",
        NODE + "test_cache",
    ]
    assert outcomes and {v for k, v in outcomes.items() if k not in skipped} == {"passed"}, (
        failures(outcomes)
    )


def norm_activations(batch: int, seq_len: int, d_model: int) -> int:
    """What `Norm` keeps: float32 x, x / rms (both (..., d_model)) and rms."""
    return 4 * batch * seq_len * (2 * d_model + 1)


class WithBuiltins(PlantedRegistry):
    """The planted components next to lmcore's built-ins, which the activations check needs to
    build a model around the component under test."""

    def __init__(self, *components: Component):
        self.registry = Registry()
        self.registry.add(*components, name="planted")


def test_a_right_activations_declaration_passes(pytester: pytest.Pytester) -> None:
    good = norm("counted", Norm, activations=norm_activations)
    outcomes = run_kit(pytester, "--lmcore-component", "counted", plugin=WithBuiltins(good))
    assert outcomes[NODE + "test_activations[norm:counted]"] == "passed"


def test_a_wrong_activations_declaration_fails_and_names_it(pytester: pytest.Pytester) -> None:
    # Forgets rms, the (..., 1) tensor: off by 4 bytes a token.
    bad = norm(
        "forgetful", Norm, activations=lambda batch, seq_len, d_model: 8 * batch * seq_len * d_model
    )
    outcomes = run_kit(pytester, "--lmcore-component", "forgetful", plugin=WithBuiltins(bad))
    assert failures(outcomes).keys() == {NODE + "test_activations[norm:forgetful]"}
    assert re.search(
        r"declares activations\(d_model=64, batch=1, seq_len=8\) = 4,096 bytes, but in the model "
        r"'vocab_size=97, context_length=32, d_model=64, num_layers=2, num_heads=4, num_kv_heads=4, "
        r"d_ff=128, norm=forgetful' autograd keeps 4,128 bytes for it \(layers\.\*\.ln1, "
        r"measured on the meta device as lmcore describe --measure does\); fix the activations "
        r"function of the Component",
        outcomes[NODE + "test_activations[norm:forgetful]"],
    )


class StartPositions(PositionalEncodingBase):
    """Planted: embeds at 0..T-1 whatever positions it is given (right for a full forward, wrong
    for the tokens after a KV cache)."""

    def __init__(self, d_model: int, context_length: int, device: Any = None):
        super().__init__()
        self.table = torch.randn(context_length, d_model, device=device)

    def embed(self, x: Tensor, token_positions: Tensor) -> Tensor:
        return x + self.table[: x.shape[1]].to(x.dtype)


@pytest.mark.parametrize(
    ("component", "pattern"),
    [
        (
            Component(kind="pos", name="start-positions", build=StartPositions,
                      features=frozenset({"absolute"})),
            r"with a KV cache, 2 new token\(s\) after 5 cached ones \(attn gets Sq=2, Sk=7\) do "
            r"not give the logits of a full forward: .* the pos hooks use the positions they are "
            r"given",
        ),
        (
            attn("start-aligned", StartAlignedAttention),  # its other checks fail too
            r"2 new token\(s\) after 5 cached ones \(attn gets Sq=2, Sk=7\) .*The kernel must "
            r"align causal queries to the end of the keys",
        ),
    ],
    ids=["pos", "attn"],
)  # fmt: skip
def test_a_component_that_breaks_the_cache_fails_and_names_it(
    component: Component, pattern: str
) -> None:
    from lmcore.testing import ConformanceError, cases

    registry = WithBuiltins(component).registry
    [case] = [c for c in cases(registry, components=[component.name]) if c.check.name == "cache"]
    assert case.skip_reason is None
    with pytest.raises(ConformanceError, match=pattern):
        case.run()
    # Declared, the check has nothing to hold it to (generation refuses it instead).
    declared = dataclasses.replace(component, features=component.features | {"nocache"})
    registry = WithBuiltins(declared).registry
    [case] = [c for c in cases(registry, components=[component.name]) if c.check.name == "cache"]
    case.run()


def test_the_cache_check_skips_where_no_model_can_be_built_around_the_component() -> None:
    from lmcore.testing import cases

    [case] = [c for c in cases(PlantedRegistry(PLANTED[0]).registry) if c.check.name == "cache"]
    assert case.skip_reason == (
        "the check builds a model around norm:good-norm, but the registry lacks the default block "
        "'prenorm', ffn "
        "'swiglu', pos 'rope', attn 'sdpa' for the other slots (lmcore's built-ins are not loaded)"
    )


def test_a_component_that_counts_a_tensor_the_next_layer_saves_fails() -> None:
    """Rows agree one by one, yet the total does not: the norm saves its own output, which the
    attention projections save too, and declares it."""
    from lmcore.testing import ConformanceError, cases

    class SavesOutput(Norm):
        def forward(self, x: Tensor) -> Tensor:
            return torch.sigmoid(self.normalise(x)).to(x.dtype)  # sigmoid keeps its output

    def declared(batch: int, seq_len: int, d_model: int) -> int:
        sigmoid_out = 4 * batch * seq_len * d_model  # float32; in float32 models also the output
        return norm_activations(batch, seq_len, d_model) + sigmoid_out

    registry = WithBuiltins(norm("greedy", SavesOutput, activations=declared)).registry
    [case] = [c for c in cases(registry, components=["greedy"]) if c.check.name == "activations"]
    with pytest.raises(
        ConformanceError,
        match=r"keeps [\d,]+ bytes where the declarations add up to [\d,]+: the component's output is probably also saved by the next layer",
    ):
        case.run()


def test_every_check_is_shown_failing_by_some_planted_bug() -> None:
    from lmcore.testing import CHECKS

    caught = {
        test.split("[")[0].removeprefix("test_") for tests in EXPECTED.values() for test in tests
    }
    caught.add("build")  # test_a_module_that_is_not_a_positional_encoding_fails_build
    caught.add("activations")  # test_a_wrong_activations_declaration_fails_and_names_it
    caught.add("cache")  # test_a_component_that_breaks_the_cache_fails_and_names_it
    caught |= {name for name, *_ in PLANTED_BESIDE_BUILTINS}  # the test after this one
    assert caught == {c.name for c in CHECKS}


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


OPTIONS = frozenset({"gqa", "mask", "bias", "scale", "softcap", "window", "compile"})
# (check, component, a regex the failure must match): checks that need lmcore's built-ins.
PLANTED_BESIDE_BUILTINS = [
    ("scale", attn("no-scale", NoScale, features=OPTIONS),
     r"with scale=0.05 \(causal=False, Sq=8, Sk=8\), the output differs from the float64 reference"),
    ("softcap", attn("no-softcap", NoSoftcap, features=OPTIONS),
     r"with softcap=5.0 \(causal=False, Sq=8, Sk=8\), the output differs from the float64 reference"),
    ("window", attn("no-window", NoWindow, features=OPTIONS),
     r"with window=1 \(causal=False, Sq=8, Sk=8\), the output differs from the float64 reference"),
    ("residual", block("peeking", PeekingBlock),  # a future leak: the cache check fails too
     r"changing the inputs from position 4 on changed the output before it .*: a block mixes tokens only through its attention sub-layer"),
    ("residual", block("doubling", DoublingBlock, features=frozenset({"residual"})),
     r"declares 'residual', but with attn and ffn giving zeros the output is not its input"),
    ("keys", block("twice-held", TwiceHeldBlock),
     r"it holds its parts a second time, as \['again'\]: each of attn, ffn and the norms appears once"),
]  # fmt: skip


@pytest.mark.parametrize(("check", "component", "pattern"), PLANTED_BESIDE_BUILTINS)
def test_each_planted_bug_beside_the_builtins_fails_its_check(
    check: str, component: Component, pattern: str
) -> None:
    from lmcore.testing import ConformanceError, cases

    found = cases(WithBuiltins(component).registry, components=[component.name])
    [case] = [c for c in found if c.check.name == check]
    assert case.skip_reason is None
    with pytest.raises(ConformanceError, match=pattern):
        case.run()
    also = {"residual": {"cache"}}.get(check, set()) if component.name == "peeking" else set()
    for other in found:  # every other check passes
        if other.check.name not in {check, "compile", *also} and other.skip_reason is None:
            other.run()


def test_a_module_that_is_not_a_positional_encoding_fails_build(pytester: pytest.Pytester) -> None:
    bad = Component(kind="pos", name="plain", build=lambda: nn.Identity())
    outcomes = run_kit(pytester, plugin=PlantedRegistry(bad))
    assert re.search(
        r"Identity does not implement lmcore.interfaces.PositionalEncoding \(missing embed, rotation, "
        r"attention_bias\); subclass lmcore.interfaces.PositionalEncodingBase",
        outcomes[NODE + "test_build[pos:plain]"],
    )


# ------------------------------------------------------------------ ids and selection


def test_ids_name_the_check_the_component_and_the_variant(pytester: pytest.Pytester) -> None:
    outcomes = run_kit(pytester, "--lmcore-component", "good-norm")
    assert sorted(outcomes) == [
        NODE + f"test_{t}[norm:good-norm{v}]"
        for t, v in sorted([
            ("activations", ""), ("build", ""), ("cache", ""), ("compile", ""), ("flops", ""),
            ("forward", "-bfloat16"),
            ("forward", "-float32"), ("gradients", ""), ("meta", ""), ("params", ""),
            ("per_token", ""), ("state_dict", ""),
        ])
    ]  # fmt: skip


def test_a_boolean_argument_is_also_checked_flipped(pytester: pytest.Pytester) -> None:
    outcomes = run_kit(pytester, "--lmcore-component", "bool-arg")
    assert outcomes[NODE + "test_params[ffn:bool-arg(gated=false)]"] == "passed"
    assert outcomes[NODE + "test_params[ffn:bool-arg]"].startswith(
        "declares params(d_model=64, gated=True) = 65"
    )
    assert NODE + "test_compile[ffn:bool-arg(gated=false)]" not in outcomes  # defaults only


def test_a_required_argument_without_default_skips_with_the_reason(
    pytester: pytest.Pytester,
) -> None:
    result = pytester.runpytest(
        *QUIET, "--lmcore-conformance", "--lmcore-component", "needs-arg", "-rs",
        plugins=[PlantedRegistry()],
    )  # fmt: skip
    result.assert_outcomes(skipped=12)
    result.stdout.fnmatch_lines(
        [
            "*norm:needs-arg has required argument(s) unused with no default; the conformance kit builds components from their declared defaults*"
        ]
    )


def test_kind_selects(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(
        *QUIET,
        "--lmcore-conformance",
        "--lmcore-kind",
        "pos",
        "--collect-only",
        "-q",
        plugins=[PlantedRegistry()],
    )
    names = {line for line in result.outlines if line.startswith(NODE)}
    assert names and all("[pos:" in n for n in names)
    targets = {re.sub(r"-(float32|bfloat16)$", "", n.split("[")[1].rstrip("]")) for n in names}
    assert targets == {"pos:good-rotary", "pos:quadratic", "pos:undeclared-bias"}


def test_dist_qualified_selection_and_ambiguous_names(pytester: pytest.Pytester) -> None:
    plugin = PlantedRegistry(norm("twin", Norm))
    plugin.registry.add(norm("twin", Norm), name="other")
    outcomes = run_kit(pytester, "--lmcore-component", "other:twin", "-k", "params", plugin=plugin)
    assert outcomes == {NODE + "test_params[norm:other:twin]": "passed"}
    both = run_kit(pytester, "--lmcore-component", "twin", "-k", "params", plugin=plugin)
    assert set(both) == {
        NODE + "test_params[norm:planted:twin]",
        NODE + "test_params[norm:other:twin]",
    }


def test_k_and_m_select_among_generated_tests(pytester: pytest.Pytester) -> None:
    outcomes = run_kit(pytester, "-k", "forward and good-attn and bfloat16")
    assert list(outcomes) == [NODE + "test_forward[attn:good-attn-bfloat16]"]
    pytester.makepyfile(test_mine="def test_mine(): pass")
    result = pytester.runpytest(
        *QUIET, "--lmcore-conformance", "-m", "not lmcore_conformance", plugins=[PlantedRegistry()]
    )
    counts = result.parseoutcomes()
    assert counts["passed"] == 1 and counts["deselected"] > 100, counts


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--lmcore-kind", "nrom"],
            r"--lmcore-kind 'nrom' is not a component kind \(did you mean 'norm'\?\); kinds are attn, block, ffn, norm, pos",
        ),
        (
            ["--lmcore-component", "leaki"],
            r"--lmcore-component 'leaki' matches no registered component \(did you mean 'leaky'\?\); registered: .*planted:leaky.* \(`lmcore plugins` lists them",
        ),
        (
            ["--lmcore-component", "elsewhere:leaky"],
            r"--lmcore-component 'elsewhere:leaky' matches no registered component.*registered: .*planted:leaky",
        ),
        (
            ["--lmcore-kind", "attn", "--lmcore-component", "good-norm"],
            r"'good-norm' matches no registered component of kind attn",
        ),
    ],
)
def test_a_selection_that_matches_nothing_is_a_usage_error(
    pytester: pytest.Pytester, args: list[str], message: str
) -> None:
    result = pytester.runpytest(*QUIET, "--lmcore-conformance", *args, plugins=[PlantedRegistry()])
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert re.search(message, result.stderr.str()), result.stderr.str()


@pytest.mark.parametrize(
    "flag", ["--lmcore-kind=norm", "--lmcore-component=rmsnorm", "--lmcore-compile-backend=eager"]
)
def test_selection_flags_without_the_switch_are_a_usage_error(
    pytester: pytest.Pytester, flag: str
) -> None:
    result = pytester.runpytest(*QUIET, flag)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"*{flag.split('=')[0]} * has no effect without --lmcore-conformance; add --lmcore-conformance*"
        ]
    )


def test_off_by_default_it_adds_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mine="def test_mine(): pass")
    result = pytester.runpytest(*QUIET, plugins=[PlantedRegistry()])
    result.assert_outcomes(passed=1)
    assert "lmcore conformance" not in result.stdout.str()


def test_off_by_default_it_loads_neither_the_checks_nor_any_plugin(
    pytester: pytest.Pytester,
) -> None:
    """In a fresh process: the pytest11 plugin is loaded, yet no check module and no lmcore plugin
    is imported unless --lmcore-conformance is given (what it costs is importing lmcore itself)."""
    pytester.makepyfile(
        test_probe="""
        import sys
        def test_probe(pytestconfig):
            assert pytestconfig.pluginmanager.has_plugin("lmcore")
            loaded = sorted(m for m in sys.modules if m.startswith(("lmcore.testing.", "lmcore_")))
            assert loaded == ["lmcore.testing.hooks", "lmcore.testing.plugin"], loaded
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_header_names_the_selection_and_backend(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(
        *QUIET, "--lmcore-conformance", "--lmcore-kind", "norm", "--lmcore-compile-backend", "eager", "--co",
        plugins=[PlantedRegistry()],
    )  # fmt: skip
    result.stdout.fnmatch_lines(
        ["lmcore conformance: kinds norm; components all; compile backend eager"]
    )


def test_the_backend_can_come_from_the_ini_file(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nlmcore_compile_backend = aot_eager\n")
    result = pytester.runpytest(*QUIET, "--lmcore-conformance", "--co", plugins=[PlantedRegistry()])
    result.stdout.fnmatch_lines(["*compile backend aot_eager"])


def test_failure_report_leads_with_the_broken_contract(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(
        *QUIET, "--lmcore-conformance", "--lmcore-compile-backend", "eager", "--lmcore-component", "wrong-dtype",
        plugins=[PlantedRegistry()],
    )  # fmt: skip
    result.assert_outcomes(failed=1, passed=9, skipped=2)  # activations, cache: see above
    result.stdout.fnmatch_lines([
        "*_ lmcore-conformance::test_forward[[]norm:wrong-dtype-bfloat16[]] _*",
        "the output is shape (2, 3, 8, 64) float32 for bfloat16 input; return the input's dtype*",
        "  contract:  Outputs keep the input's shape and dtype and are finite on random input.",
        "  component: norm 'wrong-dtype' from registered in-process (plugin 'planted', module *)",
        "FAILED lmcore-conformance::test_forward[[]norm:wrong-dtype-bfloat16[]]*",
    ])  # fmt: skip


def test_the_python_api_runs_a_case_without_pytest() -> None:
    from lmcore.testing import ConformanceError, cases

    registry = PlantedRegistry().registry
    [case] = [c for c in cases(registry, components=["miscounted"]) if c.check.name == "params"]
    assert case.name == "test_params[norm:miscounted]"
    state = torch.random.get_rng_state()
    with pytest.raises(ConformanceError, match=r"declares params\(d_model=64\) = 65"):
        case.run()
    assert torch.equal(torch.random.get_rng_state(), state), (
        "a case must not disturb the caller's RNG"
    )


def test_running_a_case_pytest_would_skip_raises_case_skipped_with_the_reason() -> None:
    """`Case.run` used to build the component anyway and crash with a TypeError."""
    from lmcore.testing import CaseSkipped, cases

    found = cases(PlantedRegistry().registry, components=["needs-arg"])
    assert found and all(case.skip_reason for case in found)
    for case in found:
        with pytest.raises(
            CaseSkipped,
            match=r"^test_\w+\[norm:needs-arg[^\]]*\] cannot run: norm:needs-arg has required "
            r"argument\(s\) unused with no default; the conformance kit builds components from "
            r"their declared defaults$",
        ) as caught:
            case.run()
        assert caught.value.reason == case.skip_reason
