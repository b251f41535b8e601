"""Hardening on this host: a full disk (a real tmpfs that fills up), bounded plans and
numeric settings checked when the file is read, terminal-safe output from files and devices, lock
files removed when released (safely, with other processes waiting on them), and the CLI's one-line
errors. The faults on phones and on the running sweep are tests/harness/test_hardening_faults.py.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from devices.base import DeviceIdentity, DeviceState
from devices.inventory import DeviceReport
from harness.campaign.file import load_campaign, parse_campaign
from harness.campaign.model import MAX_CELLS, CampaignError, fleet_home
from harness.plan.grid import make_plan
from harness.run.progress import Progress
from harness.run.runner import run_campaign
from store.campaign_dir import CampaignDir
from store.errors import LockBusy
from store.locks import FileLock, locks_dir
from tests.harness import faults
from tests.harness.conftest import write_campaign


def _campaign(tmp_path: Path, model: Path, extra: str = "", axes: str = 'cache_mb = [0]', name: str = "c") -> Path:
    return write_campaign(tmp_path, f"""version = 1
name = "{name}"
[fleet]
devices = ["local"]
[models]
m = "{model}"
[axes]
{axes}
[run]
n_predict = 2
[gate]
max_wait_s = 1
{extra}""", name=f"{name}.toml")


# ── a full disk ─────────────────────────────────────────────────────────────────────────────────


@contextlib.contextmanager
def tmpfs(path: Path, size_kib: int):
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.root("mounts a small tmpfs")
def test_a_full_disk_is_one_line_exit_1_and_nothing_half_written(tmp_path, tiny_model, cli):
    """A campaign directory on a small tmpfs that fills up, at every stage (the
    setup writes, the attempts' files, the ledger) as the free space grows: one `Error: FILE: no
    space left on device` line and exit 1, never a traceback; no half file, no folder without
    its plan, no torn attempt; with room again, a rerun completes exactly the plan."""
    path = _campaign(tmp_path, tiny_model, axes='cache_mb = [0, "cycle*1.2"]')
    plan = make_plan(load_campaign(path))
    seen = Counter()
    for size_kib in (4, 16, 48, 80):     # full at the plan, at an attempt's files (twice), never
        mount = tmp_path / f"disk{size_kib}"
        with tmpfs(mount, size_kib):
            out = mount / "camp"
            result = CliRunner().invoke(cli, ["run", str(path), "-o", str(out)], catch_exceptions=False)
            if result.exit_code == 0:
                seen["complete"] += 1
            else:
                assert result.exit_code == 1, result.output
                (line,) = result.output.strip().splitlines()[-1:]
                assert line.startswith(f"Error: {mount}") and ": no space left on device; nothing half-written" in line
                assert "Traceback" not in result.output
                seen["setup" if not (out / "plan.json").exists() else "runs"] += 1
            leftovers = [p for p in mount.rglob("*") if ".tmp-" in p.name]
            assert not leftovers, leftovers                      # no half file, no half attempt
            assert not out.exists() or (out / "plan.json").exists()  # never a folder without its plan
            if out.exists():
                CampaignDir(out).ledger.read()                   # parses
                for run_dir in out.glob("runs/*/*"):
                    assert json.loads((run_dir / "run.json").read_text())["cell_id"] == run_dir.parent.name
                subprocess.run(["mount", "-o", "remount,size=4m", str(mount)], check=True)
                again = CliRunner().invoke(cli, ["run", str(path), "-o", str(out)], catch_exceptions=False)
                assert again.exit_code == 0, again.output
                assert faults.check_dir(path, out) == Counter()
                assert len(CampaignDir(out).ledger.read()) == len(plan.cells)
    # the disk filled up during the setup, during the attempts, and not at all
    assert seen["setup"] and seen["runs"] and seen["complete"], seen


# ── plans and numbers, checked when the file is read ───────────────────────────────────────────


@pytest.mark.parametrize("extra, key, why", [
    ("[run]\nrepeats = 100000", "run.repeats", "must be at most 10000, got 100000"),
    ("[run]\nrepeats = 6000\nreverse_pass = true", "", "makes up to 12,000 cells (6,000 run.repeats x 2 passes); a "
                                                       "campaign holds at most 10,000"),
    ("[run]\nrepeats = 9223372036854775807", "run.repeats", "must be at most 10000, got 9223372036854775807"),
    ("[run]\ntimeout_s = inf", "run.timeout_s", "must be a finite number, got inf"),
    ("[gate]\ncpu_temp_max_c = nan", "gate.cpu_temp_max_c", "must be a finite number, got nan"),
    ("[gate]\ncpu_temp_max_c = 1000.0", "gate.cpu_temp_max_c", "must be at most 200"),
    ("[run]\nn_predict = " + "9" * 400, "run.n_predict", "got a 400-digit number"),
    ("[run]\nretry_backoff_s = 1e300", "run.retry_backoff_s", "must be at most 3600"),
    ("[gate]\nmax_wait_s = -inf", "gate.max_wait_s", "must be a finite number, got -inf"),
    ("[axes]\ncache_ceil_mb = [0, 4294967296]", "axes.cache_ceil_mb[1]", "must be at most 2147483647"),
    ("[run]\ntimeout_s = " + "9" * 400, "run.timeout_s", "must be a finite number, got a 400-digit number"),
    ("[models]\nm = \"" + "1" * 5000 + ".gguf\"", "models.m", "file name too long: /"),
])
def test_numbers_and_plans_are_bounded_when_the_file_is_read(tmp_path, tiny_model, cli, extra, key, why):
    """Refused by the check itself (so `--dry-run` too), naming the key, before
    any cell is expanded; `run` creates no folder."""
    text = _campaign(tmp_path, tiny_model).read_text()
    section, *lines = extra.split("\n")
    for line in lines:                       # the key's own line replaced, or added to its section
        name = line.split(" =")[0]
        old = next((x for x in text.splitlines() if x.startswith(name + " =")), None)
        text = text.replace(old, line) if old else text.replace(section + "\n", f"{section}\n{line}\n", 1) \
            if section in text else text + f"\n{section}\n{line}\n"
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(CampaignError) as e:
        load_campaign(path)
    assert f"{path}: {key + ': ' if key else ''}" in str(e.value) and why in str(e.value)
    for args in (["run", str(path), "--dry-run"], ["run", str(path), "-o", str(tmp_path / "out")]):
        result = CliRunner().invoke(cli, args, catch_exceptions=False)
        assert result.exit_code == 1 and result.output.count("\n") == 1 and why in result.output
    assert not (tmp_path / "out").exists()


def test_the_cell_bound_is_counted_without_expanding_the_plan(tmp_path, tiny_model, monkeypatch):
    """The bound is a product of the axes' lengths: a campaign over it never reaches the planner,
    and one at it plans exactly."""
    import harness.plan.grid as plan_module

    def no_expanding(*_a, **_k):
        raise AssertionError("the plan was expanded")

    base = {"version": 1, "fleet": {"devices": ["local"]}, "models": {"m": str(tiny_model)},
            "axes": {"cache_mb": [0, "cycle*1.2"]}, "run": {"n_predict": 2}}
    over = dict(base, run={"n_predict": 2, "repeats": MAX_CELLS // 2 + 1})
    monkeypatch.setattr(plan_module, "configs_for", no_expanding)
    with pytest.raises(CampaignError, match=r"makes up to 10,002 cells \(2 budgets x 5,001 run.repeats\)"):
        parse_campaign(over, "over.toml")
    monkeypatch.undo()
    at = parse_campaign(dict(base, run={"n_predict": 2, "repeats": MAX_CELLS // 2}), "at.toml")
    assert len(make_plan(at).cells) == MAX_CELLS


def test_a_campaign_that_cannot_start_leaves_no_empty_folder(tmp_path, tiny_model):
    """`run` once failed after making its folder ("cannot write inf to TOML")."""
    campaign = parse_campaign({"version": 1, "fleet": {"devices": ["local"]}, "models": {"m": str(tiny_model)},
                               "axes": {"cache_mb": [0]}, "run": {"n_predict": 2}}, "c.toml")
    import dataclasses

    broken = dataclasses.replace(campaign, run=dataclasses.replace(campaign.run, timeout_s=float("inf")))
    with pytest.raises(CampaignError, match="cannot write inf to TOML"):
        run_campaign(broken, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ── terminal safety ────────────────────────────────────────────────────────────────────────────

NASTY = "\x1b]0;pwned\x07\x1b[2J\u202eevil"


def test_device_strings_reach_the_terminal_escaped():
    """Getprop values in `devices`, device names in progress lines."""
    identity = DeviceIdentity(serial="R58" + NASTY, backend="adb", model="Pixel" + NASTY, manufacturer=NASTY,
                              soc="sm" + NASTY, abi="arm64-v8a", android_release="14" + NASTY, sdk=34,
                              ram_total_kb=8 << 20, swap_total_kb=0, kernel="6.1")
    line = DeviceReport(identity, DeviceState(0.0, None, None, None)).line()
    assert "\x1b" not in line and "\x07" not in line and "\u202e" not in line and "\\x1b]0;pwned\\x07" in line
    assert "MemAvailable unknown" in line                                   # was a TypeError
    for tty in (False, True):
        stream = _Tty() if tty else _Plain()
        progress = Progress({"virtual:" + NASTY: 1}, stream, tty)
        progress.start_cell("virtual:" + NASTY, "cell", 1)
        progress.note("virtual:" + NASTY, "gate: " + NASTY)
        progress.close()
        # on a terminal rich moves and colours (SGR, cursor up, erase line, cursor hide/show)
        written = re.sub(r"\x1b\[(?:\?25[lh]|[0-9;]*m|[0-9]*[AK])", "", stream.getvalue())
        assert "\x1b" not in written and "\x07" not in written and "\u202e" not in written
        assert "\\x1b]0;pwned\\x07" in written


class _Plain:
    def __init__(self):
        self.parts: list[str] = []

    def write(self, text: str) -> None:
        self.parts.append(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def getvalue(self) -> str:
        return "".join(self.parts)


class _Tty(_Plain):
    def isatty(self) -> bool:
        return True


def test_model_inspect_prints_gguf_strings_escaped(tmp_path, cli):
    """Through the CLI: the model's name carries a title-setting sequence."""
    from engine.gguf.synth import synth_options, write_model

    path = tmp_path / "nasty.gguf"
    write_model(path, synth_options("qwen3moe", layers=2, experts=4, top_k=2, hidden=64, expert_ffn=32, vocab=260,
                                    seed=1))
    data = path.read_bytes()
    key = b"general.name"
    at = data.index(len(key).to_bytes(8, "little") + key) + 8 + len(key) + 4      # the value's length field
    n = int.from_bytes(data[at:at + 8], "little")
    name = NASTY.encode()[:n].ljust(n, b"x")                                     # same length: still valid
    path.write_bytes(data[:at + 8] + name + data[at + 8 + n:])
    result = CliRunner().invoke(cli, ["model", "inspect", str(path)], catch_exceptions=False)
    assert result.exit_code == 0
    assert "\x1b" not in result.output and "\x07" not in result.output and "\\x1b]0;pwned\\x07" in result.output


def test_errors_from_files_are_one_escaped_line(tmp_path, cli):
    path = tmp_path / "c.toml"
    path.write_text(f"version = 1\n{json.dumps(NASTY)} = 1\n")
    result = CliRunner().invoke(cli, ["run", str(path), "--dry-run"], catch_exceptions=False)
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert "\x1b" not in result.output and "unknown key" in result.output


# ── lock files ─────────────────────────────────────────────────────────────────────────────────


def test_lock_files_are_removed_when_released(tmp_path, tiny_model):
    """~900 dir-*.lock files were once left behind."""
    locks = locks_dir(fleet_home())
    before = set(locks.glob("*.lock*")) if locks.exists() else set()
    run_campaign(load_campaign(_campaign(tmp_path, tiny_model)), tmp_path / "out", progress_stream=_Plain())
    assert set(locks.glob("*.lock*")) - before == set()
    lock = FileLock(locks / "x.lock", "x")
    lock.acquire(0, {"pid": os.getpid()})
    assert lock.path.exists()
    lock.release()
    assert not lock.path.exists()


def _contend(path: str, marker: str, rounds: int, errors) -> None:
    lock = FileLock(Path(path), "the test lock")
    for _ in range(rounds):
        lock.acquire(30, {"pid": os.getpid()})
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)   # fails if another holder is in
        except FileExistsError:
            errors.put(f"pid {os.getpid()}: two holders at once")
            lock.release()
            return
        os.close(fd)
        time.sleep(0.001)
        os.unlink(marker)
        lock.release()


def test_a_waiter_on_a_removed_lock_file_does_not_hold_it(tmp_path, monkeypatch):
    """The race removal opens, played out step by step: a waiter opened the lock file (inode A)
    before its holder released it (A removed); a third process then made the file anew (B) and
    holds it. The waiter's flock on A succeeds — and must not count: A is no longer the lock."""
    import store.locks as locks_module

    path = tmp_path / "race.lock"
    holder = FileLock(path, "the race lock")
    holder.acquire(0, {"pid": 1})
    stale_fd = os.open(path, os.O_RDWR)                 # the waiter's open, before the release
    holder.release()
    assert not path.exists()
    third = FileLock(path, "the race lock")
    third.acquire(0, {"pid": 3})
    real_open, handed = os.open, []

    def waiter_open(p, flags, mode=0o777):
        if not handed:                                  # the waiter's first open is the stale one
            handed.append(p)
            return stale_fd
        return real_open(p, flags, mode)

    monkeypatch.setattr(locks_module.os, "open", waiter_open)
    waiter = FileLock(path, "the race lock")
    with pytest.raises(LockBusy, match="is in use by another campaign"):
        waiter.acquire(0, {"pid": 2})
    monkeypatch.undo()
    assert handed and third.held
    third.release()
    assert not path.exists()


def test_removing_lock_files_never_lets_two_holders_in(tmp_path):
    """Four processes taking and releasing one lock (its file removed at every release): never
    two holders at once."""
    path, marker = tmp_path / f"{uuid.uuid4().hex}.lock", tmp_path / "holder"
    ctx = multiprocessing.get_context("fork")
    errors = ctx.Queue()
    procs = [ctx.Process(target=_contend, args=(str(path), str(marker), 15, errors)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs)
    assert errors.empty(), errors.get()
    assert not path.exists() and not marker.exists()
