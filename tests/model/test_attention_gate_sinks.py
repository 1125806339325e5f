"""The frontier's attention options: the output gate (`attn_gate`, Qwen3-Next), attention sinks
(`attn_sinks`, gpt-oss) and per-layer rotary bases (`pos[layers]=rope(theta=...)`, Gemma 3),
against transformers' own attention modules with copied weights and written-out formulas; the
sinks refused by name by a kernel without them; their sizes counted exactly; the tensor-parallel
plan; torch.compile."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from lmcore import SpecError, build_model, parse_spec
from lmcore.interfaces import LayerContext
from lmcore.model.counting import account
from lmcore.registry import scoped_registry
from tests.helpers.errors import raises_naming
from tests.helpers.plugins import plain_kernel

BASE = "vocab_size=97, context_length=16, d_model=32, num_layers=3, num_heads=4, d_ff=48"


def causal_additive(t: int) -> Tensor:
    """transformers' eager mask: 0 where a query may attend, -inf elsewhere, (1, 1, T, T)."""
    keep = torch.ones(t, t, dtype=torch.bool).tril()
    return torch.zeros(t, t).masked_fill(~keep, -math.inf)[None, None]


def no_rotation(t: int, head_dim: int) -> tuple[Tensor, Tensor]:
    """cos = 1, sin = 0: transformers' attention without a rotation (lmcore's pos=nope)."""
    return torch.ones(1, t, head_dim), torch.zeros(1, t, head_dim)


def perturb(model: torch.nn.Module, seed: int = 0) -> None:
    """Gains, biases and sinks off their initial values, so a formula ignoring them shows."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.5 * torch.randn_like(p))


# ------------------------------------------------------------------------------ the gate


def test_the_gate_is_qwen3_nexts_gated_attention_with_its_fused_q_proj_split() -> None:
    from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention

    heads, kv_heads, hd, d = 4, 2, 8, 32
    config = Qwen3NextConfig(hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv_heads,
                             head_dim=hd, attention_bias=True, rms_norm_eps=1e-6)  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    theirs = Qwen3NextAttention(config, layer_idx=0).double()
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(0.3 * torch.randn_like(p))
    spec = (f"{BASE}, num_kv_heads={kv_heads}, head_dim={hd}, pos=nope, "
            "attn_gate=true, qkv_bias=true, out_bias=true, qk_norm=rmsnorm(eps=1e-6)")  # fmt: skip
    ours = build_model(spec, dtype=torch.float64).layers[0].attn
    w = theirs.state_dict()
    # Qwen3-Next's q_proj holds each head's query rows, then its gate rows: (H, 2·D, d_model).
    q_rows, gate_rows = w["q_proj.weight"].view(heads, 2, hd, d).unbind(1)
    q_bias, gate_bias = w["q_proj.bias"].view(heads, 2, hd).unbind(1)
    mapped = {
        "q_proj.weight": q_rows.reshape(-1, d), "q_proj.bias": q_bias.reshape(-1),
        "gate_proj.weight": gate_rows.reshape(-1, d), "gate_proj.bias": gate_bias.reshape(-1),
        "output_proj.weight": w["o_proj.weight"], "output_proj.bias": w["o_proj.bias"],
        # Qwen3-Next's norms scale by 1 + weight.
        "q_norm.weight": 1 + w["q_norm.weight"], "k_norm.weight": 1 + w["k_norm.weight"],
        **{f"{m}_proj.{t}": w[f"{m}_proj.{t}"] for m in "kv" for t in ("weight", "bias")},
    }  # fmt: skip
    ours.load_state_dict(mapped, strict=True)
    x = torch.randn(2, 7, d, dtype=torch.float64)
    cos, sin = no_rotation(7, hd)
    with torch.no_grad():
        want, _ = theirs(x, (cos.double(), sin.double()), causal_additive(7).double())
        got = ours(x, LayerContext())
    # Qwen3-Next's norm runs in float32 whatever the dtype: agreement to float32's precision.
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_the_gate_multiplies_each_heads_output_by_sigmoid_of_gate_proj() -> None:
    model = build_model(f"{BASE}, attn_gate=true, pos=nope", dtype=torch.float64)
    perturb(model)
    attn = model.layers[0].attn
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    w = {k: v.detach() for k, v in attn.state_dict().items()}
    q, k, v = ((x @ w[f"{m}_proj.weight"].T).unflatten(-1, (4, 8)).transpose(1, 2) for m in "qkv")
    keep = torch.ones(5, 5, dtype=torch.bool).tril()
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=keep).transpose(1, 2).flatten(2)
    gate = torch.sigmoid(x @ w["gate_proj.weight"].T)  # (B, T, H·D): one per head and channel
    want = (heads * gate) @ w["output_proj.weight"].T
    with torch.no_grad():
        torch.testing.assert_close(attn(x, LayerContext()), want, rtol=1e-12, atol=1e-12)
    assert tuple(w["gate_proj.weight"].shape) == (32, 32)


# ------------------------------------------------------------------------------ the sinks


def sink_attention(q: Tensor, k: Tensor, v: Tensor, sinks: Tensor, keep: Tensor) -> Tensor:
    """gpt-oss's eager attention, written out: the scores and each head's sink logit
    concatenated, softmax, the sink's column dropped."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~keep, -math.inf)
    sink = sinks.view(1, -1, 1, 1).expand(*s.shape[:-1], 1)
    return F.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1] @ v


