"""The weight formats of `lmcore_quant`: GGML's blocks decoded as the gguf package decodes
them, rounded as its quantizer rounds, written back byte for byte; torch's kernels against
an independent dequantize formula; torch's int4 layout."""

from __future__ import annotations

import pytest
import torch

import lmcore_quant as Q
from tests.helpers.compiling import GraphRecorder

gguf = pytest.importorskip("gguf")

N, K = 96, 128  # 96 rows: not a multiple of the int4 layout's 64, so padding is exercised


def _weights() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, K, generator=g)


def _reference(fmt: str, raw: object) -> torch.Tensor:
    """GGML's own dequantize formula, written out here on the block bytes."""
    raw_t = torch.from_numpy(raw)  # type: ignore[arg-type]
    size = {"q8_0": 34, "q4_0": 18, "q4_1": 20}[fmt]
    b = raw_t.view(N, K // 32, size)
    d = b[..., :2].contiguous().view(torch.float16).float()  # (N, G, 1)
    if fmt == "q8_0":
        return (b[..., 2:].contiguous().view(torch.int8).float() * d).view(N, K)
    qs = b[..., size - 16 :].int()
    q = torch.cat([qs & 15, qs >> 4], dim=-1).float()
    if fmt == "q4_0":
        return ((q - 8) * d).view(N, K)
    m = b[..., 2:4].contiguous().view(torch.float16).float()
    return (q * d + m).view(N, K)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1"])
def test_blocks_decode_as_gguf_and_write_back_byte_identical(fmt: str) -> None:
    kind = gguf.GGMLQuantizationType[fmt.upper()]
    raw = gguf.quants.quantize(_weights().numpy(), kind)
    theirs = torch.from_numpy(gguf.quants.dequantize(raw, kind))
    assert torch.equal(_reference(fmt, raw), theirs)  # the formula above is GGML's
    m = Q.FORMATS[fmt].module(K, N, "matrix")
    m.from_ggml(fmt.upper(), torch.from_numpy(raw))
    assert torch.equal(m.dequantize(), theirs)
    assert torch.equal(m.rows(torch.tensor([0, 33, 95])), theirs[[0, 33, 95]])
    name, back = m.to_ggml()
    assert name == fmt.upper() and torch.equal(back, torch.from_numpy(raw))
    fresh = Q.FORMATS[fmt].module(K, N, "matrix")
    fresh.quantize_(_weights())  # lmcore's rounding is the gguf package's, byte for byte
    assert torch.equal(fresh.to_ggml()[1], torch.from_numpy(raw))


@pytest.mark.parametrize("fmt", ["int8", "q8_0", "q4_0", "q4_1"])
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 20, 300])
def test_matmul_matches_the_dequantized_matrix(fmt: str, rows: int) -> None:
    """Up to the format's kernel_rows (any, but int8's 32), torch's kernels with bfloat16 x
    and scales, within bfloat16's rounding of the float64 product; more, the float32 product
    of the exact matrix."""
    m = Q.FORMATS[fmt].module(K, N, "matrix")
    m.quantize_(_weights())
    w = m.dequantize()
    x = torch.randn(2, rows, K, generator=torch.Generator().manual_seed(1))
    ref = (x.double() @ w.double().T).float()
    if m.kernel_rows is not None and 2 * rows > m.kernel_rows:  # the exact float32 path
        torch.testing.assert_close(m(x), ref, rtol=1e-5, atol=1e-4)
        return
    scale = ref.abs().max()
    assert (m(x) - ref).abs().max() <= 2e-2 * scale  # bfloat16: 8 bits of mantissa
    assert (m(x) - ref).abs().max() > 0  # the kernel ran, not the float path


