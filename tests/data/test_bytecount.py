"""The bytes each token stands for: they add up to the text's UTF-8 bytes, <|endoftext|> none."""

from __future__ import annotations

from lmcore.data import EOT
from lmcore.data.bytecount import token_bytes
from tests.helpers.runs import EVAL_TEXT, eval_tokenizer


def test_token_bytes_add_up_to_the_texts_bytes_across_split_characters() -> None:
    tok = eval_tokenizer()
    table = token_bytes(tok)
    ids = tok.encode(EVAL_TEXT + EOT + "日本", add_special_tokens=False).ids
    assert tok.token_to_id(EOT) in ids and table[tok.token_to_id(EOT)] == 0
    assert int(table[ids].sum()) == len((EVAL_TEXT + "日本").encode("utf-8"))
    # a character split across tokens: each token alone decodes to U+FFFD, the sum stays exact
    assert any("\ufffd" in tok.decode([i]) for i in ids)
