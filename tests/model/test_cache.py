"""The KV cache (`lmcore.model.cache.KVCache`): sized to what it is asked to hold, written in
place while it has room, grown in doubling chunks (never beyond the context) when more
follows, and a forward with a cache refusing what does not fit the context."""

from __future__ import annotations

import pytest
import torch

from lmcore.errors import ModelInputError
from lmcore.model.cache import KVCache
from tests.helpers.errors import raises_naming
from tests.helpers.models import decoding_model


def test_the_cache_is_preallocated_and_written_in_place() -> None:
    model = decoding_model("num_kv_heads=2")
    kv = KVCache.for_model(model, 2, 24)
    assert len(kv.k) == len(kv.v) == 2  # a key and a value tensor per layer
    assert all(t.shape == (2, 2, 24, 8) for t in kv.k + kv.v)
    assert all(t.dtype == model.lm_head.weight.dtype for t in kv.k + kv.v)
    storage = [t.data_ptr() for t in kv.k + kv.v]
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        full = model(ids)
        parts = [model(ids[:, :4], cache=kv), model(ids[:, 4:6], cache=kv)]
        parts += [model(ids[:, i : i + 1], cache=kv) for i in range(6, 9)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)
    assert kv.length == 9 and [t.data_ptr() for t in kv.k + kv.v] == storage
    kv.reset()
    assert kv.length == 0


def test_forward_with_a_cache_refuses_what_does_not_fit() -> None:
    model = decoding_model("")
    kv = KVCache.for_model(model, 2)
    with pytest.raises(
        ModelInputError, match=r"token ids of shape \(3, 4\) do not fit a KV cache of batch 2"
    ):
        model(torch.zeros(3, 4, dtype=torch.long), cache=kv)
    model(torch.zeros(2, 20, dtype=torch.long), cache=kv)
    with raises_naming(
        ModelInputError, "the KV cache holds 20 tokens", "5 more make 25", "context_length=24"
    ):
        model(torch.zeros(2, 5, dtype=torch.long), cache=kv)
    with pytest.raises(
        ModelInputError, match=r"pad\(\) marks the slots of a prompt before its forward"
    ):
        kv.pad(torch.ones(2, 3, dtype=torch.bool))


HYBRID = "mixer=short_conv, mixer[1]=attention, num_kv_heads=2"


def test_each_layer_keeps_the_state_its_mixer_declares() -> None:
    from lmcore.model.cache import KVState, RecurrentState
    from lmcore.model.counting import account

    model = decoding_model(HYBRID)
    kv = KVCache.for_model(model, 3, 24)
    assert [type(s) for s in kv.states] == [RecurrentState, KVState]
    assert kv.names == ["short_conv", "attention"]
    assert tuple(kv.states[0]["conv"].shape) == (3, 32, 2)  # d_model channels, conv_size - 1
    assert tuple(kv.states[1].k.shape) == (3, 2, 24, 8)
    # what describe declares for a batch of 3 at the whole context, plus the positions
    declared = account(model.blueprint).state_bytes(batch=3)
    conv, keys_values = 32 * 2 * 4, 24 * 2 * 2 * 8 * 4  # float32: a tail; 24 slots of k and v
    assert declared == 3 * (conv + keys_values)
    assert kv.nbytes() == declared + kv.positions.nbytes


def test_a_state_that_cannot_go_back_refuses_truncate_by_name() -> None:
    model = decoding_model(HYBRID)
    kv = KVCache.for_model(model, 1)
    with torch.no_grad():
        model(torch.randint(0, 97, (1, 6)), cache=kv)
    assert kv.can_truncate(6) and kv.can_truncate(0) and not kv.can_truncate(4)
    kv.truncate(6)  # nothing to take back
    with raises_naming(
        ModelInputError, "truncate(4)", "layer 0's mixer 'short_conv'", "all 6 tokens",
        "truncate(0) (or reset())",
    ):
        kv.truncate(4)
    assert kv.length == 6
    kv.truncate(0)
    assert kv.length == 0
    attention_only = KVCache.for_model(decoding_model(""), 1)
    with torch.no_grad():
        decoding_model("")(torch.randint(0, 97, (1, 6)), cache=attention_only)
    attention_only.truncate(4)  # keys and values can: the slots after it are forgotten
    assert attention_only.length == 4


