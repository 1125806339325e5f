"""What `lmcore describe` shows (`lmcore.describe`): every component's declared parameters,
buffers and activations held to the model built on the meta device and to autograd's saved
tensors, measured on request, and the training memory; one probe against a real CPU forward's
RSS."""

from __future__ import annotations

import itertools
import json
import os
import platform
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from lmcore import Component, build_model, get_registry, scoped_registry
from lmcore.describe import (
    activation_bytes,
    check_buffers,
    check_params,
    describe,
    measure_activations,
    measured_params,
    recomputed_activations,
    saved_activation_bytes,
)
from lmcore.errors import LmcoreError
from lmcore.model.counting import AccountingError, account
from lmcore.model.nn import Linear
from lmcore.model.recompute import RecomputeError
from tests.helpers.errors import raises_naming
from tests.helpers.models import PlainNorm, components, spec_for

# --------------------------------------------------------------- declared vs built parameters


@pytest.mark.parametrize("preset", get_registry().preset_names())
def test_declared_parameters_equal_the_built_model_for_every_preset(preset: str) -> None:
    acc = account(preset)
    model = build_model(preset, device="meta")
    assert measured_params(acc, model) == {r.name: r.params for r in acc.rows}
    assert acc.params == sum(p.numel() for p in model.parameters())
    check_params(acc, model)


@pytest.mark.parametrize(("kind", "name"), components())
def test_declared_parameters_equal_the_built_model_for_every_component(
    kind: str, name: str
) -> None:
    spec = spec_for(kind, name)
    acc = account(spec)
    model = build_model(spec)
    assert measured_params(acc, model) == {r.name: r.params for r in acc.rows}
    assert acc.params == sum(p.numel() for p in model.parameters())


def test_a_wrong_declaration_is_named_with_its_component_and_plugin() -> None:
    class TwoLinears(torch.nn.Module):
        def __init__(self, d_model: int, d_ff: int):
            super().__init__()
            self.up, self.down = Linear(d_model, d_ff), Linear(d_ff, d_model)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.down(self.up(x))
            return out

    liar = Component(
        kind="ffn",
        name="liar",
        build=TwoLinears,
        params=lambda d_model, d_ff: 3 * d_model * d_ff,  # it builds two matrices, not three
        # (d_ff: the preset's 128 belongs to swiglu; another ffn gets its default, 4·d_model)
        flops=lambda d_model, d_ff, seq_len: 4 * seq_len * d_model * d_ff,
    )
    with scoped_registry() as registry:
        registry.add(liar, name="liars")
        with raises_naming(
            AccountingError,
            "layers.*.ffn: ffn 'liar'",
            "plugin 'liars'",
            "declares 49,152 parameters for d_model=64, d_ff=256",
            "holds 32,768",
            "fix the params= declaration of ffn 'liar'",
        ):
            describe("cs336-tiny, ffn=liar")


def test_a_parameter_outside_every_row_is_reported_by_name() -> None:
    acc = account("cs336-tiny")
    model = build_model("cs336-tiny", device="meta")
    model.register_parameter("stray", torch.nn.Parameter(torch.zeros(2, device="meta")))
    with raises_naming(AccountingError, "parameters outside the accounted modules", "(stray)"):
        check_params(acc, model)


# ------------------------------------------------------------------------------- memory


def test_saved_activation_bytes_counts_live_saved_storages_once() -> None:
    weight = torch.nn.Parameter(torch.ones(8, 8))
    module = torch.nn.Module()
    module.weight = weight
    x = torch.ones(4, 8)

    def run() -> torch.Tensor:
        h = x @ weight  # saves x (128 bytes) and weight (a parameter: not an activation)
        _ = h.amax(-1).detach()  # its node dies at once: what it saved must not count
        y = h.exp()  # saves its output (128 bytes) ...
        return (y * y.T.T).sum()  # ... which mul saves twice more, through views

    assert saved_activation_bytes(module, run) == 128 + 128


def test_activations_on_meta_equal_those_on_cpu() -> None:
    torch.manual_seed(0)
    cpu = activation_bytes(build_model("cs336-tiny, pos=alibi"), 2, 16)
    meta = activation_bytes(build_model("cs336-tiny, pos=alibi", device="meta"), 2, 16)
    assert cpu == meta > 0


