"""plugins/lmcore_mla.py: multi-head latent attention against its formula written out per token
(float64), against transformers' DeepseekV3Attention with the same weights (float32); the
absorbed decoding step against the expanded forward; its decoding state (the latent and the
rotated key only); the kit's checks at non-default widths; generation with the cache."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

import lmcore_mla
from lmcore import build_model
from lmcore.errors import SpecError
from lmcore.interfaces import LayerContext
from lmcore.model.cache import ContextState, DecodingCache, LayerCache
from lmcore.model.generate import GREEDY, compile_decoding
from lmcore.model.mla import MultiHeadLatentAttention
from lmcore.registry import get_registry
from lmcore.testing import Case, Settings
from lmcore.testing.core import CHECKS, Target
from tests.helpers.models import recompute

SPEC = "vocab_size=97, context_length=24, d_model=32, num_layers=1, num_heads=4, d_ff=64"
# head_dim 8: kv_lora_rank 32, qk_nope_head_dim 8, qk_rope_head_dim 4, v_head_dim 8 by default.
VARIANTS = ["", "q_lora_rank=12", "rope_interleave=false",
            "q_lora_rank=6, kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=2, v_head_dim=12"]  # fmt: skip


def mixer(args: str = "", dtype: torch.dtype = torch.float64) -> MultiHeadLatentAttention:
    torch.manual_seed(0)
    model = build_model(SPEC + ", mixer=mla" + (f"({args})" if args else ""), dtype=dtype)
    m = model.layers[0].attn
    with torch.no_grad():  # norm gains away from 1, so that a gain applied wrongly shows
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


def per_token(m: MultiHeadLatentAttention, x: Tensor, theta: float = 10000.0) -> Tensor:
    """Each query attends to the keys up to its own, one head, one key at a time:
    s_j = (q_nope · k_nope_j + rot(q_pe, t) · rot(k_pe_j, j)) / sqrt(n + p), the keys and values
    from kv_b_proj of the normalised latent, o = o_proj of the heads' softmax-weighted values.
    The rotation turns pairs by pos / theta^(2k/p), written out here."""
    H, r, n, p, v = m.num_heads, m.kv_lora_rank, m.nope, m.rope, m.v_dim
    B, T, _ = x.shape

    def norm(u: Tensor, w: Tensor) -> Tensor:
        return w * u / torch.sqrt((u * u).mean() + m.kv_a_layernorm.eps)

    def rot(u: Tensor, pos: int) -> Tensor:
        pairs = [
            (2 * k, 2 * k + 1) if m.rope_interleave else (k, k + p // 2) for k in range(p // 2)
        ]
        out = u.clone()
        for k, (i, j) in enumerate(pairs):
            # The angle's cos and sin in float32, as the tables (lmcore's, Hugging Face's) hold them.
            inv_freq = 1.0 / theta ** (torch.tensor(2.0 * k) / p)  # float32 throughout
            angle = torch.tensor(float(pos)) * inv_freq
            cos, sin = angle.cos().item(), angle.sin().item()
            out[i] = u[i] * cos - u[j] * sin
            out[j] = u[i] * sin + u[j] * cos
        return out

    def query(xt: Tensor) -> Tensor:
        if m.q_lora_rank:
            low = norm(m.q_a_proj.weight @ xt, m.q_a_layernorm.weight)
            return (m.q_b_proj.weight @ low).view(H, n + p)
        return (m.q_proj.weight @ xt).view(H, n + p)

    out = torch.zeros_like(x)
    for b in range(B):
        kv = [m.kv_a_proj_with_mqa.weight @ x[b, j] for j in range(T)]
        c = [norm(kv[j][:r], m.kv_a_layernorm.weight) for j in range(T)]
        k_pe = [rot(kv[j][r:], j) for j in range(T)]
        expanded = [(m.kv_b_proj.weight @ c[j]).view(H, n + v) for j in range(T)]
        for t in range(T):
            q = query(x[b, t])
            heads = []
            for h in range(H):
                q_pe = rot(q[h, n:], t)
                s = torch.stack([(q[h, :n] @ expanded[j][h, :n] + q_pe @ k_pe[j]) / math.sqrt(n + p)
                                 for j in range(t + 1)])  # fmt: skip
                w = torch.exp(s - s.max())
                w = w / w.sum()
                heads.append(sum(w[j] * expanded[j][h, n:] for j in range(t + 1)))
            out[b, t] = m.o_proj.weight @ torch.cat(heads)
    return out


@pytest.mark.parametrize("args", VARIANTS)
def test_it_computes_its_formula_token_by_token(args: str) -> None:
    m = mixer(args)
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    got = m(x, LayerContext(positions=torch.arange(6)[None]))
    torch.testing.assert_close(got, per_token(m, x), rtol=1e-12, atol=1e-12)


# DeepSeek's YaRN (the softmax scaled by mscale(4, 1.0)², cos and sin by mscale(4, 0.8) /
# mscale(4, 1.0)), an attention factor given outright, and the biases of attention_bias.
_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 0.8,
         "mscale_all_dim": 1.0, "original_max_position_embeddings": 8}  # fmt: skip
EXTRAS = [
    ("", {}),
    ("bias=true", {"attention_bias": True}),
    ("scaling=yarn, factor=4.0, original_context_length=8, mscale=0.8, mscale_all_dim=1.0",
     {"rope_parameters": _YARN}),
    ("scaling=yarn, factor=4.0, original_context_length=8, beta_fast=16.0, beta_slow=2.0, "
     "attention_factor=1.5", {"rope_parameters": {**_YARN, "mscale": None, "mscale_all_dim": None,
                                                   "attention_factor": 1.5, "beta_fast": 16.0,
                                                   "beta_slow": 2.0}}),
]  # fmt: skip


@pytest.mark.parametrize("q_lora_rank", [0, 12])
@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("extra", EXTRAS, ids=["plain", "bias", "yarn", "yarn-factor"])
def test_it_matches_transformers_deepseek_v3_attention(
    q_lora_rank: int, interleave: bool, extra: tuple[str, dict]
) -> None:
    """The state dict is Hugging Face's, key for key: the weights load as they are."""
    ds = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")
    from transformers import DeepseekV3Config

    flag = "true" if interleave else "false"
    args, changes = extra
    m = mixer(f"q_lora_rank={q_lora_rank}, rope_interleave={flag}" + (f", {args}" if args else ""),
              dtype=torch.float32)  # fmt: skip
    config = DeepseekV3Config(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=q_lora_rank or None, kv_lora_rank=32, qk_nope_head_dim=8, qk_rope_head_dim=4,
        v_head_dim=8, rope_interleave=interleave, max_position_embeddings=24, num_hidden_layers=1,
        **changes,
    )  # fmt: skip
    config._attn_implementation = "eager"
    ref = ds.DeepseekV3Attention(config, layer_idx=0).eval()
    ref.load_state_dict(m.state_dict(), strict=True)
    x = torch.randn(2, 9, 32)
    positions = torch.arange(3, 12)[None].expand(2, -1)  # not from 0: the tables are indexed
    cos, sin = ds.DeepseekV3RotaryEmbedding(config)(x, positions)
    causal = torch.full((9, 9), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        want, _ = ref(x, (cos, sin), causal)
        got = m(x, LayerContext(positions=positions))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("args", VARIANTS)
def test_the_absorbed_step_gives_the_expanded_forward_without_expanding(args: str) -> None:
    """After a prefill, each step attends to the cached latents through the absorbed query:
    kv_b_proj, which expands latents into keys and values, is never called; the outputs are
    those of the plain (expanded) forward, token by token and for a chunk."""
    m = mixer(args)
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    p = torch.arange(9)[None]
    calls: list[int] = []
    m.kv_b_proj.register_forward_hook(lambda module, i, o: calls.append(i[0].shape[1]))
    with torch.no_grad():
        full = m(x, LayerContext(positions=p))
        for steps in ([1] * 9, [4, 3, 1, 1]):
            state = m.decoding_state(batch=2, context_length=24, dtype=torch.float64)
            calls.clear()
            start, outs = 0, []
            for n in steps:
                view = LayerCache(state, start)
                outs.append(
                    m(
                        x[:, start : start + n],
                        LayerContext(cache=view, positions=p[:, start : start + n]),
                    )
                )
                start += n
            assert calls == [steps[0]], "only the prefill expands its own latents"
            torch.testing.assert_close(torch.cat(outs, dim=1), full, rtol=1e-12, atol=1e-12)


def test_decoding_keeps_the_normalised_latent_and_the_rotated_key_only() -> None:
    """The state after a prefill holds, per token, kv_a_layernorm of the latent and k_pe rotated
    as transformers' DeepseekV3 rotates (and caches) it, and nothing per head."""
    ds = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")
    m = mixer(dtype=torch.float32)
    x = torch.randn(2, 5, 32)
    state = m.decoding_state(batch=2, context_length=24, dtype=torch.float32)
    assert isinstance(state, ContextState) and state.rewind
    assert {k: tuple(t.shape) for k, t in state.tensors().items()} == {"latent": (2, 24, 36)}
    with torch.no_grad():
        m(x, LayerContext(cache=LayerCache(state, 0), positions=torch.arange(5)[None]))
        c, k_pe = m.kv_a_proj_with_mqa(x).split((32, 4), dim=-1)
        angles = torch.arange(5.0)[:, None] / 10000.0 ** (torch.arange(0, 4, 2) / 4)
        cos = torch.cat((angles, angles), dim=-1).cos()[None]  # (1, T, p), Hugging Face's layout
        sin = torch.cat((angles, angles), dim=-1).sin()[None]
        _, want = ds.apply_rotary_pos_emb_interleave(k_pe[:, None], k_pe[:, None], cos, sin)
    torch.testing.assert_close(state["latent"][:, :5, :32], m.kv_a_layernorm(c))
    torch.testing.assert_close(state["latent"][:, :5, 32:], want[:, 0])


@pytest.mark.parametrize("args", ["", "q_lora_rank=12, kv_lora_rank=10, qk_rope_head_dim=2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_state_is_kv_lora_rank_plus_qk_rope_head_dim_numbers_a_token(
    args: str, dtype: torch.dtype
) -> None:
    spec = (
        SPEC.replace("num_layers=1", "num_layers=3") + ", mixer=mla" + (f"({args})" if args else "")
    )
    model = build_model(spec, dtype=dtype)
    m = model.layers[0].attn
    per_token = (m.kv_lora_rank + m.rope) * dtype.itemsize
    assert per_token == (36 if not args else 12) * dtype.itemsize
    kwargs = {"head_dim": 8, "kv_lora_rank": m.kv_lora_rank, "qk_rope_head_dim": m.rope}
    assert lmcore_mla.state(**kwargs, dtype=dtype) == (per_token, 0)
    cache = DecodingCache.for_model(model, batch=2, capacity=24)  # the whole context
    assert cache.nbytes() - cache.positions.nbytes == 3 * 2 * 24 * per_token


def test_the_cache_truncates_and_selects_rows() -> None:
    torch.manual_seed(0)
    model = build_model(SPEC.replace("num_layers=1", "num_layers=2") + ", mixer=mla")
    ids = torch.randint(0, 97, (2, 8))
    other = torch.randint(0, 97, (2, 3))
    with torch.no_grad():
        cache = DecodingCache.for_model(model, batch=2)
        model(ids, cache=cache)
        cache.truncate(5)  # a turn re-encoded: the first 5 tokens stay cached
        got = model(other, cache=cache)
        want = model(torch.cat([ids[:, :5], other], dim=1))[:, 5:]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        forked = cache.select(torch.tensor([1, 1, 0]))  # one prefix, several continuations
        nxt = torch.randint(0, 97, (3, 1))
        got = model(nxt, cache=forked)
        prefix = torch.cat([ids[:, :5], other], dim=1)[[1, 1, 0]]
        want = model(torch.cat([prefix, nxt], dim=1))[:, -1:]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_an_additive_bias_reaches_both_forms() -> None:
    """pos=alibi's bias is added to the scores of the expanded prefill and the absorbed steps
    alike: the cached logits are the full forward's."""
    torch.manual_seed(0)
    model = build_model(SPEC + ", pos=alibi, mixer=mla")
    ids = torch.randint(0, 97, (2, 7))
    with torch.no_grad():
        full = model(ids)
        assert not torch.allclose(full, build_model(SPEC + ", pos=nope, mixer=mla")(ids))
        cache = DecodingCache.for_model(model, batch=2)
        got = torch.cat(
            [
                model(ids[:, :4], cache=cache),
                *(model(ids[:, t : t + 1], cache=cache) for t in range(4, 7)),
            ],
            dim=1,
        )
    torch.testing.assert_close(got, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "spec",
    ["num_layers=2, mixer=mla", "num_layers=2, mixer=mla(q_lora_rank=12)",
     "num_layers=4, num_kv_heads=2, mixer=mla, mixer[1::2]=attention"],
)  # fmt: skip
def test_greedy_with_the_cache_is_greedy_recomputing(spec: str) -> None:
    torch.manual_seed(0)
    model = build_model(
        f"vocab_size=97, context_length=24, d_model=32, num_heads=4, d_ff=64, {spec}"
    )
    prompt = torch.randint(0, 97, (2, 5))
    assert torch.equal(model.generate(prompt, 10, GREEDY), recompute(model, prompt, 10))
    prompts = [torch.randint(0, 97, (n,)) for n in (3, 7, 1)]  # left-padded together
    for row, alone in zip(model.generate(prompts, 6, GREEDY), prompts, strict=True):
        assert torch.equal(row, recompute(model, alone[None], 6)[0])


def test_its_training_forward_and_backward_compile_as_one_graph() -> None:
    m = mixer("q_lora_rank=12", dtype=torch.float32)
    x = torch.randn(2, 6, 32, requires_grad=True)
    context = LayerContext(positions=torch.arange(6)[None])
    eager = m(x, context)
    (grad,) = torch.autograd.grad(eager.square().sum(), x)
    torch.compiler.reset()
    try:
        got = torch.compile(m, backend="aot_eager", fullgraph=True)(x, context)
        (got_grad,) = torch.autograd.grad(got.square().sum(), x)
    finally:
        torch.compiler.reset()
    torch.testing.assert_close(got, eager)
    torch.testing.assert_close(got_grad, grad)


def test_its_decoding_step_compiles_as_one_graph() -> None:
    torch.manual_seed(0)
    model = build_model(SPEC + ", mixer=mla")
    prompt = torch.randint(0, 97, (2, 5))
    eager = model.generate(prompt, 4, GREEDY)
    torch.compiler.reset()
    try:
        decoder = compile_decoding(model, backend="eager", fullgraph=True)
        assert torch.equal(decoder.generate(prompt, 4, GREEDY), eager)
    finally:
        torch.compiler.reset()


KIT_ARGS = [(("q_lora_rank", 12),), (("v_head_dim", 40),),
            (("kv_lora_rank", 10), ("qk_nope_head_dim", 6), ("qk_rope_head_dim", 2))]  # fmt: skip
KIT = [c for c in CHECKS if "mixer" in c.kinds and not c.defaults_only and c.feature is None]


@pytest.mark.parametrize("overrides", KIT_ARGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o))
@pytest.mark.parametrize("check", KIT, ids=lambda c: c.name)
def test_the_kit_passes_at_other_widths(check, overrides) -> None:  # type: ignore[no-untyped-def]
    """The kit (which checks the defaults and the flipped rope_interleave) at a q bottleneck,
    values wider than the query/key heads, and narrow latents: its declarations hold."""
    registry = get_registry()
    [entry] = [e for e in registry.entries("mixer") if e.name == "mla"]
    for variant in check.variants:
        Case(check, Target(entry, overrides, registry=registry), variant).run(Settings())


@pytest.mark.parametrize(
    ("args", "message"),
    [("qk_rope_head_dim=3", r"qk_rope_head_dim=3: the rotation turns pairs of dimensions"),
     ("kv_lora_rank=-1", r"kv_lora_rank.*must be >= 0"),
     ("factor=4.0", r"factor=4.0 has no effect with scaling=none; it applies with scaling=yarn"),
     ("scaling=yarn, beta_fast=1.0, beta_slow=2.0",
      r"beta_fast=1.0 must exceed beta_slow=2.0")],
)  # fmt: skip
def test_widths_that_cannot_work_are_refused(args: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        build_model(f"{SPEC}, mixer=mla({args})", device="meta")
