"""The Llama family's tables: config.json fields ↔ the spec, tensor names ↔ lmcore's keys, and the
rotary permutation between the two layouts (`lmcore.hf.convert` reads and writes the files).

A Llama is lmcore's default architecture under other names: pre-norm blocks of RMSNorm, causal
(grouped-query) attention with rotary embeddings, SwiGLU, a final RMSNorm and an output matrix,
tied or not. The table `FIELDS` maps config.json to the spec and back, `KEYS` the tensor
names. The one real difference is the rotary layout: Hugging Face rotates dimension i with
i + head_dim/2 (the "half-split" layout of `rotate_half`), lmcore (and CS336) rotate interleaved
pairs (2k, 2k+1), both at frequency theta^(-2i/head_dim). Permuting the rows of each head of the
q and k projections from one layout to the other gives the same attention scores, since q·k is
unchanged when both are permuted alike.

Anything one side can express and the other cannot is refused with a `ConversionError` that names
every field or component concerned; nothing is dropped silently. Config fields that do not change
the function (token ids, initialiser range, `pretraining_tp`, ...) are kept in the checkpoint's
metadata under "hf.config" and written back by `--to-hf`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import torch
from torch import Tensor

from lmcore.blueprint import Blueprint
from lmcore.components import REQUIRED, format_scalar
from lmcore.errors import ConversionError
from lmcore.registry import normalize_dist
from lmcore.spec import ModelSpec

__all__ = [
    "ARCHITECTURE",
    "FIELDS",
    "KEYS",
    "Field",
    "config_to_spec",
    "from_hf_state_dict",
    "permute_from_hf",
    "permute_to_hf",
    "spec_to_config",
    "to_hf_state_dict",
]

ARCHITECTURE: Final = "LlamaForCausalLM"

# lmcore key <-> Hugging Face key; "{i}" is the layer. The rotary column says which head count
# the q/k rows are permuted by (None: copied as they are).
KEYS: Final[tuple[tuple[str, str, str | None], ...]] = (
    ("token_embeddings.weight", "model.embed_tokens.weight", None),
    ("layers.{i}.ln1.weight", "model.layers.{i}.input_layernorm.weight", None),
    ("layers.{i}.attn.q_proj.weight", "model.layers.{i}.self_attn.q_proj.weight", "num_heads"),
    ("layers.{i}.attn.k_proj.weight", "model.layers.{i}.self_attn.k_proj.weight", "num_kv_heads"),
    ("layers.{i}.attn.v_proj.weight", "model.layers.{i}.self_attn.v_proj.weight", None),
    ("layers.{i}.attn.output_proj.weight", "model.layers.{i}.self_attn.o_proj.weight", None),
    ("layers.{i}.ln2.weight", "model.layers.{i}.post_attention_layernorm.weight", None),
    ("layers.{i}.ffn.w1.weight", "model.layers.{i}.mlp.gate_proj.weight", None),
    ("layers.{i}.ffn.w3.weight", "model.layers.{i}.mlp.up_proj.weight", None),
    ("layers.{i}.ffn.w2.weight", "model.layers.{i}.mlp.down_proj.weight", None),
    ("ln_final.weight", "model.norm.weight", None),
    ("lm_head.weight", "lm_head.weight", None),
)
# Derived buffers some older checkpoints carry; recomputed from rope_theta, so skipped.
_DERIVED_SUFFIX: Final = ".self_attn.rotary_emb.inv_freq"


@dataclass(frozen=True)
class Field:
    """A config.json field that maps to the spec: a model key, or a component's argument."""

    name: str
    spec: str  # "d_model", or "norm.eps": argument eps of the norm
    type: type  # int and float must be positive
    default: Any = REQUIRED  # Llama's value when the field is absent


