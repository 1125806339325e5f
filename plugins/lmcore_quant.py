"""Weight formats (`quant=...`): each targeted matrix stored quantized, multiplied through
torch's CPU kernels for quantized weights.

A torch kernel plugin: it calls torch's quantized matmuls (`torch._weight_int8pack_mm`,
`torch._weight_int4pack_mm_for_cpu`), not lmcore's from-scratch primitives. Rows of one table:

======  =================================================  ============  =================
format  stored                                             bytes/param   GGUF
======  =================================================  ============  =================
int8    int8 codes, one float32 scale per row              1 + 4/K       (`--type q8_0`)
q8_0    int8 codes, one float16 scale per 32               1.0625        Q8_0, exactly
q4_0    4-bit codes, a scale per 32 (and a zero, 0)        0.75          Q4_0, exactly
q4_1    4-bit codes, a scale and a zero per 32             0.75          Q4_1, exactly
======  =================================================  ============  =================

Values: int8 ``w = c·s``; q8_0 ``w = c·d``; q4_0 ``w = (c - 8)·d`` and q4_1 ``w = c·d + m``
(GGML's formulas), held as torch's int4 kernel takes them: ``w = (c - 8)·s + z`` with
``s = d`` and ``z = 0`` (q4_0) or ``m + 8d`` (q4_1, in float32; reading a GGUF file checks
that ``z - 8d`` gives ``m`` back, so writing it again loses nothing). The 4-bit codes are in
the kernel's own layout (rows padded to 64: each block of 64 rows is ``(K, 32)`` bytes, row
``i`` in the low nibble, row ``32 + i`` in the high one), so nothing is repacked at load.
`lmcore quantize --int8` rounds as int8 does; `--int4` as Q4_1 (groups of 32, a scale and a
zero each). A batch of more than `KERNEL_ROWS` rows (a prompt's prefill) is multiplied by the
dequantized matrix instead, in chunks of rows: torch's quantized kernels are made for a few
rows at a time.

The token embeddings (and a tied head) use the format `embedding=` names (`same`: this one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import torch
from jaxtyping import Float
from torch import Tensor, nn

import lmcore
from lmcore.model.roles import SCALAR, Role

GROUP: Final = 32  # weights per scale in the block formats (GGML's QK8_0, QK4_0, QK4_1)
KERNEL_ROWS: Final = 8  # at most this many rows of x go through torch's quantized kernels
CHUNK: Final = 2048  # rows of W dequantized at a time for a larger batch
_PAD: Final = 64  # torch's int4 layout holds rows in blocks of 64


def _frozen(t: Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


def _flat(x: Tensor) -> Tensor:
    return x.reshape(-1, x.shape[-1]).float()


class _Format(nn.Module):
    """What every format shares: the widths, the forward through `_kernel` or the dequantized
    matrix, and the lookup of rows."""

    name: str = ""

    def __init__(self, in_features: int, out_features: int, role: str):
        super().__init__()
        self.in_features, self.out_features, self.role = in_features, out_features, role

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]:
        flat = _flat(x)
        if flat.shape[0] <= KERNEL_ROWS and not flat.is_meta:
            y = self._kernel(flat)
        else:  # a prefill: compute-bound, so the float matmul of dequantized chunks is faster
            y = torch.cat([flat @ self._dequantize(i, min(i + CHUNK, self.out_features)).T
                           for i in range(0, self.out_features, CHUNK)], dim=-1)  # fmt: skip
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def dequantize(self) -> Float[Tensor, "d_out d_in"]:
        return self._dequantize(0, self.out_features)

    def rows(self, ids: Tensor) -> Float[Tensor, "... d_in"]:
        flat = ids.reshape(-1)
        return self._rows(flat).reshape(*ids.shape, self.in_features)

    def parameter_roles(self) -> dict[str, Role]:
        return {name: SCALAR for name, _ in self.named_parameters(recurse=False)}

    def extra_repr(self) -> str:
        return f"{self.name}, in_features={self.in_features}, out_features={self.out_features}"

    # each format's own
    def _kernel(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def _dequantize(self, start: int, stop: int) -> Tensor:
        raise NotImplementedError

    def _rows(self, ids: Tensor) -> Tensor:
        raise NotImplementedError

    def quantize_(self, w: Float[Tensor, "d_out d_in"]) -> None:
        raise NotImplementedError


class Int8(_Format):
    """Per-row int8: ``w = codes · scale``, the scale ``max |w| / 127`` of the row."""

    name = "int8"

    def __init__(self, in_features: int, out_features: int, role: str, device: Any = None):
        super().__init__(in_features, out_features, role)
        self.codes = _frozen(torch.zeros(out_features, in_features, dtype=torch.int8,
                                         device=device))  # fmt: skip
        self.scales = _frozen(torch.ones(out_features, dtype=torch.float32, device=device))

    def _kernel(self, x: Tensor) -> Tensor:
        return torch._weight_int8pack_mm(x, self.codes, self.scales)

    def _dequantize(self, start: int, stop: int) -> Tensor:
        return self.codes[start:stop].float() * self.scales[start:stop, None]

    def _rows(self, ids: Tensor) -> Tensor:
        return self.codes[ids].float() * self.scales[ids, None]

    def quantize_(self, w: Float[Tensor, "d_out d_in"]) -> None:
        w = w.detach().float().to(self.codes.device)
        scale = w.abs().amax(dim=1) / 127
        inverse = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
        self.codes.data = torch.round(w * inverse[:, None]).clamp(-127, 127).to(torch.int8)
        self.scales.data = torch.where(scale > 0, scale, torch.ones_like(scale))


def _blocks(module: _Format, kind: str, want: str, raw: Tensor, size: int) -> Tensor:
    """GGUF rows `raw` (uint8) as `(N, K / 32, size)` blocks, or ValueError naming the type
    or the length that is wrong."""
    if kind != want:
        raise ValueError(f"{module.name} keeps GGUF {want} blocks, not {kind}")
    n, k = module.out_features, module.in_features
    expected = (n, k // GROUP * size)
    if raw.dtype != torch.uint8 or tuple(raw.shape) != expected:
        raise ValueError(
            f"GGUF {want} rows of {k} weights take {expected[1]} bytes each ({n} rows), got "
            f"{tuple(raw.shape)} {raw.dtype}: the tensor's data is damaged or of another type"
        )
    return raw.view(n, k // GROUP, size)


class Q8_0(_Format):
    """GGML's Q8_0: ``w = codes · d``, one float16 d per 32 weights of a row."""

    name = "q8_0"

    def __init__(self, in_features: int, out_features: int, role: str, device: Any = None):
        super().__init__(in_features, out_features, role)
        groups = in_features // GROUP
        self.codes = _frozen(torch.zeros(out_features, in_features, dtype=torch.int8,
                                         device=device))  # fmt: skip
        self.scales = _frozen(torch.zeros(out_features, groups, dtype=torch.float16,
                                          device=device))  # fmt: skip

    def _kernel(self, x: Tensor) -> Tensor:
        # torch's int8 kernel takes one scale per row, not per 32: dequantize in chunks
        return torch.cat([x @ self._dequantize(i, min(i + CHUNK, self.out_features)).T
                          for i in range(0, self.out_features, CHUNK)], dim=-1)  # fmt: skip

    def _dequantize(self, start: int, stop: int) -> Tensor:
        codes = self.codes[start:stop].float().view(stop - start, -1, GROUP)
        return (codes * self.scales[start:stop, :, None].float()).view(stop - start, -1)

    def _rows(self, ids: Tensor) -> Tensor:
        codes = self.codes[ids].float().view(len(ids), -1, GROUP)
        return (codes * self.scales[ids][:, :, None].float()).view(len(ids), -1)

    def from_ggml(self, kind: str, raw: Tensor) -> None:
        """Keep GGUF Q8_0 rows `(N, K / 32 · 34)` bytes as they are: a float16 d, 32 int8."""
        blocks = _blocks(self, kind, "Q8_0", raw, 34)
        self.scales.data = blocks[..., :2].contiguous().view(torch.float16).squeeze(-1)
        self.codes.data = blocks[..., 2:].contiguous().view(torch.int8).view(self.out_features, -1)

    def to_ggml(self) -> tuple[str, Tensor]:
        """The rows as GGUF Q8_0 bytes, `(N, K / 32 · 34)`."""
        d = self.scales.data.contiguous().view(torch.uint8).view(self.out_features, -1, 2)
        qs = self.codes.data.view(torch.uint8).view(self.out_features, -1, GROUP)
        return "Q8_0", torch.cat([d, qs], dim=-1).view(self.out_features, -1)

    def quantize_(self, w: Float[Tensor, "d_out d_in"]) -> None:
        blocks = w.detach().float().to(self.codes.device).view(self.out_features, -1, GROUP)
        d = blocks.abs().amax(dim=-1) / 127
        inverse = torch.where(d > 0, 1 / d, torch.zeros_like(d))
        self.codes.data = torch.round(blocks * inverse[..., None]).to(torch.int8).view_as(w)
        self.scales.data = d.to(torch.float16)


