"""Every component declares the role of every parameter it creates, and the roles say what the
code does: a packed tensor's splits are the sizes its forward splits it into."""

from __future__ import annotations

import pytest
import torch

import lmcore
from lmcore.model.roles import CONV, EMBEDDING, GAIN, HEAD, ROUTER, SCALAR, Role, roles_of
from tests.helpers.models import components, spec_for



def _roles(spec: str) -> tuple[torch.nn.Module, dict[str, Role]]:
    model = lmcore.build_model(spec)
    return model, roles_of(model)


@pytest.mark.parametrize(
    ("kind", "name"), components(), ids="{0[0]}={0[1]}".format
)
def test_every_registered_component_declares_every_parameter(kind: str, name: str) -> None:
    model, roles = _roles(spec_for(kind, name))
    trainable = {n for n, p in model.named_parameters()}
    assert set(roles) == trainable


def test_the_tied_head_is_one_embedding_and_an_untied_one_the_head() -> None:
    _, tied = _roles("cs336-tiny, tie_embeddings=true")
    assert tied["token_embeddings.weight"] == EMBEDDING and "lm_head.weight" not in tied
    _, untied = _roles("cs336-tiny")
    assert untied["token_embeddings.weight"] == EMBEDDING and untied["lm_head.weight"] == HEAD
    assert untied["layers.0.ln1.weight"] == GAIN


def test_mamba2s_input_projection_packs_z_x_b_c_and_dt() -> None:
    model, roles = _roles("cs336-tiny, mixer=mamba2(n_groups=2)")
    layer = model.layers[0].attn
    G, N, H = layer.n_groups, layer.d_state, layer.num_heads
    role = roles["layers.0.attn.in_proj.weight"]
    assert role.name == "packed"
    assert role.splits == (layer.inner, layer.inner, G * N, G * N, H)
    assert sum(role.splits[1:4]) == layer.conv_dim  # x, B and C go through the convolution
    for p in ("dt_bias", "A_log", "D"):
        assert roles[f"layers.0.attn.{p}"] == SCALAR
    assert roles["layers.0.attn.conv1d.weight"] == CONV
    assert roles["layers.0.attn.norm.weight"] == GAIN


def test_gated_deltanets_projections_pack_each_key_heads_matrices() -> None:
    model, roles = _roles("cs336-tiny, mixer=gated_deltanet(num_k_heads=2, num_v_heads=4)")
    layer = model.layers[0].attn
    hk, hv, dk, dv = layer.num_k_heads, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim
    group = hv // hk
    qkvz = roles["layers.0.attn.in_proj_qkvz.weight"]
    assert qkvz.splits == (dk, dk, group * dv, group * dv) * hk
    x = torch.randn(1, 3, model.spec.d_model)
    with torch.no_grad():  # the forward's view: per key head q, k, v, z, in that order
        flat = layer.in_proj_qkvz(x)
        pieces = flat.split(list(qkvz.splits), dim=-1)
        by_head = flat.view(1, 3, hk, -1).split([dk, dk, group * dv, group * dv], dim=-1)
    torch.testing.assert_close(pieces[4], by_head[0][:, :, 1])  # key head 1's q
    torch.testing.assert_close(pieces[7], by_head[3][:, :, 1])  # key head 1's z
    assert roles["layers.0.attn.in_proj_ba.weight"].splits == (group, group) * hk


def test_mlas_latent_projections_are_packed_by_what_they_compute() -> None:
    model, roles = _roles("cs336-tiny, mixer=mla(q_lora_rank=8)")
    layer = model.layers[0].attn
    kv_a = roles["layers.0.attn.kv_a_proj_with_mqa.weight"]
    assert kv_a.splits == (layer.kv_lora_rank, layer.rope)
    kv_b = roles["layers.0.attn.kv_b_proj.weight"]
    assert kv_b.splits == (layer.nope, layer.v_dim) * layer.num_heads
    assert roles["layers.0.attn.q_a_layernorm.weight"] == GAIN
    assert roles["layers.0.attn.q_b_proj.weight"].name == "matrix"


def test_short_conv_moe_sinks_and_learned_positions() -> None:
    _, roles = _roles("cs336-tiny, mixer=short_conv(bias=true)")
    assert roles["layers.0.attn.in_proj.weight"].splits == (64, 64, 64)
    assert roles["layers.0.attn.conv_weight"] == CONV
    assert roles["layers.0.attn.conv_bias"].name == "bias"
    _, roles = _roles("cs336-tiny, ffn=moe(shared=swiglu, shared_gate=sigmoid)")
    assert roles["layers.0.ffn.router.weight"] == ROUTER
    assert roles["layers.0.ffn.shared_gate.weight"] == ROUTER
    assert roles["layers.0.ffn.experts.0.w1.weight"].name == "matrix"
    _, roles = _roles("cs336-tiny, attn_sinks=true, pos=learned")
    assert roles["layers.0.attn.sinks"] == SCALAR
    assert roles["pos.weight"] == EMBEDDING
    _, roles = _roles("cs336-tiny, norm=layernorm")
    assert roles["layers.0.ln1.weight"] == GAIN and roles["layers.0.ln1.bias"].name == "bias"
