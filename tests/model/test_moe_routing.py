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
    """The mixture written out token by token, from the definition (DeepSeek-V3's routing
    included: sigmoid scores, the bias that only chooses, the groups, the scale)."""
    E, k = layer.num_experts, layer.top_k
    out = []
    for token in x.reshape(-1, D):
        logits = token @ layer.router.weight.T  # (E,)
        if layer.router.bias is not None:
            logits = logits + layer.router.bias
        if layer.softmax_first or layer.sigmoid:
            if layer.sigmoid:
                scores = 1 / (1 + torch.exp(-logits))
            else:
                scores = torch.exp(logits - logits.max()) / torch.exp(logits - logits.max()).sum()
            bias = [0.0] * E if layer.score_bias is None else layer.score_bias.tolist()
            choice = [float(scores[e].detach()) + bias[e] for e in range(E)]
            size = E // layer.n_group
            groups = [choice[g * size : (g + 1) * size] for g in range(layer.n_group)]
            best = sorted(range(layer.n_group), key=lambda g: -sum(sorted(groups[g])[-2:]))
            allowed = {e for g in best[: layer.topk_group] for e in range(g * size, (g + 1) * size)}
            top = sorted(allowed, key=lambda e: -choice[e])[:k]
            weights = [scores[e] for e in top]
            if layer.renormalize:
                total = sum(weights)
                weights = [w / (total + 1e-20 if layer.sigmoid else total) for w in weights]
        else:
            top = sorted(range(E), key=lambda e: -float(logits[e].detach()))[:k]
            chosen = torch.stack([logits[e] for e in top])
            weights = list(
                torch.exp(chosen - chosen.max()) / torch.exp(chosen - chosen.max()).sum()
            )
        weights = [w * layer.scale for w in weights]
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
    {"score": "sigmoid"},
    {"score": "sigmoid", "renormalize": "true", "scale": 2.5, "router_bias": "true"},
    {"score": "sigmoid", "n_group": 4, "topk_group": 2, "score_bias": "true", "top_k": 3},
    {
        "score": "sigmoid",
        "n_group": 2,
        "topk_group": 1,
        "renormalize": "true",
        "shared": "swiglu(d_ff=32)",
    },
    {"n_group": 4, "topk_group": 1, "score_bias": "true", "renormalize": "true", "scale": 0.5},
    {"softmax": "after", "router_bias": "true", "scale": 3.0},
    {"score_bias": "true", "top_k": 3},
]


