"""lmcore.model.attention: the tiled kernel behind attn=sdpa and attn=chunked, against an independent
float64 formula (k and v repeated to q's heads, an explicit mask, torch.softmax), forward and
gradients, with tiles small enough that every shape is cut into many of them."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import lmcore.model.attention as attention
import lmcore.model.tiling as tiling
from lmcore import get_registry
from lmcore.model.attention import Plan, kept_elements, tiled_attention
from tests.helpers.compiling import GraphRecorder

MODES = {"kept weights (sdpa)": None, "key blocks of 3 (chunked)": 3, "key blocks of 8": 8}


def formula(q, k, v, causal, mask=None, bias=None):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    sq, sk = scores.shape[-2:]
    allowed = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        allowed = allowed.tril(sk - sq)  # queries aligned to the end of the keys
    if mask is not None:
        allowed = allowed & mask
    weights = torch.softmax(scores.masked_fill(~allowed, -math.inf), -1).nan_to_num(0.0)
    return weights @ v


@pytest.fixture
def small_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiles of at most 48 scores and 4 queries: batch rows, query and key blocks all split."""
    monkeypatch.setattr(tiling, "TILE_ELEMENTS", 48)
    monkeypatch.setattr(tiling, "QUERY_BLOCK", 4)


def inputs(b, h, hkv, sq, sk, d=8, dtype=torch.float64):
    torch.manual_seed(0)
    q = torch.randn(b, h, sq, d, dtype=dtype, requires_grad=True)
    k = torch.randn(b, hkv, sk, d, dtype=dtype, requires_grad=True)
    v = torch.randn(b, hkv, sk, d, dtype=dtype, requires_grad=True)
    return q, k, v


SHAPES = [  # (B, H, Hkv, Sq, Sk)
    (2, 4, 4, 13, 13),  # multi-head
    (3, 6, 2, 11, 11),  # grouped-query
    (2, 4, 1, 5, 17),  # one k/v head, fewer queries than keys (decoding with a KV cache)
    (1, 2, 2, 1, 9),  # a single query
]


@pytest.mark.usefixtures("small_tiles")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("causal", [True, False])
def test_forward_and_gradients_match_the_float64_formula(mode, shape, causal) -> None:
    b, h, hkv, sq, sk = shape
    q, k, v = inputs(b, h, hkv, sq, sk)
    out = tiled_attention(q, k, v, causal=causal, key_block=MODES[mode])
    expected = formula(q, k, v, causal)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(expected, (q, k, v), grad)
    for name, a, e in zip("qkv", got, want, strict=True):
        torch.testing.assert_close(a, e, msg=lambda m, name=name: f"d{name}: {m}")


MASKS = {
    "(Sq, Sk)": lambda b, h, sq, sk: torch.rand(sq, sk) > 0.3,
    "padding (B, 1, 1, Sk)": lambda b, h, sq, sk: torch.rand(b, 1, 1, sk) > 0.3,
    "(B, H, Sq, Sk)": lambda b, h, sq, sk: torch.rand(b, h, sq, sk) > 0.3,
    "size-1 keys (B, 1, Sq, 1)": lambda b, h, sq, sk: torch.rand(b, 1, sq, 1) > 0.2,
}
BIASES = {
    "(H, Sq, Sk)": lambda b, h, sq, sk: torch.randn(h, sq, sk, dtype=torch.float64),
    "(B, H, Sq, Sk)": lambda b, h, sq, sk: torch.randn(b, h, sq, sk, dtype=torch.float64),
    "(1, H, 1, Sk)": lambda b, h, sq, sk: torch.randn(1, h, 1, sk, dtype=torch.float64),
    "size-1 keys (H, Sq, 1)": lambda b, h, sq, sk: torch.randn(h, sq, 1, dtype=torch.float64),
}


