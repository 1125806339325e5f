"""Unit tests of Adafactor's maths and wiring, against the paper's Algorithm 4 written out here
in float64 (row and column sums, 1-indexed steps) and, where installed, transformers' Adafactor;
the contract tests come from `--lmcore-conformance` (see addopts in pyproject.toml)."""

from __future__ import annotations

import math

import pytest
import torch

import lmcore
from lmcore.model.roles import roles_of
from lmcore.train.recipe import build_optimizer, param_groups, resolve_recipe
from lmcore_adafactor import Adafactor

MATRIX = {"role": "matrix", "fan_in": -1, "fan_out": -2, "lr_scale": 1.0, "splits": []}
GAIN = {"role": "gain", "fan_in": None, "fan_out": None, "lr_scale": 1.0, "splits": []}


def paper(x0, grads, *, lr, factored=True, decay_rate=0.8, clip=1.0, eps1=1e-30, eps2=1e-3,
          scale=True, relative=False, beta1=0.0, weight_decay=0.0):  # fmt: skip
    """Shazeer & Stern (2018), Algorithm 4 (factored, a matrix n × m: rows are the fan-out) or
    5 (a vector), in float64; optional first moment and decoupled decay as documented."""
    x = x0.double().clone()
    r = c = v = m = None
    for t, g in enumerate(grads, start=1):
        g = g.double()
        beta2 = 1 - t ** (-decay_rate)
        sq = g * g + eps1
        if factored:
            ones_m, ones_n = (
                torch.ones(x.shape[1], 1, dtype=x.dtype),
                torch.ones(1, x.shape[0], dtype=x.dtype),
            )
            r = (
                (1 - beta2) * (sq @ ones_m)
                if r is None
                else beta2 * r + (1 - beta2) * (sq @ ones_m)
            )
            c = (
                (1 - beta2) * (ones_n @ sq)
                if c is None
                else beta2 * c + (1 - beta2) * (ones_n @ sq)
            )
            vhat = (r @ c) / (ones_n @ r)
        else:
            v = (1 - beta2) * sq if v is None else beta2 * v + (1 - beta2) * sq
            vhat = v
        u = g / vhat.sqrt()
        u = u / max(1.0, float(u.square().mean().sqrt()) / clip)
        if beta1:
            m = (1 - beta1) * u if m is None else beta1 * m + (1 - beta1) * u
            u = m
        rho = min(1e-2, 1 / math.sqrt(t)) if relative else lr
        alpha = max(eps2, float(x.square().mean().sqrt())) * rho if scale else rho
        x = x * (1 - rho * weight_decay) - alpha * u
    return x


def run(x0, grads, group, **kw):
    p = torch.nn.Parameter(x0.clone())
    opt = Adafactor([{"params": [p], **group}], **kw)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    return p.detach(), opt


@pytest.fixture
def data():
    gen = torch.Generator().manual_seed(0)
    x0 = 0.1 * torch.randn(6, 5, generator=gen)
    grads = [torch.randn(6, 5, generator=gen) * s for s in (1.0, 0.3, 2.0, 0.5)]
    return x0, grads


