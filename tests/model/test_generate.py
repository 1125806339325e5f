"""Generation with a KV cache: greedy with the cache is exactly greedy recomputing the whole
sequence (every built-in position encoding and kernel, pre/post-norm, GQA, MQA, the example
plugin, left-padded batches); sampling (top-p, top-k, seed), stop tokens, streaming; every error.

The reference for the cache is `model(seq)` on the whole sequence at each step, argmax of the
last row: independent of lmcore.model.generate.
"""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from lmcore import Component, Registry, build_model
from lmcore.errors import GenerationError, ModelInputError
from lmcore.model.generate import GREEDY, Sampling, sample
from lmcore.model.transformer import TransformerLM
from lmcore.registry import use_registry
from tests.helpers.compiling import GraphRecorder
from tests.helpers.errors import raises_naming
from tests.helpers.models import decoding_model, recompute

ROOT = Path(__file__).resolve().parents[2]



VARIANTS = [
    *(f"pos={p}, attn={a}" for p in ("rope", "nope", "learned", "sinusoidal", "alibi")
      for a in ("sdpa", "chunked(block_size=3)")),
    "block=postnorm",
    "block=postnorm, pos=learned, attn=chunked(block_size=3)",
    "num_kv_heads=2",  # grouped-query
    "num_kv_heads=1",  # multi-query
    "num_kv_heads=1, pos=alibi, attn=chunked(block_size=5)",
    "tie_embeddings=true, norm=layernorm, ffn=gelu",
]  # fmt: skip


@pytest.mark.parametrize("spec", VARIANTS)
def test_greedy_with_the_cache_is_greedy_recomputing_the_whole_sequence(spec: str) -> None:
    model = decoding_model(spec)
    prompt = torch.randint(0, 97, (2, 5))
    expected = recompute(model, prompt, 12)
    assert torch.equal(model.generate(prompt, 12, GREEDY), expected)
    assert torch.equal(model.generate(prompt, 12, GREEDY, cache=False), expected)


@pytest.mark.parametrize("spec", ["pos=rope", "pos=learned", "pos=alibi, attn=chunked"])
def test_left_padded_prompts_generate_as_each_prompt_alone(spec: str) -> None:
    model = decoding_model(spec)
    prompts = [torch.randint(0, 97, (n,)) for n in (3, 7, 1)]
    batch = model.generate(prompts, 10, GREEDY)
    assert batch.shape == (3, 10)
    for row, prompt in zip(batch, prompts, strict=True):
        assert torch.equal(row, recompute(model, prompt[None], 10)[0])
    # Lists of ints take the same path; equal lengths need no padding.
    as_lists = model.generate([p.tolist() for p in prompts], 10, GREEDY)
    assert torch.equal(as_lists, batch)
    assert torch.equal(model.generate(prompts, 10, GREEDY, cache=False), batch)


