"""Generation through every registered mixer's decoding state: greedy with the cache is greedy
recomputing the whole sequence, for each mixer alone and beside attention layers; left-padded
prompts generate as each alone (every mixer declaring 'mask'); a mixer without 'mask' refuses
them by name; the compiled step (fullgraph) gives the eager tokens."""

from __future__ import annotations

import pytest
import torch

from lmcore import Component, Registry
from lmcore.errors import GenerationError
from lmcore.model.generate import GREEDY, compile_decoding
from lmcore.registry import get_registry
from tests.helpers.errors import raises_naming
from tests.helpers.models import decoding_model, recompute

MIXERS = sorted(e.name for e in get_registry().entries("mixer"))
SPECS = [
    *(f"mixer={m}" for m in MIXERS),
    *(f"mixer={m}, mixer[1]=attention, num_kv_heads=2" for m in MIXERS if m != "attention"),
]



def test_the_built_in_mixers_are_registered() -> None:
    assert {"attention", "short_conv"} <= set(MIXERS)


@pytest.mark.parametrize("spec", SPECS)
def test_greedy_with_the_cache_is_greedy_recomputing(spec: str) -> None:
    model = decoding_model(spec)
    prompt = torch.randint(0, 97, (2, 5))
    assert torch.equal(model.generate(prompt, 10, GREEDY), recompute(model, prompt, 10))


@pytest.mark.parametrize("spec", SPECS)
def test_left_padded_prompts_generate_as_each_alone(spec: str) -> None:
    model = decoding_model(spec)
    if model.blueprint.padding() is not None:
        pytest.skip(f"{spec}: a mixer without 'mask'")
    prompts = [torch.randint(0, 97, (n,)) for n in (3, 7, 1)]
    batch = model.generate(prompts, 8, GREEDY)
    for row, prompt in zip(batch, prompts, strict=True):
        assert torch.equal(row, recompute(model, prompt[None], 8)[0])


def test_prompts_of_different_lengths_need_a_mixer_with_mask() -> None:
    import lmcore_short_conv as sc  # its module and declarations, without 'mask'

    registry = Registry()
    registry.add(
        Component(kind="mixer", name="nopad", build=sc.ShortConv, args=sc.lmcore_components()[0].args,
                  params=sc.params, flops=sc.flops, state=sc.state, features=frozenset()),
        name="tests",
    )  # fmt: skip
    model = decoding_model("mixer=nopad", registry=registry)
    prompt = torch.randint(0, 97, (2, 5))
    assert torch.equal(model.generate(prompt, 4, GREEDY), recompute(model, prompt, 4))
    with raises_naming(
        GenerationError,
        "prompts of different lengths",
        "mixer 'nopad' does not declare 'mask'",
        "leaves its state as it was for a pad",
        "a mixer that can: attention,",
    ):
        model.generate([[1, 2], [3]], 2)


@pytest.mark.parametrize("spec", [s for s in SPECS if "mixer[1]" in s])
def test_the_compiled_step_of_a_hybrid_gives_the_eager_tokens(spec: str) -> None:
    model = decoding_model(spec)
    prompt = torch.randint(0, 97, (2, 5))
    eager = model.generate(prompt, 4, GREEDY)
    torch.compiler.reset()
    try:
        # fullgraph: a graph break in a mixer's step raises here instead of running eagerly
        decoder = compile_decoding(model, backend="eager", fullgraph=True)
        assert torch.equal(decoder.generate(prompt, 4, GREEDY), eager)
    finally:
        torch.compiler.reset()
