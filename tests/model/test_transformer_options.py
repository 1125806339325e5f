"""The attention and model options of the transformer (head_dim, q/k/v and output biases, qk_norm
per head or over the full width, the query scale, soft-capped scores and logits, the sliding
window, the embedding scale, the output gate, attention sinks) and the blocks (prenorm, postnorm, sandwich, reordered, parallel),
each against an independent forward written with torch.nn.functional from the model's state
dict; every option's default is today's model bit for bit; the KV cache, torch.compile and
save/load hold with the options on."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import lmcore
from lmcore import SpecError, build_model, parse_spec
from lmcore.model.attention import tiled_attention
from lmcore.model.generate import GREEDY
from lmcore.model.transformer import split_heads
from lmcore.registry import scoped_registry
from tests.helpers.errors import raises_naming
from tests.helpers.plugins import plain_kernel

BASE = "vocab_size=97, context_length=16, d_model=32, num_layers=3, num_heads=4, d_ff=48"


def perturbed(spec: str, seed: int = 0) -> lmcore.TransformerLM:
    """A model whose gains and biases are off their initial ones and zeros (so a formula that
    ignored them would show)."""
    torch.manual_seed(seed)
    model = build_model(spec)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.3 * torch.randn_like(p))
    return model


def reference(model: lmcore.TransformerLM, ids: Tensor) -> Tensor:
    """The model's forward from its state dict with torch's own ops (F.rms_norm, F.linear,
    F.silu, F.scaled_dot_product_attention or written-out capped attention, RoPE as complex
    multiplication of interleaved pairs), each option applied as its family's code does."""
    w = {k: v.detach() for k, v in model.state_dict().items()}
    spec = model.spec
    hd, t = spec.head_dim, ids.shape[-1]
    theta = float(spec.pos.kwargs.get("theta", 10000.0))
    freqs = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    rot = torch.polar(torch.ones(t, hd // 2, dtype=torch.float64),
                      torch.arange(t, dtype=torch.float64)[:, None] * freqs)  # fmt: skip

    def rope(x: Tensor) -> Tensor:  # (B, H, T, hd)
        c = torch.view_as_complex(x.double().reshape(*x.shape[:-1], hd // 2, 2).contiguous())
        return torch.view_as_real(c * rot).reshape(x.shape).float()

    def norm(x: Tensor, key: str) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), w[key + ".weight"], 1e-5)

    def linear(x: Tensor, key: str) -> Tensor:
        return F.linear(x, w[key + ".weight"], w.get(key + ".bias"))

    def attention(x: Tensor, p: str, layer: lmcore.ModelSpec) -> Tensor:
        q, k, v = (linear(x, f"{p}attn.{m}_proj") for m in "qkv")
        if layer.qk_norm is not None and layer.qk_norm_scope == "full":  # OLMo 2
            q, k = norm(q, p + "attn.q_norm"), norm(k, p + "attn.k_norm")
        q, k, v = (y.unflatten(-1, (-1, hd)) for y in (q, k, v))  # (B, T, H, hd)
        if layer.qk_norm is not None and layer.qk_norm_scope == "head":  # Qwen 3
            q = F.rms_norm(q, (hd,), w[p + "attn.q_norm.weight"], layer.qk_norm.kwargs["eps"])
            k = F.rms_norm(k, (hd,), w[p + "attn.k_norm.weight"], layer.qk_norm.kwargs["eps"])
        q, k, v = (y.transpose(1, 2) for y in (q, k, v))
        if layer.pos.name == "rope":
            q, k = rope(q), rope(k)
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        keep = torch.ones(t, t, dtype=torch.bool).tril()
        if layer.window:  # transformers' sliding_window_overlay: kv_idx > q_idx - window
            keep &= torch.arange(t)[None, :] > torch.arange(t)[:, None] - layer.window
        if layer.attn_softcap or layer.attn_sinks:  # Gemma 2's and gpt-oss's eager attention
            s = q @ k.transpose(-2, -1) * layer.query_scale
            if layer.attn_softcap:
                s = torch.tanh(s / layer.attn_softcap) * layer.attn_softcap
            s = s.masked_fill(~keep, -math.inf)
            if layer.attn_sinks:  # one more logit per head, dropped after the softmax
                sink = w[p + "attn.sinks"].view(1, -1, 1, 1).expand(*s.shape[:-1], 1)
                a = F.softmax(torch.cat([s, sink], -1), -1)[..., :-1] @ v
            else:
                a = torch.softmax(s, -1) @ v
        else:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=layer.query_scale)
        a = a.transpose(1, 2).flatten(-2)
        if layer.attn_gate:  # Qwen3-Next: attn_output * sigmoid(gate)
            a = a * torch.sigmoid(linear(x, p + "attn.gate_proj"))
        return linear(a, p + "attn.output_proj")

    def ffn(x: Tensor, p: str) -> Tensor:
        return linear(F.silu(linear(x, p + "ffn.w1")) * linear(x, p + "ffn.w3"), p + "ffn.w2")

    x = F.embedding(ids, w["token_embeddings.weight"])
    if spec.embed_scale != 1.0:
        x = x * torch.tensor(spec.embed_scale, dtype=x.dtype)
    for i in range(spec.num_layers):
        p, layer = f"layers.{i}.", spec.at(i)

        def a(h: Tensor) -> Tensor:
            return attention(h, p, layer)  # noqa: B023

        def f(h: Tensor) -> Tensor:
            return ffn(h, p)  # noqa: B023

        def n(h: Tensor, name: str) -> Tensor:
            return norm(h, p + name)  # noqa: B023

        block = layer.block
        if block.name == "prenorm":
            x = x + a(n(x, "ln1"))
            x = x + f(n(x, "ln2"))
        elif block.name == "postnorm":
            x = n(x + a(x), "ln1")
            x = n(x + f(x), "ln2")
        elif block.name == "sandwich":  # Gemma 2
            x = x + n(a(n(x, "ln1")), "ln1_out")
            x = x + n(f(n(x, "ln2")), "ln2_out")
        elif block.name == "reordered":  # OLMo 2
            x = x + n(a(x), "ln1_out")
            x = x + n(f(x), "ln2_out")
        else:  # parallel: GPT-NeoX's mlp_output + attn_output + hidden_states
            second = "ln2" if block.kwargs["norms"] == 2 else "ln1"
            x = f(n(x, second)) + a(n(x, "ln1")) + x
    logits = F.linear(norm(x, "ln_final"), w["lm_head.weight"]) * spec.logit_scale
    if spec.logit_softcap:
        logits = torch.tanh(logits / spec.logit_softcap) * spec.logit_softcap
    return logits


