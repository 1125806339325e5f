"""From-scratch primitives (CS336 assignment 1): Linear, Embedding, softmax, silu, gelu, attention.

Only `nn.Module`, `nn.Parameter`, `torch.nn.init` and plain tensor ops are used here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from lmcore.model.roles import BIAS, EMBEDDING, MATRIX, Role


# torch's intra-op threads as the last eager `matmul_t` saw them: a traced one-row product
# (torch.compile cannot call get_num_threads) cuts its rows by them, dynamo guarding on the
# value; 0 until an eager call has run (compile_decoding's first step is one): no cut.
_THREADS: Final = [0]


def realized(x: Tensor) -> Tensor:
    """`x`, and under torch.compile a tensor inductor computes once into memory. Inductor
    otherwise fuses the ops that make a one-row x (a norm, attention's normalisation) into the
    matrix-vector product that reads it, so they run again for every row of the matrix: a
    division and more per weight, which made a decoding step's products 10-20 % slower on a
    CPU. `as_strided` (here the identity view) is an op whose input inductor must realize."""
    if not torch.compiler.is_compiling():
        return x
    return torch.as_strided(x, x.shape, x.stride())


def matmul_t(
    x: Float[Tensor, "... d_in"], weight: Float[Tensor, "d_out d_in"]
) -> Float[Tensor, "... d_out"]:
    """`x @ weight.T`. For one row on a CPU (decoding one sequence), the matrix-vector product
    torch calls (MKL's) runs on one thread, so the weight's rows are cut into one block per
    thread, a batch that runs in parallel: a view, no copy. On 2 cores the 211 one-row
    products of a SmolLM2-135M token take 20-25 ms cut, 34-37 ms whole (2 to 8 rows gain
    1.1-1.5x too, but MKL's batched product then rounds differently for weights at other
    addresses, e.g. a memory-mapped checkpoint's: a loaded model would not repeat its
    original's logits bit for bit; at one row the plain product already does so). Under
    torch.compile the cut is traced as it is (one batched product), by the thread count the
    last eager call saw, its one row `realized`."""
    d_out, d_in = weight.shape
    rows = x.numel() // d_in if d_in else 0
    if torch.compiler.is_compiling():
        threads = _THREADS[0]
        x = realized(x) if rows == 1 else x
    else:
        threads = _THREADS[0] = torch.get_num_threads()
    if (
        threads < 2
        or rows != 1
        or d_out % threads
        or x.device.type != "cpu"
        or type(weight) not in (Tensor, nn.Parameter)  # a DTensor shard: its own rules
        or not weight.is_contiguous()
    ):
        return x @ weight.T
    blocks = weight.view(threads, d_out // threads, d_in).transpose(1, 2)  # (P, d_in, d_out/P)
    y = torch.matmul(x.reshape(1, rows, d_in), blocks)  # (P, rows, d_out/P)
    return y.transpose(0, 1).reshape(*x.shape[:-1], d_out)


class Linear(nn.Module):
    """`y = x @ W.T` (CS336: no bias), or `x @ W.T + b` with `bias=True`; `W` is
    `(out_features, in_features)`.

    `W` is initialised from a normal with σ² = 2 / (in + out), truncated at ±3σ; `b` at zeros.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        bias: bool = False,
        role: Role = MATRIX,
    ):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.role = role  # a hidden matrix unless the owner says otherwise (packed, router)
        self.weight = nn.Parameter(
            torch.empty(out_features, in_features, device=device, dtype=dtype)
        )
        std = math.sqrt(2.0 / (in_features + out_features))
        nn.init.trunc_normal_(self.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)
        self.bias = (
            nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype)) if bias else None
        )

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]:
        # Stored in a weight format (lmcore.model.quant), or a plain matmul: einsum("...i,oi->
        # ...o") is the same maths but slower on CPU (benchmarks/).
        y = self.quant(x) if "quant" in self._modules else matmul_t(x, self.weight)
        return y if self.bias is None else y + self.bias

    def parameter_roles(self) -> dict[str, Role]:
        return {"weight": self.role, "bias": BIAS}

    def extra_repr(self) -> str:
        bias = ", bias=True" if self.bias is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}{bias}"


