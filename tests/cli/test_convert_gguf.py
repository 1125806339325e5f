"""`lmcore convert --from-gguf` and `--to-gguf`: a GGUF Llama's tokenizer and chat template stored
in the checkpoint (and `lmcore generate --chat` stopping at the end of a turn), a checkpoint
written as GGUF that transformers' own GGUF loader reads with lmcore's logits, and the options
each direction takes (the conversion itself: tests/gguf/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import lmcore
from lmcore.cli.chat import Conversation
from lmcore.cli.main import main
from lmcore.gguf import load_gguf
from lmcore.model.generate import GREEDY
from lmcore.tokenizer import SavedTokenizer
from tests.helpers.errors import assert_naming
from tests.helpers.gguf import (
    CHATML,
    GGUF_IDS,
    byte_level_bpe,
    ggml_tokenizer,
    hf_llama,
    needs_gguf,
    tiny_gguf,
    write_llama,
)
from tests.helpers.hf import quiet_transformers

gguf = needs_gguf()
transformers = quiet_transformers()
T = gguf.GGMLQuantizationType


def test_convert_from_gguf_stores_the_tokenizer_and_chat_stops_at_end_of_turn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tok = byte_level_bpe()
    hf = hf_llama(vocab=300)
    write_llama(tmp_path / "m.gguf", hf, T.Q8_0, tokenizer=ggml_tokenizer(tok))
    out = tmp_path / "m.safetensors"
    assert main(["convert", "--from-gguf", str(tmp_path / "m.gguf"), str(out)]) == 0
    assert "tokenizer: stored" in capsys.readouterr().out
    info = lmcore.read_info(out)
    assert info.tokenizer is not None and info.tokenizer.chat_template == CHATML
    assert json.loads(info.metadata["gguf.metadata"])["general.name"] == "tiny"
    end = tok.token_to_id("<|im_end|>")
    model = lmcore.load(out)
    with torch.no_grad():  # make the model answer "<|im_end|>" after two tokens of anything
        model.lm_head.weight.zero_()
    saved = model.tokenizer
    assert saved is not None
    chat = Conversation(model, saved, saved.tokenizer())
    with torch.no_grad():
        model.lm_head.weight[end] = 1.0
        model.ln_final.weight.fill_(1.0)
    written: list[str] = []
    reply = chat.turn("Hi there", written.append, GREEDY, show_special=True)
    assert reply == [end] and "".join(written) == "<|im_end|>"
    first = len(chat.cached)
    chat.turn("again", written.append, GREEDY)
    assert chat.kv is not None and chat.kv.length == len(chat.cached) > first
    capsys.readouterr()
    edited = model.save(tmp_path / "edited.safetensors")  # keeps the model's tokenizer
    args = ["generate", str(edited), "--chat", "Hi", "--temperature", "0"]
    assert main([*args, "--show-special"]) == 0  # no --tokenizer; stops at <|im_end|>
    shown = capsys.readouterr()
    assert f"1 tokens (stop token {end})" in shown.err and shown.out == "<|im_end|>\n"
    assert main(args) == 0
    assert capsys.readouterr().out == "\n"  # special tokens hidden by default


@pytest.mark.parametrize("kind, tolerance", [("f32", 1e-4), ("f16", 2e-2), ("q8_0", 5e-2)])
def test_to_gguf_loads_in_transformers_with_lmcore_s_logits(
    tmp_path: Path, kind: str, tolerance: float
) -> None:
    torch.manual_seed(0)
    spec = "vocab_size=300,context_length=64,d_model=64,num_layers=2,num_heads=4,num_kv_heads=2,d_ff=128"
    model = lmcore.build_model(spec)
    model.tokenizer = SavedTokenizer.from_tokenizer(byte_level_bpe(), chat_template=CHATML)
    ckpt = model.save(tmp_path / "m.safetensors")
    assert main(["convert", "--to-gguf", str(ckpt), str(tmp_path / "m.gguf"), "--type", kind]) == 0
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == kind.upper() and types["output_norm.weight"] == "F32"
    assert "tokenizer.ggml.merges" in reader.fields and "output.weight" in types
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file="m.gguf", dtype=torch.float32
    )
    ids = GGUF_IDS % 300
    with torch.no_grad():
        theirs, ours = hf(ids).logits, model(ids)
        again = load_gguf(tmp_path / "m.gguf", dtype=torch.float32)(ids)  # the file, read back
    torch.testing.assert_close(theirs, again, atol=1e-4, rtol=0)
    torch.testing.assert_close(theirs, ours, atol=tolerance, rtol=0)
    roundtrip = load_gguf(tmp_path / "m.gguf").tokenizer
    assert roundtrip is not None and roundtrip.chat_template == CHATML


def test_to_gguf_writes_the_architecture_asked_for_or_names_why_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = "vocab_size=64,context_length=16,d_model=32,num_layers=2,num_heads=2,d_ff=64"
    model = lmcore.build_model(spec)
    model.tokenizer = SavedTokenizer.from_tokenizer(byte_level_bpe())
    ckpt = model.save(tmp_path / "m.safetensors")
    out = tmp_path / "m.gguf"
    assert main(["convert", "--to-gguf", str(ckpt), str(out), "--architecture", "qwen2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.count("(spec: ") == 1
    assert "qkv_bias=false: a Qwen2ForCausalLM has qkv_bias=true" in err
    assert not out.exists()
    assert main(["convert", "--to-gguf", str(ckpt), str(out), "--architecture", "llama"]) == 0
    assert "GGUF llama, matrices F32" in capsys.readouterr().out
    biased = lmcore.build_model(f"{spec},qkv_bias=true")
    biased.tokenizer = model.tokenizer
    biased.save(tmp_path / "b.safetensors")
    assert main(["convert", "--to-gguf", str(tmp_path / "b.safetensors"), str(out)]) == 0
    assert "GGUF qwen2, matrices F32" in capsys.readouterr().out  # the first architecture that holds it
    assert gguf.GGUFReader(str(out)).fields["general.architecture"].contents() == "qwen2"
    assert main(["convert", "--to-gguf", str(ckpt), str(out), "--architecture", "lama"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'lama'" in err and "llama" in err, err
    assert main(["convert", "--from-gguf", str(out), str(tmp_path / "o.safetensors"),
                 "--architecture", "llama"]) == 2  # fmt: skip
    assert "--type and --architecture apply to --to-gguf only" in capsys.readouterr().err


def test_convert_s_gguf_options_are_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = lmcore.build_model(
        "vocab_size=64,context_length=16,d_model=32,num_layers=1,num_heads=2,pos=nope"
    ).save(tmp_path / "m.safetensors")
    assert (
        main(
            [
                "convert",
                "--from-hf",
                str(tmp_path),
                str(tmp_path / "o.safetensors"),
                "--type",
                "f16",
            ]
        )
        == 2
    )
    assert "--type and --architecture apply to --to-gguf only" in capsys.readouterr().err
    assert (
        main(["convert", "--to-gguf", str(ckpt), str(tmp_path / "m.gguf"), "--dtype", "float16"])
        == 2
    )
    assert (
        "--dtype and --ignore-field apply to --from-hf and --from-gguf only"
        in capsys.readouterr().err
    )
    assert main(["convert", "--to-gguf", str(ckpt), str(tmp_path / "m.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmcore convert: error: ") and "nope" in err and err.count("\n") == 1
    assert main(["convert", "--from-gguf", str(ckpt), str(tmp_path / "o.safetensors")]) == 2
    assert "is not a GGUF file" in capsys.readouterr().err


def test_convert_from_gguf_says_once_that_gguf_has_no_checksum(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # P-gguf-flip
    path = tiny_gguf(tmp_path / "m.gguf")
    entry = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == "blk.0.attn_q.weight")
    with open(path, "r+b") as f:  # one flipped bit inside the tensor's data
        f.seek(int(entry.data_offset) + 40)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x40]))
    out = tmp_path / "o.safetensors"
    assert main(["convert", "--from-gguf", str(path), str(out)]) == 0  # nothing can tell
    said = capsys.readouterr().out
    assert said.count("checksum") == 1
    assert_naming(said, "a GGUF file has none", f"{out} carries lmcore's own")
    assert lmcore.load(out).spec.d_model == 32  # and the checkpoint verifies


@pytest.mark.parametrize(
    ("meta", "facts"),
    [
        ({"tokenizer.chat_template": 42}, ("tokenizer.chat_template is an int (42)",)),
        ({"tokenizer.ggml.bos_token_id": -1}, ("tokenizer.ggml.bos_token_id is an int (-1)",)),
    ],
    ids=["template-a-number", "bos-negative"],
)
def test_convert_refuses_a_bad_tokenizer_key_in_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], meta: dict[str, object],
    facts: tuple[str, ...],
) -> None:  # fmt: skip
    path = tiny_gguf(tmp_path / "m.gguf", meta)
    out = tmp_path / "o.safetensors"
    argv = ["convert", "--from-gguf", str(path), str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not out.exists()
    key = next(iter(meta))
    assert_naming(err, str(path), *facts, f"--ignore-field {key}")
    assert main([*argv, "--ignore-field", key]) == 0  # the way out it names works