def test_training_memory_adds_weights_gradients_adamw_buffers_and_activations() -> None:
    found = describe("cs336-tiny", batch=2, dtype=torch.bfloat16)
    mem, n = found.memory, found.accounting.params
    assert (mem.dtype, mem.weights, mem.gradients, mem.optimizer) == (
        "bfloat16",
        2 * n,
        2 * n,
        8 * n,
    )
    assert mem.buffers == 2 * 16 * 8 * 4  # RoPE cos and sin: (context, head_dim / 2) float32
    assert mem.activations == activation_bytes(
        build_model("cs336-tiny", device="meta", dtype=torch.bfloat16), 2, 16
    )
    assert mem.total == mem.weights + mem.gradients + mem.optimizer + mem.buffers + mem.activations


# ------------------------------------------------------- declared activations vs measurement


def measured_vs_declared(
    spec: str, batch: int, seq: int, dtype: torch.dtype
) -> dict[str, tuple[int, int]]:
    """{row: (declared, measured)} for every row (and the loss) where the two differ."""
    acc = account(spec, batch=batch, seq_len=seq, dtype=dtype)
    measured = measure_activations(acc, build_model(acc.spec, device="meta", dtype=dtype))
    declared = acc.declared_activations()
    assert measured.pop("other") == 0, "lmcore's own code saved something outside every row"
    assert measured.keys() == declared.keys()
    return {k: (declared[k], measured[k]) for k in declared if declared[k] != measured[k]}


# Around the component: multi-head, then post-norm with one k/v head, then two k/v heads with
# tied embeddings; one sequence, several of an odd length, and a single token.
VARIANTS = ("", ", block=postnorm, num_kv_heads=1", ", num_kv_heads=2, tie_embeddings=true")
SHAPES = ((1, 16), (3, 11), (2, 1))


@pytest.mark.parametrize(("kind", "name"), components())
def test_declared_activations_equal_the_measurement_for_every_component(
    kind: str, name: str
) -> None:
    spec = spec_for(kind, name)
    variants = [v.replace(", block=postnorm", "") if kind == "block" else v for v in VARIANTS]
    for variant, (batch, seq), dtype in itertools.product(
        variants, SHAPES, (torch.float32, torch.bfloat16)
    ):
        assert measured_vs_declared(spec + variant, batch, seq, dtype) == {}, (
            variant, batch, seq, dtype,
        )  # fmt: skip


@pytest.mark.parametrize("block_size", [1, 5, 16, 100])
def test_chunked_attention_activations_for_any_block_size(block_size: int) -> None:
    spec = f"cs336-tiny, attn=chunked(block_size={block_size}), pos=alibi"
    for (batch, seq), dtype in itertools.product(SHAPES, (torch.float32, torch.bfloat16)):
        assert measured_vs_declared(spec, batch, seq, dtype) == {}, (batch, seq, dtype)


def test_describe_measures_on_request_and_finds_the_declared_numbers() -> None:
    declared = describe("tinystories, attn=chunked(block_size=100)", batch=2, seq_len=250)
    measured = describe(
        "tinystories, attn=chunked(block_size=100)", batch=2, seq_len=250, measure=True
    )
    assert declared.memory.activations_source == "declared"
    assert measured.memory.activations_source == "measured" and measured.mismatches == ()
    assert measured.memory.activations == declared.memory.activations
    assert measured.memory.activations_by_part == declared.memory.activations_by_part


def test_an_undeclared_component_is_measured_and_named() -> None:
    plain = Component(kind="norm", name="plain", build=PlainNorm, params=lambda d_model: d_model)
    with scoped_registry() as registry:
        registry.add(plain, name="plain-norms")
        found = describe("cs336-tiny, norm=plain", batch=2)
        assert found.accounting.activations is None
        assert found.memory.activations_source == "measured"
        assert found.memory.note == "norm 'plain' declares none"
        model = build_model("cs336-tiny, norm=plain", device="meta")
        assert found.memory.activations == activation_bytes(model, 2, 16)


def test_a_wrong_declaration_shows_up_when_measured() -> None:
    short = Component(
        kind="norm",
        name="short",
        build=PlainNorm,
        params=lambda d_model: d_model,
        activations=lambda batch, seq_len, d_model: 4 * batch * seq_len * d_model,  # x only
    )
    with scoped_registry() as registry:
        registry.add(short, name="short-norms")
        assert describe("cs336-tiny, norm=short").mismatches == ()  # not measured: not known
        found = describe("cs336-tiny, norm=short", measure=True)
    # PlainNorm keeps float32 x, x / rms and rms: 4·16·(2·64 + 1) bytes per norm; declared 4·16·64.
    assert found.mismatches == (
        "layers.*.ln1: declared 12,288 bytes, measured 24,768",
        "layers.*.ln2: declared 12,288 bytes, measured 24,768",
        "ln_final: declared 4,096 bytes, measured 8,256",
    )
    assert found.memory.activations_source == "measured"


