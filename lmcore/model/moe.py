"""A mixture of experts feed-forward layer: a router picks `top_k` of `E` experts per token.

Routing (Shazeer et al. 2017; Switch, Fedus et al. 2021; Mixtral; Qwen3-MoE): the router's
logits `x Wᵀ` (`router.weight: (E, d_model)`) become weights either by a softmax over all `E`
followed by the top k (optionally renormalised to sum to 1: Mixtral, Qwen3-MoE's
`norm_topk_prob`), or by the top k logits followed by a softmax over those k. The softmax is
computed in float32 and the weights are cast to the input's dtype, as Qwen3-MoE does.

DeepSeek-V3's routing (`score="sigmoid"`, transformers' `DeepseekV3TopkRouter`): the router's
product is computed in float32 and each expert's score is `sigmoid(logit)`, independently of the
others. A score-correction bias `score_bias (E,)` (DeepSeek-V3's `e_score_correction_bias`,
adjusted outside the gradient by auxiliary-loss-free balancing; no gradient reaches it) is added
to the scores to choose the experts but does not weight them. Group-limited top-k (`n_group`,
`topk_group`): the experts fall into `n_group` equal groups, a group's score is the sum of its
two best (bias-corrected) scores, and only the experts of the `topk_group` best groups may be
chosen. The chosen experts' scores, renormalised to sum to 1 (`w / (Σ w + 1e-20)` for
sigmoid scores, as DeepSeek-V3), are multiplied by the routed scaling factor `scale`. Either
score, the bias and the groups combine (with the softmax before the top-k); the router may have a
bias `router.bias` (gpt-oss).

Dispatch: the `T · k` (token, expert) assignments are sorted by expert, the tokens gathered once
(`index_select`), each expert runs once on its contiguous slice (one batched product per
expert, never a loop over tokens), and each expert's weighted outputs are added back to their
tokens with one `index_add` (never concatenated first). The expert sizes are read from the
device once per forward (one synchronisation); an expert that received no token still runs on
an empty slice, so every parameter takes part in every backward (DistributedDataParallel needs
no `find_unused_parameters`).

Shared experts (DeepSeek-MoE, Qwen2-MoE): one more feed-forward module every token passes
through, its output added, optionally scaled by `sigmoid(shared_gate(x))` (Qwen2-MoE).

Load balancing (Switch Transformer, eq. 4-6): in training, with gradients on,
`aux_loss = coef · E · Σᵢ fᵢ · Pᵢ` with `fᵢ` the share of the `T` tokens routed to expert i
(counting each of a token's k choices, so Σᵢ fᵢ = k) and `Pᵢ` the mean over tokens of its softmax
probability (with sigmoid scores, of the scores normalised to sum to 1 per token, as
DeepSeek-V3's balance loss). It is left in `self.aux_loss` (None otherwise) for the training
loop to add to the loss; `TransformerLM.aux_loss()` collects it from every layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from lmcore.errors import ConfigError
from lmcore.model.nn import Linear
from lmcore.model.roles import ROUTER

SOFTMAX_ORDERS: Final = ("before", "after")
SCORES: Final = ("softmax", "sigmoid")
SIGMOID_EPS: Final = 1e-20  # DeepSeek-V3's renormalisation: w / (Σ w + 1e-20)
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
    """`out[t] = Σ_{a: token[a] = t} w[a] · y[a]` over the experts' outputs `ys` (one tensor
    per expert, in the sorted assignments' order), keeping them, w and the index for backward.

    The outputs are never concatenated (one more (T·k, d_model) copy each way, ~8% of a
    forward): each expert's is scaled and added back on its own slice of the index. As
    `zeros.index_add(0, token, y * w[:, None])` it would also keep the scaled copy of y
    (index_add keeps its source): one more (T·k, d_model) tensor per layer.
    """

    @staticmethod
    def forward(ctx: Any, w: Tensor, token: Tensor, tokens: int, *ys: Tensor) -> Tensor:
        ctx.save_for_backward(w, token, *ys)
        out = ys[0].new_zeros(tokens, ys[0].shape[-1])
        start = 0
        for y in ys:
            end = start + y.shape[0]
            if end > start:
                out.index_add_(0, token[start:end], y * w[start:end, None])
            start = end
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        w, token, *ys = ctx.saved_tensors
        rows = grad.index_select(0, token)  # (T·k, d_model): each assignment's token's grad
        sizes = [y.shape[0] for y in ys]
        parts = rows.split(sizes)
        dw = (
            torch.cat([torch.linalg.vecdot(r, y) for r, y in zip(parts, ys, strict=True)])
            if ctx.needs_input_grad[0] else None
        )  # fmt: skip
        # rows is ours: each expert's slice becomes its gradient in place
        dys = [r.mul_(v[:, None]) for r, v in zip(parts, w.split(sizes), strict=True)]
        return (dw, None, None, *dys)


class _Float32Linear(torch.autograd.Function):
    """`x Wᵀ (+ b)` computed in float32 (or wider) whatever the dtypes, keeping x and W as they
    are for backward: autograd through `x.float() @ W.float().T` would keep float32 copies of
    both in a bfloat16 model."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, w)
        ctx.bias_dtype = None if b is None else b.dtype
        wide = torch.promote_types(torch.promote_types(x.dtype, w.dtype), torch.float32)
        out = x.to(wide) @ w.to(wide).T
        return out if b is None else out.add_(b.to(wide))

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, w = ctx.saved_tensors
        dx = (grad @ w.to(grad.dtype)).to(x.dtype) if ctx.needs_input_grad[0] else None
        dw = (grad.T @ x.to(grad.dtype)).to(w.dtype) if ctx.needs_input_grad[1] else None
        db = grad.sum(dim=0).to(ctx.bias_dtype) if ctx.needs_input_grad[2] else None
        return dx, dw, db