OPTIONS = [
    "block=sandwich",
    "block=reordered",
    "block=parallel",
    "block=parallel(norms=2)",
    "block=postnorm",
    "qkv_bias=true",
    "qkv_bias=true, out_bias=true",
    "head_dim=16",
    "head_dim=4, num_kv_heads=2",
    "qk_norm=rmsnorm(eps=1e-6)",
    "qk_norm=rmsnorm, qk_norm_scope=full, num_kv_heads=2",
    "query_scale=0.125",
    "attn_softcap=2.0",
    "attn_softcap=2.0, attn=chunked(block_size=3)",
    "window=3",
    "window=3, attn=chunked(block_size=2)",
    "window[0::2]=2",
    "pos[1]=nope",
    "logit_softcap=1.5",
    "logit_scale=0.25",  # Falcon-H1's lm_head_multiplier
    "logit_scale=0.25, logit_softcap=1.5",
    "embed_scale=5.656854249492381",
    # Gemma 2, tiny: sandwich norms, capped scores and logits, a query scale, sliding windows
    # on alternate layers, the embedding scale.
    "block=sandwich, head_dim=16, query_scale=0.1767766952966369, attn_softcap=50.0, "
    "logit_softcap=30.0, window[0::2]=4, embed_scale=5.656854249492381, num_kv_heads=2",
    # OLMo 2, tiny: reordered norms, full-width q/k norms.
    "block=reordered, qk_norm=rmsnorm(eps=1e-6), qk_norm_scope=full",
    # Qwen 3, tiny: per-head q/k norms and a head_dim of its own.
    "qk_norm=rmsnorm(eps=1e-6), head_dim=16, num_kv_heads=2",
    "attn_gate=true",
    "attn_gate=true, qkv_bias=true, block=parallel",
    "attn_sinks=true",
    "attn_sinks=true, attn=chunked(block_size=3), window=3",
    # Qwen3-Next's attention layers, tiny: the output gate, per-head q/k norms, grouped heads.
    "attn_gate=true, qk_norm=rmsnorm(eps=1e-6), head_dim=16, num_kv_heads=2",
    # gpt-oss, tiny: sinks on every layer, a window on alternate ones, biases, grouped heads.
    "attn_sinks=true, window[0::2]=3, qkv_bias=true, out_bias=true, num_kv_heads=2",
    "attn_gate[1]=true, attn_sinks[0::2]=true, attn_softcap=2.0",
]