class Joined:
    """Products that take one input (q, k and v; a gated FFN's w1 and w3) computed as one:
    `product` over their rows stacked, split into the parts' widths (`join`). At decoding's one
    row each product is a kernel call of its own (~20 µs in torch's quantized kernels), so
    fewer calls are faster. The parts' tensors are views of `product`'s, so nothing is held
    twice; `fresh` says whether they still are (a part re-quantized, moved or given new
    tensors is not), and only then does its owner use it, at inference."""

    def __init__(self, parts: tuple[Linear, ...], product: nn.Module):
        self.parts, self.product = parts, product
        self.widths = tuple(part.out_features for part in parts)
        # each part's format, each of its tensors, and the address it had when joined
        self._views = tuple(
            (part.quant, name, t, t.data_ptr())
            for part in parts
            for name, t in part.quant.named_parameters(recurse=False)
        )

    def fresh(self, *parts: nn.Module) -> bool:
        """Whether `parts` (the owner's modules now) are the joined ones, unhooked, and their
        tensors still views of the joined ones. Under torch.compile only the first (the
        addresses are not traceable; `compile_decoding` joins before tracing)."""
        if len(parts) != len(self.parts) or any(
            a is not b or a._forward_hooks or a._forward_pre_hooks
            for a, b in zip(parts, self.parts, strict=False)
        ):
            return False
        return torch.compiler.is_compiling() or all(
            getattr(fmt, name) is t and t.data_ptr() == address
            for fmt, name, t, address in self._views
        )

    def __call__(self, x: Float[Tensor, "... d_in"]) -> tuple[Tensor, ...]:
        return tuple(self.product(x).split(self.widths, dim=-1))


def join(*parts: Linear) -> Joined | None:
    """`parts`, which take one input, as one product when their weight format can stack them
    (a format of `quant=` with a `joined` method: the parts' rows stacked, their tensors made
    views of it); None otherwise, and for plain float weights, whose products are bound by the
    bytes they read (one float32 step of SmolLM2-135M measured 0.95-1.03x joined), and for
    biases."""
    formats = [part._modules.get("quant") for part in parts]
    if any(f is None for f in formats) or any(getattr(p, "bias", None) is not None for p in parts):
        return None
    joined = getattr(formats[0], "joined", None)
    product = joined(formats[1:]) if joined is not None else None
    return None if product is None else Joined(parts, product)


def join_products(model: nn.Module) -> None:
    """Every module of `model` that declares `joinable` (the names of its Linears that take
    one input, e.g. the attention's q, k and v) gets `joined`, its parts as one product where
    their weight format can (`join`); a module joined already and still fresh is left as it
    is, one whose declared part is None (an ungated FFN's w3) is not joined."""
    for module in model.modules():
        names = getattr(module, "joinable", ())
        parts = tuple(getattr(module, name, None) for name in names)
        if not names or any(part is None for part in parts):
            continue
        joined: Joined | None = getattr(module, "joined", None)
        if joined is None or not joined.fresh(*parts):
            module.joined = join(*parts)


def products(owner: nn.Module, x: Tensor, *parts: Linear) -> tuple[Tensor, ...]:
    """Each part's product of `x`: `owner`'s joined one (`join_products`) when autograd is off
    and it is fresh for `parts`, else each part's own."""
    joined: Joined | None = getattr(owner, "joined", None)
    if joined is not None and not torch.is_grad_enabled() and joined.fresh(*parts):
        return joined(x)
    return tuple(part(x) for part in parts)


