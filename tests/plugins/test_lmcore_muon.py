"""optimizer=muon against torch.optim.Muon: the same updates over several steps on plain
matrices (with torch's options), on each logical matrix of a packed tensor, on a batch of
matrices and on a transposed layout; routing by role to the fallback; the state dict; its
argument errors; `lmcore train --optimizer muon --schedule wsd` end to end with an exact
resume; FSDP refused."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import lmcore
from lmcore.cli.main import main
from lmcore.errors import SpecError, TrainError
from lmcore.model.roles import roles_of
from lmcore.train.config import TrainConfig
from lmcore.train.recipe import build_optimizer, param_groups, resolve_recipe, role_table
from lmcore.train.runs import latest_checkpoint, read_run
from lmcore.train.trainer import Parallel, train
from tests.helpers.models import TINY_SPEC

OFFER = {"lr": 0.02, "weight_decay": 0.1, "betas": (0.9, 0.95), "eps": 1e-8}


def _group(params: list[torch.nn.Parameter], role: str = "matrix", **kw: Any) -> dict[str, Any]:
    return {"params": params, "lr": 0.02, "lr_scale": 1.0, "weight_decay": 0.1, "role": role,
            "fan_in": -1, "fan_out": -2, "splits": [], **kw}  # fmt: skip


def _params(*shapes: tuple[int, ...], seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]


def _clones(params: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(p.detach().clone()) for p in params]


def _grads(params: list[torch.nn.Parameter], step: int) -> None:
    gen = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)


def _muon(groups: list[dict[str, Any]], spec: str = "muon") -> torch.optim.Optimizer:
    return build_optimizer(resolve_recipe("optimizer", spec), groups, **OFFER)


OPTIONS = [
    ({}, "muon"),
    ({"nesterov": False}, "muon(nesterov=false)"),
    ({"momentum": 0.8, "ns_steps": 3}, "muon(momentum=0.8, ns_steps=3)"),
    ({"adjust_lr_fn": "match_rms_adamw"}, "muon(adjust_lr=match_rms_adamw)"),
]


@pytest.mark.parametrize(("torch_options", "spec"), OPTIONS)
def test_updates_equal_torchs(torch_options: dict[str, Any], spec: str) -> None:
    ours = _params((48, 32), (32, 48), (32, 32), (48, 32), (20, 12))
    ref, start = _clones(ours), _clones(ours)
    opt = _muon([_group(ours[:3]), _group(ours[3:], lr=0.01, weight_decay=0.0)], spec)
    torch_opt = torch.optim.Muon(
        [{"params": ref[:3], "lr": 0.02, "weight_decay": 0.1},
         {"params": ref[3:], "lr": 0.01, "weight_decay": 0.0}], **torch_options,
    )  # fmt: skip
    for step in range(5):
        _grads(ours, step)
        _grads(ref, step)
        opt.step()
        torch_opt.step()
    for i, (a, b, s) in enumerate(zip(ours, ref, start, strict=True)):
        assert torch.equal(a, b), i
        assert (a - s).abs().max() > 1e-3  # it moved
    assert [g["update"] for g in opt.param_groups] == ["muon", "muon"]


def test_the_batched_path_an_accelerator_takes_gives_the_same_updates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the CPU Muon orthogonalises one matrix at a time; on a GPU it stacks every matrix of
    one shape (over parameters, splits and experts) into one batched product: the same
    numbers."""
    import lmcore_muon

    monkeypatch.setattr(lmcore_muon, "batched", lambda device: True)
    shapes = [(48, 32), (32, 48), (48, 32), (2, 48, 32), (96, 32)]
    ours = _params(*shapes)
    ref = _clones(ours)
    groups = [_group(ours[:4]), _group(ours[4:], "packed", splits=[48, 48])]
    opt = _muon(groups)
    ref_groups = [_group(ref[:4]), _group(ref[4:], "packed", splits=[48, 48])]
    monkeypatch.undo()
    torch_like = _muon(ref_groups)  # one at a time, as checked against torch above
    monkeypatch.setattr(lmcore_muon, "batched", lambda device: True)
    for step in range(3):
        _grads(ours, step)
        _grads(ref, step)
        opt.step()
        monkeypatch.undo()
        torch_like.step()
        monkeypatch.setattr(lmcore_muon, "batched", lambda device: True)
    for a, b in zip(ours, ref, strict=True):
        assert torch.equal(a, b)


