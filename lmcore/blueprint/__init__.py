"""From a spec to the resolved model: `resolve(spec) -> Blueprint`, done once and passed on.

A `Blueprint` is the canonical `ModelSpec` plus, for each component slot (`block`, `norm`, `ffn`,
`pos`, `attn`, and `qk_norm` when there is one), the `Part` that fills it: the registry entry
(with provenance) and every argument's value, nested components resolved too. Everything
downstream (the model, accounting and `describe`, the runner, the CLI, the conformance kit)
takes a blueprint and never parses a spec again. `kwargs(slot)` is the one rule for what a
component's factory and declarations receive; `layer(i)` is the blueprint of layer `i` alone.

Resolution, in order: parse the items (`lmcore.spec`); expand the preset; look up each component
and check its arguments against its declaration (nested components against theirs); derive
`num_kv_heads`, `head_dim`, `d_ff` and the query scale; apply the per-layer items
(`key[layers]=value`) and choose the canonical whole-model value of each key that differs by
layer; check the shape of every distinct layer against each component's `validate` and the
attention kernel's features. Every failure is a `SpecError` with a caret under the token to
blame.

The modules, by concern: `resolver` (the walk over the spec's items and its preset's),
`origins` (where each value was written; every error placed there), `lookup` (components and
their arguments), `derived` (the values lmcore derives, and the one `d_ff` rule), `layers` (the
per-layer items), `checks` (shape and features), `resolved` (the `Blueprint`).
"""

from __future__ import annotations

from lmcore.blueprint.checks import divisors_near
from lmcore.blueprint.resolved import Blueprint
from lmcore.blueprint.resolver import _Resolver as _Resolver  # tests count resolutions by it
from lmcore.blueprint.resolver import parse_spec, resolve
from lmcore.parts import Part, checked_module

__all__ = ["Blueprint", "Part", "checked_module", "divisors_near", "parse_spec", "resolve"]