class Embedding(nn.Module):
    """Row lookup in a `(num_embeddings, embedding_dim)` table initialised N(0, 1) on [-3, 3]."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = nn.Parameter(
            torch.empty(num_embeddings, embedding_dim, device=device, dtype=dtype)
        )
        nn.init.trunc_normal_(self.weight, mean=0.0, std=1.0, a=-3.0, b=3.0)

    def forward(self, token_ids: Int[Tensor, "..."]) -> Float[Tensor, "... d"]:
        if "quant" in self._modules:  # stored in a weight format (lmcore.model.quant)
            rows: Tensor = self.quant.rows(token_ids)
            return rows
        return self.weight[token_ids]

    def parameter_roles(self) -> dict[str, Role]:
        return {"weight": EMBEDDING}

    def extra_repr(self) -> str:
        return f"num_embeddings={self.num_embeddings}, embedding_dim={self.embedding_dim}"


# An activation and its derivative at x, computed together (they share most of the work).
Derivative = Callable[[Tensor], tuple[Tensor, Tensor]]


class FeedForward(nn.Module):
    """Position-wise feed-forward network with CS336's key names, optionally with biases.

    Ungated: `w2(act(w1 x))`. Gated (the GLU family, Shazeer 2020): `w2(act(w1 x) * w3 x)`.
    `w1, w3: (d_ff, d_model)`, `w2: (d_model, d_ff)`; with `bias=True` each also has a bias
    (`w1.bias`, ...; GPT-2's and GPT-NeoX's MLPs). The ffn plugins differ only in `activation`,
    `gated` and `bias`, so they share this module. Given `derivative` (the activation and its
    derivative at once), a gated FFN computes `act(a) * b` with `gate`, keeping only a and b,
    and an ungated one computes `act(a)` with `activate`, keeping only a.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: Callable[[Tensor], Tensor],
        *,
        gated: bool,
        derivative: Derivative | None = None,
        bias: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        w1_scale: float = 1.0,
        w2_scale: float = 1.0,
    ):
        super().__init__()
        self.activation, self.derivative = activation, derivative
        factory: dict[str, Any] = {"device": device, "dtype": dtype, "bias": bias}
        self.w1 = Linear(d_model, d_ff, **factory)
        self.w2 = Linear(d_ff, d_model, **factory)
        self.w3 = Linear(d_model, d_ff, **factory) if gated else None
        # Falcon-H1's mlp_multipliers: w1 x (the activation's input) and the output, scaled.
        self.w1_scale, self.w2_scale = w1_scale, w2_scale

    joinable = ("w1", "w3")  # x's products, joined at inference (`join_products`)

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        if self.w3 is None:
            a, b = self.w1(x), None
        else:
            a, b = products(self, x, self.w1, self.w3)  # (..., d_ff) each
        a = a if self.w1_scale == 1.0 else a * self.w1_scale
        if b is None:
            if self.derivative is not None:
                hidden = activate(a, self.activation, self.derivative)
            else:
                hidden = self.activation(a)  # (..., d_ff)
        elif self.derivative is not None:
            hidden = gate(a, b, self.activation, self.derivative)
        else:
            hidden = self.activation(a) * b
        y = self.w2(hidden)
        return y if self.w2_scale == 1.0 else y * self.w2_scale

    def extra_repr(self) -> str:
        name = getattr(self.activation, "__name__", repr(self.activation))
        bias = ", bias=True" if self.w1.bias is not None else ""
        scales = "".join(f", {n}={v}" for n, v in (("w1_scale", self.w1_scale),
                                                  ("w2_scale", self.w2_scale)) if v != 1.0)  # fmt: skip
        return f"activation={name}, gated={self.w3 is not None}{bias}{scales}"