@pytest.mark.parametrize("options", [
    {}, {"scale_parameter": False}, {"relative_step": True}, {"beta1": 0.9}, {"weight_decay": 0.1},
    {"clip": 0.5, "decay_rate": 0.5},
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults")  # fmt: skip
def test_a_matrix_is_factored_as_algorithm_4(data, options) -> None:
    x0, grads = data
    got, opt = run(x0, grads, MATRIX, lr=3e-2, **options)
    names = {"scale_parameter": "scale", "relative_step": "relative"}
    expected = paper(x0, grads, lr=3e-2, **{names.get(k, k): v for k, v in options.items()})
    torch.testing.assert_close(got.double(), expected, atol=1e-6, rtol=1e-5)
    state = opt.state[opt.param_groups[0]["params"][0]]
    assert state["exp_avg_sq_row"].shape == (6, 1) and state["exp_avg_sq_col"].shape == (1, 5)


def test_a_gain_and_an_unfactored_matrix_keep_a_full_second_moment_as_algorithm_5(data) -> None:
    x0, grads = data
    got, opt = run(x0, grads, GAIN, lr=3e-2)
    torch.testing.assert_close(
        got.double(), paper(x0, grads, lr=3e-2, factored=False), atol=1e-6, rtol=1e-5
    )
    unfactored, _ = run(x0, grads, MATRIX, lr=3e-2, factored=False)
    torch.testing.assert_close(unfactored, got, atol=0, rtol=0)
    assert opt.state[opt.param_groups[0]["params"][0]]["exp_avg_sq"].shape == (6, 5)


def test_the_factored_axes_are_the_roles_not_the_last_two(data) -> None:
    """An embedding (vocab, d): fan_in 0, fan_out 1, so its transpose is the paper's matrix;
    a stack of experts factors each one."""
    x0, grads = data
    embedding = {**MATRIX, "role": "embedding", "fan_in": 0, "fan_out": 1}
    got, _ = run(x0.T.contiguous(), [g.T.contiguous() for g in grads], embedding, lr=3e-2)
    torch.testing.assert_close(got.T.double(), paper(x0, grads, lr=3e-2), atol=1e-6, rtol=1e-5)
    stacked = [torch.stack([g, -g]) for g in grads]
    experts, _ = run(torch.stack([x0, 2 * x0]), stacked, MATRIX, lr=3e-2, scale_parameter=False)
    second = paper(2 * x0, [-g for g in grads], lr=3e-2, scale=False)
    torch.testing.assert_close(experts[1].double(), second, atol=1e-6, rtol=1e-5)


def test_relative_step_follows_the_runners_schedule_from_its_peak(data) -> None:
    x0, grads = data
    p = torch.nn.Parameter(x0.clone())
    opt = Adafactor([{"params": [p], **MATRIX}], lr=1e-3, relative_step=True)
    opt.param_groups[0]["lr"] = 0.0  # a warmup's first step
    p.grad = grads[0].clone()
    opt.step()
    assert torch.equal(p.detach(), x0)
    assert opt.param_groups[0]["peak_lr"] == 1e-3


def test_bfloat16_parameters_stay_bfloat16_with_float32_state(data) -> None:
    x0, grads = data
    got, opt = run(x0.bfloat16(), [g.bfloat16() for g in grads], MATRIX, lr=3e-2)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(
        got.double(), paper(x0.bfloat16(), grads, lr=3e-2), atol=2e-2, rtol=2e-2
    )
    assert opt.state[opt.param_groups[0]["params"][0]]["exp_avg_sq_row"].dtype == torch.float32


def test_against_transformers_adafactor(data) -> None:
    try:
        from transformers.optimization import Adafactor as Peer
    except ImportError:
        pytest.skip("transformers is not installed: pip install 'lmcore-adafactor[reference]'")
    x0, grads = data
    ours, _ = run(x0, grads, MATRIX, lr=3e-2)
    p = torch.nn.Parameter(x0.clone())
    peer = Peer([p], lr=3e-2, relative_step=False, scale_parameter=True, warmup_init=False)
    for g in grads:
        p.grad = g.clone()
        peer.step()
    torch.testing.assert_close(ours, p.detach(), atol=1e-6, rtol=1e-5)


def test_installed_plugin_is_found_through_its_entry_point() -> None:
    entry = lmcore.get_registry().get("optimizer", "adafactor")
    assert entry.provenance.dist == "lmcore-adafactor"
    assert entry.provenance.module == "lmcore_adafactor"


def test_lmcore_builds_it_over_a_models_role_groups_and_it_trains() -> None:
    torch.manual_seed(0)
    model = lmcore.build_model("cs336-tiny, vocab_size=256")
    part = resolve_recipe("optimizer", "adafactor(beta1=0.9)")
    assert str(part.spec).startswith("adafactor(beta1=0.9,")
    groups, _ = param_groups(model, roles_of(model), decay=("matrix",), weight_decay=0.1, lr=1e-2,
                             multipliers={})  # fmt: skip
    opt = build_optimizer(part, groups, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)
    matrices = [g for g in opt.param_groups if g["role"] == "matrix"]
    assert all("exp_avg_sq_row" not in opt.state[p] for g in matrices for p in g["params"])
    tokens = torch.randint(0, 256, (4, 17))
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = lmcore.model.nn.cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert all("exp_avg_sq_row" in opt.state[p] for g in matrices for p in g["params"])


def test_a_bad_argument_is_rejected_naming_it() -> None:
    with pytest.raises(
        lmcore.SpecError, match=r"beta1 is a running mean's decay, below 1; got 1.0"
    ):
        resolve_recipe("optimizer", "adafactor(beta1=1.0)")
