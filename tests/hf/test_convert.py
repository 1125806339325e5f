"""Hugging Face model directories (`lmcore.hf.convert`) against transformers itself (a test-only
dependency): random `LlamaForCausalLM`s saved with `save_pretrained`, converted, compared by
logits and converted back; what a directory may hold (shards, links, a tokenizer) and what it
must not. No network. Through `lmcore convert`: tests/cli/test_convert_hf.py."""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import lmcore
from lmcore import ConversionError
from lmcore.hf import convert_from_hf, convert_to_hf, load_llama, save_llama
from lmcore.hf.convert import both_weights
from tests.helpers.errors import raises_naming
from tests.helpers.hf import HF_SPEC as SMALL
from tests.helpers.hf import (
    HF_TOLERANCE,
    LLAMA_V4,
    hf_logits,
    lm_logits,
    quiet_transformers,
    random_llama,
)
from tests.helpers.memory import assert_only_the_context_differs, conversion_growth
from tests.helpers.models import perturbed, token_ids

transformers = quiet_transformers()
from transformers import LlamaForCausalLM  # noqa: E402


def test_the_source_configs_passive_fields_come_back(tmp_path: Path) -> None:
    random_llama(tmp_path / "hf", bos_token_id=5, eos_token_id=6, initializer_range=0.01)
    out = convert_from_hf(tmp_path / "hf", tmp_path / "m.safetensors")
    kept = json.loads(lmcore.read_info(out).metadata["hf.config"])
    assert kept["bos_token_id"] == 5
    convert_to_hf(out, tmp_path / "back")
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["initializer_range"]) == (
        5, 6, 0.01,
    )  # fmt: skip
    assert config["rope_theta"] == 500.0 and config["rope_scaling"] is None
    assert "transformers_version" not in config  # lmcore wrote this file, not transformers


@pytest.mark.parametrize(
    "spec",
    [
        f"{SMALL}, num_kv_heads=2",
        f"{SMALL}, tie_embeddings=true, attn=chunked(block_size=8)",
        f"{SMALL}, num_kv_heads=1, norm=rmsnorm(eps=1e-6), pos=rope(theta=10000)",
    ],
)
def test_an_lmcore_model_goes_to_hf_and_gives_the_same_logits(spec: str, tmp_path: Path) -> None:
    ours = perturbed(spec)
    save_llama(ours, tmp_path / "hf")
    theirs = LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = token_ids(seq=32, seed=3)
    assert (hf_logits(theirs, ids) - lm_logits(ours, ids)).abs().max() <= HF_TOLERANCE
    again = load_llama(tmp_path / "hf")  # attn=sdpa: the kernel is lmcore's choice, not Llama's
    assert str(again.spec) == str(ours.spec).replace("attn=chunked(block_size=8)", "attn=sdpa")
    mine, back = ours.state_dict(), again.state_dict()
    assert mine.keys() == back.keys() and all(torch.equal(mine[k], back[k]) for k in mine)


# ------------------------------------------------------------------ damaged directories


def test_directories_without_usable_weights(tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match=r"is not a directory"):
        load_llama(tmp_path / "nothing")
    with pytest.raises(ConversionError, match=r"has no config.json; a Hugging Face model"):
        load_llama(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_V4))
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x02")
    with raises_naming(
        ConversionError,
        "no model.safetensors and no model.safetensors.index.json",
        "found pytorch_model.bin: pickle files, which lmcore never loads",
        "save_pretrained(DIR)",
    ):
        load_llama(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}})
    )
    with raises_naming(
        ConversionError,
        "shards that are not in the directory: model-00002-of-00002.safetensors",
        "copy the whole model directory",
    ):
        load_llama(tmp_path)


@pytest.mark.parametrize("name", ["/abs/other.safetensors", "../../x.safetensors", "link"])
def test_shards_outside_the_directory_are_refused(tmp_path: Path, name: str) -> None:
    # The probe: an index whose weight_map names /abs/other.safetensors or ../../x.safetensors
    # was read and converted (exit 0).
    model = tmp_path / "llama"
    random_llama(model, shard=True)
    index = model / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    last = sorted(set(data["weight_map"].values()))[-1]
    outside = tmp_path / "elsewhere.safetensors"
    (model / last).rename(outside)
    target = {"/abs/other.safetensors": str(outside), "../../x.safetensors": "../elsewhere.safetensors",
              "link": "link.safetensors"}[name]  # fmt: skip
    if name == "link":
        (model / target).symlink_to(outside)
    data["weight_map"] = {k: target if v == last else v for k, v in data["weight_map"].items()}
    index.write_text(json.dumps(data))
    with raises_naming(
        ConversionError,
        f"{index}: names {target!r}",
        f"resolves to {str(outside)!r}",
        f"outside the model directory {model}",
        "copy the shards into it",
    ):
        load_llama(model)


