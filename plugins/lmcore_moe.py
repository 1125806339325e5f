"""ffn=moe: a mixture of experts whose expert is any registered feed-forward component.

`moe(num_experts=8, top_k=2, renormalize=true)` is Mixtral's layer, `moe(num_experts=128,
top_k=8, renormalize=true)` Qwen3-MoE's with `norm_topk_prob`. `expert=` is the ffn every expert
is (default swiglu, Mixtral's `w1, w2, w3`), `d_ff` each expert's hidden width (the model's
`d_ff`, or `moe(d_ff=...)`); `shared=` adds a shared expert every token passes through, e.g.
`shared=swiglu(d_ff=5632)` (DeepSeek-MoE's `n_shared_experts · moe_intermediate_size`, Qwen2-MoE's
`shared_expert_intermediate_size`; without its own `d_ff`, the experts'), `shared_gate=sigmoid`
its gate (Qwen2-MoE).

The frontier's routing: `score=sigmoid` (each expert's sigmoid of its float32 logit),
`n_group`/`topk_group` (group-limited top-k), `score_bias=true` (a score-correction bias that
chooses but does not weight), `scale` (the routed scaling factor) and `router_bias=true`:
DeepSeek-V3's layer is `moe(num_experts=256, top_k=8, score=sigmoid, n_group=8, topk_group=4,
score_bias=true, renormalize=true, scale=2.5, shared=swiglu(d_ff=2048), aux_loss_coef=0)`,
gpt-oss's `moe(num_experts=128, top_k=4, softmax=after, router_bias=true, ...)`.

The module is `lmcore.model.moe.MixtureOfExperts`; this plugin declares it: its arguments, and
its parameters, FLOPs and activations from the experts' own declarations, so a spec is checked
and accounted before any weight exists.
"""

from __future__ import annotations

from typing import Any, Final

import torch

from lmcore import Arg, Component, hookimpl
from lmcore.blueprint import Part
from lmcore.model.moe import SCORES, SOFTMAX_ORDERS, MixtureOfExperts, routing_problem
from lmcore.model.nn import gated_d_ff

NAME: Final = "moe"


def _count(part: Part, what: str, **dims: Any) -> int:
    n = part.count(what, **dims)
    return 0 if n is None else n


def _gate(shared: Part | None, shared_gate: str) -> bool:
    return shared is not None and shared_gate == "sigmoid"


