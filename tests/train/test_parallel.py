"""Data-parallel, fully-sharded and tensor-parallel training on 2 CPU processes (torchrun, gloo).

The 2-rank runs happen in two torchrun launches (tests/train/parallel_worker.py); each test compares
what they wrote with a one-process run of the same global batch, made here. The tests that use
those launches are marked slow: each launch takes 15-25 s on two shared cores.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import lmcore
from lmcore.describe import describe
from lmcore.model.transformer import TransformerLM
from lmcore.train.optim import make_optimizer
from lmcore.train.parallel import (
    ParallelError,
    by_index,
    by_name,
    distributed,
    launch_env,
    memory_per_rank,
    tensor_parallel_plan,
)
from lmcore.train.runs import CHECKPOINTS, checkpoints, latest_checkpoint, read_metrics, read_run
from lmcore.train.trainer import Parallel, train
from tests.helpers.errors import raises_naming
from tests.helpers.runs import latest_weights, torchrun
from tests.train.parallel_worker import (
    CONFIG,
    OPTIONS,
    SPEC,
    TIED,
    TP_GATED,
    TP_OPTIONS,
    perturb_sinks,
    probe,
)

pytestmark = pytest.mark.usefixtures("single_thread")

WORKER = Path(__file__).with_name("parallel_worker.py")
TOL = 1e-5


@pytest.fixture(scope="module")
def two_ranks(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The worker's `runs`, once for this module."""
    out = tmp_path_factory.mktemp("two-ranks")
    done = torchrun(WORKER, "runs", tiny_data, out, cwd=out)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def one_rank(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The same runs in this one process (untied for ddp, tied for fsdp)."""
    out = tmp_path_factory.mktemp("one-rank")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(SPEC, tiny_data, out / "untied", CONFIG, echo=None)
        train(TIED, tiny_data, out / "tied", CONFIG, echo=None)
        train(OPTIONS, tiny_data, out / "options", CONFIG, echo=None)
    finally:
        torch.set_num_threads(threads)
    yield out


def losses(run: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_metrics(run) if r["kind"] == "train"]


def val_losses(run: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["val_loss"]) for r in read_metrics(run) if r["kind"] == "eval"]


def trainer_state(run: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    ckpt = latest_checkpoint(run)
    assert ckpt is not None
    body = json.loads((ckpt.path / "trainer.json").read_text())
    return load_file(str(ckpt.path / "trainer.safetensors")), body


def assert_close_runs(got: Path, want: Path, tol: float = TOL) -> None:
    a, b = losses(got), losses(want)
    assert [s for s, _ in a] == [s for s, _ in b] == list(range(1, CONFIG.steps + 1))
    assert max(abs(x - y) for (_, x), (_, y) in zip(a, b, strict=True)) <= tol, (a, b)
    va, vb = val_losses(got), val_losses(want)
    assert [s for s, _ in va] == [s for s, _ in vb] == [0, 2, 4]
    assert max(abs(x - y) for (_, x), (_, y) in zip(va, vb, strict=True)) <= tol
    wa, wb = latest_weights(got), latest_weights(want)
    assert wa.keys() == wb.keys()
    for name in wb:
        assert (wa[name] - wb[name]).abs().max().item() <= tol, name
    (ta, ja), (tb, jb) = trainer_state(got), trainer_state(want)
    assert ta.keys() == tb.keys()
    for name in tb:
        if name.startswith("optimizer."):  # AdamW's moments and step counts
            assert (ta[name].double() - tb[name].double()).abs().max().item() <= tol, name
    assert ja["optimizer"]["param_names"] == jb["optimizer"]["param_names"]
    assert ja["optimizer"]["param_groups"] == jb["optimizer"]["param_groups"]
    assert ja["step"] == jb["step"] == CONFIG.steps


# ------------------------------------------------------------------------------ 2 ranks = 1


@pytest.mark.slow
def test_ddp_on_two_ranks_matches_one_process(two_ranks: Path, one_rank: Path) -> None:
    assert_close_runs(two_ranks / "ddp", one_rank / "untied")


@pytest.mark.slow
def test_fsdp_on_two_ranks_matches_one_process(two_ranks: Path, one_rank: Path) -> None:
    # tied embeddings: one parameter in the root group, stored once in the checkpoint
    assert_close_runs(two_ranks / "fsdp", one_rank / "tied")
    ckpts = [latest_checkpoint(r) for r in (two_ranks / "fsdp", one_rank / "tied")]
    infos = [lmcore.read_info(c.model) for c in ckpts if c is not None]
    assert infos[0].tied == infos[1].tied and len(infos[0].tied) == 1
    assert infos[0].tensors.keys() == infos[1].tensors.keys()


@pytest.mark.slow
def test_only_rank_zero_writes(two_ranks: Path) -> None:
    run = two_ranks / "ddp"
    records = read_metrics(run)
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert steps == [1, 2, 3, 4]  # once each, not once per rank
    assert [r["event"] for r in records if r["kind"] == "event"] == ["start", "done"]
    assert sorted(p.name for p in run.iterdir()) == [
        ".lock", "checkpoints", "loss.png", "metrics.jsonl", "run.json", "tokenizer.json"
    ]  # fmt: skip
    assert [c.step for c in checkpoints(run)] == [2, 4]
    assert sorted(p.name for p in (run / CHECKPOINTS).iterdir()) == ["step-000002", "step-000004"]
    assert read_run(run)["status"]["state"] == "done"


@pytest.mark.slow
def test_a_sharded_checkpoint_loads_in_one_process_with_identical_logits(two_ranks: Path) -> None:
    ckpt = latest_checkpoint(two_ranks / "fsdp")
    assert ckpt is not None
    model = lmcore.load(ckpt.model)
    assert model.lm_head.weight is model.token_embeddings.weight  # still tied
    sharded = load_file(str(two_ranks / "fsdp-logits.safetensors"))["logits"]
    with torch.no_grad():
        logits = model(probe())
    assert (logits - sharded).abs().max().item() <= 1e-6


@pytest.mark.slow
def test_a_two_rank_resume_equals_the_uninterrupted_run(two_ranks: Path) -> None:
    split, whole = two_ranks / "split", two_ranks / "fsdp"
    events = [r["event"] for r in read_metrics(split) if r["kind"] == "event"]
    assert events == ["start", "interrupted", "resume", "done"]
    assert losses(split) == losses(whole)  # the same numbers, step by step
    wa, wb = latest_weights(split), latest_weights(whole)
    for name in wb:
        assert torch.equal(wa[name], wb[name]), name
    (ta, _), (tb, _) = trainer_state(split), trainer_state(whole)
    for name in tb:
        if name.startswith("optimizer."):
            assert torch.equal(ta[name], tb[name]), name


@pytest.mark.slow
def test_fsdp_mixed_precision_trains_near_float32(two_ranks: Path) -> None:
    got, want = losses(two_ranks / "bf16"), losses(two_ranks / "fsdp")
    diffs = [abs(x - y) for (_, x), (_, y) in zip(got, want, strict=True)]
    assert 0 < max(diffs) < 0.05  # bf16 compute: close, not equal
    ckpt = latest_checkpoint(two_ranks / "bf16")
    assert ckpt is not None
    assert lmcore.read_info(ckpt.model).dtype == "float32"  # the sharded weights stay float32


@pytest.mark.slow
def test_ddp_and_fsdp_of_todays_options_match_one_process(two_ranks: Path, one_rank: Path) -> None:
    assert_close_runs(two_ranks / "options-ddp", one_rank / "options")
    assert_close_runs(two_ranks / "options-fsdp", one_rank / "options")
    ckpt = latest_checkpoint(two_ranks / "options-fsdp")
    assert ckpt is not None and lmcore.load(ckpt.model).spec == lmcore.parse_spec(OPTIONS)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spec", "name"), [(SPEC, "tp"), (TP_OPTIONS, "tp-options"), (TP_GATED, "tp-gated")]
)
def test_tensor_parallel_matches_one_process(two_ranks: Path, spec: str, name: str) -> None:
    from lmcore.model.nn import cross_entropy

    got = load_file(str(two_ranks / f"{name}.safetensors"))
    torch.manual_seed(0)
    model = TransformerLM(spec)
    perturb_sinks(model)
    x = probe()
    logits = model(x)
    cross_entropy(logits, torch.roll(x, -1, dims=1)).backward()
    assert (got["logits"] - logits).abs().max().item() <= TOL
    for name, p in model.named_parameters():
        assert p.grad is not None
        assert (got[f"grad.{name}"] - p.grad).abs().max().item() <= TOL, name
    # rank 0 holds the first half of the q rows (colwise) and of w2's columns (rowwise)
    q, w2 = "layers.0.attn.q_proj.weight", "layers.0.ffn.w2.weight"
    assert torch.equal(got[f"local.{q}"], model.get_parameter(q).detach().chunk(2, dim=0)[0])
    assert torch.equal(got[f"local.{w2}"], model.get_parameter(w2).detach().chunk(2, dim=1)[0])
    assert got["local.lm_head.weight"].shape == model.lm_head.weight.shape  # replicated
    if spec == TP_GATED:  # the first half of the gate's rows and of the heads' sinks
        gate, sinks = "layers.0.attn.gate_proj.weight", "layers.0.attn.sinks"
        assert torch.equal(got[f"local.{gate}"], model.get_parameter(gate).detach().chunk(2)[0])
        assert torch.equal(got[f"local.{sinks}"], model.get_parameter(sinks).detach()[:1])


# ------------------------------------------------------------------------------ failure


@pytest.fixture(scope="module")
def failed(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A ddp run whose rank 1 raised in its third step: the run and torchrun's stderr."""
    out = tmp_path_factory.mktemp("failed")
    done = torchrun(WORKER, "fail", tiny_data, out, cwd=out)
    assert done.returncode != 0, done.stderr[-4000:]
    return out / "fail", done.stderr


@pytest.mark.slow
def test_a_rank_failing_mid_step_fails_the_job_and_leaves_no_partial_checkpoint(
    failed: tuple[Path, str],
) -> None:
    run, stderr = failed
    assert "RuntimeError: injected failure on rank 1 in step 3" in stderr
    assert "rank      : 1" in stderr  # torchrun's summary names the failing rank
    assert sorted(p.name for p in (run / CHECKPOINTS).iterdir()) == ["step-000002"]
    ckpt = latest_checkpoint(run)
    assert ckpt is not None and ckpt.step == 2
    assert lmcore.load(ckpt.model).spec == lmcore.parse_spec(SPEC)  # whole
    assert [r["step"] for r in read_metrics(run) if r["kind"] == "train"] == [1, 2]


@pytest.mark.slow
def test_the_command_line_resumes_it_on_two_processes(failed: tuple[Path, str]) -> None:
    # `torchrun -m lmcore train --resume`: the ddp run's checkpoint continues under fsdp
    run, _ = failed
    done = torchrun("-m", "lmcore", "train", "--resume", run, "--parallel", "fsdp",
                    "--steps", "5", cwd=run.parent)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count("resumed: from") == 1  # rank 0 reports, once
    assert "parallel: fsdp, rank 0 of 2, gloo backend" in done.stdout
    assert [r["step"] for r in read_metrics(run) if r["kind"] == "train"] == [1, 2, 3, 4, 5]
    assert [c.step for c in checkpoints(run)] == [2, 4, 5]
    ckpt = latest_checkpoint(run)
    assert ckpt is not None
    assert lmcore.load(ckpt.model).spec == lmcore.parse_spec(SPEC)
    assert read_run(run)["status"]["state"] == "done"


# ------------------------------------------------------------------------------ one process


def test_launch_environment() -> None:
    assert launch_env({}) is None
    env = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    got = launch_env(env)
    assert got is not None and (got.rank, got.world_size, got.local_rank) == (1, 4, 1)
    with pytest.raises(ParallelError, match=r"RANK=5 is not in 0..WORLD_SIZE-1"):
        launch_env({**env, "RANK": "5"})
    with pytest.raises(ParallelError, match=r"WORLD_SIZE='two' is not an integer"):
        launch_env({**env, "WORLD_SIZE": "two"})


def test_modes_need_torchrun_and_torchrun_needs_a_mode() -> None:
    with distributed(None, env={}) as par:
        assert type(par) is Parallel and par.world_size == 1
    with (
        pytest.raises(ParallelError, match=r"--parallel fsdp needs the process group torchrun"),
        distributed("fsdp", env={}),
    ):
        pass
    two = {"RANK": "0", "WORLD_SIZE": "2"}
    with (
        pytest.raises(ParallelError, match=r"no --parallel was given.*--parallel ddp or"),
        distributed(None, env=two),
    ):
        pass
    with (
        pytest.raises(ParallelError, match=r"--parallel 'zero': unknown mode; use one of"),
        distributed("zero", env=two),
    ):
        pass
    with (
        pytest.raises(ParallelError, match=r"--fsdp-bf16 .* needs --parallel fsdp"),
        distributed("ddp", mixed_precision="bfloat16", env=two),
    ):
        pass


def test_optimizer_state_by_name_and_back(tiny_data: Path) -> None:
    model = TransformerLM(TIED)
    opt, names, _ = make_optimizer(model, CONFIG)
    F.cross_entropy(model(probe()).flatten(0, 1), probe().flatten()).backward()
    opt.step()
    sd = opt.state_dict()
    named = by_name(sd, names)
    assert set(named["state"]) == {n for g in names for n in g}
    assert "lm_head.weight" not in named["state"]  # tied: one parameter, one name
    back = by_index(named, names)
    assert back["param_groups"] == sd["param_groups"]
    assert back["state"].keys() == sd["state"].keys()
    for i, entry in sd["state"].items():
        assert all(torch.equal(entry[k], back["state"][i][k]) for k in entry)


def test_tensor_parallel_plan_names_the_projections() -> None:
    model = TransformerLM(SPEC)
    plan = tensor_parallel_plan(model)
    assert sorted(plan) == sorted(
        f"layers.{i}.{m}" for i in range(2)
        for m in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.output_proj",
                  "ffn.w1", "ffn.w2", "ffn.w3")
    )  # fmt: skip
    kinds = {k.rsplit(".", 1)[1]: type(v).__name__ for k, v in plan.items()}
    assert kinds == {"q_proj": "ColwiseParallel", "k_proj": "ColwiseParallel",
                     "v_proj": "ColwiseParallel", "output_proj": "RowwiseParallel",
                     "w1": "ColwiseParallel", "w3": "ColwiseParallel",
                     "w2": "RowwiseParallel"}  # fmt: skip
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    assert isinstance(plan["layers.0.attn.q_proj"], ColwiseParallel)
    assert isinstance(plan["layers.0.ffn.w2"], RowwiseParallel)


