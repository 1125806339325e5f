"""lmcore's Mamba-2 layer (chunked SSD) against transformers' `Mamba2Mixer` on its torch path,
with the same weights and inputs.

    python benchmarks/mamba2.py [--rounds 7] [--batch 1] [--seq 2048] [--d-model 768]
        [--d-state 128] [--head-dim 64] [--groups 1] [--chunk 256] [--threads N]
        [--clock wall|cpu]

The peer is transformers' `Mamba2Mixer` without mamba-ssm's kernels (its `mamba2_chunk_scan`
and `causal_conv1d_fn` fallbacks: what it runs on a machine without them), loaded with
lmcore's state dict; the script checks that their outputs agree before timing. Both run the
whole layer in float32 (in_proj, convolution, chunked scan in chunks of `--chunk`, gated
norm, out_proj) with no cache. Timed in one process, each implementation once per round in
rotating order: the forward (no gradients) and a training step (forward, a loss on the
outputs, backward to the input and the weights). Prints a markdown table: median ms of each
and the median of the per-round ratios peer / lmcore with their quartiles (above 1: lmcore is
faster). On a machine shared with other work, `--threads 1 --clock cpu` gives steadier ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor, nn

from lmcore.interfaces import LayerContext
from lmcore_mamba2 import Mamba2

Layer = Callable[[Tensor], Tensor]


def layers(
    d_model: int, d_state: int, head_dim: int, groups: int, chunk: int, seed: int = 0
) -> tuple[Mamba2, nn.Module]:
    """lmcore's layer and transformers' Mamba2Mixer holding the same weights (away from their
    initial values, so that every part of the layer matters)."""
    from transformers import Mamba2Config
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

    torch.manual_seed(seed)
    ours = Mamba2(d_model=d_model, d_state=d_state, expand=2, head_dim=head_dim,
                  n_groups=groups, chunk_size=chunk)  # fmt: skip
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(0.02 * torch.randn_like(p))
    config = Mamba2Config(
        hidden_size=d_model, state_size=d_state, expand=2, head_dim=head_dim,
        num_heads=2 * d_model // head_dim, n_groups=groups, conv_kernel=4, chunk_size=chunk,
        use_conv_bias=True, use_bias=False, layer_norm_epsilon=1e-5, num_hidden_layers=1,
    )  # fmt: skip
    peer = Mamba2Mixer(config, layer_idx=0)
    peer.load_state_dict(ours.state_dict(), strict=True)
    return ours, peer


def as_layer(module: nn.Module) -> Layer:
    if isinstance(module, Mamba2):
        return lambda x: module(x, LayerContext())
    return lambda x: module(x)  # type: ignore[no-any-return]


def forward(layer: Layer, x: Tensor) -> Callable[[], object]:
    def run() -> object:
        with torch.no_grad():
            return layer(x)

    return run


def training_step(layer: Layer, module: nn.Module, x: Tensor, grad: Tensor) -> Callable[[], object]:
    leaf = x.clone().requires_grad_(True)

    def run() -> object:
        module.zero_grad(set_to_none=True)
        leaf.grad = None
        loss = (layer(leaf) * grad).sum()
        loss.backward()
        return loss

    return run


def seconds(fn: Callable[[], object], repeat: int, clock: Callable[[], float]) -> float:
    fn()  # warm-up
    start = clock()
    for _ in range(repeat):
        fn()
    return (clock() - start) / repeat


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=2, help="calls per timing")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--d-state", type=int, default=128)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    args = parser.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    torch.set_num_threads(args.threads)
    ours, peer = layers(args.d_model, args.d_state, args.head_dim, args.groups, args.chunk)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.seq, args.d_model, generator=gen)
    grad = torch.randn(args.batch, args.seq, args.d_model, generator=gen)
    modules = {"lmcore": ours, "transformers": peer}
    with torch.no_grad():
        want = as_layer(ours)(x)
        torch.testing.assert_close(as_layer(peer)(x), want, rtol=1e-3, atol=1e-3)
    cases = {
        "forward": {n: forward(as_layer(m), x) for n, m in modules.items()},
        "training step": {
            n: training_step(as_layer(m), m, x, grad) for n, m in modules.items()
        },
    }
    times = {case: {n: [] for n in modules} for case in cases}  # type: dict[str, dict[str, list[float]]]
    names = list(modules)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for case, fns in cases.items():
            for name in order:
                times[case][name].append(seconds(fns[name], args.repeat, clock))
    print(
        f"batch {args.batch} × {args.seq} tokens, d_model {args.d_model}, {ours.num_heads} "
        f"heads of {args.head_dim}, d_state {args.d_state}, {args.groups} group(s), chunks of "
        f"{args.chunk}, float32, {args.threads} threads, {args.rounds} rounds, {args.clock} clock"
    )
    print()
    print("| pass | peer | lmcore ms | peer ms | × peer (quartiles) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for case, by_name in times.items():
        mine, theirs = by_name["lmcore"], by_name["transformers"]
        ratios = [p / m for m, p in zip(mine, theirs, strict=True)]
        q1, q2, q3 = quartiles(ratios)
        print(
            f"| {case} | transformers Mamba2Mixer | {1e3 * statistics.median(mine):.1f} | "
            f"{1e3 * statistics.median(theirs):.1f} | {q2:.2f} ({q1:.2f}–{q3:.2f}) |"
        )


if __name__ == "__main__":
    main()