def linear_float32(
    x: Float[Tensor, "T d_in"], w: Float[Tensor, "d_out d_in"], b: Float[Tensor, " d_out"] | None
) -> Float[Tensor, "T d_out"]:
    """`x Wᵀ (+ b)` in float32 (or wider), saving only x and W for backward."""
    out: Tensor = _Float32Linear.apply(x, w, b)  # type: ignore[no-untyped-call]
    return out


def limit_groups(
    choice: Float[Tensor, "T E"], n_group: int, topk_group: int
) -> Float[Tensor, "T E"]:
    """`choice` with -inf for every expert outside the `topk_group` best of `n_group` equal
    groups, a group's score being the sum of its two best (DeepSeek-V3's group-limited top-k)."""
    tokens, experts = choice.shape
    grouped = choice.view(tokens, n_group, experts // n_group)
    best = grouped.topk(2, dim=-1).values.sum(dim=-1)  # (T, n_group)
    kept = best.topk(topk_group, dim=-1, sorted=False).indices
    allowed = torch.zeros_like(best, dtype=torch.bool).scatter_(1, kept, True)
    return grouped.masked_fill(~allowed[..., None], float("-inf")).view(tokens, experts)


def softmax_float32(z: Float[Tensor, "... n"]) -> Float[Tensor, "... n"]:
    """Softmax over the last dimension in float32 (or wider), subtracting the max first."""
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    out: Tensor = _Softmax.apply(z)  # type: ignore[no-untyped-call]
    return out


class MixtureOfExperts(nn.Module):
    """`Σ_{e in top_k(x)} w_e(x) · expert_e(x)` (+ a shared expert) for each token.

    State-dict keys: `router.weight (E, d_model)` (and `router.bias (E,)` with
    `router_bias`), `score_bias (E,)` (with `score_bias`; a persistent buffer),
    `experts.{e}.<the expert's keys>` (e.g. `experts.0.w1.weight` for a SwiGLU expert,
    Mixtral's own names), and, with a shared expert, `shared.<its keys>` and
    `shared_gate.weight (1, d_model)`.
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
        score: str = "softmax",
        n_group: int = 1,
        topk_group: int = 0,
        score_bias: bool = False,
        scale: float = 1.0,
        router_bias: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        problem = routing_problem(
            len(experts), top_k, softmax, renormalize, score, n_group, topk_group, score_bias
        )
        if problem:
            raise ConfigError(problem)
        self.d_model, self.num_experts, self.top_k = d_model, len(experts), top_k
        # softmax over all experts, then the top-k (else the top-k logits, then a softmax)
        self.softmax_first = softmax == "before"
        self.sigmoid = score == "sigmoid"
        self.renormalize, self.aux_loss_coef = renormalize, aux_loss_coef
        self.n_group, self.scale = n_group, scale
        # 0 (all groups) or every group: no limit, and none of its work
        self.topk_group = n_group if topk_group in (0, n_group) else topk_group
        self.router = Linear(
            d_model, len(experts), device=device, dtype=dtype, bias=router_bias, role=ROUTER
        )
        # A persistent buffer, as transformers' e_score_correction_bias: saved and loaded, not
        # a parameter (DeepSeek-V3's 671,026,404,352 parameters do not count it); no gradient
        # could reach it (it only chooses), a balancing rule adjusts it. In the model's dtype
        # (transformers keeps it in float32): added to the float32 scores, only it rounds.
        self.score_bias: Tensor | None
        if score_bias:
            bias = torch.zeros(len(experts), device=device, dtype=dtype)
            self.register_buffer("score_bias", bias, persistent=True)
        else:
            self.score_bias = None
        self.experts = nn.ModuleList(experts)
        self.shared = shared
        self.shared_gate = (
            Linear(d_model, 1, device=device, dtype=dtype, role=ROUTER)
            if shared is not None and shared_gate
            else None
        )  # fmt: skip
        self.aux_loss = None

    def logits(self, flat: Float[Tensor, "T d_model"]) -> Float[Tensor, "T E"]:
        """The router's logits: in the input's dtype for softmax scores (Qwen3-MoE), in float32
        for sigmoid scores (DeepSeek-V3)."""
        if self.sigmoid:
            return linear_float32(flat, self.router.weight, self.router.bias)
        logits: Tensor = self.router(flat)
        return logits

    def route(
        self, logits: Float[Tensor, "T E"]
    ) -> tuple[Float[Tensor, "T k"], Int[Tensor, "T k"], Float[Tensor, "T E"] | None]:
        """The top-k weights (float32), the chosen experts, and the float32 scores over all
        experts when they were computed (softmax before the top-k, or sigmoid)."""
        if not (self.softmax_first or self.sigmoid):
            top, chosen = logits.topk(self.top_k, dim=-1)
            weights = softmax_float32(top)
            return (weights * self.scale if self.scale != 1 else weights), chosen, None
        scores = logits.sigmoid() if self.sigmoid else softmax_float32(logits)  # float32
        if self.score_bias is None and self.topk_group == self.n_group:
            weights, chosen = scores.topk(self.top_k, dim=-1)
        else:
            with torch.no_grad():  # the choice only: no gradient flows through an index
                choice = scores if self.score_bias is None else scores + self.score_bias
                if self.topk_group < self.n_group:
                    choice = limit_groups(choice, self.n_group, self.topk_group)
                chosen = choice.topk(self.top_k, dim=-1).indices
            weights = scores.gather(1, chosen)
        if self.renormalize:
            total = weights.sum(dim=-1, keepdim=True)
            weights = weights / (total + SIGMOID_EPS if self.sigmoid else total)
        if self.scale != 1:
            weights = weights * self.scale
        return weights, chosen, scores

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        flat = x.reshape(-1, self.d_model)  # (T, d_model)
        logits = self.logits(flat)  # (T, E)
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
            if self.sigmoid:  # DeepSeek-V3's balance loss: the scores normalised per token
                probs = probs / probs.sum(dim=-1, keepdim=True)
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
        outs = [expert(part) for expert, part in zip(self.experts, parts, strict=True)]
        chosen = weights.reshape(-1).index_select(0, order)  # (T·k,) in the experts' order
        combined: Tensor = _Combine.apply(chosen, token, flat.shape[0], *outs)  # type: ignore[no-untyped-call]
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
        order = (
            "sigmoid"
            if self.sigmoid
            else "softmax " + ("before" if self.softmax_first else "after")
        )
        groups = f", groups={self.topk_group}/{self.n_group}" if self.n_group > 1 else ""
        bias = ", score_bias" if self.score_bias is not None else ""
        scale = f", scale={self.scale}" if self.scale != 1 else ""
        return (
            f"experts={self.num_experts}, top_k={self.top_k}, score={order}{groups}{bias}, "
            f"renormalize={self.renormalize}{scale}{shared if self.shared is not None else ''}, "
            f"aux_loss_coef={self.aux_loss_coef}"
        )


def routing_problem(
    num_experts: int,
    top_k: int,
    softmax: str,
    renormalize: bool,
    score: str,
    n_group: int,
    topk_group: int,
    score_bias: bool,
) -> str:
    """Why these routing arguments do not make a router ("" when they do); the plugin's
    validate() and the module both refuse with it."""
    if score not in SCORES:
        return f"score={score!r} must be one of {', '.join(SCORES)}"
    if softmax not in SOFTMAX_ORDERS:
        return f"softmax={softmax!r} must be 'before' or 'after' the top-k"
    if not 1 <= top_k <= num_experts:
        return f"top_k={top_k} exceeds num_experts={num_experts}; a token picks top_k of them"
    if softmax == "after" and renormalize:
        return (
            "softmax=after already gives top-k weights that sum to 1; renormalize=true would "
            "repeat it (it is for softmax=before); drop it"
        )
    if softmax == "after" and score == "sigmoid":
        return (
            "softmax=after is the order of a softmax over the chosen logits; score=sigmoid "
            "has no softmax: drop softmax=after"
        )
    limited = n_group > 1 or topk_group not in (0, n_group)
    if softmax == "after" and (limited or score_bias):
        what = "score_bias=true" if score_bias else f"n_group={n_group}, topk_group={topk_group}"
        return (
            f"{what} chooses experts by their scores; softmax=after chooses them by the raw "
            "logits: use softmax=before or score=sigmoid"
        )
    if n_group < 1:
        return f"n_group={n_group} must be at least 1"
    if num_experts % n_group:
        return (
            f"n_group={n_group} does not divide num_experts={num_experts}; the experts fall "
            "into n_group equal groups"
        )
    if n_group > 1 and num_experts // n_group < 2:
        return (
            f"n_group={n_group} leaves {num_experts // n_group} expert per group; a group's "
            "score is the sum of its two best, so each needs at least 2"
        )
    if not 0 <= topk_group <= n_group:
        return f"topk_group={topk_group} must lie within 0..n_group={n_group} (0: all groups)"
    available = (topk_group or n_group) * (num_experts // n_group)
    if top_k > available:
        return (
            f"top_k={top_k} exceeds the {available} experts of the topk_group={topk_group} "
            f"groups of {num_experts // n_group} a token may choose from"
        )
    return ""