# The config.json fields that carry over, both ways. num_key_value_heads defaults to
# num_attention_heads; rope_theta may sit in transformers 5's rope_parameters.
FIELDS: Final[tuple[Field, ...]] = (
    Field("vocab_size", "vocab_size", int),
    Field("max_position_embeddings", "context_length", int, 2048),
    Field("hidden_size", "d_model", int),
    Field("num_hidden_layers", "num_layers", int),
    Field("num_attention_heads", "num_heads", int),
    Field("num_key_value_heads", "num_kv_heads", int, None),
    Field("intermediate_size", "d_ff", int),
    Field("tie_word_embeddings", "tie_embeddings", bool, False),
    Field("rms_norm_eps", "norm.eps", float, 1e-6),
    Field("rope_theta", "pos.theta", float, 10000.0),
)
# Fields checked to hold the one value lmcore can express (absent is fine).
_FIXED: Final[dict[str, tuple[Any, ...]]] = {
    "hidden_act": ("silu", "swish"),
    "attention_bias": (False,),
    "mlp_bias": (False,),
    "attention_dropout": (0, 0.0),
    "rope_scaling": (None,),
}
# Fields read by other means: the model's identity, the head width (checked), transformers 5's
# rope_parameters (read with rope_theta).
_CHECKED: Final = frozenset({"model_type", "architectures", "head_dim", "rope_parameters"})
# Fields that do not change the function a model computes: kept in "hf.config", not mapped.
_PASSIVE: Final = frozenset({
    "_name_or_path", "transformers_version", "dtype", "torch_dtype", "bos_token_id",
    "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "initializer_range",
    "use_cache", "pretraining_tp", "tokenizer_class", "output_attentions", "output_hidden_states",
    "return_dict", "id2label", "label2id", "max_length",
})  # fmt: skip


# ------------------------------------------------------------------------------ configs


def config_to_spec(
    config: Mapping[str, Any], where: str = "config.json", *, ignore: Iterable[str] = ()
) -> str:
    """The lmcore spec of a Llama `config.json`, or `ConversionError` naming every field that
    lmcore cannot express (rope scaling, biases, another activation, a head_dim other than
    hidden_size / num_attention_heads, ...). A field lmcore does not know is refused too, since it
    may change the model (e.g. quantization_config), unless it is named in `ignore`."""
    problems: list[str] = []
    model_type = config.get("model_type")
    architectures = config.get("architectures") or []
    if model_type != "llama" and not (model_type is None and ARCHITECTURE in architectures):
        problems.append(
            f"model_type is {model_type!r}: only 'llama' (LlamaForCausalLM) converts to lmcore"
        )
    for name, allowed in _FIXED.items():
        if name in config and config[name] not in allowed and not _default_rope(name, config[name]):
            problems.append(
                f"{name}={json.dumps(config[name])} (lmcore can express {_or(allowed)})"
            )
    given = {**config, "rope_theta": _rope_theta(config, problems)}
    values: dict[str, Any] = {}  # by spec key
    for f in FIELDS:
        value = given.get(f.name)
        if value is None:
            value = given.get("num_attention_heads") if f.default is None else f.default
        if value is REQUIRED or value is None:
            problems.append(f"{f.name} is missing")
        elif f.type is bool and type(value) is not bool:
            problems.append(f"{f.name}={json.dumps(value)} is not true or false")
        elif f.type is not bool and (
            type(value) not in (f.type, int)
            or isinstance(value, bool)
            or not math.isfinite(value)  # NaN and Infinity, which Python's JSON reads
            or value <= 0
        ):
            problems.append(f"{f.name}={json.dumps(value)} is not a positive {f.type.__name__}")
        else:
            values[f.spec] = value
    d, heads, head_dim = values.get("d_model"), values.get("num_heads"), config.get("head_dim")
    if d is not None and heads is not None:
        if d % heads:
            problems.append(f"hidden_size={d} is not divisible by num_attention_heads={heads}")
        elif head_dim is not None and head_dim != d // heads:
            problems.append(
                f"head_dim={head_dim}: lmcore's heads are hidden_size / num_attention_heads = "
                f"{d // heads} wide"
            )
    unknown = sorted(
        set(config) - {f.name for f in FIELDS} - set(_FIXED) - _CHECKED - _PASSIVE - set(ignore)
    )
    if unknown:
        problems.append(
            f"fields lmcore does not know, which may change the model: {', '.join(unknown)} "
            "(if you know that one does not, e.g. because transformers' LlamaForCausalLM never "
            "reads it, pass --ignore-field NAME / ignore=[NAME])"
        )
    if problems:
        raise ConversionError(
            f"{where}: cannot convert this Hugging Face config to lmcore without losing "
            "something: " + "; ".join(problems)
        )
    model_keys = [f"{k}={format_scalar(v)}" for k, v in values.items() if "." not in k]
    return ", ".join(
        [
            *model_keys,
            "block=prenorm",
            f"norm=rmsnorm(eps={format_scalar(float(values['norm.eps']))})",
            "ffn=swiglu",
            f"pos=rope(theta={format_scalar(float(values['pos.theta']))})",
            "attn=sdpa",
        ]
    )


