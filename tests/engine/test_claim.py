"""bmoe-py speaking a newer bmoe-cli contract behind the release it claims (docs/decisions/release-claim.md):
BMOE_PY_RELEASE; at the default it is the 0.19.0 build's (tests/engine/test_differential.py)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.interface.releases import NEXT, Release
from results.read.parse_console import parse_console
from results.read.parse_csv import read_metrics_csv
from results.read.table import release_range
from tests.conftest import UPSTREAM_HOST

MODEL = UPSTREAM_HOST / "tiny-qwen3moe.gguf"


def bmoe_py(*args: str, release: str | None = None, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("BMOE_")}
    environ.update(env)
    if release is not None:
        environ["BMOE_PY_RELEASE"] = release
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, env=environ,
                          errors="replace", timeout=120)    # the tiny model's tokens are not UTF-8


def run(tmp_path: Path, *flags: str, release: str | None = None, **env: str):
    csv = tmp_path / f"{len(list(tmp_path.iterdir()))}.csv"
    done = bmoe_py("-m", str(MODEL), "-n", "4", "-t", "1", *flags, "--csv", str(csv), release=release, **env)
    assert done.returncode == 0, done.stderr
    return done, read_metrics_csv(csv)


def test_the_default_claim_is_0_19_and_says_nothing_new(tmp_path):
    assert bmoe_py("--version").stdout == "bmoe-py 0.1.0\n"
    done, metrics = run(tmp_path, "--moe-stream", "--cache-mb", "0")
    assert metrics.preamble["engine"] == "bmoe-py-0.1.0" and "." in metrics.preamble["cache_cycle_mb"]
    assert not any(line.startswith("mode:") for line in done.stdout.splitlines())
    assert release_range("bmoe-py 0.1.0") is None


def test_from_0_21_the_cycle_is_an_integer_rounded_up(tmp_path):
    _, old = run(tmp_path, "--moe-stream", "--cache-mb", "0")
    _, new = run(tmp_path, "--moe-stream", "--cache-mb", "0", release="0.21")
    assert int(new.preamble["cache_cycle_mb"]) == math.ceil(float(old.preamble["cache_cycle_mb"]))
    assert new.preamble["engine"] == "bmoe-py-0.1.0+bmoe-cli-0.21.0"


def test_from_0_21_the_cycle_warning_is_upstreams_one_line(tmp_path):
    under = ("--moe-stream", "--cache-mb", "1", "--force-cache")
    old, _ = run(tmp_path, *under)
    new, _ = run(tmp_path, *under, release="0.21")
    (two,) = [i for i, line in enumerate(old.stderr.splitlines()) if "WARNING expert cache" in line]
    assert old.stderr.splitlines()[two + 1].startswith("at top-k 2 — no entry can survive")
    (one,) = [line for line in new.stderr.splitlines() if "WARNING expert cache" in line]
    assert one == ("bmoe: WARNING expert cache 1 MiB is below this model's worst-case token cycle of 2 MiB at top-k 2 "
                   "— no entry can survive to the next token, so expect a hit rate near zero.")
    # the capture reader takes either, the same numbers
    assert parse_console(old.stderr.splitlines()).cycle_warning == parse_console([one]).cycle_warning


def test_after_0_24_every_run_says_its_mode_and_moe_stream_alone_is_auto(tmp_path):
    assert bmoe_py("--version", release="0.25").stdout == "bmoe-py 0.1.0 (bmoe-cli 0.25.0)\n"
    assert release_range("bmoe-py 0.1.0 (bmoe-cli 0.25.0)") == (NEXT, NEXT)
    alone, metrics = run(tmp_path, "--moe-stream", release="0.25")
    assert metrics.preamble["cache_auto"] == "1"
    console = parse_console(alone.stdout.splitlines())
    assert (console.value("mode", "mode"), console.value("mode", "mode_cache")) == ("expert streaming", "cache auto")
    assert console.moe_cache.auto
    fixed, _ = run(tmp_path, "--moe-stream", "--cache-mb", "0", release="0.25")
    assert parse_console(fixed.stdout.splitlines()).value("mode", "mode_cache") == "cache off"
    # an explicit budget, or BMOE_CACHE_MB, still wins over the new default
    _, metrics = run(tmp_path, "--moe-stream", release="0.25", BMOE_CACHE_MB="0")
    assert metrics.preamble["cache_auto"] == "0"
    baseline, _ = run(tmp_path, release="0.25")
    assert parse_console(baseline.stdout.splitlines()).value("mode", "mode") == "mmap"
    # older claims do not print it
    older, _ = run(tmp_path, "--moe-stream", release="0.24")
    assert not any(line.startswith("mode:") for line in older.stdout.splitlines())


@pytest.mark.parametrize("value", ["x", "0.18", "0.30"])
def test_a_claim_bmoe_py_cannot_speak_is_refused_in_one_line(value):
    done = bmoe_py("--version", release=value)
    assert done.returncode == 1 and done.stdout == "" and done.stderr.count("\n") == 1
    assert done.stderr.startswith("bmoe-py: BMOE_PY_RELEASE=")
    assert Release.parse("0.25") == NEXT
