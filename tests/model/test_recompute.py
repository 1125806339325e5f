"""Activation recomputation: the grammar, which modules it wraps, and gradients equal to a
model that keeps its activations."""

from __future__ import annotations

import pytest
import torch

from lmcore.describe import saved_activation_bytes
from lmcore.model.nn import cross_entropy
from lmcore.model.recompute import RecomputeError, apply_recompute, plan, targets
from lmcore.model.transformer import TransformerLM
from tests.helpers.errors import raises_naming

SPEC = "vocab_size=300, context_length=16, d_model=32, num_layers=2, num_heads=2, d_ff=64"
# a hybrid (mamba2 and attention layers) whose FFNs are a mixture of experts with an aux loss
HYBRID = (
    "vocab_size=300, context_length=16, d_model=32, num_layers=3, num_heads=2, d_ff=64, "
    "mixer[1]=mamba2(d_state=16), ffn=moe(num_experts=4, top_k=2, aux_loss_coef=0.5)"
)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("layers", "layers"),
        ("all", "layers"),
        (" mixer , ffn,mixer ", "mixer,ffn"),
        ("ffn,layers", "layers"),  # every whole layer holds its parts
        ("layers:mamba2, ffn", "layers:mamba2,ffn"),
        ("all:attention", "layers:attention"),
    ],
)
def test_the_grammar_is_written_canonically(text: str, canonical: str) -> None:
    assert targets(text) == canonical


def test_a_bad_value_is_named_with_the_targets() -> None:
    with raises_naming(RecomputeError, "'layer' is not a target", "layers, mixer, ffn",
                       "did you mean 'layers'?"):  # fmt: skip
        targets("layer")
    with raises_naming(RecomputeError, "'ffn:'", "TARGET:MIXER"):
        targets("ffn:")
    with raises_naming(RecomputeError, "names no target"):
        targets(" , ")


def test_the_plan_takes_whole_layers_for_their_parts_and_mixers_by_name() -> None:
    mixers = ["attention", "mamba2", "attention"]
    assert plan(mixers, "layers") == [(0, "layers"), (1, "layers"), (2, "layers")]
    assert plan(mixers, "ffn,mixer") == [(i, t) for i in range(3) for t in ("mixer", "ffn")]
    assert plan(mixers, "layers:mamba2,ffn") == [(0, "ffn"), (1, "layers"), (2, "ffn")]
    with raises_naming(RecomputeError, "no layer's mixer is 'mamba'", "attention, mamba2",
                       "did you mean 'mamba2'?"):  # fmt: skip
        plan(mixers, "mixer:mamba")


def grads(model: TransformerLM, x: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = cross_entropy(model(x), torch.roll(x, -1, dims=1))
    aux = model.aux_loss()
    (loss if aux is None else loss + aux).backward()
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.item(), out


@pytest.mark.parametrize(
    ("spec", "text", "wrapped"),
    [
        (SPEC, "layers", ["layers.0", "layers.1"]),
        (SPEC, "mixer,ffn", ["layers.0.attn", "layers.0.ffn", "layers.1.attn", "layers.1.ffn"]),
        (HYBRID, "layers:mamba2,ffn", ["layers.0.ffn", "layers.1", "layers.2.ffn"]),
        (HYBRID, "layers", ["layers.0", "layers.1", "layers.2"]),
    ],
)
def test_recomputed_gradients_equal_kept_ones(spec: str, text: str, wrapped: list[str]) -> None:
    torch.manual_seed(0)
    keep = TransformerLM(spec)
    again = TransformerLM(spec)
    again.load_state_dict(keep.state_dict())
    assert apply_recompute(again, text) == wrapped
    assert apply_recompute(again, text) == wrapped  # once: a second call wraps nothing twice
    assert again.state_dict().keys() == keep.state_dict().keys()
    x = torch.randint(0, 300, (2, 16))
    loss_a, grads_a = grads(keep, x)
    loss_b, grads_b = grads(again, x)
    assert loss_a == loss_b
    assert grads_a.keys() == grads_b.keys() == {n for n, _ in keep.named_parameters()}
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-6, atol=1e-7)
    with torch.no_grad():  # without gradients the forward runs as it is
        torch.testing.assert_close(again(x), keep(x), rtol=0, atol=0)


def test_recomputed_layers_keep_less_for_backward() -> None:
    """What autograd's own hooks see outside the recomputed layers: the whole layers' saved
    tensors are gone (their inputs the checkpoint holds itself)."""
    torch.manual_seed(0)
    model = TransformerLM(SPEC)
    x = torch.randint(0, 300, (2, 16))

    def run() -> torch.Tensor:
        return cross_entropy(model(x), torch.roll(x, -1, dims=1))

    kept = saved_activation_bytes(model, run)
    apply_recompute(model, "layers")
    assert saved_activation_bytes(model, run) < kept / 2


def test_a_mixer_the_model_lacks_is_refused() -> None:
    with raises_naming(RecomputeError, "no layer's mixer is 'mamba2'", "attention"):
        apply_recompute(TransformerLM(SPEC), "layers:mamba2")
