"""The GGUF architectures lmcore converts: per architecture, its metadata keys as the fields of a
Hugging Face config, its tensor names as Hugging Face's, and how llama.cpp's converter changed
the tensors (permuted rows, offset norm gains, transposed or regrouped matrices, stacked experts).

A GGUF file is what llama.cpp's converter (convert_hf_to_gguf.py) made of a Hugging Face model,
under other names, so each architecture here is a renaming onto one of lmcore's Hugging Face
families (`lmcore.hf.<family>`), whose tables then map the config to a spec and the tensors to
lmcore's keys (refusing what lmcore cannot express, by the same rules as `--from-hf`):

    GGUF metadata --Architecture.fields, .derived, .defaults--> config.json --hf family--> spec
    GGUF tensors  --Architecture.tensors, changes undone--> HF state dict --> lmcore's keys

What llama.cpp's converter changes, undone here on reading and redone on writing:
  - Llama (and Mixtral, written as `llama`): each q/k head's rows interleaved (2i, 2i + 1), the
    layout its rotary kernel (and lmcore's) rotates, where Hugging Face keeps them half-split.
  - Gemma, Gemma 2: every `*norm.weight` stored as `1 + w` (llama.cpp's RMSNorm multiplies by
    the gain; Gemma's computes x · (1 + w)).
  - GPT-2: the Conv1D weights (in, out) transposed to (out, in).
  - GPT-NeoX: query_key_value's rows regrouped from per-head (q, k, v) to q, then k, then v.
  - Mixture-of-experts: each expert's matrices stacked into one 3-D tensor per layer
    (`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`: experts x out x in).
A metadata key the table does not know is refused unless ignored, naming it, as an unknown
config.json field is by `--from-hf`; what llama.cpp's architecture fixes and the file does not
say (Gemma's tied embeddings, Qwen3-MoE's renormalised top-k, Gemma 2's attention scale) is set
as llama.cpp sets it.

Writing (`writable`) goes the other way, then reads the metadata it wrote back through the same
tables and compares the spec with the model's: whatever a GGUF architecture cannot say (a
Mistral's sliding window under `llama`, GPT-2's per-layer attention scale, Gemma 2 without soft
caps) is refused by name before a byte is written.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from lmcore.blueprint import Blueprint, parse_spec
from lmcore.errors import ConversionError, one_of
from lmcore.gguf.deepseek2 import DEEPSEEK2
from lmcore.gguf.falcon_h1 import FALCON_H1
from lmcore.gguf.gpt_oss import GPT_OSS
from lmcore.gguf.lfm2 import LFM2
from lmcore.gguf.mamba2 import MAMBA2
from lmcore.gguf.olmo3 import OLMO3
from lmcore.gguf.qwen3next import QWEN3NEXT
from lmcore.gguf.rows import (
    _ATTENTION,
    _ENDS,
    _HEAD_KEYS,
    _LLAMA_FIELDS,
    _LLAMA_PERMUTED,
    _MLP,
    _NO_EXPERTS,
    _NO_SCALING,
    _PRENORMS,
    _QK_NORMS,
    _ROPE,
    Architecture,
    Derived,
    Meta,
    _experts,
    _head_dim,
    positive,
)
from lmcore.gguf.rows import both as _both
from lmcore.gguf.rows import layer as _layer
from lmcore.gguf.smollm3 import SMOLLM3
from lmcore.hf.family import Family, differences, read_config
from lmcore.hf.family import family as hf_family

__all__ = [
    "ARCHITECTURES",
    "WRITE_ORDER",
    "Architecture",
    "Derived",
    "Meta",
    "architecture",
    "config_to_metadata",
    "family",
    "metadata_to_config",
    "positive",
    "relative",
    "spec_of",
    "writable",
]

def _rotated(fraction_field: str) -> Derived:
    """`rope.dimension_count` (the rotated width of each head) <-> a partial-rotary fraction."""

    def read(meta: Meta, config: dict[str, Any]) -> None:
        rot, width = meta.get("rope.dimension_count"), _head_dim(meta)
        if rot is None:
            return
        config[fraction_field] = rot / width if positive(rot) and width else rot

    def write(config: Mapping[str, Any], meta: dict[str, Any]) -> None:
        d, heads = config["hidden_size"], config["num_attention_heads"]
        fraction = config.get(fraction_field)
        meta["rope.dimension_count"] = int((1.0 if fraction is None else fraction) * d) // heads

    return Derived(("rope.dimension_count",), read, write,
                   ((fraction_field, "rope.dimension_count"),))  # fmt: skip


def _window_or_zero(key: str) -> Derived:
    """A sliding window whose 0 means none (Phi-3's converter writes 0 for a null window)."""

    def read(meta: Meta, config: dict[str, Any]) -> None:
        if key in meta:
            config["sliding_window"] = meta[key] or None

    def write(config: Mapping[str, Any], meta: dict[str, Any]) -> None:
        meta[key] = config.get("sliding_window") or 0

    return Derived((key,), read, write, (("sliding_window", key),))


def _gemma_scale(big: int) -> Callable[[Meta, dict[str, Any]], None]:
    """llama.cpp's Gemma 2 and 3 scale q·k by 1/sqrt(head width), except for their 27B
    models' (`big` layers) 1/sqrt(embedding / heads); the file holds no key for it."""

    def read(meta: Meta, config: dict[str, Any]) -> None:
        d, heads = positive(meta.get("embedding_length")), positive(meta.get("attention.head_count"))
        width = _head_dim(meta)
        if meta.get("block_count") == big and d and heads:
            config["query_pre_attn_scalar"] = d // heads
        elif width:
            config["query_pre_attn_scalar"] = width

    return read


def _linear_read(meta: Meta, config: dict[str, Any]) -> None:
    """`rope.scaling.type` linear and its factor: Gemma 3's scaled global layers."""
    kind = meta.get("rope.scaling.type")
    if kind not in (None, "none"):
        config["rope_scaling"] = {"rope_type": kind, "factor": meta.get("rope.scaling.factor")}


def _linear_write(config: Mapping[str, Any], meta: dict[str, Any]) -> None:
    scaling = config.get("rope_scaling")
    if isinstance(scaling, dict) and scaling.get("rope_type", "default") != "default":
        meta["rope.scaling.type"] = scaling["rope_type"]
        meta["rope.scaling.factor"] = scaling.get("factor")


def _gpt2_ff(meta: Meta, config: dict[str, Any]) -> None:
    if "feed_forward_length" in meta:
        config["n_inner"] = meta["feed_forward_length"]


def _gpt2_ff_write(config: Mapping[str, Any], meta: dict[str, Any]) -> None:
    meta["feed_forward_length"] = config.get("n_inner") or 4 * config["n_embd"]


def _nothing(config: Mapping[str, Any], meta: dict[str, Any]) -> None:
    """Written by no key: the read-back check refuses a model whose value differs."""


LLAMA: Final = Architecture(
    name="llama",
    family="llama",
    model_type="llama",
    fields=_LLAMA_FIELDS,
    head_keys=_HEAD_KEYS,
    trivial={**_NO_SCALING, **_NO_EXPERTS},
    tensors=(*_ENDS, *_PRENORMS, *_ATTENTION, *_MLP),
    permuted=_LLAMA_PERMUTED,
    defaults=_ROPE,
)
# Mixtral is a `llama` with experts (`llama.expert_count` > 0), its q/k permuted as Llama's.
LLAMA_MOE: Final = Architecture(
    name="llama",
    family="mixtral",
    model_type="mixtral",
    fields=(
        *_LLAMA_FIELDS,
        ("expert_count", "num_local_experts"),
        ("expert_used_count", "num_experts_per_tok"),
    ),
    head_keys=_HEAD_KEYS,
    trivial=_NO_SCALING,
    tensors=(
        *_ENDS,
        *_PRENORMS,
        *_ATTENTION,
        *_experts("block_sparse_moe", ("w1", "w3", "w2")),
    ),
    permuted=_LLAMA_PERMUTED,
    defaults=_ROPE,
)
# Qwen's converters keep Hugging Face's row order (only Llama's permutes q and k): no permutation.
QWEN2: Final = Architecture(
    name="qwen2",
    family="qwen2",
    model_type="qwen2",
    fields=_LLAMA_FIELDS,
    head_keys=_HEAD_KEYS,
    trivial={**_NO_SCALING, **_NO_EXPERTS},
    tensors=(
        *LLAMA.tensors,
        _layer("attn_q.bias", "self_attn.q_proj.bias"),
        _layer("attn_k.bias", "self_attn.k_proj.bias"),
        _layer("attn_v.bias", "self_attn.v_proj.bias"),
    ),
    defaults=_ROPE,
)
# Qwen 3: q/k RMSNorms per head, no biases, heads as wide as `attention.key_length` says.
QWEN3: Final = Architecture(
    name="qwen3",
    family="qwen3",
    model_type="qwen3",
    fields=(*_LLAMA_FIELDS, ("attention.key_length", "head_dim")),
    head_keys=("rope.dimension_count", "attention.value_length"),
    trivial={**_NO_SCALING, **_NO_EXPERTS},
    tensors=(*LLAMA.tensors, *_QK_NORMS),
    defaults=_ROPE,
)
# Qwen3-MoE: every layer's FFN is the experts (llama.cpp has no dense layers here) and the top-k
# weights are always renormalised (llama.cpp's qwen3moe graph; transformers' GGUF loader agrees).
QWEN3MOE: Final = Architecture(
    name="qwen3moe",
    family="qwen3_moe",
    model_type="qwen3_moe",
    fields=(
        *QWEN3.fields,
        ("expert_count", "num_experts"),
        ("expert_used_count", "num_experts_per_tok"),
        ("expert_feed_forward_length", "moe_intermediate_size"),
    ),
    head_keys=QWEN3.head_keys,
    trivial={**_NO_SCALING, "expert_weights_norm": (True,)},
    tensors=(*_ENDS, *_PRENORMS, *_ATTENTION, *_QK_NORMS, *_experts("mlp", ("gate_proj",
             "up_proj", "down_proj"))),  # fmt: skip
    defaults=_ROPE,
    fixed={"norm_topk_prob": True, "mlp_only_layers": [], "decoder_sparse_step": 1},
)
# Gemma: tied embeddings always (the architecture has no output tensor), norm gains + 1.
GEMMA: Final = Architecture(
    name="gemma",
    family="gemma",
    model_type="gemma",
    fields=(*_LLAMA_FIELDS, ("attention.key_length", "head_dim")),
    head_keys=("rope.dimension_count", "attention.value_length"),
    trivial={**_NO_SCALING, **_NO_EXPERTS},
    tensors=(*(t for t in _ENDS if t[0] != "output.weight"), *_PRENORMS, *_ATTENTION, *_MLP),
    defaults=_ROPE,
    fixed={"tie_word_embeddings": True},
    norm_offset=True,
)
# Gemma 2: sandwich norms, soft caps (llama.cpp's defaults 50 and 30 when absent), a window on
# the even layers (4,096 when absent), and the attention scale llama.cpp derives (`_gemma2_scale`).
GEMMA2: Final = Architecture(
    name="gemma2",
    family="gemma2",
    model_type="gemma2",
    fields=(
        *GEMMA.fields,
        ("attn_logit_softcapping", "attn_logit_softcapping"),
        ("final_logit_softcapping", "final_logit_softcapping"),
        ("attention.sliding_window", "sliding_window"),
    ),
    head_keys=GEMMA.head_keys,
    trivial=GEMMA.trivial,
    tensors=(
        *GEMMA.tensors[:2],
        _layer("attn_norm.weight", "input_layernorm.weight"),
        _layer("post_attention_norm.weight", "post_attention_layernorm.weight"),
        _layer("ffn_norm.weight", "pre_feedforward_layernorm.weight"),
        _layer("post_ffw_norm.weight", "post_feedforward_layernorm.weight"),
        *_ATTENTION,
        *_MLP,
    ),
    defaults={
        **_ROPE,
        "sliding_window": 4096,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    },
    fixed={"tie_word_embeddings": True},
    derived=(Derived((), _gemma_scale(46), _nothing),),
    norm_offset=True,
)
# Gemma 3: Gemma 2 with (1 + w) q/k norms (stored + 1 too), no soft caps, five local layers
# (window, base 10,000) to one global (rope.freq_base, linearly scaled by rope.scaling.*), as
# llama.cpp fixes them (set_swa_pattern(6), rope_freq_base_train_swa = 10000).
GEMMA3: Final = Architecture(
    name="gemma3",
    family="gemma3_text",
    model_type="gemma3_text",
    fields=(*GEMMA.fields, ("attention.sliding_window", "sliding_window")),
    head_keys=GEMMA.head_keys,
    trivial=_NO_EXPERTS,
    tensors=(*GEMMA2.tensors, ("output.weight", "lm_head.weight"), *_QK_NORMS),
    defaults=_ROPE,
    fixed={
        "rope_local_base_freq": 10000.0,
        "sliding_window_pattern": 6,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
    },
    derived=(
        Derived((), _gemma_scale(62), _nothing),
        Derived(("rope.scaling.type", "rope.scaling.factor"), _linear_read, _linear_write,
                (("rope_scaling", "rope.scaling.type"),)),  # fmt: skip
    ),
    norm_offset=True,
)
# Phi-3: fused qkv and gate_up (as Hugging Face's), a partial rotation by rope.dimension_count,
# a sliding window (0: none) that is read as the Hugging Face model applies it, though
# llama.cpp's graph leaves it out.
PHI3: Final = Architecture(
    name="phi3",
    family="phi3",
    model_type="phi3",
    fields=(
        *(f for f in _LLAMA_FIELDS),
        ("rope.scaling.original_context_length", "original_max_position_embeddings"),
    ),
    head_keys=("attention.key_length", "attention.value_length"),
    trivial={**_NO_SCALING, **_NO_EXPERTS},
    tensors=(
        *_ENDS,
        *_PRENORMS,
        _layer("attn_qkv.weight", "self_attn.qkv_proj.weight"),
        _layer("attn_output.weight", "self_attn.o_proj.weight"),
        _layer("ffn_up.weight", "mlp.gate_up_proj.weight"),
        _layer("ffn_down.weight", "mlp.down_proj.weight"),
    ),
    defaults=_ROPE,
    derived=(_rotated("partial_rotary_factor"), _window_or_zero("attention.sliding_window")),
    shapes={"ffn_up.weight": ("ff2", "d")},
    unused={"sliding_window": "llama.cpp disables Phi-3's sliding window (llama.cpp#13676)"},
)
# OLMo 2: norms after each sub-layer, q/k RMSNorms over all heads together.
OLMO2: Final = Architecture(
    name="olmo2",
    family="olmo2",
    model_type="olmo2",
    fields=_LLAMA_FIELDS,
    head_keys=_HEAD_KEYS,
    trivial={**_NO_SCALING, **_NO_EXPERTS},
    tensors=(
        *_ENDS,
        *_ATTENTION,
        *_MLP,
        *_QK_NORMS,
        _layer("post_attention_norm.weight", "post_attention_layernorm.weight"),
        _layer("post_ffw_norm.weight", "post_feedforward_layernorm.weight"),
    ),
    defaults=_ROPE,
    shapes={"attn_q_norm.weight": ("q",), "attn_k_norm.weight": ("kv",)},
)
_H: Final = "transformer.h.{i}"
# GPT-2: learned positions, LayerNorms with biases, Conv1D weights stored transposed.
GPT2: Final = Architecture(
    name="gpt2",
    family="gpt2",
    model_type="gpt2",
    fields=(
        ("vocab_size", "vocab_size"),
        ("context_length", "n_positions"),
        ("embedding_length", "n_embd"),
        ("block_count", "n_layer"),
        ("attention.head_count", "n_head"),
        ("attention.layer_norm_epsilon", "layer_norm_epsilon"),
    ),
    head_keys=(),
    trivial={},
    tensors=(
        ("token_embd.weight", "transformer.wte.weight"),
        ("position_embd.weight", "transformer.wpe.weight"),
        *_both("output_norm", "transformer.ln_f"),
        ("output.weight", "lm_head.weight"),
        *_both("blk.{i}.attn_norm", f"{_H}.ln_1"),
        *_both("blk.{i}.attn_qkv", f"{_H}.attn.c_attn"),
        *_both("blk.{i}.attn_output", f"{_H}.attn.c_proj"),
        *_both("blk.{i}.ffn_norm", f"{_H}.ln_2"),
        *_both("blk.{i}.ffn_up", f"{_H}.mlp.c_fc"),
        *_both("blk.{i}.ffn_down", f"{_H}.mlp.c_proj"),
    ),
    derived=(Derived(("feed_forward_length",), _gpt2_ff, _gpt2_ff_write,
                     (("n_inner", "feed_forward_length"),)),),  # fmt: skip
    transposed=("c_attn.weight", "c_proj.weight", "c_fc.weight"),
)
_NEOX: Final = "gpt_neox.layers.{i}"
# GPT-NeoX: parallel residual (or not), partial rotation, q/k/v rows regrouped per head.
GPTNEOX: Final = Architecture(
    name="gptneox",
    family="gpt_neox",
    model_type="gpt_neox",
    fields=(
        ("vocab_size", "vocab_size"),
        ("context_length", "max_position_embeddings"),
        ("embedding_length", "hidden_size"),
        ("block_count", "num_hidden_layers"),
        ("feed_forward_length", "intermediate_size"),
        ("attention.head_count", "num_attention_heads"),
        ("attention.layer_norm_epsilon", "layer_norm_eps"),
        ("use_parallel_residual", "use_parallel_residual"),
        ("rope.freq_base", "rotary_emb_base"),
    ),
    head_keys=("attention.key_length", "attention.value_length"),
    trivial=_NO_SCALING,
    tensors=(
        ("token_embd.weight", "gpt_neox.embed_in.weight"),
        *_both("output_norm", "gpt_neox.final_layer_norm"),
        ("output.weight", "embed_out.weight"),
        *_both("blk.{i}.attn_norm", f"{_NEOX}.input_layernorm"),
        *_both("blk.{i}.ffn_norm", f"{_NEOX}.post_attention_layernorm"),
        *_both("blk.{i}.attn_qkv", f"{_NEOX}.attention.query_key_value"),
        *_both("blk.{i}.attn_output", f"{_NEOX}.attention.dense"),
        *_both("blk.{i}.ffn_up", f"{_NEOX}.mlp.dense_h_to_4h"),
        *_both("blk.{i}.ffn_down", f"{_NEOX}.mlp.dense_4h_to_h"),
    ),
    defaults={"rotary_emb_base": 10000.0, "use_parallel_residual": True},
    derived=(_rotated("rotary_pct"),),
    per_head={"query_key_value.weight": "num_attention_heads",
              "query_key_value.bias": "num_attention_heads"},  # fmt: skip
)

# The architectures in modules of their own (lmcore/gguf/<name>.py, built on lmcore.gguf.rows).
OWN_MODULES: Final = (GPT_OSS, DEEPSEEK2, SMOLLM3, LFM2, QWEN3NEXT, MAMBA2, FALCON_H1)
ARCHITECTURES: Final[Mapping[str, Architecture]] = {
    a.name: a
    for a in (LLAMA, QWEN2, QWEN3, QWEN3MOE, GEMMA, GEMMA2, GEMMA3, PHI3, OLMO2, GPT2, GPTNEOX)
} | {a.name: a for a in OWN_MODULES}
# What `--to-gguf` tries, in order, when nothing names the architecture: the first whose
# family expresses the model and whose metadata reads back as the same model.
WRITE_ORDER: Final = (
    LLAMA, QWEN2, QWEN3, GEMMA, GEMMA2, GEMMA3, OLMO2, PHI3, GPT2, GPTNEOX, LLAMA_MOE, QWEN3MOE,
    *OWN_MODULES, OLMO3,
)  # fmt: skip
# Hugging Face model_type -> the architecture a model converted from it is written as first.
BY_MODEL_TYPE: Final[Mapping[str, Architecture]] = {
    **{a.model_type: a for a in WRITE_ORDER},
    "mistral": LLAMA,  # llama.cpp's converter writes Mistral as `llama`
}
# Metadata outside the architecture's keys that never changes the function: kept, not mapped.
PASSIVE_PREFIXES: Final = ("general.", "quantize.", "tokenizer.")
# Tensors whose presence asks for what lmcore cannot express.
_REFUSED_TENSORS: Final = {
    "rope_freqs.weight": "per-frequency RoPE scaling factors (Llama 3.1's rope scaling)",
    "rope_factors_long.weight": "LongRoPE's per-frequency factors (Phi-3's 128k models)",
    "rope_factors_short.weight": "LongRoPE's per-frequency factors (Phi-3's 128k models)",
}


def architecture(name: str, where: object, metadata: Meta | None = None) -> Architecture:
    """The architecture `general.architecture` names (a `llama` with experts is Mixtral's), or
    `ConversionError` naming the ones lmcore converts."""
    if name not in ARCHITECTURES:
        raise ConversionError(
            f"{where}: general.architecture is {name!r}; lmcore converts {one_of(ARCHITECTURES)}"
        )
    experts = (metadata or {}).get("llama.expert_count")
    if name == "llama" and positive(experts):
        return LLAMA_MOE
    if name == "olmo2" and "olmo2.attention.sliding_window" in (metadata or {}):
        return OLMO3  # llama.cpp's converter writes OLMo 3 as olmo2 with a window
    return ARCHITECTURES[name]


def family(arch: Architecture) -> Family:
    """The Hugging Face family whose tables map the renamed config and tensors."""
    return hf_family(arch.family)


def relative(metadata: Meta, arch: Architecture) -> dict[str, Any]:
    """The architecture's keys of `metadata`, without the "{arch}." prefix."""
    prefix = f"{arch.name}."
    return {k[len(prefix) :]: v for k, v in metadata.items() if k.startswith(prefix)}


def metadata_to_config(
    metadata: Meta,
    tensors: Mapping[str, tuple[int, ...]],
    where: object,
    *,
    ignore: Iterable[str] = (),
) -> dict[str, Any]:
    """The Hugging Face config.json that a GGUF's metadata describes (`tensors`: name ->
    shape, for what only the tensors say: tied embeddings, a missing vocab_size), or
    `ConversionError` naming every key lmcore does not know or cannot express."""
    arch = architecture(str(metadata.get("general.architecture")), where, metadata)
    prefix = f"{arch.name}."
    meta = relative(metadata, arch)
    problems = []
    for key, allowed in arch.trivial.items():
        value = meta.get(key)
        if value is not None and value not in allowed:
            problems.append(f"{prefix}{key}={value!r} (lmcore converts {allowed[0]!r} only)")
    known = {prefix + k for k in arch.keys}
    ignored = set(ignore)
    unknown = sorted(
        k for k in metadata
        if k not in known and not k.startswith(PASSIVE_PREFIXES) and k not in ignored
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
        if key in meta:
            config[hf] = meta[key]
    for hf, value in arch.defaults.items():
        config.setdefault(hf, value)
    fields = dict(arch.fields)
    if "attention.head_count_kv" in fields and "attention.head_count_kv" not in meta:
        # llama.cpp's default, where a family's own may differ (Mistral's 8)
        config.setdefault("num_key_value_heads", meta.get("attention.head_count"))
    for derived in arch.derived:
        derived.read(meta, config)
    config.update(arch.fixed)
    vocab = fields.get("vocab_size", "vocab_size")
    embed = tensors.get("token_embd.weight")
    if vocab not in config and embed is not None:
        config[vocab] = embed[0]
    if "tie_word_embeddings" not in arch.fixed:
        config["tie_word_embeddings"] = "output.weight" not in tensors
    width = positive(meta.get("attention.key_length"))
    said = f"{prefix}attention.key_length"
    if width is None:
        width, said = _head_dim(meta), "embedding_length / head_count"
    if width is not None:
        for key in arch.head_keys:
            value = meta.get(key)
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
        names = (*arch.fields, *((k, f) for d in arch.derived for f, k in d.names))
        for key, hf in names:
            text = re.sub(rf"\b{re.escape(hf)}\b", f"{arch.name}.{key}", text)
        raise ConversionError(text) from None
    return spec


def config_to_metadata(config: Mapping[str, Any], arch: Architecture) -> dict[str, Any]:
    """The architecture's metadata keys for a Hugging Face config (`--to-gguf`)."""
    meta: dict[str, Any] = {k: config[hf] for k, hf in arch.fields if config.get(hf) is not None}
    fields = dict(arch.fields)
    for key in arch.head_keys:  # (an architecture without attention has none)
        d, heads = config[fields["embedding_length"]], config[fields["attention.head_count"]]
        meta[key] = config.get("head_dim") or d // heads
    for derived in arch.derived:
        derived.write(config, meta)
    return {f"{arch.name}.{k}": v for k, v in meta.items()}


def writable(
    bp: Blueprint, config: Mapping[str, Any], arch: Architecture
) -> tuple[dict[str, Any], list[str]]:
    """The metadata `arch` gives the model whose family config is `config`, and what would be
    lost: the metadata read back through the same tables, compared with the model key by key
    (empty when nothing is)."""
    metadata = {"general.architecture": arch.name, **config_to_metadata(config, arch)}
    d = bp.spec.d_model
    shapes = {"token_embd.weight": (bp.spec.vocab_size, d)}
    if not bp.spec.tie_embeddings:
        if not arch.has_output:
            return metadata, [
                f"tie_embeddings=false: a GGUF {arch.name} has tie_embeddings=true (no "
                "output.weight)"
            ]
        shapes["output.weight"] = (bp.spec.vocab_size, d)
    try:
        if architecture(arch.name, "", metadata) is not arch:
            return metadata, [f"a GGUF {arch.name} without experts is another model"]
        back = metadata_to_config(metadata, shapes, "the metadata written")
        spec = parse_spec(spec_of(back, arch, "the metadata written"))
    except ConversionError as e:
        return metadata, [str(e).partition("without losing something: ")[2] or str(e)]
    expected = bp.spec  # the model, or the model its folded weights make
    if arch.folded is not None:
        try:
            expected = parse_spec(read_config(arch.folded(config), "", family=family(arch)).spec)
        except ConversionError as e:
            return metadata, [str(e).partition("without losing something: ")[2] or str(e)]
    return metadata, differences(expected, spec, f"GGUF {arch.name}")
