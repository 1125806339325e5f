"""Checkpoints: save -> load round trips, the metadata, tied weights, dtypes, CS336 state-dict
files, and every `CheckpointError` with its message.

Plugins that come and go are real distributions (a `*.dist-info` beside the module, see
conftest's `make_dist`), installed, upgraded and removed on disk between save and load.
"""

from __future__ import annotations

import importlib
import json
import re
import struct
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import lmcore
from lmcore import CheckpointError, CheckpointWarning, Registry, build_model
from lmcore.checkpoint import load_weights, read_header, read_info, resolve_checkpoint
from lmcore.model.saving import FORMAT_VERSION, checksums_json
from lmcore.runfiles import find_checkpoint

SMALL = "vocab_size=97, context_length=16, d_model=32, num_layers=2, num_heads=4, d_ff=64"


def perturbed(spec: str, seed: int = 0, **kwargs) -> lmcore.TransformerLM:
    """A model whose every parameter is random, norms' gains included, so a weight that is not
    saved or not loaded changes the logits."""
    torch.manual_seed(seed)
    model = build_model(spec, **kwargs)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def ids(vocab: int = 97, seq: int = 16) -> torch.Tensor:
    return torch.randint(0, vocab, (2, seq), generator=torch.Generator().manual_seed(1))


def builtins(kind: str) -> list[str]:
    return sorted(
        e.name for e in Registry().entries(kind) if e.provenance.dist == "lmcore-registry"
    )


def rewrite(path: Path, *, metadata=None, tensors=None, out: Path | None = None) -> Path:
    """Write a copy of a safetensors file with its metadata and/or tensors changed; changed
    tensors get checksums of their own, so that the checks after the integrity check see them."""
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


# ------------------------------------------------------------------ round trips

