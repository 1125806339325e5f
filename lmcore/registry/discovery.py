"""Finding the entry points of the group ``lmcore`` among the installed distributions, without
trusting other tools' metadata: only a distribution whose entry_points.txt has a ``[lmcore]``
section is parsed, and one whose metadata cannot be read is reported rather than raised."""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

from lmcore.errors import LmcoreWarning, describe_exception, did_you_mean, one_of
from lmcore.registry.records import Provenance, normalize_dist

GROUP = "lmcore"


@dataclass(frozen=True)
class Found:
    """One entry point of the group, or one that cannot be loaded as it is."""

    provenance: Provenance
    source: md.EntryPoint | str  # the entry point to load, or why it cannot be loaded


def discover(group: str) -> Iterator[Found]:
    """The group's entry points, sorted by distribution and name, the first distribution of a
    name on sys.path winning (as `importlib.metadata.entry_points` does).

    Only distributions whose entry_points.txt has a ``[group]`` section are parsed, so another
    tool's malformed metadata never reaches lmcore; a plugin distribution whose metadata cannot be
    read is reported (a `Found` whose `source` says why) instead of raising.
    """
    section = re.compile(rf"^\s*\[{re.escape(group)}\]\s*$", re.M)
    found: list[Found] = []
    seen: set[str] = set()
    for dist in md.distributions():
        try:
            text = dist.read_text("entry_points.txt")
        except Exception as e:  # unreadable: report it only if it may be ours
            raw = _raw_entry_points(dist)
            if raw is None or not section.search(raw):
                continue
            problem: str | None = f"its entry_points.txt cannot be read ({describe_exception(e)})"
            text = None
        else:
            if not text or not section.search(text):
                continue
            problem = None
        unreadable = None
        try:
            name, version = dist.metadata["Name"], dist.version
        except Exception as e:
            unreadable = describe_exception(e)
        else:
            if not name:
                unreadable = "it has no Name field"
        if unreadable is not None:
            name, version = stem(dist)
            problem = (
                problem or f"the METADATA of {name} cannot be read ({unreadable}); reinstall it"
            )
        if normalize_dist(name) in seen:
            continue  # shadowed by the same distribution earlier on sys.path
        seen.add(normalize_dist(name))
        try:
            eps = list(dist.entry_points.select(group=group)) if text else []
        except Exception as e:
            eps, problem = [], f"its entry_points.txt cannot be parsed ({describe_exception(e)})"
        if eps:
            found += [
                Found(Provenance(ep.name, ep.value, name, version), problem or ep) for ep in eps
            ]
        elif problem is not None:
            where = str(dist.locate_file(""))
            found.append(Found(Provenance(f"({name})", where, name, version), problem))
    found.sort(key=lambda f: (f.provenance.dist or "", f.provenance.plugin))
    yield from found


def _raw_entry_points(dist: md.Distribution) -> str | None:
    path = getattr(dist, "_path", None)
    try:
        return (path / "entry_points.txt").read_bytes().decode("utf-8", "replace") if path else None
    except OSError:
        return None


def stem(dist: md.Distribution) -> tuple[str, str]:
    """(name, version) from the folder name, ``name-1.0.dist-info``, when METADATA is unreadable."""
    folder = getattr(getattr(dist, "_path", None), "name", "?")
    name, _, rest = folder.partition("-")
    return name or "?", rest.rsplit(".", 1)[0] or "?"


def qualified_key(dist: str, name: str) -> tuple[str, str]:
    """`(normalised distribution, entry-point name)`, as `dist:name` disables one."""
    return normalize_dist(dist.strip()), name.strip()


def unknown_disabled(
    names: set[str], qualified: set[tuple[str, str]], seen: set[tuple[str, str]]
) -> list[str]:
    """A sentence with a suggestion for each disabled name (or `dist:name`) that matches none
    of the entry points `seen`."""
    seen_names = {name for _, name in seen}
    shown = sorted({f"{d}:{n}" for d, n in seen})
    unknown = [(n, did_you_mean(n, seen_names)) for n in sorted(names - seen_names)]
    unknown += [(f"{d}:{n}", did_you_mean(f"{d}:{n}", shown)) for d, n in sorted(qualified - seen)]
    return [
        f"LMCORE_DISABLE_PLUGINS names {name!r}, but no installed plugin has that "
        f"entry-point name{hint}; entry-point names: {one_of(seen_names)} "
        "(dist:name disables one distribution's)"
        for name, hint in unknown
    ]


def malformed_entry_points() -> list[str]:
    """Installed distributions whose entry_points.txt `importlib.metadata` cannot parse (a
    line that is neither a [section], a # comment nor name = value; text that is not UTF-8),
    one sentence each naming the distribution and the line."""
    found = []
    for dist in md.distributions():
        try:
            text = dist.read_text("entry_points.txt") or ""
        except Exception as e:
            found.append(f"{stem(dist)[0]}: its entry_points.txt cannot be read ({e})")
            continue
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            section = line.startswith("[") and line.endswith("]")
            if line and not line.startswith("#") and not section and "=" not in line:
                where = getattr(getattr(dist, "_path", None), "name", stem(dist)[0])
                found.append(f"{where}/entry_points.txt line {number}, {line[:60]!r}, has no '='")
                break
    return found


def guard_torch_import() -> list[str]:
    """Call before torch is first imported. torch's import reads every installed distribution's
    entry points (to autoload device backends) and fails on a malformed entry_points.txt, even
    one of an unrelated tool; when there is one, that autoload is switched off for this process
    (TORCH_DEVICE_BACKEND_AUTOLOAD=0) so lmcore keeps working, with a warning naming it.
    Returns the warnings given."""
    if "torch" in sys.modules or os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD") == "0":
        return []
    bad = malformed_entry_points()
    if not bad:
        return []
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    message = (
        f"malformed distribution metadata: {'; '.join(bad)}. importing torch would fail on it, "
        "so torch's device-backend autoload is off for this process "
        "(TORCH_DEVICE_BACKEND_AUTOLOAD=0); fix or uninstall that distribution"
    )
    warnings.warn(message, LmcoreWarning, stacklevel=2)
    return [message]
