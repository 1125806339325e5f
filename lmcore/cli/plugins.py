"""`lmcore plugins`: every component, preset and plugin with its provenance and status."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from lmcore.components import ALL_KINDS


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plugins", help="list components and presets with provenance and status")
    p.add_argument("--kind", choices=[*ALL_KINDS, "preset"])
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lmcore.components import format_qualified
    from lmcore.registry import get_registry

    rows = plugin_rows(args.kind)
    problems = get_registry().problems
    if args.json:
        print(json.dumps({"components": rows, "problems": problems}, indent=2))
        return 0
    table = [("KIND", "NAME", "DIST", "VERSION", "STATUS", "ARGS / REASON")]
    for r in rows:
        detail = ", ".join(f"{a['name']}: {a['type']} = {_default(a)}" for a in r["args"])
        if r["status"] in ("failed", "disabled", "empty"):
            detail = r["note"]
        elif r["status"] == "shadowed":
            typed = format_qualified(r["dist"] or r["plugin"], r["name"])
            detail = f"{detail}  (ambiguous: write {typed})".strip()
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
        cells = [cell.ljust(w) for cell, w in zip(row[:5], widths, strict=True)]
        print("  ".join([*cells, row[5]]).rstrip())
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
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
        elif not r.components and not r.presets:  # loaded, yet nothing to show for it
            note = "loaded, but declares no components or presets"
            rows.append(_row("-", r.name, r.provenance, "empty", note) | {"args": []})
    order = {kind: n for n, kind in enumerate((*ALL_KINDS, "preset", "-"))}
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


def _default(a: dict[str, Any]) -> str:
    """An argument's default as a spec writes it: a component-valued one as its spec text."""
    from lmcore.components import ALL_KINDS, format_scalar

    if a["required"]:
        return "required"
    if a["default"] is None:
        return "none"
    return str(a["default"]) if a["type"] in ALL_KINDS else format_scalar(a["default"])


def _arg_json(a: Any) -> dict[str, Any]:
    return {
        "name": a.name,
        "type": a.type_name,
        "default": None if a.required else a.default,
        "required": a.required,
        "help": a.help,
    }
