"""rope's partial rotation and frequency scaling, against Hugging Face's formulas written out here
(and against transformers' own `ROPE_INIT_FUNCTIONS`), and in a model."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import lmcore
from lmcore import build_model, get_registry
from lmcore.errors import SpecError
from lmcore.model.generate import GREEDY
from lmcore.testing import CHECKS, Case, Settings, Target
from lmcore_rope import RotaryPositionalEmbedding

LLAMA31 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}


@pytest.mark.parametrize(
    ("rope", "params"),
    [
        ("llama3", {"rope_theta": 500000.0, "original_max_position_embeddings": 64, **LLAMA31}),
        ("linear", {"rope_theta": 10000.0, "factor": 4.0, "partial_rotary_factor": 0.5}),
        ("default", {"rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
    ],
)
def test_the_tables_are_transformers_own_bit_for_bit(rope: str, params: dict[str, Any]) -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope == "default":  # GPT-NeoX's rotary_pct
        from transformers import GPTNeoXConfig
        from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding

        neox = GPTNeoXConfig(hidden_size=128, num_attention_heads=2,
                             rotary_pct=params["partial_rotary_factor"])  # fmt: skip
        hf_inv = GPTNeoXRotaryEmbedding.compute_default_rope_parameters(neox, "cpu")[0]
    else:
        config = LlamaConfig(hidden_size=128, num_attention_heads=2,
                             rope_parameters={"rope_type": rope, **params})  # fmt: skip
        hf_inv = ROPE_INIT_FUNCTIONS[rope](config, "cpu")[0]
    fraction = params.get("partial_rotary_factor", 1.0)
    spec = {"fraction": fraction, "scaling": "none" if rope == "default" else rope}
    spec.update({k: v for k, v in params.items() if k in ("factor", *LLAMA31)})
    if "original_max_position_embeddings" in params:
        spec["original_context_length"] = params["original_max_position_embeddings"]
    model = build_model(
        f"vocab_size=97, context_length=96, d_model=128, num_layers=1, num_heads=2, "
        f"pos=rope(theta={params['rope_theta']}, "
        + ", ".join(f"{k}={v}" for k, v in spec.items())
        + ")"
    )
    pos = model.pos
    assert isinstance(pos, RotaryPositionalEmbedding) and pos.rotary_dim == int(64 * fraction)
    angles = torch.arange(96, dtype=torch.float32)[:, None] * hf_inv[None, :]
    assert torch.equal(pos.cos, angles.cos()) and torch.equal(pos.sin, angles.sin())


@pytest.mark.parametrize(
    "params",
    [  # gpt-oss's (no truncation, the default attention factor) and DeepSeek-V3's (mscale)
        {"factor": 32.0, "original_max_position_embeddings": 16, "beta_fast": 32.0,
         "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0},
        {"factor": 40.0, "original_max_position_embeddings": 16, "beta_fast": 32, "beta_slow": 1,
         "mscale": 1.0, "mscale_all_dim": 0.707, "rope_theta": 10000.0},
        {"factor": 4.0, "original_max_position_embeddings": 16, "attention_factor": 1.25,
         "rope_theta": 10000.0},
    ],
    ids=["gpt-oss", "deepseek", "given"],
)
def test_yarn_tables_and_attention_factor_are_transformers_own(params: dict[str, Any]) -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(hidden_size=128, num_attention_heads=2, max_position_embeddings=96,
                         rope_parameters={"rope_type": "yarn", **params})  # fmt: skip
    hf_inv, hf_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    args = {k: v for k, v in params.items() if k != "original_max_position_embeddings"}
    args["theta"] = args.pop("rope_theta")
    args["original_context_length"] = params["original_max_position_embeddings"]
    inner = ", ".join(f"{k}={str(v).lower()}" for k, v in args.items())
    model = build_model("vocab_size=97, context_length=96, d_model=128, num_layers=1, "
                        f"num_heads=2, pos=rope(scaling=yarn, {inner})")  # fmt: skip
    pos = model.pos
    assert isinstance(pos, RotaryPositionalEmbedding)
    angles = torch.arange(96, dtype=torch.float32)[:, None] * hf_inv[None, :]
    assert hf_factor != 1.0
    assert torch.equal(pos.cos, angles.cos() * hf_factor)
    assert torch.equal(pos.sin, angles.sin() * hf_factor)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def test_a_partial_rotation_is_gpt_neoxs_after_the_half_split_permutation() -> None:
    """GPT-NeoX rotates the first `rotary_ndims` dimensions of each head with rotate_half
    (pairs (i, i + r/2)) and passes the rest; lmcore rotates interleaved pairs. Permuting each
    head's first r dimensions from the half-split to the interleaved order maps one on the
    other (what a converter does to q_proj and k_proj rows)."""
    torch.manual_seed(0)
    head, frac, theta = 16, 0.25, 10000.0
    r = int(head * frac)
    rope = RotaryPositionalEmbedding(theta, head, 32, rotary_dim=r)
    x = torch.randn(2, 3, 10, head)  # (B, H, T, D) in GPT-NeoX's layout
    positions = torch.arange(5, 15)[None].expand(2, -1)
    inv = 1.0 / theta ** (torch.arange(0, r, 2, dtype=torch.float32) / r)
    freqs = positions[..., None].float() * inv
    cos, sin = (
        torch.cat((freqs, freqs), -1).cos()[:, None],
        torch.cat((freqs, freqs), -1).sin()[:, None],
    )
    rot, rest = x[..., :r], x[..., r:]
    neox = torch.cat((rot * cos + _rotate_half(rot) * sin, rest), dim=-1)
    order = torch.tensor([i for k in range(r // 2) for i in (k, k + r // 2)] + list(range(r, head)))
    ours = rope.rotation(positions)(x[..., order])
    torch.testing.assert_close(ours, neox[..., order], rtol=1e-5, atol=1e-6)
    assert torch.equal(ours[..., r:], x[..., r:])  # the rest passes through unchanged


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("fraction=0.1", r"int\(head_dim · fraction\) = int\(16 · 0.1\) = 1 is odd"),
        ("fraction=1.5", r"fraction=1.5 is the share of each head to rotate, at most 1.0"),
        ("factor=8.0", r"factor=8.0 has no effect with scaling=none"),
        ("scaling=linear, low_freq_factor=2.0", r"low_freq_factor=2.0 has no effect with scaling"),
        ("scaling=llama3, low_freq_factor=4.0", r"high_freq_factor=4.0 must exceed low_freq"),
        ("scaling=longrope", r"'scaling' of pos 'rope' must be one of linear, llama3, none, yarn, got 'longrope'"),
        ("scaling=llama3, beta_fast=16.0", r"beta_fast=16.0 has no effect with scaling=llama3; "
         r"it applies with scaling=yarn"),
        ("scaling=linear, truncate=false", r"truncate=false has no effect with scaling=linear"),
        ("scaling=yarn, beta_fast=1.0, beta_slow=2.0", r"beta_fast=1.0 must exceed beta_slow=2.0"),
    ],
)
def test_bad_options_are_spec_errors(args: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        lmcore.parse_spec(f"cs336-tiny, pos=rope({args})")


SCALED = ("fraction", 0.5), ("scaling", "llama3"), ("factor", 4.0), ("original_context_length", 8)


@pytest.mark.parametrize("overrides", [(("fraction", 0.5),), SCALED], ids=["partial", "llama3"])
def test_options_pass_the_conformance_kit(overrides: tuple[tuple[str, Any], ...]) -> None:
    target = Target(get_registry().get("pos", "rope"), overrides)
    for check in CHECKS:
        if check.applies_to(target):
            for variant in check.variants:
                Case(check, target, variant).run(Settings(compile_backend="aot_eager"))


def test_a_partially_rotated_scaled_model_decodes_with_the_cache_as_without() -> None:
    torch.manual_seed(0)
    args = ", ".join(f"{k}={v}" for k, v in SCALED)
    model = build_model(f"cs336-tiny, vocab_size=97, pos=rope({args})").eval()
    prompt = torch.randint(0, 97, (2, 4))
    assert torch.equal(model.generate(prompt, 8, GREEDY),
                       model.generate(prompt, 8, GREEDY, cache=False))  # fmt: skip
