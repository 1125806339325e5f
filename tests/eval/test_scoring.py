"""Scoring continuations: shared prefixes through the KV cache score as whole sequences."""

from __future__ import annotations

import random

import pytest
import torch

from lmcore.errors import EvalError
from lmcore.eval.scoring import loglikelihoods
from tests.helpers.runs import eval_model

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread is faster


# A recurrent mixer's state forks by row as keys and values do (`DecodingCache.select`).
@pytest.mark.parametrize(
    "extra",
    ["", "mixer=short_conv, mixer[1]=attention", "mixer=gated_deltanet, mixer[1]=mla",
     "mixer=mamba2, mixer[1]=attention"],  # fmt: skip
)
def test_shared_prefixes_through_the_cache_score_as_whole_sequences(extra: str) -> None:
    model = eval_model(extra)
    rng = random.Random(0)
    pairs: list[tuple[list[int], list[int]]] = []
    for _ in range(6):  # questions with four choices, contexts beyond the context length too
        ctx = [rng.randrange(300) for _ in range(rng.randrange(1, 24))]
        pairs += [(ctx, [rng.randrange(300) for _ in range(rng.randrange(1, 6))]) for _ in range(4)]
    pairs += [([rng.randrange(300)], [rng.randrange(300) for _ in range(16)]) for _ in range(3)]
    expected = []
    with torch.no_grad():
        for ctx, cont in pairs:
            inp = torch.tensor((ctx + cont)[-17:][:-1])
            logp = model(inp[None])[0, -len(cont) :].log_softmax(-1)
            picked = logp.gather(-1, torch.tensor(cont)[:, None])
            greedy = bool((logp.argmax(-1) == torch.tensor(cont)).all())
            expected.append((float(picked.double().sum()), greedy))
    for batch in (1, 3, 8):
        for cache in (True, False):
            got = loglikelihoods(model, pairs, batch_size=batch, cache=cache)
            assert [g for _, g in got] == [g for _, g in expected]
            assert max(abs(a - b) for (a, _), (b, _) in zip(got, expected, strict=True)) < 1e-4


def test_a_continuation_longer_than_the_context_is_refused() -> None:
    with pytest.raises(EvalError, match="request 0: its continuation of 17 tokens does not fit"):
        loglikelihoods(eval_model(), [([1], [2] * 17)])
