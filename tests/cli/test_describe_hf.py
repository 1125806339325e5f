"""`lmcore describe`, `lmcore build` and `lmcore convert --print-spec` given a Hugging Face
config.json (or its directory): the parameters of the model it describes, no weights written."""

from __future__ import annotations

from pathlib import Path

import pytest

import lmcore
from lmcore.cli.main import main
from tests.helpers.hf import quiet_transformers

transformers = quiet_transformers()


@pytest.mark.parametrize(
    "config, count",
    [
        ("MixtralConfig", "46,702,792,704"),
        ("GPT2Config", "124,439,808"),
        ("Gemma3TextConfig", "2,628,658,432"),  # local and global layers, rotary bases of each
    ],
)
def test_describe_build_and_print_spec_read_a_config(
    config: str, count: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    getattr(transformers, config)().save_pretrained(tmp_path)
    assert main(["describe", str(tmp_path)]) == 0
    assert f"total {count}" in " ".join(capsys.readouterr().out.split())
    assert main(["build", str(tmp_path / "config.json"), "--device", "meta"]) == 0
    assert f"parameters: {count}" in capsys.readouterr().out
    assert main(["convert", "--from-hf", str(tmp_path), "--print-spec"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == str(lmcore.parse_spec(printed))
    assert not list(tmp_path.glob("*.safetensors"))


def test_describe_counts_qwen3_nexts_default_config_as_hugging_face_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """transformers' Qwen3NextConfig() (Qwen3-Next-80B-A3B's shape): 79,674,391,296 parameters
    (transformers' own count on meta, tests/hf/test_family.py), of which a token uses the router,
    10 of 512 experts and the shared expert: 48 layers × 502 idle experts × 3·2048·512 fewer.
    The decoding state: per DeltaNet layer a 32 × 128 × 128 float32 matrix and the convolution's
    last 3 inputs over 2·16·128 + 32·128 channels; per attention layer 2 · 2 · 256 floats a token."""
    transformers.AutoConfig.for_model("qwen3_next").save_pretrained(tmp_path)
    assert main(["describe", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    active = 79_674_391_296 - 48 * 502 * 3 * 2048 * 512
    assert "total 79,674,391,296" in out
    assert f"active parameters: {active:,} of 79,674,391,296" in out
    deltanet = 32 * 128 * 128 * 4 + (2 * 16 * 128 + 32 * 128) * 3 * 4
    assert deltanet / 2**20 == pytest.approx(2.09, abs=0.005)
    assert "layers all but 3::4 (36), mixer=gated_deltanet - 2.09 MiB" in out
    assert "layers 3::4 (12), mixer=attention 4.00 KiB/token" in out


def test_describe_refuses_the_multimodal_gemma3_naming_its_language_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    transformers.Gemma3Config().save_pretrained(tmp_path)
    assert main(["describe", str(tmp_path)]) != 0
    err = " ".join(capsys.readouterr().err.split())
    for fact in ("model_type 'gemma3'", "Gemma3ForConditionalGeneration", "multimodal",
                 "text_config", "'gemma3_text'"):  # fmt: skip
        assert fact in err, err


@pytest.mark.parametrize("name", ["smollm3", "olmo3", "lfm2"])
def test_describe_gives_hugging_faces_count_of_a_default_config(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`lmcore describe DIR` on a directory holding only a family's default (real-sized)
    config.json prints Hugging Face's own parameter count, counted on meta."""
    import torch

    config = transformers.AutoConfig.for_model(name)
    config.save_pretrained(tmp_path)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    count = sum(p.numel() for p in model.parameters())
    assert main(["describe", str(tmp_path)]) == 0
    assert f"total {count:,}" in " ".join(capsys.readouterr().out.split())
def test_describe_reads_gpt_oss_default_config_with_its_active_parameters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    transformers.AutoConfig.for_model("gpt_oss").save_pretrained(tmp_path)  # YaRN rope
    assert main(["describe", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "total 116,829,156,672" in out  # Hugging Face's count
    assert "active parameters: 5,711,982,912 of 116,829,156,672" in out


def test_describe_counts_deepseek_v3_and_its_active_parameters_on_meta(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """DeepSeek-V3's default config (61 layers, 256 experts in 58 of them): Hugging Face's own
    count, 671,026,404,352, and the 37,552,282,624 a token uses (8 of the 256 routed experts,
    the shared one and the rest), counted from declarations, no module built."""
    transformers.AutoConfig.for_model("deepseek_v3").save_pretrained(tmp_path)
    assert main(["describe", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "total 671,026,404,352" in out
    assert "active parameters: 37,552,282,624 of 671,026,404,352" in out


@pytest.mark.parametrize("name", ["mamba2", "falcon_h1"])
def test_describe_counts_a_default_config_as_hugging_face(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The families of state space layers (issue 34): the default, real-sized config's count."""
    import torch

    config = transformers.AutoConfig.for_model(name)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    count = sum(p.numel() for p in model.parameters())
    config.save_pretrained(tmp_path)
    assert main(["describe", str(tmp_path)]) == 0
    assert f"total {count:,}" in " ".join(capsys.readouterr().out.split())
