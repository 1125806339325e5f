"""lmcore components backed by torch's fused operators: `attn=torch_sdpa`, `norm=torch_rmsnorm`,
`ffn=torch_swiglu`.

The kernel-plugin answer to "from scratch is slower than C++": the same maths as lmcore's
built-ins (`sdpa`, `rmsnorm`, `swiglu`) with the same state-dict keys, so a model switches
between them by its spec alone and loads the same weights.

- `torch_sdpa`: `F.scaled_dot_product_attention` (FlashAttention on CUDA). On the CPU, and on
  the meta device where lmcore measures activations, it calls the kernel that function picks
  on the CPU, `aten._scaled_dot_product_flash_attention_for_cpu`, directly: through the public
  function a meta tensor would take the unfused path, and `lmcore describe --measure` would
  measure a different kernel's memory than the one that runs. Grouped-query heads go in as
  they are (the kernels attend a key/value head from several query heads without a copy);
  masks and biases become one additive mask.
- `torch_rmsnorm`: torch's fused RMSNorm kernel (`aten._fused_rms_norm`, what `F.rms_norm`
  runs without autograd), which accumulates in float32 as lmcore's contract asks; torch has no
  CPU kernel for its backward, so that is written out.
- `torch_swiglu`: `F.linear`, and the gate `silu(w1 x) * w3 x` with torch's fused SiLU kernels
  forward and backward (`F.silu`, `aten.silu_backward`), keeping only w1 x and w3 x.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float
from torch import Tensor, nn
from torch.utils.flop_counter import flop_registry, register_flop_formula

from lmcore import Arg, Component, hookimpl
from lmcore.model.roles import GAIN, MATRIX, Role

_FLASH_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FLASH_CPU_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _attention_flops(batch: int, heads: int, q_len: int, k_len: int, head_dim: int) -> int:
    return 4 * batch * heads * q_len * k_len * head_dim  # q kᵀ and p v, the whole score matrix


# torch's FLOP counter knows the CUDA attention kernels but not the CPU one (it counts 0 for
# it); count it as torch counts the others, so that FlopCounterMode and lmcore's declared FLOPs
# agree on the CPU too.
if _FLASH_CPU not in flop_registry and _FLASH_CPU.default not in flop_registry:

    @register_flop_formula(_FLASH_CPU)
    def _flash_cpu_flops(q_shape: Any, k_shape: Any, *args: Any, **kwargs: Any) -> int:
        b, h, sq, d = q_shape
        return _attention_flops(b, h, sq, k_shape[-2], d)

    @register_flop_formula(_FLASH_CPU_BACKWARD)
    def _flash_cpu_backward_flops(
        grad_shape: Any, q_shape: Any, k_shape: Any, *args: Any, **kwargs: Any
    ) -> int:
        b, h, sq, d = q_shape
        return 2 * _attention_flops(b, h, sq, k_shape[-2], d)


def _additive_mask(
    q: Tensor, k: Tensor, causal: bool, mask: Tensor | None, bias: Tensor | None
) -> Tensor:
    """One float mask for torch's kernel: the bias, with -inf where `mask` (True = may attend)
    or the causal rule (queries aligned to the end of the keys) forbids a key."""
    sq, sk = q.shape[-2], k.shape[-2]
    allowed = mask
    if causal:
        ahead = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
        allowed = ahead if allowed is None else allowed & ahead
    base = bias if bias is not None else torch.zeros((), dtype=q.dtype, device=q.device)
    added = base.to(q.dtype)
    if allowed is not None:
        added = added.masked_fill(~allowed, -math.inf)
    while added.ndim < 4:  # the kernels take (Sq, Sk) or (B, H, Sq, Sk)
        added = added.unsqueeze(0)
    return added.expand(*added.shape[:2], sq, sk)


class TorchSDPA(nn.Module):
    """`softmax(q kᵀ / sqrt(D) + bias) v` by torch's fused attention kernel."""

    def forward(
        self,
        q: Float[Tensor, "B H Sq D"],
        k: Float[Tensor, "B Hkv Sk D"],
        v: Float[Tensor, "B Hkv Sk D"],
        *,
        causal: bool,
        mask: Bool[Tensor, "... Sq Sk"] | None = None,
        bias: Float[Tensor, "... Sq Sk"] | None = None,
    ) -> Float[Tensor, "B H Sq D"]:
        # torch's is_causal aligns queries to the start of the keys; lmcore aligns them to the
        # end (decoding with a KV cache), so Sq != Sk needs an explicit mask.
        plain = mask is None and bias is None and (not causal or q.shape[-2] == k.shape[-2])
        attn_mask = None if plain else _additive_mask(q, k, causal, mask, bias)
        is_causal = causal and plain
        grad_bias = bias is not None and bias.requires_grad  # the CPU kernel has none for it
        if q.device.type in ("cpu", "meta") and not grad_bias:
            out: Tensor = _FLASH_CPU(q, k, v, 0.0, is_causal, attn_mask=attn_mask)[0]
            return out
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal, enable_gqa=k.shape[1] != q.shape[1]
        )


def torch_sdpa_activations(
    batch: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    seq_len: int,
    kv_len: int,
    dtype: torch.dtype,
) -> int:
    """Bytes the kernel keeps for backward (the model calls it causal, without a mask): q,
    k and v (Hkv heads), the output, and each row's float32 log-sum-exp."""
    tensors = 2 * batch * (num_heads * seq_len + num_kv_heads * kv_len) * head_dim
    return dtype.itemsize * tensors + 4 * batch * num_heads * seq_len


