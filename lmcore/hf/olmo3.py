"""OLMo 3 (`Olmo3ForCausalLM`, model_type `olmo3`): OLMo 2 (`block=reordered`, RMSNorms over the
full width of q and k) with a sliding window on the layers `layer_types` names (by default three
in four: `window=4096, window[3::4]=0`) and rotary parameters per layer type
(`rope_parameters: {"sliding_attention": {...}, "full_attention": {...}}`), so the full layers
may rotate with a base or scaling of their own (`pos[3::4]=rope(...)`; the long-context
checkpoints' YaRN there: `pos[3::4]=rope(scaling=yarn, ...)`).

    config.json                          spec
    sliding_window, layer_types          window[layers]=...
    rope_parameters (per layer type),
      rope_theta, rope_scaling           pos=rope(...), pos[layers]=rope(...)
    the rest                             as OLMo 2's (`lmcore.hf.olmo2`)

transformers 5 gives a top-level `rope_theta` and `rope_scaling` (transformers 4's fields) to
the full-attention layers only, its sliding layers rotating with 500,000; transformers 4 rotated
those with `rope_theta` too. A `rope_theta` other than 500,000 without the sliding layers' own
parameters is therefore refused, as meaning two models.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from lmcore.hf.common import GATED, attention, core, ends, mlp, norms
from lmcore.hf.family import Family
from lmcore.hf.olmo2 import FAMILY as OLMO2
from lmcore.hf.rules import FULL, SLIDING, Choice, Draft, Dropout, Field, Rope, SpecView, Window
from lmcore.hf.values import json_text as _json
from lmcore.hf.values import same as _same
from lmcore.hf.values import too_many as _too_many
from lmcore.spec import MAX_LAYERED

DEFAULTS: Final = {
    "vocab_size": 50304,
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "intermediate_size": 11008,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-5,
}
THETA: Final = 500000.0
WINDOW: Final = 4096
TYPES: Final = (SLIDING, FULL)


def _default_slides(n: int) -> list[bool]:
    """transformers' default `layer_types`: all but every fourth layer slide."""
    return [(i + 1) % 4 != 0 for i in range(n)]


def _slides(d: Draft, n: int) -> list[bool]:
    types = d.config.get("layer_types")
    if isinstance(types, list):
        return [t == SLIDING for t in types]
    return _default_slides(n)


_WINDOW: Final = Window(default=WINDOW, layer_types=True, default_types=_slides)
_ROPE: Final = Rope(theta=THETA)


@dataclass(frozen=True)
class SlidingLayers:
    """`Window` on `layer_types` (default three sliding layers in four), refusing a null window
    while layers slide (transformers' Olmo3 then has no window for their mask), and a default
    pattern on more layers than a spec lists, with no work per layer."""

    window: Window = _WINDOW

    @property
    def fields(self) -> tuple[str, ...]:
        return self.window.fields

    def read(self, d: Draft) -> None:
        n, types = d.num_layers, d.config.get("layer_types")
        size = d.config.get("sliding_window", WINDOW)
        if n is not None and types is None and n > MAX_LAYERED and size:  # three in four
            d.problems.append(_too_many(n, f"sliding_window={_json(size)}"))
            return
        if n is not None and types is None and n > MAX_LAYERED and size == 0:
            d.set("window", 0, "sliding_window")  # no window, whichever layers would slide
            return
        slides = SLIDING in types if isinstance(types, list) else bool(n)  # layer 0 does
        if "sliding_window" in d.config and size is None and slides:
            d.problems.append(
                f'sliding_window=null with "{SLIDING}" layers: transformers\' Olmo3 needs a '
                "window for their mask; give one, or make those layers full_attention"
            )
            return
        self.window.read(d)

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        self.window.write(v, out)


class _Layers(SpecView):
    """A `SpecView` of some layers only (one layer type's), for `Rope.write`."""

    def __init__(self, v: SpecView, layers: list[int]):
        super().__init__(v.bp, v.base)
        self._layers = layers

    def layers(self, path: str) -> list[Any]:
        return [self.at(path, i) for i in self._layers]

    def first(self, path: str) -> Any:
        return next((x for x in self.layers(path) if x is not None), None)


