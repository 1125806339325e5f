"""lmcore against llama.cpp on the same GGUF file: prefill and decode speed, peak memory, tokens.

    pip install llama-cpp-python          # builds llama.cpp from source: ~20+ min on 2 cores
    lmcore convert --from-gguf SmolLM2-135M-Instruct.Q4_1.gguf smol.safetensors
    lmcore convert --to-gguf smol.safetensors smol-f32.gguf
    python benchmarks/llamacpp.py smol-f32.gguf [MORE.gguf ...] [--threads 2]
                                  [--prompts 16 512] [--new 64] [--rounds 3]
    python benchmarks/llamacpp.py --quantize smol-f32.gguf --precision Q8_0 Q4_0 --out DIR
                                  [--int8] [--compile]

Each GGUF file is one precision (its rows are labelled by the file's type: F32, F16, Q8_0,
Q4_0, ...; `--precision` with `--quantize` writes the quantized files from an F32 one with
llama.cpp's own quantizer, `llama_cpp.llama_model_quantize`, so the peer runs its own format;
for Q8_0, Q4_0 and Q4_1 its `token_embedding_type` is Q8_0 and its `output_tensor_type` the
matrices' type, where its defaults would write Q6_K, which lmcore does not keep quantized).
lmcore loads a Q8_0, Q4_0 or Q4_1 file kept quantized (`load_gguf(keep_quantized=True)`), others
dequantized. llama.cpp loads without its extra weight buffers (AMX, repacked blocks:
`use_extra_bufts=False`); with them llama-cpp-python 0.3.36 crashes on batched quantized decode.
For every file and prompt length, lmcore (`lmcore.gguf.load_gguf`, `model.stream`, greedy) and
llama.cpp (`llama_cpp.Llama`, `eval` and the argmax of its logits) each run in a fresh process,
`--rounds` times, interleaved; the table gives medians. Both are fed the same token ids: those of
lmcore's tokenizer for the text (the Apache-2.0 licence text, cut to the prompt length), which
the llama.cpp worker checks against its own tokenization of the same text. Prefill tokens/s is
the prompt's length over the time to the first new token; decode tokens/s is the remaining
`new - 1` tokens over their time. Peak memory is the process's VmHWM (resident high-water mark:
model, cache, interpreter; llama.cpp maps the file, its pages counted once touched). The first 32
greedy tokens (of the shortest prompt) are compared: equal for F32/F16 files, agreement reported
for quantized ones.

`--compile` adds lmcore with its decoding compiled (`lmcore.model.generate.compile_decoding`:
each layer compiled by inductor with its C++ wrapper, as `lmcore chat --compile` runs it), in a
row of its own against the same llama.cpp runs: the worker first runs the same request once,
untimed, which compiles the prompt's graph and the step's (its seconds are printed).

Perplexity: each engine's mean negative log-likelihood of the first `--ppl-tokens` (1024) ids
of `--ppl-text` (Python's LICENSE.txt), lmcore in one forward, llama.cpp one token an `eval`.

The bound: weights read per token (every tensor of the file once, the tied embedding/head
counted once as the head; the embedding of an untied model is one row, not counted) over the
rate of a plain read of a 1 GiB float32 tensor (`torch.sum`, best of 5, the same threads).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LICENSE = Path("/usr/share/common-licenses/Apache-2.0")
INSTALL = (
    "llama-cpp-python is not installed: pip install llama-cpp-python (it builds llama.cpp from "
    "source, ~20+ min on 2 cores; a wheel built once installs with pip install --no-deps "
    "llama_cpp_python-*.whl)"
)
COMPARED = 32  # greedy tokens compared between the two
# llama.cpp's file types (llama_ftype) that --quantize writes
FTYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7}
# the block formats lmcore keeps quantized (`load_gguf(keep_quantized=True)`), as ggml_type
KEPT = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
EMBEDDING_TYPE = KEPT["Q8_0"]  # llama.cpp's default for the embedding/head is Q6_K: not kept
PPL_TEXT = Path(sys.base_prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}",
                "LICENSE.txt")  # fmt: skip
ENGINES = ("lmcore", "llama.cpp")
COMPILED = "lmcore-compiled"  # --compile: lmcore's decoding compiled (compile_decoding)
NLL = {"lmcore": "lmcore-nll", "llama.cpp": "llama.cpp-nll"}  # the perplexity workers


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", type=Path, nargs="*", help="GGUF files, one precision each")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, nargs="+", default=[16, 512])
    parser.add_argument("--new", type=int, default=64, help="new tokens per run (>= 32)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--text", type=Path, default=LICENSE, help="the prompt's source text")
    parser.add_argument("--quantize", type=Path, help="an F32 GGUF file to quantize")
    parser.add_argument("--precision", nargs="+", default=[], choices=sorted(FTYPES))
    parser.add_argument("--out", type=Path, default=Path("."), help="for --quantize's files")
    parser.add_argument("--int8", action="store_true",
                        help="also lmcore's int8 (per-row scales, from --quantize's F32 file) "
                        "against llama.cpp's Q8_0 file")  # fmt: skip
    parser.add_argument("--compile", action="store_true",
                        help="also lmcore with its decoding compiled (lmcore.model.generate."
                        "compile_decoding): one untimed generation first compiles it")  # fmt: skip
    parser.add_argument("--ppl-text", type=Path, default=PPL_TEXT, help="perplexity's text")
    parser.add_argument("--ppl-tokens", type=int, default=1024, help="its first tokens, 0: none")
    parser.add_argument("--bound-mib", type=int, default=1024, help="the read timed for the bound")
    parser.add_argument("--worker", choices=[*ENGINES, COMPILED, *NLL.values(), "bound"],
                        help=argparse.SUPPRESS)  # fmt: skip
    parser.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is None:
        if args.quantize is None and not args.files:
            parser.error("give GGUF files to compare, or --quantize F32.gguf --precision ...")
        if args.quantize is not None and not args.precision:
            parser.error(f"--quantize needs --precision, one or more of {sorted(FTYPES)}")
        if args.int8 and (args.quantize is None or "Q8_0" not in args.precision):
            parser.error("--int8 needs --quantize F32.gguf --precision Q8_0 ... (lmcore's int8 "
                         "is made from the F32 file, llama.cpp runs its Q8_0)")  # fmt: skip
        if args.new < COMPARED:
            parser.error(f"--new {args.new}: at least {COMPARED}, the tokens compared")
        if args.threads < 1 or args.rounds < 1 or min(args.prompts) < 1:
            parser.error("--threads, --rounds and every --prompts length must be >= 1")
    return args


# ----------------------------------------------------------------------------- the file


def precision(path: Path) -> str:
    """The file's type as llama.cpp names it (`general.file_type`), else the type of most of
    its tensor bytes."""
    from gguf import GGUFReader, LlamaFileType

    reader = GGUFReader(path)
    field = reader.get_field("general.file_type")
    if field is not None:
        name = LlamaFileType(int(field.parts[-1][0])).name  # e.g. MOSTLY_Q8_0, ALL_F32
        return name.removeprefix("MOSTLY_").removeprefix("ALL_")
    by_type: dict[str, int] = {}
    for t in reader.tensors:
        by_type[t.tensor_type.name] = by_type.get(t.tensor_type.name, 0) + int(t.n_bytes)
    return max(by_type, key=by_type.__getitem__)


def bytes_per_token(path: Path) -> int:
    """Weights a decoded token reads: every tensor once, except the token embedding of a model
    with its own output matrix (one row of it is read). A tied model reads token_embd as the
    head: once."""
    from gguf import GGUFReader

    sizes = {t.name: int(t.n_bytes) for t in GGUFReader(path).tensors}
    if "output.weight" in sizes:
        sizes.pop("token_embd.weight", None)
    return sum(sizes.values())


def quantize(source: Path, kinds: Sequence[str], out: Path) -> list[Path]:
    """`source` (F32) written as each of `kinds` by llama.cpp's own quantizer."""
    import llama_cpp

    out.mkdir(parents=True, exist_ok=True)
    made = []
    for kind in kinds:
        target = out / f"{source.stem.removesuffix('-f32')}-{kind.lower()}.gguf"
        if target.resolve() == source.resolve():  # the quantizer would truncate its own input
            raise SystemExit(
                f"--precision {kind} would write {target}, the file being quantized: give that "
                "file as it is (a positional GGUF file), or --out another directory"
            )
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = FTYPES[kind]
        if kind in KEPT:  # a file lmcore keeps quantized: matrices one type, embedding Q8_0
            params.token_embedding_type = EMBEDDING_TYPE
            params.output_tensor_type = KEPT[kind]
        params.nthread = os.cpu_count() or 1
        rc = llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), params)
        if rc != 0:
            raise SystemExit(f"llama_model_quantize to {kind} failed (rc {rc})")
        made.append(target)
        print(f"wrote {target} ({target.stat().st_size / 2**20:,.1f} MiB, {kind})")
    return made


