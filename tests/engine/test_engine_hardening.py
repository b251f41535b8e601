"""bmoe-py answers odd flag values as the real bmoe-cli 0.19.0 does (BMOE_CLI,
upstream's own tiny model, on which both engines print the same bytes): `--temp nan` is greedy,
an unwritable or full telemetry path is a warning or nothing (never a traceback), and integers
are read with C's atoi — `-n 1e23` is 1 token, `-n 99999999999999999999` wraps to -1 and is
refused, `--seed` past 32 bits saturates as strtoul does.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import UPSTREAM_HOST

TINY = str(UPSTREAM_HOST / "tiny-qwen3moe.gguf")


def _run(engine: list[str], *args) -> subprocess.CompletedProcess:
    return subprocess.run(engine + ["-m", TINY, "-t", "1", *map(str, args)], capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def engines(bmoe_cli):
    return {"bmoe-cli": [str(bmoe_cli)], "bmoe-py": [sys.executable, "-m", "engine"]}


def _preamble(path) -> dict[str, str]:
    """The CSV preamble's key=value tokens as written (the results parser keeps no nan or inf)."""
    lines = [line for line in path.read_text().splitlines() if line.startswith("# ")]
    return dict(token.split("=", 1) for line in lines for token in line[2:].split() if "=" in token)


def _text(out: bytes) -> bytes:
    return out[:out.rindex(b"\n\ngeneration:")]


@pytest.mark.parametrize("temp", ["nan", "-nan"])
def test_temp_nan_is_greedy_in_both_engines(engines, tmp_path, temp):
    outs = {}
    for name, engine in engines.items():
        r = _run(engine, "-n", 8, "--temp", temp, "--seed", 3, "--csv", tmp_path / f"{name}.csv")
        assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr[-500:]
        greedy = _run(engine, "-n", 8)
        assert _text(r.stdout) == _text(greedy.stdout)            # nan > 0 is false in C: no sampling
        outs[name] = _text(r.stdout)
        assert _preamble(tmp_path / f"{name}.csv")["temp"] == temp   # glibc keeps the sign
    assert outs["bmoe-py"] == outs["bmoe-cli"]


@pytest.mark.parametrize("flags", [["--moe-stream", "--route-trace", "/proc/x.csv"], ["--csv", "/proc/x.csv"],
                                   ["--moe-stream", "--route-trace", "/dev/full"], ["--csv", "/dev/full"],
                                   ["--moe-stream", "--csv", "/proc/self/status"]])
def test_an_unwritable_telemetry_path_never_stops_the_run(engines, flags):
    answers = {}
    for name, engine in engines.items():
        r = _run(engine, "-n", 4, *flags)
        assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr[-500:]
        answers[name] = [line for line in r.stderr.decode().splitlines() if line.startswith("warning:")]
        assert b"generation: 4 tokens" in r.stdout
    assert answers["bmoe-py"] == answers["bmoe-cli"]


@pytest.mark.parametrize("value, tokens", [("1e23", 1), ("3junk", 3), (" +2", 2)])
def test_token_counts_are_read_with_atoi(engines, value, tokens):
    for name, engine in engines.items():
        r = _run(engine, "-n", value)
        assert r.returncode == 0, (name, r.stderr[-300:])
        assert f"generation: {tokens} tokens".encode() in r.stdout, name


@pytest.mark.parametrize("value", ["99999999999999999999", "2147483648", "-5", "9" * 5000])
def test_integers_past_int_wrap_as_in_c_and_are_refused(engines, value):
    for name, engine in engines.items():
        r = _run(engine, "-n", value)
        assert r.returncode == 1, name
        assert r.stderr.decode().strip().splitlines()[-1] == "config error: n_predict must be positive", name


@pytest.mark.parametrize("seed, recorded", [("99999999999999999999999", "4294967295"), ("-1", "4294967295"),
                                            ("4294967297", "1")])
def test_seed_is_read_with_strtoul(engines, tmp_path, seed, recorded):
    for name, engine in engines.items():
        r = _run(engine, "-n", 1, "--seed", seed, "--csv", tmp_path / f"{name}.csv")
        assert r.returncode == 0, r.stderr[-300:]
        assert _preamble(tmp_path / f"{name}.csv")["seed"] == recorded, name


@pytest.mark.parametrize("temp, recorded", [("1e39", "inf"), ("0x10", "16"), ("0x", "0"), ("1e-50", "0")])
def test_temp_is_read_with_atof_into_a_float(engines, tmp_path, temp, recorded):
    for name, engine in engines.items():
        r = _run(engine, "-n", 1, "--temp", temp, "--csv", tmp_path / f"{name}.csv")
        assert r.returncode == 0 and b"Warning" not in r.stderr, r.stderr[-300:]
        assert _preamble(tmp_path / f"{name}.csv")["temp"] == recorded, name
