"""The KV cache (`lmcore.model.cache.KVCache`): preallocated for the whole context and written in
place, and a forward with a cache refusing what does not fit it."""

from __future__ import annotations

import pytest
import torch

from lmcore.errors import ModelInputError
from lmcore.model.cache import KVCache
from tests.helpers.errors import raises_naming
from tests.helpers.models import decoding_model


def test_the_cache_is_preallocated_and_written_in_place() -> None:
    model = decoding_model("num_kv_heads=2")
    kv = KVCache.for_model(model, 2)
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
