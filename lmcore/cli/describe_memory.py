"""`lmcore describe`'s training-memory estimate as text: the weights, the estimate (following
`--micro-batch` and `--recompute`) and the activations by part; a quantized model's weights
only (it is not trained)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmcore.cli.common import show_bytes

if TYPE_CHECKING:
    from lmcore.describe import Description, TrainingMemory


def memory_lines(found: Description) -> list[str]:
    """The lines after the decoding state: the weights, the training estimate, the activations
    by part (the forward's, without recompute)."""
    acc, mem = found.accounting, found.memory
    lines: list[str] = []
    quant = acc.blueprint.spec.quant
    if quant is not None:  # a weight format: its bytes per parameter, on average
        each = f"{mem.weights / acc.params:.3f}" if acc.params else "0"
        said = f"{acc.params:,} parameters × {each} bytes on average, quant={quant}"
    else:
        said = f"{acc.params:,} parameters × {mem.weights // max(acc.params, 1)} bytes"
    lines += ["", f"weights: {show_bytes(mem.weights)} ({said}, {mem.dtype})"]
    if quant is not None:  # no gradients, no AdamW: training is refused, so none is estimated
        return [*lines, "", "training: none (the stored quantized matrices take no gradients; "
                "train the float checkpoint, then quantize it)"]  # fmt: skip
    lines += [
        "",
        f"training memory estimate (AdamW, {mem.dtype}, batch {acc.batch} × seq {acc.seq_len}"
        + (f" in micro-batches of {mem.micro_batch}" if mem.micro_batch else "")
        + (f", --recompute {mem.recompute}" if mem.recompute else "")
        + "):",
    ]
    items: list[tuple[str, int | None, str]] = [
        ("weights", mem.weights, ""),
        ("gradients", mem.gradients, ""),
        ("AdamW moments", mem.optimizer, "two float32 moments per parameter"),
        ("activations", mem.activations, _activations_note(mem)),
        ("buffers", mem.buffers, "non-persistent tables, e.g. RoPE cos/sin"),
        ("total", mem.total, "" if mem.activations is not None else "without activations"),
    ]
    for label, amount, why in items:
        shown = "?" if amount is None else show_bytes(amount)
        lines.append(f"  {label:<13}  {shown:>10}  {why}".rstrip())
    if found.unchecked:
        lines += ["", f"note: {found.unchecked}"]
    saved = mem.activations if mem.activations_saved is None else mem.activations_saved
    if saved:
        without = ", without recompute" if mem.activations_saved is not None else ""
        lines += ["", f"activations by part (total {show_bytes(saved)}{without}):"]
        width = max(len(part) for part in mem.activations_by_part)
        for part, n in mem.activations_by_part.items():
            share = _pct(n / saved)
            lines.append(f"  {part:<{width}}  {show_bytes(n):>10}  {share:>6}")
    return lines


def _activations_note(mem: TrainingMemory) -> str:
    what = "saved for backward by forward + loss"
    if mem.activations_saved is not None:
        what = (
            "each recomputed part's input plus the largest part's saved bytes, of "
            f"{show_bytes(mem.activations_saved)} saved without --recompute"
        )
    why = f" ({mem.note})" if mem.note else ""
    if mem.activations_source == "declared":
        return f"{what}, declared by the components{why}"
    if mem.activations_source == "measured":
        return f"{what}, measured on the meta device{why}"
    return f"unknown: {mem.note}"


def _pct(share: float) -> str:
    return f"{100 * share:.1f}%"
