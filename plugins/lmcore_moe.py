"""ffn=moe: a mixture of experts whose expert is any registered feed-forward component.

`moe(experts=8, top_k=2, renormalize=true)` is Mixtral's layer, `moe(experts=128, top_k=8,
renormalize=true)` Qwen3-MoE's with `norm_topk_prob`; `shared_d_ff` adds a shared expert
(DeepSeek-MoE's `n_shared_experts · moe_intermediate_size`, Qwen2-MoE's
`shared_expert_intermediate_size`), `shared_gate=sigmoid` its gate (Qwen2-MoE). `d_ff` is
each expert's hidden width. The module is `lmcore.model.moe.MixtureOfExperts`; this plugin
declares it: its arguments, and its parameters, FLOPs and activations from the expert's own
declarations, so a spec is checked and accounted before any weight exists.
"""

from __future__ import annotations

from typing import Any, Final

import torch

from lmcore import Arg, Component, get_registry, hookimpl
from lmcore.errors import RegistryError
from lmcore.model.moe import SOFTMAX_ORDERS, MixtureOfExperts
from lmcore.model.nn import gated_d_ff

NAME: Final = "moe"


class NamedExpert:
    """An expert named by its registered ffn, with that component's default arguments; what
    `moe` asks of its expert: `create`, `count` and `check_shape` for given dimensions."""

    def __init__(self, name: str):
        if name == NAME:
            raise ValueError(
                "expert='moe': an expert is a plain feed-forward component, not a mixture"
            )
        try:
            self.entry = get_registry().get("ffn", name)
        except RegistryError as e:
            raise ValueError(f"expert={name!r}: {e}") from None
        comp = self.entry.component
        required = [a.name for a in comp.args if a.required]
        if required:
            raise ValueError(
                f"expert={name!r} has required argument(s) {', '.join(required)}, which a bare "
                "expert name cannot give"
            )
        self.values = {a.name: a.default for a in comp.args}

    def create(self, *, device: Any = None, dtype: Any = None, **dims: Any) -> Any:
        return self.entry.invoke("build", {**dims, **self.values, "device": device, "dtype": dtype})

    def count(self, what: str, **dims: Any) -> int | None:
        return self.entry.count(what, {**dims, **self.values})

    def check_shape(self, **dims: Any) -> None:
        self.entry.invoke("validate", {**dims, **self.values}, allow=(ValueError,))


def _expert(expert: str) -> NamedExpert:
    return NamedExpert(expert)


def _count(expert: NamedExpert, what: str, **dims: Any) -> int:
    n = expert.count(what, **dims)
    return 0 if n is None else n


