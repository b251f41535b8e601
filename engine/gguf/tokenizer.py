"""SentencePiece (`tokenizer.ggml.model == "llama"`) tokenizer from GGUF metadata, as llama.cpp does it.

Follows llama.cpp's src/llama-vocab.cpp (llm_tokenizer_spm_session, impl::tokenize,
impl::token_to_piece) rather than the sentencepiece library, because bmoe-cli is llama.cpp and
the prompt's token ids decide every routed expert:

* special tokens (CONTROL / USER_DEFINED / UNKNOWN types) are cut out of the text first, longest
  text first, when `parse_special` (llama-cli's prompt path) — user-defined ones always;
* each remaining fragment gets a leading space when it starts the prompt or follows a special
  token (`add_space_prefix`, default on for SPM), then spaces become "▁";
* the fragment is split into UTF-8 characters and adjacent pairs merged greedily by the score
  of the merged piece (ties: leftmost first) while the merged text is a vocabulary piece;
* a final symbol that is not a piece is re-split along the merges that built it, and text that
  never formed a piece falls back to `<0xXX>` byte tokens.

Detokenizing yields RAW BYTES, what bmoe-cli writes to stdout per token: byte tokens give their
byte, normal pieces their UTF-8 with "▁" as a space, control/unknown tokens nothing.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from engine.errors import BmoeError

SPACE_MARK = "\u2581".encode()  # "▁"

# tokenizer.ggml.token_type values (llama_token_type)
TYPE_UNDEFINED, TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = range(7)

# Token texts llama.cpp treats as end-of-generation whatever the metadata says (llama-vocab.cpp).
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
})


class TokenizerError(BmoeError):
    """The model's tokenizer cannot be built or cannot encode this text."""