INT8 = "int8(embedding=q8_0)"  # the tied embedding/head as Q8_0 blocks, as llama.cpp's file


def int8_checkpoint(source: Path, out: Path) -> Path:
    """lmcore's int8 of the F32 file `source` (`lmcore.quantizing.quantize_model`, `INT8`),
    saved once in `out`: the worker loads it as a user would load `lmcore quantize`'s file."""
    from lmcore.gguf import load_gguf
    from lmcore.quantizing import quantize_model

    target = out / f"{source.stem.removesuffix('-f32')}-int8.safetensors"
    quantize_model(load_gguf(source), INT8).save(target)
    print(f"wrote {target} ({target.stat().st_size / 2**20:,.1f} MiB, lmcore {INT8})")
    return target


def checkpoint_bytes(path: Path) -> int:
    """Weights a decoded token reads from an lmcore checkpoint: every tensor once (the tied
    head is the embedding's), as its safetensors header lays them out."""
    from lmcore.model.reading import read_header

    spans = (t.offsets for t in read_header(path).tensors.values())
    return sum(stop - start for start, stop in spans)


# ----------------------------------------------------------------------------- workers


def vm_kib(field: str) -> int:
    """This process's `field` of /proc/self/status (VmHWM: the resident high-water mark;
    VmRSS: the resident set now), KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def lmcore_worker(job: dict[str, Any], compiled: bool = False) -> dict[str, Any]:
    """lmcore's greedy generation, timed; `compiled`: through `compile_decoding`, after one
    untimed generation of the same request that compiles it (its seconds in `compile_s`)."""
    import torch

    from lmcore.model.generate import GREEDY, compile_decoding

    torch.set_num_threads(job["threads"])
    base = vm_kib("VmRSS")
    start = time.perf_counter()
    model = _lmcore_model(job)
    loaded = time.perf_counter() - start
    ids = torch.tensor(job["ids"])
    compile_s = None
    if compiled:
        start = time.perf_counter()
        model = compile_decoding(model)
        list(model.stream(ids, job["new"], GREEDY))  # the prompt's graph, then the step's
        compile_s = time.perf_counter() - start
    times, tokens = [], []
    t0 = time.perf_counter()
    for tok in model.stream(ids, job["new"], GREEDY):  # prefill, then one token a step
        times.append(time.perf_counter())
        tokens.append(int(tok))
    return {**_result(job, t0, times, tokens, loaded, None, base), "compile_s": compile_s}


def _lmcore_model(job: dict[str, Any]) -> Any:
    """The GGUF file (kept quantized where it can be), or `job["checkpoint"]`: an lmcore
    checkpoint made from it (`--int8`)."""
    import lmcore
    from lmcore.gguf import load_gguf

    if job.get("checkpoint"):
        model = lmcore.load(job["checkpoint"])
    else:
        model = load_gguf(job["file"], keep_quantized=job["keep_quantized"])
    return model.eval()


def _no_extra_buffers() -> None:
    """llama.cpp loads without its extra weight buffers (AMX int8, repacked blocks): with them,
    llama-cpp-python 0.3.36 crashes (SIGSEGV in `llama_decode`) on any batch of 2+ tokens of a
    Q8_0 or Q4_0 file on this project's AMX-reporting VM. `Llama` takes no such argument, so
    the default parameters it starts from are changed."""
    import llama_cpp
    import llama_cpp.llama

    default = llama_cpp.llama_model_default_params

    def params() -> Any:
        p = default()
        p.use_extra_bufts = False
        return p

    llama_cpp.llama.llama_cpp.llama_model_default_params = params  # type: ignore[attr-defined]


def llamacpp_worker(job: dict[str, Any]) -> dict[str, Any]:
    import llama_cpp
    import numpy as np

    _no_extra_buffers()
    base = vm_kib("VmRSS")
    start = time.perf_counter()
    llm = llama_cpp.Llama(
        job["file"], n_ctx=len(job["ids"]) + job["new"] + 8, n_batch=512, n_ubatch=512,
        n_threads=job["threads"], n_threads_batch=job["threads"], verbose=False,
    )  # fmt: skip
    loaded = time.perf_counter() - start
    own = llm.tokenize(job["text"].encode(), add_bos=False, special=False)
    same = own[: len(job["full"])] == job["full"]
    vocab = llm.n_vocab()

    def argmax() -> int:
        logits = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        return int(np.ctypeslib.as_array(logits, shape=(vocab,)).argmax())

    times, tokens = [], []
    t0 = time.perf_counter()
    llm.eval(job["ids"])
    for step in range(job["new"]):
        tok = argmax()
        times.append(time.perf_counter())
        tokens.append(tok)
        if step + 1 < job["new"]:  # the last token is never fed back, as lmcore's
            llm.eval([tok])
    return _result(job, t0, times, tokens, loaded, same, base)


def lmcore_nll(job: dict[str, Any]) -> dict[str, Any]:
    """lmcore's mean negative log-likelihood of `ids[1:]`, one forward over all of them."""
    import torch

    torch.set_num_threads(job["threads"])
    model = _lmcore_model(job)
    ids = torch.tensor(job["ids"])
    with torch.no_grad():
        logits = model(ids[None])[0, :-1].double()
    nll = logits.logsumexp(-1) - logits.gather(-1, ids[1:, None])[:, 0]
    return {"nll": float(nll.mean())}


