"""plugins/lmcore_blocks.py: each block computes its row's formula with the sub-layers and
norms it holds, and keeps them under the names its declaration lists."""

from __future__ import annotations

import pytest
import torch

from lmcore import build_model
from lmcore.interfaces import LayerContext

BASE = "vocab_size=50, context_length=8, d_model=16, num_layers=1, num_heads=2, norm=layernorm"


def formula(name: str, block: torch.nn.Module, x: torch.Tensor, c: LayerContext) -> torch.Tensor:
    """Each row's formula, written out from its docstring."""
    attn, ffn = block.attn, block.ffn
    if name == "prenorm":
        y = x + attn(block.ln1(x), c)
        return y + ffn(block.ln2(y))
    if name == "postnorm":
        y = block.ln1(x + attn(x, c))
        return block.ln2(y + ffn(y))
    if name == "sandwich":
        y = x + block.ln1_out(attn(block.ln1(x), c))
        return y + block.ln2_out(ffn(block.ln2(y)))
    if name == "reordered":
        y = x + block.ln1_out(attn(x, c))
        return y + block.ln2_out(ffn(y))
    second = block.ln1 if block.ln2 is None else block.ln2
    return ffn(second(x)) + attn(block.ln1(x), c) + x


@pytest.mark.parametrize(
    "block, norms",
    [("prenorm", ["ln1", "ln2"]), ("postnorm", ["ln1", "ln2"]),
     ("sandwich", ["ln1", "ln1_out", "ln2", "ln2_out"]), ("reordered", ["ln1_out", "ln2_out"]),
     ("parallel", ["ln1"]), ("parallel(norms=2)", ["ln1", "ln2"])],
)  # fmt: skip
def test_each_block_computes_its_formula_with_the_norms_it_declares(
    block: str, norms: list[str]
) -> None:
    torch.manual_seed(0)
    model = build_model(f"{BASE}, block={block}")
    layer = model.layers[0]
    with torch.no_grad():  # distinct norm gains, so a swapped norm would show
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    names = sorted({k.split(".")[0] for k, _ in layer.named_parameters()} - {"attn", "ffn"})
    assert names == sorted(norms)
    x = torch.randn(2, 5, 16)
    context = LayerContext(rotation=model.pos.rotation(torch.arange(5).expand(2, 5)))
    with torch.no_grad():
        torch.testing.assert_close(
            layer(x, context), formula(block.split("(")[0], layer, x, context)
        )


def test_a_parallel_block_takes_one_norm_or_two() -> None:
    with pytest.raises(ValueError, match="norms=3"):
        build_model(f"{BASE}, block=parallel(norms=3)")


def without_ffn(
    name: str, block: torch.nn.Module, x: torch.Tensor, c: LayerContext
) -> torch.Tensor:
    """Each row's formula with no feed-forward sub-layer (`ffn=none`)."""
    attn = block.attn
    if name == "prenorm":
        return x + attn(block.ln1(x), c)
    if name == "postnorm":
        return block.ln1(x + attn(x, c))
    if name == "sandwich":
        return x + block.ln1_out(attn(block.ln1(x), c))
    if name == "reordered":
        return x + block.ln1_out(attn(x, c))
    return attn(block.ln1(x), c) + x


@pytest.mark.parametrize(
    "block, norms",
    [("prenorm", ["ln1"]), ("postnorm", ["ln1"]), ("sandwich", ["ln1", "ln1_out"]),
     ("reordered", ["ln1_out"]), ("parallel", ["ln1"]), ("parallel(norms=2)", ["ln1"])],
)  # fmt: skip
def test_with_ffn_none_each_block_wires_the_mixer_alone_and_counts_nothing_more(
    block: str, norms: list[str]
) -> None:
    """No ffn call, no ffn norm (`ln2`, `ln2_out`): nothing held, and the accounting's
    parameters, norm rows and the q_proj's kept input (it is no longer shared) agree."""
    from lmcore.describe import check_params
    from lmcore.model.counting import account

    torch.manual_seed(0)
    spec = f"{BASE}, block={block}, ffn=none"
    model = build_model(spec)
    layer = model.layers[0]
    names = sorted({k.split(".")[0] for k, _ in layer.named_parameters()} - {"attn"})
    assert names == sorted(norms) and not list(layer.ffn.parameters())
    acc = account(spec)
    check_params(acc, model)
    assert acc.params == sum(p.numel() for p in model.parameters())
    assert acc.row("layers.*.ffn").params == acc.row("layers.*.ffn").flops == 0
    assert acc.row("layers.*.attn.q_proj").activations
    x = torch.randn(2, 5, 16)
    context = LayerContext(rotation=model.pos.rotation(torch.arange(5).expand(2, 5)))
    with torch.no_grad():
        torch.testing.assert_close(
            layer(x, context), without_ffn(block.split("(")[0], layer, x, context)
        )
