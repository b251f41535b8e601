"""`import` reads a capture of many runs once, not once per run (it was quadratic: a
driver log of 400 runs took 54 s). Counted, not timed: every run's lines are parsed a bounded
number of times whatever the number of runs (benchmarks/bench_readers.py prints the times)."""

from __future__ import annotations

from pathlib import Path

import pytest

import results.read.parse_console as parse_console_module
from harness.importer import import_runs
from tests.harness.big_captures import driver_log, v2_capture


@pytest.mark.parametrize("make,runs", [(driver_log, 20), (driver_log, 120), (v2_capture, 60)])
def test_each_run_of_a_capture_is_parsed_a_bounded_number_of_times(tmp_path: Path, monkeypatch, make, runs: int):
    source = tmp_path / "src"
    source.mkdir()
    (source / "capture.log").write_bytes(make(runs))
    calls = 0
    real = parse_console_module.parse_console

    def counting(*args, **kwargs):
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(parse_console_module, "parse_console", counting)
    report = import_runs([source], tmp_path / "out")
    assert report.added == runs
    # discovery splits the capture once and the import once: two parses per run, not one per pair
    assert calls <= 2 * runs, calls