ROUND_TRIPS = [
    *(f"{SMALL}, norm={n}" for n in builtins("norm")),
    *(f"{SMALL}, ffn={n}" for n in builtins("ffn")),
    *(f"{SMALL}, pos={n}" for n in builtins("pos")),
    *(f"{SMALL}, attn={n}" for n in builtins("attn")),
    *(f"{SMALL}, block={n}" for n in builtins("block")),
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
    assert kinds == {"norm", "ffn", "pos", "attn", "block"}
    assert len(ROUND_TRIPS) - 6 == sum(len(builtins(k)) for k in kinds) == 21


@pytest.mark.parametrize("spec", ROUND_TRIPS)
def test_save_then_load_gives_bitwise_equal_logits(spec: str, tmp_path: Path) -> None:
    model = perturbed(spec)
    path = model.save(tmp_path / "m.safetensors")
    torch.manual_seed(99)  # the loaded model's own initialisation differs: its weights must load
    loaded = lmcore.load(path)
    assert str(loaded.spec) == str(model.spec)
    x = ids(seq=model.spec.context_length)
    assert torch.equal(loaded(x), model(x))
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
    assert set(components) == {"norm", "ffn", "pos", "attn", "block"}
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


def test_load_takes_a_checkpoint_directory_or_a_run_directory(tmp_path: Path) -> None:
    """What `lmcore generate` takes: a run directory loads its newest checkpoint's model."""
    run = tmp_path / "run"
    models = {}
    for step in (10, 200, 30):
        ckpt = run / "checkpoints" / f"step-{step:06d}"
        ckpt.mkdir(parents=True)
        models[step] = perturbed(SMALL, seed=step)
        lmcore.save(models[step], ckpt / "model.safetensors")
    (run / "checkpoints" / ".step-000300.1a2b.tmp").mkdir()  # an interrupted save: not a step
    (run / "run.json").write_text("{}")
    empty = tmp_path / "empty-run"
    empty.mkdir()
    (empty / "run.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"has no checkpoint yet .*lmcore train --resume"):
        lmcore.load(empty)
    x = ids()
    newest = run / "checkpoints" / "step-000200"
    assert find_checkpoint(run) == newest / "model.safetensors"
    assert find_checkpoint(newest) == newest / "model.safetensors"
    assert find_checkpoint(newest / "model.safetensors") == newest / "model.safetensors"
    for path in (run, newest, newest / "model.safetensors"):
        assert torch.equal(lmcore.load(path)(x), models[200](x)), path
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    with pytest.raises(
        CheckpointError,
        match=r"is neither a model file, .* it holds a config.json: for a Hugging Face model "
        r"directory run `lmcore convert --from-hf .*hf OUT.safetensors`",
    ):
        lmcore.load(hf)


# ------------------------------------------------------------------ save's own errors


def test_save_refuses_reserved_or_non_string_metadata(tmp_path: Path) -> None:
    model = perturbed(SMALL)
    with pytest.raises(
        CheckpointError,
        match=r"metadata key 'lmcore.spec' is reserved for lmcore \(its keys are 'format' and "
        r"'lmcore.\*'\); choose another name, e.g. 'train.spec'",
    ):
        model.save(tmp_path / "m.safetensors", metadata={"lmcore.spec": "x"})
    with pytest.raises(
        CheckpointError,
        match=r"metadata must map strings to strings .*got 'step': int; convert the value",
    ):
        model.save(tmp_path / "m.safetensors", metadata={"step": 3})  # type: ignore[dict-item]
    assert list(tmp_path.iterdir()) == []


def test_save_refuses_what_is_not_a_transformer_lm_and_meta_models(tmp_path: Path) -> None:
    with pytest.raises(
        CheckpointError, match=r"lmcore.save expects a TransformerLM .*got Linear; for any other"
    ):
        lmcore.save(torch.nn.Linear(2, 2), tmp_path / "x.safetensors")
    with pytest.raises(
        CheckpointError,
        match=r"cannot save token_embeddings.weight: the model was built on the meta device",
    ):
        build_model(SMALL, device="meta").save(tmp_path / "x.safetensors")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ damaged files


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    return perturbed(SMALL).save(tmp_path / "m.safetensors")


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"nothere.safetensors: no such file"):
        lmcore.load(tmp_path / "nothere.safetensors")


def test_not_a_safetensors_file(tmp_path: Path) -> None:
    text = tmp_path / "notes.safetensors"
    text.write_text("these are my notes, not weights\n")
    with pytest.raises(
        CheckpointError,
        match=r"notes.safetensors: is not a safetensors file \(it does not start with a "
        r"safetensors header\); lmcore checkpoints are written by lmcore.save",
    ):
        lmcore.load(text)
    pt = tmp_path / "weights.safetensors"
    torch.save({"w": torch.zeros(2)}, pt)
    with pytest.raises(
        CheckpointError,
        match=r"is not a safetensors file \(it is a zip archive, which is what torch.save writes: "
        r"for a CS336-keyed state dict use lmcore.load_state_dict_file\(path, spec\)\)",
    ):
        lmcore.load(pt)
    tiny = tmp_path / "tiny.safetensors"
    tiny.write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointError, match=r"\(it is only 2 bytes long\)"):
        lmcore.load(tiny)
    with pytest.raises(
        CheckpointError,
        match=r"is neither a model file, a checkpoint directory \(holding model.safetensors\) nor "
        r"a run directory \(holding run.json\)",
    ):
        lmcore.load(tmp_path)


