"""The checkpoint writer (`lmcore.model.saving`): the CRC-32 saved with every tensor, tensors that
share storage without being tied, and what `save` refuses (reserved or non-string metadata,
what is not a TransformerLM, a model on the meta device), writing nothing."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import torch

import lmcore
from lmcore import CheckpointError, build_model
from lmcore.checkpoint import read_header, read_info, verify_checksums
from tests.helpers.errors import raises_naming
from tests.helpers.models import SMALL_SPEC as SMALL
from tests.helpers.models import perturbed


def test_each_tensors_crc32_is_stored_in_the_metadata(saved: Path) -> None:
    raw = saved.read_bytes()
    header = read_header(saved)
    table = json.loads(header.metadata["lmcore.checksums"])
    assert table["algorithm"] == "crc32"
    for name, t in header.tensors.items():  # the CRC of the very bytes in the file
        chunk = raw[header.data_start + t.offsets[0] : header.data_start + t.offsets[1]]
        assert table["tensors"][name] == f"{zlib.crc32(chunk):08x}"
    assert sorted(table["tensors"]) == sorted(header.tensors)
    verify_checksums(read_info(saved))


def test_a_view_into_a_shared_storage_is_saved_as_its_own_tensor(tmp_path: Path) -> None:
    """A state dict may expose slices of a fused weight (q, k, v of one qkv matrix): they share
    storage without being the same tensor, and are saved as copies, not as ties."""
    model = perturbed(SMALL)
    attn = model.layers[0].attn
    fused = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach()
    state = dict(model.state_dict())
    for n, name in enumerate(("q_proj", "k_proj", "v_proj")):
        state[f"layers.0.attn.{name}.weight"] = fused[32 * n : 32 * (n + 1)]
    from lmcore.model.saving import store_once

    tensors, tied = store_once(state)
    assert tied == {}
    ptrs = {t.untyped_storage().data_ptr() for t in tensors.values()}
    assert len(ptrs) == len(tensors)
    assert torch.equal(tensors["layers.0.attn.k_proj.weight"], attn.k_proj.weight)


def test_save_refuses_reserved_or_non_string_metadata(tmp_path: Path) -> None:
    model = perturbed(SMALL)
    with raises_naming(
        CheckpointError,
        "metadata key 'lmcore.spec'",
        "reserved for lmcore (its keys are 'format' and 'lmcore.*')",
        "e.g. 'train.spec'",
    ):
        model.save(tmp_path / "m.safetensors", metadata={"lmcore.spec": "x"})
    with raises_naming(
        CheckpointError,
        "metadata must map strings to strings",
        "got 'step': int",
        "convert the value",
    ):
        model.save(tmp_path / "m.safetensors", metadata={"step": 3})  # type: ignore[dict-item]
    assert list(tmp_path.iterdir()) == []


def test_save_refuses_what_is_not_a_transformer_lm_and_meta_models(tmp_path: Path) -> None:
    with raises_naming(
        CheckpointError, "lmcore.save expects a TransformerLM", "got Linear", "for any other"
    ):
        lmcore.save(torch.nn.Linear(2, 2), tmp_path / "x.safetensors")
    with raises_naming(
        CheckpointError, "cannot save token_embeddings.weight", "built on the meta device"
    ):
        build_model(SMALL, device="meta").save(tmp_path / "x.safetensors")
    assert list(tmp_path.iterdir()) == []
