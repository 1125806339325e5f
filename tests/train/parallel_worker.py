"""Run by tests/train/test_parallel.py under torchrun (2 CPU processes, gloo); not a test module.

    torchrun --nproc-per-node 2 tests/train/parallel_worker.py runs DATA OUT
    torchrun --nproc-per-node 2 tests/train/parallel_worker.py fail DATA OUT

`runs`: in one process group, the 2-rank runs the tests compare with one-process runs: ddp and
fsdp (tied embeddings) for 4 steps, fsdp stopped after 2 steps and resumed to 4, fsdp with
bf16 mixed precision, the logits of the sharded model after training, ddp and fsdp of a model
with today's options, and the tensor-parallel forward and backward of three models (the last with
the output gate and sinks). `fail`: a ddp run whose rank 1 raises in its third step.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from lmcore.model.nn import cross_entropy
from lmcore.model.transformer import TransformerLM
from lmcore.train.config import TrainConfig
from lmcore.train.parallel import Distributed, apply_tensor_parallel, distributed
from lmcore.train.trainer import _Loop, resume, train

SPEC = "vocab_size=300, context_length=16, d_model=32, num_layers=2, num_heads=2"
TIED = SPEC + ", tie_embeddings=true"
# Today's architectures: another block, biases, q/k norms, a window on one layer, soft-capping,
# a per-layer ffn (ddp and fsdp); and what tensor parallelism splits of them (biases, a
# sandwich block, a head_dim of its own, a window on one layer, soft-capping).
OPTIONS = (
    SPEC + ", block=parallel(norms=2), qkv_bias=true, out_bias=true, qk_norm=rmsnorm, "
    "qk_norm_scope=full, window[0]=4, attn_softcap=20.0, logit_softcap=10.0, ffn[1]=geglu"
)
TP_OPTIONS = (SPEC + ", block=sandwich, qkv_bias=true, out_bias=true, window[1]=3, "
              "attn_softcap=20.0, head_dim=8")  # fmt: skip
# The output gate (column-parallel like q) and sinks on one layer (sharded by heads).
TP_GATED = SPEC + ", attn_gate=true, qkv_bias=true, attn_sinks[0]=true"
CONFIG = TrainConfig(steps=4, batch_size=8, eval_batches=2, eval_every=2, log_every=1,
                     save_every=2, keep=0, device="cpu", lr=3e-3, warmup=1)  # fmt: skip


def probe() -> torch.Tensor:
    """The token ids whose logits the tests compare."""
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, 300, (2, 16), generator=g)


class Capturing(Distributed):
    """Distributed, remembering the (sharded) model it last checkpointed."""

    model: Any = None

    def full_state(self, model: Any, optimizer: Any, names: Any) -> Any:
        self.model = model
        return super().full_state(model, optimizer, names)


def runs(data: Path, out: Path) -> None:
    ddp = Distributed("ddp")
    train(SPEC, data, out / "ddp", CONFIG, parallel=ddp, echo=None)

    fsdp = Capturing("fsdp")
    train(TIED, data, out / "fsdp", CONFIG, parallel=fsdp, echo=None)
    with torch.no_grad():
        logits = fsdp.model(probe())  # the sharded model: every rank takes part
    if fsdp.is_writer:
        save_file({"logits": logits.contiguous()}, str(out / "fsdp-logits.safetensors"))

    train(TIED, data, out / "split", CONFIG, parallel=Distributed("fsdp"), echo=None,
          stop_after=2)  # fmt: skip
    resume(out / "split", parallel=Distributed("fsdp"), echo=None)

    bf16 = Distributed("fsdp", mixed_precision="bfloat16")
    train(TIED, data, out / "bf16", CONFIG, parallel=bf16, echo=None)

    train(OPTIONS, data, out / "options-ddp", CONFIG, parallel=Distributed("ddp"), echo=None)
    train(OPTIONS, data, out / "options-fsdp", CONFIG, parallel=Distributed("fsdp"), echo=None)

    tensor_parallel(out, SPEC, "tp")
    tensor_parallel(out, TP_OPTIONS, "tp-options")
    tensor_parallel(out, TP_GATED, "tp-gated")


def tensor_parallel(out: Path, spec: str, name: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(0)
    model = TransformerLM(spec)
    perturb_sinks(model)
    apply_tensor_parallel(model, init_device_mesh("cpu", (2,)))
    x = probe()
    logits = model(x)
    cross_entropy(logits, torch.roll(x, -1, dims=1)).backward()
    tensors = {"logits": logits.detach().contiguous()}
    for param, p in model.named_parameters():
        assert p.grad is not None
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        tensors[f"grad.{param}"] = grad.contiguous()
        tensors[f"local.{param}"] = (p.to_local() if hasattr(p, "to_local") else p).detach()
    if torch.distributed.get_rank() == 0:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / f"{name}.safetensors"))


def perturb_sinks(model: TransformerLM) -> None:
    """Sinks off their initial zeros, the same on every rank and in the one-process model."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".sinks"):
                p.copy_(torch.linspace(-1.0, 2.0, p.numel()))


def fail(data: Path, out: Path, par: Any) -> None:
    step = _Loop.step

    def failing(self: _Loop, n: int) -> Any:
        if self.par.rank == 1 and n == 2:  # the third step, between batches and backward
            raise RuntimeError("injected failure on rank 1 in step 3")
        return step(self, n)

    _Loop.step = failing  # type: ignore[method-assign]
    train(SPEC, data, out / "fail", CONFIG, parallel=par, echo=None)


def main() -> None:
    torch.set_num_threads(1)
    mode, data, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    with distributed("ddp") as par:
        if mode == "runs":
            runs(data, out)
        else:
            fail(data, out, par)


if __name__ == "__main__":
    main()