def pack4(codes: Tensor) -> Tensor:
    """4-bit codes `(N, K)` (0..15) in torch's int4 CPU layout: `(ceil(N / 64) * 64, K / 2)`
    bytes, each block of 64 rows `(K, 32)` bytes, row i of it in the low nibble and row
    32 + i in the high one (what `torch._convert_weight_to_int4pack_for_cpu` gives)."""
    n, k = codes.shape
    rows = -(-n // _PAD) * _PAD
    padded = torch.zeros(rows, k, dtype=torch.uint8, device=codes.device)
    padded[:n] = codes.to(torch.uint8)
    blocks = padded.view(rows // _PAD, 2, 32, k)  # (block, nibble, row in half, k)
    packed = blocks[:, 0] | (blocks[:, 1] << 4)  # (block, 32, k)
    return packed.transpose(1, 2).contiguous().view(rows, k // 2)


def unpack4(packed: Tensor, n: int, start: int = 0, stop: int | None = None) -> Tensor:
    """The codes `(stop - start, K)` (uint8, 0..15) of rows `start:stop` of `pack4`'s layout
    (rows of `n`)."""
    stop = n if stop is None else stop
    rows, half = packed.shape
    k = half * 2
    view = packed.view(rows // _PAD, k, 32)
    ids = torch.arange(start, stop, device=packed.device)
    byte = view[ids // _PAD, :, ids % 32]  # (rows asked, K)
    return (byte >> (4 * ((ids % _PAD) // 32))[:, None]) & 15


class _Four(_Format):
    """The 4-bit formats: codes in `pack4`'s layout, `(s, z)` per 32 as torch's kernel takes
    them, float32 `(K / 32, rows, 2)`; ``w = (c - 8)·s + z``."""

    def __init__(self, in_features: int, out_features: int, role: str, device: Any = None):
        super().__init__(in_features, out_features, role)
        rows = -(-out_features // _PAD) * _PAD
        self.codes = _frozen(torch.zeros(rows, in_features // 2, dtype=torch.uint8,
                                         device=device))  # fmt: skip
        self.scale_zero = _frozen(torch.zeros(in_features // GROUP, rows, 2,
                                              dtype=torch.float32, device=device))  # fmt: skip

    def _kernel(self, x: Tensor) -> Tensor:
        y = torch._weight_int4pack_mm_for_cpu(x, self.codes, GROUP, self.scale_zero)
        return y[:, : self.out_features]

    def _expand(self, codes: Tensor, rows: Tensor | slice) -> Tensor:
        sz = self.scale_zero[:, rows].transpose(0, 1)  # (rows, K / 32, 2)
        c = codes.float().view(codes.shape[0], -1, GROUP) - 8
        return (c * sz[..., :1] + sz[..., 1:]).view(codes.shape[0], -1)

    def _dequantize(self, start: int, stop: int) -> Tensor:
        codes = unpack4(self.codes, self.out_features, start, stop)
        return self._expand(codes, slice(start, stop))

    def _rows(self, ids: Tensor) -> Tensor:
        rows, half = self.codes.shape
        view = self.codes.view(rows // _PAD, half * 2, 32)
        byte = view[ids // _PAD, :, ids % 32]
        codes = (byte >> (4 * ((ids % _PAD) // 32))[:, None]) & 15
        return self._expand(codes, ids)

    def store(self, codes: Tensor, d: Tensor, zero: Tensor) -> None:
        """Keep codes `(N, K)` and float32 `d`, `zero` `(N, K / 32)` (padded rows: zeros)."""
        self.codes.data = pack4(codes)
        sz = torch.zeros_like(self.scale_zero)
        sz[:, : self.out_features, 0] = d.T
        sz[:, : self.out_features, 1] = zero.T
        self.scale_zero.data = sz

    def from_ggml(self, kind: str, raw: Tensor) -> None:
        """Keep GGUF Q4_0 / Q4_1 rows as they are: per 32 weights a float16 d (and m), then
        16 bytes, weight j in the low nibble of byte j and weight 16 + j in the high one."""
        size = 18 if self.ggml == "Q4_0" else 20
        blocks = _blocks(self, kind, self.ggml, raw, size)
        d = blocks[..., :2].contiguous().view(torch.float16).squeeze(-1).float()
        qs = blocks[..., size - 16:]
        codes = torch.cat([qs & 15, qs >> 4], dim=-1).view(self.out_features, -1)
        if self.ggml == "Q4_0":
            self.store(codes, d, torch.zeros_like(d))
            return
        m16 = blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1)
        zero = m16.float() + 8 * d
        if not torch.equal((zero - 8 * d).to(torch.float16), m16):  # kept exact, or refused
            raise ValueError(
                "a block's m + 8·d does not hold m exactly in float32 (m is tiny beside d), so "
                "it cannot be kept quantized without loss"
            )
        self.store(codes, d, zero)

    def to_ggml(self) -> tuple[str, Tensor]:
        """The rows as GGUF bytes of this format's type, `(N, K / 32 · 18 or 20)`."""
        n = self.out_features
        codes = unpack4(self.codes.data, n).view(n, -1, GROUP)
        sz = self.scale_zero.data[:, :n].transpose(0, 1)
        d = sz[..., 0]
        qs = codes[..., :16] | (codes[..., 16:] << 4)
        parts = [d.to(torch.float16)]
        if self.ggml == "Q4_1":
            parts.append((sz[..., 1] - 8 * d).to(torch.float16))
        head = [p.contiguous().view(torch.uint8).view(n, -1, 2) for p in parts]
        return self.ggml, torch.cat([*head, qs.to(torch.uint8)], dim=-1).view(n, -1)

    def blocks_of(self, w: Tensor) -> Tensor:
        return w.detach().float().to(self.codes.device).view(self.out_features, -1, GROUP)


class Q4_0(_Four):
    """GGML's Q4_0: ``w = (c - 8)·d``, d = the block's value of largest magnitude / -8."""

    name = "q4_0"
    ggml = "Q4_0"

    def quantize_(self, w: Float[Tensor, "d_out d_in"]) -> None:
        blocks = self.blocks_of(w)
        biggest = blocks.gather(-1, blocks.abs().argmax(dim=-1, keepdim=True)).squeeze(-1)
        d = biggest / -8
        inverse = torch.where(d != 0, 1 / d, torch.zeros_like(d))
        codes = torch.trunc(blocks * inverse[..., None] + 8.5).clamp(0, 15)
        d16 = d.to(torch.float16).float()
        self.store(codes.view_as(w), d16, torch.zeros_like(d16))


class Q4_1(_Four):
    """GGML's Q4_1: ``w = c·d + m``, m the block's least value, d its range / 15."""

    name = "q4_1"
    ggml = "Q4_1"

    def quantize_(self, w: Float[Tensor, "d_out d_in"]) -> None:
        blocks = self.blocks_of(w)
        low, high = blocks.amin(dim=-1), blocks.amax(dim=-1)
        d = (high - low) / 15
        inverse = torch.where(d != 0, 1 / d, torch.zeros_like(d))
        codes = torch.trunc((blocks - low[..., None]) * inverse[..., None] + 0.5).clamp(0, 15)
        d16, m16 = d.to(torch.float16).float(), low.to(torch.float16).float()
        self.store(codes.view_as(w), d16, m16 + 8 * d16)


@dataclass(frozen=True)
class _Row:
    module: type[_Format]
    help: str
    bytes: Callable[[int, int], int]  # (in_features, out_features) -> bytes stored


def _four_bytes(k: int, n: int) -> int:
    rows = -(-n // _PAD) * _PAD
    return rows * k // 2 + (k // GROUP) * rows * 2 * 4


FORMATS: Final[Mapping[str, _Row]] = {
    "int8": _Row(Int8, "int8 weights, one float32 scale per row (torch._weight_int8pack_mm)",
                 lambda k, n: n * k + 4 * n),
    "q8_0": _Row(Q8_0, "GGML's Q8_0: int8 weights, a float16 scale per 32 (GGUF Q8_0 kept "
                 "as it is)", lambda k, n: n * k + 2 * n * (k // GROUP)),
    "q4_0": _Row(Q4_0, "GGML's Q4_0: 4-bit weights, a scale per 32 "
                 "(torch._weight_int4pack_mm_for_cpu)", _four_bytes),
    "q4_1": _Row(Q4_1, "GGML's Q4_1: 4-bit weights, a scale and a zero per 32 "
                 "(torch._weight_int4pack_mm_for_cpu); lmcore quantize --int4", _four_bytes),
}  # fmt: skip
_EMBEDDING: Final = ("same", *FORMATS)


def _chosen(name: str, role: str, embedding: str) -> str:
    return name if role != "embedding" or embedding == "same" else embedding


def _factory(name: str) -> Callable[..., nn.Module]:
    def build(in_features: int, out_features: int, role: str, embedding: str = "same",
              device: Any = None) -> nn.Module:  # fmt: skip
        chosen = _chosen(name, role, embedding)
        if chosen != "int8" and in_features % GROUP:
            raise ValueError(
                f"{chosen} stores blocks of {GROUP} weights of a row, and this matrix's rows "
                f"have {in_features}; use int8 (one scale per row)"
            )
        return FORMATS[chosen].module(in_features, out_features, role, device=device)

    build.__name__ = f"build_{name}"
    return build


def _bytes(name: str) -> Callable[..., int]:
    def stored(in_features: int, out_features: int, role: str, embedding: str = "same") -> int:
        return FORMATS[_chosen(name, role, embedding)].bytes(in_features, out_features)

    return stored


@lmcore.hookimpl
def lmcore_components() -> list[lmcore.Component]:
    return [
        lmcore.Component(
            kind="quant",
            name=name,
            build=_factory(name),
            params=lambda: 0,  # the matrix's count is its weight's; the format adds none
            flops=lambda: 0,
            buffers=_bytes(name),
            args=(lmcore.Arg("embedding", str, "same", "the format of the token embeddings "
                             "(and a tied head); same: this one", choices=_EMBEDDING),),
            help=row.help,
        )
        for name, row in FORMATS.items()
    ]
