"""Decoding speed: lmcore's KV cache against recomputing the whole sequence at every step, and
against Hugging Face `generate` on the same weights (lmcore.hf converts them), in one process.

    python benchmarks/decode.py [--rounds 3] [--new 128] [--prompt 16] [--batch 1 8]
                                [--threads N] [--dtype float32] [--compile] [--profile]

The tinystories shape (vocab 10000, ctx 256, d 512, 4 layers, 16 heads, d_ff 1344), greedy,
a 16-token prompt and 128 new tokens. Each round times every peer once, in turn (interleaved,
so load on a shared machine falls on all of them alike); the table gives the median tokens/s
over the rounds (new tokens × batch / wall time, prompt included) and the ratio to Hugging Face.
Before timing, all peers must produce the same greedy tokens. `--profile` breaks one cached
generation down by operator; `--compile` adds lmcore's cached decoding under torch.compile,
each layer compiled (`compile_decoding`'s default) and the whole step as one graph
(`regional=False`). HF is skipped (with a note) when transformers is not installed. The last
row is a bound, not a decoder: the model's matrix products alone (every Linear once per token,
back to back, as lmcore's `Linear` computes them: `lmcore.model.nn.matmul_t`), what lmcore's
float32 decoding of these weights pays before norms, attention and sampling.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable

import torch

from lmcore import build_model
from lmcore.model.generate import GREEDY, compile_decoding
from lmcore.model.nn import Linear, matmul_t
from lmcore.model.transformer import TransformerLM

Peer = Callable[[torch.Tensor], torch.Tensor]
COMPILED = "lmcore, KV cache, torch.compile (each layer)"
WHOLE = "lmcore, KV cache, torch.compile (whole step)"
BOUND = "matrix products alone (bound)"


def lmcore_peer(model: TransformerLM, new: int, cache: bool) -> Peer:
    return lambda prompt: model.generate(prompt, new, GREEDY, cache=cache)


def matmul_peer(model: TransformerLM, new: int) -> Peer:
    """The bound of lmcore's float32 decoding of these weights: every `Linear` of the model
    (q, k, v, output, w1, w3, w2 per layer, then lm_head) applied to one token's vector per new
    token as `Linear` does (`matmul_t`), back to back, and nothing else (no norm, attention,
    cache or sampling)."""
    weights = [m.weight.detach() for m in model.modules() if isinstance(m, Linear)]

    def run(prompt: torch.Tensor) -> torch.Tensor:
        batch, length = prompt.shape
        widths = {w.shape[1] for w in weights}
        x = {
            (s, n): torch.ones(batch, s, n, dtype=weights[0].dtype)
            for s in (1, length)
            for n in widths
        }
        with torch.inference_mode():
            for seq in (length, *[1] * (new - 1)):  # the prompt once, then one token a step
                for w in weights:
                    matmul_t(x[seq, w.shape[1]], w)
        return prompt.new_zeros(batch, new)

    return run


def compiled_peer(model: TransformerLM, new: int, regional: bool = True) -> Peer:
    """The cached decode step under torch.compile (`lmcore.model.generate.compile_decoding`;
    the model itself stays eager for the other peers)."""
    decoder = compile_decoding(model, regional=regional)
    return lambda prompt: decoder.generate(prompt, new, GREEDY)


def hf_peer(model: TransformerLM, new: int, dtype: torch.dtype) -> tuple[Peer | None, str]:
    try:
        import transformers
        from transformers import LlamaForCausalLM
    except ImportError:
        return None, "transformers is not installed: no Hugging Face peer"
    from lmcore.hf import save_llama

    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as tmp:
        save_llama(model, tmp)
        hf = LlamaForCausalLM.from_pretrained(tmp, dtype=dtype).eval()

    def run(prompt: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            out = hf.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
            )
        return out[:, prompt.shape[1] :]

    return run, f"transformers {transformers.__version__}"


def profile(peer: Peer, prompt: torch.Tensor, new: int) -> None:
    """Where the time of one cached generation goes, by operator, and matmuls against the
    rest."""
    with torch.profiler.profile() as prof:
        peer(prompt)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    matmul = sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "aten::bmm"))
    print(
        f"\nprofile of one cached generation ({new} tokens): {total / 1e3:.1f} ms of operator "
        f"time; matrix products (aten::mm, aten::bmm) {100 * matmul / total:.0f}%, the rest "
        f"(norms, rotation, cache writes, attention softmax, sampling, dispatch) "
        f"{100 * (total - matmul) / total:.0f}%"
    )
    print(events.table(sort_by="self_cpu_time_total", row_limit=12))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new", type=int, default=128, help="new tokens")
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--compile", action="store_true", help="add a torch.compile peer")
    parser.add_argument("--no-recompute", action="store_true", help="skip the slow peer")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = build_model("tinystories", dtype=dtype)
    peers: dict[str, Peer] = {"lmcore, KV cache": lmcore_peer(model, args.new, cache=True)}
    if not args.no_recompute:
        peers["lmcore, recompute each step"] = lmcore_peer(model, args.new, cache=False)
    hf, note = hf_peer(model, args.new, dtype)
    if hf is not None:
        peers["Hugging Face generate"] = hf
    peers[BOUND] = matmul_peer(model, args.new)
    if args.compile:
        peers[COMPILED] = compiled_peer(model, args.new)
        peers[WHOLE] = compiled_peer(model, args.new, regional=False)
    print(
        f"tinystories, {args.dtype}, greedy, prompt {args.prompt}, {args.new} new tokens, "
        f"{args.threads} threads, {args.rounds} interleaved rounds; {note}"
    )
    for batch in args.batch:
        prompt = torch.randint(0, 10000, (batch, args.prompt))
        outs, warm = {}, {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name, peer in peers.items():  # warm-up (and compile), and the check
                start = time.perf_counter()
                outs[name] = peer(prompt)
                warm[name] = time.perf_counter() - start
        first = next(iter(outs.values()))
        same = {name: torch.equal(out, first) for name, out in outs.items() if name != BOUND}
        times: dict[str, list[float]] = {name: [] for name in peers}
        for _ in range(args.rounds):
            for name, peer in peers.items():
                start = time.perf_counter()
                peer(prompt)
                times[name].append(time.perf_counter() - start)
        rate = {n: batch * args.new / statistics.median(t) for n, t in times.items()}
        base = rate.get("Hugging Face generate")
        print(f"\nbatch {batch}\n")
        print("| peer | tokens/s | vs Hugging Face | same tokens |")
        print("| --- | ---: | ---: | --- |")
        for name, r in rate.items():
            ratio = f"{r / base:.2f}×" if base else "n/a"
            agree = "n/a" if name not in same else "yes" if same[name] else "NO"
            print(f"| {name} | {r:,.0f} | {ratio} | {agree} |")
        for name in (COMPILED, WHOLE):
            if name in warm:
                print(f"\n({name}: compiling and the first generation took {warm[name]:.1f} s)")
    if args.profile:
        profile(peers["lmcore, KV cache"], torch.randint(0, 10000, (1, args.prompt)), args.new)


if __name__ == "__main__":
    main()
