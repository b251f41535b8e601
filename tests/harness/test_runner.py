"""Campaigns on this host (`local`) with real engine runs: the directory they leave, how each run
is classified, the ledger, resume after Ctrl-C, --rerun-failed, and per-device locks."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from harness.campaign.device_resolution import DeviceRef
from harness.campaign.file import load_campaign, parse_campaign
from harness.campaign.model import fleet_home
from harness.plan.grid import make_plan
from harness.run.errors import RunnerError
from harness.run.runner import run_campaign
from harness.run.status import campaign_status
from results.read.parse import read_metrics_csv
from store.campaign_dir import CampaignDir
from store.errors import LockBusy
from store.locks import device_lock, dir_lock
from store.outcomes import INFRA
from tests.harness.conftest import write_campaign

PROJECT = Path(__file__).resolve().parents[2]
RUN_KEYS = {"format", "version", "cell_id", "attempt", "device", "device_id", "model", "model_id", "engine", "config",
            "argv", "repeat", "pass", "order", "outcome", "evidence", "exit_status", "timed_out", "wall_s", "gate",
            "entry_state", "exit_state", "pressure", "lmk_events", "o_direct", "summary", "started_at", "ended_at",
            "cpu"}


def local_campaign(model: Path, name: str, axes: dict, run: dict | None = None, gate: dict | None = None,
                   engine: dict | None = None):
    data = {"version": 1, "name": name, "fleet": {"devices": ["local"]}, "models": {"m": str(model)}, "axes": axes,
            "run": {"n_predict": 4, **(run or {})}, "gate": {"max_wait_s": 1, **(gate or {})}}
    if engine:
        data["engine"] = engine
    return parse_campaign(data, source=f"{name}.toml")


def runs(out: Path) -> dict[str, dict]:
    return {p.parent.parent.name + "/" + p.parent.name: json.loads(p.read_text())
            for p in sorted(out.glob("runs/*/*/run.json"))}


def ledger(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines() if line.strip()]


def test_a_local_campaign_writes_the_directory_format(tmp_path, tiny_model, monkeypatch):
    # BMOE_* variables override untyped engine flags: they must not reach the engine
    monkeypatch.setenv("BMOE_PROGRESS", "1")
    monkeypatch.setenv("BMOE_PREFETCH", "2")
    # --chatml is a bmoe-cli flag bmoe-py does not implement: it answers as to an unknown flag (refused)
    c = local_campaign(tiny_model, "fmt", {"cache_mb": [0, "cycle*1.2"], "flags": {"--chatml": [False, True]}},
                       run={"route_trace": True})
    out = tmp_path / "out"
    status = run_campaign(c, out, progress_stream=io.StringIO())
    plan = make_plan(c)
    assert status.complete and status.planned == 4 and status.outcomes == {"ok": 2, "config_error": 2}

    assert sorted(p.name for p in out.iterdir()) == ["campaign.toml", "devices", "ledger.jsonl", "models", "plan.json",
                                                     "runs"]
    assert load_campaign(out / "campaign.toml") == c
    assert json.loads((out / "plan.json").read_text()) == plan.to_dict()
    dev = json.loads((out / "devices" / "local.json").read_text())
    assert dev["format"] == "bmoe-fleet.device" and dev["kind"] == "local" and dev["ram_total_kb"] > 0
    model = json.loads((out / "models" / "m.json").read_text())
    assert model["n_expert"] == 8 and len(model["sha256"]) == 64 and model["prices"][0]["top_k"] == 2

    records = runs(out)
    assert len(records) == 4 and len(ledger(out)) == 4
    for key, rec in records.items():
        assert set(rec) >= RUN_KEYS, RUN_KEYS - set(rec)
        assert rec["format"] == "bmoe-fleet.run" and rec["version"] == 1 and key == f"{rec['cell_id']}/1"
        assert rec["engine"]["kind"] == "python" and rec["engine"]["version"] == "bmoe-py 0.1.0"
        # the plan's "-t <auto>" is the cores this host has, at most 4, resolved right before the run
        assert rec["config"]["threads_auto"] is True and rec["config"]["threads"] == min(rec["cpu"]["cores"], 4)
        assert rec["argv"] == [str(rec["config"]["threads"]) if a == "<auto>" else a
                               for a in plan.cell(rec["cell_id"]).argv]
        assert rec["gate"]["gave_up"] is False and rec["entry_state"]["mem_available_kb"] > 0
        folder = out / "runs" / key
        assert (folder / "stdout.txt").is_file() and (folder / "stderr.txt").is_file()
        assert (folder / "samples.csv").read_text().startswith(
            "t_s,mem_available_kb,vm_hwm_kb,vm_rss_kb,cpu_temp_mc,battery_temp_dc,vm_swap_kb,rss_anon_kb,rss_file_kb,"
            "maj_flt,pswpin,pswpout,pgmajfault,allocstall,pgsteal_direct,workingset_refault,psi_some_avg10,"
            "psi_full_avg10,zram_used_kb,lmkd_free_kb,lmkd_available_kb,lmkd_swap_total_kb,lmkd_swap_free_kb,"
            "lmkd_file_lru_kb,lmkd_workingset_refault_file,lmkd_psi_full_total_us\n")
        assert rec["reclaim"]["samples"] >= 1 and "/proc/vmstat" not in rec["reclaim"]["refused"]
        assert "mem_avail_before_kb=" in (folder / "run.metrics").read_text()
        if "--chatml" in rec["argv"]:
            assert rec["outcome"] == "config_error" and rec["exit_status"] == 1
            assert rec["evidence"][1] == "unknown arg: --chatml"
            assert not (folder / "metrics.csv").exists()
            continue
        assert rec["outcome"] == "ok" and rec["exit_status"] == 0 and rec["evidence"] == []
        assert (folder / "route.csv").read_text().startswith("# route_trace v1")  # asked for: pulled too
        m = read_metrics_csv(folder / "metrics.csv")
        assert m.summary["tokens"] == 4 and rec["summary"]["tok/s"] == m.summary["tok/s"]
        assert m.preamble["prefetch"] == "0"                    # BMOE_PREFETCH=2 was scrubbed
        assert b"BMOE_PROGRESS" not in (folder / "stdout.txt").read_bytes()
        assert rec["result"]["tok_per_s"] == m.summary["tok/s"] and rec["o_direct"] == 1
        assert rec["result"]["budget_mib"] == rec["config"]["cache_mb"] == m.summary["cache_budget_MiB"]
        if rec["config"]["budget_spec"] == "cycle*1.2":
            assert rec["config"]["force_cache_auto"] is True and "--force-cache" in rec["argv"]
            assert m.preamble["force_cache"] == "1"
    for line in ledger(out):
        assert line["format"] == "bmoe-fleet.ledger" and line["run_dir"] == f"runs/{line['cell_id']}/{line['attempt']}"
        assert line["outcome"] == records[f"{line['cell_id']}/1"]["outcome"]

    # the same campaign again: nothing is missing, nothing runs
    again = run_campaign(c, out, progress_stream=io.StringIO())
    assert again.attempts == 4 and len(ledger(out)) == 4
    # --rerun-failed retries the refused cells only, as attempt 2; both attempts stay in the ledger
    rerun = run_campaign(c, out, rerun_failed=True, progress_stream=io.StringIO())
    lines = ledger(out)
    assert rerun.attempts == 6 and len(lines) == 6
    assert sorted(line["attempt"] for line in lines if line["outcome"] == "config_error") == [1, 1, 2, 2]
    assert (out / "runs" / lines[-1]["cell_id"] / "2" / "run.json").is_file()


def test_timeout_invalid_and_engine_error_outcomes_from_real_runs(tmp_path, tiny_model):
    null = io.StringIO()
    # timeout: 2000 tokens (the most the default 2048-token context takes) last seconds; killed at 1 s
    slow = local_campaign(tiny_model, "slow", {"cache_mb": [0]}, run={"n_predict": 2000, "timeout_s": 1.0})
    run_campaign(slow, tmp_path / "slow", progress_stream=null)
    (rec,) = runs(tmp_path / "slow").values()
    assert rec["outcome"] == "timeout" and rec["timed_out"] is True and rec["wall_s"] < 5
    assert "killed after" in rec["evidence"][0]

    # invalid: O_DIRECT asked for, but the model sits on tmpfs, where the engine falls back
    shm = Path("/dev/shm")
    assert psutil.disk_partitions(all=True) and any(p.mountpoint == "/dev/shm" and p.fstype == "tmpfs"
                                                    for p in psutil.disk_partitions(all=True))
    on_tmpfs = shm / f"bmoe-test-{os.getpid()}.gguf"
    shutil.copyfile(tiny_model, on_tmpfs)
    try:
        bad = local_campaign(on_tmpfs, "tmpfs", {"cache_mb": [0]})
        run_campaign(bad, tmp_path / "tmpfs", progress_stream=null)
    finally:
        on_tmpfs.unlink()
    (rec,) = runs(tmp_path / "tmpfs").values()
    assert rec["outcome"] == "invalid" and rec["exit_status"] == 0 and rec["o_direct"] == 0
    assert rec["evidence"][0].startswith("o_direct=0")

    # engine_error: a native engine that fails at run time (its --version works, and is recorded)
    fake = tmp_path / "fake-cli"
    fake.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo "fake-cli 9.9"; exit 0; fi\n'
                    'echo "loading $2" ; echo "error: cannot map the model" >&2; exit 1\n')
    fake.chmod(0o755)
    native = local_campaign(tiny_model, "native", {"cache_mb": [0]},
                            engine={"kind": "native", "native": {os.uname().machine: {"cli": str(fake)}}})
    run_campaign(native, tmp_path / "native", progress_stream=null)
    (rec,) = runs(tmp_path / "native").values()
    assert rec["engine"]["kind"] == "native" and rec["engine"]["version"] == "fake-cli 9.9"
    assert rec["argv"][0].endswith("/bmoe-cli")
    assert rec["outcome"] == "engine_error" and rec["evidence"] == ["exit status 1", "error: cannot map the model"]


def _engine_pids() -> list[int]:
    """Engine runs (not `--version` probes) this test's campaigns started on this host: outside
    any virtual phone, writing their CSV under this test's fleet home (never a user's campaign)."""
    me = os.readlink("/proc/self/ns/mnt")
    ours = str(fleet_home() / "local") + "/"
    out = []
    for p in psutil.process_iter(["name", "pid", "cmdline"]):
        argv = p.info["cmdline"] or []
        csv = argv[argv.index("--csv") + 1] if "--csv" in argv[:-1] else ""
        if p.info["name"] == "bmoe-py" and csv.startswith(ours):
            try:
                if os.readlink(f"/proc/{p.info['pid']}/ns/mnt") == me:
                    out.append(p.info["pid"])
            except OSError:
                pass
    return out


def test_a_sigkill_without_lmk_evidence_is_killed_not_lmk_killed(tmp_path, tiny_model):
    c = local_campaign(tiny_model, "kill", {"cache_mb": [0]}, run={"n_predict": 2000, "timeout_s": 60})
    t = threading.Thread(target=run_campaign, args=(c, tmp_path / "o"), kwargs={"progress_stream": io.StringIO()})
    t.start()
    try:
        deadline = time.monotonic() + 20
        while not _engine_pids() and time.monotonic() < deadline:
            time.sleep(0.02)
        pids = _engine_pids()
        assert pids
        time.sleep(0.3)
    finally:
        for pid in _engine_pids():
            os.kill(pid, signal.SIGKILL)
        t.join(60)
    (rec,) = runs(tmp_path / "o").values()
    assert rec["outcome"] == "killed" and rec["exit_status"] == 137 and rec["pid"] in pids
    assert "no lmkd or kernel kill line" in rec["evidence"][0]


def test_ctrl_c_leaves_a_consistent_directory_and_a_rerun_completes_exactly_the_plan(tmp_path, tiny_model):
    path = write_campaign(tmp_path, f"""
