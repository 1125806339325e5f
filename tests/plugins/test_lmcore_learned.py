"""pos=learned: a trained table of absolute positions added to the token embeddings."""

from __future__ import annotations

import pytest
import torch

from lmcore import SpecError, build_model, get_registry, parse_spec
from lmcore_learned import LearnedPositionalEmbedding
from tests.helpers.errors import raises_naming
from tests.helpers.plugins import (
    COUNT_SHAPES,
    assert_compile_traces_the_whole_module,
    assert_declared_counts,
    assert_logits_depend_on_positions,
    assert_model_runs_counts_and_is_causal,
)


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
    with raises_naming(
        SpecError,
        "pos 'learned'",
        "a learned table of context_length=4194305 × d_model=512 = 2,147,484,160 elements",
        "exceeds 2,147,483,648 (2**31)",
        "lower context_length to at most 4194304",
        "or use a table-free encoding such as pos=rope or pos=alibi",
    ):
        parse_spec("tinystories, pos=learned, context_length=4194305")


# Declared accounting equals the built module, at two shapes; torch.compile traces it whole.
@pytest.mark.parametrize("shape", COUNT_SHAPES)
def test_declared_params_and_flops_equal_the_module(shape: tuple[int, ...]) -> None:
    assert_declared_counts("pos", "learned", {}, shape)


def test_features_are_declared_and_compile_traces_the_whole_module() -> None:
    assert_compile_traces_the_whole_module("pos", "learned", {})


def test_model_runs_counts_its_parameters_and_is_causal() -> None:
    assert_model_runs_counts_and_is_causal("cs336-tiny, pos=learned")


def test_declared_features() -> None:
    assert get_registry().get("pos", "learned").component.features == {"absolute", "compile"}


def test_absolute_encodings_make_logits_depend_on_positions() -> None:
    assert_logits_depend_on_positions("cs336-tiny, pos=learned")
