"""plugins/lmcore_attention_mamba2.py: attention and Mamba-2 side by side (Falcon-H1), against
the two layers built alone with the same weights and summed with the multipliers by hand; its
compound decoding state (keys and values beside Mamba-2's state), a left pad, generation as it
recomputes, the state refusing to go back, and the accounting of both halves."""

from __future__ import annotations

import pytest
import torch

from lmcore import build_model
from lmcore.errors import ModelInputError
from lmcore.interfaces import LayerContext
from lmcore.model.cache import CompoundState, DecodingCache, KVState, RecurrentState
from lmcore.model.counting import account
from lmcore.model.generate import GREEDY
from tests.helpers.errors import raises_naming
from tests.helpers.models import recompute

BASE = "vocab_size=97, context_length=24, d_model=32, num_layers=2, num_heads=4, d_ff=64"
MAMBA = "d_state=8, ssm_head_dim=16, n_groups=2, chunk_size=4"
MULTIPLIERS = "attention_in=0.5, attention_out=1.5, ssm_in=2.0, ssm_out=0.25"
BOTH = f"mixer=attention_mamba2({MAMBA}, {MULTIPLIERS})"


def model(extra: str = BOTH, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(f"{BASE}, {extra}", dtype=dtype)


def test_it_is_the_two_layers_summed_with_their_multipliers() -> None:
    """Without a rotation (pos=nope) the sub-layers need nothing from the model but x."""
    nope = f"pos=nope, {BOTH}"
    layer = model(nope, dtype=torch.float64).layers[0].attn
    attn = model("pos=nope", dtype=torch.float64).layers[0].attn
    ssm = model(f"pos=nope, mixer=mamba2({MAMBA})", dtype=torch.float64).layers[0].attn
    attn.load_state_dict(layer.attn.state_dict(), strict=True)
    ssm.load_state_dict(layer.ssm.state_dict(), strict=True)
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    with torch.no_grad():
        want = 1.5 * attn(0.5 * x, LayerContext()) + 0.25 * ssm(2.0 * x, LayerContext())
        got = layer(x, LayerContext())
        # and not the layers alone: each multiplier matters
        assert (got - attn(x, LayerContext()) - ssm(x, LayerContext())).abs().max() > 1e-3
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_its_state_holds_keys_and_values_beside_mamba2s() -> None:
    m = model()
    state = m.layers[0].attn.decoding_state(batch=3, context_length=24, dtype=torch.float32)
    assert isinstance(state, CompoundState) and not state.rewind
    assert isinstance(state["attn"], KVState) and isinstance(state["ssm"], RecurrentState)
    shapes = {k: tuple(t.shape) for k, t in state.tensors().items()}
    channels = 64 + 2 * 2 * 8  # x (expand · d_model), then B and C of two groups
    assert shapes == {
        "attn.k": (3, 4, 24, 8), "attn.v": (3, 4, 24, 8),
        "ssm.ssm": (3, 4, 16, 8), "ssm.conv": (3, channels, 3),
    }  # fmt: skip
    # describe's declared bytes: the keys and values grow, Mamba-2's state does not
    acc = account(f"{BASE}, {BOTH}")
    layers, kv, ssm = 2, 2 * 4 * 8, 4 * 16 * 8 + channels * 3  # numbers per layer, float32
    assert acc.decoding_state() == (layers * kv * 4, layers * ssm * 4)


def test_a_left_pad_gives_what_the_prompt_gives_alone() -> None:
    m = model(dtype=torch.float64)
    prompt = torch.randint(0, 97, (1, 5))
    with torch.no_grad():
        alone = m.generate(prompt, 6, GREEDY)
        padded = m.generate([prompt[0].tolist(), torch.randint(0, 97, (7,)).tolist()], 6, GREEDY)
    assert torch.equal(padded[0], alone[0])


@pytest.mark.parametrize("extra", [BOTH, f"{BOTH}, mixer[1]=mamba2({MAMBA})"], ids=["all", "mix"])
def test_it_generates_as_it_recomputes(extra: str) -> None:
    m = model(extra)
    prompt = torch.randint(0, 97, (2, 5))
    assert torch.equal(m.generate(prompt, 10, GREEDY), recompute(m, prompt, 10))


def test_its_state_refuses_to_go_back_by_name() -> None:
    m = model()
    cache = DecodingCache.for_model(m, 1)
    with torch.no_grad():
        m(torch.randint(0, 97, (1, 6)), cache=cache)
    assert not cache.can_truncate(4) and cache.can_truncate(0)
    with raises_naming(ModelInputError, "truncate(4)", "layer 0's mixer 'attention_mamba2'"):
        cache.truncate(4)


def test_both_halves_are_accounted() -> None:
    spec = f"{BASE}, {BOTH}"
    m = model()
    acc = account(spec)
    assert acc.params == sum(p.numel() for p in m.parameters())
    keys = set(m.state_dict())
    assert {"layers.0.attn.attn.q_proj.weight", "layers.0.attn.ssm.A_log"} <= keys