version = 1
name = "resume"
[fleet]
devices = ["local"]
[models]
tiny = "{tiny_model}"
[axes]
cache_mb = [0, "auto", "cycle*1.2", "mmap"]
[run]
n_predict = 200          # ~2 s a run: the interrupt lands mid-campaign however fast the host
repeats = 2
[gate]
max_wait_s = 1
""")
    out = tmp_path / "out"
    # Ctrl-C as on a terminal, even when this suite runs in the background (where a shell starts
    # jobs with SIGINT ignored, and Python then installs no KeyboardInterrupt handler)
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from harness.run.runner import run_campaign_file; run_campaign_file(sys.argv[1], sys.argv[2])")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path), str(out)], cwd=PROJECT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if (out / "ledger.jsonl").exists() and len(ledger(out)) >= 2:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and b"KeyboardInterrupt" in err
    assert not _engine_pids()                                 # the engine it was running is gone
    plan = make_plan(load_campaign(path))
    first = ledger(out)
    assert 2 <= len(first) < len(plan.cells)
    for line in first:                                        # every ledger line has its complete folder
        assert json.loads((out / line["run_dir"] / "run.json").read_text())["outcome"] == line["outcome"]
    assert not list(out.glob("runs/*/.tmp-*"))
    assert len(list(out.glob("runs/*/*/run.json"))) == len(first)
    assert campaign_status(out).pending == len(plan.cells) - len(first)

    status = run_campaign(load_campaign(path), out, progress_stream=io.StringIO())
    final = ledger(out)
    assert status.complete and final[: len(first)] == first
    assert sorted(line["cell_id"] for line in final) == sorted(c.cell_id for c in plan.cells)
    assert {line["attempt"] for line in final} == {1} and {line["outcome"] for line in final} == {"ok"}


def test_a_crash_between_folder_and_ledger_line_is_repaired_not_rerun(tmp_path, tiny_model):
    c = local_campaign(tiny_model, "crash", {"cache_mb": [0, "auto"]})
    out = tmp_path / "out"
    run_campaign(c, out, progress_stream=io.StringIO())
    lines = (out / "ledger.jsonl").read_text().splitlines(keepends=True)
    # the last attempt's line never made it, and a torn half line did
    (out / "ledger.jsonl").write_text("".join(lines[:-1]) + lines[-1][:25])
    (out / "runs" / json.loads(lines[0])["cell_id"] / ".tmp-2-999").mkdir()
    assert campaign_status(out).attempts == 1          # the torn line is not an attempt
    status = run_campaign(c, out, progress_stream=io.StringIO())
    repaired = (out / "ledger.jsonl").read_text().splitlines()
    assert status.complete and status.attempts == 2 and len(repaired) == 2
    assert [json.loads(x) for x in repaired] == [json.loads(x) for x in lines]  # restored from run.json
    assert len(list(out.glob("runs/*/*/run.json"))) == 2 and not list(out.glob("runs/*/.tmp-*"))
    # a later device_lost attempt: status says why from its run.json, read through the store
    cdir = CampaignDir(out)
    first = cdir.read_run(json.loads(lines[0])["cell_id"], 1)
    lost = first.with_(attempt=3, outcome="device_lost", evidence=["adb: device 'x' not found", "restarted it"],
                       ended_at=first.ended_at + 1)
    cdir.commit_attempt(cdir.start_attempt(lost.cell_id, 3), lost)
    assert campaign_status(out).devices[0].lost == "adb: device 'x' not found; restarted it"
    (cdir.run_dir(lost.cell_id, 3) / "run.json").write_text('{"format": "bmoe-fleet.run", "outcome": 3}')
    assert campaign_status(out).devices[0].lost is None            # unreadable: status still answers


def test_a_different_campaign_is_refused_in_a_used_directory(tmp_path, tiny_model):
    out = tmp_path / "out"
    run_campaign(local_campaign(tiny_model, "a", {"cache_mb": [0]}), out, progress_stream=io.StringIO())
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(RunnerError, match="holds a different campaign"):
        run_campaign(local_campaign(tiny_model, "a", {"cache_mb": [0, 4000]}), out)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_a_run_killed_before_its_first_plan_runs_again_and_a_stranger_folder_is_refused(tmp_path, tiny_model):
    """A SIGKILL between campaign.toml and the first plan.json leaves the folder with the
    campaign's own campaign.toml (and maybe an atomic write's temporary file): the same campaign
    runs there. A folder whose campaign.toml is another's, with no plan, is still refused."""
    c = local_campaign(tiny_model, "early", {"cache_mb": [0]})
    out = tmp_path / "out"
    out.mkdir()
    (out / "campaign.toml").write_text(c.to_toml())
    (out / f".plan.json.tmp-{os.getpid()}-1").write_text('{"cam')
    assert run_campaign(c, out, progress_stream=io.StringIO()).complete
    other = tmp_path / "other"
    other.mkdir()
    (other / "campaign.toml").write_text(local_campaign(tiny_model, "else", {"cache_mb": [0]}).to_toml())
    with pytest.raises(RunnerError, match="holds no campaign"):
        run_campaign(c, other, progress_stream=io.StringIO())


