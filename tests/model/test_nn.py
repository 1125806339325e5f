"""The from-scratch primitives against torch's own ops and independent formulas."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lmcore.model.nn import (
    Embedding,
    Linear,
    causal_mask,
    gate,
    gated_d_ff,
    gelu,
    gelu_derivative,
    matmul_t,
    realized,
    scaled_dot_product_attention,
    silu,
    silu_derivative,
    softmax,
)
from tests.helpers.compiling import GraphRecorder


def test_linear_is_x_times_w_transposed_without_bias() -> None:
    torch.manual_seed(0)
    layer = Linear(5, 3)
    assert layer.weight.shape == (3, 5)
    assert [name for name, _ in layer.named_parameters()] == ["weight"]
    x = torch.randn(2, 4, 5)
    torch.testing.assert_close(layer(x), x @ layer.weight.T)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight))


def _ops(f: object) -> set[str]:
    from torch.profiler import profile

    with profile() as prof:
        f()  # type: ignore[operator]
    return {event.key for event in prof.key_averages()}


@pytest.mark.parametrize(
    ("rows", "d_out", "split"),
    [(1, 12, True), (2, 12, False), (5, 12, False), (1, 13, False)],
)
def test_matmul_t_cuts_a_one_row_product_into_one_block_per_thread(
    rows: int, d_out: int, split: bool
) -> None:
    torch.manual_seed(0)
    x, w = torch.randn(1, rows, 7, dtype=torch.float64), torch.randn(d_out, 7, dtype=torch.float64)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        y = matmul_t(x, w)
        ops = _ops(lambda: matmul_t(x, w))
    finally:
        torch.set_num_threads(threads)
    # three blocks of d_out / 3 rows each, one batched product; a plain one otherwise
    assert ("aten::bmm" in ops) is split and ("aten::mm" in ops) is not split
    assert y.shape == (1, rows, d_out)
    torch.testing.assert_close(y, F.linear(x, w), rtol=1e-12, atol=1e-12)


def test_matmul_t_passes_gradients_to_x_and_the_weight_when_split() -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, 6, dtype=torch.float64, requires_grad=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        grads = torch.autograd.grad(matmul_t(x, w).square().sum(), (x, w))
    finally:
        torch.set_num_threads(threads)
    expected = torch.autograd.grad(F.linear(x, w).square().sum(), (x, w))
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want)


def test_matmul_t_of_a_transposed_weight_is_the_plain_product() -> None:
    x, w = torch.randn(1, 5), torch.randn(5, 8).T  # not contiguous: no view into blocks
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert "aten::bmm" not in _ops(lambda: matmul_t(x, w))
        torch.testing.assert_close(matmul_t(x, w), F.linear(x, w))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("eager_first", [True, False])
def test_matmul_t_under_compile_cuts_by_the_threads_the_last_eager_call_saw(
    monkeypatch: pytest.MonkeyPatch, traced: GraphRecorder, eager_first: bool
) -> None:
    """torch.compile cannot call get_num_threads: a traced one-row product cuts its rows by
    the threads the last eager call saw (three blocks of four rows here), or, before any eager
    call, not at all."""
    import lmcore.model.nn as nn_module

    monkeypatch.setattr(nn_module, "_THREADS", [0])
    torch.manual_seed(0)
    x, w = torch.randn(1, 1, 7), torch.nn.Parameter(torch.randn(12, 7))
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        if eager_first:
            matmul_t(x, w)
        y = torch.compile(matmul_t, backend=traced, fullgraph=True)(x, w)
    finally:
        torch.set_num_threads(threads)
    views = [tuple(n.args[1:]) for n in traced.graphs[0].graph.nodes if n.target == "view"]
    assert views == ([(3, 4, 7)] if eager_first else [])
    torch.testing.assert_close(y, F.linear(x, w))


def test_a_traced_one_row_product_reads_its_x_realized(traced: GraphRecorder) -> None:
    """Under torch.compile, matmul_t's one row of x goes through `realized` (as_strided, an op
    whose input inductor computes once) so that the norm making x is not fused into every row
    of the product; more rows, and eager calls, take x as it is."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(12, 7))
    x = torch.randn(1, 1, 7)
    assert realized(x) is x
    product = torch.compile(lambda x: matmul_t(x / x.norm(), w), backend=traced, fullgraph=True)
    ys = [product(x), product(torch.randn(1, 3, 7))]
    strided = [sum("as_strided" in str(n.target) for n in gm.graph.nodes) for gm in traced.graphs]
    assert strided == [1, 0]
    torch.testing.assert_close(ys[0], F.linear(x / x.norm(), w))


def test_matmul_t_leaves_a_tensor_subclass_to_its_own_product() -> None:
    class Sharded(torch.Tensor):  # e.g. a DTensor shard, whose views follow its own rules
        pass

    x, w = torch.randn(1, 6), torch.randn(8, 6).as_subclass(Sharded)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert "aten::bmm" not in _ops(lambda: matmul_t(x, w))
    finally:
        torch.set_num_threads(threads)


