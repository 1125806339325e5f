"""Weight formats on a built model (`lmcore.model.quant`): every matrix and the embedding
stored, the tied head sharing it, the logits those of the dequantized float model, saved and
loaded with checksums, and the bytes describe declares equal to the built model's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import lmcore
from lmcore.checkpoint import read_info
from lmcore.describe import describe
from lmcore.errors import CheckpointError, SpecError
from lmcore.model.generate import GREEDY
from lmcore.model.quant import stored
from lmcore.quantizing import quantize_model

SPEC = "cs336-tiny, tie_embeddings=true"
FORMATS = ("int8", "q8_0", "q4_0", "q4_1", "q4_1(embedding=q8_0)")


def _float() -> lmcore.TransformerLM:
    torch.manual_seed(0)
    return lmcore.build_model(SPEC)


def _dequantized(model: lmcore.TransformerLM) -> lmcore.TransformerLM:
    """The float model whose weights are the quantized model's, dequantized (the reference)."""
    plain = _float()
    state = plain.state_dict()
    for name, child in stored(model):
        state[f"{name}.weight"] = child.dequantize()
    state["lm_head.weight"] = state["token_embeddings.weight"]
    plain.load_state_dict(state)
    return plain


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_quantized_model_computes_its_dequantized_weights(fmt: str) -> None:
    q = quantize_model(_float(), fmt)
    assert str(q.spec).endswith(f"quant={fmt if '(' in fmt else fmt + '(embedding=same)'}")
    names = [n for n, _ in stored(q)]
    assert names[0] == "token_embeddings" and "lm_head" not in names  # tied: one, shared
    assert q.lm_head.quant is q.token_embeddings.quant
    ref = _dequantized(q)
    ids = torch.randint(0, 10000, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # torch's bfloat16 kernels, for 4 rows as for 24
        for x in (ids[:1, :4], ids):
            out, want = q(x), ref(x)
            assert (out - want).abs().max() <= 3e-2 * want.abs().max()
    with torch.enable_grad():  # x needs gradients (an adapter's): the exact float32 path
        torch.testing.assert_close(q(ids), ref(ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["int8", "q4_1(embedding=q8_0)"])
def test_saved_loaded_checksummed_and_described(tmp_path: Path, fmt: str) -> None:
    q = quantize_model(_float(), fmt)
    path = q.save(tmp_path / "q.safetensors")
    info = read_info(path)
    assert info.spec == str(q.spec) and info.dtype == "float32"
    assert any(c.kind == "quant" for c in info.components.values())
    loaded = lmcore.load(path)
    for (a, x), (b, y) in zip(q.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert a == b and x.dtype == y.dtype and torch.equal(x, y)
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(loaded.generate(ids, 4, GREEDY), q.generate(ids, 4, GREEDY))
    for child in dict(stored(loaded)).values():
        child(torch.zeros(1, child.in_features))  # the kernels' scales, counted as declared
    held = {id(t): t.numel() * t.element_size() for t in loaded.parameters()}
    held_bytes = sum(held.values()) + sum(c.kernel_bytes() for _, c in stored(loaded))
    assert describe(str(q.spec), seq_len=1).memory.weights == held_bytes
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0xFF  # a flipped bit in the last tensor
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="checksum"):
        lmcore.load(path)


def test_refusals_name_the_format() -> None:
    q = quantize_model(_float(), "int8")
    with pytest.raises(SpecError, match=r"quantized already \(quant=int8\(embedding=same\)\)"):
        quantize_model(q, "q4_1")
    with pytest.raises(SpecError, match=r"quant=q4_1.*token_embeddings.weight \(10000 x 72\): "
                       r"q4_1 stores blocks of 32 weights of a row, and this matrix's rows have "
                       r"72; use int8"):  # fmt: skip
        lmcore.build_model("cs336-tiny, d_model=72, num_heads=4, quant=q4_1", device="meta")
    with pytest.raises(SpecError, match=r"embedding.*must be one of.*did you mean 'q8_0'"):
        lmcore.build_model("cs336-tiny, quant=q4_1(embedding=q8)", device="meta")


@pytest.mark.parametrize("fmt", ["int8", "q8_0", "q4_0"])
def test_compiled_decoding_of_a_quantized_model_traces_each_layer_whole(fmt: str) -> None:
    """compile_decoding's first eager step makes the kernel scales (and int8's aligned copy),
    so each layer's trace finds them made: no graph break (fullgraph), the eager tokens."""
    from lmcore.model.generate import compile_decoding

    q = quantize_model(_float(), fmt)
    ids = torch.tensor([[1, 2, 3]])
    eager = q.generate(ids, 4, GREEDY)
    fresh = quantize_model(_float(), fmt)  # no kernel scales made yet
    assert all(child._cache is None for _, child in stored(fresh))
    torch.compiler.reset()
    try:
        decoder = compile_decoding(fresh, backend="eager", fullgraph=True)
        assert torch.equal(decoder.generate(ids, 4, GREEDY), eager)
    finally:
        torch.compiler.reset()


def _logits(model: lmcore.TransformerLM, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        out: torch.Tensor = model(ids)
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_joined_products_are_the_separate_ones_held_once(fmt: str) -> None:
    """`join_products` stacks q, k, v and w1, w3 of every layer into one product each: the
    logits are the separate products' bit for bit, the parts' tensors are views of the stack
    (nothing held twice), and the state dict is unchanged, its keys and values."""
    from lmcore.model.nn import join_products

    q = quantize_model(_float(), fmt)
    ids = torch.randint(0, 10000, (2, 12), generator=torch.Generator().manual_seed(1))
    separate = _logits(q, ids), _logits(q, ids[:1, -1:])
    before = {k: v.clone() for k, v in q.state_dict().items()}
    join_products(q)
    for layer in q.layers:
        attn, ffn = layer.attn, layer.ffn
        assert attn.joined is not None and attn.joined.widths == (64, 64, 64)
        assert ffn.joined is not None and ffn.joined.widths == (128, 128)
        stack = attn.joined.product
        for part in (attn.q_proj, attn.k_proj, attn.v_proj):
            for name, t in part.quant.named_parameters(recurse=False):
                whole = getattr(stack, name)
                assert t.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
    assert torch.equal(_logits(q, ids), separate[0])
    assert torch.equal(_logits(q, ids[:1, -1:]), separate[1])
    after = q.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[k], v) for k, v in before.items())


def test_a_part_given_new_tensors_or_a_hook_is_computed_alone_again() -> None:
    """A joined product is used only while its parts are what was joined: a part re-quantized
    (new tensors), or hooked, is multiplied on its own, with its new weights."""
    from lmcore.model.nn import join_products

    q = quantize_model(_float(), "int8")
    join_products(q)
    attn = q.layers[0].attn
    joined = attn.joined
    assert joined is not None and joined.fresh(attn.q_proj, attn.k_proj, attn.v_proj)
    attn.k_proj.quant.quantize_(torch.randn(64, 64))  # new codes and scales
    assert not joined.fresh(attn.q_proj, attn.k_proj, attn.v_proj)
    ids = torch.randint(0, 10000, (1, 6), generator=torch.Generator().manual_seed(2))
    want = _logits(_dequantized(q), ids)  # the float model of the new weights
    got = _logits(q, ids)
    assert (got - want).abs().max() <= 3e-2 * want.abs().max()
    join_products(q)  # joins again, the new tensors
    assert attn.joined is not joined and attn.joined is not None
    calls: list[int] = []
    attn.v_proj.register_forward_hook(lambda *_: calls.append(1))
    _logits(q, ids)
    assert calls == [1]  # the hooked part ran on its own


def test_joined_models_save_load_and_train_as_before(tmp_path: Path) -> None:
    """Saving writes each part's rows (views of the stack) as its own tensor; a loaded model
    gives the same logits; with gradients the parts are multiplied one by one."""
    from lmcore.model.nn import join_products

    q = quantize_model(_float(), "q4_0")
    ids = torch.randint(0, 10000, (1, 8), generator=torch.Generator().manual_seed(3))
    join_products(q)
    path = q.save(tmp_path / "joined.safetensors")
    loaded = lmcore.load(path)
    assert torch.equal(_logits(loaded, ids), _logits(q, ids))

    def refuse(x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the joined product ran with gradients enabled")

    for layer in q.layers:
        assert layer.attn.joined is not None and layer.ffn.joined is not None
        layer.attn.joined.product = layer.ffn.joined.product = refuse
    with torch.enable_grad():  # x needs no gradient, but autograd is on: the parts, one by one
        q(ids)
    with pytest.raises(AssertionError, match="ran with gradients enabled"):
        _logits(q, ids)