def test_a_locked_device_fails_clearly_or_waits(tmp_path, tiny_model):
    c = local_campaign(tiny_model, "locked", {"cache_mb": [0]})
    lock = device_lock(fleet_home(), DeviceRef("local", "local", "local"))
    lock.acquire(0, {"pid": 4242, "host": "elsewhere", "dir": "/other/campaign", "since": time.time()})
    try:
        with pytest.raises(LockBusy, match=r"device local is in use by another campaign \(pid 4242 on elsewhere, "
                                              r"campaign dir /other/campaign"):
            run_campaign(c, tmp_path / "out")
        assert not (tmp_path / "out").exists()
    finally:
        lock.release()
    # a campaign allowed to wait starts once the other lets go
    waiting = local_campaign(tiny_model, "locked", {"cache_mb": [0]}, run={"lock_wait_s": 20})
    lock.acquire(0, {"pid": 1, "host": "h", "dir": "/d", "since": time.time()})
    threading.Timer(0.5, lock.release).start()
    t0 = time.monotonic()
    status = run_campaign(waiting, tmp_path / "out", progress_stream=io.StringIO())
    assert status.complete and time.monotonic() - t0 >= 0.5


def test_the_gate_gives_up_and_says_why(tmp_path, tiny_model):
    c = local_campaign(tiny_model, "gate", {"cache_mb": [0]},
                       gate={"mem_available_min_mb": 10**6, "max_wait_s": 0.6, "poll_s": 0.2})
    run_campaign(c, tmp_path / "o", progress_stream=io.StringIO())
    (rec,) = runs(tmp_path / "o").values()
    assert rec["outcome"] == "ok"                             # a give-up is allowed ...
    assert rec["gate"]["gave_up"] is True and rec["gate"]["waited_s"] >= 0.6 and rec["gate"]["polls"] >= 3
    assert "MemAvailable" in rec["gate"]["reason"] and "is not over 1024000000 kB" in rec["gate"]["reason"]