class _Activate(torch.autograd.Function):
    """`act(a)`, keeping only a: backward recomputes act' from a, where autograd through the
    formula would keep every intermediate (the tanh GELU's cube, tanh and products)."""

    @staticmethod
    def forward(
        ctx: Any, a: Tensor, activation: Callable[[Tensor], Tensor], derivative: Derivative
    ) -> Tensor:
        ctx.derivative = derivative
        ctx.save_for_backward(a)
        return activation(a)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (a,) = ctx.saved_tensors
        _, slope = ctx.derivative(a)
        return slope.mul_(grad), None, None


def activate(
    a: Float[Tensor, "..."], activation: Callable[[Tensor], Tensor], derivative: Derivative
) -> Float[Tensor, "..."]:
    """`activation(a)` with a hand-written backward that keeps only a; `derivative(a)` returns
    `(activation(a), activation'(a))`."""
    if not torch.is_grad_enabled():
        return activation(a)
    out: Tensor = _Activate.apply(a, activation, derivative)  # type: ignore[no-untyped-call]
    return out


class _Gate(torch.autograd.Function):
    """`act(a) * b`, keeping only a and b: backward recomputes act and act' from a, where
    autograd through the formula would keep act's intermediates and its output too."""

    @staticmethod
    def forward(
        ctx: Any,
        a: Tensor,
        b: Tensor,
        activation: Callable[[Tensor], Tensor],
        derivative: Derivative,
    ) -> Tensor:
        ctx.derivative = derivative
        ctx.save_for_backward(a, b)
        return activation(a).mul_(b)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        a, b = ctx.saved_tensors
        value, slope = ctx.derivative(a)
        da = slope.mul_(grad).mul_(b) if ctx.needs_input_grad[0] else None
        db = value.mul_(grad) if ctx.needs_input_grad[1] else None
        return da, db, None, None


def gate(
    a: Float[Tensor, "... d_ff"],
    b: Float[Tensor, "... d_ff"],
    activation: Callable[[Tensor], Tensor],
    derivative: Derivative,
) -> Float[Tensor, "... d_ff"]:
    """`activation(a) * b` (the GLU family's gating) with a hand-written backward that keeps
    only a and b; `derivative(a)` returns `(activation(a), activation'(a))`."""
    if not torch.is_grad_enabled():  # inference: the same numbers without autograd's node
        return activation(a).mul_(b)
    out: Tensor = _Gate.apply(a, b, activation, derivative)  # type: ignore[no-untyped-call]
    return out


def feed_forward_activations(
    *, activation_saves: int, gated: bool, fused_gate: bool = False, fused_activation: bool = False
) -> Callable[..., int]:
    """The `activations` declaration of a `FeedForward`: bytes its forward saves for backward.

    That is its input (for w1 and w3), and the hidden product w2 reads; in between, a gated FFN
    with a fused `gate` keeps w1 x and w3 x, an ungated one with a fused `activate` keeps w1 x,
    others the `activation_saves` (..., d_ff) tensors the activation keeps besides its output,
    the activation's output and, gated, also w3 x. silu keeps 2 (its input and the sigmoid),
    gelu 3 (x/√2, x/2 and 1 + erf), relu 0 (it keeps its output, which w2 keeps anyway).
    Biases change nothing: a bias is added in place to a product nothing keeps.
    """
    if gated and fused_gate:
        per_d_ff = 3
    elif not gated and fused_activation:
        per_d_ff = 2
    else:
        per_d_ff = activation_saves + 1 + 2 * gated

    def activations(batch: int, seq_len: int, d_model: int, d_ff: int, dtype: torch.dtype) -> int:
        return batch * seq_len * dtype.itemsize * (d_model + d_ff * per_d_ff)

    return activations


def gated_d_ff(d_model: int) -> int:
    """8/3 · d_model rounded to a multiple of 64 (at least 64): a gated FFN's three matrices then
    hold about as many parameters as an ungated 4·d_model FFN's two."""
    return max(64, round(8 * d_model / 3 / 64) * 64)


