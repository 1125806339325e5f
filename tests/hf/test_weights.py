"""Hugging Face tensor names and lmcore's keys (`lmcore.hf.weights`): the rotary permutation
between rotate-half and interleaved pairs, and a directory's tensors checked against its config,
every problem listed at once."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lmcore import ConversionError
from lmcore.hf import load_llama, permute_from_hf, permute_to_hf
from tests.helpers.errors import raises_naming
from tests.helpers.hf import hf_logits, lm_logits, quiet_transformers, random_llama
from tests.helpers.models import token_ids

transformers = quiet_transformers()
from transformers import LlamaConfig  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402


def test_the_rotary_permutation_keeps_every_attention_score() -> None:
    """q·k after Hugging Face's rotate_half RoPE on HF-layout projections equals q·k after
    lmcore's interleaved RoPE on the permuted projections, at every pair of positions."""
    from lmcore_rope import RotaryPositionalEmbedding

    torch.manual_seed(0)
    heads, kv_heads, d, d_model, seq = 4, 2, 8, 32, 12
    wq, wk = torch.randn(heads * d, d_model), torch.randn(kv_heads * d, d_model)
    x = torch.randn(1, seq, d_model)
    positions = torch.arange(seq)[None]

    def split(t: torch.Tensor, h: int) -> torch.Tensor:
        return t.view(1, seq, h, d).transpose(1, 2)  # (B, H, T, D)

    config = LlamaConfig(hidden_size=d_model, num_attention_heads=heads, rope_theta=500.0,
                         max_position_embeddings=seq)  # fmt: skip
    cos, sin = modeling_llama.LlamaRotaryEmbedding(config=config)(x, positions)
    q_hf, k_hf = modeling_llama.apply_rotary_pos_emb(
        split(x @ wq.T, heads), split(x @ wk.T, kv_heads), cos, sin
    )
    rope = RotaryPositionalEmbedding(500.0, d, seq)
    q_ours = rope(split(x @ permute_from_hf(wq, heads).T, heads), positions)
    k_ours = rope(split(x @ permute_from_hf(wk, kv_heads).T, kv_heads), positions)
    scores_hf = q_hf @ k_hf.repeat_interleave(2, dim=1).transpose(-1, -2)
    scores_ours = q_ours @ k_ours.repeat_interleave(2, dim=1).transpose(-1, -2)
    assert torch.allclose(scores_ours, scores_hf, atol=1e-4, rtol=1e-5)
    assert torch.equal(permute_to_hf(permute_from_hf(wq, heads), heads), wq)
    # Row 2i + 1 of a head is Hugging Face's row i + D/2.
    assert torch.equal(permute_from_hf(wq, heads)[d + 3], wq[d + 1 + d // 2])


def test_missing_unexpected_and_misshapen_tensors_are_listed(tmp_path: Path) -> None:
    random_llama(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    state["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(32)
    state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.zeros(4)  # derived: skipped
    state["model.norm.weight"] = torch.ones(31)  # the probe: this one went unmentioned
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with raises_naming(
        ConversionError,
        "not those of a LlamaForCausalLM with this config",
        "missing (1): model.layers.1.mlp.up_proj.weight",
        "unexpected (1): model.layers.0.self_attn.q_proj.bias",
        # the last problem listed: the derived inv_freq is not one
        re.compile(r"wrong shape \(1\): model\.norm\.weight \(file \(31,\), model \(32,\)\)$"),
    ):
        load_llama(tmp_path)


def test_a_derived_inv_freq_buffer_is_skipped(tmp_path: Path) -> None:
    reference = random_llama(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.zeros(4)
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    ids = token_ids(seq=32, seed=3)
    assert (lm_logits(load_llama(tmp_path), ids) - hf_logits(reference, ids)).abs().max() <= 1e-5
