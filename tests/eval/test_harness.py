"""lmcore's lm-evaluation-harness model against lm-eval's own `hf` model, on a Llama-shaped
lmcore checkpoint converted with `lmcore convert --to-hf`: the same log-likelihood for every
request (within 1e-4), the same accuracies and the same greedy generations, on the local tasks
in tests/eval/lm_eval_tasks (nothing is downloaded: the datasets load offline)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

EXTRA = "needs the 'eval' extra: pip install -e '.[eval]'"
lm_eval = pytest.importorskip("lm_eval", reason=EXTRA)
pytest.importorskip("accelerate", reason="needs the 'test' extra (accelerate, for lm-eval's hf)")

import torch  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

import lmcore  # noqa: E402
from lmcore.cli.main import main  # noqa: E402
from lmcore.data import EOT  # noqa: E402
from tests.helpers.errors import assert_naming  # noqa: E402
from tests.helpers.runs import byte_level_bpe  #  noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TASKS_DIR = Path(__file__).with_name("lm_eval_tasks")
TASKS = ["lmcore_python_mc", "lmcore_python_ppl", "lmcore_python_gen"]
SPEC = "vocab_size=320, context_length=64, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2"

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tasks' data_files are relative to the repository's root; nothing may be fetched."""
    import datasets

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)


def _tokenizer() -> Tokenizer:
    texts = [
        next(iter(json.loads(line).values()))
        for f in sorted(TASKS_DIR.glob("*.jsonl"))
        for line in f.read_text(encoding="utf-8").splitlines()
    ]
    return byte_level_bpe([str(t) for t in texts] * 5, 320)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`lm/`: an lmcore checkpoint with its tokenizer.json; `hf/`: the same converted with
    `convert --to-hf`, with the tokenizer saved as transformers loads it."""
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("harness")
    (root / "lm").mkdir()
    torch.manual_seed(0)
    lmcore.save(lmcore.build_model(SPEC), root / "lm" / "model.safetensors")
    tok = _tokenizer()
    tok.save(str(root / "lm" / "tokenizer.json"))
    assert (
        main(["convert", "--to-hf", str(root / "lm" / "model.safetensors"), str(root / "hf")]) == 0
    )
    config = json.loads((root / "hf" / "config.json").read_text())
    config.update(eos_token_id=tok.token_to_id(EOT), bos_token_id=tok.token_to_id(EOT))
    (root / "hf" / "config.json").write_text(json.dumps(config))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOT).save_pretrained(root / "hf")
    return root


def _evaluate(model: str, args: str) -> dict[str, Any]:
    from lm_eval.tasks import TaskManager

    import lmcore.eval.harness  # noqa: F401  (registers "lmcore")

    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
    results: dict[str, Any] = lm_eval.simple_evaluate(
        model=model, model_args=args, tasks=TASKS, task_manager=manager, batch_size=4,
        device="cpu", log_samples=True,
    )  # fmt: skip
    return results


def test_lmcore_matches_lm_evals_hf_model_request_by_request(models_dir: Path) -> None:
    hf = _evaluate("hf", f"pretrained={models_dir / 'hf'},dtype=float32")
    ours = _evaluate("lmcore", f"pretrained={models_dir / 'lm'}")
    diffs: dict[str, float] = {}
    for task in TASKS:
        a, b = hf["samples"][task], ours["samples"][task]
        assert [s["doc_id"] for s in a] == [s["doc_id"] for s in b]
        worst = 0.0
        for x, y in zip(a, b, strict=True):
            for rx, ry in zip(x["resps"], y["resps"], strict=True):
                if isinstance(rx[0], str):  # generate_until: the same greedy text
                    assert rx[0] == ry[0]
                    continue
                (lx, gx), (ly, gy) = (rx[0], True), (ry[0], True)
                if isinstance(rx[0], tuple | list):  # loglikelihood: (logprob, is_greedy)
                    (lx, gx), (ly, gy) = rx[0], ry[0]
                assert gx == gy
                worst = max(worst, abs(lx - ly))
        diffs[task] = worst
    assert diffs["lmcore_python_mc"] <= 1e-4 and diffs["lmcore_python_ppl"] <= 1e-4, diffs
    for task, metric in [("lmcore_python_mc", "acc,none"), ("lmcore_python_mc", "acc_norm,none"),
                         ("lmcore_python_gen", "exact_match,none")]:  # fmt: skip
        assert ours["results"][task][metric] == hf["results"][task][metric]
    for metric in ("bits_per_byte,none", "byte_perplexity,none"):
        got, want = (
            ours["results"]["lmcore_python_ppl"][metric],
            hf["results"]["lmcore_python_ppl"][metric],
        )
        assert got == pytest.approx(want, rel=1e-5)
    print(f"largest log-likelihood difference against lm-eval's hf model: {diffs}")


def test_lmcore_eval_tasks_prints_lm_evals_table_and_writes_results(
    models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "results.json"
    argv = ["eval", str(models_dir / "lm"), "--tasks", "lmcore_python_mc,lmcore_python_ppl",
            "--include-path", str(TASKS_DIR), "--limit", "5", "--output", str(out)]  # fmt: skip
    assert main(argv) == 0
    shown = capsys.readouterr().out
    assert "|lmcore_python_mc " in shown and "acc_norm" in shown and "bits_per_byte" in shown
    saved = json.loads(out.read_text())
    assert saved["results"]["lmcore_python_mc"]["sample_len"] == 5
    assert saved["config"]["model"] == "LmcoreLM"


def test_an_unknown_task_is_named_with_a_suggestion(
    models_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import lm_eval.tasks

    real = lm_eval.tasks.TaskManager  # without lm-eval's own thousands of tasks (seconds to index)
    monkeypatch.setattr(
        lm_eval.tasks,
        "TaskManager",
        lambda include_path=None, **_: real(include_path=include_path, include_defaults=False),
    )
    argv = ["eval", str(models_dir / "lm"), "--tasks", "lmcore_python_mcq",
            "--include-path", str(TASKS_DIR)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--tasks 'lmcore_python_mcq': no task of that name in lm-eval or in " in err
    assert "did you mean 'lmcore_python_mc'" in err


# ------------------------------------------------------------------ tasks refused before the model


def _no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model may not be loaded: these are refused before it (in seconds, not after it)."""
    import lmcore.eval.harness

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded before the tasks were checked")

    monkeypatch.setattr(lmcore.eval.harness, "LmcoreLM", refused)


