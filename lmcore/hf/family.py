"""A Hugging Face model family as data, and the one reader and writer of config.json that every
family shares.

A family (`Family`, one per module under `lmcore/hf/`, e.g. `lmcore.hf.llama.FAMILY`) holds
  - `spec`: the spec values every model of the family has (`block=prenorm`, `norm=rmsnorm`),
  - `rules`: config.json fields and the spec values they give, each rule a small object that
    reads its fields into spec values and writes them back (`lmcore.hf.rules`),
  - `tensors`: Hugging Face tensor names and lmcore's state-dict keys (`lmcore.hf.weights`),
  - `passive`: the family's fields that do not change the function, kept in the checkpoint's
    metadata and written back (besides `PASSIVE`, which every config may hold).
A spec *path* is a model key (`d_model`, `window`) or a component slot and its argument
(`ffn`, `ffn.bias`, `pos.theta`, `qk_norm.eps`); a rule may give one value for the whole model
or a list of per-layer values.

Reading (`read_config`): the family's `spec` values, then each rule in order; whatever a
config says that no rule reads and that is not passive is refused, naming the field, as is any
value a rule cannot express; then the values are written as a spec string and resolved, so
the spec is validated as any spec is. Writing (`spec_to_config`): each rule writes its fields
from the resolved model, then the config written is read back and compared with the model key
by key, layer by layer: whatever differs is what the family cannot express, and is refused by
name. So each rule is written once, for both ways, and nothing is dropped silently.

A GGUF (or any other) reader can build a config.json-like dict from its own metadata names
and call `read_config` with the family it means, to get the same spec and the same refusals.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from lmcore.blueprint import Blueprint, parse_spec
from lmcore.components import format_scalar
from lmcore.errors import ConversionError, SpecError, did_you_mean
from lmcore.hf.rules import SLOTS, Draft, Fixed, Rule, SpecView
from lmcore.hf.values import json_text as _json
from lmcore.registry import normalize_dist
from lmcore.spec import LAYER_KEYS, ORDER, ComponentSpec, ModelSpec, format_layers, format_value

__all__ = [
    "FAMILIES",
    "MULTIMODAL",
    "PASSIVE",
    "Family",
    "Reading",
    "assemble",
    "config_to_spec",
    "differences",
    "family",
    "family_of",
    "read_config",
    "spec_to_config",
]

# The model types that convert, each a module of `lmcore.hf` holding its `FAMILY`.
FAMILIES: Final = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "olmo2",
    "phi3",
    "gpt2",
    "gpt_neox",
    "mixtral",
    "qwen3_moe",
    "qwen3_next",
    "gemma3_text",
    "smollm3",
    "olmo3",
    "lfm2",
    "gpt_oss",
    "deepseek_v3",
    "mamba2",
    "falcon_h1",
)

# Model types of multimodal models whose language model is a family lmcore converts: refused
# by name, saying where that language model's config is (the vision tower has no lmcore form).
MULTIMODAL: Final = {
    "gemma3": ("Gemma3ForConditionalGeneration", "text_config", "gemma3_text"),
}

# Fields any saved config may hold that do not change the function a causal LM computes:
# identity and bookkeeping, token ids, what a forward returns, generation defaults, the
# initialiser (weights are given), heads of other tasks. Kept in the metadata, written back.
PASSIVE: Final = frozenset(
    {
        "_name_or_path",
        "_model_name_or_path",
        "_commit_hash",
        "_attn_implementation",
        "_attn_implementation_autoset",
        "_experts_implementation",
        "transformers_version",
        "architectures",
        "dtype",
        "torch_dtype",
        "use_bfloat16",
        "torchscript",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "unk_token_id",
        "cls_token_id",
        "mask_token_id",
        "decoder_start_token_id",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "begin_suppress_tokens",
        "suppress_tokens",
        "tokenizer_class",
        "initializer_range",
        "initializer_factor",
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "output_scores",
        "return_dict",
        "return_dict_in_generate",
        "id2label",
        "label2id",
        "num_labels",
        "problem_type",
        "finetuning_task",
        "prefix",
        "task_specific_params",
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "exponential_decay_length_penalty",
        "remove_invalid_values",
        "chunk_size_feed_forward",
        "tf_legacy_loss",
        "is_decoder",
        "tie_encoder_decoder",
        "cross_attention_hidden_size",
        "gradient_checkpointing",
        "pretraining_tp",
        "classifier_dropout",
    }
)
# Fields that must hold the value a causal LM has in every family.
_UNIVERSAL_FIXED: Final = {
    "is_encoder_decoder": (False,),
    "add_cross_attention": (False,),
    "pruned_heads": ({},),
}

# ------------------------------------------------------------------------------ families


@dataclass(frozen=True)
class Family:
    """One Hugging Face architecture: its config.json rules and tensor table (see the module
    docstring). `embedding`/`head`: the Hugging Face names of the token embeddings and the
    output matrix (a tied model's saved file leaves the head out); `prefix`: what the base
    model's names start with (a file saved from the base model alone lacks it); `skip`:
    suffixes of derived tensors some files carry (rotary `inv_freq`, GPT-2's causal mask),
    skipped; `skip_prefixes`: the starts of tensors a checkpoint carries that transformers'
    causal LM does not load (Qwen3-Next's multi-token prediction `mtp.`), skipped."""

    model_type: str
    architecture: str
    spec: Mapping[str, Any]
    rules: tuple[Rule, ...]
    tensors: tuple[Any, ...]  # lmcore.hf.weights.Weight rows
    embedding: str = "model.embed_tokens.weight"
    head: str = "lm_head.weight"
    prefix: str = "model."
    passive: frozenset[str] = frozenset()
    skip: tuple[str, ...] = (".rotary_emb.inv_freq",)
    skip_prefixes: tuple[str, ...] = ()

    @property
    def fields(self) -> frozenset[str]:
        """The config fields the rules read and write."""
        return frozenset(f for rule in self.rules for f in rule.fields) | frozenset(
            _UNIVERSAL_FIXED
        )


def family(model_type: str) -> Family:
    """The family of `model_type` (`lmcore.hf.<model_type>.FAMILY`), or `ConversionError`
    naming the families there are."""
    if model_type in MULTIMODAL:
        arch, sub, inner = MULTIMODAL[model_type]
        raise ConversionError(
            f"model_type {model_type!r} is {arch}, a multimodal model: lmcore converts "
            f"language models only, not a vision tower; its language model's config, {sub}, "
            f"is a {inner!r} one, which converts with the weights of a "
            f"{family(inner).architecture} (model.* and lm_head.weight)"
        )
    if model_type not in FAMILIES:
        raise ConversionError(
            f"model_type {model_type!r} does not convert to lmcore"
            f"{did_you_mean(model_type, FAMILIES)}; "
            f"the families that do: {', '.join(FAMILIES)}"
        )
    found: Family = importlib.import_module(f"lmcore.hf.{model_type}").FAMILY
    return found


_find = family  # `spec_to_config`'s argument `family` hides the function there


def family_of(config: Mapping[str, Any], where: str = "config.json") -> Family:
    """The family a config.json names by `model_type` (or, without one, `architectures`)."""
    model_type = config.get("model_type")
    if model_type is None:  # transformers' own classes go by architectures then; never a guess
        archs = config.get("architectures")
        names = archs if isinstance(archs, list) else []
        found = [n for n in FAMILIES if family(n).architecture in names]
        if len(found) == 1:
            return family(found[0])
        known = ", ".join(f"{family(n).architecture} ({n})" for n in FAMILIES)
        if found:
            raise ConversionError(
                f"{where}: has no model_type, and architectures={_json(archs)} names "
                f'{len(found)} families ({", ".join(found)}); add "model_type": "NAME" '
                "naming the one its weights are"
            )
        raise ConversionError(
            f"{where}: has no model_type, and architectures={_json(archs)} names no family "
            f'lmcore converts; add "model_type": one of {", ".join(FAMILIES)} (the '
            f"architectures they read: {known})"
        )
    if not isinstance(model_type, str):
        raise ConversionError(f"{where}: model_type={_json(model_type)} is not a string")
    try:
        return family(model_type)
    except ConversionError as e:
        raise ConversionError(f"{where}: {e}") from None


@dataclass(frozen=True)
class Reading:
    """What a config.json says in lmcore's terms: the canonical `spec`, its `family`, `kept`
    (the fields that do not change the function: kept in the metadata, written back) and
    `notes` (what is kept but not applied, e.g. dropout)."""

    spec: str
    family: Family
    kept: Mapping[str, Any]
    notes: tuple[str, ...]


def read_config(
    config: Mapping[str, Any],
    where: str = "config.json",
    *,
    ignore: Iterable[str] = (),
    family: Family | None = None,
) -> Reading:
    """The lmcore spec of a Hugging Face `config.json` (a dict), or `ConversionError` naming
    every field and value lmcore cannot express. A field no rule of the family reads and that is
    not known to leave the function alone is refused too, since it may change the model (e.g.
    `quantization_config`), unless it is named in `ignore`."""
    fam = family or family_of(config, where)
    d = Draft(config)
    for path, value in fam.spec.items():
        d.set(path, value, "the family")
    for name, allowed in _UNIVERSAL_FIXED.items():
        Fixed(name, allowed).read(d)
    for rule in fam.rules:
        rule.read(d)
    ignored = set(ignore)
    unknown = sorted(set(config) - fam.fields - PASSIVE - fam.passive - ignored - {"model_type"})
    if unknown:
        d.problems.append(
            f"fields lmcore does not know, which may change the model: {', '.join(unknown)} (if "
            f"you know that one does not, e.g. because transformers' {fam.architecture} never "
            "reads it, pass --ignore-field NAME / ignore=[NAME])"
        )
    if d.problems:
        raise ConversionError(
            f"{where}: cannot convert this Hugging Face {fam.model_type} config to lmcore "
            "without losing something: " + "; ".join(dict.fromkeys(d.problems))
        )
    text = assemble(d.values)
    try:
        spec = parse_spec(text)
    except SpecError as e:
        raise ConversionError(
            f"{where}: its {fam.model_type} config gives a spec lmcore refuses: {e.message} "
            f"(spec: {text})"
        ) from None
    kept = {k: v for k, v in config.items() if k not in fam.fields or k in ignored}
    return Reading(str(spec), fam, kept, tuple(d.notes))


def config_to_spec(
    config: Mapping[str, Any], where: str = "config.json", *, ignore: Iterable[str] = ()
) -> str:
    """The canonical lmcore spec of a Hugging Face `config.json` (`read_config`'s spec)."""
    return read_config(config, where, ignore=ignore).spec


def assemble(values: Mapping[str, Any]) -> str:
    """A spec string from spec values by path; per-layer lists as `key=v, key[layers]=w`; an
    argument's value may be a component (`ComponentSpec`: `moe(shared=swiglu(d_ff=512))`).
    Without a list nothing is done per layer, however many layers `num_layers` says (the rules
    give lists only to models the spec can give per-layer values, `spread`)."""
    tops = list(dict.fromkeys(path.partition(".")[0] for path in values))
    if not any(isinstance(v, list) for v in values.values()):
        return ", ".join(_whole(top, values) for top in tops)
    n = values.get("num_layers")

    def per_layer(path: str) -> list[Any]:
        value = values[path]
        return list(value) if isinstance(value, list) else [value] * (n or 1)

    items = []
    for top in tops:
        if top in SLOTS:
            names = per_layer(top)
            args = {p.partition(".")[2]: per_layer(p) for p in values if p.startswith(f"{top}.")}
            rendered = []
            for i, name in enumerate(names):
                inner = ",".join(
                    f"{a}={format_value(v[i])}" for a, v in args.items() if v[i] is not None
                )
                rendered.append("none" if name is None else f"{name}({inner})" if inner else name)
        else:
            rendered = [format_scalar(v) for v in per_layer(top)]
        counts: dict[str, int] = {}
        for r in rendered:
            counts[r] = counts.get(r, 0) + 1
        whole = max(counts, key=lambda r: (counts[r], -rendered.index(r)))
        items.append(f"{top}={whole}")
        if top in LAYER_KEYS and n:
            for other in dict.fromkeys(r for r in rendered if r != whole):
                idx = [i for i, r in enumerate(rendered) if r == other]
                items.append(f"{top}[{format_layers(idx, n)}]={other}")
    return ", ".join(items)


def _whole(top: str, values: Mapping[str, Any]) -> str:
    """The item of a key or slot that has one value on every layer."""
    if top not in SLOTS:
        return f"{top}={format_scalar(values[top])}"
    name = values[top]
    args = {p.partition(".")[2]: v for p, v in values.items() if p.startswith(f"{top}.")}
    inner = ",".join(f"{a}={format_value(v)}" for a, v in args.items() if v is not None)
    return f"{top}={'none' if name is None else f'{name}({inner})' if inner else name}"


# ------------------------------------------------------------------------------ writing


_EXACT_KERNELS: Final = ("sdpa", "chunked")  # exact attention: the kernel is lmcore's choice


def _built_in(dist: str | None) -> bool:
    return normalize_dist(dist or "") == "lmcore-registry"


def spec_to_config(
    bp: Blueprint,
    dtype: Any,
    base: Mapping[str, Any] | None = None,
    *,
    family: Family | None = None,
) -> dict[str, Any]:
    """The `config.json` of a resolved lmcore model as Hugging Face `family` (default: the base
    config's, else the first family that expresses the model), or `ConversionError` naming
    every key or component the family cannot express. `base` supplies fields that do not change
    the function (token ids, ...), e.g. the "hf.config" a `--from-hf` conversion kept."""
    base = dict(base or {})
    if family is None and isinstance(base.get("model_type"), str):
        family = _find(base["model_type"])
    problems = [
        f"{where}={part.spec} comes from {part.provenance}, not lmcore's built-in: only the "
        "built-in is known to compute what transformers computes"
        for where, part in bp.used()
        if not _built_in(part.provenance.dist)
    ]
    if family is None:
        tried = []
        for name in FAMILIES:
            fam = _find(name)
            config, differ = _write(bp, dtype, base, fam)
            if not differ and not problems:
                return config
            tried.append((sum(x.count("; ") + 1 for x in differ), name, differ))
        _, name, differ = min(tried)
        raise ConversionError(
            "cannot convert this model to a Hugging Face family without losing something; the "
            f"closest, {name}: " + "; ".join([*problems, *differ]) + f" (spec: {bp.spec})"
        )
    config, differ = _write(bp, dtype, base, family)
    if problems or differ:
        raise ConversionError(
            f"cannot convert this model to a Hugging Face {family.architecture} without losing "
            "something: " + "; ".join([*problems, *differ]) + f" (spec: {bp.spec})"
        )
    return config


def _write(
    bp: Blueprint, dtype: Any, base: Mapping[str, Any], fam: Family
) -> tuple[dict[str, Any], list[str]]:
    """`fam`'s config of the model and what differs when it is read back."""
    same_family = base.get("model_type") == fam.model_type
    view = SpecView(bp, base if same_family else {})
    out: dict[str, Any] = {}
    for rule in fam.rules:
        rule.write(view, out)
    for name, allowed in _UNIVERSAL_FIXED.items():
        if name in base:
            out[name] = allowed[0]
    written_here = {"model_type", "architectures", "dtype", "torch_dtype", "transformers_version"}
    passive = {k: v for k, v in base.items() if k not in fam.fields and k not in written_here}
    if not same_family:  # another family's fields may mean something else here
        passive = {k: v for k, v in passive.items() if k in PASSIVE or k in fam.passive}
    config = {
        **passive,
        "architectures": [fam.architecture],
        "model_type": fam.model_type,
        **out,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    try:
        again = parse_spec(read_config(config, ignore=passive, family=fam).spec)
    except ConversionError as e:
        return config, [str(e).partition("without losing something: ")[2] or str(e)]
    return config, differences(bp.spec, again, fam.architecture)


def _exact(spec: ModelSpec) -> ModelSpec:
    """`spec` with lmcore's exact attention kernels written as `sdpa`: which one computes the
    attention is lmcore's choice, not the architecture's."""
    sdpa = ComponentSpec("sdpa")
    attn = sdpa if spec.attn.name in _EXACT_KERNELS else spec.attn
    layers = tuple(
        lv
        for lv in spec.layers
        if not (lv.key == "attn" and lv.value is not None and lv.value.name in _EXACT_KERNELS)
    )
    return replace(spec, attn=attn, layers=layers)


def differences(ours: ModelSpec, theirs: ModelSpec, architecture: str) -> list[str]:
    """Each key whose value differs (for the whole model or some layer) between `ours` and
    what `architecture`'s config gives, written as the spec writes it."""
    ours, theirs = _exact(ours), _exact(theirs)
    if ours.num_layers != theirs.num_layers:
        return [f"num_layers={ours.num_layers}: a {architecture} has {theirs.num_layers}"]
    out = []
    for key in ORDER:
        mine = [getattr(ours, key), *(getattr(ours.at(i), key) for i in range(ours.num_layers))]
        yours = [
            getattr(theirs, key),
            *(getattr(theirs.at(i), key) for i in range(theirs.num_layers)),
        ]
        if mine != yours:
            out.append(f"{_items(ours, key)}: a {architecture} has {_items(theirs, key)}")
    return out


def _items(spec: ModelSpec, key: str) -> str:
    items = [f"{key}={format_value(getattr(spec, key))}"]
    items += [lv.format(spec.num_layers) for lv in spec.layers if lv.key == key]
    return ", ".join(items)
