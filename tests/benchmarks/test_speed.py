"""benchmarks/speed.py builds its peers right: the fused reference and Hugging Face's Llama,
given lmcore's weights, compute lmcore's logits (the benchmark checks this before timing too;
here it runs at the CS336 test shape, in seconds)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from lmcore import build_model
from tests.helpers.runs import load_benchmark

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "speed.py"


@pytest.fixture(scope="module")
def speed() -> ModuleType:
    return load_benchmark("speed")


@pytest.mark.parametrize("spec", ["cs336-tiny", "cs336-tiny, num_kv_heads=2, tie_embeddings=true"])
def test_the_fused_reference_computes_lmcores_logits(speed: ModuleType, spec: str) -> None:
    torch.manual_seed(0)
    model = build_model(spec)
    reference = speed.FusedReference(model.spec, torch.device("cpu"))
    reference.load_state_dict(model.state_dict(), strict=True)
    ids = torch.randint(0, 10000, (2, 16))
    torch.testing.assert_close(reference(ids), model(ids), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("spec", ["cs336-tiny", "cs336-tiny, num_kv_heads=2"])
def test_hugging_face_llama_with_permuted_rotary_rows_computes_lmcores_logits(
    speed: ModuleType, spec: str
) -> None:
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = build_model(spec)
    llama = speed.llama(model.blueprint, model.state_dict(), torch.device("cpu"))
    ids = torch.randint(0, 10000, (2, 16))
    torch.testing.assert_close(llama(ids).logits, model(ids), rtol=1e-4, atol=1e-4)


def test_a_long_context_child_reports_memory_and_time() -> None:
    # The two children run side by side: each spends most of its time importing torch.
    cmd = [sys.executable, str(SCRIPT), "--spec", "cs336-tiny", "--child", "chunked", "32"]
    children = {
        key: subprocess.Popen(
            [*cmd, what], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for what, key in (("memory", "mib"), ("time", "s"))
    }
    for key, child in children.items():
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-2000:]
        got = json.loads(out.strip().splitlines()[-1])
        assert set(got) == {key} and got[key] > 0
