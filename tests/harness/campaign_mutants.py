"""Damaged campaign files, and the reader they are fed to (harness.campaign.file.load_campaign, then the
plan a dry run prints).

Shared by the fuzz test (tests/harness/test_fuzz_campaign.py, hypothesis draws the choices) and the
fuzz benchmark (benchmarks/fuzz_readers.py, random.Random draws them): every choice is `pick(n)`.

A seed is a valid campaign file (a small one, one using every section, and one on a phone with
other apps open); a mutant has one to three operations applied: a value replaced by nan, inf, a
400- or 5,000-digit integer, 2^63 - 1, a negative, a huge repeat count, an empty list, a string
where a number goes, an escape sequence; a number inside a string (an app's size, a budget's
factor, a release) replaced by a huge one, another script's digits, an underscore, 0 or an
exponent; a `+` or `,` doubled or left at the end of a string (an empty app); a line dropped or
duplicated (a key twice); and the byte-level operations of tests/results/mutants.py. "Parsed, or one clean error": the file loads into a campaign that
writes back to the same TOML, plans within the cell bound with every number finite, or it is
refused with one CampaignError line that is terminal-safe and short.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

from engine.errors import BmoeError
from engine.safetext import printable
from harness.campaign.file import load_campaign, parse_campaign
from harness.campaign.model import MAX_CELLS
from harness.plan.grid import make_plan
from tests.results.mutants import OPERATIONS as BYTE_OPERATIONS

Pick = Callable[[int], int]
MESSAGE_CHARS = 600
_VALUES = (b"nan", b"inf", b"-inf", b"+nan", b"9" * 400, b"1" * 5000, b"9223372036854775807", b"-9223372036854775808",
           b"-1", b"0", b"100000", b"1e308", b"1.5", b"\"x\"", b"\"\"", b"[]", b"[0, 0]", b"true", b"{}",
           b"\"\\u001b]0;pwned\\u0007\"", b"\"a\\u0000b\"", b"\"cycle*99999999999\"", b"\"knee*0\"", b"2147483648")
_KEY_LINE = re.compile(rb"^([A-Za-z_\"][^=\n]*?)\s*=\s*(.+)$", re.MULTILINE)
# what replaces a number inside a string: too large, other scripts' digits (UTF-8), `_`, 0, an exponent
_IN_STRING = (b"9" * 400, b"1" * 5000, "١٢٣".encode(), "１２".encode(), "٠.٢٥".encode(), b"1_000", b"0",
              b"0.0000001", b"1e3", b"-1", b"18446744073709551616")
_STRING_NUMBER = re.compile(rb'(?<=")([^"\n]*?)([0-9]+(?:\.[0-9]+)?)')


def seed_texts(model: Path) -> list[bytes]:
    """Three valid campaign files on one model (the third on a phone, with other apps)."""
    small = f"""version = 1
name = "fz"
[fleet]
devices = ["local"]
[models]
m = "{model}"
[axes]
cache_mb = [0, "auto", "cycle*1.2"]
[run]
n_predict = 8
repeats = 2
""".encode()
    full = f"""version = 1