@pytest.mark.parametrize("option", OPTIONS)
def test_each_option_computes_its_familys_formula(option: str) -> None:
    model = perturbed(f"{BASE}, {option}")
    ids = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), reference(model, ids), rtol=1e-4, atol=1e-4)


def test_every_default_written_out_is_the_same_model() -> None:
    defaults = (
        "head_dim=8, qkv_bias=false, out_bias=false, qk_norm=none, qk_norm_scope=head, "
        "query_scale=0.35355339059327373, window=0, attn_softcap=0.0, logit_softcap=0.0, "
        "logit_scale=1.0, "
        "embed_scale=1.0, block=prenorm, window[0]=0, attn_gate=false, attn_sinks=false, "
        "attn_sinks[1]=false"
    )
    plain, written = parse_spec(BASE), parse_spec(f"{BASE}, {defaults}")
    assert str(written) == str(plain) and written == plain
    assert "head_dim" not in str(plain) and "window" not in str(plain)
    assert "attn_gate" not in str(plain) and "attn_sinks" not in str(plain)


def old_forward(model: lmcore.TransformerLM, ids: Tensor) -> Tensor:
    """The forward as lmcore computed it before blocks were components and attention took
    options, with the model's own modules: the pre-norm block and the attention inline."""
    positions = torch.arange(ids.shape[-1])[None]
    x = model.token_embeddings(ids)
    x = model.pos.embed(x, positions)
    rotation = model.pos.rotation(positions)
    for layer in model.layers:
        h = layer.ln1(x)
        attn = layer.attn
        q = split_heads(attn.q_proj(h), attn.num_heads)
        k = split_heads(attn.k_proj(h), attn.num_kv_heads)
        v = split_heads(attn.v_proj(h), attn.num_kv_heads)
        q, k = rotation(q), rotation(k)
        out = tiled_attention(q, k, v, causal=True)
        heads = out.transpose(1, 2).clone(memory_format=torch.contiguous_format)
        x = x + attn.output_proj(heads.flatten(2))
        x = x + layer.ffn(layer.ln2(x))
    logits: Tensor = model.lm_head(model.ln_final(x))
    return logits


def test_the_default_model_is_bit_for_bit_the_one_before_the_options() -> None:
    for spec in (BASE, f"{BASE}, num_kv_heads=2"):
        model = perturbed(spec)
        ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(2))
        new, old = model(ids), old_forward(model, ids)
        assert torch.equal(new, old)
        grads = []
        for out in (new, old):
            model.zero_grad()
            out.square().mean().backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


def test_a_head_dim_of_its_own_shapes_the_projections_and_the_cache() -> None:
    odd = BASE.replace("num_heads=4", "num_heads=3")  # 32 % 3 != 0
    model = build_model(f"{odd}, head_dim=20, num_kv_heads=1")
    attn = model.layers[0].attn
    assert tuple(attn.q_proj.weight.shape) == (60, 32)
    assert tuple(attn.k_proj.weight.shape) == (20, 32)
    assert tuple(attn.output_proj.weight.shape) == (32, 60)
    assert lmcore.model.cache.KVCache.for_model(model, 1).k[0].shape[-1] == 20
    with raises_naming(
        SpecError, "d_model=32 is not divisible by num_heads=3", "or give head_dim=..."
    ):
        parse_spec(odd)


def test_biases_are_state_dict_keys_and_parameters() -> None:
    model = build_model(f"{BASE}, qkv_bias=true, out_bias=true")
    keys = {k for k in model.state_dict() if k.startswith("layers.0.attn.") and "bias" in k}
    assert keys == {
        f"layers.0.attn.{m}.bias" for m in ("q_proj", "k_proj", "v_proj", "output_proj")
    }
    plain = sum(p.numel() for p in build_model(BASE).parameters())
    assert sum(p.numel() for p in model.parameters()) == plain + 3 * (32 + 32 + 32 + 32)
    assert lmcore.model.counting.account(model.blueprint).params == plain + 3 * 4 * 32