def _task(root: Path, data_file: str, docs: int = 0) -> Path:
    """`root/tasks/probe_mc.yaml`, a multiple-choice task reading `data_file` (written with
    `docs` documents when docs > 0)."""
    (root / "tasks").mkdir(parents=True, exist_ok=True)
    if docs:
        (root / data_file).write_text("".join(json.dumps(
            {"question": f"q{i}", "answer": i % 2, "choices": [" a", " b"]}) + "\n"
            for i in range(docs)))  # fmt: skip
    (root / "tasks" / "probe_mc.yaml").write_text(
        f"task: probe_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data_file}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{question}}'\n"
        "doc_to_choice: choices\ndoc_to_target: answer\nmetric_list:\n  - metric: acc\n"
    )  # fmt: skip
    return root / "tasks"


def test_a_task_whose_data_file_is_missing_is_named_with_its_yaml_before_the_model(
    eval_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # The probe: a FileNotFoundError traceback from datasets, naming neither task nor YAML.
    monkeypatch.chdir(tmp_path)
    tasks = _task(tmp_path, "missing.jsonl")
    _no_model(monkeypatch)
    argv = ["eval", str(eval_checkpoint), "--tasks", "probe_mc", "--include-path", str(tasks)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert_naming(err, "'probe_mc'", "'missing.jsonl' does not exist",
                  f"dataset_kwargs.data_files.test in {tasks / 'probe_mc.yaml'}", str(tmp_path),
                  "fix the path")  # fmt: skip


def test_more_few_shot_examples_than_the_pool_holds_names_both_numbers_before_the_model(
    eval_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # The probe: `ValueError: Sample larger than population` from lm-eval's sampler.
    monkeypatch.chdir(tmp_path)
    tasks = _task(tmp_path, "docs.jsonl", docs=20)
    _no_model(monkeypatch)
    argv = ["eval", str(eval_checkpoint), "--tasks", "probe_mc", "--include-path", str(tasks)]
    assert main([*argv, "--num-fewshot", "50"]) == 2
    # no few-shot split: lm-eval draws from the 20 test documents (random.sample of 20)
    assert_naming(capsys.readouterr().err, "--num-fewshot 50", "'probe_mc'", "20 documents",
                  "at most 20", "--num-fewshot 20 or fewer")  # fmt: skip
    with pytest.raises(AssertionError, match="the model was loaded"):  # 20 fit: on to the model
        main([*argv, "--num-fewshot", "20"])
    # a few-shot split that is the test split: each prompt's own document is left out
    yaml = tasks / "probe_mc.yaml"
    yaml.write_text(yaml.read_text() + "fewshot_split: test\n")
    assert main([*argv, "--num-fewshot", "20"]) == 2
    assert_naming(capsys.readouterr().err, "--num-fewshot 20", "20 documents", "own",
                  "at most 19")  # fmt: skip


def test_output_is_checked_before_the_evaluation_and_its_results_kept_when_writing_fails(
    eval_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    import lmcore.cli.eval

    monkeypatch.chdir(tmp_path)
    tasks = _task(tmp_path, "docs.jsonl", docs=2)
    argv = ["eval", str(eval_checkpoint), "--tasks", "probe_mc", "--include-path", str(tasks)]
    other = tmp_path / "notes.txt"  # not results: never replaced
    other.write_text("my notes")
    assert main([*argv, "--output", str(other)]) == 2
    assert_naming(capsys.readouterr().err, f"--output {str(other)!r} exists", "not a results",
                  "remove it or give another path")  # fmt: skip
    assert other.read_text() == "my notes"
    # The probe: --output DIR failed with "Is a directory" after the whole evaluation.
    (tmp_path / "results").mkdir()
    assert main([*argv, "--output", "results"]) == 0
    saved = json.loads((tmp_path / "results" / "results.json").read_text())
    assert saved["results"]["probe_mc"]["sample_len"] == 2
    assert "results: results/results.json" in capsys.readouterr().out
    assert main([*argv, "--output", "results"]) == 0  # an earlier run's results: replaced

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(lmcore.cli.eval, "atomic_write", full)  # checked, then the disk fills
    capsys.readouterr()
    assert main([*argv, "--output", "later.json"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["results"]["probe_mc"]["sample_len"] == 2  # nothing lost
    assert_naming(err, "--output 'later.json' could not be written", "No space left",
                  "printed above")  # fmt: skip
