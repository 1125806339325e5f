"""Checkpoints (`lmcore.checkpoint`): save -> load round trips of every built-in component, the
metadata `read_info` gives, tied weights, dtypes, the ties and formats a file may claim, and
refilling a model (`load_weights`). The plugins a checkpoint needs: test_checkpoint_plugins.py;
CS336 state dicts: test_checkpoint_cs336.py; the file's bytes: tests/model/test_reading.py."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import lmcore
from lmcore import CheckpointError, Registry
from lmcore.checkpoint import load_weights, read_info, resolve_checkpoint
from lmcore.model.saving import FORMAT_VERSION
from tests.helpers.errors import raises_naming
from tests.helpers.models import SMALL_SPEC as SMALL
from tests.helpers.models import edit, perturbed, rewrite
from tests.helpers.models import token_ids as ids


def builtins(kind: str) -> list[str]:
    return sorted(
        e.name for e in Registry().entries(kind) if e.provenance.dist == "lmcore-registry"
    )


# ------------------------------------------------------------------ round trips

ROUND_TRIPS = [
    *(f"{SMALL}, norm={n}" for n in builtins("norm")),
    *(f"{SMALL}, ffn={n}" for n in builtins("ffn")),
    *(f"{SMALL}, pos={n}" for n in builtins("pos")),
    *(f"{SMALL}, attn={n}" for n in builtins("attn")),
    *(f"{SMALL}, block={n}" for n in builtins("block")),
    *(f"{SMALL}, mixer={n}" for n in builtins("mixer")),
    f"{SMALL}, norm=layernorm(bias=false, eps=1e-6), attn=chunked(block_size=4)",
    f"{SMALL}, block=postnorm",
    f"{SMALL}, num_kv_heads=2",
    f"{SMALL}, tie_embeddings=true",
    "cs336-tiny",
    f"{SMALL}, block=parallel(norms=2), qkv_bias=true, out_bias=true, qk_norm=rmsnorm, "
    "window[0]=3, attn_softcap=20.0, logit_softcap=5.0, embed_scale=2.0, ffn[1]=silu",
]


def test_every_builtin_component_is_covered() -> None:
    kinds = {spec.split(", ")[-1].split("=")[0] for spec in ROUND_TRIPS[:-6]}
    assert kinds == {"norm", "ffn", "pos", "attn", "block", "mixer"}
    assert len(ROUND_TRIPS) - 6 == sum(len(builtins(k)) for k in kinds) == 29


@pytest.mark.parametrize("spec", ROUND_TRIPS)
def test_save_then_load_gives_bitwise_equal_weights_and_logits(spec: str, tmp_path: Path) -> None:
    model = perturbed(spec)
    path = model.save(tmp_path / "m.safetensors")
    torch.manual_seed(99)  # the loaded model's own initialisation differs: its weights must load
    loaded = lmcore.load(path)
    assert str(loaded.spec) == str(model.spec)
    x = ids(seq=model.spec.context_length)
    saved, back = model.state_dict(), loaded.state_dict()
    assert saved.keys() == back.keys() and all(torch.equal(saved[k], back[k]) for k in saved)
    # The loaded weights are the file's memory: its alignment decides which BLAS kernel a small
    # matmul takes (a MoE's few-token expert matmuls), which may round differently in the last
    # bit; the weights themselves are bitwise equal above.
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=2e-6)
    assert loaded.blueprint.provenance("norm") == model.blueprint.provenance("norm")


def test_the_metadata_holds_spec_provenance_versions_and_dtype(tmp_path: Path) -> None:
    model = perturbed(f"{SMALL}, pos=nope")
    path = lmcore.save(model, tmp_path / "m.safetensors", metadata={"train.step": "120"})
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    assert meta["format"] == "pt"
    assert meta["lmcore.format_version"] == str(FORMAT_VERSION) == "1"
    assert meta["lmcore.spec"] == str(model.spec)
    assert meta["lmcore.lmcore_version"] == lmcore.__version__
    assert meta["lmcore.torch_version"] == torch.__version__
    assert meta["lmcore.dtype"] == "float32"
    assert meta["train.step"] == "120"
    components = json.loads(meta["lmcore.components"])
    assert components["pos"] == {
        "name": "nope",
        "dist": "lmcore-registry",
        "version": lmcore.__version__,
        "plugin": "nope",
        "module": "lmcore_nope",
    }
    assert set(components) == {"norm", "ffn", "pos", "attn", "block", "mixer"}
    assert "lmcore.tied" not in meta  # nothing shared

    info = read_info(path)
    assert info.spec == str(model.spec) and info.format_version == 1
    assert info.metadata == {"train.step": "120"}
    assert str(info.components["ffn"]) == (
        f"lmcore-registry {lmcore.__version__} (entry point 'swiglu', module lmcore_ffn:swiglu)"
    )
    assert info.components["ffn"].requirement == f"lmcore-registry=={lmcore.__version__}"
    assert set(info.tensors) == set(model.state_dict())
    assert info.tensors["lm_head.weight"].shape == (97, 32)
    assert info.size == path.stat().st_size


def test_tied_embeddings_are_stored_once_and_still_tied_after_load(tmp_path: Path) -> None:
    model = perturbed(f"{SMALL}, tie_embeddings=true")
    path = model.save(tmp_path / "tied.safetensors")
    untied = perturbed(SMALL).save(tmp_path / "untied.safetensors")
    info = read_info(path)
    assert info.tied == {"lm_head.weight": "token_embeddings.weight"}
    assert "lm_head.weight" not in info.tensors and "token_embeddings.weight" in info.tensors
    matrix = 97 * 32 * 4
    assert untied.stat().st_size - path.stat().st_size == pytest.approx(matrix, abs=200)

    loaded = lmcore.load(path)
    assert loaded.lm_head.weight is loaded.token_embeddings.weight
    assert len(list(loaded.parameters())) == len(list(model.parameters()))
    with torch.no_grad():
        loaded.lm_head.weight[0, 0] = 123.0
    assert loaded.token_embeddings.weight[0, 0] == 123.0


def test_dtype_is_kept_unless_a_conversion_is_asked_for(tmp_path: Path) -> None:
    model = perturbed(SMALL, dtype=torch.bfloat16)
    path = model.save(tmp_path / "bf16.safetensors")
    assert read_info(path).dtype == "bfloat16"
    assert read_info(path).tensors["ln_final.weight"].dtype == "BF16"
    kept = lmcore.load(path)
    assert {p.dtype for p in kept.parameters()} == {torch.bfloat16}
    assert torch.equal(kept(ids()), model(ids()))

    wide = lmcore.load(path, dtype=torch.float32)
    assert {p.dtype for p in wide.parameters()} == {torch.float32}
    assert torch.equal(wide.lm_head.weight, model.lm_head.weight.float())


def test_load_on_a_device_and_in_another_registry(tmp_path: Path) -> None:
    path = perturbed(SMALL).save(tmp_path / "m.safetensors")
    model = lmcore.load(path, device="cpu", registry=Registry())
    assert model.lm_head.weight.device.type == "cpu"
    with pytest.raises(
        CheckpointError, match=r"needs norm 'rmsnorm'.*pip install lmcore-registry=="
    ):
        lmcore.load(path, registry=Registry(autoload=False))


def test_save_accepts_a_compiled_model_and_load_weights_refills_a_model(tmp_path: Path) -> None:
    model = perturbed(SMALL)
    path = lmcore.save(torch.compile(model), tmp_path / "m.safetensors")
    other = perturbed(SMALL, seed=5)
    assert not torch.equal(other(ids()), model(ids()))
    load_weights(other, path)
    assert torch.equal(other(ids()), model(ids()))


def test_read_info_reads_no_tensor_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = perturbed(SMALL).save(tmp_path / "m.safetensors")
    monkeypatch.setattr("lmcore.model.reading.load_file", None)  # any tensor read would fail
    assert read_info(path).dtype == "float32"


# ------------------------------------------------------------------ what a file may claim


def test_a_safetensors_file_without_an_lmcore_spec(tmp_path: Path) -> None:
    path = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(3)}, str(path), metadata={"format": "pt"})
    with raises_naming(
        CheckpointError,
        "plain.safetensors",
        "not an lmcore checkpoint",
        "no 'lmcore.spec' (metadata keys: format)",
        "lmcore.load_state_dict_file(path, spec)",
        "`lmcore convert --from-hf DIR OUT.safetensors`",
    ):
        lmcore.load(path)


def test_a_newer_format_asks_for_an_upgrade(saved: Path) -> None:
    rewrite(saved, metadata=lambda m: {**m, "lmcore.format_version": "2"})
    with raises_naming(
        CheckpointError,
        "lmcore checkpoint format 2 by lmcore 0.1.0",
        "reads format 1 and older",
        "pip install -U lmcore-registry",
    ):
        lmcore.load(saved)


def test_damaged_lmcore_metadata(saved: Path) -> None:
    rewrite(saved, metadata=lambda m: {**m, "lmcore.components": "{not json"})
    with raises_naming(
        CheckpointError, "damaged lmcore metadata", "lmcore.components", "(JSONDecodeError"
    ):
        lmcore.load(saved)
    rewrite(saved, metadata=lambda m: {**m, "lmcore.components": "{}", "lmcore.dtype": "int99"})
    with pytest.raises(CheckpointError, match=r"lmcore.components cannot be read \(KeyError"):
        lmcore.load(saved)


def test_a_spec_that_no_longer_resolves(saved: Path) -> None:
    rewrite(
        saved, metadata=lambda m: {**m, "lmcore.spec": m["lmcore.spec"].replace("1e-05", "-1.0")}
    )
    with raises_naming(
        CheckpointError, "spec no longer resolves", "argument 'eps' of norm 'rmsnorm'"
    ):
        lmcore.load(saved)


def test_resolve_checkpoint_gives_the_blueprint_without_weights(saved: Path) -> None:
    bp = resolve_checkpoint(saved)
    assert str(bp.spec) == read_info(saved).spec


def test_a_tie_in_the_metadata_never_drops_a_stored_tensor(saved: Path, tmp_path: Path) -> None:
    # The probe: adding lmcore.tied {"lm_head.weight": "token_embeddings.weight"} to an untied
    # model's metadata made lmcore.load throw the stored lm_head.weight away, silently.
    def tie(parsed: dict) -> None:
        parsed["__metadata__"]["lmcore.tied"] = json.dumps(
            {"lm_head.weight": "token_embeddings.weight"}
        )

    bad = edit(saved, tmp_path / "tie.safetensors", header=tie)
    with raises_naming(
        CheckpointError,
        f"{bad}: ",
        "ties lm_head.weight to token_embeddings.weight (lmcore.tied)",
        "stores a different lm_head.weight",
        "remove 'lm_head.weight' from lmcore.tied",
        "restore the file",
    ):
        lmcore.load(bad)

    def tie_and_drop(parsed: dict, body: bytearray) -> None:  # no lm_head stored at all
        tie(parsed)
        start, end = parsed.pop("lm_head.weight")["data_offsets"]
        del body[start:end]
        for entry in parsed.values():
            if (
                isinstance(entry, dict)
                and "data_offsets" in entry
                and entry["data_offsets"][0] >= end
            ):
                entry["data_offsets"] = [o - (end - start) for o in entry["data_offsets"]]
        table = json.loads(parsed["__metadata__"]["lmcore.checksums"])
        del table["tensors"]["lm_head.weight"]
        parsed["__metadata__"]["lmcore.checksums"] = json.dumps(table)

    dropped = edit(saved, tmp_path / "dropped.safetensors", data=tie_and_drop)
    with raises_naming(
        CheckpointError,
        "ties lm_head.weight to token_embeddings.weight (lmcore.tied)",
        "does not store lm_head.weight",
        "the model its spec builds keeps the two apart",
    ):
        lmcore.load(dropped)
    tied = lmcore.build_model(f"{SMALL}, tie_embeddings=true").save(tmp_path / "tied.safetensors")
    model = lmcore.load(tied)  # a true tie: one tensor stored, two names
    assert model.lm_head.weight is model.token_embeddings.weight


def test_loading_into_another_model_names_both_specs(saved: Path) -> None:
    # The probe: a resumed run whose model differed from its checkpoint's was told about the
    # checkpoint's spec only, as if that were the model being loaded.
    other = lmcore.build_model(SMALL.replace("d_ff=64", "d_ff=96"))
    with raises_naming(
        CheckpointError,
        f"{saved}: ",
        f"the model it is loaded into ({other.spec};",
        f"the file's spec is {read_info(saved).spec})",
        "wrong shape (6)",  # w1, w2 and w3 of both layers
    ):
        load_weights(other, saved)


# ------------------------------------------------------------------ older files and provenance


def test_a_checkpoint_from_before_the_block_kind_still_loads(tmp_path: Path) -> None:
    """Saved when the components table had norm, ffn, pos and attn only: `block=prenorm` in its
    spec (and the mixer it names none of) resolves to whatever provides them now, and the
    weights load as they were."""
    model = perturbed(SMALL)
    path = model.save(tmp_path / "m.safetensors")

    def older(meta: dict[str, str]) -> dict[str, str]:
        table = json.loads(meta["lmcore.components"])
        del table["block"], table["mixer"]
        return {**meta, "lmcore.components": json.dumps(table, sort_keys=True)}

    rewrite(path, metadata=older)
    info = lmcore.read_info(path)
    assert set(info.components) == {"norm", "ffn", "pos", "attn"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = lmcore.load(path)
    assert loaded.blueprint.parts["block"].name == "prenorm"
    assert loaded.blueprint.parts["mixer"].name == "attention"
    assert torch.equal(loaded(ids()), model(ids()))


def test_every_component_a_model_uses_is_in_the_provenance(tmp_path: Path) -> None:
    model = perturbed(f"{SMALL}, qk_norm=layernorm, ffn[1]=silu, block[0]=sandwich")
    path = model.save(tmp_path / "m.safetensors")
    components = lmcore.read_info(path).components
    assert {(c.kind, c.name) for c in components.values()} >= {
        ("norm", "rmsnorm"), ("norm", "layernorm"), ("ffn", "swiglu"), ("ffn", "silu"),
        ("block", "prenorm"), ("block", "sandwich"), ("pos", "rope"), ("attn", "sdpa"),
    }  # fmt: skip
    assert components["ffn silu"].dist == "lmcore-registry"
    with pytest.raises(CheckpointError, match=r"needs ffn 'silu'.*pip install lmcore-registry=="):
        lmcore.load(path, registry=Registry(disabled=["silu"]))