@pytest.mark.usefixtures("small_tiles")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("mask", "bias"), list(itertools.product(MASKS, BIASES)))
def test_masks_and_a_bias_that_learns_match_the_formula(mode, mask, bias) -> None:
    b, h, hkv, sq, sk = 2, 4, 2, 6, 10
    q, k, v = inputs(b, h, hkv, sq, sk)
    m = MASKS[mask](b, h, sq, sk)
    m[..., 0, :] = False  # the first query of every row may attend nothing: zeros
    m[..., -1, -1] = True
    bias_t = BIASES[bias](b, h, sq, sk).requires_grad_()
    out = tiled_attention(q, k, v, causal=True, mask=m, bias=bias_t, key_block=MODES[mode])
    expected = formula(q, k, v, True, m, bias_t)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, bias_t), grad)
    want = torch.autograd.grad(expected, (q, k, v, bias_t), grad)
    for name, a, e in zip(("q", "k", "v", "bias"), got, want, strict=True):
        assert a.shape == e.shape, name
        torch.testing.assert_close(a, e, msg=lambda msg, name=name: f"d{name}: {msg}")


@pytest.mark.parametrize("mode", MODES)
def test_gradcheck(mode) -> None:
    """Finite differences against the hand-written backward, with a mask and a bias."""
    q, k, v = inputs(1, 4, 2, 5, 7, d=4)
    bias = torch.randn(4, 5, 7, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(5, 7) > 0.2
    mask[:, 0] = True

    def fn(q, k, v, bias):
        return tiled_attention(q, k, v, causal=True, mask=mask, bias=bias, key_block=MODES[mode])

    assert torch.autograd.gradcheck(fn, (q, k, v, bias))


@pytest.mark.parametrize("mode", MODES)
def test_rows_with_every_key_masked_are_zeros_with_zero_gradients(mode) -> None:
    q, k, v = inputs(1, 2, 2, 4, 6)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1] = False
    out = tiled_attention(q, k, v, causal=False, mask=mask, key_block=MODES[mode])
    assert bool((out[:, :, 1] == 0).all()) and bool(torch.isfinite(out).all())
    out.sum().backward()
    assert q.grad is not None and bool((q.grad[:, :, 1] == 0).all())
    assert all(bool(torch.isfinite(t.grad).all()) for t in (q, k, v) if t.grad is not None)


@pytest.mark.parametrize("mode", MODES)
def test_extreme_scores_stay_exact_and_future_keys_get_no_gradient(mode) -> None:
    """Scores 1000s apart: exp's floor must not change the result, and keys ahead of every
    query (causal) must get exactly zero gradient."""
    q, k, v = inputs(1, 2, 2, 6, 6)
    with torch.no_grad():
        q.mul_(300.0)
    out = tiled_attention(q, k, v, causal=True, key_block=MODES[mode])
    torch.testing.assert_close(out, formula(q, k, v, True))
    (dk,) = torch.autograd.grad(out[:, :, :3].sum(), k)
    assert bool((dk[:, :, 3:] == 0).all())  # queries 0..2 never see keys 3..5


@pytest.mark.parametrize("mode", MODES)
def test_bfloat16_in_bfloat16_out_close_to_float32(mode) -> None:
    q, k, v = (t.detach().to(torch.bfloat16).requires_grad_() for t in inputs(2, 4, 2, 9, 9))
    out = tiled_attention(q, k, v, causal=True, key_block=MODES[mode])
    assert out.dtype == torch.bfloat16
    expected = formula(q.double(), k.double(), v.double(), True)
    torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=2e-2)
    out.float().square().sum().backward()
    assert all(t.grad is not None and t.grad.dtype == torch.bfloat16 for t in (q, k, v))


def test_strided_inputs_are_read_in_place_and_give_the_same_result() -> None:
    """q, k, v as the model makes them: (B, H, T, D) views of (B, T, H·D) projections."""
    torch.manual_seed(0)
    proj = [torch.randn(2, 10, 4 * 8, dtype=torch.float64) for _ in range(3)]
    q, k, v = (p.view(2, 10, 4, 8).transpose(1, 2) for p in proj)
    for mode in MODES.values():
        out = tiled_attention(q, k, v, causal=True, key_block=mode)
        torch.testing.assert_close(out, formula(q, k, v, True))


