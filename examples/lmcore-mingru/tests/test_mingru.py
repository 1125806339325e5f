"""Unit tests of minGRU's maths and wiring; the contract tests come from `--lmcore-conformance`
(see addopts in pyproject.toml)."""

from __future__ import annotations

import pytest
import torch

import lmcore
from lmcore.interfaces import LayerContext
from lmcore.model.cache import LayerCache, RecurrentState
from lmcore.model.generate import GREEDY
from lmcore_mingru import MinGRU, linear_scan, params, scan_steps, state


def per_token(mixer: MinGRU, x: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
    """minGRU as the paper writes it, one token at a time, in float64."""
    w_z, w_h = mixer.in_proj.weight.double().chunk(2, dim=0)
    w_o = mixer.out_proj.weight.double()
    x = x.double()
    h = torch.zeros(x.shape[0], mixer.width, dtype=torch.float64) if h is None else h.double()
    ys = []
    for t in range(x.shape[1]):
        z = 1 / (1 + torch.exp(-(x[:, t] @ w_z.T)))
        h = (1 - z) * h + z * (x[:, t] @ w_h.T)
        ys.append(h @ w_o.T)
    return torch.stack(ys, dim=1)


def test_the_parallel_forward_is_the_per_token_recurrence() -> None:
    torch.manual_seed(0)
    mixer = MinGRU(d_model=8, expand=2, dtype=torch.float64)
    x = torch.randn(3, 37, 8, dtype=torch.float64)  # 37: not a power of two
    with torch.no_grad():
        got = mixer(x, LayerContext())
    torch.testing.assert_close(got, per_token(mixer, x), atol=1e-12, rtol=1e-12)


def test_float32_stays_finite_and_close_over_a_long_sequence_of_closed_and_open_gates() -> None:
    torch.manual_seed(1)
    mixer = MinGRU(d_model=8)
    with torch.no_grad():
        mixer.in_proj.weight.mul_(30.0)  # gates saturate: z ~ 0 (the state kept) or ~ 1
    x = torch.randn(2, 1024, 8)
    with torch.no_grad():
        got = mixer(x, LayerContext())
    expected = per_token(mixer, x)
    assert bool(torch.isfinite(got).all())
    torch.testing.assert_close(got.double(), expected, atol=1e-3, rtol=1e-4)


def test_the_scan_takes_ceil_log2_steps_and_composes_the_gates() -> None:
    assert [scan_steps(t) for t in (0, 1, 2, 3, 4, 5, 8, 9, 1024)] == [0, 0, 1, 2, 2, 3, 3, 4, 10]
    a = torch.tensor([[[0.5], [0.25], [2.0]]], dtype=torch.float64)
    b = torch.tensor([[[1.0], [3.0], [-1.0]]], dtype=torch.float64)
    decay, h = linear_scan(a, b)
    # h1 = 1; h2 = 0.25·1 + 3 = 3.25; h3 = 2·3.25 − 1 = 5.5; decays 0.5, 0.125, 0.25.
    assert decay.flatten().tolist() == [0.5, 0.125, 0.25]
    assert h.flatten().tolist() == [1.0, 3.25, 5.5]


def test_a_prefill_continues_from_the_state_it_is_given() -> None:
    torch.manual_seed(2)
    mixer = MinGRU(d_model=8, dtype=torch.float64)
    x = torch.randn(2, 12, 8, dtype=torch.float64)
    state = mixer.decoding_state(batch=2, context_length=16, dtype=torch.float64)
    assert isinstance(state, RecurrentState) and state["h"].shape == (2, 8)
    with torch.no_grad():
        first = mixer(x[:, :7], LayerContext(cache=LayerCache(state, 0)))
        after = state["h"].clone()
        rest = mixer(x[:, 7:], LayerContext(cache=LayerCache(state, 7)))
    torch.testing.assert_close(after, _hidden(mixer, x[:, :7]), atol=1e-12, rtol=1e-12)
    got = torch.cat([first, rest], dim=1)
    torch.testing.assert_close(got, per_token(mixer, x), atol=1e-12, rtol=1e-12)


def _hidden(mixer: MinGRU, x: torch.Tensor) -> torch.Tensor:
    """h after the tokens of `x`, by the per-token recurrence (out_proj left out)."""
    w_z, w_h = mixer.in_proj.weight.double().chunk(2, dim=0)
    h = torch.zeros(x.shape[0], mixer.width, dtype=torch.float64)
    for t in range(x.shape[1]):
        z = 1 / (1 + torch.exp(-(x[:, t].double() @ w_z.T)))
        h = (1 - z) * h + z * (x[:, t].double() @ w_h.T)
    return h


def test_a_left_pad_leaves_the_state_as_a_fresh_sequence_has_it() -> None:
    torch.manual_seed(3)
    mixer = MinGRU(d_model=8, dtype=torch.float64)
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    valid = torch.tensor([[False, False, False, True, True, True]])
    state = mixer.decoding_state(batch=1, context_length=8, dtype=torch.float64)
    state["h"].fill_(7.0)  # what an earlier sequence left: start=0 ignores it
    with torch.no_grad():
        got = mixer(x, LayerContext(cache=LayerCache(state, 0, valid)))
    torch.testing.assert_close(got[:, 3:], per_token(mixer, x[:, 3:]), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(state["h"], _hidden(mixer, x[:, 3:]), atol=1e-12, rtol=1e-12)


def test_greedy_generation_with_the_cache_is_generation_by_recomputing() -> None:
    torch.manual_seed(4)
    spec = "cs336-tiny, vocab_size=256, mixer=mingru(expand=2), mixer[1]=attention"
    model = lmcore.build_model(spec)
    prompt = torch.randint(0, 256, (2, 5))
    cached = model.generate(prompt, 8, GREEDY)  # the 8 new tokens
    plain = model.generate(prompt, 8, GREEDY, cache=False)
    assert cached.shape == (2, 8) and torch.equal(cached, plain)


def test_the_forward_compiles_as_one_graph_for_a_prefill_and_a_step() -> None:
    torch.manual_seed(5)
    mixer = MinGRU(d_model=8)
    x = torch.randn(2, 9, 8)
    state = mixer.decoding_state(batch=2, context_length=16)
    torch.compiler.reset()
    compiled = torch.compile(mixer, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        eager = mixer(x, LayerContext())
        prefill = compiled(x[:, :8], LayerContext(cache=LayerCache(state, 0)))
        step = compiled(x[:, 8:], LayerContext(cache=LayerCache(state, 8)))
    torch.compiler.reset()
    torch.testing.assert_close(torch.cat([prefill, step], 1), eager, atol=1e-5, rtol=1e-5)


def test_the_weights_are_three_projections_and_the_state_one_float32_vector() -> None:
    mixer = MinGRU(d_model=16, expand=3, dtype=torch.bfloat16)
    shapes = {k: tuple(v.shape) for k, v in mixer.state_dict().items()}
    assert shapes == {"in_proj.weight": (96, 16), "out_proj.weight": (16, 48)}
    assert params(d_model=16, expand=3) == 96 * 16 + 16 * 48
    made = mixer.decoding_state(batch=1, context_length=8, dtype=torch.bfloat16)
    assert made["h"].dtype == torch.float32 and made["h"].shape == (1, 48)
    assert state(d_model=16, expand=3, dtype=torch.bfloat16) == (0, 48 * 4)


def test_installed_plugin_is_found_through_its_entry_point() -> None:
    entry = lmcore.get_registry().get("mixer", "mingru")
    assert entry.provenance.dist == "lmcore-mingru"
    assert entry.provenance.module == "lmcore_mingru"


def test_a_bad_argument_is_rejected_before_any_weight_exists() -> None:
    with pytest.raises(lmcore.SpecError, match=r"expand.*must be >= 1, got 0"):
        lmcore.parse_spec("cs336-tiny, mixer=mingru(expand=0)")