name = "full"
[fleet]
devices = ["local", "R58XYZ"]
connect = ["127.0.0.1:5555"]
virtual_home = "phones"
[[fleet.adb]]
host = "127.0.0.1"
port = 5037
[models]
m = "{model}"
[engine]
kind = "python"
[axes]
cache_mb = [0, "auto", "cycle*0.9", "knee*1.5", 1600, "mmap", "resident"]
cache_ceil_mb = [0, 3000]
cache_floor_mb = 1536
dense_weights = ["anon", "warm"]
n_expert_used = [0, 1]
io_threads = [4]
[axes.flags]
"--temp" = [0.0, 0.7]
[run]
n_predict = 64
prompt = "The capital of Japan is"
threads = "auto"
engine_args = ["--seed", "3"]
repeats = 1
reverse_pass = true
route_trace = false
probe_tokens = 16
o_direct = true
timeout_s = 600.0
retries = 2
retry_backoff_s = 1.5
lock_wait_s = 0.0
[gate]
cpu_temp_max_c = 45.0
mem_available_min_mb = 100
max_wait_s = 30.0
poll_s = 1.0
""".encode()
    # the small one on a phone, with other apps open beside each run and in a session's gap
    apps = (small.replace(b'"fz"', b'"apps"').replace(b'["local"]', b'["R58XYZ"]')
            .replace(b"[axes]\n", b'[engine]\nclaim = "0.25"\n[axes]\napps = ["none", '
                     b'"cached:64MiB+perceptible:32MiB:compressible", "visible:1.5G:active"]\n')
            + b'turns = 2\nidle_s = 1.0\ngap_apps = "cached:300MiB"\n')
    return [small, full, apps]


def _replace_one(data: bytes, found: list[re.Match[bytes]], pick: Pick, choices: tuple[bytes, ...],
                 group: int = 0) -> bytes:
    """One of the matches `found` (its `group`) replaced by one of `choices`."""
    if not found:
        return data
    m = found[pick(len(found))]
    return data[:m.start(group)] + choices[pick(len(choices))] + data[m.end(group):]


def set_value(data: bytes, pick: Pick) -> bytes:
    return _replace_one(data, list(_KEY_LINE.finditer(data)), pick, _VALUES, 2)


def set_list_item(data: bytes, pick: Pick) -> bytes:
    """One element of a list value replaced (a list of budgets with a nan among them …)."""
    return _replace_one(data, list(re.finditer(rb"(?<=[\[,] )[^,\]\n]+|(?<=\[)[^,\]\n]+", data)), pick, _VALUES)


def string_number(data: bytes, pick: Pick) -> bytes:
    """A number inside a quoted string (`cached:64MiB`, `cycle*1.5`, `0.25`) replaced."""
    return _replace_one(data, list(_STRING_NUMBER.finditer(data)), pick, _IN_STRING, 2)


def empty_item(data: bytes, pick: Pick) -> bytes:
    """A `+` or `,` inside a string doubled, or one added at its end: an empty app or item."""
    ends = [m.start() for m in re.finditer(rb'[+,](?=[^"\n]*")|(?<=[A-Za-z0-9])"', data)]
    if not ends:
        return data
    at = ends[pick(len(ends))]
    return data[:at] + (b"+" if pick(2) else b",") + data[at:]


OPERATIONS = (set_value, set_value, set_list_item, string_number, string_number, empty_item) + BYTE_OPERATIONS


def mutate(data: bytes, pick: Pick, n_ops: int) -> bytes:
    for _ in range(n_ops):
        data = OPERATIONS[pick(len(OPERATIONS))](data, pick)
    return data


def _finite(obj) -> None:
    if isinstance(obj, float):
        assert math.isfinite(obj), obj
    elif isinstance(obj, dict):
        for v in obj.values():
            _finite(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _finite(v)


def load_mutant(mutant: bytes, folder: Path) -> str:
    """Load (and plan) one mutant: "accepted" or "refused"; anything else fails the property."""
    path = folder / "fz.toml"
    path.write_bytes(mutant)
    try:
        campaign = load_campaign(path)
        plan = make_plan(campaign)
    except BmoeError as e:
        message = str(e)
        assert "\n" not in message and printable(message) == message, message[:300]
        assert len(message) <= MESSAGE_CHARS, f"{len(message)} characters: {message[:200]}…"
        return "refused"
    assert 0 < len(plan.cells) <= MAX_CELLS
    data = campaign.to_dict()
    _finite(data)
    again = parse_campaign(load_toml(campaign.to_toml()), source="again", base_dir=folder)
    assert again.to_dict() == data            # what a campaign directory keeps reads back the same
    return "accepted"


def load_toml(text: str):
    import tomllib

    return tomllib.loads(text)