def test_linear_init_is_truncated_normal_with_the_cs336_variance() -> None:
    torch.manual_seed(0)
    d_in, d_out = 600, 400
    w = Linear(d_in, d_out).weight.detach()
    std = math.sqrt(2 / (d_in + d_out))
    assert w.abs().max() <= 3 * std + 1e-7
    # A normal truncated at ±3σ has std 0.9866σ; 240k samples pin it to well under 1%.
    assert abs(w.std().item() / std - 0.9866) < 0.01
    assert abs(w.mean().item()) < 0.01 * std


def test_embedding_is_a_row_lookup_with_unit_truncated_init() -> None:
    torch.manual_seed(0)
    emb = Embedding(1000, 64)
    ids = torch.tensor([[0, 5, 999], [3, 3, 1]])
    torch.testing.assert_close(emb(ids), F.embedding(ids, emb.weight))
    w = emb.weight.detach()
    assert w.shape == (1000, 64)
    assert w.abs().max() <= 3.0
    assert abs(w.std().item() - 0.9866) < 0.01


@pytest.mark.parametrize("shift", [lambda x: x, lambda x: x + 100, lambda x: x * 1000])
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_softmax_matches_torch_including_large_inputs(shift, dim: int) -> None:
    torch.manual_seed(0)
    x = shift(torch.randn(4, 7, 3))
    out = softmax(x, dim=dim)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.softmax(x, dim=dim))


def test_softmax_of_huge_values_does_not_overflow() -> None:
    x = torch.tensor([1e4, 1e4 - 1.0, -1e4])
    out = softmax(x)
    expected = torch.tensor([1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1)), 0.0])
    torch.testing.assert_close(out, expected)


def test_silu_matches_the_formula_and_torch() -> None:
    x = torch.linspace(-20, 20, 101)
    torch.testing.assert_close(silu(x), x / (1 + torch.exp(-x)))
    torch.testing.assert_close(silu(x), F.silu(x))


def test_gelu_is_the_exact_erf_form_not_tanh() -> None:
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    torch.testing.assert_close(gelu(x), F.gelu(x), rtol=0, atol=1e-12)
    # The tanh approximation differs by up to ~5e-4 here; exact means much closer than that.
    assert (gelu(x) - F.gelu(x, approximate="tanh")).abs().max() > 1e-4
    # Φ(1) = 0.8413447460685429 written out.
    torch.testing.assert_close(
        gelu(torch.tensor(1.0, dtype=torch.float64)),
        torch.tensor(0.8413447460685429, dtype=torch.float64),
    )


def _reference_attention(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("lead", [(3,), (2, 3)], ids=["3d", "4d"])
@pytest.mark.parametrize("sq,sk", [(5, 5), (3, 7), (7, 3)])
def test_sdpa_matches_a_masked_reference(lead: tuple[int, ...], sq: int, sk: int) -> None:
    torch.manual_seed(0)
    q, k = torch.randn(*lead, sq, 8), torch.randn(*lead, sk, 8)
    v = torch.randn(*lead, sk, 6)
    mask = torch.rand(*lead, sq, sk) > 0.3
    mask[..., 0] = True  # every query sees at least one key
    out = scaled_dot_product_attention(q, k, v, mask)
    assert out.shape == (*lead, sq, 6)
    torch.testing.assert_close(out, _reference_attention(q, k, v, mask))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_sdpa_without_mask_and_with_bias() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 8)
    bias = torch.randn(4, 6)
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v)
    )
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v, bias=bias),
        F.scaled_dot_product_attention(q, k, v, attn_mask=bias),
    )


def test_mask_true_means_may_attend() -> None:
    q = torch.zeros(1, 4)
    k = torch.zeros(3, 4)
    v = torch.tensor([[1.0], [10.0], [100.0]])
    out = scaled_dot_product_attention(q, k, v, mask=torch.tensor([[False, True, False]]))
    torch.testing.assert_close(out, torch.tensor([[10.0]]))


@pytest.mark.parametrize("sq,sk", [(4, 4), (2, 5), (1, 6)])
def test_causal_mask_aligns_queries_to_the_end(sq: int, sk: int) -> None:
    mask = causal_mask(sq, sk)
    for i in range(sq):
        for j in range(sk):
            assert bool(mask[i, j]) == (j <= sk - sq + i)
    if sq == sk:
        torch.testing.assert_close(mask, torch.ones(sq, sk, dtype=torch.bool).tril())


def test_sdpa_mask_and_bias_may_broadcast_to_more_dims() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(4, 8), torch.randn(6, 8), torch.randn(6, 8)
    mask = torch.rand(3, 4, 6) > 0.3
    mask[..., 0] = True
    bias = torch.randn(2, 1, 4, 6)
    out = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias)
    assert out.shape == (2, 3, 4, 8)
    expected = F.scaled_dot_product_attention(
        q.expand(2, 3, 4, 8),
        k.expand(2, 3, 6, 8),
        v.expand(2, 3, 6, 8),
        attn_mask=bias.masked_fill(~mask, float("-inf")),
    )
    torch.testing.assert_close(out, expected)


