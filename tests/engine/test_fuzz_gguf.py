"""Property-based fuzzing of the GGUF header reader behind `model inspect` (engine.gguf.header,
engine.gguf.model, engine.gguf.inspect): damaged headers of real synthetic models (tests/engine/gguf_mutants.py)
are priced, or refused with one short terminal-safe ModelError; never an uncaught exception, never
raw control characters in the text, never a non-strict JSON record.

Derandomized, no example database, a fixed number of examples; benchmarks/fuzz_readers.py runs the
same mutators 10,000 times.
"""

from __future__ import annotations

import pytest

from engine.errors import ModelError
from engine.gguf.inspect import inspect_model
from tests.engine import gguf_mutants as gm
from tests.fuzzing import fuzz


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    return gm.make_seeds(tmp_path_factory.mktemp("gguf-seeds"))


def test_inspect_prices_or_refuses_damaged_headers_cleanly(seeds, tmp_path):
    def one(pick, n_ops: int) -> str:
        header, size = gm.mutate(seeds[pick(len(seeds))], pick, n_ops)
        return gm.inspect_mutant(header, size, tmp_path)

    assert fuzz(one, 300) == {"accepted", "refused"}     # both sides reached: the fuzzer tests something


def test_strings_from_the_header_reach_the_terminal_escaped(seeds, tmp_path):
    """An `ESC]0;…BEL` title sequence in a GGUF string (here every string at
    once: the model's name and architecture among them) is shown escaped, never raw."""
    seed = seeds[0]
    header = seed.header
    for i in reversed(range(len(seed.strings))):
        header = gm.nasty_string(seed, header, lambda n, i=i: i)
    path = tmp_path / "nasty.gguf"
    path.write_bytes(header)
    with open(path, "r+b") as fh:
        fh.truncate(seed.file_bytes)
    try:
        text = inspect_model(str(path)).text
    except ModelError as e:   # the arch key itself changed: refused, and the message escaped too
        text = str(e)
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "\\x1b]0;pwned\\x07" in text


def test_an_error_quotes_a_short_excerpt_never_the_header(seeds, tmp_path):
    """A 54 KB key cut short used to be quoted whole in the error."""
    seed = seeds[0]
    at, _ = seed.strings[0]
    key = b"\x1bk" * 27_000
    path = tmp_path / "long-key.gguf"          # the file ends where the key's type should be
    path.write_bytes(seed.header[:at] + len(key).to_bytes(8, "little") + key)
    with pytest.raises(ModelError) as e:
        inspect_model(str(path))
    message = str(e.value)
    assert len(message) - len(str(path)) < 300 and "\x1b" not in message and "\n" not in message
    assert "truncated GGUF header" in message and "\\x1bk\\x1bk" in message and message.count("k") < 40
