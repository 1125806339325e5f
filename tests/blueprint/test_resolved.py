"""The `Blueprint`: the canonical spec and one entry per kind; `kwargs(slot)`, the one rule for
what a component receives (a kernel without the 'gqa' feature gets num_heads key/value heads)."""

from __future__ import annotations

import pytest
import torch

from lmcore import Component, build_model, parse_spec, resolve, scoped_registry
from lmcore.components import KINDS
from lmcore.model.counting import account
from lmcore_sdpa import SDPA
from tests.helpers.plugins import plain_kernel


def test_resolve_holds_the_canonical_spec_and_one_entry_per_kind() -> None:
    bp = resolve("tinystories, pos=nope")
    assert bp.spec == parse_spec("tinystories, pos=nope")
    assert str(bp) == str(bp.spec)
    assert set(bp.entries) == set(KINDS)
    assert bp.component("pos").name == "nope"
    assert bp.provenance("norm").dist == "lmcore-registry"


def sdpa_without_gqa() -> Component:
    """sdpa without the gqa feature: lmcore must repeat k and v for it."""
    return plain_kernel(
        frozenset({"bias", "mask"}),
        flops=lambda num_heads, head_dim, seq_len, kv_len: (
            4 * num_heads * seq_len * kv_len * head_dim
        ),
    )


def test_a_kernel_without_gqa_is_built_and_counted_for_num_heads() -> None:
    received: list[dict[str, int]] = []

    def build(num_heads: int, num_kv_heads: int, head_dim: int) -> SDPA:
        received.append({"num_heads": num_heads, "num_kv_heads": num_kv_heads})
        return SDPA()

    def flops(num_heads: int, num_kv_heads: int, head_dim: int, seq_len: int, kv_len: int) -> int:
        received.append({"num_heads": num_heads, "num_kv_heads": num_kv_heads})
        return 4 * num_heads * seq_len * kv_len * head_dim

    kernel = Component(kind="attn", name="plain", build=build, flops=flops)
    with scoped_registry() as reg:
        reg.add(kernel)
        bp = resolve("cs336-tiny, num_kv_heads=1, attn=plain")
        assert bp.kwargs("attn") == {"num_heads": 4, "num_kv_heads": 4, "head_dim": 16, "window": 0,
                                       "attn_sinks": False}
        assert resolve("cs336-tiny, num_kv_heads=1").kwargs("attn")["num_kv_heads"] == 1
        build_model(bp, device="meta")
        account(bp)
    assert received and all(r == {"num_heads": 4, "num_kv_heads": 4} for r in received)


@pytest.mark.parametrize("kv_heads", [1, 2])  # multi-query and grouped-query
def test_a_kernel_without_gqa_gives_the_logits_of_the_gqa_path(kv_heads: int) -> None:
    spec = f"cs336-tiny, num_kv_heads={kv_heads}"
    torch.manual_seed(0)
    gqa = build_model(spec)
    with scoped_registry() as reg:
        reg.add(sdpa_without_gqa())
        plain = build_model(f"{spec}, attn=plain")
    plain.load_state_dict(gqa.state_dict(), strict=True)
    ids = torch.randint(0, 10_000, (2, 16), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(plain(ids), gqa(ids), rtol=1e-5, atol=1e-5)
    assert not plain.blueprint.kernel_gqa and gqa.blueprint.kernel_gqa


# ------------------------------------------------------------- layers that repeat (issue 32)


def test_a_uniform_model_is_one_group_whatever_its_layer_count() -> None:
    """num_layers=10**12 resolves: its layers are one group, a range, never a per-layer tuple
    (which was a MemoryError in describe and build)."""
    bp = resolve("tinystories, num_layers=1000000000000")
    [(layers, group)] = bp.groups()
    assert layers == range(10**12) and group is bp
    assert bp.layer(0) is bp and bp.layer(10**12 - 1) is bp and bp.layer(-1) is bp
    with pytest.raises(IndexError):
        bp.layer(10**12)
    assert "layers" not in vars(bp)  # the per-layer tuple (for building only) was never made


def test_a_per_layer_model_groups_its_identical_layers() -> None:
    bp = resolve("cs336-tiny, num_layers=5, ffn[1::2]=gelu")
    assert [(tuple(ls), g.spec.ffn.name) for ls, g in bp.groups()] == [
        ((0, 2, 4), "swiglu"),
        ((1, 3), "gelu"),
    ]