def test_select_copies_every_layers_state_by_row() -> None:
    model = decoding_model(HYBRID)
    ids = torch.randint(0, 97, (2, 7))
    kv = KVCache.for_model(model, 2)
    with torch.no_grad():
        model(ids[:, :5], cache=kv)
        fork = kv.select(torch.tensor([1, 1, 0]))
        got = model(ids[[1, 1, 0], 5:], cache=fork)
        full = model(ids)
    torch.testing.assert_close(got, full[[1, 1, 0], 5:], rtol=1e-5, atol=1e-5)
    assert fork.states[0]["conv"].data_ptr() != kv.states[0]["conv"].data_ptr()


def test_a_fresh_sequence_ignores_what_a_state_held_before() -> None:
    model = decoding_model(HYBRID)
    ids = torch.randint(0, 97, (1, 8))
    kv = KVCache.for_model(model, 1)
    with torch.no_grad():
        model(torch.randint(0, 97, (1, 8)), cache=kv)  # another sequence first
        kv.reset()
        got = torch.cat([model(ids[:, :3], cache=kv), model(ids[:, 3:], cache=kv)], dim=1)
        torch.testing.assert_close(got, model(ids), rtol=1e-5, atol=1e-5)


def test_a_compound_state_selects_truncates_and_views_by_part() -> None:
    from lmcore.model.cache import CompoundState, KVState, LayerCache, RecurrentState

    kv = KVState.empty(batch=3, num_kv_heads=1, head_dim=2, context_length=5)
    rec = RecurrentState({"h": torch.arange(6.0).reshape(3, 2)})
    both = CompoundState({"attn": kv, "ssm": rec})
    assert not both.rewind and CompoundState({"attn": kv}).rewind
    assert set(both.tensors()) == {"attn.k", "attn.v", "ssm.h"}
    picked = both.select(torch.tensor([2, 0]))
    assert torch.equal(picked["ssm"].tensors()["h"], torch.tensor([[4.0, 5.0], [0.0, 1.0]]))
    assert picked["attn"].tensors()["k"].shape == (2, 1, 5, 2)
    valid = torch.ones(3, 1, dtype=torch.bool)
    view = LayerCache(both, 4, valid).part("ssm")
    assert view.state is rec and view.start == 4 and view.valid is valid
    cache = KVCache([both], batch=3, context_length=5, names=["hybrid"])
    cache.length = 3
    assert not cache.can_truncate(1)
    with raises_naming(ModelInputError, "truncate(1)", "layer 0's mixer 'hybrid'"):
        cache.truncate(1)


def test_generate_sizes_the_cache_to_its_request() -> None:
    from lmcore.model.generate import GREEDY

    model = decoding_model("num_kv_heads=2")
    kv = KVCache.for_model(model, 1, chunk=1)  # nothing allocated until asked
    assert kv.capacity == 0 and kv.nbytes() == 0
    prompt = torch.randint(0, 97, (5,))
    list(model.stream(prompt, 7, GREEDY, kv_cache=kv))
    # 5 prompt tokens and 7 new ones, the last never fed back: 11 slots, one allocation
    assert kv.capacity == 11 and kv.grown == 1 and kv.length == 11
    assert all(t.shape == (1, 2, 11, 8) for t in kv.k + kv.v)
    for chunk, slots in ((4, 12), (64, 24)):  # rounded up to the chunk, capped at the context
        kv = KVCache.for_model(model, 1, chunk=chunk)
        list(model.stream(prompt, 7, GREEDY, kv_cache=kv))
        assert kv.capacity == slots


