"""Weight formats (`quant=...`): each targeted matrix stored quantized, multiplied through
torch's CPU kernels for quantized weights.

A torch kernel plugin: it calls torch's quantized matmuls (`torch._weight_int8pack_mm`,
`torch._weight_int4pack_mm_for_cpu`), not lmcore's from-scratch primitives. Rows of one table
(bytes per parameter for a matrix of 576 columns and a multiple of 64 rows):

======  ===================================================  ===========  ===============
format  stored                                               bytes/param  GGUF
======  ===================================================  ===========  ===============
int8    int8 codes, one float32 scale per row                1.01         (`--type q8_0`)
q8_0    int8 codes, a float16 d per 32 (GGML's Q8_0)         1.19         Q8_0, exactly
q4_0    4-bit codes, a float16 d per 32 (GGML's Q4_0)        0.66         Q4_0, exactly
q4_1    4-bit codes, float16 d and m per 32 (GGML's Q4_1)    0.69         Q4_1, exactly
======  ===================================================  ===========  ===============

Values are GGML's: int8 ``w = c·s``; q8_0 ``w = c·d``; q4_0 ``w = (c - 8)·d``; q4_1
``w = c·d + m``, with d and m kept in float16 as the file holds them, so `dequantize`, `rows`
and writing GGUF back are exact. The 4-bit codes are in torch's int4 layout (`pack4`; Q8_0's
codes as two 4-bit halves, ``c + 128 = 16·high + low``), so nothing is repacked at load. The
matmul goes through torch's kernels, which are fast on CPU with bfloat16 activations and
scales only (float32 ones take another, several times slower path): x and the kernel's scales
are rounded to bfloat16 there (a relative error of about 2⁻⁹ each, below GGML's own rounding
of x to 8 bits in its dot products). Their time grows with the rows of x as the float
matmul's does, and they read no dequantized copy, so they serve a prefill and an evaluation
too (int8: up to 32 rows). x that needs gradients (the kernels have no backward), and int8's
larger batches, are multiplied in float32 by the exactly dequantized matrix, in chunks of
rows. Traced by torch.compile, int8 multiplies one row of x (a decoding step's) as
``(codes · x).sum · scale`` in float32, which inductor turns into one pass over the codes on
every thread, faster at one row than the kernel; the 4-bit layouts so written were slower
than their kernel, and keep it. The kernel's scales are made on first use and
counted in the declaration. At inference the products that share an input (q, k and v; a gated
FFN's w1 and w3) run as one (`joined`: their rows stacked, the parts' tensors views of the
stack), one kernel call in place of three and two.

`lmcore quantize --int8` rounds as int8 does; `--int4` as Q4_1 (the gguf package's rounding,
byte for byte). The token embeddings (and a tied head) use the format `embedding=` names
(`same`: this one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import torch
from jaxtyping import Float
from torch import Tensor, nn

import lmcore
from lmcore.model.nn import realized
from lmcore.model.roles import SCALAR, Role

GROUP: Final = 32  # weights per scale in the block formats (GGML's QK8_0, QK4_0, QK4_1)
CHUNK: Final = 2048  # rows of W dequantized at a time for a larger batch
_PAD: Final = 64  # torch's int4 layout holds rows in blocks of 64


def _frozen(t: Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


def _padded(n: int) -> int:
    return -(-n // _PAD) * _PAD


def _half(t: Tensor) -> Tensor:
    """float16 bytes `(..., 2)` of a float16 tensor, as uint8 (GGML's `d` and `m`)."""
    return t.contiguous().view(torch.uint8).view(*t.shape, 2)


class _Format(nn.Module):
    """What every format shares: the widths, the forward through `_kernel` (bfloat16
    activations, as torch's fast CPU kernels take them) or the exactly dequantized matrix in
    float32 chunks (x that needs gradients), and the lookup of rows."""

    name: str = ""
    kernel_rows: int | None = None  # the most rows of x the kernel takes (None: any)
    fuses_row = False  # traced with one row of x, `_row` multiplies it (see Int8)

    def __init__(self, in_features: int, out_features: int, role: str):
        super().__init__()
        self.in_features, self.out_features, self.role = in_features, out_features, role
        self._cache: tuple[Tensor, ...] | None = None  # the kernel's scales, made on first use

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]:
        flat = x.reshape(-1, x.shape[-1])
        if self._kernel_takes(flat):
            if self.fuses_row and flat.shape[0] == 1 and torch.compiler.is_compiling():
                return self._row(flat.float()).reshape(*x.shape[:-1], -1).to(x.dtype)
            if self._cache is None or self._cache[0].device != flat.device:
                self._cache = self._kernel_scales()
            y = self._kernel(flat.to(torch.bfloat16), *self._cache).float()
        else:  # gradients to x: the float matmul of the exactly dequantized matrix
            flat = flat.float()
            y = torch.cat([flat @ self._dequantize(i, min(i + CHUNK, self.out_features)).T
                           for i in range(0, self.out_features, CHUNK)], dim=-1)  # fmt: skip
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def _kernel_takes(self, flat: Tensor) -> bool:
        """Whether torch's kernel multiplies `flat`: it has no backward, so not when x needs
        gradients; at most `kernel_rows` rows."""
        if flat.is_meta or (flat.requires_grad and torch.is_grad_enabled()):
            return False
        return self.kernel_rows is None or flat.shape[0] <= self.kernel_rows

    def joined(self, others: Sequence[_Format]) -> _Format | None:
        """One format of this type holding the rows of `self` and `others` stacked, for
        products that share their input (`lmcore.model.nn.join`): every tensor of a format is
        one per row, so the stack is each tensor's rows concatenated, and the parts' tensors
        become views of the stack (nothing held twice; their kernel scales are dropped, the
        stack makes its own). None when the parts differ in type, width or device, or a part's
        rows are padded (the 4-bit layouts hold rows in blocks of 64)."""
        parts = [self, *others]
        names = list(self._parameters)
        device = next(t.device for t in self.parameters(recurse=False))
        if device.type == "meta" or any(
            type(part) is not type(self)
            or part.in_features != self.in_features
            or list(part._parameters) != names
            or any(
                t is None or t.shape[0] != part.out_features or t.device != device
                for t in part._parameters.values()
            )
            for part in parts
        ):
            return None
        total = sum(part.out_features for part in parts)
        stack = type(self)(self.in_features, total, self.role, device="meta")
        for name in names:
            whole = torch.cat([getattr(part, name).detach() for part in parts])
            setattr(stack, name, _frozen(whole))
            start = 0
            for part in parts:  # the part's own tensor (its Parameter) now a view of the stack
                t = getattr(part, name)
                t.data = whole[start : start + part.out_features]
                start += part.out_features
        for part in parts:
            part._cache = None
        return stack

    def dequantize(self) -> Float[Tensor, "d_out d_in"]:
        return self._dequantize(0, self.out_features)

    def rows(self, ids: Tensor) -> Float[Tensor, "... d_in"]:
        flat = ids.reshape(-1)
        return self._rows(flat).reshape(*ids.shape, self.in_features)

    def kernel_bytes(self) -> int:
        """Bytes of the kernel's scales once made (counted in the format's declaration)."""
        return sum(t.numel() * t.element_size() for t in self._cache or ())

    def parameter_roles(self) -> dict[str, Role]:
        return {name: SCALAR for name, _ in self.named_parameters(recurse=False)}

    def extra_repr(self) -> str:
        return f"{self.name}, in_features={self.in_features}, out_features={self.out_features}"

    def _stored(self) -> None:
        self._cache = None  # new tensors: the kernel's scales are made again

    # each format's own
    def _kernel_scales(self) -> tuple[Tensor, ...]:
        raise NotImplementedError

    def _kernel(self, x: Tensor, *scales: Tensor) -> Tensor:
        raise NotImplementedError

    def _dequantize(self, start: int, stop: int) -> Tensor:
        raise NotImplementedError

    def _row(self, x: Float[Tensor, "1 d_in"]) -> Float[Tensor, " d_out"]:
        raise NotImplementedError

    def _rows(self, ids: Tensor) -> Tensor:
        raise NotImplementedError

    def quantize_(self, w: Float[Tensor, "d_out d_in"]) -> None:
        raise NotImplementedError


