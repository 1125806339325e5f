"""The GGUF architectures lmcore converts: per architecture, its metadata keys as the fields of a
Hugging Face config, its tensor names as Hugging Face's, and which rows llama.cpp permuted.

A GGUF file is what llama.cpp's converter made of a Hugging Face model, under other names, so
each architecture here is a renaming onto one of lmcore's Hugging Face families
(`lmcore.hf.<family>`), whose tables then map the config to a spec and the tensors to lmcore's
keys (refusing what lmcore cannot express, by the same rules as `--from-hf`):

    GGUF metadata --Architecture.fields--> config.json fields --hf family--> lmcore spec
    GGUF tensors  --Architecture.tensors, permutation undone--> HF state dict --> lmcore's keys

llama.cpp stores a Llama's q and k projections with each head's rows interleaved (2i, 2i + 1),
the layout its rotary kernel (and lmcore's) rotates, where Hugging Face keeps them half-split
(i, i + head_dim/2); undoing the permutation gives Hugging Face's tensors (and `--from-hf`'s
permutation then gives lmcore's, which are llama.cpp's). A key the table does not know is
refused unless ignored, naming it, as an unknown config.json field is by `--from-hf`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from torch import Tensor

from lmcore.errors import ConversionError, one_of
from lmcore.hf.family import Family, read_config
from lmcore.hf.family import family as hf_family
from lmcore.hf.weights import permute_from_hf, permute_to_hf

__all__ = [
    "ARCHITECTURES",
    "Architecture",
    "check_shapes",
    "config_to_metadata",
    "family",
    "from_gguf_tensors",
    "metadata_to_config",
    "to_gguf_tensors",
]


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
    # GGUF tensor name -> Hugging Face tensor name; "{i}" is the layer
    tensors: tuple[tuple[str, str], ...]
    # Hugging Face tensor name -> config field giving the heads its rows were permuted by
    permuted: Mapping[str, str]


LLAMA: Final = Architecture(
    name="llama",
    family="llama",
    model_type="llama",
    fields=(
        ("vocab_size", "vocab_size"),
        ("context_length", "max_position_embeddings"),
        ("embedding_length", "hidden_size"),
        ("block_count", "num_hidden_layers"),
        ("feed_forward_length", "intermediate_size"),
        ("attention.head_count", "num_attention_heads"),
        ("attention.head_count_kv", "num_key_value_heads"),
        ("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        ("rope.freq_base", "rope_theta"),
    ),
    head_keys=("rope.dimension_count", "attention.key_length", "attention.value_length"),
    trivial={
        "rope.scaling.type": ("none",),
        "rope.scaling.factor": (1, 1.0),
        "expert_count": (0,),
        "expert_used_count": (0,),
    },
    tensors=(
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("blk.{i}.attn_norm.weight", "model.layers.{i}.input_layernorm.weight"),
        ("blk.{i}.attn_q.weight", "model.layers.{i}.self_attn.q_proj.weight"),
        ("blk.{i}.attn_k.weight", "model.layers.{i}.self_attn.k_proj.weight"),
        ("blk.{i}.attn_v.weight", "model.layers.{i}.self_attn.v_proj.weight"),
        ("blk.{i}.attn_output.weight", "model.layers.{i}.self_attn.o_proj.weight"),
        ("blk.{i}.ffn_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"),
        ("blk.{i}.ffn_gate.weight", "model.layers.{i}.mlp.gate_proj.weight"),
        ("blk.{i}.ffn_up.weight", "model.layers.{i}.mlp.up_proj.weight"),
        ("blk.{i}.ffn_down.weight", "model.layers.{i}.mlp.down_proj.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
    ),
    permuted={
        "self_attn.q_proj.weight": "num_attention_heads",
        "self_attn.k_proj.weight": "num_key_value_heads",
    },
)

_LLAMA_FIELDS: Final = LLAMA.fields
_NO_SCALING: Final = {"rope.scaling.type": ("none",), "rope.scaling.factor": (1, 1.0)}
_NO_EXPERTS: Final = {"expert_count": (0,), "expert_used_count": (0,)}


def _layer(gguf: str, hf: str) -> tuple[str, str]:
    return (f"blk.{{i}}.{gguf}", f"model.layers.{{i}}.{hf}")


# Qwen's converters keep Hugging Face's row order (only Llama's permutes q and k): no permutation.
QWEN2: Final = Architecture(
    name="qwen2",
    family="qwen2",
    model_type="qwen2",
    fields=_LLAMA_FIELDS,
    head_keys=LLAMA.head_keys,
    trivial={**_NO_SCALING, **_NO_EXPERTS},
    tensors=(
        *LLAMA.tensors,
        _layer("attn_q.bias", "self_attn.q_proj.bias"),
        _layer("attn_k.bias", "self_attn.k_proj.bias"),
        _layer("attn_v.bias", "self_attn.v_proj.bias"),
    ),
    permuted={},
)
# Qwen 3: q/k RMSNorms per head, no biases, heads as wide as `attention.key_length` says.
QWEN3: Final = Architecture(
    name="qwen3",
    family="qwen3",
    model_type="qwen3",
    fields=(*_LLAMA_FIELDS, ("attention.key_length", "head_dim")),
    head_keys=("rope.dimension_count", "attention.value_length"),
    trivial={**_NO_SCALING, **_NO_EXPERTS},
    tensors=(
        *LLAMA.tensors,
        _layer("attn_q_norm.weight", "self_attn.q_norm.weight"),
        _layer("attn_k_norm.weight", "self_attn.k_norm.weight"),
    ),
    permuted={},
)

ARCHITECTURES: Final[Mapping[str, Architecture]] = {a.name: a for a in (LLAMA, QWEN2, QWEN3)}
# Metadata outside the architecture's keys that never changes the function: kept, not mapped.
PASSIVE_PREFIXES: Final = ("general.", "quantize.", "tokenizer.")
# Tensors whose presence asks for what lmcore cannot express.
_REFUSED_TENSORS: Final = {
    "rope_freqs.weight": "per-frequency RoPE scaling factors (Llama 3.1's rope scaling)",
}


def architecture(name: str, where: object) -> Architecture:
    if name not in ARCHITECTURES:
        raise ConversionError(
            f"{where}: general.architecture is {name!r}; lmcore converts {one_of(ARCHITECTURES)}"
        )
    return ARCHITECTURES[name]


def family(arch: Architecture) -> Family:
    """The Hugging Face family whose tables map the renamed config and tensors."""
    return hf_family(arch.family)


def metadata_to_config(
    metadata: Mapping[str, Any],
    tensors: Mapping[str, tuple[int, ...]],
    where: object,
    *,
    ignore: Iterable[str] = (),
) -> dict[str, Any]:
    """The Hugging Face config.json that a GGUF's metadata describes (`tensors`: name ->
    shape, for what only the tensors say: tied embeddings, a missing vocab_size), or
    `ConversionError` naming every key lmcore does not know or cannot express."""
    arch = architecture(str(metadata.get("general.architecture")), where)
    prefix = f"{arch.name}."
    known = {prefix + k for k, _ in arch.fields} | {prefix + k for k in arch.head_keys}
    problems = []
    for key, allowed in arch.trivial.items():
        value = metadata.get(prefix + key)
        if value is not None and value not in allowed:
            problems.append(f"{prefix}{key}={value!r} (lmcore converts {allowed[0]!r} only)")
        known.add(prefix + key)
    unknown = sorted(
        k for k in metadata
        if k not in known and not k.startswith(PASSIVE_PREFIXES) and k not in set(ignore)
    )  # fmt: skip
    if unknown:
        problems.append(
            f"keys lmcore does not know, which may change the model: {', '.join(unknown)} (if "
            "you know one does not, pass --ignore-field NAME / ignore=[NAME])"
        )
    for name, why in _REFUSED_TENSORS.items():
        if name in tensors:
            problems.append(f"tensor {name}: {why}")
    config: dict[str, Any] = {"model_type": arch.model_type}
    for key, hf in arch.fields:
        if prefix + key in metadata:
            config[hf] = metadata[prefix + key]
    embed = tensors.get(_gguf_name(arch, "model.embed_tokens.weight"))
    if "vocab_size" not in config and embed is not None:
        config["vocab_size"] = embed[0]
    config["tie_word_embeddings"] = _gguf_name(arch, "lm_head.weight") not in tensors
    d, heads = config.get("hidden_size"), config.get("num_attention_heads")
    width, said = config.get("head_dim"), f"{prefix}attention.key_length"
    if width is None and isinstance(d, int) and isinstance(heads, int) and heads > 0:
        width = d // heads if d % heads == 0 else None
        said = "embedding_length / head_count"
    if isinstance(width, int):
        for key in arch.head_keys:
            value = metadata.get(prefix + key)
            if value is not None and value != width:
                problems.append(
                    f"{prefix}{key}={value} (lmcore's heads are {said} = {width} wide, and "
                    "rotate all of it)"
                )
    if problems:
        raise ConversionError(
            f"{where}: cannot convert this GGUF file to lmcore without losing something: "
            + "; ".join(problems)
        )
    return config


def spec_of(config: Mapping[str, Any], arch: Architecture, where: object) -> str:
    """The spec from the family's table, its messages naming GGUF's keys, not config.json's."""
    try:
        spec = read_config(config, str(where), family=family(arch)).spec
    except ConversionError as e:
        text = re.sub(r"this Hugging Face \w+ config", "this GGUF file", str(e))
        for key, hf in arch.fields:
            text = re.sub(rf"\b{re.escape(hf)}\b", f"{arch.name}.{key}", text)
        raise ConversionError(text) from None
    return spec


