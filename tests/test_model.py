"""The assembled model: CS336 state-dict contract, an independent forward, causality, bad input."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from lmcore import ModelInputError, TransformerLM, build_model, parse_spec
from lmcore.errors import BuildOptionError, ModelTooLargeError, StateDictError
from lmcore.interfaces import LayerContext


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


# ------------------------------------------------------------------ bad input


@pytest.fixture(scope="module")
def tiny():
    return build_model("cs336-tiny")


def test_float_ids_are_a_type_error(tiny) -> None:
    with pytest.raises(
        TypeError,
        match=r"token ids must be an integer tensor, got dtype torch.float32; convert with ids.long\(\)",
    ):
        tiny(torch.zeros(1, 4))


def test_out_of_range_ids_name_the_value_and_index(tiny) -> None:
    ids = torch.zeros(2, 4, dtype=torch.long)
    ids[1, 2] = 10000
    with pytest.raises(
        ModelInputError,
        match=r"token id 10000 at index \(1, 2\) is out of range for vocab_size=10000 \(valid ids: 0..9999\)",
    ):
        tiny(ids)
    ids[1, 2] = -1
    with pytest.raises(ValueError, match=r"token id -1 at index \(1, 2\)"):
        tiny(ids)


def test_too_long_sequence(tiny) -> None:
    with pytest.raises(
        ModelInputError,
        match=r"sequence length 17 exceeds context_length=16; truncate to the last 16 tokens",
    ):
        tiny(torch.zeros(1, 17, dtype=torch.long))


def test_bad_positions(tiny) -> None:
    ids = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(
        ModelInputError,
        match=r"token_positions must lie in 0..15 \(context_length=16\); got min 14, max 17",
    ):
        tiny(ids, torch.arange(14, 18))
    with pytest.raises(
        ModelInputError, match=r"token_positions must be integers of shape \(..., 4\)"
    ):
        tiny(ids, torch.arange(3))


def test_non_tensor_and_scalar_ids(tiny) -> None:
    with pytest.raises(TypeError, match=r"token ids must be a torch.Tensor, got list"):
        tiny([1, 2, 3])
    with pytest.raises(ModelInputError, match=r"token ids need a sequence dimension"):
        tiny(torch.tensor(3))


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


# ------------------------------------------------------------------ more bad input (issue 11)


def test_an_empty_batch_gives_empty_logits(tiny) -> None:
    assert tiny(torch.zeros(0, 8, dtype=torch.long)).shape == (0, 8, 10000)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.uint8, torch.int32])
def test_small_integer_ids_and_positions_give_the_int64_logits(tiny, dtype) -> None:
    ids = torch.randint(0, 100, (2, 8))
    expected = tiny(ids)
    torch.testing.assert_close(tiny(ids.to(dtype)), expected)  # uint8 is not read as a mask
    torch.testing.assert_close(tiny(ids, torch.arange(8, dtype=dtype)), expected)


@pytest.mark.parametrize(
    "ids, positions, error, message",
    [
        (torch.zeros(1, 4, dtype=torch.long), [0, 1, 2, 3], TypeError,
         r"token_positions must be a torch.Tensor, got list; use torch.tensor\(...\)"),
        (torch.zeros(1, 1, dtype=torch.long), torch.tensor(0), ModelInputError,
         r"token_positions must be integers of shape \(..., 1\); got dtype torch.int64, shape \(\)"),
        (torch.zeros(1, 4, dtype=torch.long), torch.zeros(4, dtype=torch.complex64), TypeError,
         r"token_positions must be an integer tensor, got dtype torch.complex64; convert with token_positions.long\(\)"),
        (torch.zeros(1, 4, dtype=torch.complex64), None, TypeError,
         r"token ids must be an integer tensor, got dtype torch.complex64; convert with ids.long\(\)"),
        (torch.zeros(1, 4, dtype=torch.long).to_sparse(), None, TypeError,
         r"token ids must be a dense tensor, got layout torch.sparse_coo; convert with ids.to_dense\(\)"),
        (torch.zeros(1, 4, dtype=torch.long, device="meta"), None, ModelInputError,
         r"token ids are on meta but the model is on cpu; move them with ids.to\('cpu'\)"),
        (torch.zeros(1, 4, dtype=torch.long), torch.arange(4, device="meta"), ModelInputError,
         r"token_positions are on meta but the model is on cpu; move them with token_positions.to\('cpu'\)"),
    ],
    ids=["positions-list", "positions-0d", "positions-complex", "ids-complex", "ids-sparse",
         "ids-on-meta", "positions-on-meta"],
)  # fmt: skip
def test_bad_input_is_named_not_a_raw_torch_error(tiny, ids, positions, error, message) -> None:
    with pytest.raises(error, match=message):
        tiny(ids, positions)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"dtype": torch.int64}, r"dtype torch.int64 cannot hold trainable weights; use a floating-point dtype"),
        ({"dtype": torch.complex64}, r"dtype torch.complex64 cannot hold trainable weights"),
        ({"dtype": "float32"}, r"dtype 'float32' cannot hold trainable weights"),
        ({"device": "bogus"}, r"unknown device 'bogus'; use cpu, meta, cuda or cuda:N"),
        ({"device": 3.5}, r"unknown device 3.5"),
    ],
)  # fmt: skip
def test_bad_build_options_are_named(options: dict, message: str) -> None:
    with pytest.raises(BuildOptionError, match=message):
        build_model("cs336-tiny", **options)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_is_named() -> None:
    with pytest.raises(
        BuildOptionError, match=r"device 'cuda': CUDA is not available in this torch build"
    ):
        build_model("cs336-tiny", device="cuda")


# ------------------------------------------------------------------ compiled value checks


@pytest.mark.parametrize("backend", ["eager"])  # the check is an opaque operator: inductor below
def test_a_compiled_model_checks_ids_and_positions_too(backend: str) -> None:
    torch.manual_seed(0)
    model = build_model("cs336-tiny")
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    ids = torch.randint(0, 10000, (2, 8))
    torch.testing.assert_close(compiled(ids), model(ids))
    for bad, shown in ((-1, r"token id -1"), (10_000, r"token id 10000")):
        wrong = ids.clone()
        wrong[1, 3] = bad
        with pytest.raises(
            ModelInputError,
            match=shown + r" at index \(1, 3\) is out of range for vocab_size=10000",
        ):
            compiled(wrong)  # was: id -1 silently gave the logits of id 9999
    with pytest.raises(
        ModelInputError,
        match=r"token_positions must lie in 0..15 \(context_length=16\); got min 10, max 17",
    ):
        compiled(ids, torch.arange(10, 18))


def test_inductor_does_not_abort_on_an_id_past_the_table() -> None:
    """With inductor on the CPU, id 10,000 used to abort the process (exit 134); a subprocess
    keeps that from taking the test run down if it ever comes back."""
    code = textwrap.dedent("""
        import torch, lmcore
        model = lmcore.build_model("cs336-tiny, num_layers=1")
        ids = torch.zeros(1, 4, dtype=torch.long)
        ids[0, 2] = 10_000
        try:
            torch.compile(model, backend="inductor")(ids)
        except lmcore.ModelInputError as e:
            print(e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == (
        "token id 10000 at index (0, 2) is out of range for vocab_size=10000 (valid ids: 0..9999)"
    )


# ------------------------------------------------------------------ state dicts


def test_a_tied_model_refuses_an_untied_state_dict() -> None:
    """The reproduction: a CS336 checkpoint loaded strictly into tie_embeddings=true kept one of
    its two matrices and silently dropped the other."""
    tied = build_model("cs336-tiny, tie_embeddings=true")
    before = tied.lm_head.weight.detach().clone()
    with pytest.raises(
        StateDictError,
        match=r"this model ties its embeddings \(tie_embeddings=true\), but the state dict holds "
        r"two different matrices for token_embeddings.weight and lm_head.weight",
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


# ------------------------------------------------------------------ the size check


def test_a_model_beyond_the_limit_is_refused_before_allocating(monkeypatch) -> None:
    import lmcore.model.counting

    monkeypatch.setattr(lmcore.model.counting, "available_memory", lambda device: 16 * 2**30)
    with pytest.raises(
        ModelTooLargeError,
        match=r"the model needs 11.33 TiB \(12,455,976,994,816 bytes\) for its float32 weights and "
        r"buffers, more than the 16.00 GiB of memory available on cpu; the largest part is "
        r"layers.\*.ffn \(7.51 TiB\). Shrink the spec, or raise the limit with max_bytes=",
    ):
        build_model("tinystories, num_layers=1000000")
    with pytest.raises(
        ModelTooLargeError,
        match=r"num_layers=1,000,000: the module objects alone need about 30.52 GiB of host memory "
        r"\(about 32.00 KiB per layer, on any device, meta included\), more than the 16.00 GiB",
    ):
        build_model("tinystories, num_layers=1000000", device="meta")  # was: 82 s, SystemError


@pytest.mark.parametrize(
    "spec, part",
    [
        ("tinystories, d_model=1000000000", r"layers.\*.attn.q_proj"),
        ("tinystories, vocab_size=1099511627776", r"token_embeddings"),
        ("tinystories, d_ff=1000000000000", r"layers.\*.ffn"),
    ],
)
def test_the_issues_sizes_are_refused_naming_the_largest_part(spec: str, part: str) -> None:
    with pytest.raises(ModelTooLargeError, match=r"the model needs .* the largest part is " + part):
        build_model(spec, max_bytes=2**40)


def test_max_bytes_is_the_callers_limit() -> None:
    with pytest.raises(
        ModelTooLargeError,
        match=r"the model needs 5.35 MiB \(5,614,336 bytes\) for its float32 weights and buffers, "
        r"more than the limit max_bytes=1,000,000 \(976.56 KiB\); the largest part is "
        r"token_embeddings \(2.44 MiB\)",
    ):
        build_model("cs336-tiny", max_bytes=1_000_000)
    # Exactly enough: weights (1,403,328 float32 parameters) and RoPE's tables (1,024 bytes).
    assert build_model("cs336-tiny", max_bytes=4 * 1_403_328 + 1_024) is not None


def test_the_default_limit_is_the_memory_available_and_none_on_meta(monkeypatch) -> None:
    import lmcore.model.counting

    monkeypatch.setattr(lmcore.model.counting, "available_memory", lambda device: 2**20)
    with pytest.raises(
        ModelTooLargeError, match=r"more than the 1.00 MiB of memory available on cpu"
    ):
        build_model("cs336-tiny")
    assert build_model("tinystories", device="meta").spec.d_model == 512  # meta allocates nothing


def test_a_module_torch_cannot_index_is_refused_even_on_meta() -> None:
    with pytest.raises(
        ModelTooLargeError,
        match=r"token_embeddings \(embedding 4611686018427387904×1024\) would hold 16.00 ZiB|"
        r"token_embeddings .* beyond the 2\*\*63 - 1 bytes torch can index",
    ):
        build_model(
            "tinystories, vocab_size=4611686018427387904, d_model=1024, num_heads=16", device="meta"
        )


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