@pytest.mark.parametrize("fmt", ["int8", "q8_0", "q4_0", "q4_1"])
def test_a_traced_row_of_int8_is_one_float32_pass_over_the_codes(
    fmt: str, traced: GraphRecorder
) -> None:
    """Under torch.compile, int8 multiplies one row of x as a product of the codes inductor
    fuses (float32: within float32's rounding of the exact product, closer than the kernel's
    bfloat16); more rows, and the other formats, call torch's kernel."""
    m = Q.FORMATS[fmt].module(K, N, "matrix")
    m.quantize_(_weights())
    ref_w = m.dequantize().double()
    xs = [torch.randn(1, 1, K, generator=torch.Generator().manual_seed(2)), torch.randn(1, 3, K)]
    with torch.no_grad():
        m(xs[1])  # the kernel's scales, made eagerly as compile_decoding's first step does
        compiled = torch.compile(m, backend=traced, fullgraph=True)
        ys = [compiled(x) for x in xs]
    kernels = [
        sum("int8pack" in str(n.target) or "int4pack" in str(n.target) for n in gm.graph.nodes)
        for gm in traced.graphs
    ]
    fused, calls = fmt == "int8", 2 if fmt == "q8_0" else 1  # q8_0: two int4 halves
    assert kernels == ([0, calls] if fused else [calls, calls])
    for x, y in zip(xs, ys, strict=True):
        ref = (x.double() @ ref_w.T).float()
        error = (y - ref).abs().max() / ref.abs().max()
        assert error <= (1e-6 if fused and x.shape[1] == 1 else 2e-2), (x.shape, error)


@pytest.mark.parametrize("fmt", ["int8", "q8_0", "q4_0", "q4_1"])
def test_x_that_needs_gradients_takes_the_exact_float_path(fmt: str) -> None:
    """The kernels have no backward: x with requires_grad gets the float32 product of the
    exactly dequantized matrix, and its gradient is that matrix's."""
    m = Q.FORMATS[fmt].module(K, N, "matrix")
    m.quantize_(_weights())
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(5), requires_grad=True)
    y = m(x)
    torch.testing.assert_close(y, x.detach() @ m.dequantize().T, rtol=1e-5, atol=1e-5)
    y.sum().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, m.dequantize().sum(0).expand(3, K), rtol=1e-5,
                               atol=1e-4)  # fmt: skip
    with torch.no_grad():  # no gradients wanted: the kernel, bfloat16's rounding
        assert (m(x) - y.detach()).abs().max() > 0


def test_kernel_columns_not_a_multiple_of_64() -> None:
    k = 96
    w = torch.randn(N, k, generator=torch.Generator().manual_seed(3))
    for fmt in ("q8_0", "q4_1"):
        m = Q.FORMATS[fmt].module(k, N, "matrix")
        m.quantize_(w)
        x = torch.randn(1, k, generator=torch.Generator().manual_seed(4))
        ref = x @ m.dequantize().T
        assert (m(x) - ref).abs().max() <= 2e-2 * ref.abs().max()


def test_int8_rounds_each_row_to_its_largest_magnitude() -> None:
    w = _weights()
    m = Q.FORMATS["int8"].module(K, N, "matrix")
    m.quantize_(w)
    scale = w.abs().amax(dim=1) / 127
    assert torch.equal(m.scales, scale)
    assert torch.equal(m.codes, torch.round(w / scale[:, None]).to(torch.int8))
    assert (m.dequantize() - w).abs().max() <= scale.max() / 2 + 1e-6


def test_int8_codes_at_an_unaligned_address_get_their_own_copy() -> None:
    # A checkpoint's tensors are views at the file's offsets; torch's int8 kernel crashes
    # (SIGSEGV) on codes not 16-byte aligned, from 4 rows of x on.
    m = Q.FORMATS["int8"].module(K, N, "matrix")
    m.quantize_(_weights())
    buf = torch.empty(N * K + 64, dtype=torch.int8)
    start = (-buf.data_ptr()) % 16 + 8
    view = buf[start : start + N * K].view(N, K)
    view.copy_(m.codes.data)
    m.codes.data = view
    assert m.codes.data_ptr() % 16 == 8
    x = torch.randn(16, K)
    with torch.no_grad():
        y = m(x)
    assert m.codes.data_ptr() % 16 == 0 and torch.equal(m.codes.data, view)
    want = x @ m.dequantize().T
    assert (y - want).abs().max() <= 2e-2 * want.abs().max()


