"""plugins/lmcore_gated_deltanet.py: Qwen3-Next's gated DeltaNet against transformers' own
Qwen3NextGatedDeltaNet with the same weights (its state dict loads as it is); the kit on grouped
value heads with head sizes of their own and chunks that do not divide the sequence; its
decoding state, padding, a Qwen3-Next-shaped hybrid that generates as it recomputes, the state
refusing to go back; and its refusals of shapes that cannot work."""

from __future__ import annotations

import pytest
import torch

from lmcore import build_model
from lmcore.errors import ModelInputError, SpecError
from lmcore.interfaces import LayerContext
from lmcore.model.cache import DecodingCache, LayerCache, RecurrentState
from lmcore.model.generate import GREEDY
from lmcore.registry import get_registry
from lmcore.testing import CHECKS, Settings, Target
from tests.helpers.errors import raises_naming
from tests.helpers.models import recompute

SPEC = "vocab_size=50, context_length=80, d_model=32, num_layers=1, num_heads=4"
# Qwen3-Next's proportions: two value heads per key head, the value heads of their own size.
GROUPED = "num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=6"


def mixer(args: str = GROUPED, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(f"{SPEC}, mixer=gated_deltanet({args})", dtype=dtype).layers[0].attn


def test_it_matches_transformers_qwen3_next_gated_deltanet() -> None:
    qwen3_next = pytest.importorskip(
        "transformers.models.qwen3_next.modeling_qwen3_next", reason="transformers"
    )
    from transformers import Qwen3NextConfig

    config = Qwen3NextConfig(
        hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=6, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
        num_hidden_layers=1, layer_types=["linear_attention"], num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    torch.manual_seed(1)
    ref = qwen3_next.Qwen3NextGatedDeltaNet(config, layer_idx=0).eval()
    with torch.no_grad():  # weights away from their initial values, the norm's gain too
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))
    m = mixer()
    assert set(m.state_dict()) == set(ref.state_dict())
    m.load_state_dict(ref.state_dict(), strict=True)  # the checkpoint's keys and shapes
    x = torch.randn(2, 70, 32)  # two chunks of 64, the second partial
    with torch.no_grad():
        torch.testing.assert_close(m(x, LayerContext()), ref(x), rtol=1e-5, atol=1e-5)


def kit_case(check: str) -> tuple[object, Target]:
    [entry] = [e for e in get_registry().entries("mixer") if e.name == "gated_deltanet"]
    target = Target(entry, (("num_k_heads", 1), ("num_v_heads", 2), ("head_k_dim", 8),
                            ("head_v_dim", 12), ("chunk_size", 3)))  # fmt: skip
    [found] = [c for c in CHECKS if c.name == check]
    return found, target


@pytest.mark.parametrize(
    "check",
    [
        "forward",
        "gradients",
        "params",
        "flops",
        "activations",
        "cache",
        "mixes_causally",
        "recurrent",
        "state",
    ],
)
def test_grouped_heads_of_their_own_size_pass_the_kit(check: str) -> None:
    """The kit runs the defaults itself (tests/testing/test_suite_builtins.py); here the other
    paths: one key head for two value heads, head sizes not the model's, chunks of 3 tokens."""
    from lmcore.testing import Case

    found, target = kit_case(check)
    for variant in found.variants:  # type: ignore[attr-defined]
        with torch.random.fork_rng():
            torch.manual_seed(0)
            Case(found, target, variant).run(Settings(compile_backend="eager"))  # type: ignore[arg-type]


def test_the_training_forward_compiles_as_one_graph() -> None:
    """fullgraph: the chunk loop, the triangular solve and the gates trace without a break;
    forward and backward match eager."""
    m = mixer("num_k_heads=2, num_v_heads=4, chunk_size=4")
    x = torch.randn(2, 10, 32, requires_grad=True)
    eager = m(x, LayerContext())
    (eager_grad,) = torch.autograd.grad(eager.square().sum(), x)
    torch.compiler.reset()
    try:
        compiled = torch.compile(
            lambda t: m(t, LayerContext()), backend="aot_eager", fullgraph=True
        )
        got = compiled(x)
        (grad,) = torch.autograd.grad(got.square().sum(), x)
    finally:
        torch.compiler.reset()
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, eager_grad, rtol=1e-5, atol=1e-6)


def test_decoding_keeps_a_matrix_per_value_head_and_the_conv_tail() -> None:
    m = mixer(dtype=torch.bfloat16)
    state = m.decoding_state(batch=3, context_length=80, dtype=torch.bfloat16)
    assert isinstance(state, RecurrentState) and not state.rewind
    shapes = {k: (tuple(t.shape), t.dtype) for k, t in state.tensors().items()}
    channels = 2 * 2 * 8 + 4 * 6  # q and k of 2 key heads, v of 4 value heads
    assert shapes == {
        "S": ((3, 4, 8, 6), torch.float32),
        "conv": ((3, channels, 3), torch.bfloat16),
    }


def test_a_left_pad_leaves_the_state_as_a_fresh_sequence_has_it() -> None:
    m = mixer(dtype=torch.float64)
    x = torch.randn(1, 5, 32, dtype=torch.float64)
    padded = torch.cat([torch.randn(1, 2, 32, dtype=torch.float64), x], dim=1)
    valid = torch.tensor([[False, False, True, True, True, True, True]])
    alone = m.decoding_state(batch=1, context_length=80, dtype=torch.float64)
    beside = m.decoding_state(batch=1, context_length=80, dtype=torch.float64)
    with torch.no_grad():
        want = m(x, LayerContext(cache=LayerCache(alone, 0)))
        got = m(padded, LayerContext(cache=LayerCache(beside, 0, valid)))
    torch.testing.assert_close(got[:, 2:], want, rtol=1e-12, atol=1e-12)
    for key in ("S", "conv"):
        torch.testing.assert_close(beside[key], alone[key], rtol=1e-12, atol=1e-12)


HYBRID = ("vocab_size=97, context_length=24, d_model=32, num_layers=4, num_heads=4, "
          "num_kv_heads=2, d_ff=64, mixer=gated_deltanet, mixer[3::4]=attention")  # fmt: skip


def test_a_qwen3_next_shaped_hybrid_generates_as_it_recomputes() -> None:
    torch.manual_seed(0)
    model = build_model(HYBRID)
    assert [type(layer.attn).__name__ for layer in model.layers][:4] == [
        "GatedDeltaNet", "GatedDeltaNet", "GatedDeltaNet", "CausalSelfAttention",
    ]  # fmt: skip
    prompt = torch.randint(0, 97, (2, 5))
    assert torch.equal(model.generate(prompt, 10, GREEDY), recompute(model, prompt, 10))


def test_its_state_refuses_to_go_back_by_name() -> None:
    torch.manual_seed(0)
    model = build_model(HYBRID)
    cache = DecodingCache.for_model(model, 1)
    with torch.no_grad():
        model(torch.randint(0, 97, (1, 6)), cache=cache)
    with raises_naming(
        ModelInputError, "truncate(4)", "layer 0's mixer 'gated_deltanet'", "all 6 tokens"
    ):
        cache.truncate(4)
    assert cache.length == 6


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("num_k_heads=3, num_v_heads=4",
         r"num_v_heads=4 is not a multiple of num_k_heads=3: each key head serves"),
        ("conv_size=1", r"conv_size=1: the short convolution on q, k and v sees the token"),
    ],
)  # fmt: skip
def test_shapes_that_cannot_work_are_refused(args: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        build_model(f"{SPEC}, mixer=gated_deltanet({args})", device="meta")
