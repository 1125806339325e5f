"""More than one process: data parallel (DDP), fully sharded (FSDP2) and tensor parallel plans.

    torchrun --nproc-per-node 2 -m lmcore train cs336-tiny --data DIR --out RUN --parallel fsdp

    from lmcore.train.parallel import distributed
    with distributed("fsdp") as par:          # the process group from torchrun's environment
        train(spec, data, out, config, parallel=par)

Everything here is PyTorch's own engine: `torch.distributed` (gloo on the CPU, NCCL on CUDA),
`DistributedDataParallel`, FSDP2's `fully_shard`, the `torch.distributed.checkpoint.state_dict`
helpers and DTensor tensor parallelism (`parallelize_module`). The training loop
(`lmcore.train.trainer`) knows one process; `Distributed` fills in its `Parallel` hooks:

- data: rank r of N keeps rows `[r·B/N, (r+1)·B/N)` of every global batch of B sequences
  (`lmcore.data.BatchSampler`), so the ranks' streams are disjoint, each a pure function of the
  seed, the step and the rank, and together they are the one-process batch;
- `ddp`: every rank holds the whole model, gradients are averaged by all-reduce in backward;
- `fsdp`: `fully_shard` on each transformer block, then on the root (embeddings, the final norm,
  lm_head, the positional encoding): parameters, gradients and AdamW state are split in N
  shards; a block's parameters are all-gathered for its forward and backward only. Tied
  embeddings share one parameter, which lives in the root group with both its users;
- `--micro-batch`: each rank takes its share of every micro-batch; the gradients are
  synchronised in the last one's backward only (`no_sync`: DDP's `no_sync()`, FSDP2's
  `set_requires_gradient_sync(False)`). `--recompute` wraps the layers' forwards before
  `wrap`, so the checkpoint is inside DDP and each FSDP2 block;
- the logged losses are averaged over the ranks; only rank 0 writes metrics, plots and
  checkpoints. A checkpoint is the one-process format (`lmcore.train.state`): under FSDP the
  full model and optimizer state are gathered to rank 0 (`get_model_state_dict`,
  `get_optimizer_state_dict`), written through the same atomic path; resuming on N processes
  loads the full state on every rank and shards it (`set_optimizer_state_dict`).

Tensor parallelism is a plan for `parallelize_module`: `tensor_parallel_plan(model)` and
`apply_tensor_parallel(model, mesh)` (see there).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lmcore.errors import LmcoreError
from lmcore.model.nn import Linear
from lmcore.model.transformer import CausalSelfAttention, TransformerLM
from lmcore.train.trainer import Opt, Parallel

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ParallelStyle

    from lmcore.describe import TrainingMemory

__all__ = [
    "MODES",
    "Distributed",
    "Launch",
    "ParallelError",
    "apply_tensor_parallel",
    "by_index",
    "by_name",
    "distributed",
    "launch_env",
    "memory_per_rank",
    "tensor_parallel_plan",
]

MODES: Final = ("ddp", "fsdp")
_TORCHRUN = "torchrun --nproc-per-node N -m lmcore train ..."


class ParallelError(LmcoreError, ValueError):
    """A distributed run cannot start: no torchrun environment, a mode it does not know, ..."""


# ------------------------------------------------------------------------------ the launch


@dataclass(frozen=True)
class Launch:
    """Where this process sits, as torchrun's environment says (RANK, WORLD_SIZE, ...)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def launch_env(env: Mapping[str, str] | None = None) -> Launch | None:
    """This process's place from torchrun's variables; None when they are not set (a plain
    `lmcore train`). `ParallelError` when they are set but not integers in range."""
    env = os.environ if env is None else env
    if "WORLD_SIZE" not in env and "RANK" not in env:
        return None
    values: dict[str, int] = {}
    for key, default in (("RANK", None), ("WORLD_SIZE", None), ("LOCAL_RANK", "0"),
                         ("LOCAL_WORLD_SIZE", None)):  # fmt: skip
        raw = env.get(key, default if default is not None else env.get("WORLD_SIZE"))
        try:
            values[key] = int(raw if raw is not None else "")
        except ValueError:
            raise ParallelError(
                f"environment variable {key}={raw!r} is not an integer; torchrun sets RANK, "
                f"WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE: launch with {_TORCHRUN}"
            ) from None
    launch = Launch(values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"],
                    values["LOCAL_WORLD_SIZE"])  # fmt: skip
    if launch.world_size < 1 or not 0 <= launch.rank < launch.world_size:
        raise ParallelError(
            f"RANK={launch.rank} is not in 0..WORLD_SIZE-1 (WORLD_SIZE={launch.world_size}); "
            f"launch with {_TORCHRUN}"
        )
    return launch