def test_pack4_is_torchs_int4_layout() -> None:
    codes = torch.randint(0, 16, (128, K), dtype=torch.int32,
                          generator=torch.Generator().manual_seed(2))  # fmt: skip
    assert torch.equal(Q.pack4(codes), torch._convert_weight_to_int4pack_for_cpu(codes, 1))
    assert torch.equal(Q.unpack4(Q.pack4(codes[:N]), torch.arange(N)).int(), codes[:N])


def test_refuses_damaged_blocks_and_other_types() -> None:
    m = Q.FORMATS["q8_0"].module(K, N, "matrix")
    with pytest.raises(ValueError, match=r"take 136 bytes each \(96 rows\), got \(96, 135\)"):
        m.from_ggml("Q8_0", torch.zeros(N, 135, dtype=torch.uint8))
    with pytest.raises(ValueError, match="q8_0 keeps GGUF Q8_0 blocks, not Q4_1"):
        m.from_ggml("Q4_1", torch.zeros(N, 136, dtype=torch.uint8))
    with pytest.raises(ValueError, match="rows have 100; use int8"):
        next(c for c in Q.lmcore_components() if c.name == "q4_1").build(
            in_features=100, out_features=8, role="matrix"
        )


def test_declared_bytes_are_the_held_bytes() -> None:
    for fmt, row in Q.FORMATS.items():
        m = row.module(K, N, "matrix")
        m(torch.zeros(1, K))  # the kernel's scales, made on first use, are counted too
        held = sum(p.numel() * p.element_size() for p in m.parameters()) + m.kernel_bytes()
        assert row.bytes(K, N) == held, fmt


@pytest.mark.parametrize("fmt", ["int8", "q8_0", "q4_0", "q4_1"])
def test_joined_formats_stack_rows_and_the_parts_become_views(fmt: str) -> None:
    """`joined`: one format of the parts' rows stacked, whose product is theirs side by side
    (bit for bit, the kernel's and the exact float path's), the parts' tensors views of it."""
    g = torch.Generator().manual_seed(6)
    parts = [Q.FORMATS[fmt].module(K, n, "matrix") for n in (128, 64, 64)]
    for part in parts:
        part.quantize_(torch.randn(part.out_features, K, generator=g))
    x = torch.randn(2, 5, K, generator=g)
    with torch.no_grad():
        separate = torch.cat([part(x) for part in parts], dim=-1)
    exact = torch.cat([part.dequantize() for part in parts])
    stack = parts[0].joined(parts[1:])
    assert stack is not None and type(stack) is type(parts[0])
    assert (stack.in_features, stack.out_features) == (K, 256)
    with torch.no_grad():
        assert torch.equal(stack(x), separate)
    assert torch.equal(stack.dequantize(), exact)
    start = 0
    for part in parts:
        for name, t in part.named_parameters(recurse=False):
            whole = getattr(stack, name)
            assert t.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
            assert torch.equal(t, whole[start : start + part.out_features])
        assert part._cache is None  # its own kernel scales dropped: the stack makes its own
        start += part.out_features


def test_joined_refuses_padded_rows_other_formats_and_widths() -> None:
    def fmt(name: str, k: int, n: int) -> Q._Format:
        m = Q.FORMATS[name].module(k, n, "matrix")
        m.quantize_(torch.randn(n, k, generator=torch.Generator().manual_seed(7)))
        return m

    assert fmt("q4_0", K, N).joined([fmt("q4_0", K, 64)]) is None  # 96 rows: padded to 128
    assert fmt("int8", K, N).joined([fmt("int8", K, 64)]) is not None  # int8 pads nothing
    assert fmt("q4_0", K, 64).joined([fmt("q4_1", K, 64)]) is None
    assert fmt("int8", K, 64).joined([fmt("int8", 64, 64)]) is None
    assert Q.FORMATS["int8"].module(K, 64, "matrix", device="meta").joined([]) is None
