"""Building on meta (`lmcore.model.empty.parameters_on_meta`) moves the parameters of the thread
inside the block only: a model another thread builds at the same moment gets real ones."""

from __future__ import annotations

import threading

import torch
from torch import nn

from lmcore import build_model
from lmcore.model.empty import parameters_on_meta

SPEC = "vocab_size=97, context_length=16, d_model=16, num_layers=1, num_heads=2, d_ff=32"


class Halves(nn.Module):
    """Registers one parameter, waits at `barrier` for the other thread, registers another: the
    two threads' registrations interleave."""

    def __init__(self, barrier: threading.Barrier):
        super().__init__()
        self.first = nn.Parameter(torch.ones(3))
        barrier.wait(timeout=60)
        self.second = nn.Parameter(torch.ones(3))
        barrier.wait(timeout=60)


def test_a_build_in_another_thread_gets_real_parameters_while_one_builds_on_meta() -> None:
    barrier = threading.Barrier(2)
    inside, done = threading.Event(), threading.Event()
    built: dict[str, nn.Module] = {}
    errors: list[BaseException] = []

    def on_meta() -> None:
        try:
            with parameters_on_meta():
                inside.set()
                built["meta halves"] = Halves(barrier)
                done.wait(timeout=60)  # still inside while the other thread builds a model
                built["meta model"] = build_model(SPEC)
        except BaseException as e:  # re-raised by the test's thread
            errors.append(e)
            barrier.abort()

    def plain() -> None:
        try:
            inside.wait(timeout=60)
            built["real halves"] = Halves(barrier)
            built["real model"] = build_model(SPEC)
        except BaseException as e:
            errors.append(e)
            barrier.abort()
        finally:
            done.set()

    threads = [threading.Thread(target=on_meta), threading.Thread(target=plain)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert sorted(built) == ["meta halves", "meta model", "real halves", "real model"]
    for name, module in built.items():
        metas = {p.is_meta for p in module.parameters()}
        assert metas == {name.startswith("meta")}, name
        assert not any(b.is_meta for b in module.buffers()), name  # buffers are always built
    assert not any(p.is_meta for p in build_model(SPEC).parameters())  # after: all real again


def test_parameters_on_meta_nests() -> None:
    with parameters_on_meta():
        with parameters_on_meta():
            inner = nn.Linear(2, 3)
        outer = nn.Linear(2, 3)  # still inside the outer block
    after = nn.Linear(2, 3)
    assert inner.weight.is_meta and outer.weight.is_meta and outer.bias.is_meta
    assert not after.weight.is_meta and not after.bias.is_meta
    assert outer.weight.requires_grad and outer.weight.shape == (3, 2)
