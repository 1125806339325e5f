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
# DeepSeek's YaRN: mscale / mscale_all_dim scale cos and sin by their ratio, the softmax by
# mscale(factor, mscale_all_dim)²; with qk_rope_head_dim 4 one frequency is kept, one divided.
_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0,
         "beta_slow": 1.0, "mscale": 0.8, "mscale_all_dim": 1.0,
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
    # DeltaNet on layers 0 and 2, gated attention on 1 and 3; experts everywhere but layer 2.
    "qwen3_next": dict(_SIZES, num_hidden_layers=4, full_attention_interval=2, head_dim=16,
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                       linear_value_head_dim=12, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=24, shared_expert_intermediate_size=20,
                       mlp_only_layers=[2]),
    # local layers 0 and 2 (base 50, window 6), global 1 and 3 (base 1,000, linear scaling)
    "gemma3_text": dict(_SIZES, num_hidden_layers=4, head_dim=8, sliding_window=6,
                        sliding_window_pattern=2, rope_theta=1000.0, rope_local_base_freq=50.0,
                        rope_scaling={"rope_type": "linear", "factor": 2.0},
                        query_pre_attn_scalar=16),
    "smollm3": dict(_SIZES, num_hidden_layers=4, no_rope_layer_interval=2, pad_token_id=0,
                    bos_token_id=1, eos_token_id=2,
                    use_sliding_window=True, sliding_window=6),
    "olmo3": dict(_SIZES, num_hidden_layers=4, sliding_window=6, pad_token_id=0,
                  eos_token_id=2, rope_parameters={
                      "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
                      "full_attention": {"rope_type": "linear", "factor": 2.0,
                                         "rope_theta": 10000.0}}),
    "lfm2": dict(_SIZES, num_hidden_layers=3, intermediate_size=72, block_multiple_of=16,
                 block_ffn_dim_multiplier=1.3, conv_bias=True, norm_eps=1e-5, rope_theta=500.0,
                 layer_types=["conv", "full_attention", "conv"], pad_token_id=0,
                 bos_token_id=1, eos_token_id=2),
    # layer 0 slides (transformers' default layer_types), the clamps bite at 0.5, gpt-oss's
    # YaRN (untruncated) over 4 × 16 positions
    "gpt_oss": dict(_SIZES, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                    sliding_window=6, swiglu_limit=0.5,
                    rope_parameters={"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0,
                                     "original_max_position_embeddings": 16, "beta_fast": 32.0,
                                     "beta_slow": 1.0, "truncate": False}),
    "deepseek_v3": dict(_SIZES, num_hidden_layers=3, num_key_value_heads=4, first_k_dense_replace=1,
                        n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2,
                        n_shared_experts=1, moe_intermediate_size=16, routed_scaling_factor=2.5,
                        q_lora_rank=12, kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=4,
                        v_head_dim=8, rope_parameters=_YARN),
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
    perturbed (norm gains and biases too, and DeepSeek-V3's score-correction bias, so they
    matter), saved to `directory`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(name, **FAMILY_CONFIGS[name])
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    perturb(model)
    with torch.no_grad():  # DeepSeek-V3's score correction, a saved buffer: it changes choices
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.add_(0.1 * torch.randn_like(buffer))
    model.save_pretrained(directory)
    return model
