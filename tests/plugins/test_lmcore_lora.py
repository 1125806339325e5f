"""adapter=lora: the update against an independent formula (W x + (alpha/r) B A x, per logical
matrix of a packed one), its initialisation, the spec's canonical form, targets, the frozen
base, saving the adapter alone with its base's identity, merging, and PEFT as a peer."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import lmcore
from lmcore.adapting import adapt, merged
from lmcore.errors import CheckpointError, SpecError
from lmcore.model.adapters import adapter_state, parameter_counts
from lmcore_lora import LoRA

TINY = "vocab_size=97, context_length=16, d_model=32, num_layers=2, num_heads=2, d_ff=64"


def ids() -> torch.Tensor:
    return torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(0))


def moved(model: torch.nn.Module, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


def test_the_update_is_alpha_over_rank_b_a_x_per_logical_matrix() -> None:
    torch.manual_seed(0)
    lora = LoRA(6, 7, (3, 4), rank=2, alpha=5.0)
    with torch.no_grad():
        lora.lora_B.normal_()
    x = torch.randn(4, 6, dtype=torch.float64)
    a, b = lora.lora_A.double(), lora.lora_B.double()
    want = torch.cat([x @ a[:2].T @ b[:3].T, x @ a[2:].T @ b[3:].T], dim=-1) * (5.0 / 2)
    got = lora.double()(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x @ lora.delta().T, want)  # delta() is the same update


def test_b_starts_at_zero_and_a_is_kaiming_uniform() -> None:
    torch.manual_seed(0)
    lora = LoRA(512, 64, (64,), rank=16)
    assert torch.count_nonzero(lora.lora_B) == 0
    bound = 1 / math.sqrt(512)  # kaiming_uniform_(a=sqrt(5)) over fan-in 512, as nn.Linear
    assert lora.lora_A.abs().max() <= bound and lora.lora_A.abs().max() > 0.9 * bound
    gauss = LoRA(512, 64, (64,), rank=16, init="gaussian")
    assert abs(gauss.lora_A.std().item() - 1 / 16) < 0.005


def test_a_spec_without_an_adapter_keeps_its_canonical_string() -> None:
    plain = lmcore.parse_spec("tinystories")
    assert "adapter" not in str(plain)
    assert lmcore.parse_spec("tinystories, adapter=none") == plain
    with_one = lmcore.parse_spec("tinystories, adapter=lora(rank=4)")
    assert str(with_one).endswith(
        ',adapter=lora(rank=4,alpha=16.0,targets="matrix,packed",dropout=0.0,init=kaiming)'
    )
    assert lmcore.parse_spec(str(with_one)) == with_one


def test_the_base_keeps_its_names_and_only_the_adapter_trains() -> None:
    torch.manual_seed(0)
    base = lmcore.build_model(TINY)
    torch.manual_seed(0)
    model = lmcore.build_model(f"{TINY}, adapter=lora(rank=4)")
    theirs = set(base.state_dict())
    assert theirs <= set(model.state_dict())
    extra = set(model.state_dict()) - theirs
    assert all(".adapter.lora_" in k for k in extra)
    assert all(base.state_dict()[k].equal(model.state_dict()[k]) for k in theirs)
    torch.testing.assert_close(model(ids()), base(ids()), rtol=0, atol=0)
    trainable, frozen = parameter_counts(model)
    # 7 matrices a layer (q, k, v, out, w1, w2, w3), each r·(in + out)
    per_layer = 4 * 4 * (32 + 32) + 4 * (32 + 64) * 3
    assert (trainable, frozen) == (2 * per_layer, sum(p.numel() for p in base.parameters()))


def test_targets_by_module_name_and_the_errors_name_the_choices() -> None:
    model = lmcore.build_model(f'{TINY}, adapter=lora(targets="q_proj,v_proj")')
    adapted = {k.rpartition(".adapter.")[0] for k in adapter_state(model)}
    assert adapted == {f"layers.{i}.attn.{m}" for i in (0, 1) for m in ("q_proj", "v_proj")}
    with pytest.raises(SpecError, match=r"'q_prj' names no role and no Linear.*did you mean 'q_proj'"):
        lmcore.build_model(f"{TINY}, adapter=lora(targets=q_prj)")
    with pytest.raises(SpecError, match=r"lm_head.weight is tied"):
        lmcore.build_model(f"{TINY}, tie_embeddings=true, adapter=lora(targets=lm_head)")
    with pytest.raises(SpecError, match="dropout must be < 1"):
        lmcore.parse_spec(f"{TINY}, adapter=lora(dropout=1.0)")


def test_gradients_reach_only_the_adapter() -> None:
    model = lmcore.build_model(f"{TINY}, adapter=lora(rank=2)")
    moved(model)
    model(ids()).square().mean().backward()
    for name, p in model.named_parameters():
        assert (p.grad is not None) == (".adapter." in name), name


def test_the_adapter_is_saved_alone_and_loads_onto_its_checked_base(tmp_path: Path) -> None:
    torch.manual_seed(0)
    lmcore.build_model(TINY).save(tmp_path / "base.safetensors")
    model = adapt(tmp_path / "base.safetensors", "lora(rank=4)")
    moved(model)
    want = model(ids())
    path = model.save(tmp_path / "adapter.safetensors")
    assert set(lmcore.checkpoint.read_info(path).tensors) == set(adapter_state(model))
    assert path.stat().st_size < 4 * parameter_counts(model)[0] + 16384  # the adapter's bytes
    info = lmcore.checkpoint.read_info(path)
    assert info.base is not None and info.base["relative"] == "base.safetensors"
    again = lmcore.load(path)
    torch.testing.assert_close(again(ids()), want, rtol=0, atol=0)
    # Merged, it is a plain checkpoint with the same logits.
    plain = merged(again)
    assert plain.spec.adapter is None and "adapter" not in str(plain.spec)
    torch.testing.assert_close(plain(ids()), want, rtol=1e-5, atol=1e-5)
    # A changed base is refused, naming both.
    base = lmcore.load(tmp_path / "base.safetensors")
    with torch.no_grad():
        base.ln_final.weight.add_(1.0)
    base.save(tmp_path / "base.safetensors")
    with pytest.raises(CheckpointError, match=r"adapter\.safetensors: is an adapter of the base "
                       r"checkpoint with checksum [0-9a-f]{8} .*base\.safetensors has checksum"):
        lmcore.load(path)


def test_a_packed_matrix_gets_one_pair_per_logical_matrix() -> None:
    # The short convolution's in_proj packs b, c and h (lmcore_short_conv).
    spec = f"{TINY}, mixer=short_conv, adapter=lora(rank=2, targets=packed)"
    model = lmcore.build_model(spec)
    [name] = {k.rpartition(".adapter.")[0] for k in adapter_state(model) if k.startswith("layers.0")}
    lora = model.get_submodule(f"{name}.adapter")
    assert lora.splits == (32, 32, 32) and tuple(lora.lora_A.shape) == (6, 32)
    moved(model)
    torch.testing.assert_close(merged(model)(ids()), model(ids()), rtol=1e-5, atol=1e-5)


class NNLinearSwiGLU(torch.nn.Module):
    """SwiGLU on torch's nn.Linear, as plugins on torch's kernels (examples/lmcore-torch's
    torch_swiglu) hold it; nn.Linear declares no roles, so its owner does."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = torch.nn.Linear(32, 64, bias=False)
        self.w2 = torch.nn.Linear(64, 32, bias=False)
        self.w3 = torch.nn.Linear(32, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.w1(x)
        return self.w2(a * torch.sigmoid(a) * self.w3(x))

    def parameter_roles(self) -> dict[str, object]:
        from lmcore.model.roles import MATRIX

        return {f"{w}.weight": MATRIX for w in ("w1", "w2", "w3")}


def test_torchs_nn_linear_is_targeted_like_lmcores_linear() -> None:
    from lmcore.model.adapters import with_adapter

    torch.manual_seed(0)
    ours, theirs = lmcore.build_model(TINY), lmcore.build_model(TINY)
    for layer in theirs.layers:
        layer.ffn = NNLinearSwiGLU()
    theirs.load_state_dict(ours.state_dict())
    assert with_adapter(theirs, "lora(rank=4)") == with_adapter(ours, "lora(rank=4)")
    assert hasattr(theirs.layers[0].ffn.w1, "adapter")  # the ffn's three matrices too: 7 a layer
    assert len(adapter_state(theirs)) == len(adapter_state(ours)) == 2 * 7 * 2
    moved(ours)
    theirs.load_state_dict(ours.state_dict())
    torch.testing.assert_close(theirs(ids()), ours(ids()), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(merged(theirs)(ids()), theirs(ids()), rtol=1e-5, atol=1e-5)


def test_peft_lora_on_the_same_matrices_gives_the_same_outputs() -> None:
    peft = pytest.importorskip("peft", reason="needs the test extra's peft: pip install -e '.[test]'")
    from torch import nn

    torch.manual_seed(0)
    lin = nn.Sequential()
    lin.add_module("q_proj", nn.Linear(16, 8, bias=False))
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], lora_dropout=0.0)
    theirs = peft.get_peft_model(lin, config)
    ours = LoRA(16, 8, (8,), rank=4, alpha=8.0)
    layer = theirs.base_model.model.q_proj
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()
        ours.lora_A.copy_(layer.lora_A["default"].weight)
        ours.lora_B.copy_(layer.lora_B["default"].weight)
    x = torch.randn(3, 16)
    torch.testing.assert_close(lin.q_proj.base_layer(x) + ours(x), theirs(x))


def test_lmcore_train_with_an_adapter_trains_only_the_adapter(tiny_data: Path, tmp_path: Path) -> None:
    from lmcore.cli.main import main
    from tests.helpers.models import TINY_SPEC

    run = tmp_path / "run"
    argv = ["train", f"{TINY_SPEC}, adapter=lora(rank=2)", "--data", str(tiny_data), "--out",
            str(run), "--steps", "6", "--eval-every", "3", "--lr", "3e-3", "--batch-size", "4",
            "--eval-batches", "1", "--device", "cpu"]  # fmt: skip
    torch.manual_seed(0)
    start = lmcore.build_model(f"{TINY_SPEC}, adapter=lora(rank=2)")
    assert main(argv) == 0
    trained = lmcore.load(run)  # its newest checkpoint
    assert trained.spec.adapter is not None
    after, before = trained.state_dict(), start.state_dict()
    changed = {k for k in before if not torch.equal(after[k], before[k])}
    assert changed and all(".adapter." in k for k in changed)