# A Hugging Face tensor (by its last two name parts) -> its shape, in symbols `check_shapes`
# gives values to: V vocabulary, d model width, q query width, kv key/value width, ff hidden
# width of the FFN, hd head width.
_SHAPES: Final[Mapping[str, tuple[str, ...]]] = {
    "embed_tokens.weight": ("V", "d"),
    "lm_head.weight": ("V", "d"),
    "norm.weight": ("d",),
    "input_layernorm.weight": ("d",),
    "post_attention_layernorm.weight": ("d",),
    "q_proj.weight": ("q", "d"),
    "k_proj.weight": ("kv", "d"),
    "v_proj.weight": ("kv", "d"),
    "o_proj.weight": ("d", "q"),
    "gate_proj.weight": ("ff", "d"),
    "up_proj.weight": ("ff", "d"),
    "down_proj.weight": ("d", "ff"),
    "q_proj.bias": ("q",),
    "k_proj.bias": ("kv",),
    "v_proj.bias": ("kv",),
    "q_norm.weight": ("hd",),
    "k_norm.weight": ("hd",),
}


def _count(config: Mapping[str, Any], field: str) -> int | None:
    value = config.get(field)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _dimensions(
    arch: Architecture, config: Mapping[str, Any], metadata: Mapping[str, Any]
) -> dict[str, tuple[int, str]]:
    """Each shape symbol's value and the metadata keys it comes from (symbols whose keys are
    missing or not positive integers are left out: reading the config refuses those)."""
    p = f"{arch.name}."
    d, heads = _count(config, "hidden_size"), _count(config, "num_attention_heads")
    kv_heads = _count(config, "num_key_value_heads") or heads
    out: dict[str, tuple[int, str]] = {}
    vocab = _count(config, "vocab_size")
    if vocab is not None:
        said = f"{p}vocab_size" if p + "vocab_size" in metadata else "token_embd.weight's rows"
        out["V"] = (vocab, said)
    if d is not None:
        out["d"] = (d, f"{p}embedding_length")
    ff = _count(config, "intermediate_size")
    if ff is not None:
        out["ff"] = (ff, f"{p}feed_forward_length")
    width = _count(config, "head_dim")
    said = f"{p}attention.key_length"
    if width is None and d is not None and heads is not None and d % heads == 0:
        width, said = d // heads, f"{p}embedding_length / {p}attention.head_count"
    if width is None:
        return out
    out["hd"] = (width, said)
    if heads is not None:
        out["q"] = (heads * width, f"{p}attention.head_count {heads} x head width {width} ({said})")
    if kv_heads is not None:
        key = f"{p}attention.head_count_kv" if p + "attention.head_count_kv" in metadata else (
            f"{p}attention.head_count"
        )
        out["kv"] = (kv_heads * width, f"{key} {kv_heads} x head width {width} ({said})")
    return out