def _default_rope(name: str, value: Any) -> bool:
    """A rope_scaling that asks for nothing: {"rope_type": "default"} (or "type")."""
    return (
        name == "rope_scaling"
        and isinstance(value, dict)
        and set(value) <= {"rope_type", "type", "rope_theta"}
        and value.get("rope_type", value.get("type")) == "default"
    )


def _rope_theta(config: Mapping[str, Any], problems: list[str]) -> Any:
    """rope_theta from transformers 4's top-level field or transformers 5's rope_parameters
    (None when neither gives it); problems with rope_parameters go to `problems`."""
    theta = config.get("rope_theta")
    params = config.get("rope_parameters")
    if params is not None:
        if not isinstance(params, dict):
            problems.append(f"rope_parameters={json.dumps(params)} is not an object")
            params = {}
        kind = params.get("rope_type", params.get("type", "default"))
        if kind != "default":
            problems.append(f"rope_parameters.rope_type={json.dumps(kind)} (lmcore has 'default')")
        extra = sorted(set(params) - {"rope_type", "type", "rope_theta"})
        if extra and kind == "default":
            problems.append(
                f"rope_parameters has {', '.join(extra)} (lmcore rotates every dimension of each "
                "head, unscaled)"
            )
        if "rope_theta" in params:
            if theta is not None and theta != params["rope_theta"]:
                problems.append(
                    f"rope_theta={theta} and rope_parameters.rope_theta={params['rope_theta']} "
                    "disagree"
                )
            theta = params["rope_theta"]
    return theta


def _or(values: tuple[Any, ...]) -> str:
    return " or ".join(json.dumps(v) for v in dict.fromkeys(values))