def softmax(x: Float[Tensor, "..."], dim: int = -1) -> Float[Tensor, "..."]:
    """Softmax along `dim`, subtracting the max first so large inputs do not overflow."""
    shifted = x - x.amax(dim=dim, keepdim=True)
    e = torch.exp(shifted)
    return e / e.sum(dim=dim, keepdim=True)


def softplus(x: Float[Tensor, "..."]) -> Float[Tensor, "..."]:
    """`log(1 + exp(x))`, written so that no exp overflows."""
    return x.clamp_min(0) + torch.log1p(torch.exp(-x.abs()))


def at_least_float32(dtype: torch.dtype | None) -> torch.dtype:
    """`dtype` (default: torch's) widened to float32 at least: what a recurrent state that sums
    every token is kept and computed in."""
    return torch.promote_types(dtype or torch.get_default_dtype(), torch.float32)


def silu(x: Float[Tensor, "..."]) -> Float[Tensor, "..."]:
    """`x * sigmoid(x)`."""
    return x * torch.sigmoid(x)


def silu_derivative(x: Float[Tensor, "..."]) -> tuple[Tensor, Tensor]:
    """`(silu(x), silu'(x))`, with `silu' = σ + silu · (1 - σ)` sharing the sigmoid."""
    sig = torch.sigmoid(x)
    value = x * sig
    return value, (1.0 - sig).mul_(value).add_(sig)


def gelu(x: Float[Tensor, "..."]) -> Float[Tensor, "..."]:
    """The exact GELU, `x · Φ(x) = 0.5 · x · (1 + erf(x / √2))` (not the tanh approximation)."""
    return 0.5 * x * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))


def gelu_derivative(x: Float[Tensor, "..."]) -> tuple[Tensor, Tensor]:
    """`(gelu(x), gelu'(x))`, with `gelu' = Φ(x) + x · φ(x)` (φ the standard normal density)."""
    cdf = torch.erf(x * (1.0 / math.sqrt(2.0))).add_(1.0).mul_(0.5)
    density = torch.exp(x.square().mul_(-0.5)).mul_(1.0 / math.sqrt(2.0 * math.pi))
    return x * cdf, density.mul_(x).add_(cdf)


# The tanh approximation of GELU (Hendrycks & Gimpel 2016): GPT-2's `gelu_new`, Gemma's
# `gelu_pytorch_tanh`, torch's `gelu(approximate="tanh")`.
_TANH_SCALE = math.sqrt(2.0 / math.pi)
_TANH_CUBIC = 0.044715


def gelu_tanh(x: Float[Tensor, "..."]) -> Float[Tensor, "..."]:
    """`0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))`, the tanh approximation of GELU,
    in the order of operations of GPT-2's `gelu_new`."""
    return 0.5 * x * (1.0 + torch.tanh(_TANH_SCALE * (x + _TANH_CUBIC * torch.pow(x, 3.0))))


def gelu_tanh_derivative(x: Float[Tensor, "..."]) -> tuple[Tensor, Tensor]:
    """`(gelu_tanh(x), gelu_tanh'(x))`: with `u = √(2/π)(x + a x³)` and `t = tanh(u)`,
    `gelu_tanh' = (1 + t) / 2 + x / 2 · (1 - t²) · √(2/π)(1 + 3a x²)`."""
    t = torch.tanh(_TANH_SCALE * (x + _TANH_CUBIC * torch.pow(x, 3.0)))
    value = 0.5 * x * (1.0 + t)
    du = (x * x).mul_(3 * _TANH_CUBIC).add_(1.0).mul_(_TANH_SCALE)  # du/dx
    slope = (1.0 - t * t).mul_(du).mul_(0.5 * x).add_(t.add_(1.0).mul_(0.5))
    return value, slope


def causal_mask(
    q_len: int, k_len: int, device: torch.device | str | None = None
) -> Bool[Tensor, "q k"]:
    """True where query i may attend key j, with queries aligned to the end of the keys.

    Query i sits at absolute position `k_len - q_len + i` (decoding with a KV cache), so it sees
    keys j <= k_len - q_len + i.
    """
    i = torch.arange(q_len, device=device)[:, None]
    j = torch.arange(k_len, device=device)[None, :]
    return j <= i + (k_len - q_len)


