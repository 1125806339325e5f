"""Learning-rate transfer (docs/mup.md): the quickstart model at widths 64, 128 and 256, each
trained at a grid of learning rates under parametrization=mup(base_width=128) and under the
standard parametrization; the final validation loss per (width, lr), the best lr per width,
and a plot of both side by side.

    python docs/mup/transfer.py --data data/stdlib-2k --out runs/mup-transfer

Every run is an ordinary `lmcore train` run (`lmcore.train.trainer.train`) in OUT; a run
already there is read back, not trained again, so an interrupted sweep resumes.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

SPEC = "vocab_size=2048, context_length=128, d_model={width}, num_layers=2, num_heads=4"
MUP = "mup(base_width=128)"


def run_one(
    spec: str, data: Path, out: Path, lr: float, seed: int, args: argparse.Namespace
) -> float:
    """The final validation loss of one run (inf when it diverged); a finished run is read."""
    from lmcore.train.config import TrainConfig
    from lmcore.train.trainer import train

    done = out / "result.json"
    if done.exists():
        return float(json.loads(done.read_text())["val_loss"])
    config = TrainConfig(steps=args.steps, batch_size=args.batch, lr=lr, context=args.context,
                         eval_every=args.steps, eval_batches=args.eval_batches, save_every=0,
                         seed=seed)  # fmt: skip
    result = train(spec, data, out, config, echo=None, progress=False)
    loss = result.val_loss if result.status == "done" and result.val_loss is not None else math.inf
    done.write_text(json.dumps({"val_loss": loss if math.isfinite(loss) else "inf"}))
    return loss


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=Path("data/stdlib-2k"))
    p.add_argument("--out", type=Path, default=Path("runs/mup-transfer"))
    p.add_argument("--widths", default="64,128,256")
    p.add_argument("--lrs", default="0.002,0.004,0.008,0.016,0.032")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--context", type=int, default=32)
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--seeds", type=int, default=2, help="runs per point; the loss is their mean")
    p.add_argument("--plot", type=Path, default=Path("docs/mup_transfer.png"))
    args = p.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    lrs = [float(x) for x in args.lrs.split(",")]
    start = time.perf_counter()
    losses: dict[str, dict[int, list[float]]] = {}
    for label, rules in (("muP", MUP), ("SP", None)):
        losses[label] = {}
        for w in widths:
            spec = SPEC.format(width=w) + (f", parametrization={rules}" if rules else "")
            row = []
            for lr in lrs:
                runs = [run_one(spec, args.data, args.out / f"{label}-w{w}-lr{lr:g}-s{seed}",
                                lr, seed, args) for seed in range(args.seeds)]  # fmt: skip
                loss = sum(runs) / len(runs)
                row.append(loss)
                print(f"{label:>3} width {w:>4} lr {lr:<6g} val_loss {loss:.4f}", flush=True)
            losses[label][w] = row
    print(f"wall time: {time.perf_counter() - start:.0f} s")
    print(table(losses, lrs))
    plot(losses, lrs, args.plot)
    print(f"plot: {args.plot}")
    return 0


def best(row: list[float]) -> int:
    return min(range(len(row)), key=lambda i: row[i])


def table(losses: dict[str, dict[int, list[float]]], lrs: list[float]) -> str:
    """A Markdown table: the loss per (parametrization, width, lr), the best in bold."""
    lines = ["| | width | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | best lr |",
             "|---|---:|" + "---:|" * len(lrs) + "---:|"]  # fmt: skip
    for label, rows in losses.items():
        for w, row in rows.items():
            b = best(row)
            cells = [(f"**{x:.3f}**" if i == b else f"{x:.3f}") for i, x in enumerate(row)]
            lines.append(f"| {label} | {w} | " + " | ".join(cells) + f" | {lrs[b]:g} |")
    return "\n".join(lines)


def plot(losses: dict[str, dict[int, list[float]]], lrs: list[float], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), layout="constrained")
    axes = fig.subplots(1, len(losses), sharey=True, squeeze=False)[0]
    for ax, (label, rows) in zip(axes, losses.items(), strict=True):
        for w, row in rows.items():
            shown = [x if math.isfinite(x) else float("nan") for x in row]
            (line,) = ax.plot(lrs, shown, marker="o", label=f"width {w}")
            b = best(row)
            ax.plot([lrs[b]], [row[b]], marker="*", markersize=14, color=line.get_color())
        ax.set_xscale("log", base=2)
        ax.set_xlabel("learning rate")
        ax.set_title(f"{label}" + (f": {MUP}" if label == "muP" else " (standard)"))
        ax.legend()
    axes[0].set_ylabel("validation loss")
    finite = [x for rows in losses.values() for row in rows.values() for x in row
              if math.isfinite(x)]  # fmt: skip
    if finite:
        low = min(finite)
        axes[0].set_ylim(low - 0.05, min(max(finite), low + 1.5))
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
