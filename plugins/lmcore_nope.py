"""pos=nope: no positional encoding; causal attention alone carries order.

Kazemnejad et al., 2023: decoder-only models learn positions from the causal mask.
"""

from __future__ import annotations

from lmcore import Component, hookimpl
from lmcore.interfaces import PositionalEncodingBase


class NoPE(PositionalEncodingBase):
    """Adds nothing, rotates nothing, biases nothing."""


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="pos",
            name="nope",
            build=NoPE,
            help="no positional encoding",
            activations=lambda: 0,
            features=frozenset({"compile"}),
        )
    ]
