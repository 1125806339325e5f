"""lmcore's model for lm-evaluation-harness (the `eval` extra), registered as `lmcore`.

    import lmcore.eval.harness  # registers the model name "lmcore" with lm-eval
    import lm_eval

    results = lm_eval.simple_evaluate(model="lmcore", model_args="pretrained=runs/quickstart",
                                      tasks=["lambada_openai"])

`LmcoreLM` scores any lmcore checkpoint, whatever plugin components it is built from, without a
Hugging Face conversion: `loglikelihood` and the windows of `loglikelihood_rolling` go through
`lmcore.eval.scoring` (batches, a shared context computed once through the KV cache),
`generate_until` through lmcore's generation (left-padded batches with a KV cache). Requests are
tokenized and windowed as lm-eval's Hugging Face backend does it (`TemplateLM`'s context and
continuation split, `get_rolling_token_windows`), so the same checkpoint converted with
`lmcore convert --to-hf` gets the same numbers from lm-eval's `hf` model.

`model_args`: `pretrained` (a model file, checkpoint or run directory), `tokenizer` (a
tokenizer.json; default: found as `lmcore generate` finds it), `dtype`, `max_gen_toks`; lm-eval
passes `batch_size` and `device`.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from lmcore.errors import EvalError, did_you_mean
from lmcore.eval.loading import check_vocab, load_model, load_tokenizer
from lmcore.eval.scoring import loglikelihoods
from lmcore.model.generate import GREEDY, Sampling

try:
    import lm_eval.models  # noqa: F401  (the built-ins first: lm-eval fills an empty registry only)
    from lm_eval import utils as lm_utils
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
except ImportError as e:  # pragma: no cover - the message is what the tests see
    raise ImportError(
        f"lmcore's lm-evaluation-harness model needs the 'eval' extra: pip install "
        f"'lmcore-registry[eval]' ({e})",
        name=e.name,  # what the command line names: the missing package
    ) from e

__all__ = ["LmcoreLM", "check_tasks", "run_tasks"]

EOT = "<|endoftext|>"
_log = logging.getLogger(__name__)


class LmcoreLM(TemplateLM):  # type: ignore[misc]  # lm-eval ships no type information
    """An lmcore checkpoint as an lm-eval model (see the module's docstring)."""

    def __init__(
        self,
        pretrained: str | os.PathLike[str],
        tokenizer: str | os.PathLike[str] | None = None,
        batch_size: int | str = 8,
        max_batch_size: int | None = None,
        device: str | None = "auto",
        dtype: str | None = None,
        max_gen_toks: int = 256,
        **unused: Any,
    ) -> None:
        super().__init__()
        if unused:
            _log.warning("lmcore: ignoring model_args %s", ", ".join(sorted(unused)))
        if dtype not in (None, "auto", "float32", "bfloat16", "float16"):
            raise EvalError(f"dtype {dtype!r}: use float32, bfloat16 or float16")
        torch_dtype = None if dtype in (None, "auto") else getattr(torch, dtype)
        self.model, self.info = load_model(pretrained, device=device or "auto", dtype=torch_dtype)
        self.tokenizer, self.tokenizer_path = load_tokenizer(self.info, tokenizer)
        check_vocab(self.tokenizer, self.model.spec.vocab_size, self.tokenizer_path)
        eot = self.tokenizer.token_to_id(EOT)
        if eot is None:
            raise EvalError(
                f"the tokenizer {str(self.tokenizer_path)!r} has no {EOT} token, which lm-eval "
                "uses as the end of text and the context of an empty prompt"
            )
        self._eot = int(eot)
        # "auto" (lm-eval's way of asking for the largest batch that fits): lmcore's default.
        self._batch_size = int(batch_size) if str(batch_size).isdigit() else 8
        if max_batch_size is not None:
            self._batch_size = min(self._batch_size, int(max_batch_size))
        self._max_gen_toks = int(max_gen_toks)
        self._device = self.model.lm_head.weight.device

    # ---------------------------------------------------------------- what lm-eval reads

    @property
    def eot_token_id(self) -> int:
        return self._eot

    @property
    def max_length(self) -> int:
        return int(self.model.spec.context_length)

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def tokenizer_name(self) -> str:
        return str(self.tokenizer_path).replace("/", "__")

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **_: Any
    ) -> list[int]:
        ids: list[int] = self.tokenizer.encode(string, add_special_tokens=False).ids
        return ids

    def tok_decode(self, tokens: Sequence[int], skip_special_tokens: bool = True) -> str:
        text: str = self.tokenizer.decode(list(tokens), skip_special_tokens=skip_special_tokens)
        return text

    # ---------------------------------------------------------------- requests

    def _loglikelihood_tokens(
        self,
        requests: Sequence[tuple[Any, Sequence[int], Sequence[int]]],
        disable_tqdm: bool = False,
        **_: Any,
    ) -> list[tuple[float, bool]]:
        pairs = [(ctx, cont) for _, ctx, cont in requests]
        scores = loglikelihoods(
            self.model, pairs, batch_size=self.batch_size, progress=not disable_tqdm
        )
        for request, answer in zip(requests, scores, strict=True):
            key = request[0]
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
        return scores

    def loglikelihood_rolling(
        self, requests: Sequence[Any], disable_tqdm: bool = False
    ) -> list[float]:
        """Each text's log-likelihood in disjoint windows of the context length (lm-eval's
        `get_rolling_token_windows`), every window of every text batched together."""
        windows: list[tuple[int, list[int], list[int]]] = []
        for n, (text,) in enumerate(req.args for req in requests):
            rolling = lm_utils.get_rolling_token_windows(
                token_list=self.tok_encode(text),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            windows += [(n, *lm_utils.make_disjoint_window(w)) for w in rolling]
        scores = loglikelihoods(
            self.model,
            [(ctx, cont) for _, ctx, cont in windows],
            batch_size=self.batch_size,
            progress=not disable_tqdm,
        )
        totals = [0.0] * len(requests)
        for (n, _, _), (logp, _) in zip(windows, scores, strict=True):
            totals[n] += logp
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy (or sampled, with `do_sample`) continuations up to a stop string, the end of
        text or `max_gen_toks`, requests with the same options batched (left-padded)."""
        from tqdm import tqdm

        out: dict[int, str] = {}
        groups: dict[str, list[int]] = {}
        for n, req in enumerate(requests):
            groups.setdefault(repr(sorted(req.args[1].items())), []).append(n)
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="lmcore generate_until")
        for members in groups.values():
            options = dict(requests[members[0]].args[1])
            members.sort(key=lambda n: -len(requests[n].args[0]))
            for i in range(0, len(members), self.batch_size):
                batch = members[i : i + self.batch_size]
                texts = self._generate([requests[n].args[0] for n in batch], dict(options))
                out.update(zip(batch, texts, strict=True))
                for n, text in zip(batch, texts, strict=True):
                    self.cache_hook.add_partial("generate_until", requests[n].args, text)
                bar.update(len(batch))
        bar.close()
        return [out[n] for n in range(len(requests))]

    def _generate(self, contexts: list[str], options: dict[str, Any]) -> list[str]:
        until = options.pop("until", None)
        stops = [until] if isinstance(until, str) else list(until or [])
        stops.append(EOT)
        new = options.pop("max_gen_toks", options.pop("max_new_tokens", self.max_gen_toks))
        new = max(1, min(int(new), self.max_length - 1))
        sample = bool(options.pop("do_sample", False))
        temperature = float(options.pop("temperature", 1.0 if sample else 0.0))
        prompts = [self.tok_encode(c)[-(self.max_length - new) :] or [self._eot] for c in contexts]
        masked = "mask" in self.model.blueprint.features("attn")
        if masked or len({len(p) for p in prompts}) == 1:
            return self._decode_batch(prompts, new, sample, temperature, options, stops)
        return [  # prompts of different lengths need a kernel that masks pads: one at a time
            self._decode_batch([p], new, sample, temperature, options, stops)[0] for p in prompts
        ]

    def _decode_batch(
        self,
        prompts: list[list[int]],
        new: int,
        sample: bool,
        temperature: float,
        options: dict[str, Any],
        stops: list[str],
    ) -> list[str]:
        sampling = (
            Sampling(temperature, float(options.get("top_p", 1.0)), options.get("top_k"))
            if sample
            else GREEDY
        )
        steps = self.model.stream(prompts, new, sampling, stop_token=self._eot)
        rows: list[list[int]] = [[] for _ in prompts]
        done = [False] * len(prompts)
        for tok in steps:
            for b, t in enumerate(tok.tolist()):
                if done[b]:
                    continue
                rows[b].append(int(t))
                text = self.tok_decode(rows[b], skip_special_tokens=False)
                done[b] = int(t) == self._eot or any(s and s in text for s in stops)
            if all(done):
                break
        texts = []
        for row in rows:
            text = self.tok_decode(row, skip_special_tokens=False)
            for s in stops:
                if s:
                    text = text.split(s)[0]
            texts.append(text)
        return texts

    def get_model_info(self) -> dict[str, Any]:
        return {
            "model_num_parameters": sum(p.numel() for p in self.model.parameters()),
            "model_dtype": str(self.model.lm_head.weight.dtype),
            "model_spec": self.info.spec,
            "model_path": str(self.info.path),
        }


with contextlib.suppress(ValueError):  # registered already (loaded twice under another name)
    register_model("lmcore")(LmcoreLM)


# ------------------------------------------------------------------------------ running tasks


def task_manager(tasks: Sequence[str], include_path: Sequence[str] | None) -> Any:
    """lm-eval's `TaskManager` for `tasks`: when every one is defined in `include_path`, from
    those directories alone (lm-eval's own thousands of task files take seconds to index);
    `EvalError` with a did-you-mean for a name no directory defines."""
    from lm_eval.tasks import TaskManager

    paths = [str(p) for p in include_path or ()]
    for p in paths:
        if not Path(p).is_dir():
            raise EvalError(f"--include-path {p!r} is not a directory of task YAML files")
    if paths:
        local = TaskManager(include_path=paths, include_defaults=False)
        if all(local.match_tasks([t]) for t in tasks):
            return local
    manager = TaskManager(include_path=paths or None)
    for t in tasks:
        if not manager.match_tasks([t]):
            where = f" or in {', '.join(paths)}" if paths else ""
            raise EvalError(
                f"--tasks {t!r}: no task of that name in lm-eval{where}"
                f"{did_you_mean(t, manager.all_tasks)}; `lm-eval ls tasks` lists them"
            )
    return manager


_GLOB = re.compile(r"[*?\[]")  # datasets reads these in data_files as glob patterns


def _data_files(value: Any, key: str) -> Iterator[tuple[str, str]]:
    """`(key path, file)` of each file a `data_files` value names (a str, a list of them, or
    a mapping of splits to either)."""
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _data_files(v, f"{key}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _data_files(v, f"{key}.{k}")


def _missing_data(name: str, entry: Any) -> EvalError | None:
    """The error naming the task, its YAML and the key of a local data file it names that does
    not exist (resolved as `datasets` resolves it: against the working directory)."""
    cfg = getattr(entry, "cfg", None) or {}
    kwargs = cfg.get("dataset_kwargs") if isinstance(cfg, dict) else None
    files = kwargs.get("data_files") if isinstance(kwargs, dict) else None
    for key, file in _data_files(files, "dataset_kwargs.data_files"):
        found = glob.glob(file) if _GLOB.search(file) else [file] if Path(file).exists() else []
        if not found:
            return _no_data(name, entry, file, key)
    return None


def _no_data(name: str, entry: Any, file: str, key: str | None = None) -> EvalError:
    yaml = getattr(entry, "yaml_path", None)
    where = f" ({key} in {yaml})" if key and yaml else f" (named in {yaml})" if yaml else ""
    return EvalError(
        f"--tasks {name!r}: its data file {file!r} does not exist{where}, looked for in "
        f"{os.getcwd()}, the working directory; fix the path in the task's YAML, or run "
        "lmcore from the directory the path is relative to"
    )


def _shots(task: Any, num_fewshot: int | None) -> int:
    """The few-shot examples lm-eval will give `task`'s prompts (`simple_evaluate`'s rule: a
    YAML's `num_fewshot: 0` stands; else --num-fewshot, else the YAML's, else none)."""
    configured = task.get_config("num_fewshot")
    if num_fewshot is None or configured == 0:
        return int(configured or 0)
    return num_fewshot


def _pool(task: Any) -> tuple[int, bool]:
    """How many documents `task` draws few-shot examples from, and whether they are its test
    documents (each prompt's own is then left out, so one fewer can be drawn)."""
    sampler = getattr(task, "sampler", None)
    docs = sampler.fewshot_docs() if sampler is not None else task.fewshot_docs()
    cfg = getattr(task, "fewshot_cfg", None)
    own = cfg is not None and getattr(cfg, "split", None) == task.config.test_split
    return len(docs or ()), own


def check_tasks(manager: Any, tasks: Sequence[str], num_fewshot: int | None) -> None:
    """Load each task (its documents) as `simple_evaluate` will, before the model: `EvalError`
    naming the task, its YAML and the file for a data file that does not exist, and naming
    both numbers for more few-shot examples than the task's pool holds, where lm-eval would
    fail later with a traceback."""
    if num_fewshot is not None and num_fewshot < 0:
        raise EvalError(f"--num-fewshot {num_fewshot}: must be 0 or more")
    with _quiet():  # simple_evaluate loads them again, and says what it says then
        for name in tasks:
            _check_task(manager, name, num_fewshot)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """lm-eval's warnings and datasets' progress bars off while the tasks are checked, so that
    a refusal is one line and a run's output is what it was."""
    import datasets

    logger = logging.getLogger("lm_eval")
    level, bars = logger.level, not datasets.are_progress_bars_disabled()
    logger.setLevel(logging.ERROR)
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        logger.setLevel(level)
        if bars:
            datasets.enable_progress_bars()


def _check_task(manager: Any, name: str, num_fewshot: int | None) -> None:
    """`check_tasks` for one name (a task, a group or a tag)."""
    entry = manager.task_index.get(name)
    problem = _missing_data(name, entry)
    if problem is not None:
        raise problem
    try:
        loaded = manager.load([name])
    except FileNotFoundError as e:  # a file of a group's task, or one the YAML builds
        file = e.filename or str(e).removeprefix("Unable to find ").strip("'")
        raise _no_data(name, entry, file) from None
    for task_name, task in loaded["tasks"].items():
        shots = _shots(task, num_fewshot)
        if shots == 0:
            continue
        pool, own = _pool(task)
        most = pool - 1 if own else pool
        if shots > most:
            own_doc = " less each prompt's own (they are its test documents)" if own else ""
            raise EvalError(
                f"--num-fewshot {shots}: task {task_name!r} has {pool:,} documents to draw "
                f"few-shot examples from{own_doc}, so at most {max(most, 0):,}; give "
                f"--num-fewshot {max(most, 0)} or fewer"
            )


def run_tasks(
    model: str | os.PathLike[str],
    tasks: Sequence[str],
    *,
    include_path: Sequence[str] | None = None,
    limit: float | None = None,
    num_fewshot: int | None = None,
    batch_size: int = 8,
    device: str = "auto",
    dtype: str | None = None,
    tokenizer: str | None = None,
    seed: int = 0,
) -> tuple[dict[str, Any], str]:
    """`lm_eval.simple_evaluate` with `LmcoreLM`: the results and lm-eval's table of them."""
    from lm_eval import simple_evaluate
    from lm_eval.utils import make_table

    manager = task_manager(tasks, include_path)
    check_tasks(manager, tasks, num_fewshot)  # before the model: fail in seconds, not after it
    lm = LmcoreLM(model, tokenizer=tokenizer, batch_size=batch_size, device=device, dtype=dtype)
    results: dict[str, Any] = simple_evaluate(
        model=lm,
        tasks=list(tasks),
        num_fewshot=num_fewshot,
        limit=int(limit) if limit is not None and limit >= 1 else limit,
        task_manager=manager,
        log_samples=False,
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
    )
    table = make_table(results)
    if results.get("groups"):
        table += make_table(results, "groups")
    return results, table