def _backend() -> str:
    """gloo for CPU tensors, and NCCL for CUDA tensors where this torch has it."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


@contextlib.contextmanager
def distributed(
    mode: str | None,
    *,
    mixed_precision: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[Parallel]:
    """The `Parallel` for this process: one process when `mode` is None outside torchrun, else
    `Distributed(mode)` on the process group of torchrun's environment (joined here, left at
    the end). `ParallelError` for a mode without torchrun, torchrun without a mode, or an
    unknown mode."""
    launch = launch_env(env)
    if mode is None:
        if mixed_precision is not None:
            raise ParallelError(
                "--fsdp-bf16 is FSDP's mixed precision policy; it needs --parallel fsdp under "
                f"torchrun ({_TORCHRUN} --parallel fsdp --fsdp-bf16); in one process use --bf16"
            )
        if launch is not None and launch.world_size > 1:
            raise ParallelError(
                f"this is rank {launch.rank} of {launch.world_size} processes (torchrun) but no "
                "--parallel was given; every process would train alone into the same --out: "
                f"add --parallel {' or --parallel '.join(MODES)}"
            )
        yield Parallel()
        return
    _check_mode(mode, mixed_precision)
    if launch is None:
        raise ParallelError(
            f"--parallel {mode} needs the process group torchrun sets up (RANK, WORLD_SIZE, "
            f"MASTER_ADDR, ...); launch with {_TORCHRUN} --parallel {mode}, or leave out "
            "--parallel to train in this one process"
        )
    owner = not dist.is_initialized()
    if owner:
        if torch.cuda.is_available() and launch.local_rank < torch.cuda.device_count():
            torch.cuda.set_device(launch.local_rank)  # "cuda" means this rank's GPU from here
        dist.init_process_group(_backend())
    try:
        yield Distributed(mode, mixed_precision=mixed_precision, local_rank=launch.local_rank)
    finally:
        if owner and dist.is_initialized():
            dist.destroy_process_group()


def _check_mode(mode: str, mixed_precision: str | None) -> None:
    if mode not in MODES:
        raise ParallelError(f"--parallel {mode!r}: unknown mode; use one of {', '.join(MODES)}")
    if mixed_precision not in (None, "bfloat16"):
        raise ParallelError(f"mixed precision {mixed_precision!r}: only bfloat16 is supported")
    if mixed_precision is not None and mode != "fsdp":
        raise ParallelError(
            f"--fsdp-bf16 is FSDP's mixed precision policy; it needs --parallel fsdp, not "
            f"--parallel {mode} (under ddp use --bf16, autocast)"
        )


# ------------------------------------------------------------------------------ the hooks


class Distributed(Parallel):
    """`Parallel` on the default process group (`torch.distributed.init_process_group` done).

    mode: "ddp" or "fsdp". mixed_precision: "bfloat16" under fsdp: blocks compute with bf16
    copies of the parameters and reduce gradients in float32; the shards and AdamW state keep
    the run's dtype (FSDP2's `MixedPrecisionPolicy`).
    """

    def __init__(self, mode: str, *, mixed_precision: str | None = None, local_rank: int = 0):
        _check_mode(mode, mixed_precision)
        if not dist.is_initialized():
            raise ParallelError(
                "Distributed needs an initialised process group; use lmcore.train.parallel."
                f"distributed({mode!r}) under torchrun, which joins it"
            )
        self.mode = mode
        self.mixed_precision = mixed_precision
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.local_rank = local_rank
        self.device = torch.device("cpu")  # set by `place`

    def __repr__(self) -> str:
        mp = f", {self.mixed_precision} compute" if self.mixed_precision else ""
        return (
            f"{self.mode}{mp}, rank {self.rank} of {self.world_size}, {dist.get_backend()} backend"
        )

    def place(self, device: torch.device) -> torch.device:
        """This rank's device: its own GPU (LOCAL_RANK) for CUDA, the CPU as it is."""
        if device.type == "cuda":
            if device.index is not None and device.index != self.local_rank:
                raise ParallelError(
                    f"--device {device}: under torchrun each process uses the GPU of its "
                    f"LOCAL_RANK (this one cuda:{self.local_rank}); give --device cuda or auto, "
                    "and choose GPUs with CUDA_VISIBLE_DEVICES"
                )
            device = torch.device("cuda", self.local_rank)
        self.device = device
        return device

    def wrap(
        self,
        model: nn.Module,
        optimizer: Opt,
        names: Sequence[Sequence[str]],
        rebuild: Callable[[list[dict[str, Any]]], Opt] | None = None,
    ) -> tuple[nn.Module, Opt]:
        """DDP(model), or `model` sharded in place with an optimizer over its shards that holds
        `optimizer`'s state (e.g. a checkpoint's), sharded likewise; `rebuild(groups)` makes
        that optimizer (default: `optimizer`'s class with its defaults)."""
        if self.mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device] if self.device.type == "cuda" else None
            return DistributedDataParallel(model, device_ids=ids), optimizer
        return model, self._shard(model, optimizer, names, rebuild)

    def _shard(
        self,
        model: nn.Module,
        optimizer: Opt,
        names: Sequence[Sequence[str]],
        rebuild: Callable[[list[dict[str, Any]]], Opt] | None = None,
    ) -> Opt:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        if not isinstance(model, TransformerLM):
            raise ParallelError(f"fsdp shards a TransformerLM, got {type(model).__name__}")
        saved = optimizer.state_dict()
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        kwargs: dict[str, Any] = {"mesh": mesh}
        if self.mixed_precision is not None:
            if self.device.type == "cuda" and not torch.cuda.is_bf16_supported():
                raise ParallelError(
                    f"--fsdp-bf16: {torch.cuda.get_device_name(self.device)} has no bfloat16 "
                    "arithmetic; train in float32 (leave out --fsdp-bf16)"
                )
            kwargs["mp_policy"] = MixedPrecisionPolicy(
                param_dtype=getattr(torch, self.mixed_precision), reduce_dtype=torch.float32
            )
        # The model returns its logits as a reshape (a view); FSDP2 warns that an in-place op
        # on it would skip its backward hook. The loss reads the logits out of place.
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view")
        for block in model.layers:
            fully_shard(block, **kwargs)
        # The root group: embeddings, pos, ln_final and lm_head. A tied lm_head/embedding is
        # one parameter used at both ends of the forward; it must live in this group, never in
        # a group of its own module, or it would be freed between its two uses.
        fully_shard(model, **kwargs)
        params = dict(model.named_parameters())
        groups = [
            {**{k: v for k, v in g.items() if k != "params"}, "params": [params[n] for n in ns]}
            for g, ns in zip(optimizer.param_groups, names, strict=True)
        ]
        if rebuild is not None:  # the run's optimizer, built again from its recipe
            sharded = rebuild(groups)
        else:  # the same optimizer class and options over the shards
            accepted = inspect.signature(type(optimizer)).parameters
            options_ = {k: v for k, v in optimizer.defaults.items() if k in accepted}
            sharded = type(optimizer)(groups, **options_)
        if saved["state"]:
            options = StateDictOptions(full_state_dict=True)
            set_optimizer_state_dict(model, sharded, by_name(saved, names), options=options)
        return sharded

    def full_state(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        names: Sequence[Sequence[str]],
    ) -> tuple[nn.Module, torch.optim.Optimizer | dict[str, Any]]:
        """What a checkpoint writes: under ddp the model and optimizer as they are; under fsdp
        the full state gathered to rank 0 (every rank must call this; rank 0's answer counts):
        a TransformerLM holding the gathered weights, and the optimizer's `state_dict()` in
        the one-process form."""
        if self.mode == "ddp":
            return model, optimizer
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = get_model_state_dict(model, options=options)
        state = get_optimizer_state_dict(model, optimizer, options=options)
        if not self.is_writer:
            return model, {}
        return _holder(model, weights), by_index(state, names)  # type: ignore[arg-type]

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """Backward inside accumulates gradients on each rank, unsynchronised: DDP's
        `no_sync()`; FSDP2's gradient sync off (unsharded gradients kept) and on again after,
        so the next backward reduce-scatters their sum."""
        if self.mode == "ddp":
            with model.no_sync():  # type: ignore[operator]
                yield
            return
        from torch.distributed.fsdp import FSDPModule

        if not isinstance(model, FSDPModule):
            raise ParallelError(
                f"fsdp accumulates over a sharded model, got {type(model).__name__}"
            )
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def mean(self, value: Tensor) -> Tensor:
        value = value.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)  # gloo has no AVG
        return value / self.world_size

    def any(self, flag: bool) -> bool:
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def barrier(self) -> None:
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index or 0])
        else:
            dist.barrier()


