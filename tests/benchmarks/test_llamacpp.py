"""benchmarks/llamacpp.py: its arguments, the table, the bytes a token reads (from the file's
tensors, against the model's parameter count), the instruction when llama-cpp-python is missing,
and, with llama.cpp installed, both engines fed the same ids giving the same greedy tokens on a
tiny float32 GGUF (not timed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.gguf import TINY_SHAPES, tiny_gguf
from tests.helpers.runs import load_benchmark

pytest.importorskip("gguf", reason="needs the gguf extra: pip install -e '.[gguf]'")
bench = load_benchmark("llamacpp")
TEXT = "The cat sat on the mat. 12345 the dog ran after the cat, and the mat was red. " * 3


def test_arguments_and_their_refusals(capsys: pytest.CaptureFixture[str]) -> None:
    args = bench.parse_args(["a.gguf", "b.gguf"])
    assert args.files == [Path("a.gguf"), Path("b.gguf")]
    assert (args.threads, args.prompts, args.new, args.rounds) == (2, [16, 512], 64, 3)
    q = bench.parse_args(["--quantize", "f32.gguf", "--precision", "Q8_0", "Q4_0"])
    assert q.precision == ["Q8_0", "Q4_0"] and q.files == []
    for argv, says in (
        ([], "give GGUF files"),
        (["--quantize", "f32.gguf"], "--quantize needs --precision"),
        (["a.gguf", "--new", "8"], "--new 8: at least 32"),
        (["a.gguf", "--threads", "0"], "must be >= 1"),
        (["--quantize", "f.gguf", "--precision", "Q5_9"], "invalid choice: 'Q5_9'"),
        (["--quantize", "f.gguf", "--precision", "Q4_0", "--int8"], "--int8 needs --quantize"),
    ):
        with pytest.raises(SystemExit) as e:
            bench.parse_args(argv)
        assert e.value.code == 2 and says in capsys.readouterr().err


def run(prefill: float, decode: float, peak: int, tokens: list[int]) -> dict[str, object]:
    return {"prefill": prefill, "decode": decode, "peak_kib": peak, "model_kib": peak // 2,
            "tokens": tokens}  # fmt: skip


def test_the_table_gives_medians_ratios_and_the_tokens_compared() -> None:
    same = list(range(40))
    differ = [*range(5), 99, *range(6, 40)]
    rows = [
        bench.Row("F32", 16, {
            "lmcore": [run(100, 8, 1024, same), run(300, 10, 2048, same), run(200, 12, 3072, same)],
            "llama.cpp": [run(400, 20, 512, same), run(400, 20, 512, same), run(400, 20, 512, same)],
        }, (2**20, 2**19)),
        bench.Row("F32", 512, {"lmcore": [run(90, 9, 1024, same)],
                               "llama.cpp": [run(100, 10, 1024, differ)]}, (2**20, 2**20)),
        bench.Row("Q8_0", 16, {"lmcore": [run(50, 5, 1024, same)],
                               "llama.cpp": [run(100, 10, 1024, differ)]}, (2**20, 2**20)),
    ]  # fmt: skip
    lines = bench.table(rows)
    assert len(lines) == 2 + 3
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    # medians: prefill 200 / 400, decode 10 / 20, peak 2 MiB / 0.5 MiB; the model's part of
    # it (half, here) over each engine's file: 1 MiB / 1 MiB, 0.25 MiB / 0.5 MiB
    assert cells[0] == ["F32", "16", "200.0", "400.0", "0.50×", "10.0", "20.0", "0.50×",
                        "2", "0", "1 (1.00×)", "0 (0.50×)", "equal"]  # fmt: skip
    assert cells[1][-1] == ""  # compared on the shortest prompt only
    assert cells[1][4] == "0.90×" and cells[1][7] == "0.90×"
    assert cells[2][-1] == "31/32, first differs at 5"


@pytest.mark.parametrize("tied", [False, True])
def test_bytes_a_token_reads_count_the_tied_head_once(tmp_path: Path, tied: bool) -> None:
    import lmcore
    from lmcore.gguf import save_gguf

    model = lmcore.build_model(
        "vocab_size=300, context_length=64, d_model=32, num_layers=2, num_heads=4, "
        f"num_kv_heads=2, d_ff=64, tie_embeddings={str(tied).lower()}"
    )
    path = tmp_path / "m.gguf"
    save_gguf(model, path)
    params = sum(p.numel() for p in model.parameters())  # a tied matrix once
    if not tied:  # the embedding reads one row a token: not counted
        params -= model.token_embeddings.weight.numel()
    assert bench.bytes_per_token(path) == 4 * params
    assert bench.precision(path) == "F32"


def test_without_llama_cpp_it_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails as if not installed
    with pytest.raises(SystemExit) as e:
        bench.main(["a.gguf"])
    assert "pip install llama-cpp-python" in str(e.value) and "from source" in str(e.value)


def test_both_engines_fed_the_same_ids_give_the_same_greedy_tokens(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp", reason="needs llama-cpp-python: pip install llama-cpp-python")
    # weights scaled up: a random model of std 0.02 has near-equal logits, ties for argmax
    path = tiny_gguf(tmp_path / "t.gguf", tensors={n: lambda x: x * 40 for n in TINY_SHAPES})
    ids = bench.prompt_ids(path, TEXT)
    assert len(ids) > 16
    job = {"file": str(path), "ids": ids[:8], "full": ids, "text": TEXT, "new": 32, "threads": 1,
           "keep_quantized": False}  # fmt: skip
    ours, theirs = bench.lmcore_worker(job), bench.llamacpp_worker(job)
    assert theirs["tokenized_same"] is True  # llama.cpp's own tokens for the text are lmcore's
    assert ours["tokens"] == theirs["tokens"] and len(ours["tokens"]) == 32
    for r in (ours, theirs):
        assert r["prefill"] > 0 and r["decode"] > 0 and r["peak_kib"] > 0
    assert bench.bound_worker({"threads": 1, "mib": 8})["gbps"] > 0


def test_quantize_writes_the_precision_asked_for(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp", reason="needs llama-cpp-python: pip install llama-cpp-python")
    f32 = tiny_gguf(tmp_path / "tiny-f32.gguf")
    (q8,) = bench.quantize(f32, ["Q8_0"], tmp_path / "q")
    assert q8.name == "tiny-q8_0.gguf" and bench.precision(q8) == "Q8_0"
    # 34 bytes a block of 32 for the matrices against 4 a number (a few stay float)
    assert bench.bytes_per_token(q8) < 0.4 * bench.bytes_per_token(f32)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0"])
def test_a_quantized_file_runs_kept_quantized_in_lmcore_and_agrees(
    tmp_path: Path, kind: str
) -> None:
    pytest.importorskip("llama_cpp", reason="needs llama-cpp-python: pip install llama-cpp-python")
    from gguf import GGUFReader

    from lmcore.gguf import load_gguf

    f32 = tiny_gguf(tmp_path / "tiny-f32.gguf", tensors={n: lambda x: x * 40 for n in TINY_SHAPES})
    (path,) = bench.quantize(f32, [kind], tmp_path / "q")
    types = {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}
    # the quantizer's defaults would write the embedding/head as Q6_K, which lmcore refuses
    assert types["token_embd.weight"] == "Q8_0" and types["output.weight"] == kind
    spec = str(load_gguf(path, keep_quantized=True).spec)
    assert f"quant={kind.lower()}" in spec
    ids = bench.prompt_ids(path, TEXT)
    job = {"file": str(path), "ids": ids[:8], "full": ids, "text": TEXT, "new": 32, "threads": 1,
           "keep_quantized": True}  # fmt: skip
    ours, theirs = bench.lmcore_worker(job), bench.llamacpp_worker(job)
    a, b = ours["tokens"], theirs["tokens"]
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
    print(f"{kind}: the first {first} of 32 greedy tokens agree")  # 13 (Q8_0), 10 (Q4_0)
    # llama.cpp rounds activations to 8 bits, lmcore's kernels to bfloat16: a near-tie may
    # split them, after which this random model's continuations are unrelated
    assert len(a) == len(b) == 32 and first >= 8
    nll = {e: fn({**job, "ids": ids[:24]})["nll"]
           for e, fn in (("lmcore", bench.lmcore_nll), ("llama.cpp", bench.llamacpp_nll))}  # fmt: skip
    assert abs(nll["lmcore"] - nll["llama.cpp"]) < 0.05 * nll["llama.cpp"]


def test_int8_is_made_from_the_f32_file_and_read_by_the_lmcore_workers(tmp_path: Path) -> None:
    """`--int8`: lmcore's int8 of the F32 file, saved once, is what the lmcore workers load;
    its bytes a token are its tensors' (the tied head once)."""
    import lmcore

    f32 = tiny_gguf(tmp_path / "tiny-f32.gguf", tensors={n: lambda x: x * 40 for n in TINY_SHAPES})
    ckpt = bench.int8_checkpoint(f32, tmp_path)
    assert ckpt.name == "tiny-int8.safetensors"
    model = lmcore.load(ckpt)
    assert str(model.spec).endswith("quant=int8(embedding=q8_0)")
    held = {id(t): t.numel() * t.element_size() for t in model.state_dict().values()}
    assert bench.checkpoint_bytes(ckpt) == sum(held.values())
    ids = bench.prompt_ids(f32, TEXT)
    job = {"file": str(f32), "ids": ids[:8], "full": ids, "text": TEXT, "new": 32, "threads": 1,
           "keep_quantized": False, "checkpoint": str(ckpt)}  # fmt: skip
    ours = bench.lmcore_worker(job)
    assert len(ours["tokens"]) == 32 and 0 < ours["model_kib"] <= ours["peak_kib"]
    with torch.no_grad():
        want = model(torch.tensor([ids[:24]]))[0, :-1].double()
    nll = (want.logsumexp(-1) - want.gather(-1, torch.tensor(ids[1:24])[:, None])[:, 0]).mean()
    assert bench.lmcore_nll({**job, "ids": ids[:24]})["nll"] == pytest.approx(float(nll))


