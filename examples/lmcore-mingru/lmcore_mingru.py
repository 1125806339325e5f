"""mixer=mingru: minGRU (Feng et al., 2024, "Were RNNs All We Needed?"), a gated linear RNN.

    z_t = σ(W_z x_t)                        the update gate, per channel
    h̃_t = W_h x_t                           the candidate
    h_t = (1 − z_t) · h_{t−1} + z_t · h̃_t   h_0 = 0
    y_t = W_o h_t

over `width = expand · d_model` channels. The gate depends on x_t alone, not on h_{t−1}, so the
recurrence is linear, `h_t = a_t h_{t−1} + b_t` with `a_t = 1 − z_t = σ(−W_z x_t)` and
`b_t = z_t h̃_t`, and a whole sequence is one parallel prefix scan (training, prefill); a
decoding step is the recurrence itself. The decoding state is `h`, `(batch, width)` per layer,
whatever the context. A left pad has `a = 1, b = 0`: it leaves the state as it was, so padded
prompts give what they give alone.

This module is a complete lmcore plugin: the `lmcore_components` hook below returns the
declaration, and pyproject.toml names this module under the entry-point group `lmcore`.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn

from lmcore import Arg, Component, hookimpl
from lmcore.interfaces import LayerContext
from lmcore.model.cache import RecurrentState
from lmcore.model.nn import Linear
from lmcore.model.roles import packed


def core_dtype(dtype: torch.dtype | None) -> torch.dtype:
    """The scan and its state in float32 at least: the state carries every token before it."""
    return torch.promote_types(dtype or torch.get_default_dtype(), torch.float32)


def scan_steps(seq_len: int) -> int:
    """The doubling steps of `linear_scan` over `seq_len` tokens: ceil(log2(seq_len))."""
    return max(seq_len - 1, 0).bit_length()


def linear_scan(
    a: Float[Tensor, "B T W"], b: Float[Tensor, "B T W"]
) -> tuple[Float[Tensor, "B T W"], Float[Tensor, "B T W"]]:
    """`(A, H)` with `A_t = a_1 ⋯ a_t` and `H_t = a_t H_{t−1} + b_t` (`H_0 = 0`), along dim 1.

    Hillis and Steele's inclusive scan of the pairs `(a, b)` under
    `(a1, b1) ∘ (a2, b2) = (a1 a2, a2 b1 + b2)`: after the step of distance d, position t holds
    the composition of the 2d tokens up to it. ceil(log2 T) steps of element-wise products of
    gates in [0, 1]; no exponential of a sum, so nothing overflows, whatever the length (a log-space
    cumulative sum would need exp(−Σ log a) and overflow after a few hundred closed gates).
    Then `h_t = A_t h_0 + H_t` for a state `h_0` carried in.
    """
    d, steps = 1, scan_steps(a.shape[1])
    for _ in range(steps):
        # Out of place: autograd keeps each step's a and b for the backward.
        b = torch.cat([b[:, :d], b[:, d:] + a[:, d:] * b[:, :-d]], dim=1)
        a = torch.cat([a[:, :d], a[:, d:] * a[:, :-d]], dim=1)
        d *= 2
    return a, b


class MinGRU(nn.Module):
    """minGRU over `width = expand · d_model` channels. State-dict keys: `in_proj`
    `(2 · width, d_model)`, the gate's rows `W_z` then the candidate's `W_h`, and `out_proj`
    `(d_model, width)`, `W_o`."""

    def __init__(
        self,
        *,
        d_model: int,
        expand: int = 1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.d_model, self.width = d_model, expand * d_model
        self.in_proj = Linear(  # the gate's and the candidate's matrices in one
            d_model, 2 * self.width, device=device, dtype=dtype,
            role=packed(self.width, self.width),
        )  # fmt: skip
        self.out_proj = Linear(self.width, d_model, device=device, dtype=dtype)

    def forward(
        self, x: Float[Tensor, "B T d_model"], context: LayerContext
    ) -> Float[Tensor, "B T d_model"]:
        wide = core_dtype(x.dtype)
        k, candidate = self.in_proj(x).to(wide).chunk(2, dim=-1)  # (B, T, width) each, views
        z, a = torch.sigmoid(k), torch.sigmoid(-k)  # a = 1 − z without cancellation near z = 1
        cache = context.cache
        if cache is not None and cache.valid is not None:  # a pad: a = 1, b = 0, the state kept
            keep = cache.valid[..., None].to(wide)
            z, a = z * keep, a * keep + (1 - keep)
        b = z * candidate
        h0 = None if cache is None or cache.start == 0 else cache.state["h"]
        if h0 is not None and x.shape[1] == 1:  # a decoding step: the recurrence itself
            h = a * h0[:, None] + b
        else:
            decay, h = linear_scan(a, b)
            if h0 is not None:
                h = h + decay * h0[:, None]
        if cache is not None:
            cache.state["h"].copy_(h[:, -1])  # in place: the storage never moves
        y: Tensor = self.out_proj(h.to(x.dtype))
        return y

    def decoding_state(
        self,
        *,
        batch: int,
        context_length: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> RecurrentState:
        """`h` of each sequence, `(batch, width)`, in float32 at least."""
        h = torch.zeros(batch, self.width, device=device, dtype=core_dtype(dtype))
        return RecurrentState({"h": h})

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, width={self.width}"


def params(d_model: int, expand: int) -> int:
    return 3 * expand * d_model * d_model  # in_proj (2w × d) and out_proj (d × w)


def flops(d_model: int, expand: int, seq_len: int) -> int:
    # The two projections (d -> 2w, w -> d); the scan does no matmul.
    return 2 * seq_len * d_model * 3 * expand * d_model


def activations(batch: int, seq_len: int, d_model: int, expand: int, dtype: torch.dtype) -> int:
    """Bytes kept for backward, per sequence of T tokens over w channels: the input (in_proj's),
    in_proj's output in float32 at least (the candidate is a view of it), z (its sigmoid's
    output), a and b entering each of the ceil(log2 T) scan steps (the first a is its sigmoid's
    output; with no step a is used by nothing and freed), and out_proj's input (h, or its copy
    in the model's dtype)."""
    s, c = dtype.itemsize, core_dtype(dtype).itemsize
    w, steps = expand * d_model, scan_steps(seq_len)
    wide = 2 * w * c  # the storage the candidate is a view of
    scan = (2 * steps + 1) * w * c  # z, and a and b entering each step
    out = w * s  # h in the model's dtype (the last b, or its copy)
    return batch * seq_len * (d_model * s + wide + scan + out)


def state(d_model: int, expand: int, dtype: torch.dtype) -> tuple[int, int]:
    return 0, expand * d_model * core_dtype(dtype).itemsize


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="mixer",
            name="mingru",
            build=MinGRU,
            args=(Arg("expand", int, 1, "channels of the recurrence per d_model", ge=1),),
            help="minGRU: h = (1 − z)·h + z·W_h x, z = σ(W_z x); a parallel scan, O(1) state",
            params=params,
            flops=flops,
            activations=activations,
            buffers=lambda: 0,
            state=state,
            features=frozenset({"compile", "mask"}),
        )
    ]
