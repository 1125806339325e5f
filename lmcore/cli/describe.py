"""`lmcore describe SPEC`: parameters, FLOPs and memory by component before any weight exists, and
what a checkpoint says about itself; its text and JSON reports.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from lmcore.cli.common import (
    DTYPE_HELP,
    DTYPES,
    OR_CHECKPOINT,
    check_seq,
    positive,
    show_bytes,
    source,
    torch_dtype,
)
from lmcore.cli.describe_memory import memory_lines
from lmcore.errors import clip

if TYPE_CHECKING:
    from lmcore.checkpoint import CheckpointInfo
    from lmcore.describe import Description


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "describe",
        help="parameters, FLOPs and memory by component (builds on the meta device only)",
        description="Account a spec before any weight exists: parameters and forward FLOPs by "
        "component with their shares, weight memory and a training-memory estimate (AdamW).",
    )
    p.add_argument(
        "spec",
        help=f'spec string, e.g. "gpt2-xl" or "tinystories, ffn=gelu"; {OR_CHECKPOINT}, whose '
        "spec and provenance are shown",
    )
    p.add_argument("--seq", type=positive, help="tokens per sequence (default: context_length)")
    p.add_argument("--batch", type=positive, default=1, help="sequences per batch (default: 1)")
    p.add_argument("--dtype", choices=DTYPES, help=DTYPE_HELP)
    p.add_argument("--micro-batch", type=positive, metavar="B",
                   help="the training estimate in micro-batches of B sequences (lmcore train's)")
    p.add_argument("--recompute", metavar="WHAT",
                   help="the training estimate with lmcore train's --recompute WHAT (e.g. layers)")
    p.add_argument("--measure", action="store_true",
                   help="measure activations with a forward on the meta device (about a second "
                   "more) and check each component's declaration against it; exit 1 on a "
                   "difference")  # fmt: skip
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lmcore.describe import describe

    src = source(args)
    info = src.info
    check_seq(args, src.blueprint.spec.context_length)
    found = describe(
        src.blueprint,
        batch=args.batch,
        seq_len=args.seq,
        dtype=torch_dtype(args, info),
        measure=args.measure,
        micro_batch=args.micro_batch,
        recompute=args.recompute,
    )
    if args.json:
        data = describe_json(found)
        print(
            json.dumps(
                data if info is None else {"checkpoint": checkpoint_json(info), **data}, indent=2
            )
        )
    else:
        print(
            "\n".join([*([] if info is None else checkpoint_lines(info)), *describe_lines(found)])
        )
    if found.mismatches:
        print(
            "lmcore describe: error: declared activations differ from the measurement:\n  "
            + "\n  ".join(found.mismatches),
            file=sys.stderr,
        )
        return 1
    return 0


def checkpoint_lines(info: CheckpointInfo) -> list[str]:
    """What a checkpoint says about itself: file, format, versions, and per component the
    distribution, version and entry point that provided it when it was saved."""
    lines = [
        f"checkpoint: {info.path} ({show_bytes(info.size)}, {len(info.tensors)} tensors, "
        f"{info.dtype}; "
        f"lmcore checkpoint format {info.format_version}, written by lmcore "
        f"{info.lmcore_version} with torch {info.torch_version})",
    ]
    kinds = max(len(c.kind) for c in info.components.values())
    width = max(len(c.name) for c in info.components.values())
    for saved in info.components.values():
        lines.append(f"  {saved.kind:<{kinds}}  {saved.name:<{width}}  {saved}")
    for alias, stored in info.tied.items():
        lines.append(f"  tied: {alias} is stored once, as {stored}")
    lines.append(
        f"  checksums: crc32 of each of the {len(info.checksums)} tensors, verified on load"
        if info.checksums is not None
        else "  checksums: none (saved before lmcore wrote them): nothing to verify on load"
    )
    for key, value in info.metadata.items():
        # the caller's own strings: escapes shown, not sent to the terminal; long ones cut
        shown = value if len(value) <= 60 and value.isprintable() else clip(value, 60)
        lines.append(f"  metadata: {key} = {shown}")
    return [*lines, ""]


def checkpoint_json(info: CheckpointInfo) -> dict[str, Any]:
    """`lmcore describe CKPT --json`'s "checkpoint" entry."""
    return {
        "path": str(info.path),
        "format_version": info.format_version,
        "spec": info.spec,
        "bytes": info.size,
        "tensors": len(info.tensors),
        "dtype": info.dtype,
        "lmcore_version": info.lmcore_version,
        "torch_version": info.torch_version,
        "components": {
            kind: {k: getattr(c, k) for k in ("kind", "name", "dist", "version", "plugin", "module")}
            for kind, c in info.components.items()
        },
        "tied": dict(info.tied),
        "metadata": dict(info.metadata),
    }