def test_sdpa_gradients_match_torch() -> None:
    torch.manual_seed(0)
    ours = [torch.randn(2, 3, 5, 8, requires_grad=True) for _ in range(3)]
    peer = [t.detach().clone().requires_grad_() for t in ours]
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    bias = torch.randn(3, 5, 5)
    scaled_dot_product_attention(*ours, mask=mask, bias=bias).square().sum().backward()
    F.scaled_dot_product_attention(
        *peer, attn_mask=bias.masked_fill(~mask, float("-inf"))
    ).square().sum().backward()
    for a, b in zip(ours, peer, strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_a_query_with_no_visible_key_gets_zeros_and_finite_gradients() -> None:
    torch.manual_seed(0)
    q = torch.randn(2, 4, requires_grad=True)
    k, v = torch.randn(3, 4), torch.randn(3, 4)
    mask = torch.tensor([[True, False, False], [False, False, False]])
    out = scaled_dot_product_attention(q, k, v, mask=mask)
    torch.testing.assert_close(out[0], v[0])
    torch.testing.assert_close(out[1], torch.zeros(4))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all() and (q.grad[1] == 0).all()


def test_gated_d_ff_is_8_thirds_d_model_rounded_to_64() -> None:
    assert gated_d_ff(512) == 1344  # 1365.3 -> 21 * 64
    assert gated_d_ff(768) == 2048
    assert gated_d_ff(1600) == 4288  # 4266.7 -> 67 * 64
    assert gated_d_ff(16) == 64  # never below one block of 64
    for d in range(64, 4097, 64):
        assert gated_d_ff(d) % 64 == 0
        assert abs(gated_d_ff(d) - 8 * d / 3) <= 32


@pytest.mark.parametrize(
    ("activation", "derivative", "torch_op"),
    [(silu, silu_derivative, F.silu), (gelu, gelu_derivative, F.gelu)],
    ids=["silu", "gelu"],
)
def test_derivatives_are_the_activation_and_its_slope(activation, derivative, torch_op) -> None:
    x = torch.linspace(-12, 12, 241, dtype=torch.float64, requires_grad=True)
    (slope,) = torch.autograd.grad(torch_op(x).sum(), x)
    value, got = derivative(x.detach())
    torch.testing.assert_close(value, torch_op(x.detach()))
    torch.testing.assert_close(got, slope)


@pytest.mark.parametrize(
    ("activation", "derivative", "torch_op"),
    [(silu, silu_derivative, F.silu), (gelu, gelu_derivative, F.gelu)],
    ids=["silu", "gelu"],
)
def test_gate_matches_autograd_through_torch(activation, derivative, torch_op) -> None:
    torch.manual_seed(0)
    a = torch.randn(3, 5, 7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 5, 7, dtype=torch.float64, requires_grad=True)
    out = gate(a, b, activation, derivative)
    expected = torch_op(a) * b
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    torch.testing.assert_close(
        torch.autograd.grad(out, (a, b), grad), torch.autograd.grad(expected, (a, b), grad)
    )
    assert torch.autograd.gradcheck(lambda a, b: gate(a, b, activation, derivative), (a, b))


def test_gate_without_a_gradient_gives_the_same_numbers_and_no_graph() -> None:
    torch.manual_seed(0)
    a = torch.randn(3, 5, 7, requires_grad=True)
    b = torch.randn(3, 5, 7, requires_grad=True)
    trained = gate(a, b, silu, silu_derivative)
    with torch.no_grad():
        plain = gate(a, b, silu, silu_derivative)
    assert trained.grad_fn is not None and plain.grad_fn is None
    assert torch.equal(plain, trained.detach())


def test_gate_keeps_only_its_two_inputs_for_backward() -> None:
    a = torch.randn(4, 6, requires_grad=True)
    b = torch.randn(4, 6, requires_grad=True)
    saved: list[int] = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.untyped_storage()._cdata) or t, lambda t: t
    ):
        gate(a, b, silu, silu_derivative)
    assert sorted(saved) == sorted([a.untyped_storage()._cdata, b.untyped_storage()._cdata])


# ------------------------------------------------------------------ large logits (issue 11)


@pytest.mark.parametrize("scale", [10.0, 30.0])
def test_sdpa_stays_finite_and_exact_for_large_logits(scale: float) -> None:
    """q and k scaled by 10 already push q·k/√d past exp's float32 range (~88): without the
    max-subtraction the softmax is inf/inf = NaN, where torch's fused attention stays finite."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 16) for _ in range(3))
    q, k = scale * q, scale * k
    keep = causal_mask(16, 16)
    out = scaled_dot_product_attention(q, k, v, mask=keep)
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected.float(), rtol=1e-4, atol=1e-4)
