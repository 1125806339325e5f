"""A checkpoint carries its tokenizer (`lmcore.tokenizer`), and `lmcore.load` builds without
initialising the weights it is about to replace (`lmcore.model.empty`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import lmcore
from lmcore.errors import CheckpointError, GenerationError
from lmcore.tokenizer import CONFIG_KEY, METADATA_KEY, SavedTokenizer
from tests.helpers.errors import raises_naming

SPEC = "vocab_size=300,context_length=32,d_model=32,num_layers=2,num_heads=2,d_ff=64"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    t.train_from_iterator(["the cat sat on the mat, hello world"] * 20, trainer)
    return t


def test_a_checkpoint_keeps_its_tokenizer_through_load_and_save(
    tmp_path: Path, tok: Tokenizer
) -> None:
    saved = SavedTokenizer.from_tokenizer(tok, chat_template=CHATML, eos_token_id=2)
    assert saved.stop_token_ids == (2, 0)  # eos, then <|endoftext|> (an end token's spelling)
    model = lmcore.build_model(SPEC)
    path = model.save(tmp_path / "m.safetensors", tokenizer=saved)
    again = lmcore.load(path)
    assert again.tokenizer == saved and lmcore.read_info(path).tokenizer == saved
    second = again.save(tmp_path / "again.safetensors")  # the model's own, by default
    assert lmcore.read_info(second).tokenizer == saved
    assert lmcore.read_info(model.save(tmp_path / "none.safetensors")).tokenizer is None


def test_a_changed_tokenizer_fails_the_integrity_check(tmp_path: Path, tok: Tokenizer) -> None:
    saved = SavedTokenizer.from_tokenizer(tok, chat_template=CHATML)
    path = lmcore.build_model(SPEC).save(tmp_path / "m.safetensors", tokenizer=saved)
    with safe_open(str(path), "pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    config = json.loads(meta[CONFIG_KEY])
    config["chat_template"] = "{{ 'something else' }}"
    save_file(tensors, str(path), {**meta, CONFIG_KEY: json.dumps(config, sort_keys=True)})
    with raises_naming(
        CheckpointError, "fails its integrity check", "the metadata lmcore.tokenizer_config"
    ):
        lmcore.read_info(path)
    save_file(tensors, str(path), {k: v for k, v in meta.items() if k != METADATA_KEY})
    with pytest.raises(CheckpointError, match=r"lmcore\.tokenizer does not match"):
        lmcore.read_info(path)


def test_a_hugging_face_directory_s_tokenizer_files(tmp_path: Path, tok: Tokenizer) -> None:
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": CHATML,
                "eos_token": "<|im_end|>",
                "bos_token": {"content": "<|im_start|>"},
            }
        )
    )
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 1]}))
    saved = SavedTokenizer.from_directory(tmp_path)
    assert saved is not None
    assert (saved.bos_token_id, saved.eos_token_id, saved.stop_token_ids) == (1, 2, (2, 1, 0))
    text = saved.render_chat([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert SavedTokenizer.from_directory(tmp_path / "nowhere") is None


def test_chat_templates_run_in_a_sandbox(tok: Tokenizer) -> None:
    hostile = SavedTokenizer.from_tokenizer(
        tok, chat_template="{{ ''.__class__.__mro__[1].__subclasses__() }}"
    )
    with pytest.raises(GenerationError, match="the chat template fails: SecurityError"):
        hostile.render_chat([{"role": "user", "content": "hi"}], tokenizer=tok)
    refusing = SavedTokenizer.from_tokenizer(
        tok, chat_template="{{ raise_exception('no system role') }}"
    )
    with pytest.raises(GenerationError, match="no system role"):
        refusing.render_chat([], tokenizer=tok)
    with pytest.raises(GenerationError, match="has no chat template"):
        SavedTokenizer.from_tokenizer(tok).render_chat([], tokenizer=tok)


def test_load_does_not_initialise_the_weights_it_replaces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    model = lmcore.build_model(SPEC + ",tie_embeddings=true")
    path = model.save(tmp_path / "m.safetensors")

    real: list[tuple[int, ...]] = []  # the shapes initialised in memory, not on meta
    original = torch.nn.init.trunc_normal_

    def record(t: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        if not t.is_meta:
            real.append(tuple(t.shape))
        return original(t, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.nn.init, "trunc_normal_", record)
    again = lmcore.load(path)
    assert real == []
    assert again.lm_head.weight is again.token_embeddings.weight  # still one parameter
    assert not any(p.is_meta for p in again.parameters())
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(again(ids), model(ids), atol=0, rtol=0)
    half = lmcore.load(path, dtype=torch.bfloat16)  # converted on the way in
    assert half.lm_head.weight.dtype == torch.bfloat16


def test_eval_uses_the_checkpoints_own_tokenizer_and_says_so(
    tmp_path: Path, tok: Tokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    from lmcore.cli.main import main

    path = lmcore.build_model(SPEC).save(
        tmp_path / "m.safetensors", tokenizer=SavedTokenizer.from_tokenizer(tok)
    )
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat\n" * 3)
    assert main(["eval", str(path), "--text", str(text)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"text: {text} (69 bytes); tokenizer {path} (the checkpoint's own)" in out


LOOPS = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
BUDGETED = {  # a template -> the facts its error names (P-chat-endless, P-chat-gigabytes, ...)
    "endless": (LOOPS, ("ran past 0.2 s", "0.2 s and 10,000 characters", "loop iterations")),
    "filtered": (LOOPS.replace(") %}", ") if a > -1 %}", 1), ("ran past 0.2 s",)),
    "recursive": ("{% for a in range(1000) recursive %}{{ loop(range(1000)) if loop.depth < 4 }}"
                  "{% endfor %}",
                  ("ran past 0.2 s",)),
    "gigabytes": (LOOPS.replace("%}{% endfor", "%}{{ 'x' * 1000 }}{% endfor", 1),
                  ("wrote past 10,000 characters",)),
    "raw-text": (LOOPS.replace("%}{% endfor", "%}xxxxxxxx{% endfor", 1),
                 ("wrote past 10,000 characters",)),
    "macro": ("{% macro m() %}" + LOOPS.replace("%}{% endfor", "%}xx{% endfor", 1)
              + "{% endmacro %}{{ m()|length }}", ("wrote past 10,000 characters",)),
    "repeat": ("{{ 'x' * 10**12 }}", ("asks for 1,000,000,000,000 characters", "a repetition")),
    "power": ("{{ 3 ** (10**9) }}", ("raises 3 to the power 1000000000",)),
    "doubling": ("{% set ns = namespace(s='x') %}{% for i in range(60) %}"
                 "{% set ns.s = ns.s ~ ns.s %}{% endfor %}", ("asks for 16,384", "a ~ join")),
    "sum": ("{% set ns = namespace(s='x') %}{% for i in range(60) %}"
            "{% set ns.s = ns.s + ns.s %}{% endfor %}", ("asks for 16,384", "a sum")),
    "center": ("{{ 'x'|center(10**10) }}", ("10,000,000,000", "the center filter")),
    "ljust": ("{{ 'x'.ljust(10**10) }}", ("10,000,000,000", "str.ljust")),
    "format": ("{{ '{:>9999999999}'.format(1) }}", ("9,999,999,999", "str.format")),
    "percent": ("{{ '%9999999999d' % 1 }}", ("9,999,999,999", "in %")),
    "join": ("{{ (['x' * 5000] * 1000)|join }}", ("5,000,000", "the join filter")),
    "replace": ("{{ ('x' * 5000).replace('x', 'x' * 5000) }}", ("25,005,000", "str.replace")),
}  # fmt: skip


@pytest.mark.parametrize(("template", "facts"), BUDGETED.values(), ids=BUDGETED.keys())
def test_a_chat_template_runs_within_a_budget_of_time_and_characters(
    tok: Tokenizer, template: str, facts: tuple[str, ...]
) -> None:
    saved = SavedTokenizer.from_tokenizer(tok, chat_template=template)
    start = time.perf_counter()
    with raises_naming(GenerationError, "the chat template", *facts):
        saved.render_chat([{"role": "user", "content": "Hi"}], tokenizer=tok, seconds=0.2,
                          chars=10_000)  # fmt: skip
    assert time.perf_counter() - start < 2.0


def test_the_budget_leaves_real_templates_alone(tok: Tokenizer) -> None:
    # loop variables, filters, macros, a recursive loop and joins within the budget render as
    # plain jinja2 renders them
    template = (
        "{% macro say(m) %}{{ m['role']|upper }}: {{ m['content']|trim }}{% endmacro %}"
        "{% for m in messages %}{{ loop.index }}/{{ loop.length }} {{ say(m) }}"
        "{{ '|' if not loop.last }}{% endfor %} {{ messages|map(attribute='role')|join(',') }}"
        " {{ 'ab' * 3 ~ '%03d' % 7 }} {{ [1, [2, [3]]] | tojson }}"
        "{% for x in [[1, [2]], [3]] recursive %}<{% if x is iterable %}{{ loop(x) }}"
        "{% else %}{{ x }}{% endif %}>{% endfor %}"
    )
    messages = [{"role": "user", "content": " Hi "}, {"role": "assistant", "content": "Hello"}]
    saved = SavedTokenizer.from_tokenizer(tok, chat_template=template)
    ours = saved.render_chat(messages, tokenizer=tok, add_generation_prompt=False)
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    plain.filters["tojson"] = json.dumps
    assert ours == plain.from_string(template).render(messages=messages)
    assert ours == (
        "1/2 USER: Hi|2/2 ASSISTANT: Hello user,assistant ababab007 [1, [2, [3]]]<<1><<2>>><<3>>"
    )
    # large numbers are values, not sizes, unless a width or count is what they give
    numbers = "{{ '{}'.format(10**10) }} {{ '%d' % 10**10 }} {{ [1, 2]|sum(start=10**10) }}"
    saved = SavedTokenizer.from_tokenizer(tok, chat_template=numbers)
    assert saved.render_chat([], tokenizer=tok) == "10000000000 10000000000 10000000003"


def test_a_chat_template_s_syntax_error_names_its_line(tok: Tokenizer) -> None:  # P-chat-syntax
    template = "{% for m in messages %}\n{{ m.content }}\n{% if x %}\n{% endfor %}"
    saved = SavedTokenizer.from_tokenizer(tok, chat_template=template)
    with raises_naming(GenerationError, "syntax error at line 4", "'{% endfor %}'",
                       "Encountered unknown tag 'endfor'"):  # fmt: skip
        saved.check_chat_template()
    with raises_naming(GenerationError, "syntax error at line 4"):
        saved.render_chat([{"role": "user", "content": "Hi"}], tokenizer=tok)


def test_a_message_that_is_not_text_is_refused(tok: Tokenizer) -> None:
    # what Python makes of bytes that are not UTF-8 (surrogateescape): lone surrogates
    saved = SavedTokenizer.from_tokenizer(tok, chat_template=CHATML)
    text = b"caf\xe9".decode("utf-8", errors="surrogateescape")
    with raises_naming(GenerationError, "message 2 (user)", "'\\udce9' at position 3", "UTF-8"):
        saved.render_chat([{"role": "system", "content": "ok"}, {"role": "user", "content": text}])