@pytest.mark.parametrize("kw", ROUTINGS, ids=[str(k) for k in ROUTINGS])
def test_the_router_and_dispatch_equal_a_per_token_loop(kw: dict[str, Any]) -> None:
    torch.manual_seed(0)
    layer = moe(**kw).double()
    with torch.no_grad():  # biases large enough to change choices
        for p in (layer.router.bias, layer.score_bias):
            if p is not None:
                p.copy_(torch.randn(p.shape, dtype=p.dtype) * 0.5)
    x = torch.randn(3, 7, D, dtype=torch.float64, requires_grad=True)
    got, want = layer(x), per_token(layer, x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    g = torch.randn_like(got)  # and the same gradients, for the input and every parameter
    inputs = [x, *(p for p in layer.parameters() if p.requires_grad)]
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


def _deepseek_v3(layer: MixtureOfExperts, norm: bool, shared: int) -> Any:
    """transformers' `DeepseekV3MoE` holding `layer`'s router, bias, experts and shared experts."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    config = DeepseekV3Config(
        hidden_size=D, moe_intermediate_size=D_FF, n_routed_experts=layer.num_experts,
        num_experts_per_tok=layer.top_k, n_group=layer.n_group, topk_group=layer.topk_group,
        norm_topk_prob=norm, routed_scaling_factor=layer.scale, n_shared_experts=shared,
    )  # fmt: skip
    hf: Any = DeepseekV3MoE(config)
    _hf_experts(hf, layer)
    s = layer.shared
    assert s is not None and layer.score_bias is not None
    with torch.no_grad():
        hf.gate.e_score_correction_bias.copy_(layer.score_bias)
        hf.shared_experts.gate_proj.weight.copy_(s.w1.weight)
        hf.shared_experts.up_proj.weight.copy_(s.w3.weight)
        hf.shared_experts.down_proj.weight.copy_(s.w2.weight)
    return hf


@pytest.mark.parametrize("norm", [True, False], ids=["renormalize", "raw"])
def test_sigmoid_group_limited_routing_equals_deepseek_v3s_moe_on_the_same_weights(
    norm: bool,
) -> None:
    """sigmoid + groups + score bias + scale (+ renormalisation) + shared experts: the chosen
    experts, their weights and the layer's output are transformers' DeepseekV3MoE's."""
    torch.manual_seed(0)
    E, k, shared = 16, 4, 2
    layer = moe(num_experts=E, top_k=k, score="sigmoid", n_group=4, topk_group=2,
                score_bias="true", renormalize=str(norm).lower(), scale=2.5,
                shared=f"swiglu(d_ff={shared * D_FF})", aux_loss_coef=0)  # fmt: skip
    with torch.no_grad():
        assert layer.score_bias is not None
        layer.score_bias.copy_(torch.randn(E) * 0.2)  # enough to change choices
    hf = _deepseek_v3(layer, norm, shared)
    x = torch.randn(3, 11, D)
    _, hf_weights, hf_chosen = hf.gate(x)
    weights, chosen, _ = layer.route(layer.logits(x.reshape(-1, D)))
    # the same experts per token, each with the same weight (HF's order is unsorted)
    mine, theirs = chosen.sort(dim=-1), hf_chosen.sort(dim=-1)
    assert torch.equal(mine.values, theirs.values)
    torch.testing.assert_close(weights.gather(1, mine.indices),
                               hf_weights.gather(1, theirs.indices), rtol=1e-6, atol=1e-7)  # fmt: skip
    assert weights.dtype == hf_weights.dtype == torch.float32
    torch.testing.assert_close(layer(x), hf(x), rtol=1e-5, atol=1e-6)
    # and the bias and the groups matter here: without them other experts are chosen
    plain = layer.logits(x.reshape(-1, D)).sigmoid().topk(k, dim=-1).indices.sort(dim=-1).values
    assert not torch.equal(plain, mine.values)


def test_the_score_bias_changes_which_experts_are_chosen_not_their_weights() -> None:
    torch.manual_seed(0)
    layer = moe(num_experts=8, top_k=2, score="sigmoid", score_bias="true")
    x = torch.randn(40, D)
    logits = layer.logits(x)
    scores = torch.sigmoid(logits)
    assert layer.score_bias is not None
    with torch.no_grad():
        layer.score_bias.fill_(3.0)  # the same for every expert: the same choice
    weights, chosen, _ = layer.route(logits)
    top = scores.topk(2, dim=-1)
    assert torch.equal(chosen, top.indices) and torch.equal(weights, top.values)
    with torch.no_grad():
        layer.score_bias.zero_()
        layer.score_bias[5] = 2.0  # above any difference of sigmoids: expert 5 always chosen
    weights, chosen, _ = layer.route(logits)
    assert bool((chosen == 5).any(dim=-1).all())
    assert not torch.equal(chosen.sort(dim=-1).values, top.indices.sort(dim=-1).values)
    # each chosen expert is weighted by its own sigmoid score, the bias left out
    torch.testing.assert_close(weights, scores.gather(1, chosen), rtol=0, atol=0)


def test_the_score_bias_is_in_the_state_dict_and_gets_no_gradient() -> None:
    model = build_model(f"{SMALL}, ffn=moe(num_experts=4, top_k=2, score=sigmoid, n_group=2, "
                        "topk_group=1, score_bias=true, router_bias=true)")  # fmt: skip
    keys = set(model.state_dict())
    assert {"layers.0.ffn.score_bias", "layers.0.ffn.router.bias"} <= keys
    ffn = model.layers[0].ffn
    assert isinstance(ffn, MixtureOfExperts) and ffn.score_bias is not None
    assert ffn.score_bias.shape == (4,) and not ffn.score_bias.requires_grad
    model(torch.randint(0, 97, (2, 8))).sum().backward()
    assert ffn.score_bias.grad is None
    assert ffn.router.bias is not None and ffn.router.bias.grad is not None
    from lmcore.train.config import TrainConfig
    from lmcore.train.optim import role_groups

    names = {n for ns in role_groups(model, TrainConfig())[1] for n in ns}
    assert "layers.0.ffn.score_bias" not in names and "layers.0.ffn.router.bias" in names


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"score": "sigmoid", "softmax": "after"}, "score=sigmoid has no softmax"),
        ({"num_experts": 6, "n_group": 4}, "n_group=4 does not divide num_experts=6"),
        ({"num_experts": 4, "n_group": 4}, "leaves 1 expert per group"),
        ({"n_group": 2, "topk_group": 3}, r"topk_group=3 must lie within 0..n_group=2"),
        ({"n_group": 4, "topk_group": 1, "top_k": 3}, "top_k=3 exceeds the 2 experts"),
    ],
)
def test_the_module_refuses_what_the_spec_refuses(kw: dict[str, Any], message: str) -> None:
    from lmcore.errors import ConfigError
    from lmcore.model.nn import FeedForward

    kw = {"num_experts": 8, "top_k": 2, **kw}
    experts = [FeedForward(D, D_FF, torch.relu, gated=False) for _ in range(kw.pop("num_experts"))]
    with pytest.raises(ConfigError, match=message):
        MixtureOfExperts(D, experts, **kw)
