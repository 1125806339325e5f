"""Tiny random transformers models saved as Hugging Face model directories."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.models import perturb

# ---------------------------------------------------------------------------------------------
# Hugging Face interop: tiny random transformers models, saved as model directories
# ---------------------------------------------------------------------------------------------


def quiet_transformers() -> Any:
    """transformers (a test-only dependency; a module that calls this at import is skipped
    without it), its logging and progress bars silenced."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


# The lmcore spec of `random_llama`'s model, and the logits both must give (float32).
HF_SPEC = "vocab_size=97, context_length=32, d_model=32, num_layers=2, num_heads=4, d_ff=48"
HF_TOLERANCE = 1e-5  # max abs logit difference

LLAMA_V4 = {  # a transformers 4 config.json
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 97,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32,
    "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1,
    "eos_token_id": 2, "pretraining_tp": 1, "transformers_version": "4.45.0",
}  # fmt: skip


def random_llama(
    directory: Path, *, kv_heads: int = 2, tie: bool = False, shard: bool = False, **config: Any
) -> Any:
    """A small random Llama, every weight perturbed (RMSNorm gains too), saved to `directory`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=32,
        rms_norm_eps=1e-5, rope_theta=500.0, tie_word_embeddings=tie, **config,
    )  # fmt: skip
    model = perturb(LlamaForCausalLM(cfg).eval())
    model.save_pretrained(directory, max_shard_size="20KB" if shard else "5GB")
    return model


def hf_logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits: torch.Tensor = model(ids).logits
    return logits


def lm_logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits: torch.Tensor = model(ids)
    return logits


# One tiny config per family lmcore converts, each using what sets the family apart.
HF_VOCAB = 97
_SIZES: dict[str, Any] = dict(
    vocab_size=HF_VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
)  # fmt: skip
_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 16}  # fmt: skip
FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": dict(_SIZES, rope_scaling=_LLAMA3, rope_theta=500.0),
    "mistral": dict(_SIZES, sliding_window=6),
    "qwen2": dict(_SIZES, use_sliding_window=True, sliding_window=6, max_window_layers=1),
    "qwen3": dict(_SIZES, head_dim=16, tie_word_embeddings=True),
    "gemma": dict(_SIZES, head_dim=8),
    "gemma2": dict(_SIZES, head_dim=8, sliding_window=6, query_pre_attn_scalar=8,
                   attn_logit_softcapping=5.0, final_logit_softcapping=3.0),
    "olmo2": dict(_SIZES),
    "phi3": dict(_SIZES, partial_rotary_factor=0.5, pad_token_id=0),
    "gpt2": dict(vocab_size=HF_VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                 scale_attn_by_inverse_layer_idx=True),
    "gpt_neox": dict(vocab_size=HF_VOCAB, hidden_size=32, intermediate_size=64,
                     num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
                     rotary_pct=0.5),
    "mixtral": dict(_SIZES, num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(_SIZES, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                      head_dim=8, norm_topk_prob=True, mlp_only_layers=[1]),
    # Two groups of B and C over eight heads, chunks of 8 (the 24-token prompt is three), biases.
    "mamba2": dict(vocab_size=HF_VOCAB, hidden_size=32, num_hidden_layers=2, num_heads=8,
                   head_dim=8, state_size=8, n_groups=2, chunk_size=8, use_bias=True),
    # Every multiplier away from 1, Mamba-2 of its own width with its norm after the gate.
    "falcon_h1": dict(_SIZES, mamba_d_ssm=48, mamba_n_heads=6, mamba_d_head="auto",
                      mamba_n_groups=2, mamba_d_state=8, mamba_chunk_size=8, mamba_rms_norm=True,
                      mamba_norm_before_gate=True, mamba_proj_bias=True, projectors_bias=False,
                      key_multiplier=0.7, embedding_multiplier=1.5, lm_head_multiplier=0.8,
                      mlp_multipliers=[0.9, 0.6], attention_in_multiplier=1.2,
                      attention_out_multiplier=0.8, ssm_in_multiplier=0.9, ssm_out_multiplier=1.1,
                      ssm_multipliers=[0.5, 1.5, 0.8, 1.25, 0.7], rope_theta=500.0),
}  # fmt: skip


def random_family_model(name: str, directory: Path) -> Any:
    """A tiny random model of family `name` (`FAMILY_CONFIGS`), eager attention, every weight
    perturbed (norm gains and biases too, so they matter), saved to `directory`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(name, **FAMILY_CONFIGS[name])
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    perturb(model)
    model.save_pretrained(directory)
    return model