def scaled_dot_product_attention(
    Q: Float[Tensor, "... q d_k"],
    K: Float[Tensor, "... k d_k"],
    V: Float[Tensor, "... k d_v"],
    mask: Bool[Tensor, "... q k"] | None = None,
    bias: Float[Tensor, "... q k"] | None = None,
) -> Float[Tensor, "... q d_v"]:
    """`softmax(Q Kᵀ / sqrt(d_k) + bias) V` over any leading batch dims.

    `mask` is boolean, True = may attend; False positions get -inf before the softmax. A query
    whose keys are all masked gets zeros (as torch's fused kernel does), so a padded row cannot
    spread NaN through the residual stream or the gradients.
    """
    # Same maths as softmax(scores) @ V, arranged to touch the (q, k) matrix as few times as
    # possible: the 1/sqrt(d_k) scale goes on Q, the mask and bias go in place, and the softmax
    # denominator divides the (q, d_v) output instead of the (q, k) probabilities. 2.5x faster
    # forward+backward than the literal formula on CPU (benchmarks/primitives.py).
    scores = (Q * (1.0 / math.sqrt(Q.shape[-1]))) @ K.transpose(-2, -1)  # (..., q, k)
    if bias is not None:
        scores = scores + bias  # not in place: bias may broadcast scores to a larger shape
    if mask is not None:
        fits = mask.ndim <= scores.ndim and all(
            m in (1, s) for m, s in zip(reversed(mask.shape), reversed(scores.shape), strict=False)
        )
        if fits:
            scores.masked_fill_(~mask, float("-inf"))
        else:  # the mask adds batch dimensions
            scores = scores.masked_fill(~mask, float("-inf"))
    # The max is only a shift for stability; softmax is invariant to it, so no gradient flows.
    # A row with every key masked has max -inf: shift it by 0 so its weights are exp(-inf) = 0.
    row_max = scores.amax(dim=-1, keepdim=True).detach()  # (..., q, 1)
    row_max = torch.where(row_max == float("-inf"), 0.0, row_max)
    weights = (scores - row_max).exp_()  # (..., q, k)
    total = weights.sum(dim=-1, keepdim=True)
    return (weights @ V) / torch.where(total == 0, 1.0, total)


IGNORE: Final = -100  # a target equal to it is left out of the loss (torch's ignore_index)


def cross_entropy(
    logits: Float[Tensor, "... vocab"], targets: Int[Tensor, "..."]
) -> Float[Tensor, ""]:
    """Mean of `-log softmax(logits)[target]` over every position whose target is not `IGNORE`,
    computed in float32; 0 (with zero gradients, no NaN) when every target is `IGNORE`.

    `logsumexp` subtracts the max internally, so large logits do not overflow.
    """
    return cross_entropy_and_log_z(logits, targets)[0]


def kept_mean(values: Float[Tensor, "..."], kept: Bool[Tensor, "..."]) -> Float[Tensor, ""]:
    """The mean of `values` where `kept`; 0 where nothing is kept. When everything is kept it is
    exactly `values.mean()`, bit for bit and in its gradients, chosen on the device without a
    host sync (the other branch gets a zero gradient)."""
    count = kept.sum()
    masked = torch.where(kept, values, 0.0).sum() / count.clamp(min=1)
    return torch.where(count == kept.numel(), values.mean(), masked)


