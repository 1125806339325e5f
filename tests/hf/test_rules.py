"""The rules of a family's table (`lmcore.hf.rules`) under hostile numbers: every number a
config.json gives is checked before it is used (a 400-digit integer named, abbreviated), and the
per-layer rules (sliding windows, experts) do no work per layer for a model whose layers are all
alike, whatever `num_hidden_layers` says (issue 32)."""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import pytest

import lmcore.hf.family as family_module
from lmcore import ConversionError
from lmcore.hf import read_config
from lmcore.hf.rules import Draft, Moe, Window
from lmcore.spec import MAX_LAYERED
from tests.helpers.errors import raises_naming
from tests.helpers.hf import FAMILY_CONFIGS, LLAMA_V4

THETA = 10**399  # a 400-digit integer
HUGE = 10**12


def test_a_400_digit_rope_theta_is_named_abbreviated() -> None:
    v5 = {k: v for k, v in LLAMA_V4.items() if k not in ("rope_theta", "rope_scaling")}
    for config, key in (
        (dict(LLAMA_V4, rope_theta=THETA), "rope_theta="),
        (dict(v5, rope_parameters={"rope_type": "default", "rope_theta": THETA}),
         "rope_parameters.rope_theta="),
    ):  # fmt: skip
        with raises_naming(ConversionError, key, "1000000", "400 digits", "float's range") as e:
            read_config(config)
        assert len(str(e.value)) < 400  # abbreviated: the value is not printed whole


@pytest.mark.parametrize(
    ("value", "facts"),
    [
        (2**63, ("num_hidden_layers=9223372036854775808", "2**63 - 1")),
        (10**100, ("num_hidden_layers=100000000000...(101 digits)", "2**63 - 1")),
        (-3, ("num_hidden_layers=-3", "positive int")),
        (2.5, ("num_hidden_layers=2.5", "positive int")),
        ("2", ('num_hidden_layers="2"', "positive int")),
    ],
)
def test_integers_are_checked_before_use(value: Any, facts: tuple[str, ...]) -> None:
    with raises_naming(ConversionError, "config.json", *facts):
        read_config(dict(LLAMA_V4, num_hidden_layers=value))


def _draft(config: dict[str, Any], n: int) -> Draft:
    d = Draft(config)
    d.set("num_layers", n, "num_hidden_layers")
    return d


def test_windows_and_experts_on_every_layer_are_one_value_for_a_trillion_layers() -> None:
    tracemalloc.start()
    start = time.perf_counter()
    d = _draft({"sliding_window": 6, "num_experts": 4, "intermediate_size": 48,
                "moe_intermediate_size": 24}, HUGE)  # fmt: skip
    Window(default=4096).read(d)
    Moe(experts=("num_experts",), d_ff="moe_intermediate_size", dense="mlp_only_layers").read(d)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert time.perf_counter() - start < 1 and peak < 1_000_000
    assert d.problems == []
    assert d.values["window"] == 6 and d.values["ffn"] == "moe" and d.values["d_ff"] == 24
    assert d.values["ffn.num_experts"] == 4


def test_layers_that_differ_are_listed_when_the_spec_can_say_it_else_refused() -> None:
    d = _draft({"sliding_window": 6, "layer_types": ["sliding_attention", "full_attention"] * 3}, 6)
    Window(layer_types=True).read(d)
    assert d.values["window"] == [6, 0] * 3
    d = _draft({"sliding_window": 6}, HUGE)
    Window(layer_types=True, default_types=lambda d, n: range(0, n, 2)).read(d)  # Gemma 2's
    assert len(d.problems) == 1
    assert "sliding_window=6" in d.problems[0] and "1,000,000,000,000 layers" in d.problems[0]
    assert f"{MAX_LAYERED:,}" in d.problems[0]
    d = _draft({"num_experts": 4, "intermediate_size": 48, "mlp_only_layers": [3]}, HUGE)
    Moe(experts=("num_experts",), dense="mlp_only_layers").read(d)
    assert "experts" in d.problems[0] and "1,000,000,000,000 layers" in d.problems[0]


def test_no_window_is_zero_on_every_layer_whatever_the_types(monkeypatch) -> None:
    d = _draft({"sliding_window": None}, HUGE)
    Window(layer_types=True, default_types=lambda d, n: range(0, n, 2)).read(d)
    assert d.problems == [] and d.values["window"] == 0


@pytest.mark.parametrize("name", sorted(FAMILY_CONFIGS))
def test_every_family_reads_a_trillion_layers_in_bounded_time_and_memory(
    name: str, monkeypatch
) -> None:
    """The translation alone (the spec string, not its resolution, which is the blueprint's):
    nothing is done per layer unless the config itself lists per-layer values."""
    config = dict(FAMILY_CONFIGS[name], model_type=name)
    layers = "n_layer" if name == "gpt2" else "num_hidden_layers"
    config[layers] = HUGE
    config.pop("mlp_only_layers", None)  # a list that names layers: Qwen3-MoE's dense ones
    config.pop("max_window_layers", None)  # Qwen 2: its default (28) splits the layers
    config.pop("use_sliding_window", None)
    config.pop("layer_types", None)  # LFM2's: a list that names layers
    config.pop("scale_attn_by_inverse_layer_idx", None)  # GPT-2's: a scale per layer
    monkeypatch.setattr(family_module, "parse_spec", lambda text: text)
    tracemalloc.start()
    start = time.perf_counter()
    # Hybrids: windows (Gemma 2: every other layer; Gemma 3: all but every pattern-th),
    # attention (Qwen3-Next) or experts (DeepSeek-V3) on more layers than a spec can list.
    hybrid = {
        "gemma2": "sliding_window=6",
        "gemma3_text": "sliding_window_pattern=2",
        "qwen3_next": "full attention (full_attention_interval=2)",
        "olmo3": "sliding_window=6",
        "gpt_oss": "sliding_window=6",
        "deepseek_v3": "experts (first_k_dense_replace=1)",  # dense first layers
    }
    if name in hybrid:
        with raises_naming(ConversionError, hybrid[name], "1,000,000,000,000 layers"):
            read_config(config)
    elif name == "smollm3":  # NoPE on every other layer: as many per-layer values
        with raises_naming(ConversionError, "NoPE on some of its 1,000,000,000,000 layers"):
            read_config(config)
    else:
        spec = read_config(config).spec
        assert f"num_layers={HUGE}" in spec and "[" not in spec
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert time.perf_counter() - start < 2 and peak < 5_000_000


def test_a_scale_per_layer_is_refused_past_what_a_spec_lists(monkeypatch) -> None:
    config = dict(FAMILY_CONFIGS["gpt2"], model_type="gpt2", n_layer=HUGE)
    monkeypatch.setattr(family_module, "parse_spec", lambda text: text)
    with raises_naming(
        ConversionError, "scale_attn_by_inverse_layer_idx=true", "1,000,000,000,000 layers",
        f"{MAX_LAYERED:,}",
    ):  # fmt: skip
        read_config(config)
    spec = read_config(dict(config, n_layer=3)).spec  # 1/(i + 1) of 1/sqrt(8), by layer
    items = dict(item.split("=", 1) for item in spec.split(", ") if item.startswith("query"))
    scales = [float(items["query_scale"]), *(float(items[f"query_scale[{i}]"]) for i in (1, 2))]
    assert scales == pytest.approx([8**-0.5 / (i + 1) for i in range(3)], rel=1e-12)