def test_the_compiled_worker_compiles_first_then_times_the_same_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--compile`: the lmcore worker's decoding through `compile_decoding` (dynamo with the
    eager backend here: the plumbing, not inductor's time), its untimed first generation's
    seconds reported, the tokens those of the eager worker."""
    import lmcore.model.generate as generation

    made = []
    compile_decoding = generation.compile_decoding

    def eager_backend(model: object) -> object:
        made.append(model)
        return compile_decoding(model, backend="eager")  # type: ignore[arg-type]

    monkeypatch.setattr(generation, "compile_decoding", eager_backend)
    path = tiny_gguf(tmp_path / "t.gguf", tensors={n: lambda x: x * 40 for n in TINY_SHAPES})
    ids = bench.prompt_ids(path, TEXT)
    job = {"file": str(path), "ids": ids[:8], "full": ids, "text": TEXT, "new": 32, "threads": 1,
           "keep_quantized": False}  # fmt: skip
    torch.compiler.reset()
    try:
        compiled = bench.lmcore_worker(job, compiled=True)
    finally:
        torch.compiler.reset()
    eager = bench.lmcore_worker(job)
    assert len(made) == 1 and compiled["compile_s"] > 0 and eager["compile_s"] is None
    assert compiled["tokens"] == eager["tokens"] and len(eager["tokens"]) == 32
    with pytest.raises(SystemExit):
        bench.parse_args(["--compile"])  # no files: refused as without it


def test_quantize_refuses_to_write_over_its_own_source(tmp_path: Path) -> None:
    """`--precision F32` of `x-f32.gguf` into its own directory would name the source as the
    target, which llama.cpp's quantizer truncates while reading it (a bus error)."""
    pytest.importorskip("llama_cpp", reason="needs llama-cpp-python: pip install llama-cpp-python")
    f32 = tiny_gguf(tmp_path / "tiny-f32.gguf")
    before = f32.read_bytes()
    with pytest.raises(SystemExit, match="the file being quantized"):
        bench.quantize(f32, ["F32"], tmp_path)
    assert f32.read_bytes() == before