class Int8(_Format):
    """Per-row int8: ``w = codes · scale``, the scale ``max |w| / 127`` of the row."""

    name = "int8"
    fuses_row = True
    kernel_rows = 32  # from 64 rows on, the float matmul of the dequantized matrix is as fast

    def __init__(self, in_features: int, out_features: int, role: str, device: Any = None):
        super().__init__(in_features, out_features, role)
        self.codes = _frozen(torch.zeros(out_features, in_features, dtype=torch.int8,
                                         device=device))  # fmt: skip
        self.scales = _frozen(torch.ones(out_features, dtype=torch.float32, device=device))

    def _kernel_scales(self) -> tuple[Tensor, ...]:
        if self.codes.data_ptr() % 16:  # e.g. a view at a checkpoint's offset of the codes:
            # torch 2.13's `_weight_int8pack_mm` reads W with aligned 16-byte loads and crashes
            # (SIGSEGV) on batches of 4+ rows of any other W, so the codes get a copy of their own
            self.codes.data = self.codes.data.clone()
        return (self.scales.to(torch.bfloat16),)

    def _kernel(self, x: Tensor, *scales: Tensor) -> Tensor:
        return torch._weight_int8pack_mm(x, self.codes, scales[0])

    def _row(self, x: Float[Tensor, "1 d_in"]) -> Float[Tensor, " d_out"]:
        # one pass over the codes that inductor fuses (in float32: x and scales unrounded)
        return (self.codes.float() * realized(x)).sum(-1) * self.scales

    def _dequantize(self, start: int, stop: int) -> Tensor:
        return self.codes[start:stop].float() * self.scales[start:stop, None]

    def _rows(self, ids: Tensor) -> Tensor:
        return self.codes[ids].float() * self.scales[ids, None]

    def quantize_(self, w: Float[Tensor, "d_out d_in"]) -> None:
        w = w.detach().float()
        scale = w.abs().amax(dim=1) / 127
        inverse = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
        self.codes = _frozen(torch.round(w * inverse[:, None]).clamp(-127, 127).to(torch.int8))
        self.scales = _frozen(torch.where(scale > 0, scale, torch.ones_like(scale)))
        self._stored()


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


