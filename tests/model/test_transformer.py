"""The assembled model (`lmcore.model.transformer`): the CS336 state-dict contract, an independent
forward and its gradients, causality, grouped-query attention, tied embeddings, compiling and
building on meta."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lmcore import TransformerLM, build_model, parse_spec
from lmcore.errors import ModelTooLargeError, StateDictError
from lmcore.interfaces import LayerContext
from tests.helpers.errors import raises_naming


def cs336_state_dict_shapes(
    vocab: int, ctx: int, d: int, layers: int, d_ff: int
) -> dict[str, tuple[int, ...]]:
    """The CS336 reference checkpoint's keys and shapes, written out independently."""
    shapes: dict[str, tuple[int, ...]] = {"token_embeddings.weight": (vocab, d)}
    for i in range(layers):
        p = f"layers.{i}."
        shapes |= {
            p + "ln1.weight": (d,),
            p + "attn.q_proj.weight": (d, d),
            p + "attn.k_proj.weight": (d, d),
            p + "attn.v_proj.weight": (d, d),
            p + "attn.output_proj.weight": (d, d),
            p + "ln2.weight": (d,),
            p + "ffn.w1.weight": (d_ff, d),
            p + "ffn.w2.weight": (d, d_ff),
            p + "ffn.w3.weight": (d_ff, d),
        }
    shapes |= {"ln_final.weight": (d,), "lm_head.weight": (vocab, d)}
    return shapes


def random_reference_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = cs336_state_dict_shapes(10000, 16, 64, 3, 128)
    return {
        k: torch.randn(s, generator=g) * (0.3 if len(s) == 2 else 1.0)
        + (1.0 if len(s) == 1 else 0.0)
        for k, s in shapes.items()
    }