def test_the_example_plugin_generates_the_same_with_and_without_the_cache() -> None:
    spec = importlib.util.spec_from_file_location(
        "lmcore_dyt", ROOT / "examples" / "lmcore-dyt" / "lmcore_dyt.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    registry = Registry(disabled=["dyt"])  # the copy from the source, not an installed one
    registry.add(*module.lmcore_components(), name="lmcore-dyt")
    with use_registry(registry):
        model = decoding_model("norm=dyt, num_kv_heads=2", registry=registry)
    prompt = torch.randint(0, 97, (2, 4))
    assert torch.equal(model.generate(prompt, 10, GREEDY), recompute(model, prompt, 10))


def test_one_prompt_gives_one_row_and_streaming_yields_the_same_tokens_one_by_one() -> None:
    model = decoding_model("")
    prompt = torch.randint(0, 97, (6,))
    ids = model.generate(prompt, 8, GREEDY)
    assert ids.shape == (8,)
    steps = model.stream(prompt, 8, GREEDY)
    first = next(steps)
    assert first.shape == () and int(first) == int(ids[0])
    assert [int(t) for t in steps] == ids[1:].tolist()
    assert torch.is_grad_enabled()  # inference mode never leaks out of a step
    assert model.generate(prompt, 0).shape == (0,)
    assert model.generate(prompt[None].repeat(2, 1), 0).shape == (2, 0)


# ------------------------------------------------------------------------------ sampling


def logits_of(probs: list[float], rows: int = 4000) -> Tensor:
    return torch.tensor(probs).log().expand(rows, -1)


def drawn(probs: list[float], **kw: Any) -> Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.bincount(sample(logits_of(probs), Sampling(**kw), g), minlength=len(probs))


def test_top_p_keeps_the_smallest_set_reaching_p_with_ties_broken_by_id() -> None:
    probs = [0.125, 0.5, 0.125, 0.25]  # ranked: 1, 3, then 0 and 2 tied (0 first)
    assert drawn(probs, top_p=0.5).nonzero().flatten().tolist() == [1]  # 0.5 reaches 0.5
    assert drawn(probs, top_p=0.6).nonzero().flatten().tolist() == [1, 3]
    counts = drawn(probs, top_p=0.8)
    assert counts.nonzero().flatten().tolist() == [0, 1, 3]  # the tie: id 0 kept, 2 not
    # Renormalised over what is kept: 0.5 / 0.875 for token 1.
    assert abs(counts[1].item() / 4000 - 0.5 / 0.875) < 0.03
    assert drawn(probs, top_p=1.0).nonzero().flatten().tolist() == [0, 1, 2, 3]


def test_top_k_keeps_the_k_most_likely_ties_by_id_and_combines_with_top_p() -> None:
    probs = [0.2, 0.4, 0.2, 0.2]
    assert drawn(probs, top_k=1).nonzero().flatten().tolist() == [1]
    assert drawn(probs, top_k=2).nonzero().flatten().tolist() == [0, 1]
    assert drawn(probs, top_k=3, top_p=0.5).nonzero().flatten().tolist() == [0, 1]
    assert drawn(probs, top_k=50).nonzero().flatten().tolist() == [0, 1, 2, 3]


def test_temperature_sharpens_and_zero_is_argmax_with_ties_to_the_lowest_id() -> None:
    probs = [0.3, 0.7]
    cold, hot = drawn(probs, temperature=0.5), drawn(probs, temperature=2.0)
    # p ∝ p^(1/T): at T=0.5, 0.49 / 0.58; at T=2, sqrt(0.7) / (sqrt(0.3) + sqrt(0.7)).
    assert abs(cold[1].item() / 4000 - 0.49 / 0.58) < 0.03
    assert abs(hot[1].item() / 4000 - math.sqrt(0.7) / (math.sqrt(0.3) + math.sqrt(0.7))) < 0.03
    assert sample(torch.tensor([[1.0, 3.0, 3.0]]), Sampling(temperature=0)).tolist() == [1]


def test_the_same_seed_gives_the_same_sample_without_touching_the_global_rng() -> None:
    model = decoding_model("")
    prompt = torch.randint(0, 97, (2, 4))
    state = torch.get_rng_state()
    a = model.generate(prompt, 16, Sampling(top_k=40, seed=7))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(model.generate(prompt, 16, Sampling(top_k=40, seed=7)), a)
    assert not torch.equal(model.generate(prompt, 16, Sampling(top_k=40, seed=8)), a)


def test_a_stop_token_ends_its_sequence_while_the_rest_of_the_batch_continues() -> None:
    model = decoding_model("")
    torch.manual_seed(2)
    prompt = torch.randint(0, 97, (2, 4))
    free = model.generate(prompt, 12, GREEDY)
    stop, at = int(free[0, 2]), 2  # row 0's third token, which row 1 never produces
    assert stop not in free[0, :2].tolist() + free[1].tolist()
    out = model.generate(prompt, 12, GREEDY, stop_token=stop)
    assert out.shape == (2, 12)
    assert out[0, : at + 1].tolist() == free[0, : at + 1].tolist()
    assert set(out[0, at:].tolist()) == {stop}  # the ended row repeats the stop token
    assert torch.equal(out[1], free[1])  # the other row goes on as without a stop token
    # When every sequence has stopped, generation ends early.
    alone = model.generate(prompt[0], 12, GREEDY, stop_token=stop)
    assert alone.tolist() == free[0, : at + 1].tolist()


# ------------------------------------------------------------------------------ checks, once


def test_token_ids_are_checked_once_up_front_not_at_every_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import lmcore.model.inputs as inputs

    model = decoding_model("")
    calls: list[int] = []
    real = inputs._raise_out_of_range
    monkeypatch.setattr(
        inputs, "_raise_out_of_range", lambda t, *a: (calls.append(t.numel()), real(t, *a))[1]
    )
    model.generate(torch.randint(0, 97, (2, 5)), 10, GREEDY)
    assert calls == [10]  # the prompt's ids, once; no positions or ids per step
    with pytest.raises(ModelInputError, match=r"token id 97 at index \(1, 2\) is out of range"):
        model.generate(torch.tensor([[1, 2, 3], [4, 5, 97]]), 3)


def test_options_out_of_range_are_refused_before_anything_runs() -> None:
    model = decoding_model("")
    p = torch.tensor([1, 2, 3])
    # Each: the option, what it may be, the value given and, where there is one, the hint.
    cases = [
        ({"temperature": -1.0}, ("temperature", "finite number >= 0", "got -1.0", "0 is greedy")),
        ({"temperature": math.nan}, ("temperature", "finite number >= 0", "got nan")),
        ({"top_p": 0.0}, ("top_p", "in (0, 1]", "got 0.0", "1 keeps every token")),
        ({"top_p": 1.5}, ("top_p", "in (0, 1]", "got 1.5")),
        ({"top_k": 0}, ("top_k", "positive integer or None", "got 0")),
        ({"stop_token": 97}, ("stop_token", "token id in 0..96 (vocab_size=97)", "a non-empty list of them, or None", "got 97")),
        ({"stop_token": [2, 97]}, ("stop_token", "a non-empty list of them", "got [2, 97]")),
        ({"stop_token": []}, ("stop_token", "a non-empty list of them", "got []")),
        ({"seed": -1}, ("seed", "integer in 0 .. 2**64-1 or None", "got -1")),
        ({"max_new_tokens": -2}, ("max_new_tokens", ">= 0", "got -2")),
        ({"max_new_tokens": 2.0}, ("max_new_tokens", "an integer", "got 2.0")),
    ]  # fmt: skip
    for kw, facts in cases:
        n = kw.pop("max_new_tokens", 4)
        picking = {k: kw.pop(k) for k in ("temperature", "top_p", "top_k", "seed") if k in kw}
        with raises_naming(GenerationError, *facts):
            # The sampling value refuses its own fields; the call refuses the rest, before the
            # first step.
            model.stream(p, n, Sampling(**picking), **kw)


def test_sampling_is_one_value_and_anything_else_is_refused_by_name() -> None:
    model = decoding_model("")
    with pytest.raises(GenerationError, match=r"sampling must be a Sampling, .* got 0.0"):
        model.generate(torch.tensor([1, 2, 3]), 2, 0.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'temperature'"):
        model.generate(torch.tensor([1, 2, 3]), 2, temperature=0.0)  # type: ignore[call-arg]


def test_prompts_that_are_not_token_ids_are_refused() -> None:
    model = decoding_model("")
    with pytest.raises(ModelInputError, match=r"prompt_ids must be 1-d \(one prompt\) or 2-d"):
        model.generate(torch.zeros(1, 1, 3, dtype=torch.long), 2)
    with pytest.raises(ModelInputError, match=r"prompt_ids holds no prompt"):
        model.generate([], 2)
    with pytest.raises(ModelInputError, match=r"prompt 1 is not a list of integer token ids"):
        model.generate([[1, 2], ["a"]], 2)
    with pytest.raises(ModelInputError, match=r"token ids have an empty sequence dimension"):
        model.generate([[1, 2], []], 2)
    with pytest.raises(TypeError, match=r"token ids must be an integer tensor, got dtype"):
        model.generate(torch.tensor([1.0, 2.0]), 2)


def test_generating_past_the_context_names_both_numbers() -> None:
    model = decoding_model("")  # context_length=24
    prompt = torch.randint(0, 97, (20,))
    assert model.generate(prompt, 5, GREEDY).shape == (5,)  # 20 + 5 - 1 = 24 fed
    with raises_naming(
        GenerationError,
        "a prompt of 20 tokens",
        "max_new_tokens=6",
        "25 positions",
        "context_length=24",
        "at most 5 new tokens",
        "shorten the prompt",
    ):
        model.generate(prompt, 6)


class NoMaskSDPA(nn.Module):
    """The built-in kernel, declared without 'mask' (and asserting it never gets one)."""

    def __init__(self) -> None:
        super().__init__()
        from lmcore_sdpa import SDPA

        self.inner = SDPA()

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, bias: Any = None) -> Tensor:
        out: Tensor = self.inner(q, k, v, causal=causal, bias=bias)
        return out


def test_prompts_of_different_lengths_need_a_kernel_with_mask() -> None:
    registry = Registry()
    registry.add(
        Component(kind="attn", name="nomask", build=NoMaskSDPA, features=frozenset({"gqa"})),
        name="tests",
    )
    model = decoding_model("attn=nomask", registry=registry)
    prompt = torch.randint(0, 97, (2, 5))
    assert torch.equal(model.generate(prompt, 6, GREEDY), recompute(model, prompt, 6))
    with raises_naming(
        GenerationError,
        "prompts of different lengths",
        "attn 'nomask' does not declare 'mask'",
        "give prompts of equal length",
        "one at a time",
        "a kernel that can: chunked, sdpa",
    ):
        model.generate([[1, 2], [3]], 2)


def test_a_component_that_declares_nocache_is_refused_before_generation() -> None:
    from lmcore_nope import NoPE

    registry = Registry()
    registry.add(
        Component(kind="pos", name="whole", build=NoPE, features=frozenset({"nocache"})),
        name="tests",
    )
    model = decoding_model("pos=whole", registry=registry)
    prompt = torch.randint(0, 97, (1, 4))
    with raises_naming(
        GenerationError, "pos 'whole'", "declares 'nocache'", "KV cache", "cache=False"
    ):
        model.stream(prompt, 3)
    assert torch.equal(model.generate(prompt, 3, GREEDY, cache=False), recompute(model, prompt, 3))


@pytest.mark.slow
def test_compiled_decoding_with_its_defaults_gives_eager_tokens() -> None:
    """Inductor with compile_decoding's own options (C++ wrapper, shapes static until they
    change): the same greedy tokens as eager, for a prompt and for a left-padded batch of
    another length (a mask, and the prompt's length turned dynamic). In a subprocess: dynamo's
    compiled code and recompile counts belong to the code object, shared by every test."""
    code = textwrap.dedent("""
        import torch
        from lmcore import build_model
        from lmcore.model.generate import GREEDY, compile_decoding

        torch.manual_seed(0)
        spec = ("vocab_size=97, context_length=16, d_model=16, num_layers=1, num_heads=2, "
                "num_kv_heads=1, d_ff=32")
        eager, compiled = build_model(spec), build_model(spec)
        compiled.load_state_dict(eager.state_dict())
        prompts = [torch.randint(0, 97, (2, 5)), [[5, 6, 7, 8], [9, 10]]]
        expected = [eager.generate(p, 4, GREEDY) for p in prompts]
        decoder = compile_decoding(compiled)
        for p, want in zip(prompts, expected):
            got = decoder.generate(p, 4, GREEDY)
            print(torch.equal(got, want), got.tolist(), want.tolist())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("True ") for line in lines), out.stdout


def test_compiled_decoding_gives_the_same_tokens_and_compiles_each_kind_of_call_once(
    traced: GraphRecorder,
) -> None:
    from torch._dynamo.utils import counters

    from lmcore.model.generate import compile_decoding

    torch.manual_seed(0)
    model = build_model(
        "vocab_size=97, context_length=16, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=32"
    )
    prompt = torch.randint(0, 97, (2, 5))
    eager = model.generate(prompt, 4, GREEDY)
    shorter = recompute(model, prompt[:, 1:], 4)
    shorter_still = recompute(model, prompt[:, 2:], 4)
    counters.clear()
    # fullgraph: a graph break (e.g. an int-returning torch call in the attention's
    # tiling) would raise here instead of silently running the step eagerly.
    decoder = compile_decoding(model, backend=traced, fullgraph=True)
    assert torch.equal(decoder.generate(prompt, 4, GREEDY), eager)
    assert torch.equal(decoder.generate(prompt[:, 1:], 4, GREEDY), shorter)
    # The layer: the first prompt's length, every later step (any fill level), every other
    # prompt length; the head: the last position, whatever the length. A third prompt
    # length and the steps after it compile nothing new.
    assert counters["stats"]["unique_graphs"] == 4
    assert torch.equal(decoder.generate(prompt[:, 2:], 4, GREEDY), shorter_still)
    assert counters["stats"]["unique_graphs"] == 4
    # The model itself was left as it was: its own generation compiles nothing.
    assert model.forward_unchecked.__func__ is TransformerLM.forward_unchecked
    assert torch.equal(model.generate(prompt, 4, GREEDY), eager)
    assert counters["stats"]["unique_graphs"] == 4
    # Attention this small is one tile: traced as plain operators, not an opaque call.
    targets = {str(node.target) for gm in traced.graphs for node in gm.graph.nodes}
    assert traced.graphs and not any("tiled_attention" in t for t in targets), targets


def test_layers_of_one_structure_share_one_compiled_code() -> None:
    """compile_decoding's regional mode: three layers compile the graphs one layer does (the
    first prompt, every later step, another prompt's length), each layer whole (fullgraph),
    the head one more, and the tokens are eager's."""
    from torch._dynamo.utils import counters

    from lmcore.model.generate import compile_decoding

    torch.manual_seed(0)
    model = build_model(
        "vocab_size=97, context_length=16, d_model=16, num_layers=3, num_heads=2, num_kv_heads=1, d_ff=32"
    )
    prompt = torch.randint(0, 97, (2, 5))
    eager = [model.generate(p, 4, GREEDY) for p in (prompt, prompt[:, 1:])]
    torch.compiler.reset()
    counters.clear()
    try:
        decoder = compile_decoding(model, backend="eager", fullgraph=True)
        got = [decoder.generate(p, 4, GREEDY) for p in (prompt, prompt[:, 1:])]
        assert all(torch.equal(a, b) for a, b in zip(got, eager, strict=True))
        assert counters["stats"]["unique_graphs"] == 4
    finally:
        torch.compiler.reset()


def test_the_whole_step_compiles_as_one_graph_with_regional_false(traced: GraphRecorder) -> None:
    from torch._dynamo.utils import counters

    from lmcore.model.generate import compile_decoding

    torch.manual_seed(0)
    model = build_model(
        "vocab_size=97, context_length=16, d_model=16, num_layers=2, num_heads=2, d_ff=32"
    )
    prompt = torch.randint(0, 97, (1, 5))
    eager = model.generate(prompt, 4, GREEDY)
    counters.clear()
    decoder = compile_decoding(model, regional=False, backend=traced, fullgraph=True)
    assert torch.equal(decoder.generate(prompt, 4, GREEDY), eager)
    assert counters["stats"]["unique_graphs"] == 2  # the prompt, then every step
    # one graph holds both layers' seven projections each and the head
    products = [n for n in traced.graphs[0].graph.nodes if "matmul" in str(n.target)]
    assert len(products) == 2 * 7 + 1, [str(n.target) for n in traced.graphs[0].graph.nodes]


def test_regional_compilation_needs_the_models_layers() -> None:
    from lmcore.model.generate import compile_decoding

    model = build_model(
        "vocab_size=97, context_length=16, d_model=16, num_layers=1, num_heads=2, d_ff=32"
    )
    decoder = compile_decoding(model, backend="eager")
    with pytest.raises(TypeError, match=r"and its head \(a method `head`\); Decoder has not both: use regional=False"):
        compile_decoding(decoder, backend="eager")
    prompt = torch.randint(0, 97, (1, 3))
    twice = compile_decoding(decoder, regional=False, backend="eager")
    torch.compiler.reset()
    try:
        assert torch.equal(twice.generate(prompt, 3, GREEDY), model.generate(prompt, 3, GREEDY))
    finally:
        torch.compiler.reset()


def test_compiled_decoding_without_a_cpp_compiler_is_refused_before_tracing() -> None:
    from torch._inductor import config

    from lmcore.model.generate import compile_decoding

    model = build_model(
        "vocab_size=97, context_length=16, d_model=16, num_layers=1, num_heads=2, d_ff=32"
    )
    with (
        config.patch({"cpp.cxx": (None, "/nonexistent/g++")}),
        raises_naming(
            GenerationError, "no working C++ compiler", "/nonexistent/g++", "without compiling"
        ),
    ):
        compile_decoding(model)
    compile_decoding(model, backend="eager")  # another backend builds no C++: no check


def test_generation_stops_at_any_of_several_stop_tokens() -> None:
    model = decoding_model("")
    free = model.generate(torch.tensor([1, 2, 3]), 12, GREEDY).tolist()
    stops = [free[5], free[2]]
    out = model.generate(torch.tensor([1, 2, 3]), 12, GREEDY, stop_token=stops).tolist()
    end = min(free.index(t) for t in stops)
    assert end <= 2 and out == free[: end + 1]  # the first of either, included, then nothing
