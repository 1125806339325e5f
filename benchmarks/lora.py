"""LoRA fine-tuning steps: lmcore's LoRA against full fine-tuning and against PEFT's LoRA.

    python benchmarks/lora.py --checkpoint smol.safetensors      # SmolLM2-135M (docs/gguf.md)
    python benchmarks/lora.py                                    # a random model of its shape

Three measurements, each in fresh subprocesses (so each peak resident memory, VmHWM, is its
own; memory and time in separate ones, `run_worker`), on the same random token batches with
torch's AdamW over the trainable tensors:

- `lmcore-lora`: the checkpoint with ``adapter=lora(rank=R)`` (`lmcore.adapting.adapt`), its
  base frozen;
- `lmcore-full`: the checkpoint with every tensor trained;
- `peft-lora`: the same weights as a transformers `LlamaForCausalLM` (`lmcore convert
  --to-hf`) with PEFT's `LoraConfig(r=R, lora_alpha=2R, target_modules=q,k,v,o,gate,up,down)`,
  the matrices lmcore's default targets (``matrix,packed``) pick in a Llama; skipped when peft
  is not installed.

`--kernels SPEC_ITEMS` runs both lmcore modes with those spec items replacing the checkpoint's
(the weights are the same tensors), e.g. the kernels transformers itself calls, from the
`lmcore-torch` example plugin (``pip install -e examples/lmcore-torch``):
``--kernels "attn=torch_sdpa,norm=torch_rmsnorm(eps=1e-05),ffn=torch_swiglu"``, so that the
comparison with PEFT is of the adapters and the loop around them, not of attention kernels.

Reported: median seconds per step (after warm-up steps), tokens/s, VmHWM and the peak above the
loaded model; ratios full/LoRA (memory, time) and PEFT/lmcore (time: ≥ 1.0 is lmcore as fast or
faster). `--rounds N` times every mode N times, interleaved (lmcore LoRA, full, PEFT, lmcore
LoRA, ...), so that a machine's drift over minutes reaches every mode alike: the table gives
each mode's median over rounds and the PEFT/lmcore ratio of each round. `tests/benchmarks/test_lora.py` checks, on a tiny model, that both LoRAs given the same
initial A take the same steps (the losses agree), untimed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

SMOL_SPEC = ("vocab_size=49152,context_length=8192,d_model=576,num_layers=30,num_heads=9,"
             "num_kv_heads=3,d_ff=1536,tie_embeddings=true,pos=rope(theta=100000.0)")  # fmt: skip
PEFT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# lmcore's Llama module names → Hugging Face's (lmcore.hf's Llama mapping)
HF_NAMES = {"attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj",
            "attn.v_proj": "self_attn.v_proj", "attn.output_proj": "self_attn.o_proj",
            "ffn.w1": "mlp.gate_proj", "ffn.w3": "mlp.up_proj",
            "ffn.w2": "mlp.down_proj"}  # fmt: skip


def batches(vocab: int, batch: int, context: int, n: int, seed: int = 0) -> Iterator[Any]:
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        ids = torch.randint(0, vocab, (batch, context + 1), generator=g)
        yield ids[:, :-1], ids[:, 1:]


def lmcore_model(checkpoint: str, mode: str, rank: int) -> torch.nn.Module:
    import lmcore
    from lmcore.adapting import adapt

    if mode == "lmcore-lora":
        return adapt(checkpoint, f"lora(rank={rank}, alpha={2 * rank})")
    return lmcore.load(checkpoint)


def with_kernels(checkpoint: str, items: str, out: Path) -> str:
    """`checkpoint` rebuilt with the spec `items` in place of its own (same keys replaced,
    new ones added) and its weights loaded strictly, saved to `out`."""
    import lmcore
    from lmcore.syntax import parse_items

    base = lmcore.load(checkpoint)
    text = str(base.spec)
    own = {i.key: text[i.start : i.value.end] for i in parse_items(text)}
    for item in parse_items(items):
        if item.key is None:
            raise SystemExit(f"--kernels {items!r}: give key=value items, not a preset")
        own[item.key] = items[item.start : item.value.end]
    model = lmcore.build_model(",".join(own.values()))
    model.load_state_dict(base.state_dict(), strict=True)
    model.tokenizer = base.tokenizer
    return str(model.save(out))


def peft_model(hf_dir: str, rank: int) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                        target_modules=list(PEFT_TARGETS), bias="none")  # fmt: skip
    return get_peft_model(base, config)


def lmcore_loss(model: torch.nn.Module) -> Callable[[Any, Any], torch.Tensor]:
    from lmcore.model.nn import cross_entropy

    return lambda x, y: cross_entropy(model(x), y)


def peft_loss(model: torch.nn.Module) -> Callable[[Any, Any], torch.Tensor]:
    import torch.nn.functional as F  # a benchmark's reference, not lmcore's code

    def loss(x: Any, y: Any) -> torch.Tensor:
        logits = model(input_ids=x).logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))

    return loss


def copy_lora_into_peft(lm: torch.nn.Module, peft: torch.nn.Module) -> int:
    """Give PEFT's LoRA matrices lmcore's values (A and B), so both start from one point;
    returns how many pairs were copied."""
    from lmcore.model.adapters import adapters

    theirs = dict(peft.named_modules())
    copied = 0
    with torch.no_grad():
        for name, module in adapters(lm):
            layer, _, local = name.partition(".")[2].partition(".")  # "layers.3.attn.q_proj"
            hf = theirs[f"base_model.model.model.layers.{layer}.{HF_NAMES[local]}"]
            hf.lora_A["default"].weight.copy_(module.lora_A)
            hf.lora_B["default"].weight.copy_(module.lora_B)
            copied += 1
    return copied


def train_steps(model: torch.nn.Module, loss_of: Callable[[Any, Any], torch.Tensor],
                data: Iterator[Any], lr: float = 1e-3) -> Iterator[tuple[float, float]]:
    """`(loss, seconds)` of each AdamW step over `model`'s trainable tensors."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    model.train()
    for x, y in data:
        start = time.perf_counter()
        loss = loss_of(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        yield float(loss.detach()), time.perf_counter() - start


def vm(field: str) -> int:
    """A /proc/self/status memory field in bytes (VmHWM: the peak resident set)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def worker(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    if args.worker == "peft-lora":
        model = peft_model(args.hf, args.rank)
        loss_of = peft_loss(model)
    else:
        model = lmcore_model(args.checkpoint, args.worker, args.rank)
        loss_of = lmcore_loss(model)
    loaded = vm("VmRSS")
    vocab = model.get_input_embeddings().weight.shape[0] if args.worker == "peft-lora" \
        else model.spec.vocab_size  # fmt: skip
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    data = batches(vocab, args.batch, args.context, args.warmup + args.steps)
    steps = list(train_steps(model, loss_of, data))
    times = [s for _, s in steps[args.warmup:]]
    peak = vm("VmHWM")
    return {"mode": args.worker, "trainable": trainable, "step_s": statistics.median(times),
            "tokens_per_s": args.batch * args.context / statistics.median(times),
            "peak_bytes": peak, "above_loaded_bytes": peak - loaded,
            "losses": [loss for loss, _ in steps]}  # fmt: skip


def run_worker(
    mode: str, args: argparse.Namespace, checkpoint: str, hf: str, *, memory: bool
) -> dict[str, Any]:
    """`mode` measured in a fresh process: for `memory`, with glibc's malloc at a fixed mmap
    threshold of 64 KiB (every large tensor mapped and unmapped as it lives and dies, so the
    resident set follows the live tensors, not malloc's cache); for time, with malloc as it
    is."""
    cmd = [sys.executable, __file__, "--worker", mode, "--checkpoint", checkpoint, "--hf", hf,
           "--rank", str(args.rank), "--batch", str(args.batch), "--context", str(args.context),
           "--steps", str(args.steps), "--warmup", str(args.warmup)]  # fmt: skip
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"} if memory else dict(os.environ)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:  # the worker's own last words, not only its exit status
        sys.stderr.write(out.stderr)
        raise SystemExit(f"benchmarks/lora.py: the {mode} worker exited {out.returncode}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def measure(modes: list[str], args: argparse.Namespace, checkpoint: str,
            hf: str) -> dict[str, dict[str, Any]]:
    """Each mode's memory (one run) and time (`args.rounds` runs, interleaved across modes):
    the median step over rounds, and every round's `step_s` in `rounds`."""
    memory = {m: run_worker(m, args, checkpoint, hf, memory=True) for m in modes}
    timed: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for m in modes:
            timed[m].append(run_worker(m, args, checkpoint, hf, memory=False))
    rows = {}
    for m in modes:
        steps = [r["step_s"] for r in timed[m]]
        step = statistics.median(steps)
        rows[m] = {**timed[m][0], "step_s": step, "rounds": steps,
                   "tokens_per_s": args.batch * args.context / step,
                   "peak_bytes": memory[m]["peak_bytes"],
                   "above_loaded_bytes": memory[m]["above_loaded_bytes"]}  # fmt: skip
    return rows


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", help="an lmcore checkpoint (default: a random SmolLM2-135M)")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1,
                   help="time every mode this many times, interleaved (default 1)")  # fmt: skip
    p.add_argument("--kernels", metavar="SPEC_ITEMS",
                   help="spec items replacing the checkpoint's for the lmcore runs")  # fmt: skip
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--hf", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("rank", "batch", "context", "steps", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.warmup < 0:
        p.error(f"--warmup must be at least 0, got {args.warmup}")
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    import importlib.util

    import lmcore
    from lmcore.hf.convert import convert_to_hf

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint
        if checkpoint is None:
            torch.manual_seed(0)
            checkpoint = str(lmcore.build_model(SMOL_SPEC).save(Path(tmp) / "random.safetensors"))
        hf = os.path.join(tmp, "hf")
        modes = ["lmcore-lora", "lmcore-full"]
        if importlib.util.find_spec("peft") is not None:
            convert_to_hf(checkpoint, hf)  # the checkpoint's own weights, before --kernels
            modes.append("peft-lora")
        else:
            print("peft is not installed: the PEFT comparison is skipped (pip install peft)")
        if args.kernels:
            checkpoint = with_kernels(checkpoint, args.kernels, Path(tmp) / "kernels.safetensors")
        rows = measure(modes, args, checkpoint, hf)
    print(f"checkpoint {args.checkpoint or 'random ' + SMOL_SPEC}; batch {args.batch} × "
          f"context {args.context}, rank {args.rank}, {args.steps} timed steps after "
          f"{args.warmup}, {args.rounds} round{'s' if args.rounds > 1 else ''}; torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads"
          + (f"; lmcore with {args.kernels}" if args.kernels else ""))
    print("| run | trainable | s/step | tokens/s | peak memory (VmHWM) | above the loaded model |")
    print("| --- | --- | --- | --- | --- | --- |")
    for m, r in rows.items():
        print(f"| {m} | {r['trainable']:,} | {r['step_s']:.3f} | {r['tokens_per_s']:,.0f} | "
              f"{mib(r['peak_bytes'])} | {mib(r['above_loaded_bytes'])} |")
    lora, full = rows["lmcore-lora"], rows["lmcore-full"]
    print(f"full / LoRA: memory {full['peak_bytes'] / lora['peak_bytes']:.2f}× (above the "
          f"model {full['above_loaded_bytes'] / lora['above_loaded_bytes']:.2f}×), time "
          f"{full['step_s'] / lora['step_s']:.2f}×")
    if "peft-lora" in rows:
        peft = rows["peft-lora"]
        print(f"PEFT / lmcore LoRA time: {peft['step_s'] / lora['step_s']:.2f}× (goal ≥ 1.0), "
              f"memory {peft['peak_bytes'] / lora['peak_bytes']:.2f}×")
        if args.rounds > 1:
            each = [p / q for p, q in zip(peft["rounds"], lora["rounds"], strict=True)]
            print("PEFT / lmcore LoRA time, each round: "
                  + ", ".join(f"{r:.2f}×" for r in each))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
