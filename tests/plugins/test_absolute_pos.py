"""pos=learned and pos=sinusoidal: absolute encodings added to the token embeddings."""

from __future__ import annotations

import math

import pytest
import torch

from lmcore import SpecError, build_model, parse_spec
from lmcore_learned import LearnedPositionalEmbedding
from lmcore_sinusoidal import SinusoidalPositionalEncoding


def _sinusoid_table(length: int, d: int, base: float) -> torch.Tensor:
    """Vaswani et al. §3.5 written out element by element."""
    table = torch.empty(length, d, dtype=torch.float64)
    for p in range(length):
        for i in range(d // 2):
            angle = p / base ** (2 * i / d)
            table[p, 2 * i] = math.sin(angle)
            table[p, 2 * i + 1] = math.cos(angle)
    return table


@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_sinusoidal_table_is_vaswanis(base: float) -> None:
    enc = SinusoidalPositionalEncoding(d_model=12, context_length=20, base=base)
    expected = _sinusoid_table(20, 12, base)
    torch.testing.assert_close(enc.table.double(), expected, atol=2e-6, rtol=0)


def test_sinusoidal_embed_adds_the_rows_at_the_given_positions() -> None:
    torch.manual_seed(0)
    enc = SinusoidalPositionalEncoding(d_model=8, context_length=16)
    x = torch.randn(2, 3, 8)
    positions = torch.tensor([[0, 1, 2], [7, 9, 15]])
    expected = x.double() + _sinusoid_table(16, 8, 10000.0)[positions]
    torch.testing.assert_close(enc.embed(x, positions).double(), expected, atol=1e-6, rtol=0)
    # (1, T) positions broadcast over the batch, as the model passes them.
    out = enc.embed(x, torch.tensor([[4, 5, 6]]))
    torch.testing.assert_close(out[1], x[1] + enc.table[4:7])


def test_sinusoidal_table_is_a_non_persistent_buffer_and_dtype_follows_x() -> None:
    enc = SinusoidalPositionalEncoding(d_model=8, context_length=16)
    assert enc.state_dict() == {} and [n for n, _ in enc.named_buffers()] == ["table"]
    x = torch.randn(1, 4, 8).to(torch.bfloat16)
    assert enc.embed(x, torch.arange(4)[None]).dtype == torch.bfloat16


def test_sinusoidal_refuses_an_odd_d_model() -> None:
    with pytest.raises(
        SpecError,
        match=r"pos 'sinusoidal': sinusoidal encodings fill \(sin, cos\) pairs, but d_model=63 is odd; use an even d_model, or pos=learned",
    ):
        parse_spec("cs336-tiny, d_model=63, num_heads=3, pos=sinusoidal")
    with pytest.raises(ValueError, match=r"d_model=7 is odd"):
        SinusoidalPositionalEncoding(d_model=7, context_length=4)


def test_learned_table_shape_init_and_key() -> None:
    torch.manual_seed(0)
    enc = LearnedPositionalEmbedding(context_length=256, d_model=512)
    assert {k: tuple(v.shape) for k, v in enc.state_dict().items()} == {"weight": (256, 512)}
    w = enc.weight.detach()
    # Truncated N(0, 1) on [-3, 3] like the token embeddings: std = 0.9866 after truncation.
    assert w.abs().max() <= 3.0
    assert abs(w.mean().item()) < 0.01 and abs(w.std().item() - 0.9866) < 0.01


def test_learned_embed_adds_the_rows_at_the_given_positions() -> None:
    torch.manual_seed(0)
    enc = LearnedPositionalEmbedding(context_length=16, d_model=8)
    x = torch.randn(2, 3, 8)
    positions = torch.tensor([[0, 1, 2], [7, 9, 15]])
    expected = torch.stack([x[b] + enc.weight[positions[b]] for b in range(2)])
    torch.testing.assert_close(enc.embed(x, positions), expected)


def test_learned_in_the_model_is_pos_weight_and_trains() -> None:
    model = build_model("cs336-tiny, pos=learned")
    assert tuple(model.state_dict()["pos.weight"].shape) == (16, 64)
    model(torch.randint(0, 10000, (2, 16))).sum().backward()
    grad = model.pos.weight.grad
    assert grad is not None and bool((grad.abs().sum(-1) > 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_learned_parameters_follow_the_requested_dtype(dtype: torch.dtype) -> None:
    enc = LearnedPositionalEmbedding(context_length=4, d_model=8, dtype=dtype)
    assert enc.weight.dtype == dtype
    assert enc.embed(torch.zeros(1, 4, 8, dtype=dtype), torch.arange(4)[None]).dtype == dtype


def test_learned_refuses_a_table_too_large_to_allocate() -> None:
    # 4_194_304 × 512 = 2**31 exactly is allowed (parse_spec allocates nothing) ...
    assert parse_spec("tinystories, pos=learned, context_length=4194304").context_length == 4194304
    # ... one more position is not.
    with pytest.raises(
        SpecError,
        match=r"pos 'learned': a learned table of context_length=4194305 × d_model=512 = "
        r"2,147,484,160 elements exceeds 2,147,483,648 \(2\*\*31\); lower context_length to at "
        r"most 4194304, or use a table-free encoding such as pos=rope or pos=alibi",
    ):
        parse_spec("tinystories, pos=learned, context_length=4194305")


@pytest.mark.parametrize("name", ["learned", "sinusoidal"])
def test_absolute_encodings_make_logits_depend_on_positions(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(f"cs336-tiny, pos={name}")
    ids = torch.randint(0, 10000, (1, 8))
    a = model(ids, torch.arange(8)[None])
    b = model(ids, torch.arange(8)[None] + 5)
    assert not torch.allclose(a, b, atol=1e-3)