def test_each_logical_matrix_of_a_packed_tensor_is_orthogonalised_alone() -> None:
    splits = [32, 48, 16]
    (packed,) = _params((96, 32))
    ref = [torch.nn.Parameter(s.detach().clone()) for s in packed.split(splits)]
    opt = _muon([_group([packed], "packed", splits=splits)])
    torch_opt = torch.optim.Muon(ref, lr=0.02, weight_decay=0.1)
    whole = torch.optim.Muon(_clones([packed]), lr=0.02, weight_decay=0.1)  # not the answer
    for step in range(3):
        _grads([packed], step)
        for r, g in zip(ref, packed.grad.split(splits), strict=True):  # type: ignore[union-attr]
            r.grad = g.clone()
        whole.param_groups[0]["params"][0].grad = packed.grad.clone()  # type: ignore[union-attr]
        opt.step()
        torch_opt.step()
        whole.step()
    assert torch.equal(packed.detach(), torch.cat([r.detach() for r in ref]))
    assert not torch.allclose(packed, whole.param_groups[0]["params"][0], atol=1e-3)


def test_a_batch_of_matrices_is_orthogonalised_matrix_by_matrix() -> None:
    (experts,) = _params((4, 48, 32))  # stacked experts: (E, out, in)
    ref = [torch.nn.Parameter(e.detach().clone()) for e in experts]
    opt = _muon([_group([experts])])
    torch_opt = torch.optim.Muon(ref, lr=0.02, weight_decay=0.1)
    for step in range(3):
        _grads([experts], step)
        for r, g in zip(ref, experts.grad, strict=True):  # type: ignore[arg-type]
            r.grad = g.clone()
        opt.step()
        torch_opt.step()
    assert torch.equal(experts.detach(), torch.stack([r.detach() for r in ref]))


def test_the_declared_axes_are_honoured_in_a_transposed_layout() -> None:
    """A matrix stored (in, out) with experts on the last axis: fan_in 0, fan_out 1."""
    (w,) = _params((32, 48, 3))  # in 32, out 48, 3 experts
    ref = [torch.nn.Parameter(w[:, :, e].T.detach().clone()) for e in range(3)]  # (out, in)
    opt = _muon([_group([w], fan_in=0, fan_out=1)])
    torch_opt = torch.optim.Muon(ref, lr=0.02, weight_decay=0.1)
    for step in range(3):
        _grads([w], step)
        for e, r in enumerate(ref):
            r.grad = w.grad[:, :, e].T.clone()  # type: ignore[index]
        opt.step()
        torch_opt.step()
    got = torch.stack([w[:, :, e].T for e in range(3)]).detach()
    assert torch.equal(got, torch.stack([r.detach() for r in ref]))


def test_other_roles_go_to_the_fallback_and_match_it_alone() -> None:
    model = lmcore.build_model("cs336-tiny")
    twin = lmcore.build_model("cs336-tiny")
    twin.load_state_dict(model.state_dict())

    def groups(m: torch.nn.Module) -> list[dict[str, Any]]:
        return param_groups(m, roles_of(m), decay=("matrix", "head"), weight_decay=0.1,
                            lr=0.02, multipliers={"embedding": 0.5})[0]  # fmt: skip

    opt = _muon(groups(model))
    table = role_table(opt.param_groups)
    assert {role: row["update"] for role, row in table.items()} == {
        "matrix": "muon", "embedding": "adamw", "gain": "adamw", "head": "adamw",
    }  # fmt: skip
    mine = groups(twin)
    matrices = [g for g in mine if g["role"] == "matrix"]
    others = [g for g in mine if g["role"] != "matrix"]
    adamw = build_optimizer(resolve_recipe("optimizer", "adamw"), others, **OFFER)
    muon = torch.optim.Muon([{"params": g["params"], "lr": g["lr"],
                              "weight_decay": g["weight_decay"]} for g in matrices])  # fmt: skip
    for step in range(4):
        _grads(list(model.parameters()), step)
        _grads(list(twin.parameters()), step)
        opt.step()
        adamw.step()
        muon.step()
    for (name, a), b in zip(model.named_parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_a_reloaded_state_continues_bit_for_bit() -> None:
    def fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        m = lmcore.build_model("cs336-tiny")
        groups = param_groups(m, roles_of(m), decay=("matrix",), weight_decay=0.1, lr=0.02,
                              multipliers={})[0]  # fmt: skip
        return m, _muon(groups)

    a, opt_a = fresh()
    for step in range(3):
        _grads(list(a.parameters()), step)
        opt_a.step()
    b, opt_b = fresh()
    b.load_state_dict(a.state_dict())
    saved = copy.deepcopy(opt_a.state_dict())
    assert {k for s in saved["state"].values() for k in s} == {
        "momentum_buffer", "step", "exp_avg", "exp_avg_sq",
    }  # fmt: skip
    opt_b.load_state_dict(saved)
    for g in opt_b.param_groups:
        g["lr"] = 0.01  # the runner's schedule: it must reach the part that steps the group
    for g in opt_a.param_groups:
        g["lr"] = 0.01
    for step in range(3, 6):
        _grads(list(a.parameters()), step)
        _grads(list(b.parameters()), step)
        opt_a.step()
        opt_b.step()
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(x, y)


def test_canonical_form_and_provenance_name_the_fallback() -> None:
    part = resolve_recipe("optimizer", "muon(fallback=torch_adamw)")
    assert str(part.spec) == (
        "muon(momentum=0.95,nesterov=true,ns_steps=5,adjust_lr=original,fallback=torch_adamw)"
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("muon(ns_steps=0)", r"argument 'ns_steps' of optimizer 'muon' must be >= 1, got 0"),
        (
            "muon(ns_steps=100)",
            r"ns_steps must be from 1 to 99 \(Newton–Schulz iterations\), "
            r"got 100",
        ),
        ("muon(momentum=1.0)", r"optimizer 'muon': momentum must be in \[0, 1\), got 1.0"),
        ("muon(momentum=-0.1)", r"argument 'momentum' of optimizer 'muon' must be >= 0.0"),
        (
            "muon(adjust_lr=match_rms)",
            r"must be one of match_rms_adamw, original, got "
            r"'match_rms' \(did you mean 'match_rms_adamw'\?\)",
        ),
        (
            "muon(fallback=adamm)",
            r"no installed plugin provides optimizer 'adamm' \(did you "
            r"mean 'adamw'\?\)",
        ),
        ("muon(fallback=rmsnorm)", r"no installed plugin provides optimizer 'rmsnorm'"),
        ("muon(fallback=muon)", r"fallback=muon: the fallback updates what Muon does not take"),
    ],
)
def test_bad_arguments_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        resolve_recipe("optimizer", spec)