class _FusedRMSNorm(torch.autograd.Function):
    """torch's fused RMSNorm kernel forward (`aten._fused_rms_norm`, which accumulates in
    float32 and also returns each row's rstd); torch has no CPU kernel for its backward, so
    that is written out: `dx = rstd · (g·w − x̂ · mean(g·w · x̂))`, `dw = Σ g · x̂`."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        y, rstd = torch.ops.aten._fused_rms_norm(x, [x.shape[-1]], weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        out: Tensor = y
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, weight, rstd = ctx.saved_tensors
        x_hat = x.to(rstd.dtype) * rstd
        g = grad.to(rstd.dtype)
        dweight = None
        if ctx.needs_input_grad[1]:
            dweight = (g * x_hat).reshape(-1, x.shape[-1]).sum(dim=0).to(weight.dtype)
        g_w = g * weight
        dot = (g_w * x_hat).mean(dim=-1, keepdim=True)
        dx = g_w.addcmul_(x_hat, dot, value=-1).mul_(rstd).to(x.dtype)
        return dx, dweight, None


class TorchRMSNorm(nn.Module):
    """RMSNorm by torch's fused kernel, with a learned gain `weight` (lmcore's key); computed in
    float32 and returned in the input dtype."""

    def __init__(
        self,
        d_model: int,
        eps: float = 1e-5,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        weight = self.weight if self.weight.dtype == x.dtype else self.weight.to(x.dtype)
        y: Tensor = _FusedRMSNorm.apply(x, weight, self.eps)
        return y

    def parameter_roles(self) -> dict[str, Role]:
        return {"weight": GAIN}

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def torch_rmsnorm_activations(batch: int, seq_len: int, d_model: int, dtype: torch.dtype) -> int:
    """Bytes kept for backward: the input in its own dtype and a float32 rstd per token."""
    return batch * seq_len * (d_model * dtype.itemsize + 4)


class TorchSwiGLU(nn.Module):
    """`w2(silu(w1 x) * w3 x)` with `F.linear` and `F.silu`; `w1, w3: (d_ff, d_model)`,
    `w2: (d_model, d_ff)`, lmcore's keys."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        factory: dict[str, Any] = {"bias": False, "device": device, "dtype": dtype}
        self.w1 = nn.Linear(d_model, d_ff, **factory)
        self.w2 = nn.Linear(d_ff, d_model, **factory)
        self.w3 = nn.Linear(d_model, d_ff, **factory)
        for w in (self.w1, self.w2, self.w3):  # lmcore's initialisation, σ² = 2 / (in + out)
            std = math.sqrt(2.0 / sum(w.weight.shape))
            nn.init.trunc_normal_(w.weight, std=std, a=-3 * std, b=3 * std)

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        hidden: Tensor = _SiLUGate.apply(self.w1(x), self.w3(x))
        return self.w2(hidden)

    def parameter_roles(self) -> dict[str, Role]:
        # torch's nn.Linear declares no roles: its owner declares them by dotted path.
        return {f"{w}.weight": MATRIX for w in ("w1", "w2", "w3")}


class _SiLUGate(torch.autograd.Function):
    """`silu(a) * b` by torch's fused SiLU kernels (`F.silu` forward, `aten.silu_backward`),
    keeping only a and b for backward."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor) -> Tensor:
        ctx.save_for_backward(a, b)
        return F.silu(a).mul_(b)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        a, b = ctx.saved_tensors
        da = torch.ops.aten.silu_backward(grad * b, a) if ctx.needs_input_grad[0] else None
        db = F.silu(a).mul_(grad) if ctx.needs_input_grad[1] else None
        return da, db


def torch_swiglu_activations(
    batch: int, seq_len: int, d_model: int, d_ff: int, dtype: torch.dtype
) -> int:
    """Bytes kept for backward: the input (w1 and w3 share it), w1 x and w3 x (the gate's
    factors), and the gated product (w2's input)."""
    return batch * seq_len * dtype.itemsize * (d_model + 3 * d_ff)


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="attn",
            name="torch_sdpa",
            build=TorchSDPA,
            help="torch's fused attention (F.scaled_dot_product_attention); memory linear in Sq",
            flops=lambda num_heads, head_dim, seq_len, kv_len: _attention_flops(
                1, num_heads, seq_len, kv_len, head_dim
            ),
            activations=torch_sdpa_activations,
            features=frozenset({"gqa", "bias", "mask", "compile"}),
        ),
        Component(
            kind="norm",
            name="torch_rmsnorm",
            build=TorchRMSNorm,
            args=(Arg("eps", float, 1e-5, "added to mean(x²) inside the square root", gt=0.0),),
            help="RMSNorm by torch's F.rms_norm, computed in float32",
            params=lambda d_model: d_model,
            activations=torch_rmsnorm_activations,
            features=frozenset({"compile"}),
        ),
        Component(
            kind="ffn",
            name="torch_swiglu",
            build=TorchSwiGLU,
            help="gated SiLU FFN by torch's F.linear and F.silu: w2(silu(w1 x) * w3 x)",
            params=lambda d_model, d_ff: 3 * d_model * d_ff,
            flops=lambda d_model, d_ff, seq_len: 6 * seq_len * d_model * d_ff,
            activations=torch_swiglu_activations,
            default_d_ff=lambda d_model: max(64, round(8 * d_model / 3 / 64) * 64),
            features=frozenset({"compile"}),
        ),
    ]
