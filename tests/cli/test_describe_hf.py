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
    "config, count", [("MixtralConfig", "46,702,792,704"), ("GPT2Config", "124,439,808")]
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