@dataclass(frozen=True)
class RopeByType:
    """`rope_parameters` per layer type to `pos=rope(...)` on the layers of each type (one
    value when both types rotate alike), each type's parameters read as `Rope` reads a model's.
    Written back per layer type."""

    rope: Rope = _ROPE

    @property
    def fields(self) -> tuple[str, ...]:
        return self.rope.fields

    def _entries(self, d: Draft) -> dict[str, Any] | None:
        """Each layer type's rotary parameters, as transformers 5 builds them."""
        params = d.config.get("rope_parameters")
        if params is not None and not isinstance(params, dict):
            d.problems.append(f"rope_parameters={_json(params)} is not an object")
            return None
        params = params or {}
        flat = sorted(k for k in params if k not in TYPES)
        if flat:
            d.problems.append(
                f"rope_parameters {', '.join(f'{k}={_json(params[k])}' for k in flat)}: an "
                f'OLMo 3 config gives its rotary parameters per layer type ({{"{SLIDING}": '
                f'{{...}}, "{FULL}": {{...}}}}), and transformers\' Olmo3 reads no others'
            )
            return None
        top = d.config.get("rope_theta")
        entries: dict[str, Any] = {}
        for t in TYPES:
            entry = params.get(t)
            if entry is not None and not isinstance(entry, dict):
                d.problems.append(f"rope_parameters.{t}={_json(entry)} is not an object")
                return None
            entry = dict(entry or {"rope_type": "default"})
            if "rope_theta" not in entry:
                if t == SLIDING and top is not None and not _same(top, THETA):
                    d.problems.append(
                        f"rope_theta={_json(top)} without rope_parameters.{SLIDING}: "
                        f"transformers 5 rotates the sliding layers with {THETA}, transformers "
                        "4 with rope_theta; give rope_parameters per layer type"
                    )
                    return None
                entry["rope_theta"] = top if t == FULL and top is not None else THETA
            entries[t] = entry
        scaling = d.config.get("rope_scaling")
        if scaling is not None:  # transformers 5 gives it to the full layers
            if not isinstance(scaling, dict):
                d.problems.append(f"rope_scaling={_json(scaling)} is not an object")
                return None
            entries[FULL] = {**entries[FULL], **scaling}
        return entries

    def read(self, d: Draft) -> None:
        n = d.num_layers
        entries = self._entries(d)
        if entries is None or n is None:
            return
        by_type: dict[str, Mapping[str, Any]] = {}
        for t, entry in entries.items():
            sub = Draft({"rope_parameters": entry})
            self.rope.read(sub)
            d.problems.extend(f"rope_parameters.{t}: {p}" for p in sub.problems)
            by_type[t] = sub.values
        if d.problems:
            return
        types = d.config.get("layer_types")
        if by_type[SLIDING] == by_type[FULL]:
            flags: list[bool] = [True]
        elif types is None and n > MAX_LAYERED:
            d.problems.append(_too_many(n, "rotary parameters that differ by layer type"))
            return
        elif types is None or (isinstance(types, list) and len(types) == n):
            flags = _slides(d, n)
        else:
            return  # the window's rule names the layer_types
        if all(flags) or not any(flags):  # one type's parameters on every layer
            for path, value in by_type[SLIDING if flags[0] else FULL].items():
                d.set(path, value, "the rotary parameters")
            return
        for path in dict.fromkeys([*by_type[SLIDING], *by_type[FULL]]):
            values = [by_type[SLIDING if s else FULL].get(path) for s in flags]
            d.set(path, values, "the rotary parameters")

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        windows = v.layers("window")
        base = v.base.get("rope_parameters")
        base = base if isinstance(base, dict) else {}
        written: dict[str, Any] = {}
        for t in TYPES:
            layers = [i for i, w in enumerate(windows) if bool(w) == (t == SLIDING)]
            if not layers:
                continue
            one: dict[str, Any] = {}
            self.rope.write(_Layers(v, layers), one)
            scaling = one.get("rope_scaling") or {"rope_type": "default"}
            written[t] = {**scaling, "rope_theta": one.get("rope_theta", THETA)}
        for t in TYPES:  # a type no layer has: unused; the base's, or the other's
            if t not in written:
                other = next(iter(written.values()), {"rope_type": "default", "rope_theta": THETA})
                written[t] = base.get(t, other)
        out["rope_parameters"] = written


FAMILY: Final = Family(
    model_type="olmo3",
    architecture="Olmo3ForCausalLM",
    spec=OLMO2.spec,
    rules=(
        *core(DEFAULTS, qk_norm=True),
        Choice("hidden_act", GATED, "silu", what="a gated MLP's activation"),
        Field("attention_bias", ("qkv_bias", "out_bias"), bool, False),
        SlidingLayers(),
        RopeByType(),
        Dropout(("attention_dropout",)),
    ),
    tensors=(
        *ends(),
        *norms({"ln1_out": "post_attention_layernorm", "ln2_out": "post_feedforward_layernorm"}),
        *attention(),
        *mlp(),
    ),
)
