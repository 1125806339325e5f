"""Every Hugging Face family lmcore converts, through `lmcore convert` both ways and `lmcore
generate`, against transformers' own modeling code: a tiny random model (every weight, norm
gains and biases included, perturbed) gives the same logits in lmcore, the same logits again once
converted back, and the same greedy tokens through lmcore's KV cache as `generate`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import lmcore
from lmcore.cli.main import main
from lmcore.hf import FAMILIES
from lmcore.model.generate import GREEDY
from tests.helpers.hf import FAMILY_CONFIGS, HF_VOCAB, quiet_transformers, random_family_model

transformers = quiet_transformers()
from transformers import AutoModelForCausalLM  # noqa: E402

FAMILY_TOLERANCE = 1e-4  # max abs logit difference, float32


def test_every_family_has_a_case() -> None:
    assert sorted(FAMILY_CONFIGS) == sorted(FAMILIES)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_family_converts_both_ways_exactly(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reference = random_family_model(name, tmp_path / "hf")
    ids = torch.randint(0, HF_VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = reference(ids).logits
    out = tmp_path / "m.safetensors"
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), str(out)]) == 0
    ours = lmcore.load(out).eval()
    with torch.no_grad():
        got = ours(ids)
    assert (got - expected).abs().max() <= FAMILY_TOLERANCE

    assert main(["convert", "--to-hf", str(out), str(tmp_path / "back")]) == 0
    back, info = AutoModelForCausalLM.from_pretrained(
        tmp_path / "back", attn_implementation="eager", output_loading_info=True
    )
    assert not any(info.values()), info  # no missing, unexpected or mismatched tensors
    with torch.no_grad():
        assert (back.eval()(ids).logits - got).abs().max() <= FAMILY_TOLERANCE
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["model_type"] == name

    prompt = ids[0, :5]
    theirs = reference.generate(prompt[None], max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(prompt, 12, GREEDY), theirs[0, 5:])
    capsys.readouterr()
    argv = ["generate", str(out), "--prompt-ids", ",".join(map(str, prompt.tolist())),
            "--temperature", "0", "--max-new-tokens", "12"]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out.split() == [str(i) for i in theirs[0, 5:].tolist()]