@pytest.mark.parametrize("kernel", ["sdpa", "chunked(block_size=2)"])
@pytest.mark.parametrize(("sq", "sk"), [(7, 7), (3, 9), (1, 6)])
def test_both_kernels_compute_gpt_oss_sinks_and_their_gradients(
    kernel: str, sq: int, sk: int
) -> None:
    from lmcore.blueprint import resolve

    module = resolve(f"{BASE}, attn={kernel}, attn_sinks=true").create("attn")
    torch.manual_seed(1)
    q = torch.randn(2, 4, sq, 8, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 2, sk, 8, dtype=torch.float64, requires_grad=True) for _ in "kv")
    # Sinks far above and below the scores: the sink takes nearly all, or nearly none.
    sinks = torch.tensor([2.0, -1.0, 40.0, -40.0], dtype=torch.float64, requires_grad=True)
    keep = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + sk - sq
    out = module(q, k, v, causal=True, sinks=sinks)
    want = sink_attention(q, k, v, sinks, keep)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    cotangent = torch.randn_like(out)
    got_grads = torch.autograd.grad((out * cotangent).sum(), (q, k, v, sinks))
    want_grads = torch.autograd.grad((want * cotangent).sum(), (q, k, v, sinks))
    for name, g, r in zip(("q", "k", "v", "sinks"), got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12, msg=name)
    assert got_grads[3].abs().min() > 0 or sk == 1


def test_float32_sinks_keep_the_sink_gradient_when_the_sink_weight_is_tiny() -> None:
    """The sink's gradient comes from its own weight, kept or recomputed from the row's
    log-sum-exp, not from 1 minus the keys' weights: exact when that weight is 1e-9."""
    from lmcore.model.attention import tiled_attention

    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 2, 6, 8, requires_grad=True) for _ in "qkv")
    sinks = torch.tensor([-20.0, 0.5], requires_grad=True)
    keep = torch.ones(6, 6, dtype=torch.bool).tril()
    ref = [t.detach().double().requires_grad_() for t in (q, k, v, sinks)]
    (want_grad,) = torch.autograd.grad(sink_attention(*ref, keep).sum(), ref[3])
    for block in (None, 2):
        out = tiled_attention(q, k, v, causal=True, key_block=block, sinks=sinks)
        (grad,) = torch.autograd.grad(out.sum(), sinks)
        torch.testing.assert_close(grad.double(), want_grad, rtol=1e-4, atol=0.0)


def test_the_sinks_are_gpt_oss_attention_with_copied_weights() -> None:
    from transformers.models.gpt_oss.configuration_gpt_oss import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention

    config = GptOssConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=8, attention_bias=True, num_hidden_layers=1,
                          layer_types=["full_attention"])  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    theirs = GptOssAttention(config, layer_idx=0).double()
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(0.3 * torch.randn_like(p))
        theirs.sinks.copy_(torch.tensor([1.0, -2.0, 0.5, 3.0]))
    spec = (f"{BASE}, num_kv_heads=2, head_dim=8, pos=nope, attn_sinks=true, qkv_bias=true, "
            "out_bias=true")  # fmt: skip
    ours = build_model(spec, dtype=torch.float64).layers[0].attn
    w = theirs.state_dict()
    ours.load_state_dict({("output_proj" + k[6:] if k.startswith("o_proj") else k): t
                          for k, t in w.items()}, strict=True)  # fmt: skip
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    cos, sin = no_rotation(7, 4)  # gpt-oss's tables hold one angle per pair
    with torch.no_grad():
        want, _ = theirs(x, (cos.double(), sin.double()), causal_additive(7).double())
        got = ours(x, LayerContext())
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_a_kernel_without_sinks_is_refused_by_name_listing_the_kernels_that_have_them() -> None:
    with scoped_registry() as registry:
        registry.add(plain_kernel(frozenset({"gqa", "mask"})))
        for spec, caret in ((f"{BASE}, attn=plain, attn_sinks=true", "true"),
                            (f"{BASE}, attn=plain, attn_sinks[1]=true", "true")):  # fmt: skip
            with raises_naming(
                SpecError,
                "attn 'plain' cannot compute attention sinks (attn_sinks=true)",
                "it does not declare the 'sinks' feature",
                "kernels that can: chunked, sdpa",
            ) as e:
                parse_spec(spec)
            assert str(e.value).splitlines()[-1].strip() == "^" * len(caret)
        build_model(f"{BASE}, attn=plain, attn_gate=true")  # the gate asks nothing of a kernel


# ------------------------------------------------------------------------------ sizes


