"""`lmcore convert --from-hf` and `--to-hf`: Llama directories there and back through the command
line (sharded, tied, grouped heads), its flags (--dtype, --ignore-field, --model-type, --force)
and what it refuses, writing nothing (the conversion itself: tests/hf/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import lmcore
from lmcore import ConversionError
from lmcore.cli.main import main
from lmcore.hf import config_to_spec, convert_from_hf, convert_to_hf
from tests.helpers.errors import raises_naming
from tests.helpers.hf import HF_SPEC as SMALL
from tests.helpers.hf import (
    HF_TOLERANCE,
    LLAMA_V4,
    hf_logits,
    lm_logits,
    quiet_transformers,
    random_llama,
)
from tests.helpers.models import token_ids

transformers = quiet_transformers()
from transformers import LlamaForCausalLM  # noqa: E402


@pytest.mark.parametrize(
    "kv_heads, tie, shard",
    [(4, False, False), (2, False, True), (1, True, True), (2, True, False)],
    ids=["mha", "gqa-sharded", "mqa-tied-sharded", "gqa-tied"],
)
def test_from_hf_and_back_through_the_command_line(
    tmp_path: Path, kv_heads: int, tie: bool, shard: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "hf"
    reference = random_llama(source, kv_heads=kv_heads, tie=tie, shard=shard)
    if shard:
        assert len(list(source.glob("model-*.safetensors"))) > 2
    out = tmp_path / "m.safetensors"
    assert main(["convert", "--from-hf", str(source), str(out)]) == 0
    spec = f"{SMALL}, num_kv_heads={kv_heads}, tie_embeddings={str(tie).lower()}, "
    spec += "norm=rmsnorm(eps=1e-5), pos=rope(theta=500)"
    assert capsys.readouterr().out.splitlines()[0] == f"spec: {lmcore.parse_spec(spec)}"

    ours = lmcore.load(out)
    ids = token_ids(seq=32, seed=3)
    expected = hf_logits(reference, ids)
    assert (lm_logits(ours, ids) - expected).abs().max() <= HF_TOLERANCE
    assert (ours.lm_head.weight is ours.token_embeddings.weight) == tie

    back_dir = tmp_path / "back"
    assert main(["convert", "--to-hf", str(out), str(back_dir)]) == 0
    assert "LlamaForCausalLM.from_pretrained loads it" in capsys.readouterr().out
    back, info = LlamaForCausalLM.from_pretrained(back_dir, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched keys
    back.eval()
    # The exact weights went there and back: the Hugging Face logits are the same numbers.
    assert torch.equal(hf_logits(back, ids), expected)
    assert (hf_logits(back, ids) - lm_logits(ours, ids)).abs().max() <= HF_TOLERANCE


def test_bfloat16_weights_keep_their_dtype_unless_asked(tmp_path: Path) -> None:
    reference = random_llama(tmp_path / "f32")
    reference.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    kept = convert_from_hf(tmp_path / "bf16", tmp_path / "bf16.safetensors")
    assert lmcore.read_info(kept).dtype == "bfloat16"
    assert main(["convert", "--from-hf", str(tmp_path / "bf16"), str(tmp_path / "f32.safetensors"),
                 "--dtype", "float32"]) == 0  # fmt: skip
    wide = lmcore.load(tmp_path / "f32.safetensors")
    assert wide.lm_head.weight.dtype == torch.float32
    assert torch.equal(wide.lm_head.weight, reference.lm_head.weight.float())


def test_a_field_known_not_to_matter_can_be_ignored(tmp_path: Path, capsys) -> None:
    config = {**LLAMA_V4, "rope_interleaved": False, "is_llama_config": True}
    with pytest.raises(ConversionError, match=r"not know.*: is_llama_config, rope_interleaved"):
        config_to_spec(config)
    spec = config_to_spec(config, ignore=["rope_interleaved", "is_llama_config"])
    assert spec == config_to_spec(LLAMA_V4)
    random_llama(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "rope_interleaved": False}))
    out = str(tmp_path / "m.safetensors")
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), out]) == 2
    assert "rope_interleaved (if you know" in capsys.readouterr().err
    argv = ["convert", "--from-hf", str(tmp_path / "hf"), out, "--ignore-field", "rope_interleaved"]
    assert main(argv) == 0
    assert '"rope_interleaved": false' in lmcore.read_info(out).metadata["hf.config"]
    assert main(["convert", "--to-hf", out, str(tmp_path / "back"), "--ignore-field", "x"]) == 2
    assert "--dtype, --ignore-field and --print-spec apply to --from-hf only" in (
        capsys.readouterr().err
    )


def test_a_refused_directory_writes_nothing(tmp_path: Path, capsys) -> None:
    random_llama(tmp_path / "hf", rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                  "rope_theta": 500.0})  # fmt: skip
    out = tmp_path / "m.safetensors"
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), str(out)]) == 2
    assert 'rope type "dynamic"' in capsys.readouterr().err
    assert not out.exists()


def test_a_yarn_llama_gives_transformers_logits_both_ways(tmp_path: Path) -> None:
    rope = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 500.0, "beta_fast": 8.0,
            "original_max_position_embeddings": 8, "truncate": False}  # fmt: skip
    reference = random_llama(tmp_path / "hf", rope_parameters=rope)
    ids = token_ids(97, 24)
    with torch.no_grad():
        expected = reference(ids).logits
    out = tmp_path / "m.safetensors"
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), str(out)]) == 0
    ours = lmcore.load(out).eval()
    assert ours.blueprint.kwargs("pos")["scaling"] == "yarn"
    with torch.no_grad():
        got = ours(ids)
    assert (got - expected).abs().max() <= 1e-4
    assert main(["convert", "--to-hf", str(out), str(tmp_path / "back")]) == 0
    back = LlamaForCausalLM.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        assert (back(ids).logits - expected).abs().max() <= 1e-4


@pytest.mark.parametrize(
    "change, facts",
    [
        ("block=postnorm", ("block=postnorm: a LlamaForCausalLM has block=prenorm",)),
        ("pos=alibi", ("pos=alibi: a LlamaForCausalLM has pos=rope(theta=10000.0)",)),
        ("pos=nope", ("pos=nope: a LlamaForCausalLM has pos=rope",)),
        ("pos=learned", ("pos=learned: a LlamaForCausalLM has pos=rope",)),
        ("norm=layernorm",
         ("norm=layernorm(bias=true,eps=1e-05): a LlamaForCausalLM has norm=rmsnorm(eps=1e-05)",)),
        ("ffn=gelu", ("ffn=gelu: a LlamaForCausalLM has ffn=swiglu",)),
        ("window=4", ("window=4: a LlamaForCausalLM has window=0",)),
        ("norm=none, ffn=geglu, pos=sinusoidal",
         ("norm=none: ", "pos=sinusoidal(base=10000.0): a LlamaForCausalLM has pos=rope")),
],
)  # fmt: skip
def test_what_llama_cannot_express_is_refused_by_name(
    change: str, facts: tuple[str, ...], tmp_path: Path, capsys
) -> None:
    path = lmcore.build_model(f"{SMALL}, {change}").save(tmp_path / "m.safetensors")
    with raises_naming(
        ConversionError, "cannot convert this model to a Hugging Face LlamaForCausalLM", *facts
    ):
        convert_to_hf(path, tmp_path / "hf", model_type="llama")
    argv = ["convert", "--to-hf", str(path), str(tmp_path / "hf"), "--model-type", "llama"]
    assert main(argv) == 2
    assert "lmcore convert: error: cannot convert this model" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


def test_to_hf_refuses_a_directory_that_is_not_empty_and_force_replaces_it_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The probe: into a copy of another model's directory --to-hf exited 0, replaced
    # config.json and model.safetensors and left its generation_config.json mixed in; into a
    # directory with an unrelated config.json, the same.
    ckpt = lmcore.build_model(SMALL).save(tmp_path / "m.safetensors")
    other = tmp_path / "other"
    random_llama(other)
    (other / "generation_config.json").write_text("{}")
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    unrelated = tmp_path / "unrelated"
    unrelated.mkdir()
    (unrelated / "config.json").write_text('{"x": 1}')
    for target, held in ((other, "config.json, generation_config.json, model.safetensors"),
                         (unrelated, "config.json")):  # fmt: skip
        assert main(["convert", "--to-hf", str(ckpt), str(target)]) == 2
        assert capsys.readouterr().err == (
            f"lmcore convert: error: target directory {str(target)!r} is not empty (it holds "
            f"{held}); nothing was written: pass --force to replace it whole, or choose an "
            "empty directory\n"
        )
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before
    assert main(["convert", "--to-hf", str(ckpt), str(other), "--force"]) == 0
    assert sorted(p.name for p in other.iterdir()) == ["config.json", "model.safetensors"]
    assert LlamaForCausalLM.from_pretrained(other).config.vocab_size == 97
    # The checkpoint itself inside the directory --force would replace: refused, kept
    inside = tmp_path / "inside"
    inside.mkdir()
    kept = lmcore.build_model(SMALL).save(inside / "m.safetensors")
    assert main(["convert", "--to-hf", str(kept), str(inside), "--force"]) == 2
    assert f"the checkpoint {str(kept)!r} is inside target directory" in capsys.readouterr().err
    assert kept.is_file()
    assert main(["convert", "--from-hf", str(other), str(tmp_path / "x.safetensors"),
                 "--force"]) == 2  # fmt: skip
    assert "--force and --model-type apply to --to-hf only" in capsys.readouterr().err


def test_a_trillion_layers_print_at_once_and_convert_refuses_the_weights_of_two(
    tmp_path: Path, capsys
) -> None:
    """config.json's num_hidden_layers = 10**12 (issue 32: MemoryError in --print-spec and in
    convert): the spec is printed at once, with no work per layer (the blueprint's groups), and
    the conversion names the two layers its weights hold, before a model is built."""
    random_llama(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["num_hidden_layers"] = 10**12
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--print-spec"]) == 0
    assert "num_layers=1000000000000," in capsys.readouterr().out
    out = tmp_path / "o.safetensors"
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    assert "num_hidden_layers=1,000,000,000,000" in err and "hold 2 layers" in err
