"""lmcore.model.moe: the router and dispatch against a written-out per-token loop, the
load-balancing loss against its formula (and Hugging Face's), the layer against transformers'
Mixtral, Qwen3-MoE and Qwen2-MoE blocks on the same weights, and compiled against eager."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import lmcore
from lmcore import build_model
from lmcore.model.moe import MixtureOfExperts

D, D_FF = 16, 24


BASE = "vocab_size=97, context_length=16, d_model=32, num_heads=2, d_ff=48"


SMALL = f"{BASE}, num_layers=2"


def moe(**kw: Any) -> MixtureOfExperts:
    """A mixture built as a model builds it, from `moe(...)` with these arguments."""
    args = ", ".join(f"{k}={v}" for k, v in kw.items())
    bp = lmcore.resolve(f"vocab_size=97, context_length=16, d_model={D}, num_layers=1, "
                        f"num_heads=2, d_ff={D_FF}, ffn=moe({args})")  # fmt: skip
    layer = bp.create("ffn")
    assert isinstance(layer, MixtureOfExperts)
    return layer


def per_token(layer: MixtureOfExperts, x: torch.Tensor) -> torch.Tensor:
    """The mixture written out token by token, from the definition."""
    out = []
    for token in x.reshape(-1, D):
        logits = token @ layer.router.weight.T  # (E,)
        if layer.softmax_first:
            probs = torch.exp(logits - logits.max()) / torch.exp(logits - logits.max()).sum()
            top = sorted(range(layer.num_experts), key=lambda e: -float(probs[e].detach()))[
                : layer.top_k
            ]
            weights = [probs[e] for e in top]
            if layer.renormalize:
                total = sum(weights)
                weights = [w / total for w in weights]
        else:
            top = sorted(range(layer.num_experts), key=lambda e: -float(logits[e].detach()))[
                : layer.top_k
            ]
            chosen = torch.stack([logits[e] for e in top])
            weights = list(
                torch.exp(chosen - chosen.max()) / torch.exp(chosen - chosen.max()).sum()
            )
        y = sum(w * layer.experts[e](token[None])[0] for w, e in zip(weights, top, strict=True))
        if layer.shared is not None:
            s = layer.shared(token[None])[0]
            if layer.shared_gate is not None:
                s = s * torch.sigmoid(token @ layer.shared_gate.weight[0])
            y = y + s
        out.append(y)
    return torch.stack(out).reshape(x.shape)


ROUTINGS = [
    {},
    {"renormalize": "true"},
    {"softmax": "after", "top_k": 3},
    {"top_k": 1, "num_experts": 5},
    {"shared": "swiglu(d_ff=32)"},
    {"shared": "swiglu", "shared_gate": "sigmoid", "renormalize": "true"},
    {"expert": "gelu(bias=true, approximate=tanh)", "num_experts": 3},
]


@pytest.mark.parametrize("kw", ROUTINGS, ids=[str(k) for k in ROUTINGS])
def test_the_router_and_dispatch_equal_a_per_token_loop(kw: dict[str, Any]) -> None:
    torch.manual_seed(0)
    layer = moe(**kw).double()
    x = torch.randn(3, 7, D, dtype=torch.float64, requires_grad=True)
    got, want = layer(x), per_token(layer, x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    g = torch.randn_like(got)  # and the same gradients, for the input and every parameter
    inputs = [x, *layer.parameters()]
    for a, b in zip(torch.autograd.grad(got, inputs, g, allow_unused=True),
                    torch.autograd.grad(want, inputs, g, allow_unused=True), strict=True):  # fmt: skip
        assert (a is None) == (b is None) or float(a.abs().sum()) == 0
        if b is not None:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_each_expert_runs_once_per_forward_on_its_tokens_and_idle_ones_on_none() -> None:
    torch.manual_seed(0)
    layer = moe(num_experts=6, top_k=2)
    with torch.no_grad():
        layer.router.weight[5] = -100.0  # a large negative logit: expert 5 is never chosen
    seen: list[int] = []
    for expert in layer.experts:
        expert.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[0]))
    x = torch.rand(2, 9, D) + 0.1
    layer(x).sum().backward()
    assert len(seen) == 6 and seen[5] == 0 and sum(seen) == 2 * 9 * 2
    # every parameter takes part in backward, the idle expert's with zeros (DDP needs it)
    assert all(p.grad is not None for p in layer.parameters())
    assert all(float(p.grad.abs().sum()) == 0 for p in layer.experts[5].parameters())


def test_the_load_balancing_loss_is_the_switch_formula_and_hugging_faces() -> None:
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    torch.manual_seed(0)
    layer = moe(num_experts=4, top_k=2, aux_loss_coef=0.3)
    x = torch.randn(2, 11, D)
    layer(x)
    logits = x.reshape(-1, D) @ layer.router.weight.T
    probs = torch.softmax(logits, dim=-1)
    chosen = probs.topk(2, dim=-1).indices
    share = torch.stack([(chosen == e).float().sum() / 22 for e in range(4)])
    expected = 0.3 * 4 * (share * probs.mean(dim=0)).sum()
    assert layer.aux_loss is not None
    torch.testing.assert_close(layer.aux_loss, expected)
    hf = load_balancing_loss_func((logits,), num_experts=4, top_k=2)
    torch.testing.assert_close(layer.aux_loss, 0.3 * hf)
    # a gradient reaches the router through it
    layer.aux_loss.backward()
    assert layer.router.weight.grad is not None and bool(layer.router.weight.grad.ne(0).any())


def test_no_aux_loss_in_eval_mode_without_gradients_or_with_a_zero_coefficient() -> None:
    layer, x = moe(), torch.randn(2, 3, D)
    layer.eval()
    layer(x)
    assert layer.aux_loss is None
    layer.train()
    with torch.no_grad():
        layer(x)
    assert layer.aux_loss is None
    zero = moe(aux_loss_coef=0.0)
    zero(x)
    assert zero.aux_loss is None
    empty = layer(torch.randn(0, D))  # no token: nothing routed, nothing to balance
    assert empty.shape == (0, D) and layer.aux_loss is None


def test_the_model_sums_the_layers_aux_losses() -> None:
    model = build_model(f"{SMALL}, ffn=moe(num_experts=4, top_k=2)")
    model(torch.randint(0, 97, (2, 8)))
    first, second = (layer.ffn.aux_loss for layer in model.layers)
    total = model.aux_loss()
    assert total is not None and first is not None and second is not None
    torch.testing.assert_close(total, first + second)
    assert build_model(SMALL).aux_loss() is None


def _hf_experts(hf: Any, layer: MixtureOfExperts) -> None:
    """Copy lmcore's router and SwiGLU experts into a transformers block (5.x: 3-D weights)."""
    with torch.no_grad():
        hf.gate.weight.copy_(layer.router.weight)
        for e, expert in enumerate(layer.experts):
            hf.experts.gate_up_proj[e].copy_(torch.cat([expert.w1.weight, expert.w3.weight]))
            hf.experts.down_proj[e].copy_(expert.w2.weight)


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "qwen3_moe-norm", "qwen2_moe"])
def test_the_layer_equals_transformers_block_on_the_same_weights(family: str) -> None:
    torch.manual_seed(0)
    E, k = 8, 2
    if family == "mixtral":
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

        config: Any = MixtralConfig(hidden_size=D, intermediate_size=D_FF, num_local_experts=E,
                                    num_experts_per_tok=k)  # fmt: skip
        hf: Any = MixtralSparseMoeBlock(config)
        layer = moe(num_experts=E, top_k=k, renormalize="true")
    elif family.startswith("qwen3_moe"):
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

        norm = family.endswith("norm")
        config = Qwen3MoeConfig(hidden_size=D, moe_intermediate_size=D_FF, num_experts=E,
                                num_experts_per_tok=k, norm_topk_prob=norm)  # fmt: skip
        hf = Qwen3MoeSparseMoeBlock(config)
        layer = moe(num_experts=E, top_k=k, renormalize=str(norm).lower())
    else:
        from transformers import Qwen2MoeConfig
        from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

        config = Qwen2MoeConfig(hidden_size=D, moe_intermediate_size=D_FF, num_experts=E,
                                num_experts_per_tok=k, shared_expert_intermediate_size=40)  # fmt: skip
        hf = Qwen2MoeSparseMoeBlock(config)
        layer = moe(num_experts=E, top_k=k, shared="swiglu(d_ff=40)", shared_gate="sigmoid")
        with torch.no_grad():
            s = layer.shared
            assert s is not None and layer.shared_gate is not None
            hf.shared_expert.gate_proj.weight.copy_(s.w1.weight)
            hf.shared_expert.up_proj.weight.copy_(s.w3.weight)
            hf.shared_expert.down_proj.weight.copy_(s.w2.weight)
            hf.shared_expert_gate.weight.copy_(layer.shared_gate.weight)
    _hf_experts(hf, layer)
    x = torch.randn(2, 13, D)
    torch.testing.assert_close(layer(x), hf(x), rtol=1e-5, atol=1e-6)


