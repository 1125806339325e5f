"""`IGNORE` targets in `cross_entropy`: left out of the mean (torch's `ignore_index`), zero loss
and gradients when every target is ignored, and today's numbers bit for bit when none is."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lmcore.model.nn import IGNORE, cross_entropy, cross_entropy_and_log_z, kept_mean


def _case(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 7, 13, generator=g) * 3
    targets = torch.randint(0, 13, (3, 7), generator=g)
    return logits, targets


def _reference(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The formula before IGNORE existed: the plain mean over every position."""
    logits = logits.float()
    log_z = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (log_z - picked).mean()


def test_ignored_targets_are_left_out_as_torch_ignore_index() -> None:
    logits, targets = _case()
    targets[0, :4] = IGNORE
    targets[2, 5] = IGNORE
    expected = F.cross_entropy(logits.reshape(-1, 13), targets.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(cross_entropy(logits, targets), expected)
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    cross_entropy(a, targets).backward()
    F.cross_entropy(b.reshape(-1, 13), targets.reshape(-1), ignore_index=-100).backward()
    assert a.grad is not None and b.grad is not None
    torch.testing.assert_close(a.grad, b.grad)
    assert torch.count_nonzero(a.grad[0, :4]) == 0  # ignored positions get no gradient


def test_nothing_ignored_is_bit_for_bit_the_plain_mean_and_its_gradient() -> None:
    for seed in range(4):
        logits, targets = _case(seed)
        a = logits.clone().requires_grad_()
        b = logits.clone().requires_grad_()
        got, want = cross_entropy(a, targets), _reference(b, targets)
        assert torch.equal(got, want)
        got.backward()
        want.backward()
        assert a.grad is not None and b.grad is not None
        assert torch.equal(a.grad, b.grad)
        bf = logits.bfloat16()
        assert torch.equal(cross_entropy(bf, targets), _reference(bf, targets))


def test_every_target_ignored_gives_zero_loss_and_zero_gradients_not_nan() -> None:
    logits, targets = _case()
    targets.fill_(IGNORE)
    x = logits.clone().requires_grad_()
    loss = cross_entropy(x, targets)
    assert loss.item() == 0.0
    loss.backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and not x.grad.any()


def test_log_z_is_every_positions_and_kept_mean_averages_the_kept() -> None:
    logits, targets = _case()
    targets[1] = IGNORE
    _, log_z = cross_entropy_and_log_z(logits, targets)
    torch.testing.assert_close(log_z, torch.logsumexp(logits, -1))
    kept = targets != IGNORE
    torch.testing.assert_close(kept_mean(log_z, kept), log_z[kept].mean())
    assert kept_mean(log_z, torch.zeros_like(kept)).item() == 0.0