def _holder(model: nn.Module, weights: Mapping[str, Tensor]) -> TransformerLM:
    """A TransformerLM built on the meta device (no memory, no initialisation) that holds the
    gathered `weights`, with the parameters `model` shares (tied embeddings) shared again."""
    assert isinstance(model, TransformerLM)
    holder = TransformerLM(model.blueprint, device="meta")
    holder.load_state_dict(weights, strict=True, assign=True)
    first: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:  # `name` is an alias of `first[id(p)]`
            *path, leaf = name.split(".")
            *src_path, src_leaf = first[id(p)].split(".")
            owner = holder.get_submodule(".".join(path))
            setattr(owner, leaf, getattr(holder.get_submodule(".".join(src_path)), src_leaf))
        else:
            first[id(p)] = name
    return holder


def by_name(state: Mapping[str, Any], names: Sequence[Sequence[str]]) -> dict[str, Any]:
    """An optimizer `state_dict()` keyed by parameter index (torch's own form) keyed by
    parameter name instead, as `torch.distributed.checkpoint.state_dict` speaks it."""
    flat = [n for group in names for n in group]
    return {
        "state": {flat[int(i)]: dict(v) for i, v in state["state"].items()},
        "param_groups": [
            {**g, "params": [flat[int(i)] for i in g["params"]]} for g in state["param_groups"]
        ],
    }