def build(
    d_model: int,
    d_ff: int,
    num_experts: int,
    top_k: int,
    expert: Part,
    softmax: str,
    renormalize: bool,
    shared: Part | None,
    shared_gate: str,
    aux_loss_coef: float,
    score: str = "softmax",
    n_group: int = 1,
    topk_group: int = 0,
    score_bias: bool = False,
    scale: float = 1.0,
    router_bias: bool = False,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> MixtureOfExperts:
    factory = {"device": device, "dtype": dtype, "d_model": d_model, "d_ff": d_ff}
    return MixtureOfExperts(
        d_model,
        [expert.create(**factory) for _ in range(num_experts)],
        top_k=top_k,
        softmax=softmax,
        renormalize=renormalize,
        shared=None if shared is None else shared.create(**factory),
        shared_gate=_gate(shared, shared_gate),
        aux_loss_coef=aux_loss_coef,
        score=score,
        n_group=n_group,
        topk_group=topk_group,
        score_bias=score_bias,
        scale=scale,
        router_bias=router_bias,
        device=device,
        dtype=dtype,
    )


def params(
    d_model: int,
    d_ff: int,
    num_experts: int,
    expert: Part,
    shared: Part | None,
    shared_gate: str,
    score_bias: bool = False,
    router_bias: bool = False,
) -> int:
    return _params(
        d_model, d_ff, num_experts, num_experts, expert, shared, shared_gate,
        score_bias, router_bias,
    )  # fmt: skip


def active_params(
    d_model: int,
    d_ff: int,
    num_experts: int,
    top_k: int,
    expert: Part,
    shared: Part | None,
    shared_gate: str,
    score_bias: bool = False,
    router_bias: bool = False,
) -> int:
    """The router (its biases), `top_k` experts and the shared expert (with its gate)."""
    return _params(
        d_model, d_ff, num_experts, top_k, expert, shared, shared_gate, score_bias, router_bias
    )


def _params(
    d_model: int,
    d_ff: int,
    num_experts: int,
    used: int,
    expert: Part,
    shared: Part | None,
    shared_gate: str,
    score_bias: bool,
    router_bias: bool,
) -> int:
    total = d_model * num_experts + used * _count(expert, "params", d_model=d_model, d_ff=d_ff)
    total += num_experts * router_bias  # score_bias is a buffer, as transformers' is
    if shared is not None:
        total += _count(shared, "params", d_model=d_model, d_ff=d_ff)
        total += d_model * _gate(shared, shared_gate)
    return total


def flops(
    d_model: int,
    d_ff: int,
    num_experts: int,
    top_k: int,
    expert: Part,
    shared: Part | None,
    shared_gate: str,
    seq_len: int,
) -> int:
    """The router's product, the experts' work on `top_k · seq_len` tokens (an expert's FLOPs
    grow linearly with its tokens), the shared expert's on all of them."""
    dims = {"d_model": d_model, "d_ff": d_ff, "seq_len": seq_len, "kv_len": seq_len}
    total = 2 * seq_len * d_model * num_experts + top_k * _count(expert, "flops", **dims)
    if shared is not None:
        total += _count(shared, "flops", **dims)
        total += 2 * seq_len * d_model * _gate(shared, shared_gate)
    return total


def activations(
    batch: int,
    seq_len: int,
    d_model: int,
    d_ff: int,
    dtype: torch.dtype,
    num_experts: int,
    top_k: int,
    expert: Part,
    softmax: str,
    renormalize: bool,
    shared: Part | None,
    shared_gate: str,
    aux_loss_coef: float,
    score: str = "softmax",
) -> int | None:
    """Bytes a training forward keeps for backward; None when an expert declares none.

    The input x (kept by the router); the float32 softmax or sigmoid; the top-k's int64 indices
    (and, with renormalisation, the float32 top-k weights and their sum; with the softmax after,
    the float32 softmax over the k); the load-balancing loss's float32 token shares (and, with
    sigmoid scores, each token's float32 sum of them, which normalises them); the int64
    token index of each sorted assignment and the sort order; what the experts keep for their
    `top_k · tokens` inputs, by their own declaration; the experts' outputs and the weights
    they are scaled by; the shared expert's own (less its input, which is x) and its gate's.
    """
    tokens, size = batch * seq_len, dtype.itemsize
    assigned = tokens * top_k
    kept = expert.count(
        "activations", d_model=d_model, d_ff=d_ff, batch=1, seq_len=assigned, kv_len=assigned,
        dtype=dtype,
    )  # fmt: skip
    if kept is None:
        return None
    total = tokens * d_model * size + assigned * 8 + kept
    if softmax == "before" or score == "sigmoid":
        total += tokens * num_experts * 4
        total += (assigned * 4 + tokens * 4) if renormalize else 0
        total += tokens * 4 if score == "sigmoid" and aux_loss_coef > 0 else 0
    else:
        total += assigned * 4 + (tokens * num_experts * 4 if aux_loss_coef > 0 else 0)
    total += num_experts * 4 if aux_loss_coef > 0 else 0
    total += 2 * assigned * 8  # the token of each sorted assignment, and the sort order
    total += assigned * (d_model + 1) * size  # the experts' outputs and their weights
    if shared is not None:
        own = shared.count(
            "activations", d_model=d_model, d_ff=d_ff, batch=batch, seq_len=seq_len,
            kv_len=seq_len, dtype=dtype,
        )  # fmt: skip
        if own is None:
            return None
        total += own - tokens * d_model * size
        total += tokens * (1 + d_model) * size if _gate(shared, shared_gate) else 0
    return total


# The module objects of an expert that does not declare its own: a gated feed-forward network
# and its three projections.
EXPERT_MODULES: Final = 4


def modules(
    d_model: int, d_ff: int, num_experts: int, expert: Part, shared: Part | None, shared_gate: str
) -> int:
    """The layer, its router and expert list, each expert's modules, the shared expert's and
    its gate: the host memory and build time of a mixture grow with its experts."""

    def of(part: Part) -> int:
        n = part.count("modules", d_model=d_model, d_ff=d_ff)
        return EXPERT_MODULES if n is None else n

    total = 3 + num_experts * of(expert)
    if shared is not None:
        total += of(shared) + _gate(shared, shared_gate)
    return total


def validate(
    d_model: int,
    d_ff: int,
    num_experts: int,
    top_k: int,
    expert: Part,
    softmax: str,
    renormalize: bool,
    shared: Part | None,
    shared_gate: str,
    score: str = "softmax",
    n_group: int = 1,
    topk_group: int = 0,
    score_bias: bool = False,
) -> None:
    problem = routing_problem(
        num_experts, top_k, softmax, renormalize, score, n_group, topk_group, score_bias
    )
    if problem:
        raise ValueError(problem)
    if shared_gate != "none" and shared is None:
        raise ValueError(
            f"shared_gate={shared_gate} gates the shared expert; give one, e.g. "
            "shared=swiglu(d_ff=...)"
        )
    for which, part in (("expert", expert), ("shared", shared)):
        if part is None:
            continue
        if part.name == NAME:
            raise ValueError(f"{which}={part.spec}: an expert is a plain feed-forward network")
        if which == "expert" and "d_ff" in part.kwargs():
            raise ValueError(
                f"expert={part.spec}: the experts' width is the moe's d_ff (the model's d_ff, "
                f"or moe(d_ff={part.kwargs()['d_ff']})); drop d_ff from the expert"
            )
        part.check_shape(d_model=d_model, d_ff=d_ff)


ARGS: Final = (
    Arg("num_experts", int, 8, "number of routed experts E", ge=1),
    Arg("top_k", int, 2, "experts each token is routed to", ge=1),
    Arg("expert", "ffn", "swiglu", "the feed-forward network each expert is (d_ff wide)"),
    Arg(
        "softmax",
        str,
        "before",
        "softmax over all experts before the top-k, or over the k chosen logits after it",
        choices=SOFTMAX_ORDERS,
    ),
    Arg("renormalize", bool, False, "rescale the top-k weights to sum to 1 (softmax=before)"),
    Arg("shared", "ffn", None, "a shared expert every token passes through; none: no shared one"),
    Arg(
        "shared_gate",
        str,
        "none",
        "none, or sigmoid: scale the shared expert by sigmoid(shared_gate x) (Qwen2-MoE)",
        choices=("none", "sigmoid"),
    ),
    Arg(
        "aux_loss_coef",
        float,
        0.01,
        "weight of the load-balancing loss added to the training loss",
        ge=0.0,
    ),
    Arg(
        "score",
        str,
        "softmax",
        "softmax over the experts, or sigmoid: each expert's own sigmoid of its float32 logit "
        "(DeepSeek-V3)",
        choices=SCORES,
        written="changed",
    ),
    Arg(
        "n_group",
        int,
        1,
        "groups the experts fall into for group-limited top-k (DeepSeek-V3)",
        ge=1,
        written="changed",
    ),
    Arg(
        "topk_group",
        int,
        0,
        "the best groups (by the sum of their two best scores) whose experts a token may "
        "choose; 0: all",
        ge=0,
        written="changed",
    ),
    Arg(
        "score_bias",
        bool,
        False,
        "a score-correction bias (E,) added to the scores to choose the experts, not to "
        "weight them (DeepSeek-V3's e_score_correction_bias)",
        written="changed",
    ),
    Arg(
        "scale",
        float,
        1.0,
        "the routed scaling factor multiplying the chosen experts' weights, after "
        "renormalisation (DeepSeek-V3's routed_scaling_factor)",
        gt=0.0,
        written="changed",
    ),
    Arg("router_bias", bool, False, "the router has a bias (gpt-oss)", written="changed"),
)


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="ffn",
            name=NAME,
            build=build,
            args=ARGS,
            help="mixture of experts: a router sends each token to top_k of E experts",
            params=params,
            flops=flops,
            activations=activations,
            active_params=active_params,
            modules=modules,
            default_d_ff=gated_d_ff,
            validate=validate,
            features=frozenset({"compile"}),
        )
    ]
