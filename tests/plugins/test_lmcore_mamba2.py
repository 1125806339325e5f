"""plugins/lmcore_mamba2.py: Mamba-2's layer against transformers' own Mamba2Mixer (its torch
path) with the same weights (its state dict loads as it is); the kit on grouped B and C, heads
of their own size and chunks that do not divide the sequence; its decoding state, padding,
Mamba-2 alone and in a hybrid generating as they recompute, the state refusing to go back; and
its refusals of shapes that cannot work."""

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
# Two groups of B and C over four heads of 16 channels, a small state.
GROUPED = "d_state=8, ssm_head_dim=16, n_groups=2, chunk_size=16"


def mixer(args: str = GROUPED, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(f"{SPEC}, mixer=mamba2({args})", dtype=dtype).layers[0].attn


@pytest.mark.parametrize("cached", [False, True])
def test_it_matches_transformers_mamba2_mixer(cached: bool) -> None:
    """The whole sequence (two chunks of 16, the second partial), and with transformers' cache
    the prompt then three decoding steps by the recurrent form."""
    modeling = pytest.importorskip(
        "transformers.models.mamba2.modeling_mamba2", reason="transformers"
    )
    from transformers import Mamba2Config

    config = Mamba2Config(
        hidden_size=32, state_size=8, expand=2, head_dim=16, num_heads=4, n_groups=2,
        conv_kernel=4, chunk_size=16, use_conv_bias=True, use_bias=False,
        layer_norm_epsilon=1e-5, num_hidden_layers=1, vocab_size=50,
    )  # fmt: skip
    torch.manual_seed(1)
    ref = modeling.Mamba2Mixer(config, layer_idx=0).eval()
    with torch.no_grad():  # weights away from their initial values, the norm's gain too
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))
    m = mixer()
    assert set(m.state_dict()) == set(ref.state_dict())
    m.load_state_dict(ref.state_dict(), strict=True)  # the checkpoint's keys and shapes
    x = torch.randn(2, 21, 32)
    with torch.no_grad():
        if not cached:
            torch.testing.assert_close(m(x, LayerContext()), ref(x), rtol=1e-5, atol=1e-5)
            return
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache(config=config)
        state = m.decoding_state(batch=2, context_length=80)
        got, want = [], []
        for start, stop in ((0, 18), (18, 19), (19, 20), (20, 21)):
            got.append(m(x[:, start:stop], LayerContext(cache=LayerCache(state, start))))
            want.append(ref(x[:, start:stop], cache=cache))
        torch.testing.assert_close(torch.cat(got, 1), torch.cat(want, 1), rtol=1e-5, atol=1e-5)


def kit_case(check: str) -> tuple[object, Target]:
    [entry] = [e for e in get_registry().entries("mixer") if e.name == "mamba2"]
    target = Target(entry, (("d_state", 6), ("ssm_head_dim", 8), ("n_groups", 2),
                            ("chunk_size", 3), ("expand", 1)))  # fmt: skip
    [found] = [c for c in CHECKS if c.name == check]
    return found, target


@pytest.mark.parametrize(
    "check",
    ["forward", "gradients", "params", "flops", "activations", "cache", "mixes_causally",
     "recurrent", "state"],
)  # fmt: skip
def test_grouped_heads_of_their_own_size_pass_the_kit(check: str) -> None:
    """The kit runs the defaults itself (tests/testing/test_suite_builtins.py); here the other
    paths: two groups of B and C, heads of 8 channels, chunks of 3 tokens, no expansion."""
    from lmcore.testing import Case

    found, target = kit_case(check)
    for variant in found.variants:  # type: ignore[attr-defined]
        with torch.random.fork_rng():
            torch.manual_seed(0)
            Case(found, target, variant).run(Settings(compile_backend="eager"))  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_the_training_forward_compiles_as_one_graph(backend: str) -> None:
    """fullgraph: the chunk loop, the grouped B and C and the gates trace without a break;
    forward and backward (inductor's compiled backward too) match eager."""
    m = mixer("d_state=8, ssm_head_dim=16, n_groups=2, chunk_size=4")
    x = torch.randn(2, 10, 32, requires_grad=True)
    eager = m(x, LayerContext())
    (eager_grad,) = torch.autograd.grad(eager.square().sum(), x)
    torch.compiler.reset()
    try:
        compiled = torch.compile(lambda t: m(t, LayerContext()), backend=backend, fullgraph=True)
        got = compiled(x)
        (grad,) = torch.autograd.grad(got.square().sum(), x)
    finally:
        torch.compiler.reset()
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, eager_grad, rtol=1e-5, atol=1e-5)