def cross_entropy_and_log_z(
    logits: Float[Tensor, "... vocab"], targets: Int[Tensor, "..."]
) -> tuple[Float[Tensor, ""], Float[Tensor, "..."]]:
    """`cross_entropy`, and the log-partition function `log Σ_j exp(logits[..., j])` of every
    position (float32) it is computed from, for a loss that uses it too (the z-loss: average
    it over `targets != IGNORE`, `kept_mean`)."""
    logits = logits.float()  # a bf16 log-partition function loses ~2 digits
    kept = targets != IGNORE
    safe = torch.where(kept, targets, 0)  # an ignored position gathers id 0, then is left out
    log_z, picked = _LogZAndPicked.apply(logits, safe)  # (...,) each
    return kept_mean(log_z - picked, kept), log_z


# Bytes of logits the loss handles at a time on a CPU: a block of rows stays in cache across
# its few ops (1 MiB of L2 a core, measured on 2 cores), where whole-tensor ops each go out
# to memory (SmolLM2's 4 x 128 tokens: 100 MB of logits; forward and backward 60-76 ms in
# blocks of 1-4 MiB, 190-230 ms whole through autograd, 118-126 ms for torch's fused op).
_BLOCK_BYTES: Final = 1 << 21


class _LogZAndPicked(torch.autograd.Function):
    """`logsumexp(logits, -1)` and `logits[..., target]` of every position, with the gradient
    written in one tensor, a block of rows at a time: `softmax(logits) * g_log_z`, plus
    `g_picked` at each target. The same floating-point operations as autograd's
    `logsumexp` and `gather` (bit for bit), without their full-size temporaries."""

    @staticmethod
    def forward(
        ctx: Any, logits: Float[Tensor, "... vocab"], targets: Int[Tensor, "..."]
    ) -> tuple[Float[Tensor, "..."], Float[Tensor, "..."]]:
        flat = logits.reshape(-1, logits.shape[-1])  # (rows, vocab)
        index = targets.reshape(-1, 1)
        rows = _block_rows(flat)
        if rows >= flat.shape[0]:
            log_z = torch.logsumexp(flat, dim=-1)
        else:
            log_z = flat.new_empty(flat.shape[0])
            for start in range(0, flat.shape[0], rows):
                torch.logsumexp(flat[start : start + rows], dim=-1, out=log_z[start : start + rows])
        picked = flat.gather(-1, index).squeeze(-1)
        ctx.save_for_backward(flat, index, log_z)
        ctx.rows, ctx.shape = rows, logits.shape
        return log_z.view(targets.shape), picked.view(targets.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, g_log_z: Tensor, g_picked: Tensor) -> tuple[Tensor, None]:
        flat, index, log_z = ctx.saved_tensors
        g_log_z, g_picked = g_log_z.reshape(-1, 1), g_picked.reshape(-1, 1)
        grad = torch.empty_like(flat)
        for start in range(0, flat.shape[0], ctx.rows):
            end = start + ctx.rows
            block = grad[start:end]
            torch.sub(flat[start:end], log_z[start:end, None], out=block)
            block.exp_().mul_(g_log_z[start:end])  # softmax's rows, times their gradient
            block.scatter_add_(-1, index[start:end], g_picked[start:end])
        return grad.view(ctx.shape), None


def _block_rows(flat: Tensor) -> int:
    """Rows of `flat` per block: as many as `_BLOCK_BYTES` hold on a CPU; every row at once on
    other devices (a kernel each op, whole) and under torch.compile (which fuses them)."""
    if flat.device.type != "cpu" or torch.compiler.is_compiling():
        return max(flat.shape[0], 1)
    return max(_BLOCK_BYTES // max(flat.shape[1] * flat.element_size(), 1), 1)


class LogitCap(nn.Module):
    """`cap · tanh(logits / cap)` (Gemma 2's final-logit soft-capping, in its order of ops)."""

    def __init__(self, cap: float):
        super().__init__()
        self.cap = cap

    def forward(self, logits: Float[Tensor, "... V"]) -> Float[Tensor, "... V"]:
        return torch.tanh(logits / self.cap) * self.cap

    def extra_repr(self) -> str:
        return f"cap={self.cap}"