def by_index(state: Mapping[str, Any], names: Sequence[Sequence[str]]) -> dict[str, Any]:
    """The inverse of `by_name`: parameter names back to torch's indices (group order)."""
    index = {n: i for i, n in enumerate(n for group in names for n in group)}
    return {
        "state": {index[k]: dict(v) for k, v in state["state"].items()},
        "param_groups": [
            {**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]
        ],
    }


# ------------------------------------------------------------------------------ tensor parallel


def tensor_parallel_plan(model: TransformerLM) -> dict[str, ParallelStyle]:
    """The Megatron-style plan for `parallelize_module(model, mesh, plan)`, one entry per block:
    `ColwiseParallel` for q/k/v, the output gate's gate_proj and the FFN's w1/w3 (each rank
    computes a slice of the heads and of d_ff), `RowwiseParallel` for output_proj and w2 (their
    partial sums are all-reduced), and the attention module itself where it has sinks, which are
    sharded by heads (`HeadParallel`).
    Embeddings, norms and lm_head stay replicated. The FFN entries are there for the FFNs that
    have those projections (swiglu, geglu: w1, w2, w3; silu, gelu, relu: w1, w2)."""
    styles = _styles()
    plan: dict[str, ParallelStyle] = {}
    for i, block in enumerate(model.layers):
        assert isinstance(block.attn, CausalSelfAttention)
        for name in ("q_proj", "gate_proj", "k_proj", "v_proj"):
            if getattr(block.attn, name, None) is not None:  # gate_proj: with attn_gate
                plan[f"layers.{i}.attn.{name}"] = styles["colwise"]()
        plan[f"layers.{i}.attn.output_proj"] = styles["rowwise"]()
        if block.attn.sinks is not None:  # one per head: each rank holds its heads'
            plan[f"layers.{i}.attn"] = styles["heads"]()
        ffn = block.get_submodule("ffn")
        ffn_linears = {n for n, m in ffn.named_children() if isinstance(m, Linear)}
        for name, style in (("w1", "colwise"), ("w3", "colwise"), ("w2", "rowwise")):
            if name in ffn_linears:
                plan[f"layers.{i}.ffn.{name}"] = styles[style]()
    return plan


