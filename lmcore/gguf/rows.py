"""What every GGUF architecture's row (`lmcore.gguf.architectures.Architecture`) is made of:
the row itself, the metadata-to-config step a row may add (`Derived`), and the pieces of the
Llama row that the others reuse (its metadata keys and tensor names), so that an architecture
can have a module of its own (`lmcore/gguf/smollm3.py`, ...) that `architectures.py` registers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

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
    # Hugging Face suffixes of depthwise convolutions, (channels, 1, taps), stored without the
    # middle axis (llama.cpp's ssm_conv takes a 2-D filter)
    squeezed: tuple[str, ...] = ()
    # what the renaming cannot say, done to the Hugging Face tensors after reading's renaming
    # (`joined`) and before writing's (`split`): Qwen3-Next's fused projection, for one
    joined: Callable[[dict[str, Any], Mapping[str, Any]], dict[str, Any]] | None = None
    split: Callable[[dict[str, Any], Mapping[str, Any]], dict[str, Any]] | None = None
    per_head: Mapping[str, str] = field(default_factory=dict)  # suffix -> heads field (NeoX)
    shapes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # overrides of _SHAPES
    # config fields the file holds but llama.cpp's graph ignores -> why: a model using one is
    # written as this architecture only when asked for, or when it came from it
    unused: Mapping[str, str] = field(default_factory=dict)

    @property
    def keys(self) -> frozenset[str]:
        """Every "{arch}."-relative key the architecture reads."""
        names = [k for k, _ in self.fields] + list(self.head_keys) + list(self.trivial)
        return frozenset(names + [k for d in self.derived for k in d.keys])

    @property
    def has_output(self) -> bool:
        return any(g == "output.weight" for g, _ in self.tensors)


def _layer(gguf: str, hf: str) -> tuple[str, str]:
    return (f"blk.{{i}}.{gguf}", f"model.layers.{{i}}.{hf}")


def _both(gguf: str, hf: str) -> tuple[tuple[str, str], ...]:
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
    _layer("attn_q.weight", "self_attn.q_proj.weight"),
    _layer("attn_k.weight", "self_attn.k_proj.weight"),
    _layer("attn_v.weight", "self_attn.v_proj.weight"),
    _layer("attn_output.weight", "self_attn.o_proj.weight"),
)
_MLP: Final = (
    _layer("ffn_gate.weight", "mlp.gate_proj.weight"),
    _layer("ffn_up.weight", "mlp.up_proj.weight"),
    _layer("ffn_down.weight", "mlp.down_proj.weight"),
)
_PRENORMS: Final = (
    _layer("attn_norm.weight", "input_layernorm.weight"),
    _layer("ffn_norm.weight", "post_attention_layernorm.weight"),
)
_QK_NORMS: Final = (
    _layer("attn_q_norm.weight", "self_attn.q_norm.weight"),
    _layer("attn_k_norm.weight", "self_attn.k_norm.weight"),
)
_LLAMA_PERMUTED: Final = {
    "self_attn.q_proj.weight": "num_attention_heads",
    "self_attn.k_proj.weight": "num_key_value_heads",
}


def _experts(at: str, names: tuple[str, str, str]) -> tuple[tuple[str, str], ...]:
    """The stacked experts (gate, up, down) and the router, Hugging Face's per-expert names."""
    gate, up, down = names
    return (
        _layer("ffn_gate_inp.weight", f"{at}.gate.weight"),
        _layer("ffn_gate_exps.weight", f"{at}.experts.{{e}}.{gate}.weight"),
        _layer("ffn_up_exps.weight", f"{at}.experts.{{e}}.{up}.weight"),
        _layer("ffn_down_exps.weight", f"{at}.experts.{{e}}.{down}.weight"),
    )