def describe_json(found: Description) -> dict[str, Any]:
    """`lmcore describe --json`: every row, the totals, the FLOPs by part and the memory."""
    acc, mem = found.accounting, found.memory
    return {
        "spec": str(acc.spec),
        "batch": acc.batch,
        "seq_len": acc.seq_len,
        "dtype": mem.dtype,
        "rows": [
            {
                "name": r.name,
                "part": r.part,
                "module": r.module,
                "count": r.count,
                "params_each": r.params_each,
                "params": r.params,
                "params_share": acc.params_share(r),
                "flops_each": r.flops_each,
                "flops": r.flops,
                "flops_share": acc.flops_share(r),
                "activations_declared": r.activations,
            }
            for r in acc.rows
        ],
        "per_layer": {"params": acc.layer_params, "flops": acc.layer_flops},
        "layers": [
            {"layers": layers, "count": n, "values": values, "params": params, "flops": flops}
            for layers, n, values, params, flops in layer_groups(found)
        ],
        "total": {
            "params": acc.params,
            "active_params": acc.active_params,
            "flops": acc.flops,
            "flops_per_token": acc.flops_per_token,
        },
        "roles": {
            r.role: {"tensors": r.tensors, "params": r.params, "share": r.params / acc.params}
            for r in found.roles
        },
        "flops_by_part": {
            part: {"flops": n, "share": n / acc.flops if acc.flops else 0.0}
            for part, n in acc.flops_by_part().items()
        },
        "memory": {
            "weights": mem.weights,
            "gradients": mem.gradients,
            "optimizer": mem.optimizer,
            "buffers": mem.buffers,
            "activations": mem.activations,
            "activations_source": mem.activations_source,
            "micro_batch": mem.micro_batch,
            "recompute": mem.recompute,
            "activations_saved": mem.activations_saved,
            "total": mem.total,
            "note": mem.note,
        },
        "activations_by_part": mem.activations_by_part,
        "decoding_state": {
            "layers": [
                {
                    "layers": layers,
                    "count": n,
                    "per_token": None if state is None else state[0],
                    "per_sequence": None if state is None else state[1],
                }
                for layers, n, state in acc.layer_states()
            ],
            "at_context_length": acc.state_bytes(),
        },
        "mismatches": list(found.mismatches),
        **({"unchecked": found.unchecked} if found.unchecked else {}),
    }


