"""attn=chunked: tiled attention against torch and sdpa, masks and biases, stability, gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmcore import SpecError, build_model, get_registry, parse_spec
from lmcore_chunked import ChunkedAttention
from lmcore_sdpa import SDPA
from tests.helpers.plugins import (
    COUNT_SHAPES,
    assert_compile_traces_the_whole_module,
    assert_declared_counts,
    assert_model_runs_counts_and_is_causal,
)


def _end_aligned(sq: int, sk: int) -> torch.Tensor:
    # torch's is_causal aligns to the start for Sq != Sk; build the end-aligned mask explicitly.
    return torch.ones(sq, sk, dtype=torch.bool).tril(diagonal=sk - sq)


def _torch_attention(q, k, v, mask=None, bias=None) -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    attn_mask = bias
    if mask is not None:
        neg = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
        attn_mask = neg if attn_mask is None else attn_mask + neg
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)


@pytest.mark.parametrize("block", [1, 3, 4, 128])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("sq,sk", [(9, 9), (3, 10), (1, 7)])
def test_causal_matches_torch_and_sdpa(block, heads, kv_heads, sq, sk) -> None:
    torch.manual_seed(0)
    q = torch.randn(2, heads, sq, 8)
    k, v = torch.randn(2, kv_heads, sk, 8), torch.randn(2, kv_heads, sk, 8)
    out = ChunkedAttention(block_size=block)(q, k, v, causal=True)
    expected = _torch_attention(q, k, v, mask=_end_aligned(sq, sk))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, SDPA()(q, k, v, causal=True), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block", [2, 5])
def test_mask_and_bias_in_several_shapes_combine_with_causal(block: int) -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    causal = _end_aligned(5, 7)
    masks = [
        torch.rand(5, 7) > 0.3,  # (Sq, Sk)
        torch.rand(2, 1, 1, 7) > 0.3,  # a padding mask over keys
        torch.rand(2, 4, 5, 7) > 0.3,  # per batch and head
        torch.rand(2, 1, 5, 1) > 0.3,  # a size-1 key dimension broadcasts over every block
    ]
    biases = [
        torch.randn(4, 5, 7),
        torch.randn(2, 4, 5, 7),
        torch.randn(1, 4, 1, 7),
        torch.randn(4, 5, 1),  # constant per row: broadcasts over keys
    ]
    for mask in masks:
        mask[..., 0] = True  # every row keeps a key: sdpa's NaN rows are tested separately
        for bias in biases:
            out = ChunkedAttention(block)(q, k, v, causal=True, mask=mask, bias=bias)
            expected = _torch_attention(q, k, v, mask=mask & causal, bias=bias)
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
            ref = SDPA()(q, k, v, causal=True, mask=mask, bias=bias)
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_not_causal_attends_to_every_key() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 10, 4), torch.randn(1, 2, 10, 4)
    out = ChunkedAttention(block_size=4)(q, k, v, causal=False)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), rtol=1e-5, atol=1e-5)


def test_large_scores_do_not_overflow() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 1, 6, 4) * 100, torch.randn(1, 1, 6, 4) * 100, torch.randn(1, 1, 6, 4)
    out = ChunkedAttention(block_size=2)(q, k, v, causal=True)
    torch.testing.assert_close(out, _torch_attention(q, k, v, mask=_end_aligned(6, 6)))


def test_fully_masked_rows_return_zeros_with_finite_gradients() -> None:
    torch.manual_seed(0)
    q = torch.randn(1, 2, 4, 8, requires_grad=True)
    k, v = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1] = False  # query 1 may attend nothing
    out = ChunkedAttention(block_size=4)(q, k, v, causal=False, mask=mask)
    assert bool((out[:, :, 1] == 0).all())
    # torch's own kernel and lmcore's sdpa return zeros there too.
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    torch.testing.assert_close(out, SDPA()(q, k, v, causal=False, mask=mask), rtol=1e-5, atol=1e-5)
    out.sum().backward()
    assert q.grad is not None and bool(torch.isfinite(q.grad).all())
    assert bool((q.grad[:, :, 1] == 0).all())


def test_gradients_match_torch() -> None:
    torch.manual_seed(0)
    q = torch.randn(1, 4, 6, 8, requires_grad=True)
    k = torch.randn(1, 2, 9, 8, requires_grad=True)
    v = torch.randn(1, 2, 9, 8, requires_grad=True)
    grads = []
    for fn in (
        lambda: ChunkedAttention(block_size=4)(q, k, v, causal=True),
        lambda: _torch_attention(q, k, v, mask=_end_aligned(6, 9)),
    ):
        g = torch.autograd.grad((fn() * torch.arange(8.0)).sum(), (q, k, v))
        grads.append(g)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_bf16_stays_bf16_and_is_close_to_float32() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 8, 256, 64).to(torch.bfloat16) for _ in range(3))
    out = ChunkedAttention(block_size=64)(q, k, v, causal=True)
    assert out.dtype == torch.bfloat16
    reference = _torch_attention(q.float(), k.float(), v.float(), mask=_end_aligned(256, 256))
    torch.testing.assert_close(out.float(), reference, rtol=2e-2, atol=2e-2)
    bf16_sdpa = SDPA()(q, k, v, causal=True).float()
    torch.testing.assert_close(out.float(), bf16_sdpa, rtol=3e-2, atol=3e-2)


def test_block_size_is_validated() -> None:
    with pytest.raises(
        SpecError, match=r"argument 'block_size' of attn 'chunked' must be >= 1, got 0"
    ):
        parse_spec("cs336-tiny, attn=chunked(block_size=0)")
    with pytest.raises(ValueError, match=r"block_size must be >= 1, got 0"):
        ChunkedAttention(block_size=0)
    assert str(parse_spec("cs336-tiny, attn=chunked").attn) == "chunked(block_size=128)"


@pytest.mark.parametrize("pos", ["rope", "alibi"])
def test_model_with_chunked_equals_model_with_sdpa(pos: str) -> None:
    torch.manual_seed(0)
    sdpa = build_model(f"cs336-tiny, pos={pos}, num_kv_heads=2")
    chunked = build_model(f"cs336-tiny, pos={pos}, num_kv_heads=2, attn=chunked(block_size=5)")
    chunked.load_state_dict(sdpa.state_dict(), strict=True)
    ids = torch.randint(0, 10000, (2, 16))
    torch.testing.assert_close(chunked(ids), sdpa(ids), rtol=1e-5, atol=1e-5)


# Declared accounting equals the built module, at two shapes; torch.compile traces it whole.
@pytest.mark.parametrize("shape", COUNT_SHAPES)
def test_declared_params_and_flops_equal_the_module(shape: tuple[int, ...]) -> None:
    assert_declared_counts("attn", "chunked", {"block_size": 3}, shape)


def test_features_are_declared_and_compile_traces_the_whole_module() -> None:
    assert_compile_traces_the_whole_module("attn", "chunked", {"block_size": 3})


def test_model_runs_counts_its_parameters_and_is_causal() -> None:
    assert_model_runs_counts_and_is_causal("cs336-tiny, attn=chunked(block_size=4)")


def test_flops_are_the_matmul_counts_written_out() -> None:
    component = get_registry().get("attn", "chunked").component
    # q kᵀ and p v for each of 8 heads, 5 queries over 20 keys, D=64: block size changes nothing.
    for block in (1, 4, 128):
        assert component.count_flops(
            num_heads=8, head_dim=64, seq_len=5, kv_len=20, block_size=block
        ) == 8 * 2 * (2 * 5 * 64 * 20)


def test_declared_features() -> None:
    assert get_registry().get("attn", "chunked").component.features == {
        "gqa", "bias", "mask", "scale", "softcap", "window", "sinks", "documents", "compile"
    }  # fmt: skip


def _row_of_documents(lengths: tuple[int, ...]) -> torch.Tensor:
    return torch.cat([torch.full((n,), d) for d, n in enumerate(lengths)])[None]


@pytest.mark.parametrize("lengths", [(64,) * 8, (100, 3, 200, 209), (512,)])
def test_documents_match_torch_with_the_block_causal_mask_and_skip_tiles(
    monkeypatch: pytest.MonkeyPatch, lengths: tuple[int, ...]
) -> None:
    """With documents, forward and backward are torch's attention under the block-causal mask,
    and only the tiles within documents are computed: a row of eight 64-token documents
    computes under a fifth of the score columns the dense mask does."""
    import lmcore.model.attention as attention
    from lmcore.model.documents import same_document

    computed = {"columns": 0}
    scores = attention._scores

    def counting(qt, kt, *args, **kw):
        computed["columns"] += qt.shape[1] * kt.shape[1]
        return scores(qt, kt, *args, **kw)

    monkeypatch.setattr(attention, "_scores", counting)
    torch.manual_seed(0)
    docs = _row_of_documents(lengths)
    T = docs.shape[1]
    q, k, v = (torch.randn(1, 2, T, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    kernel = ChunkedAttention(block_size=32)
    mask = same_document(docs)
    out = kernel(q, k, v, causal=True, documents=docs)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    with_documents = computed["columns"]
    computed["columns"] = 0
    dense = kernel(q, k, v, causal=True, mask=mask)
    torch.autograd.grad(dense.sum(), (q, k, v))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask & _end_aligned(T, T))
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads, torch.autograd.grad(expected.sum(), (q, k, v)), strict=True):
        torch.testing.assert_close(got, want)
    if lengths == (64,) * 8:
        assert with_documents * 5 < computed["columns"]
    else:  # never more than the dense mask's tiles
        assert with_documents <= computed["columns"]