def test_status_command_reports_progress_and_outcomes(tmp_path, tiny_model, cli):
    # ahwb is Android-only: the engine takes the flag and fails at load (exit 1, `error: …`), as bmoe-cli does
    c = local_campaign(tiny_model, "st", {"cache_mb": [0], "dense_weights": ["anon", "ahwb"]})
    out = tmp_path / "out"
    run_campaign(c, out, progress_stream=io.StringIO())
    text = CliRunner().invoke(cli, ["status", str(out)], catch_exceptions=False).output
    assert "2/2 cells done, 0 pending" in text and "complete" in text and "engine_error 1" in text
    data = json.loads(CliRunner().invoke(cli, ["status", str(out), "--json"], catch_exceptions=False).output)
    assert data["format"] == "bmoe-fleet.status" and data["complete"] is True
    assert data["outcomes"] == {"ok": 1, "engine_error": 1} and data["running"] is None
    assert set(data["cells"].values()) == {"ok", "engine_error"}
    # while a run holds the directory, status names it
    held = dir_lock(fleet_home(), out.resolve())
    held.acquire(0, {"pid": 31337, "host": "box", "dir": str(out), "since": time.time()})
    try:
        assert campaign_status(out).running == "pid 31337 on box"
        assert "running (pid 31337 on box)" in CliRunner().invoke(cli, ["status", str(out)]).output
    finally:
        held.release()
    assert campaign_status(out).running is None
    missing = CliRunner().invoke(cli, ["status", str(tmp_path)])
    assert missing.exit_code == 1 and "not a campaign directory (no plan.json)" in missing.output
    assert not set(INFRA) & set(data["outcomes"])