def llamacpp_nll(job: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's, one token an `eval` (its decode path, as lmcore's mean is over one
    forward: both exact, the two differ in rounding only), from the last position's logits."""
    import llama_cpp
    import numpy as np

    _no_extra_buffers()
    llm = llama_cpp.Llama(
        job["file"], n_ctx=len(job["ids"]) + 8, n_batch=512, n_ubatch=512,
        n_threads=job["threads"], n_threads_batch=job["threads"], verbose=False,
    )  # fmt: skip
    vocab, ids, total = llm.n_vocab(), job["ids"], 0.0
    for i in range(len(ids) - 1):
        llm.eval([ids[i]])
        raw = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        logits = np.ctypeslib.as_array(raw, shape=(vocab,)).astype(np.float64)
        top = logits.max()
        total += top + math.log(np.exp(logits - top).sum()) - logits[ids[i + 1]]
    return {"nll": total / (len(ids) - 1)}


def _result(
    job: dict[str, Any], t0: float, times: list[float], tokens: list[int], loaded: float,
    same: bool | None, base_kib: int,
) -> dict[str, Any]:  # fmt: skip
    peak = vm_kib("VmHWM")
    return {
        "prefill": len(job["ids"]) / (times[0] - t0),
        "decode": (len(times) - 1) / (times[-1] - times[0]),
        "tokens": tokens,
        "peak_kib": peak,
        "model_kib": peak - base_kib,
        "load_s": loaded,
        "tokenized_same": same,
    }


