"""engine.gguf.tokenizer: llama.cpp's SPM tokenizer semantics, checked by hand-worked vocabularies."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.gguf.model import load_model_shape
from engine.gguf.tokenizer import (
    TYPE_BYTE,
    TYPE_CONTROL,
    TYPE_NORMAL,
    TYPE_UNKNOWN,
    TYPE_USER_DEFINED,
    SpmTokenizer,
    TokenizerError,
    eog_ids_from_metadata,
    load_tokenizer,
)

UPSTREAM = Path(__file__).resolve().parents[1] / "fixtures" / "upstream" / "host-v2-0.19.0"
SPACE = "\u2581"


def _vocab(pieces: dict[str, float], user_defined: tuple[str, ...] = ()) -> SpmTokenizer:
    """<unk> <s> </s>, 256 byte tokens, then `pieces` (text -> score) and user-defined tokens."""
    texts = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TYPE_UNKNOWN, TYPE_CONTROL, TYPE_CONTROL] + [TYPE_BYTE] * 256
    scores = [0.0] * len(texts)
    for text, score in pieces.items():
        texts.append(text)
        types.append(TYPE_NORMAL)
        scores.append(score)
    for text in user_defined:
        texts.append(text)
        types.append(TYPE_USER_DEFINED)
        scores.append(0.0)
    return SpmTokenizer(texts, scores, types, bos_id=1, eos_id=2)


def _byte_ids(data: bytes) -> list[int]:
    return [3 + b for b in data]


def test_upstream_prompt_is_the_35_tokens_bmoe_cli_prefilled():
    shape = load_model_shape(UPSTREAM / "tiny-qwen3moe.gguf")
    tok = load_tokenizer(shape.metadata)
    ids = tok.tokenize("The capital of Japan is")
    # The vocabulary is bytes only: BOS, then every byte of "▁The▁capital▁of▁Japan▁is".
    assert len(ids) == 35
    assert ids == [1] + _byte_ids(" The capital of Japan is".replace(" ", SPACE).encode())
    assert tok.eog_ids == {2} == eog_ids_from_metadata(shape.metadata)


def test_merges_follow_scores_and_ties_go_left():
    text = "abc"
    for pieces, expected in (
        ({"ab": 1.0, "bc": 2.0}, ["a", "bc"]),   # higher score merges first
        ({"ab": 2.0, "bc": 1.0}, ["ab", "c"]),
        ({"ab": 1.0, "bc": 1.0}, ["ab", "c"]),   # equal scores: leftmost pair first
        ({"ab": 1.0, "bc": 2.0, "abc": 0.5}, ["abc"]),      # merged pieces merge again
        ({"ab": 2.0, "bc": 1.0, "abc": 0.5}, ["abc"]),
        ({"ab": 2.0, "bc": 3.0, "ac": 9.0}, ["a", "bc"]),  # "ac" never becomes adjacent
    ):
        tok = _vocab(pieces)
        tok.add_space_prefix = False
        ids = tok.tokenize(text, add_special=False)
        # "a" and "c" are not pieces: they come out as byte-fallback tokens
        assert [tok.token_to_piece(i).decode() for i in ids] == expected, pieces


def test_space_prefix_and_whitespace_escape():
    tok = _vocab({SPACE: -5.0, SPACE + "hi": 1.0, "hi": 0.5})
    ids = tok.tokenize("hi hi", add_special=True)
    assert ids[0] == tok.bos_id
    assert [tok.piece(i).decode() for i in ids[1:]] == [SPACE + "hi", SPACE + "hi"]
    assert tok.detokenize(ids) == b" hi hi"     # BOS prints nothing, ▁ prints a space
    assert tok.tokenize("", add_special=True) == [tok.bos_id]
    assert tok.tokenize("", add_special=False) == []


@pytest.mark.parametrize("text", [
    "hello world",
    "caf\u00e9 cr\u00e8me br\u00fbl\u00e9e",
    "\u65e5\u672c\u306e\u9996\u90fd\u306f\u6771\u4eac",
    "emoji \U0001F600 and \u2713 check\u0301",
    "tabs\tand\nnewlines  and   runs of spaces ",
    "<0x41> looks like a byte token but is text",
])
def test_round_trip_through_pieces_and_byte_fallback(text):
    tok = _vocab({SPACE: -1.0, "he": 1.0, "ll": 1.0, "o": 0.0, SPACE + "w": 0.5, "or": 0.2, "ld": 0.3,
                  "\u00e9": 0.1, "\u6771\u4eac": 2.0})
    ids = tok.tokenize(text, add_special=False)
    assert tok.detokenize(ids) == (" " + text).encode()
    # every byte token stands for exactly the byte of the text it replaced
    assert all(0 <= i < tok.n_vocab for i in ids)


def test_byte_fallback_emits_utf8_bytes_for_unknown_characters():
    tok = _vocab({SPACE: 0.0})
    tok.add_space_prefix = False
    ids = tok.tokenize("\u00e9\U0001F600", add_special=False)
    assert ids == _byte_ids("\u00e9\U0001F600".encode())
    assert [tok.token_to_piece(i) for i in ids] == [bytes([b]) for b in "\u00e9\U0001F600".encode()]


def test_special_tokens_are_parsed_out_of_the_text():
    tok = _vocab({SPACE: 0.0, SPACE + "a": 1.0, "a": 0.5}, user_defined=("<tool>",))
    tool = tok.n_vocab - 1
    ids = tok.tokenize("a<s>a<tool>a", add_special=False, parse_special=True)
    # after a special token the next fragment gets the space prefix again
    assert [tok.piece(i).decode() for i in ids] == [SPACE + "a", "<s>", SPACE + "a", "<tool>", SPACE + "a"]
    plain = tok.tokenize("a<s>a", add_special=False, parse_special=False)
    assert tok.bos_id not in plain and tool not in plain
    # user-defined tokens are cut out even without parse_special
    assert tool in tok.tokenize("a<tool>", add_special=False, parse_special=False)


def test_token_to_piece_by_token_type():
    tok = _vocab({SPACE + "x": 0.0}, user_defined=(SPACE + "raw",))
    assert tok.token_to_piece(1) == b"" and tok.token_to_piece(1, special=True) == b"<s>"
    assert tok.token_to_piece(0) == b""                       # <unk> is not printed either
    assert tok.token_to_piece(3 + 0x41) == b"A"
    assert tok.token_to_piece(3 + 0xFF) == b"\xff"            # raw byte, not UTF-8 of U+00FF
    assert tok.token_to_piece(tok.n_vocab - 2) == b" x"
    assert tok.token_to_piece(tok.n_vocab - 1) == (SPACE + "raw").encode()   # user-defined kept verbatim
    with pytest.raises(TokenizerError):
        tok.token_to_piece(tok.n_vocab)


def test_non_spm_tokenizer_is_refused_with_a_hint_to_pass_token_ids():
    with pytest.raises(TokenizerError, match=r"--prompt-tokens 1,2,3") as err:
        load_tokenizer({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"]})
    assert "'gpt2'" in str(err.value)
    with pytest.raises(TokenizerError, match="prompt-tokens"):
        load_tokenizer({})


def test_eog_ids_cover_end_markers_of_any_vocabulary():
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "<|return|>", "<|call|>", "b"],
          "tokenizer.ggml.eos_token_id": 3}
    assert eog_ids_from_metadata(md) == {1, 2, 3}


def test_vocabulary_errors_are_reported():
    with pytest.raises(TokenizerError, match="duplicate token"):
        SpmTokenizer(["a", "a"], [0.0, 0.0], [TYPE_NORMAL] * 2, bos_id=None, eos_id=None, add_bos=False)
    with pytest.raises(TokenizerError, match="bos_token_id"):
        SpmTokenizer(["a"], [0.0], [TYPE_NORMAL], bos_id=None, eos_id=None, add_bos=True)
    tok = SpmTokenizer(["<s>", "a"], [0.0, 0.0], [TYPE_CONTROL, TYPE_NORMAL], bos_id=0, eos_id=None)
    with pytest.raises(TokenizerError, match="byte-fallback"):
        tok.tokenize("z")