def test_memory_per_rank_for_gpt2_xl_on_eight_ranks() -> None:
    mem = describe("gpt2-xl").memory
    params = describe("gpt2-xl").accounting.params
    ddp, fsdp = memory_per_rank(mem, "ddp", 8), memory_per_rank(mem, "fsdp", 8)
    assert ddp["weights"] == ddp["gradients"] == 4 * params  # float32
    assert ddp["optimizer"] == 8 * params  # two float32 moments
    assert fsdp["weights"] == -(-4 * params // 8) and fsdp["optimizer"] == -(-8 * params // 8)
    assert ddp["total"] == 16 * params + mem.buffers
    with pytest.raises(ParallelError, match=r"mode 'tp': use one of ddp, fsdp"):
        memory_per_rank(mem, "tp", 8)


def test_tensor_parallel_refuses_qk_norms_and_per_layer_attention_biases() -> None:
    from lmcore.train.parallel import apply_tensor_parallel

    class Mesh:
        def size(self) -> int:
            return 2

    for spec, facts in (
        (f"{SPEC}, qk_norm[1]=rmsnorm, qk_norm_scope[1]=full",
         ("qk_norm=rmsnorm(eps=1e-05)", "tensor parallelism splits the heads across ranks")),
        (f"{SPEC}, pos[1]=alibi", ("adds an attention bias across the heads",)),
    ):  # fmt: skip
        with raises_naming(ParallelError, *facts):
            apply_tensor_parallel(TransformerLM(spec), Mesh())  # type: ignore[arg-type]