def check_shapes(
    arch: Architecture,
    config: Mapping[str, Any],
    metadata: Mapping[str, Any],
    shapes: Mapping[str, tuple[int, ...]],
    where: object,
) -> None:
    """`ConversionError` naming the first tensor whose shape is not the one the metadata
    gives it (checked before any tensor is read, reshaped or un-permuted), with the shape the
    metadata implies and the keys each dimension comes from."""
    dims = _dimensions(arch, config, metadata)
    rules = [(_pattern(g), h) for g, h in arch.tensors]
    for name, shape in shapes.items():
        hf = _rename(name, rules)
        symbols = None if hf is None else _SHAPES.get(".".join(hf.split(".")[-2:]))
        if symbols is None or not all(s in dims for s in symbols):
            continue  # a name lmcore does not know: the family's strict check lists it
        expected = tuple(dims[s][0] for s in symbols)
        if tuple(shape) != expected:
            sources = "; ".join(f"{dims[s][0]}: {dims[s][1]}" for s in dict.fromkeys(symbols))
            raise ConversionError(
                f"{where}: tensor {name} has shape {tuple(shape)}, but the metadata gives it "
                f"{expected} ({sources}); the file's tensors do not match its metadata (damaged, "
                "or written by a broken converter): fetch or convert it again"
            )