# ------------------------------------------------------------------ lmcore train, end to end

FAST = ["--batch-size", "8", "--eval-batches", "2", "--device", "cpu", "--eval-every", "5"]


@pytest.mark.usefixtures("single_thread")
def test_train_with_muon_and_wsd_resumes_bit_for_bit(tiny_data: Path, tmp_path: Path) -> None:
    recipe = ["--optimizer", "muon", "--schedule", "wsd", "--lr", "0.01", "--steps", "12"]
    whole, split = tmp_path / "whole", tmp_path / "split"
    args = [TINY_SPEC, "--data", str(tiny_data), *recipe, *FAST]
    assert main(["train", *args, "--out", str(whole)]) == 0
    cfg = TrainConfig(batch_size=8, eval_batches=2, device="cpu", eval_every=5, steps=12,
                      lr=0.01, optimizer="muon", schedule="wsd")  # fmt: skip
    first = train(TINY_SPEC, tiny_data, split, cfg, echo=None, stop_after=6)
    assert first.status == "interrupted" and first.step == 6
    assert main(["train", "--resume", str(split)]) == 0

    a, b = latest_checkpoint(whole), latest_checkpoint(split)
    assert a is not None and b is not None and a.step == b.step == 12
    for name in ("model.safetensors", "trainer.safetensors"):
        ta, tb = load_file(str(a.path / name)), load_file(str(b.path / name))
        assert ta.keys() == tb.keys()
        for key in ta:
            if not key.startswith("rng."):
                assert torch.equal(ta[key], tb[key]), key
    assert any(k.endswith(".momentum_buffer") for k in tb)  # Muon's state was saved and resumed

    info = read_run(whole)
    optimizer = info["recipe"]["optimizer"]
    assert (
        optimizer["spec"]
        == info["config"]["optimizer"]
        == ("muon(momentum=0.95,nesterov=true,ns_steps=5,adjust_lr=original,fallback=adamw)")
    )
    assert (optimizer["name"], optimizer["plugin"], optimizer["module"]) == (
        "muon", "muon", "lmcore_muon",
    )  # fmt: skip
    (fallback,) = optimizer["uses"]
    assert (fallback["kind"], fallback["name"], fallback["module"]) == (
        "optimizer", "adamw", "lmcore_adamw",
    )  # fmt: skip
    assert info["recipe"]["schedule"]["spec"] == "wsd(decay=0.2,shape=sqrt)"
    assert info["roles"]["matrix"]["update"] == "muon"
    assert info["roles"]["embedding"]["update"] == "adamw"
    trainer = json.loads((a.path / "trainer.json").read_text())
    assert trainer["recipe"]["optimizer"] == optimizer


class _Sharded(Parallel):
    """What `lmcore train --parallel fsdp` runs under torchrun, as far as the check sees."""

    mode = "fsdp"


@pytest.mark.parametrize("spec", ["muon", "muon(fallback=torch_adamw)"])
def test_fsdp_is_refused_before_the_run_exists(tiny_data: Path, tmp_path: Path, spec: str) -> None:
    out = tmp_path / "run"
    with pytest.raises(TrainError, match=r"^--parallel fsdp: optimizer 'muon' needs whole "
                       r"matrices and FSDP shards them; use --parallel ddp, or another "
                       r"--optimizer$"):  # fmt: skip
        train(TINY_SPEC, tiny_data, out, TrainConfig(optimizer=spec, device="cpu"),
              parallel=_Sharded(), echo=None)  # fmt: skip
    assert not out.exists()
