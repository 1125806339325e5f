"""A mixture of experts feed-forward layer: a router picks `top_k` of `E` experts per token.

Routing (Shazeer et al. 2017; Switch, Fedus et al. 2021; Mixtral; Qwen3-MoE): the router's
logits `x Wᵀ` (`router.weight: (E, d_model)`) become weights either by a softmax over all `E`
followed by the top k (optionally renormalised to sum to 1: Mixtral, Qwen3-MoE's
`norm_topk_prob`), or by the top k logits followed by a softmax over those k. The softmax is
computed in float32 and the weights are cast to the input's dtype, as Qwen3-MoE does.

Dispatch: the `T · k` (token, expert) assignments are sorted by expert, the tokens gathered once
(`index_select`), each expert runs once on its contiguous slice (one batched product per
expert, never a loop over tokens), and the weighted outputs are summed back per token with one
`index_add`. The expert sizes are read from the device once per forward (one synchronisation);
an expert that received no token still runs on an empty slice, so every parameter takes part in
every backward (DistributedDataParallel needs no `find_unused_parameters`).

Shared experts (DeepSeek-MoE, Qwen2-MoE): one more feed-forward module every token passes
through, its output added, optionally scaled by `sigmoid(shared_gate(x))` (Qwen2-MoE).

Load balancing (Switch Transformer, eq. 4-6): in training, with gradients on,
`aux_loss = coef · E · Σᵢ fᵢ · Pᵢ` with `fᵢ` the share of the `T` tokens routed to expert i
(counting each of a token's k choices, so Σᵢ fᵢ = k) and `Pᵢ` the mean over tokens of its softmax
probability. It is left in `self.aux_loss` (None otherwise) for the training loop to add to the
loss; `TransformerLM.aux_loss()` collects it from every layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from lmcore.errors import ConfigError
from lmcore.model.nn import Linear

SOFTMAX_ORDERS: Final = ("before", "after")
_UNCOMPILED: dict[str, Callable[..., Tensor]] = {}


def _uncompiled_dispatch() -> Callable[..., Tensor]:
    """`MixtureOfExperts.dispatch` wrapped in `torch.compiler.disable`, made on first use under
    torch.compile: wrapping at import would import Dynamo (seconds) with every model."""
    found = _UNCOMPILED.get("dispatch")
    if found is None:
        found = torch.compiler.disable(MixtureOfExperts.dispatch)  # type: ignore[no-untyped-call]
        _UNCOMPILED["dispatch"] = found
    return found


class _Softmax(torch.autograd.Function):
    """Softmax over the last dimension that keeps only its output for backward:
    `dz = p · (g - Σ g · p)`. Autograd through the formula keeps the input, the max, the
    exponentials and their sum."""

    @staticmethod
    def forward(ctx: Any, z: Tensor) -> Tensor:
        p = (z - z.amax(dim=-1, keepdim=True)).exp_()
        p = p.div_(p.sum(dim=-1, keepdim=True))
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        p: Tensor = ctx.saved_tensors[0]
        return p * (grad - (grad * p).sum(dim=-1, keepdim=True))


class _Combine(torch.autograd.Function):
    """`out[t] = Σ_{a: token[a] = t} w[a] · y[a]`, keeping y, w and the index for backward.

    As `zeros.index_add(0, token, y * w[:, None])` it would also keep the scaled copy of y
    (index_add keeps its source): one more (T·k, d_model) tensor per layer.
    """

    @staticmethod
    def forward(ctx: Any, y: Tensor, w: Tensor, token: Tensor, tokens: int) -> Tensor:
        ctx.save_for_backward(y, w, token)
        out = y.new_zeros(tokens, y.shape[-1])
        return out.index_add_(0, token, y * w[:, None])

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        y, w, token = ctx.saved_tensors
        rows = grad.index_select(0, token)  # (T·k, d_model): each assignment's token's grad
        dw = torch.linalg.vecdot(rows, y) if ctx.needs_input_grad[1] else None  # one pass
        dy = rows.mul_(w[:, None]) if ctx.needs_input_grad[0] else None  # rows is ours
        return dy, dw, None, None


def softmax_float32(z: Float[Tensor, "... n"]) -> Float[Tensor, "... n"]:
    """Softmax over the last dimension in float32 (or wider), subtracting the max first."""
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    out: Tensor = _Softmax.apply(z)  # type: ignore[no-untyped-call]
    return out


class MixtureOfExperts(nn.Module):
    """`Σ_{e in top_k(x)} w_e(x) · expert_e(x)` (+ a shared expert) for each token.

    State-dict keys: `router.weight (E, d_model)`, `experts.{e}.<the expert's keys>`
    (e.g. `experts.0.w1.weight` for a SwiGLU expert, Mixtral's own names), and, with a shared
    expert, `shared.<its keys>` and `shared_gate.weight (1, d_model)`.
    """

    aux_loss: Tensor | None

    def __init__(
        self,
        d_model: int,
        experts: Sequence[nn.Module],
        *,
        top_k: int,
        softmax: str = "before",
        renormalize: bool = False,
        shared: nn.Module | None = None,
        shared_gate: bool = False,
        aux_loss_coef: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        if not 1 <= top_k <= len(experts):
            raise ConfigError(f"top_k={top_k} must lie within 1..{len(experts)} (the experts)")
        if softmax not in SOFTMAX_ORDERS:
            raise ConfigError(f"softmax={softmax!r} must be 'before' or 'after' the top-k")
        self.d_model, self.num_experts, self.top_k = d_model, len(experts), top_k
        # softmax over all experts, then the top-k (else the top-k logits, then a softmax)
        self.softmax_first = softmax == "before"
        self.renormalize, self.aux_loss_coef = renormalize, aux_loss_coef
        self.router = Linear(d_model, len(experts), device=device, dtype=dtype)
        self.experts = nn.ModuleList(experts)
        self.shared = shared
        self.shared_gate = (
            Linear(d_model, 1, device=device, dtype=dtype) if shared is not None and shared_gate
            else None
        )  # fmt: skip
        self.aux_loss = None

    def route(
        self, logits: Float[Tensor, "T E"]
    ) -> tuple[Float[Tensor, "T k"], Int[Tensor, "T k"], Float[Tensor, "T E"] | None]:
        """The top-k weights (float32), the chosen experts, and the float32 softmax over all
        experts when it was computed (softmax before the top-k)."""
        if self.softmax_first:
            probs = softmax_float32(logits)
            weights, chosen = probs.topk(self.top_k, dim=-1)
            if self.renormalize:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            return weights, chosen, probs
        top, chosen = logits.topk(self.top_k, dim=-1)
        return softmax_float32(top), chosen, None

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        flat = x.reshape(-1, self.d_model)  # (T, d_model)
        logits = self.router(flat)  # (T, E)
        weights, chosen, probs = self.route(logits)
        assignments = chosen.reshape(-1)  # (T·k,): token t's j-th choice at t·k + j
        counts = torch.zeros(self.num_experts, dtype=torch.long, device=x.device)
        counts = counts.index_add_(0, assignments, torch.ones_like(assignments))
        # Under torch.compile the dispatch runs outside the graphs: the experts' sizes are data,
        # and tracing with them would recompile for each new routing (sizes 0 and 1 are
        # specialised) up to Dynamo's recompile limit. The rest of the layer is compiled.
        dispatch = _uncompiled_dispatch() if torch.compiler.is_compiling() else type(self).dispatch
        out = dispatch(self, flat, weights.to(x.dtype), assignments, counts)
        if self.shared is not None:
            extra = self.shared(flat)
            if self.shared_gate is not None:
                extra = extra * torch.sigmoid(self.shared_gate(flat))
            out = out + extra
        self.aux_loss = None
        if self.training and torch.is_grad_enabled() and self.aux_loss_coef > 0 and len(flat):
            if probs is None:
                probs = softmax_float32(logits)
            self.aux_loss = self.balance_loss(probs, counts)
        return out.reshape(x.shape)

    def dispatch(
        self,
        flat: Float[Tensor, "T d_model"],
        weights: Float[Tensor, "T k"],
        assignments: Int[Tensor, " Tk"],
        counts: Int[Tensor, " E"],
    ) -> Float[Tensor, "T d_model"]:
        """Each expert once, on the tokens routed to it, grouped by a stable sort."""
        order = assignments.argsort(stable=True)  # grouped by expert, tokens in order
        token = order // self.top_k  # (T·k,) the token of each sorted assignment
        gathered = flat.index_select(0, token)  # (T·k, d_model)
        parts = torch.split(gathered, self.sizes(counts, len(order)))
        outs = torch.cat([expert(part) for expert, part in zip(self.experts, parts, strict=True)])
        chosen = weights.reshape(-1).index_select(0, order)  # (T·k,) in the experts' order
        combined: Tensor = _Combine.apply(outs, chosen, token, flat.shape[0])  # type: ignore[no-untyped-call]
        return combined

    def sizes(self, counts: Int[Tensor, " E"], total: int) -> list[int]:
        """How many of the `total` assignments each expert got. On the meta device there are
        no values: they are spread evenly, which keeps every shape and the sum of the experts'
        work (what accounting and memory measurement see) as in a real forward."""
        if counts.device.type != "meta":
            found: list[int] = counts.tolist()  # the one synchronisation of the forward
            return found
        each, rest = divmod(total, self.num_experts)
        return [each + (e < rest) for e in range(self.num_experts)]

    def balance_loss(self, probs: Float[Tensor, "T E"], counts: Int[Tensor, " E"]) -> Tensor:
        """`coef · E · Σᵢ fᵢ · Pᵢ`: fᵢ = counts[i] / T, Pᵢ = mean over tokens of probs[:, i]."""
        tokens = probs.shape[0]
        share = counts.to(probs.dtype) / tokens  # (E,), no gradient: a count
        return (share * probs.mean(dim=0)).sum() * (self.aux_loss_coef * self.num_experts)

    def extra_repr(self) -> str:
        shared = ", shared" + ("(gated)" if self.shared_gate is not None else "")
        order = "before" if self.softmax_first else "after"
        return (
            f"experts={self.num_experts}, top_k={self.top_k}, softmax={order}, "
            f"renormalize={self.renormalize}{shared if self.shared is not None else ''}, "
            f"aux_loss_coef={self.aux_loss_coef}"
        )
