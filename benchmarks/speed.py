"""lmcore's speed against torch's fused ops and Hugging Face Llama: one command, one process.

    python benchmarks/speed.py [--spec tinystories] [--batch 8] [--rounds 7] [--compile] [--quick]
                               [--threads N] [--clock wall|cpu] [--long 4096 16384 | --no-long]
    python benchmarks/speed.py --profile        # where a training step's time goes, by operator

Throughput: the spec's architecture is built as
  - lmcore from the spec (the built-ins, or whatever components the spec names),
  - lmcore with `attn=chunked`, and with the `lmcore-torch` components when that is installed,
  - the *fused reference*, written here with torch's fused modules (nn.Embedding, nn.Linear /
    F.linear, nn.RMSNorm / F.rms_norm, F.silu, F.scaled_dot_product_attention(is_causal=True),
    RoPE on interleaved pairs as complex products, as Meta's Llama code does),
  - `transformers.LlamaForCausalLM` (sdpa attention) when transformers is installed,
all holding the same weights (lmcore's state dict; for Llama the q/k rows are permuted to its
half-split rotary layout). The script checks that every model's logits agree, then times an
inference forward (`torch.no_grad`) and a training step (forward, cross-entropy, backward,
AdamW step) of each, interleaved: every round runs each model's forward back to back in a
rotating order, then each model's training step, so all see the same machine load. It prints
tokens/s (median of the rounds) and the ratio to the eager fused reference (median of the
per-round ratios, with their quartiles; above 1 means faster than the reference). `--compile`
adds every model again under torch.compile (lmcore through `build_model(..., compile=True)`, the
others through `module.compile()`); compiling happens in the warm-up, before any timing.

On a machine shared with other work, `--threads 1 --clock cpu` gives the steadiest ratios: torch's
threads wait for each other at every operator, and a thread descheduled by another process stalls
them all (lmcore's attention runs many small operators per layer, a fused kernel one), while the
CPU time of a single thread hardly depends on what else runs.

The last row is a bound, not a model: the spec's matrix products alone (every Linear of the
fused reference on the batch's tokens; for the training step, also their two backward products,
with no optimizer step), what any float32 implementation of these weights pays before attention,
norms and the rest. A ratio goal above the bound's cannot be met by any implementation.

Long context: peak memory and time of one training step at batch 1 x `--long` tokens (4,096,
and 16,384 without --quick), the spec's context length raised to fit, for each attention kernel
(`sdpa`, `chunked`, `lmcore-torch`'s `torch_sdpa` when installed) and the fused reference. Each
is measured in two fresh subprocesses. Memory: after a short warm-up step (which allocates
AdamW's state), the peak resident set size is reset (/proc/self/clear_refs) and one step runs;
the table shows how far the peak rose above the resident size before the step (activations,
gradients, temporaries), with MALLOC_MMAP_THRESHOLD_=64 KiB so that freed tensors leave the
resident set at once (on CUDA, --device cuda, torch's peak-allocated counter). Time: the same
step with the default allocator, the kernels taking turns for `--long-rounds` rounds (3; 1 with
--quick and above 8,192 tokens), median time and median per-round ratio. `sdpa` is skipped above
8,192 tokens, where its kept softmax weights alone outgrow a 24 GiB machine.

Never run by the test suite; never asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmcore import ModelSpec, build_model, get_registry, parse_spec
from lmcore.blueprint import Blueprint
from lmcore.errors import ConversionError
from lmcore.hf import spec_to_config, to_hf_state_dict
from lmcore.hf.family import family

MiB = 2**20
TORCH_COMPONENTS = "norm=torch_rmsnorm, ffn=torch_swiglu, attn=torch_sdpa"  # lmcore-torch's


# ----------------------------------------------------------------------------- the peers


def rope_tables(spec: ModelSpec, device: torch.device) -> tuple[Tensor, Tensor]:
    """cos and sin of `pos · theta^(-2k/D)` for every position and pair k: (context, D/2)."""
    hd, theta = spec.head_dim, float(spec.pos.kwargs["theta"])
    inv_freq = theta ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    angles = torch.arange(spec.context_length, dtype=torch.float32)[:, None] * inv_freq
    return angles.cos().to(device), angles.sin().to(device)


def rotate(x: Tensor, freqs: tuple[Tensor, Tensor]) -> Tensor:
    """RoPE on interleaved pairs `(x[2k], x[2k+1])` as complex products (Meta's Llama code);
    in real arithmetic under torch.compile, which generates no code for complex operators."""
    cos, sin = freqs
    if torch.compiler.is_compiling():
        even, odd = x[..., 0::2].float(), x[..., 1::2].float()
        rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), -1)
        return rotated.flatten(-2).type_as(x)
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))  # (B, H, T, D/2)
    return torch.view_as_real(pairs * torch.complex(cos, sin)).flatten(-2).type_as(x)


class ReferenceBlock(nn.Module):
    def __init__(self, spec: ModelSpec, eps: float):
        super().__init__()
        d, kv = spec.d_model, spec.num_kv_heads * spec.head_dim
        self.heads, self.kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.ln1, self.ln2 = nn.RMSNorm(d, eps=eps), nn.RMSNorm(d, eps=eps)
        self.attn = nn.ModuleDict(
            {
                "q_proj": nn.Linear(d, d, bias=False),
                "k_proj": nn.Linear(d, kv, bias=False),
                "v_proj": nn.Linear(d, kv, bias=False),
                "output_proj": nn.Linear(d, d, bias=False),
            }
        )
        self.ffn = nn.ModuleDict(
            {
                "w1": nn.Linear(d, spec.d_ff, bias=False),
                "w2": nn.Linear(spec.d_ff, d, bias=False),
                "w3": nn.Linear(d, spec.d_ff, bias=False),
            }
        )

    def forward(self, x: Tensor, freqs: tuple[Tensor, Tensor]) -> Tensor:
        a, f = self.attn, self.ffn
        h = self.ln1(x)
        q = a["q_proj"](h).unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)
        k = a["k_proj"](h).unflatten(-1, (self.kv_heads, self.head_dim)).transpose(1, 2)
        v = a["v_proj"](h).unflatten(-1, (self.kv_heads, self.head_dim)).transpose(1, 2)
        o = F.scaled_dot_product_attention(
            rotate(q, freqs), rotate(k, freqs), v, is_causal=True,
            enable_gqa=self.kv_heads != self.heads,
        )  # fmt: skip
        x = x + a["output_proj"](o.transpose(1, 2).flatten(-2))
        h = self.ln2(x)
        return x + f["w2"](F.silu(f["w1"](h)) * f["w3"](h))


class FusedReference(nn.Module):
    """The spec's architecture with torch's fused modules; state-dict keys are lmcore's."""

    def __init__(self, spec: ModelSpec, device: torch.device):
        super().__init__()
        eps = float(spec.norm.kwargs.get("eps", 1e-5))
        self.token_embeddings = nn.Embedding(spec.vocab_size, spec.d_model)
        self.layers = nn.ModuleList(ReferenceBlock(spec, eps) for _ in range(spec.num_layers))
        self.ln_final = nn.RMSNorm(spec.d_model, eps=eps)
        self.lm_head = nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        if spec.tie_embeddings:
            self.token_embeddings.weight = self.lm_head.weight
        cos, sin = rope_tables(spec, device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.to(device)

    def forward(self, ids: Tensor) -> Tensor:
        t = ids.shape[-1]
        freqs = (self.cos[:t], self.sin[:t])
        x = self.token_embeddings(ids)
        for layer in self.layers:
            x = layer(x, freqs)
        logits: Tensor = self.lm_head(self.ln_final(x))
        return logits


def llama(bp: Blueprint, state: dict[str, Tensor], device: torch.device) -> nn.Module | str:
    """`LlamaForCausalLM` with lmcore's weights, or why there is none: the config and the
    tensors (q/k rows permuted to Llama's half-split rotary layout) from `lmcore.hf`, the same
    conversion as `lmcore convert --to-hf`."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return "transformers is not installed"
    try:
        config = spec_to_config(bp, torch.float32, family=family("llama"))
    except ConversionError as e:
        return str(e)
    del config["torch_dtype"]  # the benchmark's dtype is the model's
    model = LlamaForCausalLM(LlamaConfig(**config, attn_implementation="sdpa", use_cache=False))
    tensors = to_hf_state_dict(family("llama"), state, bp)
    model.load_state_dict(tensors, strict=not bp.spec.tie_embeddings)
    return model.to(device)


# ----------------------------------------------------------------------------- the runs


@dataclass
class Impl:
    name: str
    model: nn.Module
    logits: Callable[[Tensor], Tensor]
    optimizer: torch.optim.Optimizer = field(init=False)
    forward_s: list[float] = field(default_factory=list)
    train_s: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)

    def forward(self, ids: Tensor) -> None:
        with torch.no_grad():
            self.logits(ids)

    def train_step(self, ids: Tensor, targets: Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        logits = self.logits(ids)
        F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten()).backward()
        self.optimizer.step()


@dataclass
class MatmulBound:
    """Not a model: the matrix products of the spec's Linear layers alone (q, k, v, output, w1,
    w3, w2 per layer and lm_head, for the batch's tokens), what any implementation that keeps
    these weights in float32 pays before attention, norms and the rest. Its training step is
    those products forward and their two backward ones (input and weight gradients), with no
    optimizer step, so it bounds a training step from below by less than the forward's bound."""

    name: str
    weights: list[Tensor]
    forward_s: list[float] = field(default_factory=list)
    train_s: list[float] = field(default_factory=list)
    inputs: dict[tuple[int, int], Tensor] = field(default_factory=dict)

    def _x(self, rows: int, width: int) -> Tensor:
        key = (rows, width)
        if key not in self.inputs:
            self.inputs[key] = torch.ones(rows, width, device=self.weights[0].device)
        return self.inputs[key]

    def forward(self, ids: Tensor) -> None:
        with torch.no_grad():
            for w in self.weights:
                self._x(ids.numel(), w.shape[1]) @ w.T

    def train_step(self, ids: Tensor, targets: Tensor) -> None:
        rows = ids.numel()
        with torch.no_grad():
            for w in self.weights:
                x, dy = self._x(rows, w.shape[1]), self._x(rows, w.shape[0])
                x @ w.T  # forward
                dy @ w  # the input's gradient
                dy.T @ x  # the weight's gradient


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]


def timed(fn: Callable[[], None], device: torch.device) -> float:
    sync(device)
    start = clock()
    fn()
    sync(device)
    return clock() - start


def compatible(spec: ModelSpec) -> str | None:
    """Why the fused reference cannot build `spec`'s architecture, or None."""
    if spec.pos.name != "rope" or spec.block.name != "prenorm":
        return f"pos={spec.pos.name}, block={spec.block} (the reference is pre-norm with RoPE)"
    if spec.norm.name not in ("rmsnorm", "torch_rmsnorm"):
        return f"norm={spec.norm.name} (the reference uses RMSNorm)"
    if spec.ffn.name not in ("swiglu", "torch_swiglu"):
        return f"ffn={spec.ffn.name} (the reference uses SwiGLU)"
    return None


def lmcore_variants(spec_text: str) -> list[tuple[str, str]]:
    """(row name, spec) of each lmcore model to time."""
    spec = parse_spec(spec_text)
    rows = [(f"lmcore `{spec_text}`", spec_text)]
    if spec.attn.name != "chunked":
        rows.append(("lmcore `attn=chunked`", f"{spec_text}, attn=chunked"))
    if "torch_sdpa" in get_registry().names("attn"):
        rows.append(("lmcore + lmcore-torch components", f"{spec_text}, {TORCH_COMPONENTS}"))
    return rows


def make_impls(args: argparse.Namespace, device: torch.device) -> tuple[list[Impl], list[str]]:
    torch.manual_seed(0)
    base = build_model(args.spec, device=device)
    spec = base.spec
    why = compatible(spec)
    if why:
        raise SystemExit(f"the fused reference cannot build {args.spec!r}: {why}")
    state = {k: v.detach().clone() for k, v in base.state_dict().items()}
    notes: list[str] = []

    def copy_of(spec_text: str, compile: bool) -> nn.Module:
        # compile= only when compiling: the script also times lmcore versions without it.
        kwargs = {"compile": True} if compile else {}
        model = build_model(spec_text, device=device, **kwargs)
        model.load_state_dict(state, strict=True)
        return model

    def reference() -> nn.Module:
        ref = FusedReference(spec, device)
        ref.load_state_dict(state, strict=True)
        return ref

    impls: list[Impl] = []
    for compiled in (False, True) if args.compile else (False,):
        tag = " + torch.compile" if compiled else ""
        ref = reference()
        if compiled:
            ref.compile()
        impls.append(Impl(f"fused reference{tag}", ref, ref))
        hf = llama(base.blueprint, state, device)
        if isinstance(hf, str):
            if not compiled:
                notes.append(f"Hugging Face Llama skipped: {hf}")
        else:
            if compiled:
                hf.compile()
            impls.append(
                Impl(f"HF `LlamaForCausalLM` (sdpa){tag}", hf, lambda ids, m=hf: m(ids).logits)
            )
        for name, spec_text in lmcore_variants(args.spec):
            model = copy_of(spec_text, compiled)
            impls.append(Impl(f"{name}{tag}", model, model))
    if "torch_sdpa" not in get_registry().names("attn"):
        notes.append("lmcore-torch is not installed: pip install --no-deps examples/lmcore-torch")
    return impls, notes


def check_agreement(impls: list[Impl], ids: Tensor) -> None:
    with torch.no_grad():
        expected = impls[0].logits(ids).float()
        for impl in impls[1:]:
            got = impl.logits(ids).float()
            err = (got - expected).abs().max().item()
            if not err <= 1e-3 * max(1.0, expected.abs().max().item()):
                raise SystemExit(f"{impl.name}: logits differ from the reference by {err:.2e}")


def ratio(ref: list[float], ours: list[float], digits: int = 2) -> str:
    """Median of the per-round speed ratios (reference time / our time), with the quartiles."""
    rounds = sorted(a / b for a, b in zip(ref, ours, strict=True))
    if len(rounds) < 4:
        return f"{statistics.median(rounds):.{digits}f}"
    q1, _, q3 = statistics.quantiles(rounds, n=4)
    return f"{statistics.median(rounds):.{digits}f} ({q1:.{digits}f}–{q3:.{digits}f})"


def throughput(args: argparse.Namespace, device: torch.device) -> None:
    impls, notes = make_impls(args, device)
    spec = parse_spec(args.spec)
    seq = args.seq or spec.context_length
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, spec.vocab_size, (args.batch, seq + 1), generator=gen).to(device)
    ids, targets = tokens[:, :-1], tokens[:, 1:]
    check_agreement(impls, ids)
    linears = [m.weight.detach() for m in impls[0].model.modules() if isinstance(m, nn.Linear)]
    peers: list[Impl | MatmulBound] = [
        *impls,
        MatmulBound("matrix products alone (bound)", linears),
    ]
    print(f"warming up {len(impls)} models ...", file=sys.stderr)
    for impl in peers:  # lazy initialisation, AdamW's state, torch.compile's graphs
        for _ in range(args.warmup):
            impl.forward(ids)
            impl.train_step(ids, targets)
    load_before = os.getloadavg()
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
        order = peers[r % len(peers) :] + peers[: r % len(peers)]
        for impl in order:  # each pass back to back, so a round's ratios see one load
            impl.forward_s.append(timed(lambda i=impl: i.forward(ids), device))
        for impl in order:
            impl.train_s.append(timed(lambda i=impl: i.train_step(ids, targets), device))
    load_after = os.getloadavg()

    n = args.batch * seq
    print(
        f"\n`{args.spec}` ({parse_spec(args.spec)}), batch {args.batch} x {seq} tokens, "
        f"{device}, float32, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{args.clock} clock; "
        f"median of {args.rounds} interleaved rounds; load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after\n"
    )
    print(
        "| implementation | forward tokens/s | × fused (quartiles) "
        "| training step tokens/s | × fused (quartiles) |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    ref = impls[0]  # the eager fused reference
    for impl in peers:
        print(
            f"| {impl.name} | {n / statistics.median(impl.forward_s):,.0f} "
            f"| {ratio(ref.forward_s, impl.forward_s)} "
            f"| {n / statistics.median(impl.train_s):,.0f} | {ratio(ref.train_s, impl.train_s)} |"
        )
    for note in notes:
        print(f"\n{note}")


# ----------------------------------------------------------------------------- output checks


def interleaved(
    models: dict[str, nn.Module],
    fn: Callable[[nn.Module, Tensor], None],
    ids: Tensor,
    rounds: int,
    device: torch.device,
) -> dict[str, list[float]]:
    """Seconds per call of `fn(model, ids)` for each model, `rounds` samples each, the models
    taking turns; a sample repeats the call for about 0.25 s, so that short calls are timed."""
    for model in models.values():  # warm-up
        fn(model, ids)
    once = min(timed(lambda m=m: fn(m, ids), device) for m in models.values())
    reps = max(1, int(0.25 / max(once, 1e-6)))

    def run(model: nn.Module) -> None:
        for _ in range(reps):
            fn(model, ids)

    names = list(models)
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        for key in names[r % len(names) :] + names[: r % len(names)]:
            times[key].append(timed(lambda k=key: run(models[k]), device) / reps)
    return times


def hook_overhead(args: argparse.Namespace, device: torch.device) -> None:
    """lmcore with and without the forward hooks `Blueprint.create` puts on every norm, ffn and
    attn module to check its output's shape and dtype: inference forward and forward+backward,
    at the benchmark's shape and at one token (a decoding step), interleaved, median ratio."""
    from lmcore.parts import _OutputCheck

    spec = parse_spec(args.spec)
    torch.manual_seed(0)
    hooked = build_model(args.spec, device=device)
    bare = build_model(args.spec, device=device)
    bare.load_state_dict(hooked.state_dict(), strict=True)
    removed = 0
    for module in bare.modules():
        for key, hook in list(module._forward_hooks.items()):
            if isinstance(hook, _OutputCheck):
                del module._forward_hooks[key]
                removed += 1
    models = {"with": hooked, "without": bare}

    def forward(model: nn.Module, ids: Tensor) -> None:
        with torch.no_grad():
            model(ids)

    def forward_backward(model: nn.Module, ids: Tensor) -> None:
        model.zero_grad(set_to_none=True)
        model(ids).float().logsumexp(-1).mean().backward()

    print(
        f"\nOutput-check hooks ({removed} modules): `{args.spec}`, {device}, float32, "
        f"{torch.get_num_threads()} threads, {args.clock} clock; median of {args.rounds} "
        f"interleaved rounds; load average {os.getloadavg()[0]:.1f}\n"
    )
    print("| batch × tokens | pass | with hooks ms | without ms | with / without (quartiles) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for batch, seq in ((args.batch, args.seq or spec.context_length), (1, 1)):
        ids = torch.randint(0, spec.vocab_size, (batch, seq), device=device)
        for name, fn in (("forward", forward), ("forward + backward", forward_backward)):
            times = interleaved(models, fn, ids, args.rounds, device)
            ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
            print(
                f"| {batch} × {seq} | {name} | {ms['with']:.3f} | {ms['without']:.3f} "
                f"| {ratio(times['with'], times['without'], digits=3)} |"
            )


# ----------------------------------------------------------------------------- long context


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def long_child(args: argparse.Namespace, kernel: str, seq: int, what: str) -> dict[str, float]:
    """One training step at batch 1 x `seq` tokens in this fresh process: its peak memory
    (`what="memory"`) or its time (`"time"`)."""
    device = torch.device(args.device)
    spec_text = f"{args.spec}, context_length={max(seq, parse_spec(args.spec).context_length)}"
    torch.manual_seed(0)
    if kernel == "fused reference":
        model: nn.Module = FusedReference(parse_spec(spec_text), device)
    elif kernel == "torch_sdpa":
        model = build_model(f"{spec_text}, attn=torch_sdpa", device=device)
    else:
        model = build_model(f"{spec_text}, attn={kernel}", device=device)
    impl = Impl(kernel, model, model)
    vocab = parse_spec(spec_text).vocab_size
    warm = torch.randint(0, vocab, (1, min(seq, 64) + 1), device=device)
    impl.train_step(warm[:, :-1], warm[:, 1:])  # AdamW's state, lazy initialisation
    tokens = torch.randint(0, vocab, (1, seq + 1), device=device)
    impl.optimizer.zero_grad(set_to_none=True)

    def step() -> None:
        impl.train_step(tokens[:, :-1], tokens[:, 1:])

    if what == "time":
        return {"s": timed(step, device)}
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as f:  # reset the peak to the current RSS
            f.write("5")
        before = rss()
    step()
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else peak_rss()
    return {"mib": (peak - before) / MiB}


def long_context(args: argparse.Namespace) -> None:
    kernels = ["fused reference", "sdpa", "chunked"]
    if "torch_sdpa" in get_registry().names("attn"):
        kernels.append("torch_sdpa")
    print(
        f"\nOne training step (forward, cross-entropy, backward, AdamW) at batch 1, `{args.spec}` "
        f"with context_length raised to fit, {args.device}, float32, "
        f"{torch.get_num_threads()} threads, {args.clock} clock; each in a fresh process; "
        f"time: median of up to {args.long_rounds} interleaved round(s); load average "
        f"{os.getloadavg()[0]:.1f}\n"
    )
    print("| tokens | attention | step peak MiB | × fused | step s | × fused |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for seq in args.long:
        # sdpa keeps its softmax weights: past 8,192 tokens they alone outgrow 24 GiB.
        here = [k for k in kernels if not (k == "sdpa" and seq > 8192)]
        mib: dict[str, float] = {}
        seconds: dict[str, list[float]] = {k: [] for k in here}
        failed: dict[str, str] = {}
        for kernel in here:
            print(f"{kernel} at {seq} tokens: memory ...", file=sys.stderr)
            try:
                mib[kernel] = child_run(args, kernel, seq, "memory")["mib"]
            except RuntimeError as e:
                failed[kernel] = str(e)
        alive = [k for k in here if k not in failed]
        rounds = args.long_rounds if seq <= 8192 else 1  # a longer step takes minutes
        for r in range(rounds):  # the kernels take turns, so they share the load
            for kernel in alive[r % len(alive) :] + alive[: r % len(alive)]:
                print(f"{kernel} at {seq} tokens: time, round {r + 1} ...", file=sys.stderr)
                seconds[kernel].append(child_run(args, kernel, seq, "time")["s"])
        ref = "fused reference"
        for kernel in here:
            name = "fused reference (`F.sdpa`)" if kernel == ref else f"`{kernel}`"
            if kernel in failed:
                print(f"| {seq:,} | {name} | failed: {failed[kernel]} | | | |")
                continue
            ratio = statistics.median(
                a / b for a, b in zip(seconds[kernel], seconds[ref], strict=True)
            )
            print(
                f"| {seq:,} | {name} | {mib[kernel]:,.0f} | {mib[kernel] / mib[ref]:.2f} "
                f"| {statistics.median(seconds[kernel]):.2f} | {ratio:.2f} |"
            )


def child_run(args: argparse.Namespace, kernel: str, seq: int, what: str) -> dict[str, float]:
    """`long_child` in a fresh process. Memory runs with MALLOC_MMAP_THRESHOLD_=64 KiB, so that
    glibc returns every freed tensor to the OS at once and the resident set tracks the live
    tensors; time runs with the default allocator, which keeps freed blocks for reuse."""
    env = dict(os.environ)
    if what == "memory":
        env["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)
    cmd = [sys.executable, __file__, "--spec", args.spec, "--device", args.device,
           "--child", kernel, str(seq), what]  # fmt: skip
    if args.threads:
        cmd.append(f"--threads={args.threads}")
    cmd.append(f"--clock={args.clock}")
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or ["killed"])[-1])
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# ----------------------------------------------------------------------------- profile


def profile(args: argparse.Namespace, device: torch.device) -> None:
    """Operator-level profile of one training step of lmcore and of the fused reference."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    impls, _ = make_impls(args, device)
    spec = parse_spec(args.spec)
    seq = args.seq or spec.context_length
    tokens = torch.randint(0, spec.vocab_size, (args.batch, seq + 1), device=device)
    ids, targets = tokens[:, :-1], tokens[:, 1:]
    chosen = [i for i in impls if i.name.startswith(("fused reference", "lmcore `"))]
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    for impl in chosen:
        impl.train_step(ids, targets)
        with torch_profile(activities=activities) as prof:
            impl.train_step(ids, targets)
        print(f"\n### {impl.name}: one training step, batch {args.batch} x {seq}\n")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", default="tinystories")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=0, help="tokens per row (default: context)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="also time each under compile")
    parser.add_argument("--quick", action="store_true", help="3 rounds, 4,096 tokens only")
    parser.add_argument("--long", type=int, nargs="*", default=None, help="long-context lengths")
    parser.add_argument("--no-long", action="store_true", help="skip the long-context table")
    parser.add_argument(
        "--long-rounds", type=int, default=0, help="timed steps per kernel (default 3, quick 1)"
    )
    parser.add_argument("--no-throughput", action="store_true", help="only the long context")
    parser.add_argument("--profile", action="store_true", help="profile a training step instead")
    parser.add_argument(
        "--hooks", action="store_true", help="time the output-check forward hooks instead"
    )
    parser.add_argument("--top", type=int, default=20, help="operators shown by --profile")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: all)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall: elapsed time (default); cpu: this process's CPU time, which other processes "
        "on a shared machine disturb less (use with --threads 1)",
    )
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        kernel, seq, what = args.child
        print(json.dumps(long_child(args, kernel, int(seq), what)))
        return
    if args.quick:
        args.rounds = min(args.rounds, 3)
        args.warmup = 1
    if args.long is None:
        args.long = [4096] if args.quick else [4096, 16384]
    if not args.long_rounds:
        args.long_rounds = 1 if args.quick else 3
    device = torch.device(args.device)
    if args.profile:
        profile(args, device)
        return
    if args.hooks:
        hook_overhead(args, device)
        return
    if not args.no_throughput:
        throughput(args, device)
    if not args.no_long and args.long:
        long_context(args)


if __name__ == "__main__":
    main()