def apply_tensor_parallel(model: TransformerLM, mesh: DeviceMesh) -> TransformerLM:
    """Shard `model` in place over the 1-D `mesh` with `tensor_parallel_plan` and set each
    attention layer to the heads its rank holds. Every rank must feed the same inputs.

    `ParallelError` when the heads (query or key/value), d_ff or the FFN do not split evenly
    over the mesh, or when the positional encoding adds a per-head attention bias (ALiBi),
    which would need sharding across heads too."""
    n = mesh.size()
    spec = model.spec
    for what, value in (("num_heads", spec.num_heads), ("num_kv_heads", spec.num_kv_heads),
                        ("d_ff", spec.d_ff)):  # fmt: skip
        if value % n:
            raise ParallelError(
                f"{what}={value} does not split over {n} tensor-parallel ranks; use a "
                f"multiple of {n} or fewer ranks"
            )
    normed = [b.spec.qk_norm for b in model.blueprint.layers if b.spec.qk_norm is not None]
    if normed:
        raise ParallelError(
            f"qk_norm={normed[0]}: tensor parallelism splits the heads across ranks, and the q/k "
            "norm's weights, shared by all the heads, would get each rank's part of their "
            "gradient only; train it with ddp or fsdp"
        )
    biased = [b.spec.pos for b in model.blueprint.layers if "bias" in b.features("pos")]
    if biased:
        raise ParallelError(
            f"pos={biased[0]} adds an attention bias across the heads, which tensor "
            "parallelism would have to shard too; use a positional encoding without one "
            "(rope, nope, learned, sinusoidal)"
        )
    plan = tensor_parallel_plan(model)
    ffn_names = {k.rsplit(".", 1)[1] for k in plan if ".ffn." in k}
    if "w2" not in ffn_names or "w1" not in ffn_names:
        raise ParallelError(
            f"ffn={spec.ffn.name} has no w1/w2 projections to split; tensor parallelism "
            "covers the FFNs with them (swiglu, geglu, silu, gelu, relu)"
        )
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(model, mesh, plan)
    for block in model.layers:
        attn = block.attn
        assert isinstance(attn, CausalSelfAttention)
        attn.num_heads //= n  # (B, H/n, T, D) per rank: the heads are independent
        attn.num_kv_heads //= n
    return model


def _styles() -> dict[str, type[ParallelStyle]]:
    """torch's ColwiseParallel / RowwiseParallel, taught lmcore's `Linear`.

    torch's styles accept only `nn.Linear` and `nn.Embedding` (an isinstance check);
    lmcore's `Linear` is written from scratch with the same contract (`weight` of shape
    (out, in), `y = x @ weight.T`, no bias), so it is partitioned exactly like `nn.Linear`:
    the same partition function and input/output layouts, through `distribute_module`.
    """
    from functools import partial

    from torch.distributed.tensor import Shard, distribute_module, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    from torch.distributed.tensor.parallel import ParallelStyle as Style

    def distribute_linear(
        style: ColwiseParallel | RowwiseParallel, module: Linear, mesh: DeviceMesh
    ) -> nn.Module:
        # What torch's `_apply` does for an nn.Linear, for lmcore's: one rule for both styles.
        return distribute_module(
            module,
            mesh,
            style._partition_linear_fn,
            partial(style._prepare_input_fn, style.input_layouts, style.desired_input_layouts),
            partial(style._prepare_output_fn, style.output_layouts, style.use_local_output),
        )

    class LinearColwise(ColwiseParallel):
        def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
            if not isinstance(module, Linear):
                return super()._apply(module, device_mesh)
            return distribute_linear(self, module, device_mesh)

    class LinearRowwise(RowwiseParallel):
        def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
            if not isinstance(module, Linear):
                return super()._apply(module, device_mesh)
            self.desired_input_layouts = (Shard(-1),)
            return distribute_linear(self, module, device_mesh)

    class HeadParallel(Style):
        """The attention's per-head parameters (`sinks`) as DTensors sharded by heads: rank r
        holds the heads of its slice of q_proj's rows; the forward reads its part
        (`lmcore.model.transformer.local`), and the gradients stay sharded the same way."""

        def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
            sinks = getattr(module, "sinks", None)
            if sinks is not None:
                shard = distribute_tensor(sinks.data, device_mesh, [Shard(0)])
                module.sinks = nn.Parameter(shard, requires_grad=sinks.requires_grad)
            return module

    LinearColwise.__name__ = LinearColwise.__qualname__ = "ColwiseParallel"
    LinearRowwise.__name__ = LinearRowwise.__qualname__ = "RowwiseParallel"
    return {"colwise": LinearColwise, "rowwise": LinearRowwise, "heads": HeadParallel}


# ------------------------------------------------------------------------------ memory


def memory_per_rank(mem: TrainingMemory, mode: str, world_size: int) -> dict[str, int]:
    """Bytes per rank of `lmcore describe`'s training estimate under `mode` on `world_size`
    ranks: ddp holds every weight, gradient and AdamW moment on each rank; fsdp a 1/N shard of
    each (rounded up), plus the largest block's weights and gradients unsharded while it
    runs, which this leaves out. Activations (per rank's batch) and buffers are unchanged."""
    if mode not in MODES:
        raise ParallelError(f"mode {mode!r}: use one of {', '.join(MODES)}")
    share = world_size if mode == "fsdp" else 1
    rows = {
        "weights": -(-mem.weights // share),
        "gradients": -(-mem.gradients // share),
        "optimizer": -(-mem.optimizer // share),
        "buffers": mem.buffers,
    }
    return {**rows, "total": sum(rows.values())}
