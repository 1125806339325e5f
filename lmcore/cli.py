"""The `lmcore` console script.

lmcore build SPEC           build a model; print its canonical spec and parameter count
lmcore plugins              list components, presets and plugins with provenance and status
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from lmcore.errors import LmcoreError, LmcoreWarning


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", LmcoreWarning)  # `lmcore plugins` prints them itself
    try:
        code: int = args.func(args)
    except LmcoreError as e:
        print(f"lmcore {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `lmcore plugins | head`
        return 0
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lmcore",
        description="Build decoder-only transformer LMs from spec strings and plugin components.",
        epilog='Spec example: "tinystories, pos=nope, norm=rmsnorm(eps=1e-6)". '
        "See the README for the grammar.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("build", help="build a model and print its canonical spec and size")
    p.add_argument("spec", help='spec string, e.g. "tinystories, pos=nope"')
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--device", default="cpu", help="torch device (meta: no allocation)")
    p.set_defaults(func=_cmd_build)

    p = sub.add_parser("plugins", help="list components and presets with provenance and status")
    p.add_argument("--kind", choices=["norm", "ffn", "pos", "attn", "preset"])
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_plugins)
    return parser


DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def _cmd_build(args: argparse.Namespace) -> int:
    import torch

    from lmcore.model import build_model

    model = build_model(args.spec, device=args.device, dtype=getattr(torch, args.dtype))
    n = sum(p.numel() for p in model.parameters())
    print(model.spec)
    print(f"parameters: {n:,}")
    return 0


def plugin_rows(kind: str | None = None) -> list[dict[str, Any]]:
    """One row per component, preset and unavailable plugin, as `lmcore plugins` shows them."""
    from lmcore.registry import get_registry

    registry = get_registry()
    rows: list[dict[str, Any]] = []
    if kind != "preset":
        for e in registry.entries(kind):
            rows.append(
                _row(e.kind, e.name, e.provenance, e.status, e.component.help)
                | {"args": [_arg_json(a) for a in e.component.args]}
            )
    if kind in (None, "preset"):
        for p in registry.preset_entries():
            rows.append(
                _row("preset", p.name, p.provenance, p.status, p.preset.help) | {"args": []}
            )
    for r in registry.plugins():
        if r.status != "ok":  # its kinds are unknown, so it shows under every filter
            rows.append(_row("-", r.name, r.provenance, r.status, r.reason) | {"args": []})
    order = {"norm": 0, "ffn": 1, "pos": 2, "attn": 3, "preset": 4, "-": 5}
    rows.sort(key=lambda r: (order[r["kind"]], r["name"], r["dist"] or ""))
    return rows


def _row(kind: str, name: str, prov: Any, status: str, note: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "name": name,
        "dist": prov.dist,
        "version": prov.version,
        "plugin": prov.plugin,
        "module": prov.module,
        "status": status,
        "note": note,
    }


def _arg_json(a: Any) -> dict[str, Any]:
    return {
        "name": a.name,
        "type": a.type.__name__,
        "default": None if a.required else a.default,
        "required": a.required,
        "help": a.help,
    }


def _cmd_plugins(args: argparse.Namespace) -> int:
    from lmcore.components import format_scalar
    from lmcore.registry import get_registry

    rows = plugin_rows(args.kind)
    problems = get_registry().problems
    if args.json:
        print(json.dumps({"components": rows, "problems": problems}, indent=2))
        return 0
    table = [("KIND", "NAME", "DIST", "VERSION", "STATUS", "ARGS / REASON")]
    for r in rows:
        detail = ", ".join(
            f"{a['name']}: {a['type']} = "
            + ("required" if a["required"] else format_scalar(a["default"]))
            for a in r["args"]
        )
        if r["status"] in ("failed", "disabled"):
            detail = r["note"]
        elif r["status"] == "shadowed":
            detail = f"{detail}  (ambiguous: write {r['dist'] or r['plugin']}:{r['name']})".strip()
        table.append(
            (
                r["kind"],
                r["name"],
                r["dist"] or "(in-process)",
                r["version"] or "-",
                r["status"],
                detail,
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(5)]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths, strict=True)), row[5])
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