def spec_to_config(
    bp: Blueprint, dtype: torch.dtype, base: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The Llama `config.json` of a resolved lmcore model, or `ConversionError` naming every
    component or key Llama cannot express. `base` supplies fields that do not change the function
    (token ids, ...), e.g. the "hf.config" a `--from-hf` conversion kept."""
    spec = bp.spec
    problems: list[str] = []
    wanted = {
        "norm": ("rmsnorm",),
        "ffn": ("swiglu",),
        "pos": ("rope",),
        "attn": ("sdpa", "chunked"),
    }
    why = {
        "norm": "Llama normalises with RMSNorm (norm=rmsnorm)",
        "ffn": "Llama's MLP is SwiGLU (ffn=swiglu)",
        "pos": "Llama encodes positions with rotary embeddings (pos=rope)",
        "attn": "Llama's attention is exact softmax attention (attn=sdpa or attn=chunked)",
    }
    for kind, names in wanted.items():
        comp, prov = spec.component(kind), bp.provenance(kind)
        if comp.name not in names:
            problems.append(f"{kind}={comp}: {why[kind]}")
        elif normalize_dist(prov.dist or "") != "lmcore-registry":
            problems.append(
                f"{kind}={comp} comes from {prov}, not lmcore's built-in: only the built-in is "
                "known to compute what Llama computes"
            )
    if spec.block.name != "prenorm":
        problems.append(f"block={spec.block}: Llama blocks are pre-norm (block=prenorm)")
    for key in ("embed_scale", "logit_softcap", "qkv_bias", "out_bias", "qk_norm",
                "query_scale", "window", "attn_softcap"):  # fmt: skip
        if getattr(spec, key) != spec.default(key):
            problems.append(f"{key}={getattr(spec, key)}: a Llama has no such option")
    if spec.layers:
        problems.append("its layers differ (key[layers]=...): a Llama's layers are all alike")
    if problems:
        raise ConversionError(
            "cannot convert this model to a Hugging Face Llama without losing something: "
            + "; ".join(problems)
            + f" (spec: {spec})"
        )
    passive = {k: v for k, v in (base or {}).items() if k in _PASSIVE}
    for written_here in ("dtype", "transformers_version"):  # torch_dtype is written below
        passive.pop(written_here, None)

    def value(f: Field) -> Any:
        kind, _, arg = f.spec.partition(".")
        return spec.component(kind).kwargs[arg] if arg else getattr(spec, kind)

    return {
        **passive,
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        **{f.name: value(f) for f in FIELDS},
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


# ------------------------------------------------------------------------------ tensors


def permute_from_hf(w: Tensor, heads: int) -> Tensor:
    """q/k projection rows, per head, from the half-split layout (i, i + D/2) to interleaved
    pairs (2i, 2i + 1): lmcore row 2i is HF row i, lmcore row 2i + 1 is HF row i + D/2."""
    out_features, d_in = w.shape
    d = out_features // heads
    return w.reshape(heads, 2, d // 2, d_in).transpose(1, 2).reshape(out_features, d_in)


def permute_to_hf(w: Tensor, heads: int) -> Tensor:
    """The inverse of `permute_from_hf`."""
    out_features, d_in = w.shape
    d = out_features // heads
    return w.reshape(heads, d // 2, 2, d_in).transpose(1, 2).reshape(out_features, d_in)


def _pairs(spec: ModelSpec) -> list[tuple[str, str, int | None]]:
    """(lmcore key, HF key, heads to permute by) for every tensor of `spec`'s model."""
    out = []
    for ours, theirs, rotary in KEYS:
        heads = getattr(spec, rotary) if rotary else None
        layers = range(spec.num_layers) if "{i}" in ours else [None]
        out += [(ours.format(i=i), theirs.format(i=i), heads) for i in layers]
    return out


def from_hf_state_dict(
    tensors: Mapping[str, Tensor],
    spec: ModelSpec,
    where: str = "the Hugging Face weights",
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> dict[str, Tensor]:
    """Rename (and permute) a `LlamaForCausalLM` state dict to lmcore's keys, strictly: every
    missing, unexpected and (given the model's `shapes` by lmcore key) misshapen tensor is
    listed in one `ConversionError`."""
    tensors = {k: v for k, v in tensors.items() if not k.endswith(_DERIVED_SUFFIX)}
    pairs = _pairs(spec)
    embed = tensors.get("model.embed_tokens.weight")
    if spec.tie_embeddings and embed is not None:
        head = tensors.setdefault("lm_head.weight", embed)  # transformers leaves it out
        if head is not embed and not torch.equal(head, embed):
            raise ConversionError(
                f"{where}: tie_word_embeddings is true but lm_head.weight differs from "
                "model.embed_tokens.weight; set tie_word_embeddings to false in config.json"
            )
    missing = [theirs for _, theirs, _ in pairs if theirs not in tensors]
    unexpected = sorted(set(tensors) - {theirs for _, theirs, _ in pairs})
    misshapen = [
        f"{theirs} (file {tuple(tensors[theirs].shape)}, model {tuple(shapes[ours])})"
        for ours, theirs, _ in pairs
        if shapes is not None and theirs in tensors and ours in shapes
        and tuple(tensors[theirs].shape) != tuple(shapes[ours])
    ]  # fmt: skip
    if missing or unexpected or misshapen:
        groups = (("missing", missing), ("unexpected", unexpected), ("wrong shape", misshapen))
        shown = "; ".join(
            f"{label} ({len(names)}): {', '.join(names[:12])}{' ...' if len(names) > 12 else ''}"
            for label, names in groups
            if names
        )
        raise ConversionError(
            f"{where}: the tensors are not those of a LlamaForCausalLM with this config: {shown}"
        )
    return {
        ours: permute_from_hf(tensors[theirs], heads) if heads else tensors[theirs]
        for ours, theirs, heads in pairs
    }


def to_hf_state_dict(state: Mapping[str, Tensor], spec: ModelSpec) -> dict[str, Tensor]:
    """lmcore's state dict under `LlamaForCausalLM`'s keys; with tied embeddings lm_head.weight
    is left out, as transformers saves it."""
    out = {
        theirs: (permute_to_hf(state[ours], heads) if heads else state[ours]).contiguous()
        for ours, theirs, heads in _pairs(spec)
    }
    if spec.tie_embeddings:
        del out["lm_head.weight"]
    return out
