"""DeepSeek-V3 (`DeepseekV3ForCausalLM`, model_type `deepseek_v3`; Kimi K2 has the same
architecture): multi-head latent attention (`mixer=mla`, its rotation YaRN-scaled with
DeepSeek's mscale), and, from layer `first_k_dense_replace` on, a mixture of SwiGLU experts
routed by sigmoid scores over groups of experts, with a score-correction bias that picks the
experts but does not weight them, a routed scaling factor and shared experts. The first layers
keep a dense SwiGLU `intermediate_size` wide: `ffn[:k]=swiglu, d_ff[:k]=...`.

    config.json                                     spec
    q_lora_rank (null: 0), kv_lora_rank,            mixer=mla(q_lora_rank=..., kv_lora_rank=...,
      qk_nope_head_dim, qk_rope_head_dim,             qk_nope_head_dim=..., qk_rope_head_dim=...,
      v_head_dim                                      v_head_dim=...)
    rope_interleave (null: false)                   mixer=mla(rope_interleave=...)
    attention_bias                                  mixer=mla(bias=...)
    rope_theta, rope_scaling / rope_parameters      mixer=mla(rope_theta=..., scaling=yarn,
      (default or yarn, with mscale and               factor=..., original_context_length=...,
      mscale_all_dim)                                 beta_fast=..., mscale=..., ...)
    n_routed_experts, num_experts_per_tok           ffn=moe(num_experts=..., top_k=...)
    n_group, topk_group                             ffn=moe(n_group=..., topk_group=...)
    (sigmoid scores, e_score_correction_bias)       ffn=moe(score=sigmoid, score_bias=true)
    norm_topk_prob, routed_scaling_factor           ffn=moe(renormalize=..., scale=...)
    n_shared_experts · moe_intermediate_size        ffn=moe(shared=swiglu(d_ff=...))
    moe_intermediate_size, intermediate_size        d_ff (experts), d_ff[dense layers]
    first_k_dense_replace                           ffn[:k]=swiglu
    rms_norm_eps                                    norm=rmsnorm(eps=...)

The latent norms (`q_a_layernorm`, `kv_a_layernorm`) are RMSNorms of eps 1e-6 whatever
`rms_norm_eps` says, as transformers builds them; the model's own `pos=` is `nope` (the mixer
rotates its `qk_rope_head_dim` dimensions itself). transformers derives `head_dim`
(`qk_rope_head_dim`) and `qk_head_dim` (`qk_nope_head_dim + qk_rope_head_dim`) and overwrites
whatever a config says: they are written, not read. `num_key_value_heads` must be the heads
(every head has its own keys and values). DeepSeek's own fields that transformers never reads
are refused unless they say what it computes (`moe_layer_freq: 1`, `scoring_func: sigmoid`,
`topk_method: noaux_tc`), or kept when they only concern training or parallelism
(`aux_loss_alpha`, `seq_aux`, `ep_size`), DeepSeek's remote code (`auto_map`), or the
multi-token-prediction layers transformers' DeepseekV3ForCausalLM does not build
(`num_nextn_predict_layers`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from lmcore.hf.common import core, ends, mlp, norms
from lmcore.hf.family import Family
from lmcore.hf.rules import Draft, Dropout, Field, Fixed, SpecView, checked, spread
from lmcore.hf.values import json_text as _json
from lmcore.hf.values import same as _same
from lmcore.hf.values import too_many as _too_many
from lmcore.hf.weights import weight
from lmcore.spec import ComponentSpec

DEFAULTS: Final = {
    "vocab_size": 129280,
    "hidden_size": 7168,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
}
ARCHITECTURE: Final = "DeepseekV3ForCausalLM"


@dataclass(frozen=True)
class Heads:
    """`num_key_value_heads`: null or the heads (latent attention has no grouped keys: every
    head's keys and values come from the one latent)."""

    @property
    def fields(self) -> tuple[str, ...]:
        return ("num_key_value_heads",)

    def read(self, d: Draft) -> None:
        kv, heads = d.config.get("num_key_value_heads"), d.values.get("num_heads")
        if kv is not None and heads is not None and not _same(kv, heads):
            d.problems.append(
                f"num_key_value_heads={_json(kv)}: DeepSeek-V3's latent attention gives each "
                f"of the num_attention_heads={heads} heads its own keys and values (set it to "
                f"{heads})"
            )

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        out["num_key_value_heads"] = v.spec.num_heads


@dataclass(frozen=True)
class Derived:
    """`head_dim` and `qk_head_dim`: transformers sets them from the mixer's widths whatever a
    config says (`qk_rope_head_dim`, `qk_nope_head_dim + qk_rope_head_dim`); written only."""

    @property
    def fields(self) -> tuple[str, ...]:
        return ("head_dim", "qk_head_dim")

    def read(self, d: Draft) -> None:
        return None

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        nope, rope = v.first("mixer.qk_nope_head_dim"), v.first("mixer.qk_rope_head_dim")
        if isinstance(nope, int) and isinstance(rope, int):
            out["head_dim"], out["qk_head_dim"] = rope, nope + rope


# A rope dict's YaRN parameters and the mixer's arguments (0.0: absent, as transformers treats
# a null or missing mscale).
_YARN: Final = {
    "factor": ("factor", float),
    "beta_fast": ("beta_fast", float),
    "beta_slow": ("beta_slow", float),
    "mscale": ("mscale", float),
    "mscale_all_dim": ("mscale_all_dim", float),
    "attention_factor": ("attention_factor", float),
}
_YARN_DEFAULTS: Final = {"beta_fast": 32.0, "beta_slow": 1.0}  # transformers' `or 32`, `or 1`


@dataclass(frozen=True)
class LatentRope:
    """The mixer's rotation: `rope_theta` and `rope_scaling` (transformers 4) or
    `rope_parameters` (5), of type default or yarn, to `mixer=mla(rope_theta=..., scaling=yarn,
    factor=..., ...)`; `original_max_position_embeddings` (in the rope dict, else at the top,
    else `max_position_embeddings`, as transformers standardises it). Other types, a partial
    rotation and `truncate: false` are refused by name. Written in transformers 4's form."""

    @property
    def fields(self) -> tuple[str, ...]:
        return (
            "rope_theta", "rope_scaling", "rope_parameters", "original_max_position_embeddings",
        )  # fmt: skip

    def read(self, d: Draft) -> None:
        p = d.problems
        params: dict[str, Any] = {}
        for name in ("rope_scaling", "rope_parameters"):
            given = d.config.get(name)
            if given is None:
                continue
            if not isinstance(given, dict):
                p.append(f"{name}={_json(given)} is not an object")
                return
            for key, value in given.items():
                key = "rope_type" if key == "type" else key
                if key in params and not _same(params[key], value):
                    p.append(f"rope_scaling and rope_parameters disagree on {key}")
                params[key] = value
        kind = params.pop("rope_type", "default")
        if kind not in ("default", "yarn"):
            p.append(
                f"rope type {_json(kind)}: DeepSeek-V3's latent attention in lmcore rotates "
                'without scaling ("default") or with "yarn"'
            )
            return
        top = d.config.get("rope_theta")
        if "rope_theta" in params and top is not None and not _same(params["rope_theta"], top):
            p.append(
                f"rope_theta={_json(top)} and rope rope_theta={_json(params['rope_theta'])} "
                "disagree"
            )
        theta = params.pop("rope_theta", 10000.0 if top is None else top)
        theta = checked("rope_theta", theta, float, p)
        fraction = params.pop("partial_rotary_factor", None)
        if fraction is not None and not (_same(fraction, 1) or _same(fraction, 1.0)):
            p.append(
                f"partial_rotary_factor={_json(fraction)}: the latent attention rotates all "
                "qk_rope_head_dim dimensions"
            )
        if theta is not None:
            d.set("mixer.rope_theta", theta, "the rotary parameters")
        if kind == "default":
            self._extra(d, params, kind)
            return
        d.set("mixer.scaling", "yarn", "the rotary parameters")
        if params.get("factor") is None:
            p.append("rope yarn scaling without factor")
        original = params.pop("original_max_position_embeddings", None)
        outer = d.config.get("original_max_position_embeddings")
        if original is not None and outer is not None and not _same(original, outer):
            p.append(
                f"original_max_position_embeddings={_json(outer)} and rope "
                f"original_max_position_embeddings={_json(original)} disagree"
            )
        original = outer if outer is not None else original
        if original is None:
            original = d.config.get("max_position_embeddings", DEFAULTS["max_position_embeddings"])
        got = checked("original_max_position_embeddings", original, int, p)
        if got is not None:
            d.set("mixer.original_context_length", got, "the rotary parameters")
        truncate = params.pop("truncate", True)
        if truncate is not True:
            p.append(
                f"rope truncate={_json(truncate)}: lmcore's YaRN rounds the correction range "
                "outwards (truncate: true)"
            )
        for key, (arg, kind_of) in _YARN.items():
            value = params.pop(key, None)
            value = value or _YARN_DEFAULTS.get(key)  # transformers reads 0 and null as unset
            if value is None:
                continue
            value = checked(f"rope {key}", value, kind_of, p)
            if value is not None:
                d.set(f"mixer.{arg}", value, "the rotary parameters")
        self._extra(d, params, kind)

    @staticmethod
    def _extra(d: Draft, params: dict[str, Any], kind: str) -> None:
        if params:
            shown = ", ".join(f"{k}={_json(v)}" for k, v in sorted(params.items()))
            d.problems.append(
                f"rope parameters {shown}: lmcore's latent attention with {_json(kind)} "
                "rotation reads none of them"
            )

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        if v.first("mixer") != "mla":
            return  # the read-back names it
        out["rope_theta"] = v.keep("rope_theta", v.first("mixer.rope_theta"))
        if v.first("mixer.scaling") != "yarn":
            out["rope_scaling"] = None
            return
        rope: dict[str, Any] = {
            "rope_type": "yarn",
            "original_max_position_embeddings": v.first("mixer.original_context_length"),
        }
        for key, (arg, _) in _YARN.items():
            value = v.first(f"mixer.{arg}")
            if value:  # 0: absent
                rope[key] = value
        out["rope_scaling"] = rope


@dataclass(frozen=True)
class Experts:
    """DeepSeek-V3's mixture of experts on layers `first_k_dense_replace` on (the ones before
    keep a dense SwiGLU `intermediate_size` wide): `n_routed_experts` experts
    `moe_intermediate_size` wide, `num_experts_per_tok` of them per token, chosen by sigmoid
    scores plus the correction bias within the best `topk_group` of `n_group` groups, weighted
    by the scores (renormalised with `norm_topk_prob`) times `routed_scaling_factor`, plus a
    shared SwiGLU `n_shared_experts · moe_intermediate_size` wide. transformers' DeepSeek-V3
    adds no load-balancing loss: `aux_loss_coef=0`."""

    @property
    def fields(self) -> tuple[str, ...]:
        return (
            "n_routed_experts", "num_local_experts", "num_experts_per_tok",
            "moe_intermediate_size", "intermediate_size", "first_k_dense_replace",
            "n_shared_experts", "n_group", "topk_group", "norm_topk_prob",
            "routed_scaling_factor",
        )  # fmt: skip

    def read(self, d: Draft) -> None:
        p = d.problems
        given = [(n, d.config[n]) for n in ("n_routed_experts", "num_local_experts")
                 if d.config.get(n) is not None]  # fmt: skip
        if len({_json(v) for _, v in given}) > 1:
            p.append(" and ".join(f"{n}={_json(v)}" for n, v in given) + " disagree")
        experts = checked(
            given[0][0] if given else "n_routed_experts", given[0][1] if given else 256, int, p
        )

        def field(name: str, default: Any, kind: type = int, zero: bool = False) -> Any:
            return checked(name, d.field(name, default), kind, p, zero=zero)

        top_k = field("num_experts_per_tok", 8)
        width = field("moe_intermediate_size", 2048)
        dense_width = field("intermediate_size", 18432)
        dense = field("first_k_dense_replace", 3, zero=True)
        shared = field("n_shared_experts", 1)
        groups = field("n_group", 8)
        topk_group = field("topk_group", 4)
        renorm = field("norm_topk_prob", True, bool)
        scale = field("routed_scaling_factor", 2.5, float)
        n = d.num_layers
        values = (experts, top_k, width, dense_width, dense, shared, groups, topk_group)
        if None in (*values, renorm, scale) or n is None:
            return
        sparse = spread(n, range(min(dense, n), n))
        if sparse is None:
            p.append(_too_many(n, f"experts (first_k_dense_replace={dense})"))
            return

        def by_layer(yes: Any, no: Any) -> Any:
            if isinstance(sparse, bool):
                return yes if sparse else no
            return [yes if s else no for s in sparse]

        d.set("ffn", by_layer("moe", "swiglu"), "first_k_dense_replace")
        d.set("d_ff", by_layer(width, dense_width), "moe_intermediate_size")
        router = {
            "num_experts": experts,
            "top_k": top_k,
            "renormalize": renorm,
            "shared": ComponentSpec("swiglu", (("d_ff", shared * width),)),
            "aux_loss_coef": 0.0,
            "score": "sigmoid",
            "n_group": groups,
            "topk_group": topk_group,
            "score_bias": True,
            "scale": scale,
        }
        for arg, value in router.items():
            d.set(f"ffn.{arg}", by_layer(value, None), "the router")

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        ffns, widths = v.layers("ffn"), v.layers("d_ff")
        sparse = [f == "moe" for f in ffns]
        dense = next((i for i, s in enumerate(sparse) if s), v.n)
        out["first_k_dense_replace"] = dense
        if not any(sparse):  # every layer dense: the experts' fields as the base says
            out["intermediate_size"] = widths[0]
            for name in self.fields[2:]:
                if name in v.base and name not in out and name != "num_local_experts":
                    out[name] = v.base[name]
            return
        width = widths[dense]
        out["n_routed_experts"] = v.first("ffn.num_experts")
        out["num_experts_per_tok"] = v.first("ffn.top_k")
        out["moe_intermediate_size"] = width
        out["intermediate_size"] = widths[0] if dense else v.base.get("intermediate_size", width)
        shared = v.first("ffn.shared")
        shared_width = None if shared is None else shared.kwargs().get("d_ff", width)
        # Not a multiple of the experts' width (or none): the read-back names the difference.
        out["n_shared_experts"] = max(1, (shared_width or width) // width)
        out["n_group"] = v.first("ffn.n_group")
        out["topk_group"] = v.first("ffn.topk_group")
        out["norm_topk_prob"] = v.first("ffn.renormalize")
        out["routed_scaling_factor"] = v.keep("routed_scaling_factor", v.first("ffn.scale"))


def _latent(name: str, arg: str, default: Any, **kw: Any) -> Field:
    return Field(name, f"mixer.{arg}", int, default, **kw)


AT: Final = "model.layers.{i}"
_ATTN: Final = (
    "q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
)  # fmt: skip
FAMILY: Final = Family(
    model_type="deepseek_v3",
    architecture=ARCHITECTURE,
    spec={
        "block": "prenorm",
        "norm": "rmsnorm",
        "pos": "nope",
        "mixer": "mla",
        "mixer.eps": 1e-6,  # transformers' latent norms keep their default eps
        "attn": "sdpa",
    },
    rules=(
        *(r for r in core(DEFAULTS, head_dim=False, d_ff=False)
          if r.fields[0] != "num_key_value_heads"),
        Heads(),
        Derived(),
        Fixed("hidden_act", ("silu", "swish"), "lmcore's experts here are SwiGLU"),
        Field(
            "q_lora_rank", "mixer.q_lora_rank", int, 1536, zero=True, null=0,
            writes=lambda r: r or None,
        ),
        _latent("kv_lora_rank", "kv_lora_rank", 512),
        _latent("qk_nope_head_dim", "qk_nope_head_dim", 128),
        _latent("qk_rope_head_dim", "qk_rope_head_dim", 64),
        _latent("v_head_dim", "v_head_dim", 128),
        Field("rope_interleave", "mixer.rope_interleave", bool, True, null=False),
        Field("attention_bias", "mixer.bias", bool, False),
        LatentRope(),
        Experts(),
        Fixed(
            "moe_layer_freq", (1,),
            "transformers' DeepseekV3 makes every layer from first_k_dense_replace on a "
            "mixture of experts", write_it=False,
        ),
        Fixed("scoring_func", ("sigmoid",), "transformers' DeepseekV3 routes by sigmoid",
              write_it=False),
        Fixed("topk_method", ("noaux_tc",), "transformers' DeepseekV3 picks the top-k of the "
              "best groups with the correction bias", write_it=False),
        Dropout(("attention_dropout",)),
    ),  # fmt: skip
    tensors=(
        *ends(),
        *norms({"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}),
        *(
            weight(f"layers.{{i}}.attn.{name}.{kind}", f"{AT}.self_attn.{name}.{kind}")
            for name in _ATTN
            for kind in ("weight", "bias")
        ),
        weight("layers.{i}.attn.q_a_layernorm.weight", f"{AT}.self_attn.q_a_layernorm.weight"),
        weight("layers.{i}.attn.kv_a_layernorm.weight", f"{AT}.self_attn.kv_a_layernorm.weight"),
        *mlp(),
        weight("layers.{i}.ffn.router.weight", f"{AT}.mlp.gate.weight"),
        weight("layers.{i}.ffn.score_bias", f"{AT}.mlp.gate.e_score_correction_bias"),
        *(
            weight(
                f"layers.{{i}}.ffn.experts.{{e}}.{ours}.weight",
                f"{AT}.mlp.experts.{{e}}.{hf}.weight",
            )
            for ours, hf in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj"))
        ),
        *mlp(at=f"{AT}.mlp.shared_experts", ours="layers.{i}.ffn.shared"),
    ),
    passive=frozenset(
        {"num_nextn_predict_layers", "output_router_logits", "aux_loss_alpha", "seq_aux",
         "ep_size", "auto_map"}
    ),  # fmt: skip
)