RSS_PROBE = r"""
import gc, json, sys
import torch
from lmcore.describe import activation_bytes
from lmcore.model.nn import cross_entropy
from lmcore.model.transformer import build_model
from lmcore.train.smoke import random_tokens

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

batch, seq, specs = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
results = {}
for spec in specs:
    torch.manual_seed(0)
    model = build_model(spec)
    tokens = torch.Generator().manual_seed(0)
    inputs, targets = random_tokens(model.spec.vocab_size, batch, seq, tokens)
    cross_entropy(model(inputs), targets).backward()  # warm up thread pools, lazy initialisation
    model.zero_grad(set_to_none=True)
    gc.collect()
    before = rss()
    loss = cross_entropy(model(inputs), targets)  # the graph holds what backward will need
    held = rss() - before
    del loss
    estimate = activation_bytes(build_model(spec, device="meta"), batch, seq)
    results[spec] = {"measured": held, "estimate": estimate}
print(json.dumps(results))
"""


@pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc",
    reason="measures RSS with glibc's malloc returning every freed block to the system",
)
def test_activation_estimate_matches_the_memory_a_real_cpu_forward_holds() -> None:
    specs = ["tinystories, num_layers=2", "tinystories, num_layers=2, ffn=gelu, pos=alibi"]
    # With mmap for every block of 4 KiB or more, RSS rises by what the live graph holds.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "4096"}
    out = subprocess.run(
        [sys.executable, "-c", RSS_PROBE, "4", "64", *specs],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    results = json.loads(out.stdout)
    assert list(results) == specs
    for spec, result in results.items():
        assert result["estimate"] > 20_000_000, spec  # big enough that page rounding is noise
        assert result["measured"] == pytest.approx(result["estimate"], rel=0.03), (spec, result)


class DataDependentNorm(PlainNorm):
    """Reads a value in its forward, which a meta tensor cannot give."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.abs().max().item() > 1e4:
            x = x / 1e4
        return super().forward(x)


def test_a_forward_that_cannot_run_on_meta_leaves_undeclared_activations_unknown() -> None:
    norm = Component(
        kind="norm", name="peeks", build=DataDependentNorm, params=lambda d_model: d_model
    )
    with scoped_registry() as registry:
        registry.add(norm, name="peeking-norms")
        mem = describe("cs336-tiny, norm=peeks").memory
    assert (mem.activations, mem.activations_source, mem.activations_by_part) == (None, "", {})
    assert mem.note.startswith(
        "norm 'peeks' declares none, and the forward does not run on the meta device (RuntimeError: "
    )
    assert mem.total == mem.weights + mem.gradients + mem.optimizer + mem.buffers


def test_measuring_a_forward_that_cannot_run_on_meta_keeps_the_declared_bytes() -> None:
    norm = Component(
        kind="norm",
        name="peeks",
        build=DataDependentNorm,
        params=lambda d_model: d_model,
        activations=lambda batch, seq_len, d_model: 4 * batch * seq_len * (2 * d_model + 1),
    )
    with scoped_registry() as registry:
        registry.add(norm, name="peeking-norms")
        declared = describe("cs336-tiny, norm=peeks").memory
        asked = describe("cs336-tiny, norm=peeks", measure=True)
    assert asked.memory.activations == declared.activations is not None
    assert asked.memory.activations_source == "declared" and asked.mismatches == ()
    assert asked.memory.note.startswith(
        "not measured: the forward does not run on the meta device (RuntimeError: "
    )
    assert asked.memory.note.endswith("; showing the declared bytes")


# ------------------------------------------------------------------------------- buffers


def test_declared_buffers_equal_the_built_modules_for_every_component() -> None:
    for entry in get_registry().entries():
        if entry.component.buffers is None:
            continue
        spec = spec_for(entry.kind, entry.name)
        acc = account(spec)
        check_buffers(acc, build_model(spec, device="meta"))
        if entry.kind in ("block", "mixer"):  # one holding nothing of its own has no row
            rows = [r for r in acc.rows if r.entry == entry]
            assert all(r.buffers is not None for r in rows)
            continue
        assert acc.row("pos" if entry.kind == "pos" else "ln_final").buffers is not None


def test_a_wrong_buffers_declaration_is_named() -> None:
    import lmcore_rope

    [rope] = lmcore_rope.lmcore_components()
    wrong = replace(
        rope,
        name="rope2",
        buffers=lambda context_length, head_dim: 4 * context_length * head_dim // 2,
    )
    with scoped_registry() as registry:
        registry.add(wrong, name="half-rope")
        with raises_naming(
            AccountingError,
            "pos: pos 'rope2'",
            "plugin 'half-rope'",
            "declares 512 bytes of buffers in torch.float32",
            "holds 1,024",
            "fix the buffers= declaration of pos 'rope2'",
        ):
            describe("cs336-tiny, pos=rope2")


def test_describe_builds_at_most_two_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """`describe "tinystories, num_layers=1000000"` answers without building a million layers:
    layers are identical, so two are built to check the declarations against."""
    import lmcore.describe

    built: list[int] = []
    real = lmcore.describe.build_model

    def recording(bp, *args, **kwargs):  # type: ignore[no-untyped-def]
        built.append(bp.spec.num_layers)
        return real(bp, *args, **kwargs)

    monkeypatch.setattr(lmcore.describe, "build_model", recording)
    found = describe("tinystories, num_layers=1000000")
    assert built == [2]
    assert (
        found.accounting.params
        == 10_000 * 512 * 2 + 1_000_000 * (4 * 512**2 + 3 * 512 * 1344 + 2 * 512) + 512
    )
    assert found.memory.buffers == 8 * 256 * 16  # RoPE's two (256, 16) float32 tables, once
    small = describe("tinystories")
    assert small.memory.buffers == found.memory.buffers


# ------------------------------------------------------------------------------ training options


def test_the_activations_of_micro_batches_are_one_micro_batchs() -> None:
    whole = describe("tinystories", batch=4).memory
    micro = describe("tinystories", batch=4, micro_batch=2).memory
    assert micro.activations == describe("tinystories", batch=2).memory.activations
    assert micro.activations is not None and whole.activations is not None
    assert micro.activations < whole.activations and micro.micro_batch == 2
    assert (micro.weights, micro.gradients, micro.optimizer) == (
        whole.weights, whole.gradients, whole.optimizer)  # fmt: skip
    assert micro.total == whole.total - whole.activations + micro.activations
    with raises_naming(LmcoreError, "--micro-batch 3", "--batch 4"):
        describe("tinystories", batch=4, micro_batch=3)


@pytest.mark.parametrize("recompute", ["layers", "mixer,ffn", "ffn"])
def test_recompute_keeps_each_parts_input_and_the_largest_parts_activations(
    recompute: str,
) -> None:
    spec, seq = "tinystories", 256
    mem = describe(spec, batch=2, seq_len=seq, recompute=recompute).memory
    acc = account(spec, batch=2, seq_len=seq)
    layers = acc.spec.num_layers
    each = {
        part: sum(r.activations_each or 0 for r in acc.rows
                  if r.name.startswith("layers.*" + suffix))
        for part, suffix in (("layers", "."), ("mixer", ".attn"), ("ffn", ".ffn"))
    }  # fmt: skip
    names = recompute.split(",")
    recomputed = [each[n] for n in names]
    layer_input = 2 * seq * acc.spec.d_model * 4  # batch × seq × d_model, float32
    saved = acc.activations
    assert saved is not None and mem.activations_saved == saved
    want = saved - layers * sum(recomputed) + layers * len(names) * layer_input + max(recomputed)
    assert mem.activations == want and mem.recompute == recompute
    assert mem.total == mem.weights + mem.gradients + mem.optimizer + mem.buffers + want
    assert want < saved


def test_recompute_of_a_hybrids_attention_layers_only() -> None:
    spec = "tinystories, mixer[1]=mamba2(d_state=16)"
    acc = account(spec, batch=1, seq_len=256)
    saved = acc.declared_activations()
    got = recomputed_activations(acc, saved, "layers:mamba2")
    layer1 = sum(n for name, n in saved.items() if name.startswith("layers[1]."))
    assert layer1 > 0
    assert got == sum(saved.values()) - layer1 + 256 * acc.spec.d_model * 4 + layer1
    with raises_naming(RecomputeError, "no layer's mixer is 'mla'", "attention, mamba2"):
        recomputed_activations(acc, saved, "mixer:mla")
