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