@pytest.mark.parametrize("mode", MODES)
def test_flops_are_counted_over_the_whole_score_matrix_as_torch_counts_its_own(mode) -> None:
    q, k, v = (t.detach().float() for t in inputs(2, 4, 2, 8, 12))
    with FlopCounterMode(display=False) as counter:
        tiled_attention(q, k, v, causal=True, key_block=MODES[mode])
    assert counter.get_total_flops() == 4 * 2 * 4 * 8 * 12 * 8


@pytest.mark.usefixtures("small_tiles")
@pytest.mark.parametrize("key_block", [0, 3])
@pytest.mark.parametrize(("sq", "sk", "causal"), [(9, 9, True), (4, 9, True), (9, 9, False)])
def test_the_plan_covers_every_score_a_query_may_see_once(key_block, sq, sk, causal) -> None:
    plan = Plan(3, 4, 2, sq, sk, 8, causal, key_block)
    seen = torch.zeros(3, sq, sk, dtype=torch.int64)
    for (b0, b1), (i0, i1, kbeg, kend) in itertools.product(
        plan.batch_blocks(), plan.query_blocks()
    ):
        for j0, j1 in plan.key_blocks(kbeg, kend):
            seen[b0:b1, i0:i1, j0:j1] += 1
    allowed = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq) if causal else True
    assert bool((seen[:, allowed] == 1).all())  # every allowed score exactly once
    if causal and sq > plan.query_block:  # keys ahead of a whole query block are skipped
        assert int(seen.sum()) < 3 * sq * sk
    kept = kept_elements(plan)
    assert kept == (plan.heads * int(seen.sum()) if key_block == 0 else 0)


def test_compiles_as_one_graph_with_its_backward() -> None:
    q, k, v = inputs(2, 4, 2, 9, 9, dtype=torch.float32)

    def fn(q, k, v):
        return tiled_attention(q, k, v, causal=True).square().sum()

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    want = torch.autograd.grad(fn(q, k, v), (q, k, v))
    got = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    torch.testing.assert_close(got, want)


def test_runs_on_the_meta_device() -> None:
    q, k, v = (torch.empty(2, 4, 9, 8, device="meta", requires_grad=True) for _ in range(3))
    out = tiled_attention(q, k, v, causal=True)
    assert out.shape == (2, 4, 9, 8) and out.device.type == "meta"
    out.sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape


def test_inference_streams_keys_and_gives_the_same_result() -> None:
    """Without autograd nothing is kept: the kept-weights mode streams keys in blocks (linear
    memory) and must agree with what it computes for training."""
    q, k, v = inputs(2, 4, 2, 40, 40)
    with torch.no_grad():
        streamed = tiled_attention(q, k, v, causal=True)
    torch.testing.assert_close(streamed, tiled_attention(q, k, v, causal=True))
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention, "STREAM_BLOCK", 7)  # several key blocks at this length
        torch.testing.assert_close(tiled_attention(q, k, v, causal=True), formula(q, k, v, True))


