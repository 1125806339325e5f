"""gpt-oss (`GptOssForCausalLM`, model_type `gpt_oss`): a pre-norm RMSNorm decoder whose
attention has biases, a learned sink logit per head (`attn_sinks`) and a sliding window on the
layers `layer_types` names (by default the even ones), and whose every feed-forward layer is a
mixture of clamped-SwiGLU experts with biases (`clamped_swiglu`), routed by a biased router
whose top-k logits are softmaxed (`moe(softmax=after, router_bias=true)`); rotary embeddings
with YaRN scaling by default.

    config.json                             spec
    num_local_experts, num_experts_per_tok  ffn=moe(num_experts=..., top_k=...)
    intermediate_size                       d_ff (each expert's width)
    swiglu_alpha, swiglu_limit              moe(expert=clamped_swiglu(alpha, limit, bias=true))
    attention_bias                          qkv_bias, out_bias
    sliding_window, layer_types             window[layers]=...
    rope_parameters (absent: YaRN, factor   pos=rope(theta=..., scaling=...)
      32 over 4,096 positions)
    router_aux_loss_coef, ...               moe(aux_loss_coef=...), as Mixtral's

State-dict keys: the experts' weights are stacked in three tensors per layer, transposed
(`x @ W`): `experts.gate_up_proj (E, d_model, 2·d_ff)`, its columns the gate's and the up
projection's in turn (w1 row 0, w3 row 0, w1 row 1, ...), and `experts.down_proj (E, d_ff,
d_model)`, each with its bias; `self_attn.sinks` is `attn.sinks`; `mlp.router` is `ffn.router`.
`hidden_act` is never read by transformers' gpt-oss (its experts gate by their own formula): kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from lmcore.hf.common import attention, core, ends, norms
from lmcore.hf.draft import Draft, SpecView
from lmcore.hf.family import Family
from lmcore.hf.rules import Dropout, Field, Moe, Rope, Window
from lmcore.hf.values import checked
from lmcore.hf.weights import Experts, weight
from lmcore.spec import ComponentSpec

DEFAULTS: Final = {
    "vocab_size": 201088,
    "hidden_size": 2880,
    "num_hidden_layers": 36,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-5,
}
# transformers' GptOssConfig: the rotary parameters of a config that gives none.
DEFAULT_ROPE: Final = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
EXPERT: Final = "clamped_swiglu"


def even_layers(d: Draft, n: int) -> range:
    """transformers' default `layer_types`: layers 0, 2, 4, ... slide."""
    return range(0, n, 2)


@dataclass(frozen=True)
class ClampedExperts:
    """`swiglu_alpha` and `swiglu_limit` to the experts, `clamped_swiglu(alpha, limit,
    bias=true)`: every gpt-oss expert has biases."""

    alpha: float = 1.702
    limit: float = 7.0

    @property
    def fields(self) -> tuple[str, ...]:
        return ("swiglu_alpha", "swiglu_limit")

    def read(self, d: Draft) -> None:
        alpha = checked("swiglu_alpha", d.field("swiglu_alpha", self.alpha), float, d.problems)
        limit = checked("swiglu_limit", d.field("swiglu_limit", self.limit), float, d.problems)
        if alpha is None or limit is None:
            return
        args = (("alpha", alpha), ("limit", limit), ("bias", True))
        d.set("ffn.expert", ComponentSpec(EXPERT, args), "swiglu_alpha, swiglu_limit")

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        expert = v.first("ffn.expert")
        if expert is None or expert.name != EXPERT:
            return  # the read-back names the expert
        kwargs = expert.kwargs()
        out["swiglu_alpha"] = v.keep("swiglu_alpha", kwargs["alpha"])
        out["swiglu_limit"] = v.keep("swiglu_limit", kwargs["limit"])


@dataclass(frozen=True)
class GptOssRope:
    """The shared `Rope` rule, with transformers' YaRN default (`DEFAULT_ROPE`) for a config
    that gives no rotary parameters, as GptOssConfig fills them in; so a rope without scaling
    is written `{"rope_type": "default"}`, never null."""

    rope: Rope = Rope(theta=150000.0)

    @property
    def fields(self) -> tuple[str, ...]:
        return self.rope.fields

    def read(self, d: Draft) -> None:
        config = d.config
        if config.get("rope_parameters") is None and config.get("rope_scaling") is None:
            d.config = {**config, "rope_parameters": DEFAULT_ROPE}
        try:
            self.rope.read(d)
        finally:
            d.config = config

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        self.rope.write(v, out)
        if "rope_scaling" in out and out["rope_scaling"] is None:
            out["rope_scaling"] = {"rope_type": "default"}


AT: Final = "model.layers.{i}.mlp"
_OURS: Final = "layers.{i}.ffn.experts.{e}"
FAMILY: Final = Family(
    model_type="gpt_oss",
    architecture="GptOssForCausalLM",
    spec={
        "block": "prenorm",
        "norm": "rmsnorm",
        "pos": "rope",
        "attn": "sdpa",
        "attn_sinks": True,
        "ffn.softmax": "after",
        "ffn.router_bias": True,
    },
    rules=(
        *core(DEFAULTS, d_ff=False),
        Field("attention_bias", ("qkv_bias", "out_bias"), bool, True),
        Moe(experts=("num_local_experts", "num_experts"), experts_default=128, top_k_default=4,
            renormalize=False),
        ClampedExperts(),
        GptOssRope(),
        Window(default=128, layer_types=True, default_types=even_layers),
        Dropout(("attention_dropout",)),
    ),  # fmt: skip
    tensors=(
        *ends(),
        *norms({"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}),
        *attention(),
        weight("layers.{i}.attn.sinks", "model.layers.{i}.self_attn.sinks"),
        weight("layers.{i}.ffn.router.weight", f"{AT}.router.weight"),
        weight("layers.{i}.ffn.router.bias", f"{AT}.router.bias"),
        weight(
            (f"{_OURS}.w1.weight", f"{_OURS}.w3.weight"),
            f"{AT}.experts.gate_up_proj",
            Experts(2, interleaved=True, transpose=True),
        ),
        weight(
            (f"{_OURS}.w1.bias", f"{_OURS}.w3.bias"),
            f"{AT}.experts.gate_up_proj_bias",
            Experts(2, interleaved=True),
        ),
        weight(f"{_OURS}.w2.weight", f"{AT}.experts.down_proj", Experts(transpose=True)),
        weight(f"{_OURS}.w2.bias", f"{AT}.experts.down_proj_bias", Experts()),
    ),
    passive=frozenset({"hidden_act"}),
)