def test_a_truncated_file(saved: Path) -> None:
    data = saved.read_bytes()
    saved.write_bytes(data[: len(data) // 2])
    with pytest.raises(
        CheckpointError,
        match=r"m.safetensors: is truncated: its header describes [\d,]+ bytes of tensor data "
        r"but the file holds [\d,]+; it was cut short \(an interrupted copy or download\?\): "
        r"copy it again",
    ):
        lmcore.load(saved)
    saved.write_bytes(data[:100])  # cut inside the header
    with pytest.raises(
        CheckpointError,
        match=r"is truncated: its safetensors header needs [\d,]+ bytes after the first 8, but "
        r"the file holds only 100 bytes in all",
    ):
        read_info(saved)


def test_a_corrupted_header(saved: Path) -> None:
    data = bytearray(saved.read_bytes())
    (length,) = struct.unpack("<Q", data[:8])
    header = data[8 : 8 + length]
    colon = header.index(b":")
    data[8 + colon] = ord("#")  # one flipped byte inside the JSON
    saved.write_bytes(bytes(data))
    with pytest.raises(
        CheckpointError,
        match=r"m.safetensors: has a corrupted safetensors header: it is not valid JSON "
        r"\(.*\); the file is damaged, restore it from a good copy",
    ):
        lmcore.load(saved)


def test_a_header_whose_offsets_disagree_with_the_shapes(saved: Path) -> None:
    data = saved.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    header["ln_final.weight"]["shape"] = [16]  # 32 floats of data, 16 declared
    raw = json.dumps(header, separators=(",", ":")).encode().ljust(length)
    saved.write_bytes(data[:8] + raw + data[8 + length :])
    with pytest.raises(
        CheckpointError,
        match=r"corrupted safetensors header: tensor 'ln_final.weight' \(F32, shape \(16,\)\) "
        r"should take 64 bytes, its offsets give 128",
    ):
        read_header(saved)


def test_a_safetensors_file_without_an_lmcore_spec(tmp_path: Path) -> None:
    path = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(3)}, str(path), metadata={"format": "pt"})
    with pytest.raises(
        CheckpointError,
        match=r"plain.safetensors: is a safetensors file but not an lmcore checkpoint: its "
        r"metadata has no 'lmcore.spec' \(metadata keys: format\). For a CS336-keyed state dict "
        r"use lmcore.load_state_dict_file\(path, spec\); for a Hugging Face model "
        r"directory, `lmcore convert --from-hf DIR OUT.safetensors`",
    ):
        lmcore.load(path)


def test_a_newer_format_asks_for_an_upgrade(saved: Path) -> None:
    rewrite(saved, metadata=lambda m: {**m, "lmcore.format_version": "2"})
    with pytest.raises(
        CheckpointError,
        match=r"was written in lmcore checkpoint format 2 by lmcore 0.1.0; this lmcore reads "
        r"format 1 and older: upgrade it \(pip install -U lmcore-registry\)",
    ):
        lmcore.load(saved)


def test_damaged_lmcore_metadata(saved: Path) -> None:
    rewrite(saved, metadata=lambda m: {**m, "lmcore.components": "{not json"})
    with pytest.raises(
        CheckpointError,
        match=r"has damaged lmcore metadata: lmcore.components cannot be read \(JSONDecodeError",
    ):
        lmcore.load(saved)
    rewrite(saved, metadata=lambda m: {**m, "lmcore.components": "{}", "lmcore.dtype": "int99"})
    with pytest.raises(CheckpointError, match=r"lmcore.components cannot be read \(KeyError"):
        lmcore.load(saved)


