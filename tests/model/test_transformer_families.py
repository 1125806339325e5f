"""Tiny specs of today's families that use the feed-forward, rotary, norm and mixture-of-experts
vocabulary: each round-trips its canonical string, is counted as built, decodes with the cache
as without it, and saves and loads bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import lmcore
from lmcore.model.counting import account
from lmcore.model.generate import GREEDY

BASE = "vocab_size=97, context_length=32, d_model=64, num_layers=2, num_heads=4"


FAMILIES = {
    "llama-3.1": f"{BASE}, num_kv_heads=2, d_ff=128, "
    "pos=rope(theta=500000.0, scaling=llama3, factor=8.0, original_context_length=16)",
    "gpt-2": f"{BASE}, tie_embeddings=true, norm=layernorm, ffn=gelu(bias=true, approximate=tanh), "
    "pos=learned, qkv_bias=true, out_bias=true",
    "gpt-neox": f"{BASE}, block=parallel(norms=2), norm=layernorm, ffn=gelu(bias=true), "
    "pos=rope(fraction=0.25), qkv_bias=true, out_bias=true",
    "gemma": f"{BASE}, num_kv_heads=1, d_ff=128, tie_embeddings=true, embed_scale=8.0, "
    "norm=rmsnorm(eps=1e-6, zero_centered=true), ffn=geglu(approximate=tanh)",
    "mixtral": f"{BASE}, num_kv_heads=2, d_ff=64, "
    "ffn=moe(num_experts=4, top_k=2, renormalize=true, aux_loss_coef=0.02)",
    "qwen3-moe": f"{BASE}, num_kv_heads=2, head_dim=32, d_ff=32, qk_norm=rmsnorm(eps=1e-6), "
    "norm=rmsnorm(eps=1e-6), pos=rope(theta=1000000.0), "
    "ffn=moe(num_experts=8, top_k=2, renormalize=true, aux_loss_coef=0.001), "
    "ffn[0]=swiglu, d_ff[0]=128",
}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_spec_builds_decodes_and_round_trips(family: str, tmp_path: Path) -> None:
    spec = lmcore.parse_spec(FAMILIES[family])
    assert lmcore.parse_spec(str(spec)) == spec
    torch.manual_seed(0)
    model = lmcore.build_model(spec).eval()
    assert account(spec).params == sum(p.numel() for p in model.parameters())
    prompt = torch.randint(0, 97, (2, 5))
    cached = model.generate(prompt, 10, GREEDY)
    assert torch.equal(cached, model.generate(prompt, 10, GREEDY, cache=False))
    loaded = lmcore.load(model.save(tmp_path / "m.safetensors"))
    x = torch.randint(0, 97, (2, 32))
    assert str(loaded.spec) == str(model.spec) and torch.equal(loaded(x), model(x))