def config_to_metadata(config: Mapping[str, Any], arch: Architecture) -> dict[str, Any]:
    """The architecture's metadata keys for a Hugging Face config (`--to-gguf`)."""
    out = {f"{arch.name}.{k}": config[hf] for k, hf in arch.fields if config.get(hf) is not None}
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    for key in arch.head_keys:
        out[f"{arch.name}.{key}"] = head_dim
    return out


def _gguf_name(arch: Architecture, hf: str) -> str:
    return next(g for g, h in arch.tensors if h == hf)


def _heads(arch: Architecture, config: Mapping[str, Any], hf_name: str) -> int | None:
    """The head count a tensor's rows are permuted by (None: not permuted); the key-value
    heads default to the attention heads, as in config.json."""
    for suffix, field in arch.permuted.items():
        if hf_name.endswith(suffix):
            heads: int = config.get(field) or config["num_attention_heads"]
            return heads
    return None


def _pattern(template: str) -> re.Pattern[str]:
    return re.compile(re.escape(template).replace(r"\{i\}", r"(\d+)"))


def _rename(name: str, rules: list[tuple[re.Pattern[str], str]]) -> str | None:
    """`name` under the first rule whose pattern it matches (its layer carried over), or None."""
    for pattern, target in rules:
        m = pattern.fullmatch(name)
        if m:
            return target.replace("{i}", m.group(1)) if m.groups() else target
    return None


def from_gguf_tensors(
    tensors: Mapping[str, Tensor], arch: Architecture, config: Mapping[str, Any]
) -> dict[str, Tensor]:
    """GGUF tensors under Hugging Face's names, llama.cpp's q/k row permutation undone (names
    the table does not know are kept, for the family's strict check to list)."""
    rules = [(_pattern(g), h) for g, h in arch.tensors]
    out: dict[str, Tensor] = {}
    for name, t in tensors.items():
        renamed = _rename(name, rules)
        if renamed is None:
            out[name] = t
            continue
        heads = _heads(arch, config, renamed)
        out[renamed] = permute_to_hf(t, heads) if heads else t
    return out


def to_gguf_tensors(
    tensors: Mapping[str, Tensor], arch: Architecture, config: Mapping[str, Any]
) -> dict[str, Tensor]:
    """Hugging Face tensors under GGUF's names, q/k rows permuted as llama.cpp stores them."""
    rules = [(_pattern(h), g) for g, h in arch.tensors]
    out: dict[str, Tensor] = {}
    for name, t in tensors.items():
        renamed = _rename(name, rules)
        if renamed is None:
            raise ConversionError(f"tensor {name} has no GGUF name in the {arch.name} table")
        heads = _heads(arch, config, name)
        out[renamed] = permute_from_hf(t, heads).contiguous() if heads else t
    return out