def test_sweep_runs_and_writes_the_equivalent_campaign_file(tmp_path, tiny_model, cli):
    out = tmp_path / "sw"
    args = ["sweep", "--device", "local", "--model", str(tiny_model), "--cache-mb", "0,cycle*1.2",
            "--dense-weights", "anon", "-n", "4", "-o", str(out), "--json"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    status = json.loads(result.output[result.output.index("{"):])
    assert status["complete"] and status["outcomes"] == {"ok": 2}
    written = load_campaign(out / "campaign.toml")
    assert written.axes.cache_mb == (0, "cycle*1.2") and written.run.n_predict == 4
    # running the written file resumes the same directory: nothing left to do
    again = CliRunner().invoke(cli, ["run", str(out / "campaign.toml"), "--json"], catch_exceptions=False)
    assert json.loads(again.output[again.output.index("{"):])["attempts"] == 2
    assert len(CampaignDir(out).ledger.read()) == 2


def test_an_engine_the_device_cannot_execute_stops_that_device_with_a_clear_error(tmp_path, tiny_model):
    c = local_campaign(tiny_model, "noexec", {"cache_mb": [0]}, engine={"python": str(tmp_path / "no-python")})
    with pytest.raises(RunnerError, match=r"local: the engine cannot start there \(cannot start .*bmoe-py.*\); "
                                          r"engine.python \(.*no-python\) must be an interpreter path this device has"):
        run_campaign(c, tmp_path / "out", progress_stream=io.StringIO())
    assert campaign_status(tmp_path / "out").pending == 1 and not (tmp_path / "out" / "ledger.jsonl").exists()