def test_missing_unexpected_and_misshapen_tensors_are_all_listed(saved: Path) -> None:
    def damage(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        del state["layers.1.ffn.w3.weight"]
        del state["ln_final.weight"]
        state["layers.0.attn.bias"] = torch.zeros(32)
        state["lm_head.weight"] = torch.zeros(96, 32)
        return state

    rewrite(saved, tensors=damage)
    with pytest.raises(
        CheckpointError,
        match=r"m.safetensors: its tensors do not fit the model its spec builds \(vocab_size=97,"
        r".*\): missing \(2\): layers.1.ffn.w3.weight, ln_final.weight; unexpected \(1\): "
        r"layers.0.attn.bias; wrong shape \(1\): lm_head.weight \(file \(96, 32\), model "
        r"\(97, 32\)\). The file was changed after it was saved, or a plugin's parameters "
        r"changed between versions",
    ):
        lmcore.load(saved)


def test_an_lmcore_upgrade_is_one_sentence_for_all_its_components(saved: Path) -> None:
    def older(meta: dict[str, str]) -> dict[str, str]:
        table = json.loads(meta["lmcore.components"])
        for row in table.values():
            row["version"] = "0.0.9"
        return {**meta, "lmcore.components": json.dumps(table)}

    rewrite(saved, metadata=older)
    with pytest.warns(CheckpointWarning) as caught:
        lmcore.load(saved)
    [warning] = caught
    assert str(warning.message) == (
        f"{saved}: norm 'rmsnorm', ffn 'swiglu', pos 'rope', attn 'sdpa' and block 'prenorm' were "
        "saved with "
        f"lmcore-registry 0.0.9, and lmcore-registry {lmcore.__version__} is installed. Loading "
        "it anyway; if its tensors no longer fit, or to reproduce it exactly, pip install "
        "lmcore-registry==0.0.9"
    )


def test_a_spec_that_no_longer_resolves(saved: Path) -> None:
    rewrite(
        saved, metadata=lambda m: {**m, "lmcore.spec": m["lmcore.spec"].replace("1e-05", "-1.0")}
    )
    with pytest.raises(
        CheckpointError,
        match=r"its spec no longer resolves with the installed plugins: argument 'eps' of norm "
        r"'rmsnorm'",
    ):
        lmcore.load(saved)


# ------------------------------------------------------------------ plugins that come and go

SCALE = """
import torch
from torch import nn
from lmcore import Arg, Component, hookimpl

class Scale(nn.Module):
    def __init__(self, d_model, init=1.0, device=None, dtype=None):
        super().__init__()
        self.gain = nn.Parameter(torch.full((d_model,), init, device=device, dtype=dtype))

    def forward(self, x):
        return x * self.gain

@hookimpl
def lmcore_components():
    return [Component(kind="norm", name="scale", build=Scale,
                      args=(Arg("init", float, 1.0, "initial gain"),),
                      params=lambda d_model: d_model)]
"""


def forget(site: Path, module: str) -> None:
    """Uninstall a distribution made by `make_dist`: take its site off sys.path."""
    sys.path.remove(str(site))
    sys.modules.pop(module, None)
    importlib.invalidate_caches()


def set_version(site: Path, dist: str, old: str, new: str) -> None:
    """What `pip install dist==new` leaves on disk: a renamed dist-info with the new version."""
    info = site / f"{dist.replace('-', '_')}-{old}.dist-info"
    meta = info / "METADATA"
    meta.write_text(meta.read_text().replace(f"Version: {old}", f"Version: {new}"))
    info.rename(site / f"{dist.replace('-', '_')}-{new}.dist-info")
    importlib.invalidate_caches()


@pytest.fixture
def scale_checkpoint(make_dist, tmp_path: Path) -> tuple[Path, Path]:
    site = make_dist("lmcore-scale", version="1.2", entry_points={"scale": "scale_norm"},
                     modules={"scale_norm": SCALE})  # fmt: skip
    model = perturbed(f"{SMALL}, norm=scale(init=0.5)", registry=Registry())
    return site, model.save(tmp_path / "scale.safetensors")


def test_a_missing_plugin_names_the_distribution_to_install(scale_checkpoint) -> None:
    site, path = scale_checkpoint
    assert read_info(path).components["norm"].requirement == "lmcore-scale==1.2"
    assert lmcore.load(path, registry=Registry()).spec.norm.name == "scale"
    forget(site, "scale_norm")
    with pytest.raises(
        CheckpointError,
        match=r"scale.safetensors: needs norm 'scale', provided by lmcore-scale 1.2 \(entry point "
        r"'scale', module scale_norm\) when it was saved, and no installed plugin provides it "
        r"\(the registry says: no installed plugin provides norm 'scale'.*\); install it: "
        r"pip install lmcore-scale==1.2",
    ):
        lmcore.load(path, registry=Registry())


def test_a_disabled_plugin_is_named_with_the_reason(scale_checkpoint) -> None:
    _, path = scale_checkpoint
    with pytest.raises(
        CheckpointError,
        match=r"disabled plugins, not loaded \(LMCORE_DISABLE_PLUGINS\): 'scale' \(lmcore-scale "
        r"1.2\)\); install it: pip install lmcore-scale==1.2",
    ):
        lmcore.load(path, registry=Registry(disabled=["scale"]))


def test_another_installed_version_warns_naming_both(
    scale_checkpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    site, path = scale_checkpoint
    set_version(site, "lmcore-scale", "1.2", "1.3")
    message = (
        r"scale.safetensors: norm 'scale' was saved with lmcore-scale 1.2, and lmcore-scale 1.3 "
        r"is installed. Loading it anyway; if its tensors no longer fit, or to reproduce it "
        r"exactly, pip install lmcore-scale==1.2"
    )
    with pytest.warns(CheckpointWarning, match=message):
        model = lmcore.load(path, registry=Registry())
    assert model.blueprint.provenance("norm").version == "1.3"

    monkeypatch.setenv("LMCORE_STRICT_PLUGINS", "1")
    with pytest.raises(
        CheckpointError,
        match=r"was saved with lmcore-scale 1.2, and lmcore-scale 1.3 is installed. "
        r"LMCORE_STRICT_PLUGINS is set, so this is an error: install what saved it \(pip install "
        r"lmcore-scale==1.2\) or unset LMCORE_STRICT_PLUGINS",
    ):
        lmcore.load(path, registry=Registry())
    with pytest.raises(CheckpointError, match="LMCORE_STRICT_PLUGINS is set"):
        lmcore.load(path, registry=Registry(strict=True))


def test_another_distribution_providing_the_name_warns(
    scale_checkpoint, make_dist, tmp_path: Path
) -> None:
    site, path = scale_checkpoint
    forget(site, "scale_norm")
    make_dist("other-scale", version="3.0", entry_points={"scale": "scale_norm2"},
              modules={"scale_norm2": SCALE})  # fmt: skip
    with pytest.warns(
        CheckpointWarning,
        match=r"norm 'scale' was saved with lmcore-scale 1.2 \(entry point 'scale', module "
        r"scale_norm\), and other-scale 3.0 \(plugin 'scale', module scale_norm2\) is "
        r"installed. Loading it anyway; if its tensors no longer fit, or to reproduce it "
        r"exactly, pip install lmcore-scale==1.2",
    ):
        lmcore.load(path, registry=Registry())


def test_two_providers_one_of_them_the_saved_one(scale_checkpoint, make_dist) -> None:
    """The name is ambiguous now; the checkpoint picks the distribution that saved it."""
    _, path = scale_checkpoint
    make_dist("other-scale", version="3.0", entry_points={"scale2": "scale_norm3"},
              modules={"scale_norm3": SCALE})  # fmt: skip
    registry = Registry()
    assert registry.is_ambiguous("norm", "scale")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = lmcore.load(path, registry=registry)
    assert model.blueprint.provenance("norm").dist == "lmcore-scale"
    assert "norm=lmcore-scale:scale(init=0.5)" in str(model.spec)


def test_an_in_process_component_must_be_registered_again(tmp_path: Path) -> None:
    from lmcore import Component
    from lmcore_rmsnorm import RMSNorm

    registry = Registry()
    registry.add(Component(kind="norm", name="mine", build=RMSNorm, params=lambda d_model: d_model),
                 name="my-norms")  # fmt: skip
    path = perturbed(f"{SMALL}, norm=mine", registry=registry).save(tmp_path / "m.safetensors")
    assert str(read_info(path).components["norm"]) == (
        "registered in-process (entry point 'my-norms', module lmcore_rmsnorm)"
    )
    assert lmcore.load(path, registry=registry).spec.norm.name == "mine"
    with pytest.raises(
        CheckpointError,
        match=r"no installed plugin provides it .*; register it before loading "
        r"\(Registry.register / Registry.add, plugin 'my-norms' from module lmcore_rmsnorm\)",
    ):
        lmcore.load(path, registry=Registry())


def test_resolve_checkpoint_gives_the_blueprint_without_weights(saved: Path) -> None:
    bp = resolve_checkpoint(saved)
    assert str(bp.spec) == read_info(saved).spec


# ------------------------------------------------------------------ CS336 state dicts


@pytest.mark.parametrize("suffix", [".pt", ".pth", ".safetensors"])
def test_a_cs336_state_dict_file_loads_strictly(suffix: str, tmp_path: Path) -> None:
    model = perturbed("cs336-tiny")
    path = tmp_path / f"ts_state_dict{suffix}"
    if suffix == ".safetensors":
        save_file(model.state_dict(), str(path))
    else:
        torch.save(model.state_dict(), path)
    loaded = lmcore.load_state_dict_file(path, "cs336-tiny")
    assert torch.equal(loaded(ids(10_000)), model(ids(10_000)))


def test_a_cs336_training_checkpoint_and_a_compiled_models_keys(tmp_path: Path) -> None:
    model = perturbed("cs336-tiny")
    compiled = {f"_orig_mod.{k}": v for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters())
    path = tmp_path / "run.pt"
    torch.save({"model": compiled, "optimizer": optimizer.state_dict(), "iteration": 7}, path)
    loaded = lmcore.load_state_dict_file(path, "cs336-tiny", dtype=torch.bfloat16)
    assert loaded.lm_head.weight.dtype == torch.bfloat16
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight.bfloat16())


def test_a_cs336_state_dict_is_checked_strictly(tmp_path: Path) -> None:
    path = tmp_path / "ts.pt"
    torch.save(perturbed("cs336-tiny").state_dict(), path)
    with pytest.raises(
        CheckpointError,
        match=r"ts.pt: its tensors do not fit the model of vocab_size=10000,.*d_ff=96,.*: wrong "
        r"shape \(9\): layers.0.ffn.w1.weight \(file \(128, 64\), model \(96, 64\)\)",
    ):
        lmcore.load_state_dict_file(path, "cs336-tiny, d_ff=96")


class Sneaky:
    def __init__(self) -> None:
        self.x = 1


def test_a_pickle_with_objects_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"w": torch.zeros(1), "obj": Sneaky()}, path)
    with pytest.raises(
        CheckpointError,
        match=r"evil.pt: holds objects other than tensors and plain containers "
        rf"\({re.escape(Sneaky.__module__)}.Sneaky\), which torch.load\(weights_only=True\) refuses to "
        r"unpickle \(unpickling can run code\); re-save just the state dict: "
        r"torch.save\(model.state_dict\(\), path\)",
    ):
        lmcore.load_state_dict_file(path, "cs336-tiny")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file at all")
    with pytest.raises(
        CheckpointError,
        match=r"junk.pt: is not a readable torch.save file \(unpickling stops: Unsupported operand 110\)",
    ):
        lmcore.load_state_dict_file(junk, "cs336-tiny")
    listed = tmp_path / "list.pt"
    torch.save([torch.zeros(1)], listed)
    with pytest.raises(CheckpointError, match=r"list.pt: holds a list, not a state dict"):
        lmcore.load_state_dict_file(listed, "cs336-tiny")


