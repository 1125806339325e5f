"""`lmcore describe`: the table, the totals, --json, a checkpoint's spec and provenance, and its
errors; metadata never reaches the terminal raw."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import lmcore
from lmcore import Component, parse_spec, scoped_registry
from lmcore.cli.main import main
from lmcore.describe import activation_bytes
from lmcore.model.transformer import build_model
from tests.helpers.runs import CHECKPOINT_SPEC, PROBE_SPEC, mib

ROWS = [
    "token_embeddings",
    "pos",
    "layers.*.ln1",
    "layers.*.attn.q_proj",
    "layers.*.attn.k_proj",
    "layers.*.attn.v_proj",
    "layers.*.attn.output_proj",
    "layers.*.attn.kernel",
    "layers.*.ln2",
    "layers.*.ffn",
    "ln_final",
    "lm_head",
]


def describe_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["describe", *argv, "--json"]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_text_output_for_the_cs336_test_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["describe", "cs336-tiny"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"spec: {parse_spec('cs336-tiny')}"
    assert lines[1] == "input: batch 1 × seq 16 tokens, float32"
    rows = {line.split()[0]: line.split()[1:] for line in lines[3:19] if line}
    # per layer: 3·64·128 SwiGLU parameters; 6·16·64·128 FLOPs; shares of 1,403,328 / 24,608,768
    assert rows["layers.*.ffn"] == ["ffn=swiglu", "3", "73,728", "5.3%", "2,359,296", "9.6%"]
    assert rows["layers.*.attn.kernel"] == ["attn=sdpa", "3", "0", "0.0%", "196,608", "0.8%"]
    assert rows["lm_head"] == [
        "linear",
        "64->10000",
        "1",
        "640,000",
        "45.6%",
        "20,480,000",
        "83.2%",
    ]
    assert rows["per"] == ["layer", "41,088", "1,376,256"]
    assert rows["total"] == ["1,403,328", "100.0%", "24,608,768", "100.0%"]
    text = "\n".join(lines)
    assert "forward FLOPs by part (total 24.6 MFLOPs):" in text
    assert "  lm_head                  20.5 MFLOPs   83.2%" in text
    assert "weights: 5.35 MiB (1,403,328 parameters × 4 bytes, float32)" in text
    assert "  AdamW moments   10.71 MiB  two float32 moments per parameter" in text


def test_parameters_by_role_in_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    # cs336-tiny: 3 layers of 4·64² attention + 3·64·128 SwiGLU matrices; 10,000×64 embedding
    # and head; 2 gains per layer and the final one.
    assert main(["describe", "cs336-tiny"]) == 0
    text = capsys.readouterr().out
    block = text.split("parameters by role:\n")[1].split("\n\n")[0].splitlines()
    assert block == [
        "  matrix             122,880    8.8%  21 tensors",
        "  embedding          640,000   45.6%  1 tensor",
        "  head               640,000   45.6%  1 tensor",
        "  gain                   448    0.0%  7 tensors",
    ]
    assert 3 * (4 * 64 * 64 + 3 * 64 * 128) == 122_880
    found = describe_json(capsys, "cs336-tiny, mixer=mamba2, num_layers=5")
    roles = found["roles"]
    assert sum(r["params"] for r in roles.values()) == found["total"]["params"]
    assert roles["packed"]["tensors"] == 5  # one in_proj per layer, from a two-layer probe
    assert roles["scalar"]["tensors"] == 15  # dt_bias, A_log and D
    assert list(roles) == ["matrix", "packed", "embedding", "head", "gain", "bias", "scalar",
                           "conv"]  # fmt: skip


def test_gpt2_xl_reports_cs336s_parameter_and_flop_counts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["describe", "gpt2-xl"]) == 0
    out = capsys.readouterr().out
    total = next(line for line in out.splitlines() if line.startswith("total"))
    assert total.split() == ["total", "2,127,057,600", "100.0%", "4,513,336,524,800", "100.0%"]
    assert "forward FLOPs by part (total 4.51 TFLOPs):" in out
    assert "weights: 7.92 GiB (2,127,057,600 parameters × 4 bytes, float32)" in out


def test_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    found = describe_json(capsys, "cs336-tiny", "--batch", "2", "--seq", "8", "--dtype", "bfloat16")
    assert set(found) == {
        "spec", "batch", "seq_len", "dtype", "rows", "per_layer", "layers", "total", "flops_by_part", "roles",
        "memory", "activations_by_part", "mismatches", "decoding_state",
    }  # fmt: skip
    # keys and values, 4 heads of 16 in bfloat16 per token, in each of 3 layers, at context 16
    assert found["decoding_state"] == {
        "layers": [{"layers": "*", "count": 3, "per_token": 2 * 4 * 16 * 2, "per_sequence": 0}],
        "at_context_length": 3 * 256 * 16,
    }
    [every] = found["layers"]  # every layer alike: one kind, written *
    assert (every["layers"], every["count"], every["values"]) == ("*", 3, {})
    assert (every["params"], every["flops"]) == (
        found["per_layer"]["params"],
        found["per_layer"]["flops"],
    )
    assert (found["batch"], found["seq_len"], found["dtype"]) == (2, 8, "bfloat16")
    assert [r["name"] for r in found["rows"]] == ROWS
    assert set(found["rows"][0]) == {
        "name", "part", "module", "count", "params_each", "params", "params_share",
        "flops_each", "flops", "flops_share", "activations_declared",
    }  # fmt: skip
    layer = 8 * 8 * 64**2 + 4 * 8**2 * 64 + 6 * 8 * 64 * 128  # S=8, d=64, d_ff=128
    flops = 2 * (3 * layer + 2 * 8 * 64 * 10_000)
    assert found["total"] == {"params": 1_403_328, "active_params": 1_403_328, "flops": flops,
                              "flops_per_token": flops / 16}  # fmt: skip
    assert sum(r["params"] for r in found["rows"]) == found["total"]["params"]
    assert sum(r["flops_share"] for r in found["rows"]) == pytest.approx(1.0)
    assert list(found["flops_by_part"]) == [
        "embeddings", "norms", "attention projections", "attention kernel", "ffn", "lm_head",
    ]  # fmt: skip
    memory = found["memory"]
    assert memory["weights"] == memory["gradients"] == 2 * 1_403_328  # bfloat16
    assert memory["optimizer"] == 8 * 1_403_328
    # Declared, and equal to what a forward on the meta device keeps (measured independently).
    meta = build_model("cs336-tiny", device="meta", dtype=torch.bfloat16)
    assert memory["activations"] == activation_bytes(meta, 2, 8)
    assert (memory["activations_source"], memory["note"], found["mismatches"]) == (
        "declared",
        "",
        [],
    )
    assert (
        sum(r["activations_declared"] for r in found["rows"]) + found["activations_by_part"]["loss"]
        == memory["activations"]
    )
    assert sum(found["activations_by_part"].values()) == memory["activations"]
    parts = ("weights", "gradients", "optimizer", "buffers", "activations")
    assert memory["total"] == sum(memory[k] for k in parts)


def test_a_wider_ffn_changes_only_the_ffn_rows(capsys: pytest.CaptureFixture[str]) -> None:
    base = describe_json(capsys, "tinystories")
    wide = describe_json(capsys, "tinystories, ffn=swiglu(d_ff=2048)")
    absolute = (
        "name", "module", "count", "params_each", "params", "flops_each", "flops",
        "activations_declared",
    )  # fmt: skip
    differ = [
        a["name"]
        for a, b in zip(base["rows"], wide["rows"], strict=True)
        if [a[k] for k in absolute] != [b[k] for k in absolute]
    ]
    assert differ == ["layers.*.ffn"]
    ffn = next(r for r in wide["rows"] if r["name"] == "layers.*.ffn")
    assert (ffn["params_each"], ffn["flops_each"]) == (3 * 512 * 2048, 6 * 256 * 512 * 2048)


def test_the_attention_kernel_dominates_gpt2_xl_at_16k_context(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def kernel_share(seq: int, d: int = 1600, d_ff: int = 6400, vocab: int = 50257) -> float:
        kernel = 4 * seq * seq * d
        total = 48 * (8 * seq * d * d + kernel + 6 * seq * d * d_ff) + 2 * seq * d * vocab
        return 48 * kernel / total

    short = describe_json(capsys, "gpt2-xl")["flops_by_part"]
    long = describe_json(capsys, "gpt2-xl, context_length=16384")["flops_by_part"]
    assert short["attention kernel"]["share"] == pytest.approx(kernel_share(1024), rel=1e-12)
    assert long["attention kernel"]["share"] == pytest.approx(kernel_share(16384), rel=1e-12)
    assert short["attention kernel"]["share"] < 0.08 < 0.5 < long["attention kernel"]["share"]


def test_spec_errors_exit_2_with_a_caret(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["describe", "tinystories, pos=rop"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(
        "lmcore describe: error: no installed plugin provides pos 'rop' (did you mean 'rope'?)"
    )
    assert err[-2:] == ["  tinystories, pos=rop", "                   ^^^"]


def test_seq_beyond_the_context_exits_2_and_says_how_to_fix_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["describe", "gpt2-small", "--seq", "2048"]) == 2
    assert capsys.readouterr().err == (
        "lmcore describe: error: --seq 2048 exceeds context_length=1024 of this spec; "
        "use --seq 1024 or less, or raise the context in the spec: "
        '"gpt2-small, context_length=2048"\n'
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batch", "0"], "argument --batch: expected a positive integer, got '0'"),
        (["--seq", "many"], "argument --seq: expected a positive integer, got 'many'"),
        (["--dtype", "float64"], "argument --dtype: invalid choice: 'float64'"),
        (["--batch", "4", "--micro-batch", "3"], "--micro-batch 3: must be a divisor of --batch 4"),
        (["--recompute", "layer"], "--recompute 'layer': 'layer' is not a target"),
        (["--recompute", "layers:mamba2"], "--recompute 'layers:mamba2': no layer's mixer is"),
    ],
)
def test_bad_options_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["describe", "cs336-tiny", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lmcore describe: error: {message}") and err.count("\n") == 1, err


def test_console_script_describes_gpt2_xl() -> None:
    script = Path(sys.executable).with_name("lmcore")
    out = subprocess.run(
        [script, "describe", "gpt2-xl", "--json"], capture_output=True, text=True, check=True
    )
    found = json.loads(out.stdout)
    assert found["total"] == {"params": 2_127_057_600, "active_params": 2_127_057_600,
                              "flops": 4_513_336_524_800,
                              "flops_per_token": 4_513_336_524_800 / 1024}  # fmt: skip


def test_activations_text_says_where_they_come_from(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["describe", "cs336-tiny"]) == 0
    declared = capsys.readouterr().out
    assert main(["describe", "cs336-tiny", "--measure"]) == 0
    measured = capsys.readouterr().out
    line = "  activations    827.52 KiB  saved for backward by forward + loss"
    assert f"{line}, declared by the components\n" in declared
    assert f"{line}, measured on the meta device\n" in measured
    # The same bytes by part, either way; the loss's float32 logits (16 × 10,000) dominate.
    by_part = declared[declared.index("activations by part") :]
    assert by_part == measured[measured.index("activations by part") :]
    assert by_part.splitlines()[0] == "activations by part (total 827.52 KiB):"
    # 16 · (4·10,000 + 4 + 8 + 1) + 9: logits, log-partition, targets, the kept mask; the mean's
    assert "  loss                   625.21 KiB   75.6%" in by_part
    assert activation_bytes(build_model("cs336-tiny", device="meta"), 1, 16) == 847_385


def test_describe_runs_no_operator_on_meta_tensors() -> None:
    """torch's first operator on a meta tensor imports its compiler stack (torch._dynamo, about
    a second): describe builds on meta and counts from declarations without one, so it stays
    near the time of `import torch`. --measure runs the forward, which shows the probe works."""
    probe = (
        "import sys; from lmcore.cli.main import main; code = main(sys.argv[1:]); "
        "print(code, 'torch._dynamo' in sys.modules, file=sys.stderr)"
    )

    def run(*argv: str) -> str:
        out = subprocess.run(
            [sys.executable, "-c", probe, "describe", *argv],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return out.stderr.strip()

    assert run("gpt2-xl") == "0 False"
    assert run("gpt2-xl, pos=learned, norm=layernorm, attn=chunked, ffn=geglu") == "0 False"
    assert run("gpt2-small", "--measure") == "0 True"


def test_a_declaration_the_measurement_contradicts_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    class Norm(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)

    wrong = Component(kind="norm", name="wrong", build=Norm, activations=lambda: 0)
    with scoped_registry() as registry:
        registry.add(wrong, name="wrong-norms")
        assert main(["describe", "cs336-tiny, norm=wrong"]) == 0  # declared: nothing to contradict
        capsys.readouterr()
        assert main(["describe", "cs336-tiny, norm=wrong", "--measure"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "lmcore describe: error: declared activations differ from the measurement:"
    assert err[1].startswith("  layers.*.ln1: declared 0 bytes, measured ")


def test_describe_shows_the_embedded_spec_and_provenance(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["describe", str(checkpoint)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        f"checkpoint: {checkpoint} ({mib(checkpoint)}, 30 tensors, float32; lmcore checkpoint format 1, "
        f"written by lmcore {lmcore.__version__} with torch {torch.__version__})"
    )
    version = lmcore.__version__
    assert lines[1:8] == [
        f"  norm   rmsnorm    lmcore-registry {version} (entry point 'rmsnorm', module lmcore_rmsnorm)",
        f"  ffn    swiglu     lmcore-registry {version} (entry point 'swiglu', module lmcore_ffn:swiglu)",
        f"  pos    nope       lmcore-registry {version} (entry point 'nope', module lmcore_nope)",
        f"  attn   sdpa       lmcore-registry {version} (entry point 'sdpa', module lmcore_sdpa)",
        f"  block  prenorm    lmcore-registry {version} (entry point 'prenorm', module lmcore_blocks:prenorm)",
        f"  mixer  attention  lmcore-registry {version} (entry point 'attention', module lmcore_attention)",
        "  checksums: crc32 of each of the 30 tensors, verified on load",
    ]
    assert lines[8] == ""
    assert lines[9] == f"spec: {parse_spec(CHECKPOINT_SPEC)}"
    assert lines[10] == "input: batch 1 × seq 16 tokens, float32"
    assert "total" in "\n".join(lines)


def test_describe_json_has_the_checkpoint(checkpoint: Path, capsys) -> None:
    lmcore.build_model(CHECKPOINT_SPEC).save(checkpoint, metadata={"note": "hello"})
    assert main(["describe", str(checkpoint), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["checkpoint"]["spec"] == data["spec"] == str(parse_spec(CHECKPOINT_SPEC))
    assert data["checkpoint"]["components"]["pos"]["dist"] == "lmcore-registry"
    assert data["checkpoint"]["metadata"] == {"note": "hello"}
    assert data["dtype"] == "float32" and data["total"]["params"] == 1_403_328


def test_describe_uses_the_checkpoints_dtype(checkpoint: Path, capsys) -> None:
    half = lmcore.build_model(CHECKPOINT_SPEC, dtype=torch.bfloat16).save(
        checkpoint.with_name("h.safetensors")
    )
    assert main(["describe", str(half)]) == 0
    assert "input: batch 1 × seq 16 tokens, bfloat16" in capsys.readouterr().out


def test_metadata_strings_never_reach_the_terminal_raw(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The probe: ANSI escapes in metadata reached the terminal; a 10 MB version string printed
    # 30 MB.
    model = lmcore.build_model(PROBE_SPEC)
    path = model.save(tmp_path / "m.safetensors", metadata={"note": "\x1b[31mred\x1b[0m"})
    assert main(["describe", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and r"metadata: note = '\x1b[31mred\x1b[0m'" in out
    from safetensors.torch import load_file, save_file

    header = _metadata(path)
    header["lmcore.lmcore_version"] = "9" * 10_000_000
    save_file(load_file(str(path)), str(path), metadata=header)
    assert main(["describe", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err) < 400 and re.fullmatch(
        rf"lmcore describe: error: {re.escape(str(path))}: has damaged lmcore metadata: "
        r"lmcore.lmcore_version is not a short printable string \('9999.*9999' \(10,000,000 "
        r"characters\)\); the file was edited or damaged after lmcore saved it\n",
        err,
    )


def _metadata(path: Path) -> dict[str, str]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return dict(json.loads(raw[8 : 8 + n])["__metadata__"])


def test_a_trillion_layers_are_described_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    """Identical layers are counted once and multiplied: huge numbers, no MemoryError."""
    import time

    start = time.perf_counter()
    data = describe_json(capsys, "tinystories, num_layers=1000000000000")
    assert time.perf_counter() - start < 2
    per_layer = 4 * 512 * 512 + 3 * 512 * 1344 + 2 * 512
    assert data["per_layer"]["params"] == per_layer
    assert data["total"]["params"] == 10**12 * per_layer + 2 * 10_000 * 512 + 512
    assert "unchecked" not in data


def test_a_canonical_spec_longer_than_a_file_name_is_described(
    capsys: pytest.CaptureFixture[str],
) -> None:
    long = str(parse_spec("vocab_size=300, context_length=32, d_model=32, num_layers=1, "
                          "num_heads=2, ffn=moe(num_experts=4, shared=swiglu)"))  # fmt: skip
    assert len(long) > 255
    assert describe_json(capsys, long)["spec"] == long  # was: File name too long


def test_the_training_estimate_follows_micro_batches_and_recompute(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from lmcore.describe import describe

    args = ["describe", "tinystories", "--batch", "4", "--micro-batch", "2", "--json"]
    assert main([*args, "--recompute", "layers"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    want = describe("tinystories", batch=4, micro_batch=2, recompute="layers").memory
    assert memory["micro_batch"] == 2 and memory["recompute"] == "layers"
    assert memory["activations"] == want.activations and memory["total"] == want.total
    assert memory["activations_saved"] == describe("tinystories", batch=2).memory.activations
    assert main([*args[:-1], "--recompute", "all"]) == 0
    text = capsys.readouterr().out
    assert "batch 4 × seq 256 in micro-batches of 2, --recompute layers):" in text
    assert "each recomputed part's input plus the largest part's saved bytes" in text
    assert ", without recompute):" in text