@pytest.mark.parametrize(
    ("shape", "one_tile"),
    [((1, 4, 2, 1, 3 * attention.STREAM_BLOCK), True), ((1, 4, 2, 200, 600), False)],
    ids=["a decoding step's query against a long cache", "a long prefill"],
)
def test_inference_is_one_tile_whenever_the_scores_fit_one_whatever_the_keys(
    monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...], one_tile: bool
) -> None:
    """Past STREAM_BLOCK keys, a call whose scores fit one tile (1 × 4 heads × 1,536 keys) runs
    as one, never the key-block walk; one that does not (4 × 200 × 600 scores) streams."""
    walked: list[int] = []
    walk = attention._attend
    monkeypatch.setattr(attention, "_attend", lambda *a, **kw: walked.append(1) or walk(*a, **kw))
    q, k, v = (t.detach() for t in inputs(*shape))
    with torch.no_grad():
        out = tiled_attention(q, k, v, causal=True)
    assert bool(walked) is not one_tile
    torch.testing.assert_close(out, formula(q, k, v, True))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("dtype", "exact", "underflow"),
    [(torch.float64, [0.0, -100.0, -300.0, -700.0], -750.0), (torch.float32, [0.0, -50.0, -86.0, -87.0], -100.0)],
    ids=["float64", "float32"],
)  # fmt: skip
def test_weights_far_below_the_max_are_exact_down_to_the_smallest_normal(
    mode, dtype, exact, underflow
) -> None:
    """exp's floor (a speed-up: exp is slow where its result is subnormal) sits at the log of
    the smallest normal number of the dtype the weights are computed in: a weight above it is
    exact to relative precision, in float64 too; one below it is off by less than twice that
    number.
    With v the identity, the output row is the attention weights themselves, and dv is the
    weights times dout."""
    scores = [*exact, underflow]
    d = len(scores)
    q = torch.zeros(1, 1, 1, d, dtype=dtype)
    q[..., 0] = math.sqrt(d)  # q·k / sqrt(D) = k[0]
    k = torch.zeros(1, 1, d, d, dtype=dtype)
    k[0, 0, :, 0] = torch.tensor(scores, dtype=dtype)
    v = torch.eye(d, dtype=dtype)[None, None].requires_grad_()
    out = tiled_attention(q, k, v, causal=False, key_block=MODES[mode])
    expected = torch.softmax(torch.tensor(scores, dtype=torch.float64), -1).to(dtype)
    n, tiny = len(exact), torch.finfo(dtype).tiny
    torch.testing.assert_close(
        out[0, 0, 0, :n], expected[:n], rtol=4 * torch.finfo(dtype).eps, atol=0
    )
    assert 0 <= out.detach()[0, 0, 0, n].item() < 2 * tiny
    (dv,) = torch.autograd.grad(out, v, torch.ones_like(out))
    torch.testing.assert_close(
        dv[0, 0, :n, 0], expected[:n], rtol=4 * torch.finfo(dtype).eps, atol=0
    )
    assert 0 <= float(dv[0, 0, n, 0]) < 2 * tiny


