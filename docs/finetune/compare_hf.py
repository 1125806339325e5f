"""The LoRA walk-through's last check (docs/training.md, "Fine-tuning SmolLM2 with LoRA"): the
fine-tuned adapter, loaded by lmcore onto its base and left unmerged, against its merged
Hugging Face conversion loaded by transformers: the logits of the same ids.

    python docs/finetune/compare_hf.py ADAPTER.safetensors HF_DIR [TEXT]
"""

from __future__ import annotations

import sys

import torch


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: python docs/finetune/compare_hf.py ADAPTER.safetensors HF_DIR [TEXT]",
              file=sys.stderr)  # fmt: skip
        return 2
    from transformers import AutoModelForCausalLM

    import lmcore

    ours = lmcore.load(argv[0]).eval()
    theirs = AutoModelForCausalLM.from_pretrained(argv[1], torch_dtype=torch.float32).eval()
    text = argv[2] if len(argv) == 3 else "What does `gzip.compress` do? " * 8
    assert ours.tokenizer is not None
    ids = torch.tensor([ours.tokenizer.tokenizer().encode(text).ids])
    with torch.no_grad():
        a, b = ours(ids), theirs(input_ids=ids).logits
    diff = float((a - b).abs().max())
    same = int((a.argmax(-1) == b.argmax(-1)).sum())
    print(f"{ids.shape[1]} tokens: logits within {diff:.3g} (largest {float(a.abs().max()):.3g}), "
          f"argmax equal at {same} of {ids.shape[1]}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
