"""Packed rows of documents (lmcore/model/documents.py and `TransformerLM.forward(documents=)`):
each document's logits are what it gives alone, for several mixers and positional encodings;
the derived starts, positions and masks against their definitions; the chunked recurrences
against one document at a time; refusals that name what to change."""

from __future__ import annotations

import pytest
import torch

from lmcore import build_model
from lmcore.errors import ModelInputError
from lmcore.model.conv import causal_conv
from lmcore.model.deltanet import chunk_gated_delta_rule
from lmcore.model.documents import document_positions, document_starts, same_document
from lmcore.model.ssd import chunk_ssd
from tests.helpers.errors import raises_naming

BASE = "vocab_size=97, context_length=64, d_model=64, num_layers=2, num_heads=4, d_ff=128"
LENGTHS = (7, 20, 1, 5)


def packed(lengths: tuple[int, ...] = LENGTHS, rows: int = 2) -> torch.Tensor:
    ids = torch.cat([torch.full((n,), d) for d, n in enumerate(lengths)])
    return (ids + 3)[None].expand(rows, -1)  # ids need not start at 0


def spans(lengths: tuple[int, ...] = LENGTHS) -> list[slice]:
    out, start = [], 0
    for n in lengths:
        out.append(slice(start, start + n))
        start += n
    return out


def test_starts_positions_and_mask_follow_their_definitions() -> None:
    docs = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [5, 6, 6, 6, 6, 6, 7, 7]])
    assert document_starts(docs).tolist() == [[0, 0, 0, 3, 3, 5, 5, 5], [0, 1, 1, 1, 1, 1, 6, 6]]
    assert document_positions(docs).tolist() == [[0, 1, 2, 0, 1, 0, 1, 2],
                                                 [0, 0, 1, 2, 3, 4, 0, 1]]  # fmt: skip
    mask = same_document(docs)
    assert mask.shape == (2, 1, 8, 8)
    for b in range(2):
        for i in range(8):
            for j in range(8):
                assert bool(mask[b, 0, i, j]) == (docs[b, i] == docs[b, j]).item()
    assert torch.equal(same_document(docs, 3), mask[:, :, -3:])  # the last queries


@pytest.mark.parametrize(
    "extra",
    ["pos=rope", "pos=nope", "pos=learned", "pos=sinusoidal", "pos=alibi",
     "pos=rope, pos[0]=nope", "attn=chunked(block_size=4), num_kv_heads=2",
     "attn=chunked(block_size=4), pos=alibi", "mixer=short_conv", "mixer=gated_deltanet(chunk_size=4)",
     "mixer=mamba2(chunk_size=4)", "mixer=attention_mamba2", "mixer=mla",
     "mixer=attention, mixer[1]=mamba2(chunk_size=8)"],
)  # fmt: skip
def test_each_document_gives_its_logits_alone(extra: str) -> None:
    torch.manual_seed(0)
    model = build_model(f"{BASE}, {extra}", dtype=torch.float64)
    ids = torch.randint(0, 97, (2, sum(LENGTHS)))
    together = model(ids, documents=packed())
    for part in spans():
        torch.testing.assert_close(together[:, part], model(ids[:, part]), rtol=1e-10, atol=1e-10)


def test_documents_train_as_each_document_alone() -> None:
    """The gradients of a packed row's loss are the sum of each document's own."""
    torch.manual_seed(0)
    model = build_model(f"{BASE}, attn=chunked(block_size=4)", dtype=torch.float64)
    ids = torch.randint(0, 97, (1, sum(LENGTHS)))
    model(ids, documents=packed(rows=1)).square().sum().backward()
    together = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    for part in spans():
        model(ids[:, part]).square().sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(together[n], p.grad, rtol=1e-9, atol=1e-10, msg=n)


def test_one_document_and_no_documents_give_the_same_logits() -> None:
    torch.manual_seed(0)
    model = build_model(f"{BASE}, attn=chunked(block_size=4)")
    ids = torch.randint(0, 97, (2, 30))
    plain = model(ids)
    torch.testing.assert_close(model(ids, documents=torch.zeros(2, 30, dtype=torch.long)), plain)
    assert torch.equal(model(ids, documents=None), plain)


def test_given_positions_are_kept() -> None:
    torch.manual_seed(0)
    model = build_model(f"{BASE}, pos=learned")  # absolute: the positions show
    ids = torch.randint(0, 97, (1, 12))
    docs = packed((6, 6), rows=1)
    stream = torch.arange(12)[None]
    with_stream = model(ids, stream, documents=docs)
    # The second document at positions 6..11 is the document alone at those positions.
    torch.testing.assert_close(with_stream[:, 6:], model(ids[:, 6:], stream[:, 6:]))
    assert (with_stream[:, 6:] - model(ids[:, 6:])).abs().max() > 1e-4