def reference_forward(
    w: dict[str, torch.Tensor], ids: torch.Tensor, heads: int, theta: float, eps: float = 1e-5
) -> torch.Tensor:
    """CS336's LM with torch's own ops: F.rms_norm, F.silu, F.scaled_dot_product_attention, and
    RoPE as complex multiplication of interleaved pairs."""
    d = w["token_embeddings.weight"].shape[1]
    hd = d // heads
    t = ids.shape[-1]
    freqs = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    rot = torch.polar(
        torch.ones(t, hd // 2, dtype=torch.float64),
        torch.arange(t, dtype=torch.float64)[:, None] * freqs,
    )

    def rope(x: torch.Tensor) -> torch.Tensor:  # (B, H, T, hd)
        c = torch.view_as_complex(x.double().reshape(*x.shape[:-1], hd // 2, 2).contiguous())
        return torch.view_as_real(c * rot).reshape(x.shape).float()

    x = F.embedding(ids, w["token_embeddings.weight"])
    n = 0
    while f"layers.{n}.ln1.weight" in w:
        p = f"layers.{n}."
        h = F.rms_norm(x, (d,), w[p + "ln1.weight"], eps)
        q, k, v = (
            F.linear(h, w[p + f"attn.{m}_proj.weight"]).unflatten(-1, (heads, hd)).transpose(1, 2)
            for m in "qkv"
        )
        a = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        x = x + F.linear(a.transpose(1, 2).flatten(-2), w[p + "attn.output_proj.weight"])
        h = F.rms_norm(x, (d,), w[p + "ln2.weight"], eps)
        x = x + F.linear(
            F.silu(F.linear(h, w[p + "ffn.w1.weight"])) * F.linear(h, w[p + "ffn.w3.weight"]),
            w[p + "ffn.w2.weight"],
        )
        n += 1
    return F.linear(F.rms_norm(x, (d,), w["ln_final.weight"], eps), w["lm_head.weight"])


def test_state_dict_keys_and_shapes_are_cs336s() -> None:
    model = build_model("cs336-tiny")
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    expected = cs336_state_dict_shapes(10000, 16, 64, 3, 128)
    assert list(shapes) == list(expected)
    assert shapes == expected


def test_reference_weights_load_strictly_and_give_the_reference_logits() -> None:
    weights = random_reference_weights()
    model = build_model("cs336-tiny")
    model.load_state_dict(weights, strict=True)
    ids = torch.randint(0, 10000, (2, 16), generator=torch.Generator().manual_seed(1))
    expected = reference_forward(weights, ids, heads=4, theta=10000.0)
    torch.testing.assert_close(model(ids), expected, rtol=1e-4, atol=1e-4)


def test_a_model_from_another_models_canonical_spec_is_the_same_shape() -> None:
    a = build_model("tinystories, pos=nope, d_model=256, num_heads=8")
    b = build_model(str(a.spec))
    assert b.spec == a.spec
    assert {k: v.shape for k, v in a.state_dict().items()} == {
        k: v.shape for k, v in b.state_dict().items()
    }
    b.load_state_dict(a.state_dict(), strict=True)
    ids = torch.randint(0, 10000, (1, 32))
    torch.testing.assert_close(a(ids), b(ids))


@pytest.mark.parametrize(
    "spec",
    [
        "cs336-tiny",
        "cs336-tiny, pos=nope",
        "cs336-tiny, num_kv_heads=1",
        "cs336-tiny, block=postnorm",
    ],
)
def test_changing_later_tokens_never_changes_earlier_logits(spec: str) -> None:
    torch.manual_seed(0)
    model = build_model(spec)
    ids = torch.randint(0, 10000, (3, 16))
    base = model(ids)
    for t in (0, 5, 14):
        changed = ids.clone()
        changed[:, t + 1 :] = torch.randint(0, 10000, changed[:, t + 1 :].shape)
        out = model(changed)
        torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], rtol=0, atol=1e-5)
        assert not torch.allclose(out[:, t + 1 :], base[:, t + 1 :])


def test_build_on_meta_allocates_nothing() -> None:
    model = build_model("gpt2-xl", device="meta")
    assert all(p.device.type == "meta" for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == 2_127_057_600


def test_the_whole_model_compiles_as_one_graph() -> None:
    torch.manual_seed(0)
    model = build_model("cs336-tiny")
    ids = torch.randint(0, 10000, (2, 16))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(ids), model(ids))


def test_bf16_model_runs_in_bf16() -> None:
    model = build_model("cs336-tiny", dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    logits = model(torch.randint(0, 10000, (2, 8)))
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()


def test_leading_dims_and_explicit_positions() -> None:
    torch.manual_seed(0)
    model = build_model("cs336-tiny")
    ids = torch.randint(0, 10000, (2, 3, 8))
    out = model(ids)
    assert out.shape == (2, 3, 8, 10000)
    torch.testing.assert_close(out[1, 2], model(ids[1, 2][None])[0])
    torch.testing.assert_close(model(ids[0], torch.arange(8)), out[0])
    # Shifting every position by the same offset leaves RoPE attention unchanged.
    torch.testing.assert_close(model(ids[0], torch.arange(8) + 5), out[0], rtol=1e-4, atol=1e-4)


def test_grouped_query_attention_shrinks_k_and_v() -> None:
    model = build_model("cs336-tiny, num_kv_heads=2")
    sd = model.state_dict()
    assert sd["layers.0.attn.k_proj.weight"].shape == (32, 64)
    assert sd["layers.0.attn.v_proj.weight"].shape == (32, 64)
    assert sd["layers.0.attn.q_proj.weight"].shape == (64, 64)


def test_gqa_equals_mha_with_repeated_kv_weights() -> None:
    torch.manual_seed(0)
    gqa = build_model("cs336-tiny, num_kv_heads=2")
    mha = build_model("cs336-tiny")
    sd = gqa.state_dict()
    for i in range(3):
        for m in "kv":
            w = sd[f"layers.{i}.attn.{m}_proj.weight"].unflatten(0, (2, 16))
            sd[f"layers.{i}.attn.{m}_proj.weight"] = w.repeat_interleave(2, dim=0).flatten(0, 1)
    mha.load_state_dict(sd)
    ids = torch.randint(0, 10000, (2, 16))
    torch.testing.assert_close(gqa(ids), mha(ids), rtol=1e-5, atol=1e-5)


def test_tied_embeddings_share_one_matrix() -> None:
    model = build_model("cs336-tiny, tie_embeddings=true")
    assert model.lm_head.weight is model.token_embeddings.weight
    untied = sum(p.numel() for p in build_model("cs336-tiny").parameters())
    assert sum(p.numel() for p in model.parameters()) == untied - 10000 * 64
    std = math.sqrt(2 / (64 + 10000))
    assert model.lm_head.weight.abs().max() <= 3 * std + 1e-7


def test_postnorm_block_order() -> None:
    torch.manual_seed(0)
    model = build_model("cs336-tiny, block=postnorm")
    block = model.layers[0]
    x = torch.randn(1, 4, 64)
    context = LayerContext(model.pos.rotation(torch.arange(4)[None]))
    y = block.ln1(x + block.attn(x, context))
    torch.testing.assert_close(block(x, context), block.ln2(y + block.ffn(y)))


def test_model_keeps_the_canonical_spec() -> None:
    model = build_model("tinystories, pos=nope", device="meta")
    assert model.spec == parse_spec("tinystories, pos=nope")
    assert str(model.spec).startswith("vocab_size=10000,context_length=256,d_model=512")


def test_training_gradients_match_the_reference_model() -> None:
    """Every hand-written backward in the default model (attention, RMSNorm, the SwiGLU gate,
    RoPE) against autograd through torch's own ops, parameter by parameter."""
    weights = random_reference_weights()
    model = build_model("cs336-tiny")
    model.load_state_dict(weights, strict=True)
    ids = torch.randint(0, 10000, (2, 16), generator=torch.Generator().manual_seed(1))
    reference = {k: v.clone().requires_grad_() for k, v in weights.items()}
    reference_forward(reference, ids, heads=4, theta=10000.0).logsumexp(-1).mean().backward()
    model(ids).logsumexp(-1).mean().backward()
    for name, p in model.named_parameters():
        expected = reference[name].grad
        assert p.grad is not None and expected is not None, name
        # The reference rotates in float64: gradients of magnitude ~1 agree to ~1e-5 (as on
        # the CS336 reference model before lmcore's hand-written backwards).
        torch.testing.assert_close(p.grad, expected, rtol=1e-3, atol=1e-4, msg=name)


@pytest.mark.parametrize("attn", ["sdpa", "chunked(block_size=5)"])
def test_grouped_query_kernel_path_and_the_repeated_kv_path_train_alike(attn: str) -> None:
    """A kernel with the "gqa" feature gets k, v with num_kv_heads heads; one without gets them
    repeated by the model. Both give the same logits and gradients."""
    torch.manual_seed(0)
    native = build_model(f"cs336-tiny, num_kv_heads=2, attn={attn}")
    repeated = build_model(f"cs336-tiny, num_kv_heads=2, attn={attn}")
    for layer in repeated.layers:
        layer.attn.kernel_gqa = False  # as for a kernel without the feature
    repeated.load_state_dict(native.state_dict(), strict=True)
    ids = torch.randint(0, 10000, (2, 16))
    torch.testing.assert_close(repeated(ids), native(ids), rtol=1e-5, atol=1e-5)
    for model in (native, repeated):
        model(ids).logsumexp(-1).mean().backward()
    for (name, a), (_, b) in zip(
        native.named_parameters(), repeated.named_parameters(), strict=True
    ):
        assert a.grad is not None and b.grad is not None
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_build_model_compile_keeps_the_model_and_its_keys() -> None:
    torch.manual_seed(0)
    eager = build_model("cs336-tiny")
    compiled = build_model("cs336-tiny", compile={"backend": "aot_eager"})
    assert isinstance(compiled, TransformerLM)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    compiled.load_state_dict(eager.state_dict(), strict=True)
    ids = torch.randint(0, 10000, (2, 16))
    torch.testing.assert_close(compiled(ids), eager(ids), rtol=1e-5, atol=1e-5)
    for model in (eager, compiled):
        model(ids).logsumexp(-1).mean().backward()
    for (name, a), (_, b) in zip(
        eager.named_parameters(), compiled.named_parameters(), strict=True
    ):
        assert a.grad is not None and b.grad is not None
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)


# ------------------------------------------------------------------ state dicts


def test_a_tied_model_refuses_an_untied_state_dict() -> None:
    """The reproduction: a CS336 checkpoint loaded strictly into tie_embeddings=true kept one of
    its two matrices and silently dropped the other."""
    tied = build_model("cs336-tiny, tie_embeddings=true")
    before = tied.lm_head.weight.detach().clone()
    with raises_naming(
        StateDictError,
        "tie_embeddings=true",
        "two different matrices",
        "token_embeddings.weight",
        "lm_head.weight",
    ):
        tied.load_state_dict(random_reference_weights(), strict=True)
    assert torch.equal(tied.lm_head.weight, before)  # nothing was loaded


def test_a_tied_model_loads_a_tied_state_dict() -> None:
    a = build_model("cs336-tiny, tie_embeddings=true")
    b = build_model("cs336-tiny, tie_embeddings=true")
    b.load_state_dict(a.state_dict(), strict=True)  # one tensor under both keys
    copied = {k: v.clone() for k, v in a.state_dict().items()}  # two equal tensors
    b.load_state_dict(copied, strict=True)
    assert torch.equal(b.token_embeddings.weight, a.lm_head.weight)
    assert b.token_embeddings.weight is b.lm_head.weight


# ------------------------------------------------------------------ building


def test_allocator_failures_the_declarations_missed_are_one_line(monkeypatch) -> None:
    import lmcore.model.nn

    def empty(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 bytes"
        )

    monkeypatch.setattr(lmcore.model.nn.torch, "empty", empty)
    with pytest.raises(ModelTooLargeError, match=r"allocating the model failed: \[enforce fail"):
        build_model("cs336-tiny")


def test_meta_builds_compute_no_position_table(monkeypatch) -> None:
    """RoPE's and the sinusoidal tables are only shaped on meta: nothing proportional to the
    context is computed on the CPU (gpt2-xl at 10,000,000 tokens used to take 2.8 GB)."""
    made: list[tuple[int, ...]] = []
    real = torch.arange

    def arange(*args: object, **kwargs: object) -> torch.Tensor:
        out = real(*args, **kwargs)
        if out.device.type == "cpu":
            made.append(tuple(out.shape))
        return out

    monkeypatch.setattr(torch, "arange", arange)
    for spec in (
        "tinystories, pos=sinusoidal, context_length=2000000",
        "gpt2-xl, context_length=10000000",
    ):
        model = build_model(spec, device="meta")
        assert {b.device.type for b in model.buffers()} == {"meta"}
    assert all(n < 1_000 for shape in made for n in shape), made
