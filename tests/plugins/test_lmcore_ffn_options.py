"""The feed-forward rows' options: biases and the tanh GELU, against their formulas and against
GPT-2's, GPT-NeoX's and Gemma's MLPs in transformers on the same weights; defaults unchanged."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from lmcore import build_model, get_registry
from lmcore.model.nn import gelu_tanh, gelu_tanh_derivative
from lmcore.testing import CHECKS, Case, Settings, Target
from lmcore_ffn import GEGLU, GELUFeedForward, SiLUFeedForward, SwiGLU

SMALL = "vocab_size=97, context_length=16, d_model=32, num_layers=2, num_heads=2, d_ff=48"


def test_gelu_tanh_is_the_tanh_formula_and_its_derivative_is_autograds() -> None:
    x = torch.linspace(-8, 8, 2001, dtype=torch.float64)
    expected = 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x**3)))
    torch.testing.assert_close(gelu_tanh(x), expected, rtol=0, atol=1e-15)
    torch.testing.assert_close(gelu_tanh(x), F.gelu(x, approximate="tanh"), rtol=0, atol=1e-14)
    xr = x.clone().requires_grad_()
    F.gelu(xr, approximate="tanh").sum().backward()
    value, slope = gelu_tanh_derivative(x)
    torch.testing.assert_close(value, gelu_tanh(x), rtol=0, atol=1e-15)
    torch.testing.assert_close(slope, xr.grad, rtol=0, atol=1e-13)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_biases_and_the_tanh_gelu_match_the_formula_forward_and_backward(
    gated: bool, approximate: str
) -> None:
    torch.manual_seed(0)
    factory = GEGLU if gated else GELUFeedForward
    ffn = factory(d_model=16, d_ff=40, bias=True, approximate=approximate).double()
    with torch.no_grad():
        for p in ffn.parameters():
            p.add_(0.1 * torch.randn_like(p))  # biases off zero
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)

    def act(t: torch.Tensor) -> torch.Tensor:
        return F.gelu(t, approximate=approximate)

    hidden = act(F.linear(x, ffn.w1.weight, ffn.w1.bias))
    if gated:
        assert ffn.w3 is not None
        hidden = hidden * F.linear(x, ffn.w3.weight, ffn.w3.bias)
    expected = F.linear(hidden, ffn.w2.weight, ffn.w2.bias)
    got = ffn(x)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(got)
    grads = torch.autograd.grad(got, [x, *ffn.parameters()], g)
    want = torch.autograd.grad(expected, [x, *ffn.parameters()], g)
    for a, b in zip(grads, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def _copy_linear(dst: Any, src: Any, conv1d: bool = False) -> None:
    with torch.no_grad():
        dst.weight.copy_(src.weight.T if conv1d else src.weight)
        if src.bias is not None:
            dst.bias.copy_(src.bias)


def test_gelu_with_bias_and_tanh_is_gpt2s_mlp() -> None:
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

    torch.manual_seed(0)
    hf = GPT2MLP(64, GPT2Config(n_embd=16, activation_function="gelu_new")).eval()
    ffn = GELUFeedForward(d_model=16, d_ff=64, bias=True, approximate="tanh")
    with torch.no_grad():
        hf.c_fc.bias.normal_()
        hf.c_proj.bias.normal_()
    _copy_linear(ffn.w1, hf.c_fc, conv1d=True)  # Conv1D keeps (in, out)
    _copy_linear(ffn.w2, hf.c_proj, conv1d=True)
    x = torch.randn(2, 7, 16)
    torch.testing.assert_close(ffn(x), hf(x), rtol=1e-6, atol=1e-6)


def test_gelu_with_bias_is_gpt_neoxs_mlp() -> None:
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXMLP

    torch.manual_seed(0)
    hf = GPTNeoXMLP(
        GPTNeoXConfig(
            hidden_size=16, num_attention_heads=2, intermediate_size=64, hidden_act="gelu"
        )
    )
    ffn = GELUFeedForward(d_model=16, d_ff=64, bias=True)
    _copy_linear(ffn.w1, hf.dense_h_to_4h)
    _copy_linear(ffn.w2, hf.dense_4h_to_h)
    x = torch.randn(2, 7, 16)
    torch.testing.assert_close(ffn(x), hf(x), rtol=1e-6, atol=1e-6)


def test_geglu_with_tanh_is_gemmas_mlp() -> None:
    from transformers import GemmaConfig
    from transformers.models.gemma.modeling_gemma import GemmaMLP

    torch.manual_seed(0)
    config = GemmaConfig(
        hidden_size=16, intermediate_size=40, hidden_activation="gelu_pytorch_tanh"
    )
    hf = GemmaMLP(config)
    ffn = GEGLU(d_model=16, d_ff=40, approximate="tanh")
    assert ffn.w3 is not None
    _copy_linear(ffn.w1, hf.gate_proj)
    _copy_linear(ffn.w3, hf.up_proj)
    _copy_linear(ffn.w2, hf.down_proj)
    x = torch.randn(2, 7, 16)
    torch.testing.assert_close(ffn(x), hf(x), rtol=1e-6, atol=1e-6)


def test_defaults_are_todays_modules_and_a_bias_draws_no_random_numbers() -> None:
    assert set(SwiGLU(d_model=8, d_ff=16).state_dict()) == {"w1.weight", "w2.weight", "w3.weight"}
    assert set(SiLUFeedForward(d_model=8, d_ff=16).state_dict()) == {"w1.weight", "w2.weight"}
    torch.manual_seed(0)
    plain = build_model(SMALL).state_dict()
    torch.manual_seed(0)
    biased = build_model(f"{SMALL}, ffn=swiglu(bias=true)").state_dict()
    assert {k for k in biased if k.endswith(".bias")} == {
        f"layers.{i}.ffn.{w}.bias" for i in range(2) for w in ("w1", "w2", "w3")
    }
    assert all(torch.equal(plain[k], biased[k]) for k in plain)  # the same weights, bit for bit
    assert all(not biased[k].any() for k in biased if k.endswith(".bias"))  # zeros


@pytest.mark.parametrize(
    ("name", "overrides"),
    [("gelu", (("approximate", "tanh"), ("bias", True))), ("geglu", (("approximate", "tanh"),))],
)
def test_tanh_variants_pass_the_conformance_kit(
    name: str, overrides: tuple[tuple[str, Any], ...]
) -> None:
    target = Target(get_registry().get("ffn", name), overrides)
    for check in CHECKS:
        if check.applies_to(target):
            for variant in check.variants:
                Case(check, target, variant).run(Settings(compile_backend="aot_eager"))


def test_only_the_gelu_rows_take_approximate() -> None:
    takes = {e.name for e in get_registry().entries("ffn") if e.component.arg("approximate")}
    assert takes == {"gelu", "geglu"}
    others = [e for e in get_registry().entries("ffn") if e.name not in ("moe", "none")]
    assert all(e.component.arg("bias") for e in others)


@pytest.mark.parametrize("name", ["swiglu", "gelu"])
def test_w1_scale_and_w2_scale_multiply_the_activations_input_and_the_output(name: str) -> None:
    """Falcon-H1's mlp_multipliers: `w2(act(w1_scale · w1 x) [· w3 x]) · w2_scale`; the
    parameters and the activations the kit measures are those of the row without them."""
    torch.manual_seed(0)
    model = build_model(f"{SMALL}, ffn={name}(w1_scale=0.5, w2_scale=1.5)")
    ffn = model.layers[0].ffn
    x = torch.randn(3, 32)
    act = F.silu if name == "swiglu" else F.gelu
    hidden = act(ffn.w1(x) * 0.5)
    if ffn.w3 is not None:
        hidden = hidden * ffn.w3(x)
    with torch.no_grad():
        torch.testing.assert_close(ffn(x), ffn.w2(hidden) * 1.5)
    assert "w1_scale=0.5,w2_scale=1.5" in str(model.spec)
    target = Target(get_registry().get("ffn", name), (("w1_scale", 0.5), ("w2_scale", 1.5)))
    for check in CHECKS:
        if check.name in ("params", "activations") and check.applies_to(target):
            for variant in check.variants:
                Case(check, target, variant).run(Settings(compile_backend="aot_eager"))