@pytest.mark.parametrize("tiles", ["one tile", "small tiles"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("masked", [False, True], ids=["plain", "mask and bias"])
def test_inference_in_one_tile_or_many_matches_the_formula(
    monkeypatch: pytest.MonkeyPatch, tiles, shape, causal, masked
) -> None:
    """Without autograd, a call that fits one tile skips the tiling (a decoding step's path);
    both paths give the formula's result, with a mask, a bias and a row whose keys are all
    masked (zeros)."""
    if tiles == "small tiles":
        monkeypatch.setattr(tiling, "TILE_ELEMENTS", 48)
        monkeypatch.setattr(tiling, "QUERY_BLOCK", 4)
        monkeypatch.setattr(attention, "STREAM_BLOCK", 3)
    b, h, hkv, sq, sk = shape
    q, k, v = (t.detach() for t in inputs(*shape))
    mask = bias = None
    if masked:
        gen = torch.Generator().manual_seed(1)
        mask = torch.rand(b, 1, sq, sk, generator=gen) > 0.3
        mask[:, :, 0] = False  # the first query of every row may attend nothing
        bias = torch.randn(h, sq, sk, dtype=torch.float64, generator=gen)
    plan = Plan(b, h, hkv, sq, sk, q.shape[-1], causal, attention.STREAM_BLOCK)
    assert plan.whole == (tiles == "one tile")
    with torch.no_grad():
        out = tiled_attention(q, k, v, causal=causal, mask=mask, bias=bias)
    torch.testing.assert_close(out, formula(q, k, v, causal, mask, bias))
    if masked:
        assert bool((out[:, :, 0] == 0).all())


@pytest.mark.parametrize("mode", MODES)
def test_inference_gives_what_training_computes(mode) -> None:
    """The gradient-free paths (one tile, or the tiling called directly) agree with the
    operator autograd records, for every kernel mode, GQA and a decoding step's shapes."""
    for shape in [(2, 4, 2, 9, 9), (3, 4, 1, 1, 12)]:
        q, k, v = inputs(*shape, dtype=torch.float32)
        trained = tiled_attention(q, k, v, causal=True, key_block=MODES[mode])
        assert trained.grad_fn is not None
        with torch.no_grad():
            inferred = tiled_attention(q, k, v, causal=True, key_block=MODES[mode])
        assert inferred.grad_fn is None
        torch.testing.assert_close(inferred, trained.detach(), rtol=1e-6, atol=1e-6)


# ------------------------------------------------- the query scale, soft-capping, the window


def formula_with(q, k, v, causal, scale=None, softcap=None, window=None, bias=None):
    """Gemma 2's eager attention (scores times the scale, then cap·tanh(s / cap)), with
    transformers' sliding window (key j visible from the query at position p iff j > p - w),
    in float64 and written out."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-1, -2) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias
    sq, sk = scores.shape[-2:]
    position = torch.arange(sq)[:, None] + sk - sq
    allowed = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        allowed &= torch.arange(sk)[None, :] <= position
    if window:
        allowed &= torch.arange(sk)[None, :] > position - window
    return torch.softmax(scores.masked_fill(~allowed, -math.inf), -1).nan_to_num(0.0) @ v


OPTIONS = {
    "scale 0.7": {"scale": 0.7},
    "softcap 2": {"softcap": 2.0},
    "window 1": {"window": 1},
    "window 3": {"window": 3},
    "window 6, softcap 1.5, scale 0.2": {"window": 6, "softcap": 1.5, "scale": 0.2},
}


@pytest.mark.usefixtures("small_tiles")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", SHAPES[:3], ids=str)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("option", OPTIONS)
def test_the_options_match_their_formula_forward_and_backward(mode, shape, causal, option) -> None:
    b, h, hkv, sq, sk = shape
    q, k, v = inputs(b, h, hkv, sq, sk)
    q2 = (3 * q.detach()).requires_grad_()  # scores large enough for the cap to bite
    bias = torch.randn(h, sq, sk, dtype=torch.float64, requires_grad=True)
    kw = OPTIONS[option]
    out = tiled_attention(q2, k, v, causal=causal, key_block=MODES[mode], bias=bias, **kw)
    expected = formula_with(q2, k, v, causal, bias=bias, **kw)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q2, k, v, bias), grad)
    want = torch.autograd.grad(expected, (q2, k, v, bias), grad)
    for name, a, e in zip(("q", "k", "v", "bias"), got, want, strict=True):
        torch.testing.assert_close(a, e, msg=lambda m, name=name: f"d{name}: {m}")


@pytest.mark.usefixtures("small_tiles")
@pytest.mark.parametrize("option", OPTIONS)
def test_the_options_without_a_gradient_match_their_formula(option) -> None:
    """Inference streams its keys, and a one-tile call (a decoding step) takes a short path."""
    for b, h, hkv, sq, sk in (*SHAPES, (1, 2, 1, 1, 3)):
        q, k, v = (t.detach() for t in inputs(b, h, hkv, sq, sk))
        for causal in (True, False):
            out = tiled_attention(q, k, v, causal=causal, **OPTIONS[option])
            torch.testing.assert_close(out, formula_with(q, k, v, causal, **OPTIONS[option]))


def test_the_defaults_are_exactly_the_call_without_options() -> None:
    q, k, v = inputs(2, 4, 2, 9, 9, dtype=torch.float32)
    for key_block in (None, 3):
        plain = tiled_attention(q, k, v, causal=True, key_block=key_block)
        written = tiled_attention(
            q, k, v, causal=True, key_block=key_block, scale=1 / math.sqrt(8), softcap=0.0,
            window=0,
        )  # fmt: skip
        assert torch.equal(plain, written)


@pytest.mark.usefixtures("small_tiles")
@pytest.mark.parametrize(("sq", "sk"), [(9, 9), (4, 9), (13, 13), (1, 7)])
@pytest.mark.parametrize("window", [1, 2, 3, 5, 20])
def test_a_window_keeps_only_the_weights_inside_it_and_counts_them(sq, sk, window) -> None:
    plan = Plan(3, 4, 2, sq, sk, 8, True, 0, window)
    seen = torch.zeros(3, sq, sk, dtype=torch.int64)
    for (b0, b1), (i0, i1, kbeg, kend) in itertools.product(
        plan.batch_blocks(), plan.query_blocks()
    ):
        for j0, j1 in plan.key_blocks(kbeg, kend):
            seen[b0:b1, i0:i1, j0:j1] += 1
    position = torch.arange(sq)[:, None] + sk - sq
    allowed = (torch.arange(sk)[None, :] <= position) & (torch.arange(sk) > position - window)
    assert bool((seen[:, allowed] == 1).all())  # every score in the window, once
    assert kept_elements(plan) == plan.heads * int(seen.sum())
    assert kept_elements(plan) == sum(a * b * c for a, b, c in plan.kept_shapes())


# ------------------------------------------------------ every kernel, large logits (issue 11)


@pytest.mark.parametrize("name", [e.name for e in get_registry().entries("attn")])
def test_every_attention_kernel_is_stable_for_large_logits(name: str) -> None:
    torch.manual_seed(0)
    entry = get_registry().get("attn", name)
    grouped = "gqa" in entry.component.features
    kernel = entry.component.create(num_heads=4, num_kv_heads=2 if grouped else 4, head_dim=16)
    q = 30.0 * torch.randn(2, 4, 12, 16)
    k, v = 30.0 * torch.randn(2, 2, 12, 16), torch.randn(2, 2, 12, 16)
    if not grouped:
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    with torch.no_grad():
        out = kernel(q, k, v, causal=True)
    expected = F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), is_causal=True, enable_gqa=grouped
    )
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("sk", [3, 40, 400])
def test_a_decoding_step_on_either_side_of_the_serial_size_gives_the_formula(sk) -> None:
    """One query per head against a cache, in a view of a larger buffer as the cache holds it:
    below SERIAL_ELEMENTS multiplications the products are broadcast sums, above them bmm."""
    from lmcore.model.attention import SERIAL_ELEMENTS

    torch.manual_seed(0)
    q = torch.randn(1, 6, 1, 16, dtype=torch.float64)
    buffer = torch.randn(2, 1, 2, 512, 16, dtype=torch.float64)
    k, v = buffer[0, :, :, :sk], buffer[1, :, :, :sk]
    assert (q.numel() * sk < SERIAL_ELEMENTS) == (sk < 400)
    with torch.no_grad():
        out = tiled_attention(q, k, v, causal=True)
        keep = torch.ones(1, 1, 1, sk, dtype=torch.bool)
        masked = tiled_attention(q, k, v, causal=True, mask=keep)
    torch.testing.assert_close(out, formula(q, k, v, True))
    torch.testing.assert_close(masked, out)


def test_a_traced_decoding_step_is_multiply_and_sum_at_any_cache_length(
    traced: GraphRecorder,
) -> None:
    """Under torch.compile a decoding step's products are broadcast multiply-and-sum (which
    inductor fuses) even past SERIAL_ELEMENTS, where eager calls bmm; more queries keep bmm."""
    torch.manual_seed(0)
    buffer = torch.randn(2, 1, 2, 512, 16)
    k, v = buffer[0, :, :, :400], buffer[1, :, :, :400]

    def step(q: torch.Tensor) -> torch.Tensor:
        return tiled_attention(q, k, v, causal=True)

    qs = [torch.randn(1, 6, 1, 16), torch.randn(1, 6, 3, 16)]
    with torch.no_grad():
        compiled = torch.compile(step, backend=traced, fullgraph=True)
        outs = [compiled(q) for q in qs]
    bmms = [sum("bmm" in str(n.target) for n in gm.graph.nodes) for gm in traced.graphs]
    assert bmms == [0, 2]
    for q, out in zip(qs, outs, strict=True):
        expected = formula(q.double(), k.double(), v.double(), True).float()
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