def test_a_qk_norm_is_any_registered_norm_and_checked_against_its_declaration() -> None:
    model = build_model(f"{BASE}, qk_norm=layernorm(bias=false)")
    assert type(model.layers[0].attn.q_norm).__name__ == "LayerNorm"
    assert tuple(model.layers[0].attn.q_norm.weight.shape) == (8,)  # per head
    full = build_model(f"{BASE}, num_kv_heads=2, qk_norm=rmsnorm, qk_norm_scope=full")
    assert tuple(full.layers[0].attn.k_norm.weight.shape) == (16,)  # 2 kv heads × 8
    with raises_naming(
        SpecError, "norm 'rmsnorm' has no argument 'epsilon'", "(did you mean 'eps'?)"
    ) as e:
        parse_spec(f"{BASE}, qk_norm=rmsnorm(epsilon=1e-6)")
    assert str(e.value).splitlines()[-1].strip() == "^^^^^^^^^^^^"
    with raises_naming(
        SpecError, "no installed plugin provides norm 'rmsnrm'", "(did you mean 'rmsnorm'?)"
    ):
        parse_spec(f"{BASE}, qk_norm=rmsnrm")
    with pytest.raises(SpecError, match=r"qk_norm_scope must be one of full, head, got 'whole'"):
        parse_spec(f"{BASE}, qk_norm=rmsnorm, qk_norm_scope=whole")


def test_a_kernel_without_scale_gets_q_multiplied_instead() -> None:
    with scoped_registry() as registry:
        registry.add(plain_kernel(frozenset({"gqa"})))  # declares none of the options
        model = perturbed(f"{BASE}, attn=plain, query_scale=0.125")
        assert model.layers[0].attn.q_factor == pytest.approx(0.125 * math.sqrt(8))
        ids = torch.randint(0, 97, (2, 11))
        with torch.no_grad():
            torch.testing.assert_close(model(ids), reference(model, ids), rtol=1e-4, atol=1e-4)


CACHED = [
    "block=sandwich, window[0::2]=3, attn_softcap=20.0, logit_softcap=10.0, embed_scale=2.0",
    "block=parallel(norms=2), qkv_bias=true, out_bias=true, pos[2]=nope",
    "block=reordered, qk_norm=rmsnorm, qk_norm_scope=full, num_kv_heads=2, attn=chunked(block_size=2), window=5",
    "qk_norm=rmsnorm(eps=1e-6), head_dim=12, num_kv_heads=1, query_scale=0.2",
    "attn_gate=true, attn_sinks=true, window[0::2]=3, num_kv_heads=2",
    "attn_gate[0]=true, attn_sinks[1:]=true, attn=chunked(block_size=2)",
]


@pytest.mark.parametrize("option", CACHED)
def test_greedy_decoding_with_the_cache_equals_recomputing(option: str) -> None:
    model = perturbed(f"{BASE}, {option}")
    prompt = torch.randint(0, 97, (2, 4), generator=torch.Generator().manual_seed(3))
    cached = model.generate(prompt, 9, GREEDY)
    plain = model.generate(prompt, 9, GREEDY, cache=False)
    assert torch.equal(cached, plain)


@pytest.mark.parametrize("option", [*CACHED[:2], CACHED[4]])
def test_save_and_load_are_bitwise_and_keep_the_options(option: str, tmp_path: Any) -> None:
    model = perturbed(f"{BASE}, {option}")
    path = model.save(tmp_path / "m.safetensors")
    loaded = lmcore.load(path)
    assert loaded.spec == model.spec
    ids = torch.randint(0, 97, (2, 16))
    assert torch.equal(loaded(ids), model(ids))


def test_compiled_the_options_give_the_eager_logits_and_gradients() -> None:
    model = perturbed(f"{BASE}, {CACHED[0]}")
    ids = torch.randint(0, 97, (2, 16))
    eager = model(ids)
    compiled = build_model(model.blueprint, compile={"backend": "aot_eager"})
    compiled.load_state_dict(model.state_dict())
    got = compiled(ids)
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)
    eager.sum().backward()
    got.sum().backward()
    for (name, p), q in zip(model.named_parameters(), compiled.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_describe_measures_what_the_options_declare() -> None:
    from lmcore.describe import describe

    for option in OPTIONS:
        for dtype in (torch.float32, torch.bfloat16):
            found = describe(f"{BASE}, {option}", batch=2, seq_len=7, dtype=dtype, measure=True)
            assert found.mismatches == (), (option, dtype, found.mismatches)


def test_compiled_decoding_with_the_options_gives_the_same_tokens_in_one_graph_per_call() -> None:
    """fullgraph: the window, the caps, a per-layer encoding and the embedding scale trace
    without a graph break."""
    from lmcore.model.generate import compile_decoding

    model = perturbed(f"{BASE}, {CACHED[0]}, pos[1]=nope, query_scale=0.3")
    prompt = torch.randint(0, 97, (2, 5))
    eager = model.generate(prompt, 6, GREEDY)
    torch.compiler.reset()
    try:
        decoder = compile_decoding(model, backend="eager", fullgraph=True)
        assert torch.equal(decoder.generate(prompt, 6, GREEDY), eager)
    finally:
        torch.compiler.reset()
