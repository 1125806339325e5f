"""GGUF tensors and Hugging Face's, both ways: every tensor's shape checked against the metadata
(`check_shapes`, before any tensor is read), and the changes llama.cpp's converter makes undone
on reading (`from_gguf_tensors`) and redone on writing (`to_gguf_tensors`), as each
`lmcore.gguf.architectures.Architecture` says: q/k rows permuted (Llama), norm gains + 1
(Gemma), Conv1D weights transposed (GPT-2), q/k/v regrouped per head (GPT-NeoX), each layer's
experts stacked into one 3-D tensor per matrix (experts x out x in).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import torch
from torch import Tensor

from lmcore.errors import ConversionError
from lmcore.gguf.architectures import relative
from lmcore.gguf.rows import Architecture, Meta, positive
from lmcore.hf.weights import permute_from_hf, permute_to_hf

__all__ = ["check_shapes", "from_gguf_tensors", "to_gguf_tensors"]

# A GGUF tensor (its name after "blk.N.") -> its shape, in symbols `_dimensions` gives values
# to: V vocabulary, P positions, d model width, q query width, kv key/value width, qkv both,
# ff the FFN's hidden width (ff2 twice it), hd head width, E experts, fe an expert's width.
_SHAPES: Final[Mapping[str, tuple[str, ...]]] = {
    "token_embd.weight": ("V", "d"),
    "output.weight": ("V", "d"),
    "position_embd.weight": ("P", "d"),
    **{f"{n}.{p}": ("d",) for n in ("output_norm", "attn_norm", "ffn_norm",
       "post_attention_norm", "post_ffw_norm") for p in ("weight", "bias")},  # fmt: skip
    "attn_q.weight": ("q", "d"),
    "attn_k.weight": ("kv", "d"),
    "attn_v.weight": ("kv", "d"),
    "attn_qkv.weight": ("qkv", "d"),
    "attn_output.weight": ("d", "q"),
    "attn_q.bias": ("q",),
    "attn_k.bias": ("kv",),
    "attn_v.bias": ("kv",),
    "attn_qkv.bias": ("qkv",),
    "attn_output.bias": ("d",),
    "attn_q_norm.weight": ("hd",),
    "attn_k_norm.weight": ("hd",),
    "ffn_gate.weight": ("ff", "d"),
    "ffn_up.weight": ("ff", "d"),
    "ffn_down.weight": ("d", "ff"),
    "ffn_up.bias": ("ff",),
    "ffn_down.bias": ("d",),
    "ffn_gate_inp.weight": ("E", "d"),
    "ffn_gate_exps.weight": ("E", "fe", "d"),
    "ffn_up_exps.weight": ("E", "fe", "d"),
    "ffn_down_exps.weight": ("E", "d", "fe"),
}


def _dimensions(
    arch: Architecture, config: Mapping[str, Any], metadata: Meta
) -> dict[str, tuple[int, str]]:
    """Each shape symbol's value and the metadata keys it comes from (symbols whose keys are
    missing or not positive integers are left out: reading the config refuses those)."""
    p = f"{arch.name}."
    meta = relative(metadata, arch)
    out: dict[str, tuple[int, str]] = {}
    vocab = positive(config.get(dict(arch.fields).get("vocab_size", "vocab_size")))
    if vocab is not None:
        said = f"{p}vocab_size" if "vocab_size" in meta else "token_embd.weight's rows"
        out["V"] = (vocab, said)
    for symbol, key in (("d", "embedding_length"), ("P", "context_length"),
                        ("ff", "feed_forward_length"), ("E", "expert_count")):  # fmt: skip
        value = positive(meta.get(key))
        if value is not None:
            out[symbol] = (value, f"{p}{key}")
    fe = positive(meta.get("expert_feed_forward_length"))
    if fe is not None:
        out["fe"] = (fe, f"{p}expert_feed_forward_length")
    elif "ff" in out:
        out["fe"] = out["ff"]
    if "ff" in out:
        out["ff2"] = (2 * out["ff"][0], f"2 x {out['ff'][1]} (gate and up)")
    d, heads = out.get("d", (None,))[0], positive(meta.get("attention.head_count"))
    kv_heads = positive(_most(meta.get("attention.head_count_kv"))) or heads
    width, said = positive(meta.get("attention.key_length")), f"{p}attention.key_length"
    if width is None and d is not None and heads is not None and d % heads == 0:
        width, said = d // heads, f"{p}embedding_length / {p}attention.head_count"
    if width is None:
        return out
    out["hd"] = (width, said)
    if heads is not None:
        out["q"] = (heads * width, f"{p}attention.head_count {heads} x head width {width} ({said})")
    if kv_heads is not None:
        key = f"{p}attention.head_count_kv" if "attention.head_count_kv" in meta else (
            f"{p}attention.head_count"
        )
        out["kv"] = (kv_heads * width, f"{key} {kv_heads} x head width {width} ({said})")
    if "q" in out and "kv" in out:
        out["qkv"] = (out["q"][0] + 2 * out["kv"][0], f"q {out['q'][1]} + 2 x kv {out['kv'][1]}")
    return out


def _most(value: Any) -> Any:
    """A per-layer key's largest entry (LFM2's `head_count_kv`: 0 on its convolution layers)."""
    if isinstance(value, list) and value and all(type(v) is int for v in value):
        return max(value)
    return value


def _short(name: str) -> str:
    return re.sub(r"^blk\.\d+\.", "", name)


def check_shapes(
    arch: Architecture,
    config: Mapping[str, Any],
    metadata: Meta,
    shapes: Mapping[str, tuple[int, ...]],
    where: object,
) -> None:
    """`ConversionError` naming the first tensor whose shape is not the one the metadata
    gives it (checked before any tensor is read, reshaped or un-permuted), with the shape the
    metadata implies and the keys each dimension comes from."""
    dims = _dimensions(arch, config, metadata)
    table = {**_SHAPES, **arch.shapes}
    for name, shape in shapes.items():
        symbols = table.get(_short(name))
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



def _pattern(template: str) -> re.Pattern[str]:
    escaped = re.escape(template)
    return re.compile(escaped.replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{e\}", r"(?P<e>\d+)"))


def _rules(arch: Architecture, reverse: bool) -> list[tuple[re.Pattern[str], str]]:
    return [(_pattern(h if reverse else g), g if reverse else h) for g, h in arch.tensors]


def _rename(
    name: str, rules: list[tuple[re.Pattern[str], str]]
) -> tuple[str, int | None] | None:
    """`name` under the first rule whose pattern it matches (its layer carried over) and the
    expert its name gives, or None."""
    for pattern, target in rules:
        m = pattern.fullmatch(name)
        if m:
            groups = m.groupdict()
            renamed = target.replace("{i}", groups["i"]) if groups.get("i") else target
            expert = groups.get("e")
            return renamed, None if expert is None else int(expert)
    return None


def _heads(arch: Architecture, config: Mapping[str, Any], table: Mapping[str, str], hf: str
           ) -> int | None:  # fmt: skip
    """The head count a tensor's rows are arranged by (None: not rearranged); the key-value
    heads default to the attention heads, as in config.json."""
    for suffix, name in table.items():
        if hf.endswith(suffix):
            heads: int = config.get(name) or config["num_attention_heads"]
            return heads
    return None


def _regroup(t: Tensor, heads: int, per_head: bool) -> Tensor:
    """GPT-NeoX's rows: q, k, v blocks (llama.cpp) <-> each head's q, k, v (Hugging Face)."""
    rest = t.shape[1:]
    if per_head:  # llama.cpp's -> Hugging Face's
        return t.reshape(3, heads, -1, *rest).transpose(0, 1).reshape(t.shape)
    return t.reshape(heads, 3, -1, *rest).transpose(0, 1).reshape(t.shape)


def _from_gguf(arch: Architecture, config: Mapping[str, Any], hf: str, t: Tensor) -> Tensor:
    if arch.norm_offset and hf.endswith("norm.weight"):
        t = t - 1
    if hf.endswith(arch.transposed) and t.dim() == 2:
        t = t.T.contiguous()
    if hf.endswith(arch.squeezed) and t.dim() == 2:
        t = t.unsqueeze(1)
    heads = _heads(arch, config, arch.per_head, hf)
    if heads:
        t = _regroup(t, heads, per_head=True)
    heads = _heads(arch, config, arch.permuted, hf)
    return permute_to_hf(t, heads) if heads else t


def _to_gguf(arch: Architecture, config: Mapping[str, Any], hf: str, t: Tensor) -> Tensor:
    heads = _heads(arch, config, arch.permuted, hf)
    if heads:
        t = permute_from_hf(t, heads)
    heads = _heads(arch, config, arch.per_head, hf)
    if heads:
        t = _regroup(t, heads, per_head=False)
    if hf.endswith(arch.transposed) and t.dim() == 2:
        t = t.T
    if hf.endswith(arch.squeezed) and t.dim() == 3:
        t = t.squeeze(1)
    if arch.norm_offset and hf.endswith("norm.weight"):
        t = t + 1
    return t.contiguous()


def from_gguf_tensors(
    tensors: Mapping[str, Tensor], arch: Architecture, config: Mapping[str, Any]
) -> dict[str, Tensor]:
    """GGUF tensors under Hugging Face's names, llama.cpp's changes undone (stacked experts
    split into each expert's; names the table does not know are kept, for the family's strict
    check to list)."""
    rules = _rules(arch, reverse=False)
    out: dict[str, Tensor] = {}
    if arch.join is not None:
        tensors = arch.join(dict(tensors), config)
    for name, t in tensors.items():
        renamed = _rename(name, rules)
        if renamed is None:
            out[name] = t
            continue
        hf = renamed[0]
        if "{e}" in hf:
            for e, one in enumerate(t.unbind(0)):
                out[hf.replace("{e}", str(e))] = _from_gguf(arch, config, hf, one)
            continue
        out[hf] = _from_gguf(arch, config, hf, t)
    return arch.undone(out, config) if arch.undone else out


def to_gguf_tensors(
    tensors: Mapping[str, Tensor], arch: Architecture, config: Mapping[str, Any]
) -> dict[str, Tensor]:
    """Hugging Face tensors under GGUF's names, changed as llama.cpp's converter changes them
    (each layer's experts stacked into one tensor per matrix)."""
    if arch.redone:
        tensors = arch.redone(dict(tensors), config)
    rules = _rules(arch, reverse=True)
    out: dict[str, Tensor] = {}
    if arch.split is not None:
        tensors, out = arch.split(dict(tensors), config)
    stacks: dict[str, dict[int, Tensor]] = {}
    for name, t in tensors.items():
        renamed = _rename(name, rules)
        if renamed is None:
            raise ConversionError(f"tensor {name} has no GGUF name in the {arch.name} table")
        gguf_name, expert = renamed
        changed = _to_gguf(arch, config, name, t)
        if expert is None:
            out[gguf_name] = changed
        else:
            stacks.setdefault(gguf_name, {})[expert] = changed
    for gguf_name, experts in stacks.items():
        out[gguf_name] = torch.stack([experts[e] for e in sorted(experts)]).contiguous()
    return out