def pack4(codes: Tensor) -> Tensor:
    """4-bit codes `(N, K)` (0..15) in torch's int4 CPU layout: `(ceil(N / 64) * 64, K / 2)`
    bytes, each block of 64 rows `(K, 32)` bytes, row i of it in the low nibble and row
    32 + i in the high one (what `torch._convert_weight_to_int4pack_for_cpu` gives)."""
    n, k = codes.shape
    rows = _padded(n)
    padded = torch.zeros(rows, k, dtype=torch.uint8, device=codes.device)
    padded[:n] = codes.to(torch.uint8)
    blocks = padded.view(rows // _PAD, 2, 32, k)  # (block, nibble, row in half, k)
    packed = blocks[:, 0] | (blocks[:, 1] << 4)  # (block, 32, k)
    return packed.transpose(1, 2).contiguous().view(rows, k // 2)


def unpack4(packed: Tensor, ids: Tensor) -> Tensor:
    """The codes `(len(ids), K)` (uint8, 0..15) of rows `ids` of `pack4`'s layout."""
    rows, half = packed.shape
    view = packed.view(rows // _PAD, half * 2, 32)
    byte = view[ids // _PAD, :, ids % 32]  # (rows asked, K)
    return (byte >> (4 * ((ids % _PAD) // 32))[:, None]) & 15


def _sz(scale: Tensor, zero: Tensor, rows: int) -> Tensor:
    """`(K / 32, rows, 2)` bfloat16 `(s, z)` as torch's int4 kernel takes them (`w = (c - 8)·s
    + z`), padded rows zero."""
    sz = torch.zeros(scale.shape[1], rows, 2, dtype=torch.bfloat16, device=scale.device)
    sz[:, : scale.shape[0], 0] = scale.T
    sz[:, : scale.shape[0], 1] = zero.T
    return sz


def _int4(x: Tensor, codes: Tensor, sz: Tensor) -> Tensor:
    return torch._weight_int4pack_mm_for_cpu(x, codes, GROUP, sz)


class Q8_0(_Format):
    """GGML's Q8_0: ``w = c·d``, one float16 d per 32 weights of a row. The codes are held as
    two 4-bit halves in torch's int4 layout, ``c + 128 = 16·high + low``, so the matmul is two
    of torch's int4 kernels sharing one ``(s, z) = (d, 8d/17)``: ``16·((high - 8)·d + z)``
    plus ``(low - 8)·d + z`` is ``(16·high + low - 136)·d + 17z``, which is ``c·d``."""

    name = "q8_0"

    def __init__(self, in_features: int, out_features: int, role: str, device: Any = None):
        super().__init__(in_features, out_features, role)
        rows, half = _padded(out_features), in_features // 2
        self.high = _frozen(torch.zeros(rows, half, dtype=torch.uint8, device=device))
        self.low = _frozen(torch.zeros(rows, half, dtype=torch.uint8, device=device))
        self.scales = _frozen(torch.zeros(out_features, in_features // GROUP,
                                          dtype=torch.float16, device=device))  # fmt: skip

    def _codes(self, ids: Tensor) -> Tensor:
        return 16 * unpack4(self.high, ids).int() + unpack4(self.low, ids).int() - 128

    def store(self, codes: Tensor, d: Tensor) -> None:
        """Keep int8 codes `(N, K)` and float16 `d` `(N, K / 32)`."""
        biased = codes.to(torch.int8).view(torch.uint8) ^ 128  # c + 128, in one byte
        self.high = _frozen(pack4(biased >> 4))
        self.low = _frozen(pack4(biased & 15))
        self.scales = _frozen(d.to(torch.float16))
        self._stored()

    def _kernel_scales(self) -> tuple[Tensor, ...]:
        d = self.scales.float()
        return (_sz(d, d * (8 / 17), self.high.shape[0]),)

    def _kernel(self, x: Tensor, *scales: Tensor) -> Tensor:
        high, low = _int4(x, self.high, scales[0]), _int4(x, self.low, scales[0])
        return (16 * high.float() + low.float())[:, : self.out_features]

    def _expand(self, codes: Tensor, d: Tensor) -> Tensor:
        c = codes.float().view(codes.shape[0], -1, GROUP)
        return (c * d.float()[..., None]).view(codes.shape[0], -1)

    def _dequantize(self, start: int, stop: int) -> Tensor:
        ids = torch.arange(start, stop, device=self.scales.device)
        return self._expand(self._codes(ids), self.scales[start:stop])

    def _rows(self, ids: Tensor) -> Tensor:
        return self._expand(self._codes(ids), self.scales[ids])

    def from_ggml(self, kind: str, raw: Tensor) -> None:
        """Keep GGUF Q8_0 rows `(N, K / 32 · 34)` bytes: a float16 d, then 32 int8."""
        blocks = _blocks(self, kind, "Q8_0", raw, 34)
        d = blocks[..., :2].contiguous().view(torch.float16).squeeze(-1)
        codes = blocks[..., 2:].contiguous().view(torch.int8)
        self.store(codes.view(self.out_features, -1), d)

    def to_ggml(self) -> tuple[str, Tensor]:
        """The rows as GGUF Q8_0 bytes, `(N, K / 32 · 34)`."""
        n = self.out_features
        codes = self._codes(torch.arange(n, device=self.scales.device)).to(torch.int8)
        qs = codes.view(torch.uint8).view(n, -1, GROUP)
        return "Q8_0", torch.cat([_half(self.scales.data), qs], dim=-1).view(n, -1)

    def quantize_(self, w: Float[Tensor, "d_out d_in"]) -> None:
        blocks = w.detach().float().view(self.out_features, -1, GROUP)
        d = blocks.abs().amax(dim=-1) / 127
        inverse = torch.where(d > 0, 1 / d, torch.zeros_like(d))
        self.store(torch.round(blocks * inverse[..., None]).view_as(w), d)


class _Four(_Format):
    """The 4-bit formats: codes in `pack4`'s layout, float16 d (and m) per 32 weights as GGML
    keeps them; the kernel's bfloat16 ``(s, z)`` with ``s = d`` and ``z = 0`` (Q4_0: ``w =
    (c - 8)·d``) or ``m + 8d`` (Q4_1: ``w = c·d + m``)."""

    ggml: str = ""

    def __init__(self, in_features: int, out_features: int, role: str, device: Any = None):
        super().__init__(in_features, out_features, role)
        groups = in_features // GROUP
        self.codes = _frozen(torch.zeros(_padded(out_features), in_features // 2,
                                         dtype=torch.uint8, device=device))  # fmt: skip
        self.scales = _frozen(torch.zeros(out_features, groups, dtype=torch.float16,
                                          device=device))  # fmt: skip
        if self.ggml == "Q4_1":
            self.mins = _frozen(torch.zeros(out_features, groups, dtype=torch.float16,
                                            device=device))  # fmt: skip

    def _zero(self, d: Tensor, ids: Tensor | slice) -> Tensor:
        """The value of code 8 per block: 0 (Q4_0), m + 8d (Q4_1)."""
        if self.ggml == "Q4_0":
            return torch.zeros_like(d)
        return self.mins[ids].float() + 8 * d

    def _kernel_scales(self) -> tuple[Tensor, ...]:
        d = self.scales.float()
        return (_sz(d, self._zero(d, slice(None)), self.codes.shape[0]),)

    def _kernel(self, x: Tensor, *scales: Tensor) -> Tensor:
        return _int4(x, self.codes, scales[0])[:, : self.out_features]

    def _expand(self, ids: Tensor) -> Tensor:
        d = self.scales[ids].float()
        c = unpack4(self.codes, ids).float().view(len(ids), -1, GROUP)
        if self.ggml == "Q4_0":
            return ((c - 8) * d[..., None]).view(len(ids), -1)
        return (c * d[..., None] + self.mins[ids].float()[..., None]).view(len(ids), -1)

    def _dequantize(self, start: int, stop: int) -> Tensor:
        return self._expand(torch.arange(start, stop, device=self.codes.device))

    def _rows(self, ids: Tensor) -> Tensor:
        return self._expand(ids)

    def store(self, codes: Tensor, d: Tensor, m: Tensor | None) -> None:
        """Keep codes `(N, K)` and float16 `d` (and `m`) `(N, K / 32)`."""
        self.codes = _frozen(pack4(codes))
        self.scales = _frozen(d.to(torch.float16))
        if m is not None:
            self.mins = _frozen(m.to(torch.float16))
        self._stored()

    def from_ggml(self, kind: str, raw: Tensor) -> None:
        """Keep GGUF Q4_0 / Q4_1 rows: per 32 weights a float16 d (and m), then 16 bytes,
        weight j in the low nibble of byte j and weight 16 + j in the high one."""
        size = 18 if self.ggml == "Q4_0" else 20
        blocks = _blocks(self, kind, self.ggml, raw, size)
        d = blocks[..., :2].contiguous().view(torch.float16).squeeze(-1)
        qs = blocks[..., size - 16 :]
        codes = torch.cat([qs & 15, qs >> 4], dim=-1).view(self.out_features, -1)
        m = blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1)
        self.store(codes, d, m if self.ggml == "Q4_1" else None)

    def to_ggml(self) -> tuple[str, Tensor]:
        """The rows as GGUF bytes of this format's type, `(N, K / 32 · 18 or 20)`."""
        n = self.out_features
        codes = unpack4(self.codes.data, torch.arange(n, device=self.codes.device))
        codes = codes.view(n, -1, GROUP)
        qs = codes[..., :16] | (codes[..., 16:] << 4)
        head = [_half(self.scales.data)]
        if self.ggml == "Q4_1":
            head.append(_half(self.mins.data))
        return self.ggml, torch.cat([*head, qs.to(torch.uint8)], dim=-1).view(n, -1)

    def blocks_of(self, w: Tensor) -> Tensor:
        return w.detach().float().view(self.out_features, -1, GROUP)


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
        self.store(codes.view_as(w), d, None)


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
        self.store(codes.view_as(w), d, low)


@dataclass(frozen=True)
class _Row:
    module: Callable[..., _Format]
    help: str
    bytes: Callable[[int, int], int]  # (in_features, out_features) -> bytes stored


def _int8_bytes(k: int, n: int) -> int:
    return n * k + 4 * n + 2 * n  # codes, float32 scales, the kernel's bfloat16 ones


def _q8_bytes(k: int, n: int) -> int:
    groups = k // GROUP  # two 4-bit halves, float16 d, the kernel's bfloat16 (s, z)
    return _padded(n) * k + 2 * n * groups + groups * _padded(n) * 2 * 2


def _four_bytes(mins: bool) -> Callable[[int, int], int]:
    def stored(k: int, n: int) -> int:
        groups = k // GROUP  # codes, float16 d (and m), the kernel's bfloat16 (s, z)
        return (
            _padded(n) * k // 2
            + (2 if mins else 1) * 2 * n * groups
            + (groups * _padded(n) * 2 * 2)
        )

    return stored


FORMATS: Final[Mapping[str, _Row]] = {
    "int8": _Row(Int8, "int8 weights, one float32 scale per row (torch._weight_int8pack_mm)",
                 _int8_bytes),
    "q8_0": _Row(Q8_0, "GGML's Q8_0: int8 weights, a float16 scale per 32 (GGUF Q8_0 kept "
                 "as it is)", _q8_bytes),
    "q4_0": _Row(Q4_0, "GGML's Q4_0: 4-bit weights, a scale per 32 "
                 "(torch._weight_int4pack_mm_for_cpu)", _four_bytes(False)),
    "q4_1": _Row(Q4_1, "GGML's Q4_1: 4-bit weights, a scale and a zero per 32 "
                 "(torch._weight_int4pack_mm_for_cpu); lmcore quantize --int4", _four_bytes(True)),
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
            stored=_bytes(name),
            args=(
                lmcore.Arg(
                    "embedding",
                    str,
                    "same",
                    "the format of the token embeddings (and a tied head); same: this one",
                    choices=_EMBEDDING,
                ),
            ),
            help=row.help,
        )
        for name, row in FORMATS.items()
    ]
