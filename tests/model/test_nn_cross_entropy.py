"""`lmcore.model.nn.cross_entropy`: torch's numbers, large logits, float32 out of bfloat16."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lmcore.model.nn import cross_entropy


def test_cross_entropy_matches_torch_and_survives_large_logits() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g)
    targets = torch.randint(0, 11, (3, 5), generator=g)
    expected = F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1))
    torch.testing.assert_close(cross_entropy(logits, targets), expected)
    torch.testing.assert_close(cross_entropy(logits * 1000 + 100, targets), F.cross_entropy(
        (logits * 1000 + 100).reshape(-1, 11), targets.reshape(-1)
    ))  # fmt: skip
    bf16 = cross_entropy(logits.bfloat16(), targets)
    assert bf16.dtype == torch.float32
    torch.testing.assert_close(bf16, expected, atol=0.05, rtol=0.0)


def test_blocks_of_rows_give_autograds_numbers_bit_for_bit(monkeypatch) -> None:
    """The loss and its gradient, computed a few rows at a time (blocks that end mid-batch and a
    short last one), equal autograd's `logsumexp` and `gather` over the whole tensor exactly,
    with a gradient through the log-partition function too (the z-loss) and ignored targets."""
    from lmcore.model import nn as lmnn

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 7, 29, generator=g) * 4
    targets = torch.randint(0, 29, (3, 7), generator=g)
    targets[1, 2:5] = lmnn.IGNORE
    monkeypatch.setattr(lmnn, "_BLOCK_BYTES", 4 * 29 * 4)  # 4 rows a block: 21 = 5 x 4 + 1
    assert lmnn._block_rows(logits.reshape(-1, 29)) == 4

    def loss(fn, x: torch.Tensor) -> torch.Tensor:
        ce, log_z = fn(x, targets)
        return ce + 1e-2 * lmnn.kept_mean(log_z.square(), targets != lmnn.IGNORE)

    def autograd(x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kept = t != lmnn.IGNORE
        log_z = torch.logsumexp(x, dim=-1)
        picked = x.gather(-1, torch.where(kept, t, 0).unsqueeze(-1)).squeeze(-1)
        return lmnn.kept_mean(log_z - picked, kept), log_z

    a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    got, want = loss(lmnn.cross_entropy_and_log_z, a), loss(autograd, b)
    assert torch.equal(got, want)
    got.backward()
    want.backward()
    assert a.grad is not None and b.grad is not None
    assert torch.equal(a.grad, b.grad)
    assert torch.count_nonzero(a.grad[1, 2:5]) == 0
    expected = F.cross_entropy(logits.reshape(-1, 29), targets.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(lmnn.cross_entropy(logits, targets), expected)


def test_gradient_passes_gradcheck_in_double_through_blocks(monkeypatch) -> None:
    from lmcore.model import nn as lmnn

    monkeypatch.setattr(lmnn, "_BLOCK_BYTES", 2 * 5 * 8)  # 2 rows of 5 doubles a block
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(7, 5, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, 5, (7,), generator=g)
    weights = torch.randn(7, dtype=torch.float64, generator=g)

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        log_z, picked = lmnn._LogZAndPicked.apply(x, targets)
        return log_z * weights, picked

    assert torch.autograd.gradcheck(f, (logits,))


def test_the_loss_traces_whole_under_torch_compile() -> None:
    """A compiled training step takes the loss into its graph (one block, no graph break)."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 50, generator=g, requires_grad=True)
    targets = torch.randint(0, 50, (6,), generator=g)
    targets[2] = -100
    step = torch.compile(lambda x: cross_entropy(x * 2, targets), backend="aot_eager",
                         fullgraph=True)  # fmt: skip
    (got,) = torch.autograd.grad(step(logits), logits)
    (want,) = torch.autograd.grad(F.cross_entropy(logits * 2, targets), logits)
    torch.testing.assert_close(got, want)
