"""CS336 state dicts (`lmcore.load_state_dict_file`): `torch.save` and safetensors files of
CS336-keyed tensors, training checkpoints and compiled models' keys, loaded strictly; pickles
holding anything but tensors refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import lmcore
from lmcore import CheckpointError
from tests.helpers.errors import raises_naming
from tests.helpers.models import perturbed
from tests.helpers.models import token_ids as ids


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
    with raises_naming(
        CheckpointError,
        "ts.pt: ",
        "the model of vocab_size=10000,",
        ",d_ff=96,",
        "wrong shape (9)",  # w1, w2 and w3 of three layers
        "layers.0.ffn.w1.weight (file (128, 64), model (96, 64))",
    ):
        lmcore.load_state_dict_file(path, "cs336-tiny, d_ff=96")


class Sneaky:
    def __init__(self) -> None:
        self.x = 1


def test_a_pickle_with_objects_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"w": torch.zeros(1), "obj": Sneaky()}, path)
    with raises_naming(
        CheckpointError,
        "evil.pt: ",
        f"objects other than tensors and plain containers ({Sneaky.__module__}.Sneaky)",
        "torch.load(weights_only=True)",
        "unpickling can run code",
        "torch.save(model.state_dict(), path)",
    ):
        lmcore.load_state_dict_file(path, "cs336-tiny")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file at all")
    with raises_naming(
        CheckpointError,
        "junk.pt: ",
        "not a readable torch.save file",
        "(unpickling stops: Unsupported operand 110)",
    ):
        lmcore.load_state_dict_file(junk, "cs336-tiny")
    listed = tmp_path / "list.pt"
    torch.save([torch.zeros(1)], listed)
    with pytest.raises(CheckpointError, match=r"list.pt: holds a list, not a state dict"):
        lmcore.load_state_dict_file(listed, "cs336-tiny")