def test_decoding_keeps_a_state_per_head_and_the_conv_tail() -> None:
    m = mixer(dtype=torch.bfloat16)
    state = m.decoding_state(batch=3, context_length=80, dtype=torch.bfloat16)
    assert isinstance(state, RecurrentState) and not state.rewind
    shapes = {k: (tuple(t.shape), t.dtype) for k, t in state.tensors().items()}
    channels = 64 + 2 * 2 * 8  # x (expand · d_model), then B and C of two groups
    assert shapes == {
        "ssm": ((3, 4, 16, 8), torch.float32),
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
    for key in ("ssm", "conv"):
        torch.testing.assert_close(beside[key], alone[key], rtol=1e-12, atol=1e-12)


BASE = "vocab_size=97, context_length=24, d_model=32, num_layers=4, num_heads=4, d_ff=64"
HYBRID = f"{BASE}, mixer=mamba2(d_state=8, chunk_size=4), mixer[1::2]=attention"


@pytest.mark.parametrize(
    "spec", [f"{BASE}, mixer=mamba2(d_state=8, chunk_size=4)", HYBRID], ids=["alone", "hybrid"]
)
def test_it_generates_as_it_recomputes(spec: str) -> None:
    torch.manual_seed(0)
    model = build_model(spec)
    names = [type(layer.attn).__name__ for layer in model.layers]
    assert names == (["Mamba2", "CausalSelfAttention"] * 2 if spec == HYBRID else ["Mamba2"] * 4)
    prompt = torch.randint(0, 97, (2, 5))
    assert torch.equal(model.generate(prompt, 10, GREEDY), recompute(model, prompt, 10))


def test_its_state_refuses_to_go_back_by_name() -> None:
    torch.manual_seed(0)
    model = build_model(HYBRID)
    cache = DecodingCache.for_model(model, 1)
    with torch.no_grad():
        model(torch.randint(0, 97, (1, 6)), cache=cache)
    with raises_naming(
        ModelInputError, "truncate(4)", "layer 0's mixer 'mamba2'", "all 6 tokens"
    ):
        cache.truncate(4)
    assert cache.length == 6


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("ssm_head_dim=24", r"ssm_head_dim=24 does not divide expand · d_model = 2 · 32 = 64"),
        ("ssm_head_dim=16, n_groups=3", r"n_groups=3 does not divide the 4 SSM heads"),
    ],
)  # fmt: skip
def test_shapes_that_cannot_work_are_refused(args: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        build_model(f"{SPEC}, mixer=mamba2({args})", device="meta")


def test_the_module_builds_from_flat_arguments() -> None:
    """What another mixer (Falcon-H1's parallel attention and Mamba-2) builds it from."""
    import lmcore_mamba2

    m = lmcore_mamba2.Mamba2(d_model=32, d_state=8, expand=2, head_dim=16, n_groups=2,
                             conv_size=3, chunk_size=5)  # fmt: skip
    assert (m.num_heads, m.conv1d.weight.shape) == (4, (64 + 32, 1, 3))
    assert m(torch.randn(1, 7, 32), LayerContext()).shape == (1, 7, 32)
    with pytest.raises(ValueError, match="ssm_head_dim=48 does not divide"):
        lmcore_mamba2.Mamba2(d_model=32, head_dim=48)


# Falcon-H1's Mamba-2: its own inner width, the norm after the gate or none, out_proj's bias
# apart from in_proj's, and the mup multipliers of in_proj's z, x, B, C and dt.
FALCON = ("d_state=8, ssm_head_dim=8, n_groups=2, chunk_size=16, d_inner=48, bias=true, "
          "out_bias=off, z_multiplier=0.5, x_multiplier=1.5, b_multiplier=0.8, "
          "c_multiplier=1.25, dt_multiplier=0.7")  # fmt: skip


@pytest.mark.parametrize("gate_norm", ["norm_first", "gate_first", "none"])
@pytest.mark.parametrize("cached", [False, True])
def test_falcon_h1s_options_match_transformers_falcon_h1_mixer(gate_norm: str, cached: bool) -> None:
    modeling = pytest.importorskip(
        "transformers.models.falcon_h1.modeling_falcon_h1", reason="transformers"
    )
    from transformers import FalconH1Config

    config = FalconH1Config(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=1,
        vocab_size=50, mamba_d_ssm=48, mamba_n_heads=6, mamba_d_head="auto", mamba_n_groups=2,
        mamba_d_state=8, mamba_d_conv=4, mamba_chunk_size=16, mamba_conv_bias=True,
        mamba_proj_bias=True, projectors_bias=False, mamba_rms_norm=gate_norm != "none",
        mamba_norm_before_gate=gate_norm == "norm_first",
        ssm_multipliers=[0.5, 1.5, 0.8, 1.25, 0.7], rms_norm_eps=1e-5,
    )  # fmt: skip
    torch.manual_seed(1)
    ref = modeling.FalconH1Mixer(config, layer_idx=0).eval()
    ref.register_buffer("mup_vector", modeling.compute_mup_vector(config), persistent=False)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))
    m = mixer(f"{FALCON}, gate_norm={gate_norm}")
    assert set(m.state_dict()) == set(ref.state_dict())
    m.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(2, 21, 32)
    with torch.no_grad():
        if not cached:
            torch.testing.assert_close(m(x, LayerContext()), ref(x), rtol=1e-5, atol=1e-5)
            return
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache(config=config)
        state = m.decoding_state(batch=2, context_length=80)
        got, want = [], []
        for start, stop in ((0, 18), (18, 19), (19, 20), (20, 21)):
            got.append(m(x[:, start:stop], LayerContext(cache=LayerCache(state, start))))
            want.append(ref(x[:, start:stop], cache=cache))
        torch.testing.assert_close(torch.cat(got, 1), torch.cat(want, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("check", ["params", "flops", "activations", "state"])
@pytest.mark.parametrize("gate_norm", ["norm_first", "none"])
def test_falcon_h1s_options_pass_the_kits_accounting(check: str, gate_norm: str) -> None:
    from lmcore.testing import Case

    [entry] = [e for e in get_registry().entries("mixer") if e.name == "mamba2"]
    target = Target(entry, (("d_state", 6), ("ssm_head_dim", 8), ("n_groups", 2),
                            ("chunk_size", 3), ("d_inner", 48), ("bias", True),
                            ("out_bias", "off"), ("gate_norm", gate_norm),
                            ("z_multiplier", 0.5), ("dt_multiplier", 0.7)))  # fmt: skip
    [found] = [c for c in CHECKS if c.name == check]
    for variant in found.variants:  # type: ignore[attr-defined]
        with torch.random.fork_rng():
            torch.manual_seed(0)
            Case(found, target, variant).run(Settings(compile_backend="eager"))  # type: ignore[arg-type]


def test_an_inner_width_the_heads_cannot_split_is_refused() -> None:
    with pytest.raises(SpecError, match=r"ssm_head_dim=16 does not divide d_inner = 40"):
        mixer("ssm_head_dim=16, d_inner=40")