def test_leading_dimensions_are_flattened_like_the_ids() -> None:
    torch.manual_seed(0)
    model = build_model(BASE)
    ids = torch.randint(0, 97, (2, 3, 10))
    docs = torch.tensor([0] * 4 + [1] * 6).expand(2, 3, 10)
    out = model(ids, documents=docs)
    assert out.shape == (2, 3, 10, 97)
    torch.testing.assert_close(out[1, 2, 4:], model(ids[1, 2, 4:][None])[0])


def test_bad_documents_are_refused_with_the_reason() -> None:
    model = build_model(BASE)
    ids = torch.zeros(2, 8, dtype=torch.long)
    with raises_naming(ModelInputError, "documents must not decrease along a row",
                       "row 1 goes from 2 to 1 at index 5"):  # fmt: skip
        model(ids, documents=torch.tensor([[0] * 8, [0, 0, 2, 2, 2, 1, 1, 1]]))
    with raises_naming(ModelInputError, "documents must be integers of the token ids' shape",
                       "(B, 8); got shape (2, 7)"):  # fmt: skip
        model(ids, documents=torch.zeros(2, 7, dtype=torch.long))
    with raises_naming(TypeError, "documents must be an integer tensor, got dtype torch.float32"):
        model(ids, documents=torch.zeros(2, 8))


def test_a_cache_with_documents_is_refused() -> None:
    from lmcore.model.cache import KVCache

    model = build_model(BASE)
    kv = KVCache.for_model(model, 1)
    with raises_naming(ModelInputError, "documents and a KV cache cannot be given together",
                       "decode each document with a cache of its own"):  # fmt: skip
        model(torch.zeros(1, 4, dtype=torch.long), cache=kv, documents=torch.zeros(1, 4))


def test_a_kernel_without_documents_is_refused_by_name() -> None:
    from lmcore import Component, Registry
    from lmcore.model.attention import tiled_attention

    class Plain(torch.nn.Module):
        def forward(self, q, k, v, *, causal, mask=None, bias=None):
            return tiled_attention(q, k, v, causal=causal, mask=mask, bias=bias)

    registry = Registry()
    registry.add(Component(kind="attn", name="plain", build=Plain,
                           features=frozenset({"gqa", "mask", "bias"})), name="test")  # fmt: skip
    model = build_model(f"{BASE}, attn=plain", registry=registry)
    with raises_naming(ModelInputError, "attn 'plain' does not declare 'documents'",
                       "use a kernel that does: chunked, sdpa"):  # fmt: skip
        model(torch.zeros(1, 4, dtype=torch.long), documents=torch.zeros(1, 4, dtype=torch.long))


def test_chunked_recurrences_restart_at_each_document() -> None:
    torch.manual_seed(0)
    B, T, H, P, N = 2, 33, 2, 4, 3
    docs = packed((9, 16, 8), rows=B)
    x, dt = torch.randn(B, T, H, P, dtype=torch.float64), torch.rand(B, T, H, dtype=torch.float64)
    A = -torch.rand(H, dtype=torch.float64)
    b, c = (torch.randn(B, T, 1, N, dtype=torch.float64) for _ in range(2))
    q, k = (torch.randn(B, T, H, P, dtype=torch.float64) for _ in range(2))
    v, g = torch.randn(B, T, H, P, dtype=torch.float64), -torch.rand(B, T, H, dtype=torch.float64)
    beta = torch.rand(B, T, H, dtype=torch.float64)
    w = torch.randn(5, 4, dtype=torch.float64)
    xc = torch.randn(B, T, 5, dtype=torch.float64)
    for size in (4, 8, 64):
        y, _ = chunk_ssd(x, dt, A, b, c, chunk_size=size, documents=docs)
        o, _ = chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=size, documents=docs)
        for part in spans((9, 16, 8)):
            alone, _ = chunk_ssd(x[:, part], dt[:, part], A, b[:, part], c[:, part], chunk_size=size)
            torch.testing.assert_close(y[:, part], alone, rtol=1e-10, atol=1e-12)
            alone, _ = chunk_gated_delta_rule(q[:, part], k[:, part], v[:, part], g[:, part],
                                              beta[:, part], chunk_size=size)  # fmt: skip
            torch.testing.assert_close(o[:, part], alone, rtol=1e-10, atol=1e-12)
    y, _ = causal_conv(xc, w, documents=docs)
    for part in spans((9, 16, 8)):
        torch.testing.assert_close(y[:, part], causal_conv(xc[:, part], w)[0])
