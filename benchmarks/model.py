"""A whole lmcore model against the same model written with torch's fused ops, in the same run.

    python benchmarks/model.py [--spec "tinystories"] [--batch 4] [--seq 256] [--threads N]

The peer loads lmcore's weights (the CS336 state-dict keys) and uses nn.functional's linear,
embedding, rms_norm, silu and scaled_dot_product_attention(is_causal=True). Both run forward and
forward+backward on the same tokens; the script checks the logits agree, then prints the median
times and the ratio (lmcore / torch; above 1 means lmcore is slower).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.benchmark import Timer

from lmcore import ModelSpec, build_model


def torch_forward(w: dict[str, Tensor], spec: ModelSpec, ids: Tensor) -> Tensor:
    d, H, Hkv = spec.d_model, spec.num_heads, spec.num_kv_heads
    hd, T = d // H, ids.shape[-1]
    theta = float(spec.pos.kwargs["theta"])
    inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv  # (T, hd/2)
    cos, sin = ang.cos(), ang.sin()

    def rope(x: Tensor) -> Tensor:  # (B, H, T, hd), interleaved pairs
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2)

    eps = float(spec.norm.kwargs["eps"])
    x = F.embedding(ids, w["token_embeddings.weight"])
    for i in range(spec.num_layers):
        p = f"layers.{i}."
        h = F.rms_norm(x, (d,), w[p + "ln1.weight"], eps)
        q = F.linear(h, w[p + "attn.q_proj.weight"]).unflatten(-1, (H, hd)).transpose(1, 2)
        k = F.linear(h, w[p + "attn.k_proj.weight"]).unflatten(-1, (Hkv, hd)).transpose(1, 2)
        v = F.linear(h, w[p + "attn.v_proj.weight"]).unflatten(-1, (Hkv, hd)).transpose(1, 2)
        a = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True, enable_gqa=Hkv != H)
        x = x + F.linear(a.transpose(1, 2).flatten(-2), w[p + "attn.output_proj.weight"])
        h = F.rms_norm(x, (d,), w[p + "ln2.weight"], eps)
        gate = F.silu(F.linear(h, w[p + "ffn.w1.weight"])) * F.linear(h, w[p + "ffn.w3.weight"])
        x = x + F.linear(gate, w[p + "ffn.w2.weight"])
    return F.linear(F.rms_norm(x, (d,), w["ln_final.weight"], eps), w["lm_head.weight"])


def median_ms(fn: Callable[[], object], threads: int) -> float:
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    return float(timer.blocked_autorange(min_run_time=2.0).median * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", default="tinystories")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.manual_seed(0)
    model = build_model(args.spec)
    spec = model.spec
    if (spec.norm.name, spec.ffn.name, spec.pos.name, spec.attn.name) != (
        "rmsnorm", "swiglu", "rope", "sdpa",
    ):  # fmt: skip
        parser.error("the torch peer implements the default components only")
    weights = dict(model.named_parameters())
    ids = torch.randint(0, spec.vocab_size, (args.batch, args.seq))
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids), torch_forward(weights, spec, ids), rtol=1e-3, atol=1e-3
        )

    def ours_train() -> None:
        model.zero_grad(set_to_none=True)
        model(ids).float().logsumexp(-1).mean().backward()

    def peer_train() -> None:
        model.zero_grad(set_to_none=True)
        torch_forward(weights, spec, ids).float().logsumexp(-1).mean().backward()

    with torch.no_grad():
        fwd = median_ms(lambda: model(ids), args.threads)
        fwd_peer = median_ms(lambda: torch_forward(weights, spec, ids), args.threads)
    rows = [
        ("forward", fwd, fwd_peer),
        (
            "forward+backward",
            median_ms(ours_train, args.threads),
            median_ms(peer_train, args.threads),
        ),
    ]
    tokens = args.batch * args.seq
    shape = f"batch {args.batch} x seq {args.seq}"
    print(f"torch {torch.__version__}, {args.threads} threads, {args.spec!r}, {shape}")
    print("| pass | lmcore ms | torch ms | ratio | lmcore tokens/s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, ours, peer in rows:
        print(
            f"| {name} | {ours:.0f} | {peer:.0f} | {ours / peer:.2f} | {tokens / ours * 1e3:,.0f} |"
        )


if __name__ == "__main__":
    main()
