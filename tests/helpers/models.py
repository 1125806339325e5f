"""Small specs and models, tiny corpora, checkpoints perturbed or edited on disk."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import lmcore
from lmcore.model.roles import GAIN, Role

# ---------------------------------------------------------------------------------------------
# Training: a tiny model and a tiny corpus
# ---------------------------------------------------------------------------------------------

TINY_SPEC = "vocab_size=300, context_length=16, d_model=32, num_layers=2, num_heads=2"


def tiny_corpus(root: Path) -> Path:
    """A small text with structure a tiny model learns in a few hundred steps: a few "functions"
    repeated with small variations, one per document."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(24):
        lines = [
            f"def f{(i + k) % 5}(x):\n    return x * {k % 3} + {(i * k) % 4}\n" for k in range(12)
        ]
        (root / f"doc{i:02d}.py").write_text("".join(lines), encoding="utf-8")
    return root


# ---------------------------------------------------------------------------------------------
# Models and checkpoints: small specs, perturbed weights, files edited on disk
# ---------------------------------------------------------------------------------------------


# A small model: two layers, four heads of 8 dimensions (room for num_kv_heads=2 or 1).
SMALL_SPEC = "vocab_size=97, context_length=16, d_model=32, num_layers=2, num_heads=4, d_ff=64"
# The same with room for a prompt and the tokens generated after it.
DECODING_SPEC = "vocab_size=97, context_length=24, d_model=32, num_layers=2, num_heads=4, d_ff=64"


def decoding_model(spec: str = "", seed: int = 0, registry: Any = None) -> Any:
    """A model of `DECODING_SPEC` with `spec` added ("pos=alibi, num_kv_heads=2"), seeded."""
    torch.manual_seed(seed)
    return lmcore.build_model(
        f"{DECODING_SPEC}, {spec}" if spec else DECODING_SPEC, registry=registry
    )


def recompute(model: torch.nn.Module, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """Greedy by a full forward of the whole sequence at every step: the reference for
    generation with a cache, independent of lmcore.model.generate."""
    seq = prompt
    with torch.no_grad():
        for _ in range(n):
            nxt = model(seq)[:, -1].argmax(dim=-1)
            seq = torch.cat([seq, nxt[:, None]], dim=1)
    return seq[:, prompt.shape[1] :]


def perturb(model: torch.nn.Module, scale: float = 0.1) -> Any:
    """`model` with every parameter moved by `scale` times a standard normal (norm gains and
    biases too), so a weight that is not saved, loaded or converted changes the logits."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))
    return model


def perturbed(spec: str, seed: int = 0, **kwargs: Any) -> Any:
    """`lmcore.build_model(spec, **kwargs)`, seeded and perturbed."""
    torch.manual_seed(seed)
    return perturb(lmcore.build_model(spec, **kwargs))


def token_ids(vocab: int = 97, seq: int = 16, seed: int = 1) -> torch.Tensor:
    """Two rows of `seq` token ids, the same at every call."""
    return torch.randint(0, vocab, (2, seq), generator=torch.Generator().manual_seed(seed))


def rewrite(
    path: Path,
    *,
    metadata: Callable[[dict[str, str]], dict[str, str]] | None = None,
    tensors: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
    out: Path | None = None,
) -> Path:
    """Save a copy of a safetensors file (over it unless `out`) with its metadata and/or its
    tensors changed; changed tensors get checksums of their own, so the file is consistent in
    itself and the checks after the integrity check see the change."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from lmcore.model.saving import checksums_json

    with safe_open(str(path), "pt") as f:
        meta = dict(f.metadata())
    state = load_file(str(path))
    meta = metadata(meta) if metadata else meta
    if tensors:
        state = tensors(state)
        if "lmcore.checksums" in meta:
            meta["lmcore.checksums"] = checksums_json(state)
    out = out or path
    save_file(state, str(out), metadata=meta)
    return out


def edit(
    path: Path,
    out: Path,
    *,
    header: Callable[[dict[str, Any]], None] | None = None,
    data: Callable[[dict[str, Any], bytearray], None] | None = None,
) -> Path:
    """A copy of a safetensors file with its JSON header and/or its data bytes changed in
    place, the way a damaged disk or a hand edit changes them (checksums untouched)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    parsed, body = json.loads(raw[8 : 8 + n]), bytearray(raw[8 + n :])
    if header:
        header(parsed)
    if data:
        data(parsed, body)
    text = json.dumps(parsed).encode()
    text += b" " * (-len(text) % 8)
    out.write_bytes(struct.pack("<Q", len(text)) + text + bytes(body))
    return out


# The components and a norm of the tests' own, for the declarations of every component


def components() -> list[tuple[str, str]]:
    """Every registered model component (the recipe's kinds, optimizer and schedule, have a kit
    of their own), so newly installed plugins are tested without editing this."""
    return sorted(
        {(e.kind, e.name) for e in lmcore.get_registry().entries() if e.kind in lmcore.KINDS}
    )


def spec_for(kind: str, name: str) -> str:
    """cs336-tiny with the component `kind` `name`; skips one that has no default to build."""
    entry = next(e for e in lmcore.get_registry().entries(kind) if e.name == name)
    required = [a.name for a in entry.component.args if a.required]
    if required:
        pytest.skip(f"{kind} {name!r} needs argument(s) {', '.join(required)}: no default to build")
    qualified = f"{entry.provenance.qualifier}:{name}" if entry.status == "shadowed" else name
    return f"cs336-tiny, {kind}={qualified}"


class PlainNorm(torch.nn.Module):
    """An RMS norm in float32 for the tests' own components."""

    def __init__(
        self, d_model: int, device: torch.device | None = None, dtype: torch.dtype | None = None
    ):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 / torch.sqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight).to(
            x.dtype
        )

    def parameter_roles(self) -> dict[str, Role]:
        return {"weight": GAIN}


def non_finite_checkpoint(directory: Path) -> Path:
    """A checkpoint of `SMALL_SPEC` whose ln_final holds a NaN and lm_head two infs, saved so
    (its checksums agree): loading it warns, naming them."""
    model = lmcore.build_model(SMALL_SPEC)
    with torch.no_grad():
        model.ln_final.weight[3] = float("nan")
        model.lm_head.weight[0, :2] = float("inf")
    path: Path = model.save(directory / "nan.safetensors")
    return path


def nest_components(parsed: dict[str, Any]) -> None:
    """For `edit`'s header: a components table nested 50,000 deep, more than Python's JSON
    parser follows."""
    parsed["__metadata__"]["lmcore.components"] = "[" * 50_000 + "]" * 50_000