def test_the_hub_caches_links_into_blobs_are_its_own(tmp_path: Path) -> None:
    # models--org--name/snapshots/REV/* link to ../../blobs/<hash>, as huggingface_hub lays out
    repo = tmp_path / "models--org--tiny"
    snapshot, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    random_llama(tmp_path / "plain")
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, p in enumerate(sorted((tmp_path / "plain").iterdir())):
        p.rename(blobs / f"blob{i}")
        (snapshot / p.name).symlink_to(f"../../blobs/blob{i}")
    assert load_llama(snapshot).spec.vocab_size == 97


def test_integer_tensors_convert_only_when_asked(tmp_path: Path) -> None:
    # The probe: int32 tensors were cast to float silently by --from-hf.
    random_llama(tmp_path)
    weights = tmp_path / "model.safetensors"
    state = load_file(str(weights))
    state["model.norm.weight"] = torch.ones(32, dtype=torch.int32)
    save_file(state, str(weights), metadata={"format": "pt"})
    with raises_naming(
        ConversionError,
        f"{tmp_path}: ",
        "another dtype than the model's",
        "ln_final.weight (int32, model float32)",
        "never changes a dtype silently",
        "dtype= (--dtype)",
        "or fix the file",
    ):
        load_llama(tmp_path)
    converted = load_llama(tmp_path, dtype=torch.float32)
    assert torch.equal(converted.ln_final.weight, torch.ones(32))


def test_a_config_nested_too_deep_is_refused_in_one_line(tmp_path: Path) -> None:
    random_llama(tmp_path)
    (tmp_path / "config.json").write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(
        ConversionError, match=r"config.json: nests deeper than Python's parser follows"
    ):
        load_llama(tmp_path)


def test_product_code_never_imports_transformers() -> None:
    root = Path(lmcore.__file__).parent
    for path in [*root.rglob("*.py"), *(root.parent / "plugins").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.split(".")[0] == "transformers" for n in names), path


