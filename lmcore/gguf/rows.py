"""The row each GGUF architecture is (`Architecture`: metadata keys as a Hugging Face config's
fields, tensor names as Hugging Face's, how llama.cpp's converter changed the tensors) and the
helpers its tables are written with; `lmcore.gguf.architectures` holds the rows and reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from torch import Tensor

__all__ = ["Architecture", "Derived", "Meta", "both", "layer", "positive"]

Meta = Mapping[str, Any]  # metadata keys relative to "{arch}." -> values


@dataclass(frozen=True)
class Derived:
    """Metadata keys and config fields that are not one renaming: `read(meta, config)` sets
    config fields from the architecture-relative metadata (values of the wrong type are passed
    on as they are, for the family's checks to name), `write(config, meta)` the other way."""

    keys: tuple[str, ...]
    read: Callable[[Meta, dict[str, Any]], None]
    write: Callable[[Mapping[str, Any], dict[str, Any]], None]
    names: tuple[tuple[str, str], ...] = ()  # config field -> the key a message names for it


@dataclass(frozen=True)
class Architecture:
    """One GGUF architecture (`general.architecture`) and the Hugging Face family it renames."""

    name: str
    family: str  # the module of lmcore.hf holding the family's tables
    model_type: str  # config.json's model_type
    # "{arch}."-relative metadata key -> config.json field (both directions)
    fields: tuple[tuple[str, str], ...]
    # keys checked against what the spec implies (head widths, the rotated width), not mapped
    head_keys: tuple[str, ...]
    # keys whose value is the default (scaling "none", 0 experts) are accepted
    trivial: Mapping[str, tuple[Any, ...]]
    # GGUF tensor name -> Hugging Face tensor name; "{i}" is the layer, "{e}" (Hugging Face side
    # only) the expert of a GGUF tensor stacking every expert's
    tensors: tuple[tuple[str, str], ...]
    # Hugging Face tensor name suffix -> config field giving the heads its rows were permuted by
    permuted: Mapping[str, str] = field(default_factory=dict)
    # config field -> llama.cpp's value when the file lacks the key (optional keys)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    # config fields llama.cpp's architecture fixes, whatever the file says
    fixed: Mapping[str, Any] = field(default_factory=dict)
    derived: tuple[Derived, ...] = ()
    norm_offset: bool = False  # Gemma: `*norm.weight` stored as 1 + w
    transposed: tuple[str, ...] = ()  # Hugging Face suffixes stored transposed (Conv1D)
    per_head: Mapping[str, str] = field(default_factory=dict)  # suffix -> heads field (NeoX)
    shapes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # overrides of _SHAPES
    # config fields the file holds but llama.cpp's graph ignores -> why: a model using one is
    # written as this architecture only when asked for, or when it came from it
    unused: Mapping[str, str] = field(default_factory=dict)
    # llama.cpp's tensors that are not one renaming of Hugging Face's (gpt-oss's de-interleaved
    # experts, DeepSeek-V2's attn_k_b and attn_v_b): `join(gguf tensors, config)` gives those as
    # Hugging Face's tensors (the rest as they were), `split(hf tensors, config)` the tensors
    # left for the renaming and the GGUF tensors made of the others
    join: Callable[[dict[str, Tensor], Mapping[str, Any]], dict[str, Tensor]] | None = None
    split: Callable[[dict[str, Tensor], Mapping[str, Any]],
                    tuple[dict[str, Tensor], dict[str, Tensor]]] | None = None  # fmt: skip
    # Hugging Face suffixes of depthwise convolutions, (channels, 1, taps), stored without the
    # middle axis (llama.cpp's ssm_conv takes a 2-D filter)
    squeezed: tuple[str, ...] = ()
    # changes to the Hugging Face tensors after reading's renaming (`undone`) and before
    # writing's (`redone`): Qwen3-Next's fused projection, Mamba-2's A as -exp(A_log)
    undone: Callable[[dict[str, Tensor], Mapping[str, Any]], dict[str, Tensor]] | None = None
    redone: Callable[[dict[str, Tensor], Mapping[str, Any]], dict[str, Tensor]] | None = None
    # the config of the model `redone`'s tensors make, where it folds config fields into the
    # weights (Falcon-H1's multipliers): writing compares the read-back with it, not the model
    folded: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None

    @property
    def keys(self) -> frozenset[str]:
        """Every "{arch}."-relative key the architecture reads."""
        names = [k for k, _ in self.fields] + list(self.head_keys) + list(self.trivial)
        return frozenset(names + [k for d in self.derived for k in d.keys])

    @property
    def has_output(self) -> bool:
        return any(g == "output.weight" for g, _ in self.tensors)


def layer(gguf: str, hf: str) -> tuple[str, str]:
    return (f"blk.{{i}}.{gguf}", f"model.layers.{{i}}.{hf}")


def both(gguf: str, hf: str) -> tuple[tuple[str, str], ...]:
    return tuple((f"{gguf}.{p}", f"{hf}.{p}") for p in ("weight", "bias"))


def positive(value: Any) -> int | None:
    """`value` if it is a positive integer (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _head_dim(meta: Meta) -> int | None:
    """The head width llama.cpp takes: `attention.key_length`, else embedding / heads."""
    width = positive(meta.get("attention.key_length"))
    d, heads = positive(meta.get("embedding_length")), positive(meta.get("attention.head_count"))
    if width is None and d is not None and heads is not None and d % heads == 0:
        width = d // heads
    return width


# The pieces of the Llama row the others reuse.
_LLAMA_FIELDS: Final = (
    ("vocab_size", "vocab_size"),
    ("context_length", "max_position_embeddings"),
    ("embedding_length", "hidden_size"),
    ("block_count", "num_hidden_layers"),
    ("feed_forward_length", "intermediate_size"),
    ("attention.head_count", "num_attention_heads"),
    ("attention.head_count_kv", "num_key_value_heads"),
    ("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
    ("rope.freq_base", "rope_theta"),
)
_HEAD_KEYS: Final = ("rope.dimension_count", "attention.key_length", "attention.value_length")
_NO_SCALING: Final = {"rope.scaling.type": ("none",), "rope.scaling.factor": (1, 1.0)}
_NO_EXPERTS: Final = {"expert_count": (0,), "expert_used_count": (0,)}
_ROPE: Final = {"rope_theta": 10000.0}  # llama.cpp's base when rope.freq_base is absent
_ENDS: Final = (
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
)
_ATTENTION: Final = (
    layer("attn_q.weight", "self_attn.q_proj.weight"),
    layer("attn_k.weight", "self_attn.k_proj.weight"),
    layer("attn_v.weight", "self_attn.v_proj.weight"),
    layer("attn_output.weight", "self_attn.o_proj.weight"),
)
_MLP: Final = (
    layer("ffn_gate.weight", "mlp.gate_proj.weight"),
    layer("ffn_up.weight", "mlp.up_proj.weight"),
    layer("ffn_down.weight", "mlp.down_proj.weight"),
)
_PRENORMS: Final = (
    layer("attn_norm.weight", "input_layernorm.weight"),
    layer("ffn_norm.weight", "post_attention_layernorm.weight"),
)
_QK_NORMS: Final = (
    layer("attn_q_norm.weight", "self_attn.q_norm.weight"),
    layer("attn_k_norm.weight", "self_attn.k_norm.weight"),
)
_LLAMA_PERMUTED: Final = {
    "self_attn.q_proj.weight": "num_attention_heads",
    "self_attn.k_proj.weight": "num_key_value_heads",
}


def _experts(at: str, names: tuple[str, str, str]) -> tuple[tuple[str, str], ...]:
    """The stacked experts (gate, up, down) and the router, Hugging Face's per-expert names."""
    gate, up, down = names
    return (
        layer("ffn_gate_inp.weight", f"{at}.gate.weight"),
        layer("ffn_gate_exps.weight", f"{at}.experts.{{e}}.{gate}.weight"),
        layer("ffn_up_exps.weight", f"{at}.experts.{{e}}.{up}.weight"),
        layer("ffn_down_exps.weight", f"{at}.experts.{{e}}.{down}.weight"),
    )