def describe_lines(found: Description) -> list[str]:
    """`lmcore describe` as text: the spec, one row per module, the FLOPs by part, memory."""

    acc, mem = found.accounting, found.memory
    table = [("row", "module", "count", "parameters", "share", "forward FLOPs", "share")]
    names = layer_names(found)
    for r in acc.rows:
        label = r.name
        if r.layers is not None and label.startswith("layers["):
            written, rest = label[len("layers[") :].split("]", 1)
            label = f"layers[{names.get(written, written)}]{rest}"
        table.append((
            label, r.module, str(r.count), f"{r.params:,}", _pct(acc.params_share(r)),
            f"{r.flops:,}", _pct(acc.flops_share(r)),
        ))  # fmt: skip
    if acc.uniform:
        table.append(("per layer", "", "", f"{acc.layer_params:,}", "", f"{acc.layer_flops:,}", ""))
    else:  # one row per kind of layer: its parameters and FLOPs
        shown = layer_names(found)
        for layers, n, _, params, flops in layer_groups(found):
            label = f"layers[{shown.get(layers, layers)}]"
            table.append((label, "", str(n), f"{params:,}", "", f"{flops:,}", ""))
    table.append(("total", "", "", f"{acc.params:,}", _pct(1.0), f"{acc.flops:,}", _pct(1.0)))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    left = (True, True, False, False, False, False, False)
    lines = [
        f"spec: {acc.spec}",
        f"input: batch {acc.batch} × seq {acc.seq_len} tokens, {mem.dtype}",
        "",
    ]
    groups = 1 if acc.uniform else len(layer_groups(found))
    for n, row in enumerate(table):
        if n == len(table) - 1 - groups:
            lines.append("")
        cells = [
            c.ljust(w) if lft else c.rjust(w) for c, w, lft in zip(row, widths, left, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    if not acc.uniform:
        lines += ["", "the keys that differ by layer:"]
        names = layer_names(found)
        for layers, n, values, _, _ in layer_groups(found):
            shown = ", ".join(f"{k}={v}" for k, v in values.items())
            where = names.get(layers, layers)
            lines.append(f"  layers {where} ({n} layer{'s' if n > 1 else ''}): {shown}")
    if found.roles:  # what drives weight decay and an optimizer's routing (docs/recipe.md)
        lines += ["", "parameters by role:"]
        for r in found.roles:
            tensors = f"{r.tensors:,} tensor{'s' if r.tensors > 1 else ''}"
            lines.append(f"  {r.role:<9}  {r.params:>15,}  {_pct(r.params / acc.params):>6}  "
                         f"{tensors}")  # fmt: skip
    by_part = acc.flops_by_part()
    lines += ["", f"forward FLOPs by part (total {_flops(acc.flops)}):"]
    width = max(len(part) for part in by_part)
    for part, n in by_part.items():
        lines.append(
            f"  {part:<{width}}  {_flops(n):>13}  {_pct(n / acc.flops if acc.flops else 0):>6}"
        )
    if acc.active_params != acc.params:  # a mixture of experts: a token uses some of them
        lines += [
            "",
            f"active parameters: {acc.active_params:,} of {acc.params:,} "
            f"({_pct(acc.active_params / acc.params)}) per token; forward FLOPs per token: "
            f"{_flops(round(acc.flops_per_token))}",
        ]
    lines += state_lines(found)
    lines += memory_lines(found)
    return lines


def state_lines(found: Description) -> list[str]:
    """The decoding state of one sequence by kind of layer (what generation's cache holds):
    bytes per token of context, which grow with it (keys and values, a latent), and bytes
    whatever the context (a recurrent state, a convolution's tail), and the whole model's at
    its context length."""
    from lmcore.spec import format_layers

    acc, mem = found.accounting, found.memory
    ctx = acc.spec.context_length
    bp = acc.blueprint
    mixers = {
        # The name alone: its arguments are under "the keys that differ by layer".
        format_layers(indices, acc.spec.num_layers) if acc.spec.layers else "*": lbp.spec.mixer.name
        for indices, lbp in bp.groups()
    }
    names = layer_names(found)
    rows = []
    for layers, n, state in acc.layer_states():
        where = "every layer" if layers == "*" else f"layers {names.get(layers, layers)}"
        what = f"{where} ({n}), mixer={mixers.get(layers, '?')}"
        if state is None:
            rows.append((what, "?", "?", "?"))
            continue
        per_token, per_sequence = state
        rows.append((
            what, f"{show_bytes(per_token)}/token" if per_token else "-",
            show_bytes(per_sequence) if per_sequence else "-",
            show_bytes(n * (per_token * ctx + per_sequence)),
        ))  # fmt: skip
    total = acc.state_bytes()
    header = ("layers", "grows", "fixed", f"at {ctx:,} tokens")
    table = [header, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    lines = ["", f"decoding state per sequence ({mem.dtype}; what generation caches):"]
    for r in table:
        lines.append(
            "  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                             for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        )  # fmt: skip
    shown = "?" if total is None else show_bytes(total)
    lines.append(f"  total at context_length={ctx:,}: {shown} per sequence")
    return lines


def layer_groups(found: Description) -> list[tuple[str, int, dict[str, str], int, int]]:
    """`(layers, count, values, params, flops)` of each kind of layer: the layers as a spec
    writes them, the values of the keys that differ by layer, and one layer's parameters and
    forward FLOPs."""
    from lmcore.spec import format_layers, format_value

    acc = found.accounting
    bp, spec = acc.blueprint, acc.spec
    keys = list(dict.fromkeys(lv.key for lv in spec.layers))
    sizes = {layers: (params, flops) for layers, _, params, flops in acc.layer_groups()}
    out = []
    for indices, lbp in bp.groups():
        layers = format_layers(indices, spec.num_layers) if spec.layers else "*"
        values = {k: format_value(getattr(lbp.spec, k)) for k in keys}
        params, flops = sizes.get(layers, (0, 0))
        out.append((layers, len(indices), values, params, flops))
    return out


def layer_names(found: Description) -> dict[str, str]:
    """How describe shows each kind of layer: its layers as a spec writes them, or, where that
    is long and the other layers' spelling is shorter, `all but` those (Qwen3-Next's 36 gated
    DeltaNet layers are `all but 3::4`, not twelve ranges)."""
    from lmcore.spec import format_layers

    spec = found.accounting.spec
    names = {}
    for indices, _ in found.accounting.blueprint.groups():
        written = format_layers(indices, spec.num_layers) if spec.layers else "*"
        rest = sorted(set(range(spec.num_layers)) - set(indices))
        other = format_layers(rest, spec.num_layers) if rest else ""
        short = rest and len(written) > 16 and len(other) + 8 < len(written)
        names[written] = f"all but {other}" if short else written
    return names


def _pct(share: float) -> str:
    return f"{100 * share:.1f}%"


def _flops(n: int) -> str:
    """Decimal prefixes, as FLOP counts are usually quoted: 4.51 TFLOPs."""
    scales = (("PFLOPs", 1e15), ("TFLOPs", 1e12), ("GFLOPs", 1e9), ("MFLOPs", 1e6), ("kFLOPs", 1e3))
    for unit, scale in scales:
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:,} FLOPs"
