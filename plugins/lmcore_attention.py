"""mixer=attention: lmcore's causal self-attention as the layer's token mixer (the default).

The module is lmcore's own attention sub-layer (`lmcore.model.transformer.CausalSelfAttention`,
built by the `attention()` the factory is given): q, k, v and output projections, the
positional rotation, the `attn=` kernel and every attention key of the spec (`num_kv_heads`,
`head_dim`, `qkv_bias`, `qk_norm`, `window`, ...). lmcore accounts its projections, kernel and
norms itself (the `attention` declaration says where it is: the mixer is the sub-layer), so
this component declares nothing of its own. Its decoding state is keys and values, a slot per
token, accounted with the kernel.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from lmcore import Component, hookimpl


def build(attention: Callable[[], nn.Module]) -> nn.Module:
    return attention()


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="mixer",
            name="attention",
            build=build,
            help="causal self-attention through the attn= kernel (the default)",
            activations=lambda: 0,
            buffers=lambda: 0,
            state=lambda: (0, 0),  # its keys and values are lmcore's, counted with the kernel
            attention=lambda: ("",),
            # Left pads are masked keys: the layer takes them when its kernel has 'mask'.
            # Documents go to its kernel, which must declare "documents" too.
            features=frozenset({"compile", "mask", "documents"}),
        )
    ]