def test_the_cache_grows_in_doubling_chunks_and_gives_the_full_sized_logits() -> None:
    model = decoding_model(HYBRID)  # a recurrent state (copied whole) beside keys and values
    ids = torch.randint(0, 97, (2, 24))
    grown, full = KVCache.for_model(model, 2, chunk=1), KVCache.for_model(model, 2, 24)
    turns = [(0, 5), (5, 8), *[(i, i + 1) for i in range(8, 24)]]  # two turns, then tokens
    capacities = []
    with torch.no_grad():
        for a, b in turns:
            got, want = model(ids[:, a:b], cache=grown), model(ids[:, a:b], cache=full)
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            capacities.append(grown.capacity)
    # 5 fit exactly; 8 > 5 doubles to 10, 11 to 20, 21 to 40 capped at context_length = 24
    assert sorted(set(capacities)) == [5, 10, 20, 24] and grown.grown == 4
    assert full.grown == 0 and grown.nbytes() == full.nbytes()
    with raises_naming(ModelInputError, "the KV cache holds 24 tokens", "context_length=24"):
        model(ids[:, :1], cache=grown)


def test_a_padded_or_selected_cache_grows_too() -> None:
    model = decoding_model("num_kv_heads=2")
    ids = torch.randint(0, 97, (2, 7))
    real = torch.ones(2, 4, dtype=torch.bool)
    real[0, :2] = False  # row 0: two pads, then two tokens
    logits = []
    for kv in (KVCache.for_model(model, 2, 2, chunk=1), KVCache.for_model(model, 2, 24)):
        kv.pad(real)  # grows the small one to the prompt's 4 slots
        with torch.no_grad():
            steps = [model(ids[:, :4], cache=kv)]
            steps += [model(ids[:, i : i + 1], cache=kv) for i in range(4, 7)]
        logits.append(torch.cat(steps, dim=1))
        assert kv.valid is not None and kv.valid.shape[1] == kv.capacity
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=0)
    ids = torch.randint(0, 97, (1, 12))
    kv = KVCache.for_model(model, 1, chunk=1)
    with torch.no_grad():
        model(ids[:, :4], cache=kv)
        fork = kv.select(torch.tensor([0, 0]))
        got = model(ids[[0, 0], 4:], cache=fork)  # 8 more than its 4 slots
        torch.testing.assert_close(got, model(ids)[[0, 0], 4:], rtol=1e-5, atol=1e-5)
    assert fork.capacity == 12 and fork.batch == 2 and kv.capacity == 4


def test_the_cache_holds_bytes_for_its_capacity_not_the_context() -> None:
    model = decoding_model("num_kv_heads=2")  # 2 layers, 2 key heads of 8, context 24, float32
    per_slot = 2 * 2 * 2 * 8 * 4 + 8  # layers × (k, v) × heads × head_dim × 4 B, an int64 position
    for capacity in (0, 3, 24):
        assert KVCache.for_model(model, 1, capacity).nbytes() == capacity * per_slot
    with raises_naming(ModelInputError, "capacity=25", "0..24", "context_length=24"):
        KVCache.for_model(model, 1, 25)
    bare = KVCache(KVCache.for_model(model, 1, 3).states, batch=1, context_length=24, capacity=3)
    with raises_naming(ModelInputError, "holds 3 slots and cannot grow to 4", "for_model"):
        bare.reserve(4)


def test_generation_computes_the_head_for_the_last_position_only() -> None:
    model = decoding_model("num_kv_heads=2")
    ids = torch.randint(0, 97, (2, 6))
    positions = torch.arange(6)[None]
    with torch.no_grad():
        every = model.forward_unchecked(ids, positions)
        last = model.forward_unchecked(ids, positions, last=True)
    assert last.shape == (2, 1, 97)
    torch.testing.assert_close(last, every[:, -1:], rtol=1e-6, atol=1e-6)