def test_state_dict_keys_map_one_to_one_onto_mixtrals_checkpoint_names() -> None:
    model = build_model(
        f"{SMALL}, ffn=moe(num_experts=3, top_k=2, shared=swiglu(d_ff=16), shared_gate=sigmoid)"
    )
    keys = {k for k in model.state_dict() if k.startswith("layers.0.ffn.")}
    experts = {f"layers.0.ffn.experts.{e}.{w}.weight" for e in range(3) for w in ("w1", "w2", "w3")}
    shared = {f"layers.0.ffn.shared.{w}.weight" for w in ("w1", "w2", "w3")}
    assert (
        keys == {"layers.0.ffn.router.weight", "layers.0.ffn.shared_gate.weight"} | experts | shared
    )


def test_compiled_forward_and_aux_loss_match_eager_without_recompiling_per_routing() -> None:
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = build_model(f"{BASE}, num_layers=1, ffn=moe(num_experts=4, top_k=2)")
    compiled = torch.compile(model, backend="aot_eager")
    torch.compiler.reset()
    compiles = []
    try:
        for seed in range(4):  # a new routing each time, the same shapes
            x = torch.randint(0, 97, (2, 8), generator=torch.Generator().manual_seed(seed))
            got, got_aux = compiled(x), model.aux_loss()
            compiles.append(sum(counters["frames"].values()))
            want, want_aux = model(x), model.aux_loss()
            torch.testing.assert_close(got, want)
            assert got_aux is not None and want_aux is not None
            torch.testing.assert_close(got_aux, want_aux)
    finally:
        torch.compiler.reset()
    # After the second call (the first makes the uncompiled dispatch, a one-off recompile of
    # the tiny frame that looks it up), a new routing compiles nothing anew.
    assert compiles[0] > 0 and compiles[1:] == [compiles[1]] * 3
