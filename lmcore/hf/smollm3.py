"""SmolLM3 (`SmolLM3ForCausalLM`, model_type `smollm3`): a Llama whose layers marked 0 in
`no_rope_layers` rotate nothing (NoPE; absent, every `no_rope_layer_interval`-th layer:
`pos[3::4]=nope`), with tied embeddings by default and an optional sliding window on the
layers `layer_types` names (by default the NoPE layers, when `use_sliding_window`).

    config.json                                  spec
    no_rope_layers / no_rope_layer_interval      pos[layers]=nope
    use_sliding_window, sliding_window,
      layer_types                                window[layers]=...
    the rest                                     as Llama's (`lmcore.hf.llama`)

transformers' eager and SDPA attention slide on the layers `layer_types` names whatever
`use_sliding_window` says, its flash attention only when it is true; a config whose
`layer_types` names sliding layers while `use_sliding_window` is false means two models, and is
refused. `max_window_layers`, which SmolLM3's published configs carry over from Qwen 2, is not
read by transformers' SmolLM3: kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from lmcore.hf.common import GATED, attention, core, ends, mlp, norms
from lmcore.hf.family import Family
from lmcore.hf.rules import SLIDING, Choice, Draft, Dropout, Field, Rope, SpecView, Window, spread
from lmcore.hf.values import checked
from lmcore.hf.values import json_text as _json
from lmcore.hf.values import too_many as _too_many

DEFAULTS: Final = {
    "vocab_size": 128256,
    "hidden_size": 2048,
    "num_hidden_layers": 36,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "intermediate_size": 11008,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
}
THETA: Final = 2000000.0
INTERVAL: Final = 4


def _nope(d: Draft, n: int, problems: list[str]) -> bool | list[bool] | None:
    """Which layers rotate nothing (`spread`'s answer; None with the problem in `problems`):
    `no_rope_layers`' 0s, or every `no_rope_layer_interval`-th layer."""
    given = d.config.get("no_rope_layers")
    if given is None:
        k = checked(
            "no_rope_layer_interval", d.field("no_rope_layer_interval", INTERVAL), int, problems
        )
        if k is None:
            return None
        on = spread(n, range(k - 1, n, k))
    elif (
        not isinstance(given, list)
        or len(given) < n
        or not all(type(v) is int and v in (0, 1) for v in given)
    ):
        problems.append(
            f"no_rope_layers={_json(given)}: lmcore reads a list of at least {n:,} entries, 1 "
            "(the layer rotates) or 0 (NoPE)"
        )
        return None
    else:
        on = spread(n, [v == 0 for v in given[:n]])
    if on is None:
        problems.append(_too_many(n, "NoPE"))
    return on


_ROPE: Final = Rope(theta=THETA)


@dataclass(frozen=True)
class NoRope:
    """`no_rope_layers` (or `no_rope_layer_interval`) to `pos[layers]=nope`, after `Rope`: the
    rotary arguments stay on the layers that rotate. Written back as an explicit list."""

    rope: Rope = _ROPE

    @property
    def fields(self) -> tuple[str, ...]:
        return (*self.rope.fields, "no_rope_layers", "no_rope_layer_interval")

    def read(self, d: Draft) -> None:
        self.rope.read(d)
        n = d.num_layers
        nope = None if n is None else _nope(d, n, d.problems)
        if nope is None or nope is False:
            return
        # The family's pos=rope and the rope's arguments become per-layer values: none on a
        # NoPE layer, whose component takes no arguments.
        rope_args = [p for p in d.values if p.startswith("pos.")]
        if nope is True:
            d.values["pos"] = "nope"
            for p in rope_args:
                del d.values[p]
            return
        d.values["pos"] = ["nope" if off else "rope" for off in nope]
        for p in rope_args:
            d.values[p] = [None if off else d.values[p] for off in nope]

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        kinds = v.layers("pos")
        self.rope.write(_Rotating(v), out)
        flags = [int(k == "rope") for k in kinds]
        base = v.base.get("no_rope_layers")
        keep = isinstance(base, list) and base[: v.n] == flags
        out["no_rope_layers"] = base if keep else flags
        out["no_rope_layer_interval"] = v.base.get("no_rope_layer_interval", INTERVAL)


class _Rotating(SpecView):
    """A `SpecView` whose whole-model `pos` is `rope` when any layer rotates (layer 0 may be a
    NoPE layer), for `Rope.write`."""

    def __init__(self, v: SpecView):
        super().__init__(v.bp, v.base)

    def first(self, path: str) -> Any:
        if path == "pos" and "rope" in self.layers("pos"):
            return "rope"
        return super().first(path)


def nope_layers(d: Draft, n: int) -> range | list[bool]:
    """transformers' default `layer_types`: the NoPE layers slide (when a window is on)."""
    nope = _nope(d, n, [])  # its problems are NoRope's to name
    return nope if isinstance(nope, list) else range(n) if nope else range(0)


_WINDOW: Final = Window(gate="use_sliding_window", layer_types=True, default_types=nope_layers)


@dataclass(frozen=True)
class _GatedWindow:
    """`Window` with `use_sliding_window`, refusing `layer_types` that name sliding layers
    while it is false (transformers' attention implementations disagree there)."""

    window: Window = _WINDOW

    @property
    def fields(self) -> tuple[str, ...]:
        return self.window.fields

    def read(self, d: Draft) -> None:
        types = d.config.get("layer_types")
        if (
            d.config.get("use_sliding_window", False) is False
            and isinstance(types, list)
            and SLIDING in types
        ):
            d.problems.append(
                f'layer_types names "{SLIDING}" layers while use_sliding_window=false: '
                "transformers' eager and SDPA attention slide there, its flash attention does "
                "not; set use_sliding_window to the one meant"
            )
            return
        self.window.read(d)

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        self.window.write(v, out)


FAMILY: Final = Family(
    model_type="smollm3",
    architecture="SmolLM3ForCausalLM",
    spec={"block": "prenorm", "norm": "rmsnorm", "pos": "rope", "attn": "sdpa"},
    rules=(
        *core(DEFAULTS),
        Choice("hidden_act", GATED, "silu", what="a gated MLP's activation"),
        Field("mlp_bias", "ffn.bias", bool, False),
        Field("attention_bias", ("qkv_bias", "out_bias"), bool, False),
        NoRope(),
        _GatedWindow(),
        Dropout(("attention_dropout",)),
    ),
    tensors=(
        *ends(),
        *norms({"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}),
        *attention(),
        *mlp(),
    ),
    passive=frozenset({"max_window_layers"}),
)
