"""Numbers in text are ASCII decimal only (engine/units.py, docs/decisions/ascii-numbers.md): the
helpers refuse what int() and float() read beyond that (other scripts' digits, `_`, Unicode
space), and no module reads digits another way: no `\\d` in a regex, no bare `str.isdigit()`."""

from __future__ import annotations

import ast
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import BmoeError
from engine.units import GIB, MIB, ascii_float, ascii_int, is_digits, parse_bytes, parse_number
from tests.source_scan import ROOT, assert_none_outside

HOME = ROOT / "engine" / "units.py"
PROPS = settings(max_examples=200, deadline=None, derandomize=True, database=None)
# what int()/float() read and no engine, kernel or phone prints
FOREIGN = ["١٢٣", "１２", "1_000", "12\u00a0", "\u2003" + "7", "٠.٥", "𝟕", "۳", "१२", "1_0.5", "1e1_0"]


@pytest.mark.parametrize("text", FOREIGN)
def test_what_python_reads_beyond_ascii_decimal_is_refused(text):
    float(text)                                     # Python itself reads each of them
    with pytest.raises(ValueError):
        ascii_float(text)
    with pytest.raises(ValueError):
        ascii_int(text)
    assert parse_number(text) is None and not is_digits(text)


@pytest.mark.parametrize(("text", "value"), [("12", 12), ("-3", -3), ("+7", 7), (" 42\n", 42), ("007", 7)])
def test_ascii_integers_read_as_int_does(text, value):
    assert ascii_int(text) == value == int(text) and parse_number(text) == value


@pytest.mark.parametrize(("text", "value"), [("1.5", 1.5), ("-.5", -0.5), ("2e3", 2000.0), ("1.", 1.0),
                                             ("inf", math.inf), ("-Infinity", -math.inf), ("1e-05", 1e-05)])
def test_ascii_floats_read_as_float_does(text, value):
    assert ascii_float(text) == value == float(text)


def test_a_numeral_too_large_for_a_float_is_refused_not_made_infinite():
    for text in ("9" * 400, "1e400", "-1e999"):
        assert math.isinf(float(text))
        with pytest.raises(ValueError, match="too large"):
            ascii_float(text)
    with pytest.raises(ValueError):
        ascii_int("9" * 5000)                      # int() refuses it too, with its own ValueError
    assert math.isnan(ascii_float("nan")) and ascii_float("inf") == math.inf


def test_booleans_and_superscripts_are_not_numbers():
    assert parse_number(True) is None and parse_number(False, "x") == "x"
    assert parse_number(3) == 3 and parse_number(2.5) == 2.5
    assert not is_digits("²") and not is_digits("") and is_digits("0123456789")


@PROPS
@given(st.text(max_size=8))
def test_any_text_the_helpers_take_is_ascii_and_reads_as_python_reads_it(text):
    try:
        value = ascii_float(text)
    except ValueError:
        return
    assert text.isascii() and "_" not in text
    assert value == float(text) or (math.isnan(value) and math.isnan(float(text)))


def test_sizes_are_ascii_and_bounded():
    assert parse_bytes("2GiB") == 2 * GIB and parse_bytes(" 1.5 M ") == int(1.5 * MIB)
    for text in ("１GiB", "1_0MiB", "9" * 400 + "GiB", "1e3MiB", "99999999999TiB", "1GiB\n2"):
        with pytest.raises(BmoeError):
            parse_bytes(text)


# ── the tree ────────────────────────────────────────────────────────────────────────────────────


def _digit_escapes(source: str) -> list[str]:
    """Each string constant holding `\\d` (in a regex it matches every script's digits)."""
    return [f"{node.lineno}: {node.value[:60]!r}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "\\d" in node.value]


_DIGIT_TESTS = ("isdigit", "isdecimal", "isnumeric")


def _digit_tests(source: str) -> list[str]:
    """Each `X.isdigit()` (isdecimal, isnumeric) not right after `X.isascii() and`."""
    tree = ast.parse(source)
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
            for before, call in zip(node.values, node.values[1:]):
                if (isinstance(before, ast.Call) and isinstance(before.func, ast.Attribute)
                        and before.func.attr == "isascii" and isinstance(call, ast.Call)
                        and isinstance(call.func, ast.Attribute) and call.func.attr in _DIGIT_TESTS
                        and ast.dump(before.func.value) == ast.dump(call.func.value)):
                    guarded.add(id(call))
    return [f"{node.lineno}: .{node.func.attr}()" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in _DIGIT_TESTS and id(node) not in guarded]


def test_no_regex_spells_digits_as_backslash_d():
    assert_none_outside(HOME, _digit_escapes, "`\\d` (write [0-9])",
                        plants=('re.compile(r"(\\d+) kB")', 'X = rf"^t=(\\d+)"'))


def test_no_module_takes_str_isdigit_for_ascii_digits():
    assert_none_outside(HOME, _digit_tests, "str.isdigit() without isascii() (use engine.units.is_digits)",
                        plants=("ok = pid.isdigit()", "a = s.strip().isdecimal()", "b = t.isascii() and u.isdigit()"))
    assert _digit_tests("ok = s.isascii() and s.isdigit()") == []