def _utf8_len(first_byte: int) -> int:
    # llama.cpp's unicode_len_utf8: by the high nibble; stray continuation bytes count as one.
    return (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[first_byte >> 4]


class SpmTokenizer:
    """A llama.cpp-compatible SPM tokenizer; build it with `from_metadata`."""

    def __init__(
        self,
        pieces: Sequence[str],
        scores: Sequence[float],
        token_types: Sequence[int],
        *,
        bos_id: int | None,
        eos_id: int | None,
        add_bos: bool = True,
        add_eos: bool = False,
        add_space_prefix: bool = True,
        extra_eog_ids: Iterable[int | None] = (),
    ):
        self.n_vocab = len(pieces)
        self._text = [p.encode() if p else f"[EMPTY_{i}]".encode() for i, p in enumerate(pieces)]
        self._scores = [float(s) for s in scores] if scores else [0.0] * self.n_vocab
        self._types = list(token_types) if token_types else [TYPE_NORMAL] * self.n_vocab
        if len(self._scores) < self.n_vocab or len(self._types) < self.n_vocab:
            raise TokenizerError("tokenizer scores/token types are shorter than the vocabulary")
        self._ids: dict[bytes, int] = {}
        for i, text in enumerate(self._text):
            if text in self._ids:
                raise TokenizerError(f"duplicate token in vocabulary: {text!r} has ids {self._ids[text]} and {i}")
            self._ids[text] = i
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.add_space_prefix = add_space_prefix
        if add_bos and bos_id is None:
            raise TokenizerError("tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set")
        eog = {i for i in extra_eog_ids if i is not None}
        eog |= {i for i, t in enumerate(self._text) if t.decode("utf-8", "replace") in _EOG_TEXTS}
        if eos_id is not None:
            eog.add(eos_id)
        self.eog_ids = frozenset(eog)
        # Longest text first so "<|im_end|>" wins over "<|im"; id breaks ties deterministically.
        special = [i for i, t in enumerate(self._types[:self.n_vocab])
                   if t in (TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNKNOWN)]
        self._special_ids = sorted(special, key=lambda i: (-len(self._text[i]), i))

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> SpmTokenizer:
        model = metadata.get("tokenizer.ggml.model")
        if model != "llama":
            raise TokenizerError(
                f"bmoe-py can tokenize only SentencePiece ('llama') vocabularies; this model's "
                f"tokenizer.ggml.model is {model!r}. Pass the prompt as token ids instead, "
                f"e.g. --prompt-tokens 1,2,3"
            )
        pieces = metadata.get("tokenizer.ggml.tokens")
        if not pieces:
            raise TokenizerError("model has no tokenizer.ggml.tokens vocabulary")

        def opt_id(key: str) -> int | None:
            v = metadata.get(key)
            return int(v) if v is not None and 0 <= int(v) < len(pieces) else None

        return cls(
            pieces,
            metadata.get("tokenizer.ggml.scores") or [],
            metadata.get("tokenizer.ggml.token_type") or [],
            bos_id=opt_id("tokenizer.ggml.bos_token_id"),
            eos_id=opt_id("tokenizer.ggml.eos_token_id"),
            add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", True)),
            add_eos=bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
            add_space_prefix=bool(metadata.get("tokenizer.ggml.add_space_prefix", True)),
            extra_eog_ids=(opt_id("tokenizer.ggml.eot_token_id"), opt_id("tokenizer.ggml.eom_token_id")),
        )

    # ---- queries -------------------------------------------------------------------------------
    def piece(self, token: int) -> bytes:
        return self._text[token]

    def is_eog(self, token: int) -> bool:
        return token in self.eog_ids

    # ---- encode --------------------------------------------------------------------------------
    def tokenize(self, text: str | bytes, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids for `text`, BOS first when the model asks for it (llama_tokenize)."""
        raw = text.encode() if isinstance(text, str) else bytes(text)
        out: list[int] = []
        if add_special and self.add_bos and self.bos_id is not None:   # add_bos needs a bos_id (__init__)
            out.append(self.bos_id)
        prev_special = True  # the prompt's first fragment gets the space prefix too
        for fragment in self._partition(raw, parse_special):
            if isinstance(fragment, int):
                out.append(fragment)
                prev_special = True
                continue
            if self.add_space_prefix and prev_special:
                fragment = b" " + fragment
            self._encode_fragment(fragment.replace(b" ", SPACE_MARK), out)
            prev_special = False
        if add_special and self.add_eos and self.eos_id is not None:
            out.append(self.eos_id)
        return out

    def _partition(self, raw: bytes, parse_special: bool) -> list[bytes | int]:
        # tokenizer_st_partition: cut every occurrence of each special token's text out of the
        # raw fragments, one special token at a time, longest first.
        parts: list[bytes | int] = [raw] if raw else []
        for sid in self._special_ids:
            if not parse_special and self._types[sid] in (TYPE_CONTROL, TYPE_UNKNOWN):
                continue
            needle = self._text[sid]
            split: list[bytes | int] = []
            for part in parts:
                if isinstance(part, int) or needle not in part:
                    split.append(part)
                    continue
                pieces = part.split(needle)
                for k, chunk in enumerate(pieces):
                    if chunk:
                        split.append(chunk)
                    if k < len(pieces) - 1:
                        split.append(sid)
            parts = split
        return parts

    def _encode_fragment(self, text: bytes, out: list[int]) -> None:
        # llm_tokenizer_spm_session::tokenize over one fragment.
        starts, lens = [], []
        offs = 0
        while offs < len(text):
            n = min(_utf8_len(text[offs]), len(text) - offs)
            starts.append(offs)
            lens.append(n)
            offs += n
        count = len(starts)
        prev = list(range(-1, count - 1))
        nxt = list(range(1, count + 1))
        if count:
            nxt[-1] = -1
        heap: list[tuple[float, int, int, int]] = []   # (-score, left, right, merged size)
        rev_merge: dict[bytes, tuple[int, int]] = {}

        def try_add(left: int, right: int) -> None:
            if left == -1 or right == -1:
                return
            merged = text[starts[left]:starts[left] + lens[left] + lens[right]]
            token = self._ids.get(merged)
            if token is None:
                return
            # std::priority_queue pops the highest score; on equal scores the lower `left`.
            heapq.heappush(heap, (-self._scores[token], left, right, len(merged)))
            rev_merge[merged] = (left, right)

        for i in range(1, count):
            try_add(i - 1, i)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if lens[left] == 0 or lens[right] == 0 or lens[left] + lens[right] != size:
                continue
            lens[left] += lens[right]
            lens[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            try_add(prev[left], left)
            try_add(left, nxt[left])

        def resegment(index: int, length: int) -> None:
            piece = text[starts[index]:starts[index] + length]
            token = self._ids.get(piece)
            if token is not None:
                out.append(token)
                return
            halves = rev_merge.get(piece)
            if halves is None:
                for byte in piece:
                    out.append(self.byte_to_token(byte))
                return
            # The halves' lengths are those they had when merged: the left one spans up to
            # where the right one starts.
            left, right = halves
            resegment(left, starts[right] - starts[left])
            resegment(right, len(piece) - (starts[right] - starts[left]))

        i = 0 if count else -1
        while i != -1:
            resegment(i, lens[i])
            i = nxt[i]

    def byte_to_token(self, byte: int) -> int:
        token = self._ids.get(f"<0x{byte:02X}>".encode())
        if token is None:
            token = self._ids.get(bytes([byte]))
        if token is None:
            raise TokenizerError(f"vocabulary has no byte-fallback token <0x{byte:02X}> for a byte of the prompt")
        return token

    # ---- decode --------------------------------------------------------------------------------
    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        """What llama.cpp's token_to_piece writes for one token (lstrip 0)."""
        if not 0 <= token < self.n_vocab:
            raise TokenizerError(f"token id {token} is outside the vocabulary of {self.n_vocab}")
        kind = self._types[token]
        if kind in (TYPE_CONTROL, TYPE_UNKNOWN):
            return self._text[token] if special else b""
        if kind == TYPE_USER_DEFINED:
            return self._text[token]
        if kind == TYPE_NORMAL:
            return self._text[token].replace(SPACE_MARK, b" ")
        if kind == TYPE_BYTE:
            return bytes([int(self._text[token][3:5], 16)])
        return b""  # unused / undefined types print nothing

    def detokenize(self, tokens: Iterable[int], special: bool = False) -> bytes:
        """The bytes bmoe-cli streams for these tokens: each token's piece, concatenated."""
        return b"".join(self.token_to_piece(t, special) for t in tokens)


def load_tokenizer(metadata: Mapping[str, Any]) -> SpmTokenizer:
    return SpmTokenizer.from_metadata(metadata)


def eog_ids_from_metadata(metadata: Mapping[str, Any]) -> frozenset[int]:
    """End-of-generation ids for any vocabulary type, as llama.cpp collects them: the eos/eot/eom
    ids in the metadata plus tokens whose text is a known end marker ("</s>", "<|return|>", ...)."""
    ids = {int(metadata[k]) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                      "tokenizer.ggml.eom_token_id") if metadata.get(k) is not None}
    pieces = metadata.get("tokenizer.ggml.tokens") or []
    ids |= {i for i, text in enumerate(pieces) if text in _EOG_TEXTS}
    return frozenset(ids)