def test_the_directorys_tokenizer_goes_into_the_checkpoint_and_back(tmp_path: Path) -> None:
    """--from-hf keeps tokenizer.json, its special tokens and the chat template in the
    checkpoint; --to-hf writes them back, and transformers' own tokenizer reads them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    source = tmp_path / "hf"
    random_llama(source)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=97,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()[:60],
        show_progress=False,
    )
    tok.train_from_iterator(["the cat sat on the mat"] * 10, trainer)
    tok.save(str(source / "tokenizer.json"))
    template = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
    (source / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": template, "eos_token": "<|im_end|>"})
    )
    out = convert_from_hf(source, tmp_path / "m.safetensors")
    saved = lmcore.load(out).tokenizer
    assert saved is not None and saved.json == tok.to_str()
    assert saved.chat_template == template and saved.eos_token_id == 2
    assert saved.stop_token_ids == (2, 0)  # end of turn, then end of text

    back = convert_to_hf(out, tmp_path / "back")
    assert sorted(p.name for p in back.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json",
    ]  # fmt: skip
    hf_tok = transformers.AutoTokenizer.from_pretrained(back)
    text = "the mat sat on the cat"
    assert hf_tok(text)["input_ids"] == tok.encode(text).ids
    assert hf_tok.eos_token == "<|im_end|>"
    chat = hf_tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == saved.render_chat([{"role": "user", "content": "hi"}])


def test_model_safetensors_is_converted_beside_an_index_as_transformers_loads_it(
    tmp_path: Path,
) -> None:
    """Both model.safetensors and a shard index of other weights: transformers'
    `_get_resolved_checkpoint_files` tries model.safetensors first, and so does lmcore (issue 32:
    lmcore converted the shards)."""
    random_llama(tmp_path / "hf", shard=True)
    shards = lmcore.hf.load_hf(tmp_path / "hf").token_embeddings.weight.clone()
    random_llama(tmp_path / "one")  # the same model, in one file, its weights doubled
    doubled = {k: v * 2 for k, v in load_file(tmp_path / "one" / "model.safetensors").items()}
    save_file(doubled, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    ours = lmcore.hf.load_hf(tmp_path / "hf").token_embeddings.weight
    theirs = LlamaForCausalLM.from_pretrained(tmp_path / "hf").model.embed_tokens.weight
    assert torch.equal(ours, theirs) and torch.equal(ours, shards * 2)
    assert both_weights(tmp_path / "hf") and not both_weights(tmp_path / "one")


def test_a_layer_count_the_weights_do_not_hold_is_refused_before_building(tmp_path: Path) -> None:
    """config.json edited to 10**6 layers beside the weights of 2 (issue 32: 100 s before the
    size check, 10**12 a MemoryError): named from the tensor names, no model built."""
    random_llama(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for n in (10**6, 3, 1):
        (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": n}))
        with raises_naming(
            ConversionError, "config.json", f"num_hidden_layers={n:,}", "hold 2 layers",
            "model.layers.0 to model.layers.1", "same model",
        ):  # fmt: skip
            load_llama(tmp_path)


def test_an_integer_past_pythons_conversion_limit_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"num_hidden_layers": ' + "7" * 5000 + "}")
    with raises_naming(ConversionError, "config.json", "a number lmcore cannot read", "4300"):
        lmcore.hf.hf_reading(tmp_path)


def _same_file_outputs(d: Path) -> list[Path]:
    (d.parent / "link.safetensors").symlink_to(d / "model.safetensors")
    os.link(d / "model.safetensors", d.parent / "hard.safetensors")
    return [d / "model.safetensors", d, d / "config.json", d / "tokenizer.json",
            d / "model.safetensors.index.json", d / ".." / d.name / "model.safetensors",
            d.parent / "link.safetensors", d.parent / "hard.safetensors"]  # fmt: skip


def test_the_output_may_not_be_a_file_of_the_model_directory(tmp_path: Path) -> None:
    """`convert --from-hf DIR DIR/model.safetensors` replaced the Hugging Face weights (issue
    32): every file a conversion reads, the directory itself, and links to them are refused
    before anything is read or written."""
    d = tmp_path / "hf"
    random_llama(d)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    for out in _same_file_outputs(d):
        with raises_naming(ConversionError, f"the output {out}", "which this conversion reads",
                           "choose another output path"):  # fmt: skip
            convert_from_hf(d, out)
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
    assert convert_from_hf(d, d / "lmcore.safetensors").is_file()  # a file of its own is fine


def test_the_shards_of_an_index_are_the_directorys_own(tmp_path: Path) -> None:
    d = tmp_path / "hf"
    random_llama(d, shard=True)
    with raises_naming(ConversionError, "model-00002-of-00005.safetensors", "conversion reads"):
        convert_from_hf(d, d / "model-00002-of-00005.safetensors")


def test_to_hf_onto_its_own_checkpoint_is_refused(tmp_path: Path) -> None:
    ckpt = perturbed(SMALL).save(tmp_path / "m.safetensors")
    raw = ckpt.read_bytes()
    with raises_naming(ConversionError, str(ckpt), "the lmcore checkpoint", "conversion reads"):
        convert_to_hf(ckpt, ckpt)
    assert ckpt.read_bytes() == raw


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_long_context_converts_in_the_memory_of_a_short_one(tmp_path: Path) -> None:
    """P-hf-ctx: max_position_embeddings = 10**7 (issue 32: 10**8 took 5.3 GB for a 90 KB
    model): RoPE's tables are never saved, so they are never computed; the checkpoint holds
    the very tensors of the short directory's, and only its spec's context_length differs."""
    context = 10**7
    short, long = tmp_path / "short", tmp_path / "long"
    random_llama(short)
    random_llama(long)
    config = json.loads((long / "config.json").read_text())
    (long / "config.json").write_text(json.dumps({**config, "max_position_embeddings": context}))
    grown = conversion_growth("lmcore.hf:convert_from_hf", short, long)
    # the cos and sin tables: context x (head_dim 8 / 2) float32 each, 305 MiB together
    tables = 2 * context * (8 // 2) * 4
    assert grown < tables / 8, (grown, tables)
    assert_only_the_context_differs(short, long, (32, context))


def test_a_converted_checkpoint_gives_the_logits_of_load_hf(tmp_path: Path) -> None:
    """The conversion builds no buffers (`build_empty(buffers=False)`); loading the checkpoint
    builds them, and it gives the logits of the Hugging Face model and `load_llama`'s."""
    hf = random_llama(tmp_path / "hf", tie=True)
    model = lmcore.load(convert_from_hf(tmp_path / "hf", tmp_path / "m.safetensors"))
    assert model.lm_head.weight is model.token_embeddings.weight
    ids = token_ids()
    assert (hf_logits(hf, ids) - lm_logits(model, ids)).abs().max() <= HF_TOLERANCE
    assert torch.equal(lm_logits(model, ids), lm_logits(load_llama(tmp_path / "hf"), ids))