def test_the_readme_saving_and_loading_example_runs(tmp_path: Path, monkeypatch) -> None:
    """The README's two commands, then its Python block, as written."""
    from lmcore.cli.main import main

    readme = (Path(__file__).resolve().parents[1] / "docs" / "checkpoints.md").read_text()
    section = readme.split("\n## Saving and loading\n", 1)[1].split("\n### ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)```", section, flags=re.S)[0].splitlines()
    assert commands == [
        'lmcore build "tinystories, pos=nope" --save m.safetensors',
        "lmcore describe m.safetensors",
    ]
    monkeypatch.chdir(tmp_path)
    assert main(["build", "tinystories, pos=nope", "--save", "m.safetensors"]) == 0
    assert main(["describe", "m.safetensors"]) == 0
    torch.save(perturbed("cs336-tiny").state_dict(), tmp_path / "ts_state_dict.pt")
    [block] = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    exec(compile(block, "docs/checkpoints.md", "exec"), {})
    assert read_info(tmp_path / "copy.safetensors").metadata == {"note": "strings only"}


def test_a_checkpoint_from_before_the_block_kind_still_loads(tmp_path: Path) -> None:
    """Saved when the components table had norm, ffn, pos and attn only: `block=prenorm` in its
    spec resolves to whatever provides the block now, and the weights load as they were."""
    model = perturbed(SMALL)
    path = model.save(tmp_path / "m.safetensors")

    def older(meta: dict[str, str]) -> dict[str, str]:
        table = json.loads(meta["lmcore.components"])
        del table["block"]
        return {**meta, "lmcore.components": json.dumps(table, sort_keys=True)}

    rewrite(path, metadata=older)
    info = lmcore.read_info(path)
    assert set(info.components) == {"norm", "ffn", "pos", "attn"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = lmcore.load(path)
    assert loaded.blueprint.parts["block"].name == "prenorm"
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