def bound_worker(job: dict[str, Any]) -> dict[str, Any]:
    """GB/s of a plain read of a `mib` MiB float32 tensor (1 GiB: far beyond any cache), best
    of 5."""
    import torch

    torch.set_num_threads(job["threads"])
    x = torch.ones(job["mib"] * 2**18)
    x.sum()
    best = min(_timed(x.sum) for _ in range(5))
    return {"gbps": x.nbytes / best / 1e9}


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run_worker(engine: str, job: dict[str, Any]) -> dict[str, Any]:
    """`job` run by `engine` in a fresh process of this script."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    try:
        out = subprocess.run(
            # -X faulthandler: a worker killed by a signal still says where it was
            [sys.executable, "-X", "faulthandler", __file__, "--worker", engine, "--job", f.name],
            capture_output=True, text=True,
        )  # fmt: skip
    finally:
        os.unlink(f.name)
    if out.returncode != 0:
        what = f"{engine} on {Path(job.get('checkpoint') or job.get('file') or '-').name}"
        raise SystemExit(f"the {what} worker failed (rc {out.returncode}):\n{out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


# ----------------------------------------------------------------------------- the table


@dataclass
class Row:
    precision: str
    prompt: int
    runs: dict[str, list[dict[str, Any]]]
    sizes: tuple[int, int]  # the bytes of each engine's file (lmcore's checkpoint for int8)

    def median(self, engine: str, key: str) -> float:
        return statistics.median(r[key] for r in self.runs[engine])

    def agreement(self) -> tuple[int, int | None]:
        """How many of the first COMPARED greedy tokens agree, and the first that differs."""
        a, b = (self.runs[e][0]["tokens"][:COMPARED] for e in ENGINES)
        equal = sum(x == y for x, y in zip(a, b, strict=True))
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
        return equal, first


def table(rows: Sequence[Row], compared: int | None = None) -> list[str]:
    """The markdown table: per precision and prompt length, each engine's medians and lmcore's
    ratio to llama.cpp; the tokens compared on the shortest prompt of each precision."""
    lines = [
        "| precision | prompt | prefill tok/s lmcore | llama.cpp | ratio | decode tok/s lmcore "
        "| llama.cpp | ratio | peak MiB lmcore | llama.cpp | model MiB lmcore (÷ file) | "
        "llama.cpp (÷ file) | first 32 tokens |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| --- |",
    ]
    shortest = {r.precision: min(x.prompt for x in rows if x.precision == r.precision)
                for r in rows}  # fmt: skip
    for r in rows:
        p = [r.median(e, "prefill") for e in ENGINES]
        d = [r.median(e, "decode") for e in ENGINES]
        m = [r.median(e, "peak_kib") / 1024 for e in ENGINES]
        own = [r.median(e, "model_kib") * 1024 for e in ENGINES]
        fits = [f"{b / 2**20:,.0f} ({b / size:.2f}×)"
                for b, size in zip(own, r.sizes, strict=True)]  # fmt: skip
        agree = ""
        if r.prompt == shortest[r.precision]:
            equal, first = r.agreement()
            agree = "equal" if first is None else f"{equal}/{COMPARED}, first differs at {first}"
        lines.append(
            f"| {r.precision} | {r.prompt} | {p[0]:,.1f} | {p[1]:,.1f} | {p[0] / p[1]:.2f}× "
            f"| {d[0]:,.1f} | {d[1]:,.1f} | {d[0] / d[1]:.2f}× | {m[0]:,.0f} | {m[1]:,.0f} "
            f"| {fits[0]} | {fits[1]} | {agree} |"
        )
    return lines


def prompt_ids(path: Path, text: str) -> list[int]:
    """lmcore's tokenization of `text` with the file's tokenizer (no special tokens)."""
    from lmcore.gguf import load_gguf

    tok = load_gguf(path).tokenizer.tokenizer()  # type: ignore[union-attr]
    ids: list[int] = tok.encode(text, add_special_tokens=False).ids
    return ids


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker is not None:
        job = json.loads(args.job.read_text())
        fn = {"lmcore": lmcore_worker, "llama.cpp": llamacpp_worker, "bound": bound_worker,
              COMPILED: lambda job: lmcore_worker(job, compiled=True),
              NLL["lmcore"]: lmcore_nll, NLL["llama.cpp"]: llamacpp_nll}  # fmt: skip
        print(json.dumps(fn[args.worker](job)))
        return
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise SystemExit(INSTALL) from None
    if args.quantize is not None:
        args.files = [*args.files, *quantize(args.quantize, args.precision, args.out)]
        if not args.files:
            return
    text = args.text.read_text()
    rows, nll = [], {}
    runs_of = [(path, precision(path), None) for path in args.files]
    if args.int8:
        q8 = next(p for p, kind, _ in runs_of if kind == "Q8_0")
        runs_of.append((q8, "int8 / Q8_0", int8_checkpoint(args.quantize, args.out)))
    for path, kind, checkpoint in runs_of:
        full = prompt_ids(path, text)
        if len(full) < max(args.prompts):
            raise SystemExit(f"{args.text} gives {len(full)} tokens, fewer than {max(args.prompts)}")
        kept = kind in KEPT
        sizes = ((checkpoint or path).stat().st_size, path.stat().st_size)
        own = {"keep_quantized": kept, "checkpoint": str(checkpoint) if checkpoint else None}
        if args.ppl_tokens:
            ppl_ids = prompt_ids(path, args.ppl_text.read_text())[: args.ppl_tokens]
            job = {"file": str(path), "ids": ppl_ids, "threads": args.threads, **own}
            nll[kind] = {e: run_worker(NLL[e], job)["nll"] for e in ENGINES}
        for length in args.prompts:
            job = {"file": str(path), "ids": full[:length], "full": full, "text": text,
                   "new": args.new, "threads": args.threads, **own}  # fmt: skip
            engines = (*ENGINES, COMPILED) if args.compile else ENGINES
            runs: dict[str, list[dict[str, Any]]] = {e: [] for e in engines}
            for _ in range(args.rounds):  # interleaved: load falls on all alike
                for engine in engines:
                    runs[engine].append(run_worker(engine, job))
            rows.append(Row(kind, length, {e: runs[e] for e in ENGINES}, sizes))
            if args.compile:  # a row of its own, against the same llama.cpp runs
                compiled = {"lmcore": runs[COMPILED], "llama.cpp": runs["llama.cpp"]}
                rows.append(Row(f"{kind}, compiled", length, compiled, sizes))
            if not all(r["tokenized_same"] for r in runs["llama.cpp"]):
                print(f"note: llama.cpp tokenizes {args.text} differently from lmcore ({path})")
    bound = run_worker("bound", {"threads": args.threads, "mib": args.bound_mib})["gbps"]
    print("\n".join(table(rows)))
    for kind, by in nll.items():
        ppl = {e: math.exp(v) for e, v in by.items()}
        print(f"perplexity {kind} ({args.ppl_tokens} tokens of {args.ppl_text}): lmcore "
              f"{ppl['lmcore']:.4f}, llama.cpp {ppl['llama.cpp']:.4f}, "
              f"{ppl['lmcore'] / ppl['llama.cpp'] - 1:+.2%}")  # fmt: skip
    print(f"\nmemory read: {bound:.1f} GB/s ({args.threads} threads, torch.sum of "
          f"{args.bound_mib} MiB)")  # fmt: skip
    for path, kind, checkpoint in runs_of:
        per = checkpoint_bytes(checkpoint) if checkpoint else bytes_per_token(path)
        for label in (kind, f"{kind}, compiled") if args.compile else (kind,):
            decode = [r.median("lmcore", "decode") for r in rows if r.precision == label]
            print(
                f"{label}: {per / 1e6:,.1f} MB of weights a token (lmcore's), bound "
                f"{bound * 1e9 / per:,.1f} tokens/s; lmcore decodes at "
                f"{decode[0] / (bound * 1e9 / per):.2f} of it (prompt {min(args.prompts)})"
            )
        if args.compile:
            seconds = [r.median("lmcore", "compile_s") for r in rows
                       if r.precision == f"{kind}, compiled"]  # fmt: skip
            took = ", ".join(f"{t:.1f}" for t in seconds)
            print(f"{kind}, compiled: compile_decoding and its first generation took {took} s "
                  f"(prompts {', '.join(map(str, args.prompts))}; inductor's cache on disk as "
                  "the earlier runs left it)")  # fmt: skip


if __name__ == "__main__":
    main()
