"""What the registry records of a component: where it came from."""

from __future__ import annotations

import importlib.metadata as md

from lmcore import (
    Registry,
)


def test_components_carry_their_provenance(registry: Registry) -> None:
    entry = registry.get("norm", "rmsnorm")
    prov = entry.provenance
    assert (prov.dist, prov.version, prov.plugin, prov.module) == (
        "lmcore-registry", md.version("lmcore-registry"), "rmsnorm", "lmcore_rmsnorm",
    )  # fmt: skip
    assert entry.status == "ok"
    assert (
        str(prov)
        == f"lmcore-registry {md.version('lmcore-registry')} (plugin 'rmsnorm', module lmcore_rmsnorm)"
    )