def build(
    d_model: int,
    d_ff: int,
    experts: int,
    top_k: int,
    expert: str,
    softmax: str,
    renormalize: bool,
    shared_d_ff: int,
    shared_gate: str,
    aux_loss_coef: float,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> MixtureOfExperts:
    part = _expert(expert)
    factory = {"device": device, "dtype": dtype, "d_model": d_model}
    gated = shared_gate == "sigmoid"
    return MixtureOfExperts(
        d_model,
        [part.create(d_ff=d_ff, **factory) for _ in range(experts)],
        top_k=top_k,
        softmax=softmax,
        renormalize=renormalize,
        shared=part.create(d_ff=shared_d_ff, **factory) if shared_d_ff else None,
        shared_gate=gated,
        aux_loss_coef=aux_loss_coef,
        device=device,
        dtype=dtype,
    )


def params(
    d_model: int, d_ff: int, experts: int, expert: str, shared_d_ff: int, shared_gate: str
) -> int:
    part = _expert(expert)
    total = d_model * experts + experts * _count(part, "params", d_model=d_model, d_ff=d_ff)
    if shared_d_ff:
        total += _count(part, "params", d_model=d_model, d_ff=shared_d_ff)
        total += d_model * (shared_gate == "sigmoid")
    return total


def active_params(
    d_model: int,
    d_ff: int,
    experts: int,
    top_k: int,
    expert: str,
    shared_d_ff: int,
    shared_gate: str,
) -> int:
    """The router, `top_k` experts and the shared expert (with its gate)."""
    part = _expert(expert)
    total = d_model * experts + top_k * _count(part, "params", d_model=d_model, d_ff=d_ff)
    if shared_d_ff:
        total += _count(part, "params", d_model=d_model, d_ff=shared_d_ff)
        total += d_model * (shared_gate == "sigmoid")
    return total


def flops(
    d_model: int,
    d_ff: int,
    experts: int,
    top_k: int,
    expert: str,
    shared_d_ff: int,
    shared_gate: str,
    seq_len: int,
) -> int:
    """The router's product, the experts' work on `top_k · seq_len` tokens (an expert's FLOPs
    grow linearly with its tokens), the shared expert's on all of them."""
    part = _expert(expert)
    tokens = {"d_model": d_model, "seq_len": seq_len, "kv_len": seq_len}
    total = 2 * seq_len * d_model * experts + top_k * _count(part, "flops", d_ff=d_ff, **tokens)
    if shared_d_ff:
        gate = 2 * seq_len * d_model if shared_gate == "sigmoid" else 0
        total += _count(part, "flops", d_ff=shared_d_ff, **tokens) + gate
    return total


def activations(
    batch: int,
    seq_len: int,
    d_model: int,
    d_ff: int,
    dtype: torch.dtype,
    experts: int,
    top_k: int,
    expert: str,
    softmax: str,
    renormalize: bool,
    shared_d_ff: int,
    shared_gate: str,
    aux_loss_coef: float,
) -> int | None:
    """Bytes a training forward keeps for backward; None when the expert declares none.

    The input x (kept by the router); the float32 softmax; the top-k's int64 indices (and, with
    renormalisation, the float32 top-k weights and their sum; with the softmax after, the
    float32 softmax over the k); the load-balancing loss's float32 token shares; the int64
    token index of each sorted assignment and the sort order; what the experts keep for their
    `top_k · tokens` inputs, by their own declaration; the experts' outputs and the weights
    they are scaled by; the shared expert's own (less its input, which is x) and its gate's.
    """
    part = _expert(expert)
    tokens, size = batch * seq_len, dtype.itemsize
    assigned = tokens * top_k
    kept = part.count(
        "activations", d_model=d_model, d_ff=d_ff, batch=1, seq_len=assigned, kv_len=assigned,
        dtype=dtype,
    )  # fmt: skip
    if kept is None:
        return None
    total = tokens * d_model * size + assigned * 8 + kept
    if softmax == "before":
        total += tokens * experts * 4
        total += (assigned * 4 + tokens * 4) if renormalize else 0
    else:
        total += assigned * 4 + (tokens * experts * 4 if aux_loss_coef > 0 else 0)
    total += experts * 4 if aux_loss_coef > 0 else 0
    total += 2 * assigned * 8  # the token of each sorted assignment, and the sort order
    total += assigned * (d_model + 1) * size  # the experts' outputs and their weights
    if shared_d_ff:
        own = part.count(
            "activations", d_model=d_model, d_ff=shared_d_ff, batch=batch, seq_len=seq_len,
            kv_len=seq_len, dtype=dtype,
        )  # fmt: skip
        if own is None:
            return None
        total += own - tokens * d_model * size
        total += tokens * (1 + d_model) * size if shared_gate == "sigmoid" else 0
    return total


def validate(
    d_model: int,
    d_ff: int,
    experts: int,
    top_k: int,
    expert: str,
    softmax: str,
    renormalize: bool,
    shared_d_ff: int,
    shared_gate: str,
) -> None:
    if top_k > experts:
        raise ValueError(f"top_k={top_k} exceeds experts={experts}; a token picks top_k of them")
    if softmax == "after" and renormalize:
        raise ValueError(
            "softmax=after already gives top-k weights that sum to 1; renormalize=true would "
            "repeat it (it is for softmax=before); drop it"
        )
    if shared_gate != "none" and not shared_d_ff:
        raise ValueError(
            f"shared_gate={shared_gate} gates the shared expert; give its width shared_d_ff"
        )
    part = _expert(expert)
    for width in (d_ff, shared_d_ff) if shared_d_ff else (d_ff,):
        part.check_shape(d_model=d_model, d_ff=width)


ARGS: Final = (
    Arg("experts", int, 8, "number of routed experts E", ge=1),
    Arg("top_k", int, 2, "experts each token is routed to", ge=1),
    Arg("expert", str, "swiglu", "the feed-forward component each expert is (d_ff wide)"),
    Arg(
        "softmax",
        str,
        "before",
        "softmax over all experts before the top-k, or over the k chosen logits after it",
        choices=SOFTMAX_ORDERS,
    ),
    Arg("renormalize", bool, False, "rescale the top-k weights to sum to 1 (softmax=before)"),
    Arg("shared_d_ff", int, 0, "hidden width of a shared expert every token uses; 0: none", ge=0),
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
            default_d_ff=gated_d_ff,
            validate=validate,
            features=frozenset({"compile"}),
        )
    ]