@pytest.mark.parametrize(
    "option",
    ["attn_gate=true, qkv_bias=true", "attn_sinks=true, num_kv_heads=2",
     "attn_gate=true, attn_sinks[1]=true, attn=chunked(block_size=3)"],
)  # fmt: skip
def test_declared_params_and_flops_are_the_built_models(option: str) -> None:
    model = build_model(f"{BASE}, {option}")
    acc = account(model.blueprint, batch=2, seq_len=9)
    assert acc.params == sum(p.numel() for p in model.parameters())
    with FlopCounterMode(display=False) as counter:
        model(torch.zeros(2, 9, dtype=torch.long))
    assert acc.flops == counter.get_total_flops()
    plain = account(f"{BASE}, qkv_bias=true")
    if option.startswith("attn_gate=true, qkv_bias"):
        # gate_proj: a d_model -> H·D linear with the q biases' shape, 3 layers.
        assert acc.params - plain.params == 3 * (32 * 32 + 32)
        assert acc.row("layers.*.attn.gate_proj").flops == 3 * 2 * 2 * 9 * 32 * 32
        assert acc.row("layers.*.attn").module == "sigmoid output gate"


def test_the_sinks_are_one_parameter_per_head_in_the_state_dict() -> None:
    model = build_model(f"{BASE}, attn_sinks=true, attn_gate=true, num_kv_heads=2")
    sd = model.state_dict()
    assert tuple(sd["layers.0.attn.sinks"].shape) == (4,)
    assert torch.equal(sd["layers.0.attn.sinks"], torch.zeros(4))  # no sink weight at first
    assert tuple(sd["layers.2.attn.gate_proj.weight"].shape) == (32, 32)
    row = account(model.blueprint).row("layers.*.attn")
    assert row.params == 3 * 4 and row.module == "sigmoid output gate, sinks (4)"
    assert "sinks" not in str(build_model(BASE).state_dict().keys())


def test_compiled_gate_and_sinks_give_the_eager_logits_and_gradients() -> None:
    spec = f"{BASE}, attn_gate=true, attn_sinks=true, window[0]=3, num_kv_heads=2"
    model = build_model(spec)
    perturb(model)
    ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(4))
    eager = model(ids)
    compiled = build_model(model.blueprint, compile={"backend": "aot_eager"})
    compiled.load_state_dict(model.state_dict())
    got = compiled(ids)
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)
    eager.sum().backward()
    got.sum().backward()
    for (name, p), q in zip(model.named_parameters(), compiled.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_the_tensor_parallel_plan_splits_the_gate_and_shards_the_sinks_by_heads() -> None:
    from lmcore.train.parallel import tensor_parallel_plan

    model = build_model(f"{BASE}, attn_gate=true, attn_sinks[0]=true")
    plan = tensor_parallel_plan(model)
    assert {k for k in plan if "gate_proj" in k} == {f"layers.{i}.attn.gate_proj" for i in range(3)}
    assert type(plan["layers.0.attn.gate_proj"]).__name__ == "ColwiseParallel"
    assert type(plan["layers.0.attn"]).__name__ == "HeadParallel"
    assert "layers.1.attn" not in plan  # no sinks there


# ------------------------------------------------------------------------------ rotary bases


def test_per_layer_rotary_bases_rotate_each_layer_with_its_own_theta() -> None:
    """Gemma 3: local layers at base 10,000, every sixth (global) layer at 1,000,000."""
    spec = (f"{BASE.replace('num_layers=3', 'num_layers=6')}, head_dim=8, "
            "pos=rope(theta=10000), pos[5::6]=rope(theta=1000000)")  # fmt: skip
    parsed = parse_spec(spec)
    assert str(parsed).endswith("pos=rope(theta=10000.0),pos[5]=rope(theta=1000000.0),attn=sdpa")
    assert [parsed.at(i).pos.kwargs["theta"] for i in range(6)] == [1e4] * 5 + [1e6]
    model = build_model(spec)
    positions = torch.arange(11)[None]
    x = torch.randn(1, 4, 11, 8, dtype=torch.float64)
    for i in range(6):
        pos = (model.pos, *model.layer_pos)[model.pos_index[i]]
        got = pos.rotation(positions)(x.float())  # the tables are float32
        theta = 1e6 if i == 5 else 1e4
        # Interleaved pairs (x[2k], x[2k+1]) turned by p / theta^(2k/d).
        angle = torch.arange(11, dtype=torch.float64)[:, None] * theta ** (
            -torch.arange(0, 8, 2, dtype=torch.float64) / 8
        )
        even, odd = x[..., 0::2], x[..., 1::2]
        want = torch.stack(
            [even * angle.cos() - odd * angle.sin(), even * angle.sin() + odd * angle.cos()], -1
        ).flatten(-2)
        torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-5, msg=f"layer {i}")
    rows = {r.name: dict(r.kwargs) for r in account(spec).rows}
    assert rows["pos"]["theta"] == 1e4 and rows["layer_pos.0"]["theta"] == 1e6
