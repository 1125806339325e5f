"""`lmcore convert`: its usage (the conversions themselves are tested with tests/hf and
tests/gguf)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lmcore.cli.main import main
from tests.helpers.errors import assert_naming
from tests.helpers.hf import HF_SPEC


def test_convert_needs_one_direction(capsys) -> None:
    assert main(["convert"]) == 2  # usage errors: one line, status 2 (issue 11)
    assert (
        "one of the arguments --from-hf --to-hf --from-gguf --to-gguf --merge is required"
        in capsys.readouterr().err
    )


def _refused(capsys, argv: list[str], *paths: Path) -> None:
    assert main(["convert", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert_naming(err, *(str(p) for p in paths), "which this conversion reads",
                  "choose another output path")  # fmt: skip


def test_every_direction_refuses_an_output_that_is_its_input(
    tmp_path: Path, checkpoint: Path, capsys
) -> None:
    """`convert --from-gguf X.gguf X.gguf` overwrote the GGUF, `--from-hf DIR DIR/model.safetensors`
    the Hugging Face weights (issue 32): each direction refuses before anything is read or
    written, by path, through a symbolic link and through a hard link."""
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF not read: refused before")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"not read either")
    (tmp_path / "link.gguf").symlink_to(gguf)
    os.link(checkpoint, tmp_path / "hard.safetensors")
    files = {
        p: p.read_bytes() for p in (gguf, checkpoint, hf / "config.json", hf / "model.safetensors")
    }
    _refused(capsys, ["--from-gguf", str(gguf), str(gguf)], gguf)
    _refused(
        capsys, ["--from-gguf", str(gguf), str(tmp_path / "link.gguf")], gguf, "through a link"
    )
    _refused(capsys, ["--to-gguf", str(checkpoint), str(checkpoint)], checkpoint)
    _refused(capsys, ["--to-gguf", str(checkpoint), str(tmp_path / "hard.safetensors")], checkpoint)
    _refused(capsys, ["--to-hf", str(checkpoint), str(checkpoint)], checkpoint)
    _refused(
        capsys, ["--from-hf", str(hf), str(hf / "model.safetensors")], hf / "model.safetensors"
    )
    _refused(capsys, ["--from-hf", str(hf), str(hf)], hf)
    assert {p: p.read_bytes() for p in files} == files
    assert sorted(p.name for p in hf.iterdir()) == ["config.json", "model.safetensors"]


def test_to_hf_into_the_checkpoints_own_directory_is_refused(tmp_path: Path, capsys) -> None:
    checkpoint = tmp_path / "m.safetensors"
    assert main(["build", HF_SPEC, "--save", str(checkpoint)]) == 0  # a Llama's shape
    for force in ([], ["--force"]):
        assert main(["convert", "--to-hf", str(checkpoint), str(checkpoint.parent), *force]) == 2
        assert_naming(capsys.readouterr().err, str(checkpoint.parent),
                      "--force" if not force else "move it out first")  # fmt: skip
        assert checkpoint.is_file()


def test_a_directory_with_both_weights_says_which_it_converted(tmp_path: Path, capsys) -> None:
    pytest.importorskip("transformers")
    from tests.helpers.hf import quiet_transformers, random_llama

    quiet_transformers()
    random_llama(tmp_path / "hf", shard=True)
    random_llama(tmp_path / "one")
    os.replace(tmp_path / "one" / "model.safetensors", tmp_path / "hf" / "model.safetensors")
    assert (
        main(["convert", "--from-hf", str(tmp_path / "hf"), str(tmp_path / "o.safetensors")]) == 0
    )
    assert_naming(capsys.readouterr().out, "note:", "both model.safetensors and "
                  "model.safetensors.index.json", "converted model.safetensors, which transformers loads")  # fmt: skip


def test_a_config_without_model_type_says_which_family_it_was_read_as(
    tmp_path: Path, capsys
) -> None:
    """config.json without model_type was converted as a Llama, silently (issue 32): its
    architectures name the family, and the output says so."""
    pytest.importorskip("transformers")
    import json

    from tests.helpers.hf import quiet_transformers, random_llama

    quiet_transformers()
    random_llama(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    del config["model_type"]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    assert (
        main(["convert", "--from-hf", str(tmp_path / "hf"), str(tmp_path / "o.safetensors")]) == 0
    )
    assert_naming(capsys.readouterr().out, "has no model_type", "read as llama", "LlamaForCausalLM")
    config["architectures"] = ["BertForMaskedLM"]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    assert (
        main(["convert", "--from-hf", str(tmp_path / "hf"), str(tmp_path / "p.safetensors")]) == 2
    )
    assert_naming(capsys.readouterr().err, "BertForMaskedLM", "llama, mistral", 'add "model_type"')
