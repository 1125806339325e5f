"""The built-in presets: the CS336 test model, TinyStories and the GPT-2 shapes."""

from __future__ import annotations

from lmcore import Preset, hookimpl

_GPT2 = {  # name: (num_layers, d_model, num_heads)
    "small": (12, 768, 12),
    "medium": (24, 1024, 16),
    "large": (36, 1280, 20),
    "xl": (48, 1600, 25),
}


@hookimpl
def lmcore_presets() -> list[Preset]:
    presets = [
        Preset(
            "cs336-tiny",
            "vocab_size=10000, context_length=16, d_model=64, num_layers=3, num_heads=4, "
            "d_ff=128, pos=rope(theta=10000)",
            "the CS336 reference test model",
        ),
        Preset(
            "tinystories",
            "vocab_size=10000, context_length=256, d_model=512, num_layers=4, num_heads=16, "
            "d_ff=1344, pos=rope(theta=10000)",
            "the CS336 TinyStories model",
        ),
    ]
    for size, (layers, d, heads) in _GPT2.items():
        presets.append(
            Preset(
                f"gpt2-{size}",
                f"vocab_size=50257, context_length=1024, d_model={d}, num_layers={layers}, "
                f"num_heads={heads}, d_ff={4 * d}",
                f"GPT-2 {size} shape (d_ff = 4·d_model) with the default components",
            )
        )
    return presets
