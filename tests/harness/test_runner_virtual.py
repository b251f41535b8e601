"""Campaigns on virtual phones, reached through the real adb server like real phones: devices in
parallel, bmoe-py and models pushed once, a resident run killed by the phone's memory cgroup and
classified `lmk_killed` from the phone's own lmkd lines, the gate, push failures retried, a phone
that disappears mid-run, and locks shared between a phone's names."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import threading
import time
from pathlib import Path

import psutil
import pytest

from devices.adb.link import WORK_DIR
from harness.campaign.device_resolution import resolve_devices
from harness.campaign.file import parse_campaign
from harness.campaign.model import CampaignError, fleet_home
from harness.run.cpushare import host_boot_id, local_cpu
from harness.run.runner import run_campaign
from harness.run.status import campaign_status
from store.errors import LockBusy
from store.locks import device_lock
from tests.harness.conftest import the_phone
from tests.harness.faults import stop_phone_when


def vcampaign(name, devices, model, adb_port, phone_home, axes, run=None, gate=None, connect=()):
    data = {"version": 1, "name": name,
            "fleet": {"devices": list(devices), "connect": list(connect), "virtual_home": str(phone_home),
                      "adb": [{"host": "127.0.0.1", "port": adb_port}]},
            "models": {"mid": str(model)}, "axes": axes, "run": {"n_predict": 4, **(run or {})},
            "gate": {"max_wait_s": 2, **(gate or {})}}
    return parse_campaign(data, source=f"{name}.toml")


def records(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("runs/*/*/run.json"))]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_two_phones_and_this_host_run_in_parallel(tmp_path, phones, adb_port, phone_home, mid_model):
    c = vcampaign("par", ["virtual:roomy", "virtual:tight", "local"], mid_model, adb_port, phone_home,
                  {"cache_mb": [0, "cycle*1.2", "resident"]})
    out = tmp_path / "out"
    status = run_campaign(c, out, progress_stream=io.StringIO())
    assert status.complete and status.planned == 9
    by_device = {d.device: d.outcomes for d in status.devices}
    assert by_device == {"virtual:roomy": {"ok": 3}, "virtual:tight": {"ok": 2, "killed": 1}, "local": {"ok": 3}}
    recs = records(out)

    # the 84 MiB phone's kernel OOM-killed the resident run: over adb lmkd never considers the engine
    # (it kills only what ActivityManager registered), and a user build's shell reads no kernel
    # line, so the evidence is the bare SIGKILL; the run still carries the app's replayed verdict
    (killed,) = [r for r in recs if r["outcome"] == "killed"]
    assert killed["device"] == "virtual:tight" and killed["config"]["no_mmap"] is True
    assert killed["exit_status"] == 137 and killed["pid"]
    assert killed["evidence"] == [f"exit status 137 (SIGKILL) with no lmkd or kernel kill line for pid {killed['pid']}"]
    assert not [e for e in killed["lmk_events"] if e["pid"] == killed["pid"]]
    assert [v["role"] for v in killed["app_verdicts"]] == ["top", "service"] and killed["collateral"] == []

    for r in recs:
        if r["device"] == "local":
            continue
        phone = phones[r["device"].split(":")[1]]
        assert r["engine"] == {"kind": "python", "version": "bmoe-py 0.1.0", "sha256": r["engine"]["sha256"],
                               "path": f"{WORK_DIR}/bmoe-py"}
        assert r["argv"][0] == f"{WORK_DIR}/bmoe-py" and r["argv"][2] == f"{WORK_DIR}/mid.gguf"
        assert r["entry_state"]["cpu_temp_mc"] is not None and r["entry_state"]["battery_temp_dc"] is not None
        assert r["gate"]["gave_up"] is False
        assert 0 < r["pressure"]["mem_avail_before_kb"] <= phone.ram_bytes // 1024
        if r["outcome"] == "ok":
            assert r["result"]["tokens"] == 4
            assert r["o_direct"] == (1 if r["config"]["moe_stream"] else 0)   # staged on a real filesystem
            metrics = (out / "runs" / r["cell_id"] / "1" / "metrics.csv").read_text()
            assert "# summary tokens=4 " in metrics
        # each phone got the engine and the model with its first cell, and never again
        first = r["order"] == 0
        assert sorted(p["path"] for p in r["pushed"]) == (
            [f"{WORK_DIR}/bmoe-py", f"{WORK_DIR}/mid.gguf"] if first else [])
    for name, phone in phones.items():
        staged = phone.root / "data/local/tmp/bmoe"
        assert sha(staged / "mid.gguf") == sha(mid_model)
        assert os.access(staged / "bmoe-py", os.X_OK)
        assert list((staged / "out").iterdir()) == []          # outputs pulled, then removed
        dev = json.loads((out / "devices" / f"virtual-{name}.json").read_text())
        assert dev["kind"] == "virtual" and dev["ram_total_kb"] == phone.ram_bytes // 1024
        assert dev["model"] == phone.model
    assert json.loads((out / "devices" / "virtual-tight.json").read_text())["android_release"] == "13"

    # devices ran side by side: a roomy run overlaps a tight run in time
    spans = {d: [(r["started_at"], r["ended_at"]) for r in recs if r["device"] == d] for d in by_device}
    assert any(a0 < b1 and b0 < a1 for a0, a1 in spans["virtual:roomy"] for b0, b1 in spans["virtual:tight"])

    # this host and both phones run on one kernel (the host's boot id, its cores): each run counts the
    # campaign's engines that ran at the same moment on the other devices (bmoe-py: its -t each)
    cores, by_cell, saw_others = local_cpu().cores, {r["cell_id"]: r for r in recs}, 0
    for r in recs:
        cpu = r["cpu"]
        assert cpu["boot_id"] == host_boot_id() and cpu["shares_host"] is True and cpu["cores"] == cores
        assert cpu["threads"] == r["config"]["threads"] and cpu["oversubscribed"] is (cpu["threads_sum"] > cores)
        mates = [e for e in cpu["engines"] if not e.get("outside")]
        for e in mates:                                   # seen at one moment: each saw the other
            assert by_cell[e["cell_id"]]["device"] == e["device"] != r["device"]
            assert any(m.get("cell_id") == r["cell_id"] for m in by_cell[e["cell_id"]]["cpu"]["engines"])
        saw_others += bool(mates)
    assert saw_others >= 2

    again = run_campaign(c, out, progress_stream=io.StringIO())
    assert again.attempts == 9


def test_the_gate_on_a_phone_reads_its_cpu_sensor_and_may_give_up(tmp_path, phones, adb_port, phone_home, mid_model):
    # a campaign before it leaves engine and model on the phone (whichever tests ran there before)
    run_campaign(vcampaign("before", ["virtual:roomy"], mid_model, adb_port, phone_home, {"cache_mb": [0]}),
                 tmp_path / "before", progress_stream=io.StringIO())
    c = vcampaign("hot", ["virtual:roomy"], mid_model, adb_port, phone_home, {"cache_mb": [0]},
                  gate={"cpu_temp_max_c": 5.0, "max_wait_s": 0.5, "poll_s": 0.2})
    run_campaign(c, tmp_path / "out", progress_stream=io.StringIO())
    (r,) = records(tmp_path / "out")
    assert r["outcome"] == "ok" and r["gate"]["gave_up"] is True
    assert "is not under 5 °C" in r["gate"]["reason"] and r["gate"]["cpu_temp_mc"] > 5000
    # a second campaign finds engine and model already on the phone
    assert r["pushed"] == []


def test_push_failures_are_retried_with_backoff_and_every_attempt_is_kept(tmp_path, phones, adb_port, phone_home,
                                                                          mid_model):
    staged_out = phones["roomy"].root / WORK_DIR.lstrip("/") / "out"
    # made by the phone's shell user (whichever tests ran on this phone before, if any): the folders
    # above it as a campaign's own would be, then a file where the output folder goes
    shell = the_phone(adb_port, phones["roomy"]).shell
    out_dir = shlex.quote(f"{WORK_DIR}/out")
    assert shell(f"mkdir -p {shlex.quote(WORK_DIR)} && rm -rf {out_dir} && "
                 f"echo 'a file where the output folder should be' > {out_dir}")[0] == 0
    c = vcampaign("push", ["virtual:roomy"], mid_model, adb_port, phone_home, {"cache_mb": [0]},
                  run={"retries": 2, "retry_backoff_s": 0.05})
    out = tmp_path / "out"
    try:
        t0 = time.monotonic()
        status = run_campaign(c, out, progress_stream=io.StringIO())
        assert time.monotonic() - t0 >= 0.05 + 0.1               # two backoffs
    finally:
        staged_out.unlink()
    assert status.pending == 1 and status.attempts == 3 and status.outcomes == {"push_failed": 1}
    first = records(out)
    assert [r["outcome"] for r in first] == ["push_failed"] * 3 and [r["attempt"] for r in first] == [1, 2, 3]
    assert "mkdir failed" in first[0]["evidence"][0]
    status = run_campaign(c, out, progress_stream=io.StringIO())
    assert status.complete and status.attempts == 4
    lines = [json.loads(x) for x in (out / "ledger.jsonl").read_text().splitlines()]
    assert [(x["attempt"], x["outcome"]) for x in lines] == [(1, "push_failed"), (2, "push_failed"),
                                                             (3, "push_failed"), (4, "ok")]


def test_a_phone_lost_mid_run_is_device_lost_and_retried(tmp_path, adb_port, phone_home, mid_model, tiny_model):
    from devices.virtual import manager

    manager.up("flaky", 256 << 20, home=phone_home, adb_host="127.0.0.1", adb_port=adb_port)
    try:
        phone_ns = manager.info("flaky", phone_home).mount_namespace   # its commands', not its daemon's
        c = vcampaign("lost", ["virtual:flaky"], tiny_model, adb_port, phone_home, {"cache_mb": [0, "auto"]},
                      run={"n_predict": 2000, "retries": 1, "retry_backoff_s": 0.1})
        c = parse_campaign(dict(json.loads(json.dumps(c.to_dict())), models={"tiny": str(tiny_model)}), "lost.toml")
        result: list = []
        worker = threading.Thread(target=lambda: result.append(run_campaign(c, tmp_path / "out",
                                                                            progress_stream=io.StringIO())))
        worker.start()
        deadline = time.monotonic() + 60
        engine = None
        while engine is None and time.monotonic() < deadline:
            for p in psutil.process_iter(["name", "pid"]):
                if p.info["name"] == "bmoe-py":
                    try:
                        if os.readlink(f"/proc/{p.info['pid']}/ns/mnt") == phone_ns:
                            engine = p.info["pid"]
                    except OSError:
                        pass
            time.sleep(0.05)
        assert engine is not None, "the engine never started on the phone"
        manager.down("flaky", home=phone_home, adb_host="127.0.0.1", adb_port=adb_port)
        worker.join(120)
        assert not worker.is_alive()
    finally:
        if manager.info("flaky", phone_home).running:
            manager.down("flaky", home=phone_home, adb_host="127.0.0.1", adb_port=adb_port)
    (status,) = result
    recs = sorted(records(tmp_path / "out"), key=lambda r: r["started_at"])
    assert [(r["outcome"], r["attempted"]) for r in recs] == [("device_lost", True)] * 2 + [("device_lost", False)]
    assert recs[0]["cell_id"] == recs[1]["cell_id"] != recs[2]["cell_id"]
    assert "lost" in recs[0]["evidence"][0]
    assert recs[2]["evidence"][0].startswith("not attempted: virtual:flaky was lost at cell ")
    assert status.pending == 2 and status.attempts == 2 and status.outcomes == {"device_lost": 2}
    assert campaign_status(tmp_path / "out").devices[0].outcomes == {"device_lost": 2}


def test_a_phone_stopped_mid_campaign_loses_its_cells_and_a_rerun_runs_only_those(tmp_path, phones, adb_port,
                                                                                   phone_home, tiny_model):
    """One phone stopped mid-campaign -> its cells are device_lost while the other phone
    finishes; back up, a rerun runs only its missing cells; the ledger keeps every attempt."""
    from devices.virtual import manager

    manager.up("flaky2", 256 << 20, home=phone_home, adb_host="127.0.0.1", adb_port=adb_port)
    out = tmp_path / "out"
    c = vcampaign("lossy", ["virtual:flaky2", "virtual:roomy"], tiny_model, adb_port, phone_home,
                  {"cache_mb": [0, "auto", "cycle*1.2", "cycle*4"]},
                  run={"n_predict": 48, "retries": 1, "retry_backoff_s": 0.1})
    c = parse_campaign(dict(json.loads(json.dumps(c.to_dict())), models={"tiny": str(tiny_model)}), "lossy.toml")

    def ledger() -> list[dict]:
        path = out / "ledger.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def flaky_ran() -> bool:
        return any(json.loads((out / r["run_dir"] / "run.json").read_text())["device"] == "virtual:flaky2"
                   for r in ledger())

    try:
        killer = stop_phone_when(flaky_ran, "flaky2", phone_home, adb_port)
        first = run_campaign(c, out, progress_stream=io.StringIO())
        killer.join(120)
        by_device = {d.device: d for d in first.devices}
        assert by_device["virtual:roomy"].outcomes == {"ok": 4} and by_device["virtual:roomy"].pending == 0
        flaky = sorted((r for r in records(out) if r["device"] == "virtual:flaky2"), key=lambda r: r["started_at"])
        outcomes = [(r["outcome"], r["attempted"]) for r in flaky]
        n_ok = outcomes.count(("ok", True))
        assert n_ok >= 1 and outcomes[:n_ok] == [("ok", True)] * n_ok
        lost_cells = {r["cell_id"] for r in flaky[n_ok:]}
        assert all(o == "device_lost" for o, _ in outcomes[n_ok:]) and len(lost_cells) == 4 - n_ok >= 2
        assert ("device_lost", False) in outcomes              # cells the lost phone never reached
        assert by_device["virtual:flaky2"].pending == 4 - n_ok

        manager.up("flaky2", 256 << 20, home=phone_home, adb_host="127.0.0.1", adb_port=adb_port)
        before = ledger()
        second = run_campaign(c, out, progress_stream=io.StringIO())
        assert second.complete and second.outcomes == {"ok": 8}
        new = ledger()[len(before):]
        assert {r["cell_id"] for r in new} == lost_cells and all(r["outcome"] == "ok" for r in new)
        assert ledger()[:len(before)] == before                    # every earlier attempt is still there
        assert len(ledger()) == len(before) + len(lost_cells)
    finally:
        if manager.info("flaky2", phone_home).running:
            manager.down("flaky2", home=phone_home, adb_host="127.0.0.1", adb_port=adb_port)


def test_an_unattached_serial_is_an_unknown_device(phones, adb_port, phone_home, mid_model):
    c = vcampaign("unk", ["R58NOTHERE"], mid_model, adb_port, phone_home, {"cache_mb": [0]})
    with pytest.raises(CampaignError) as e:
        resolve_devices(c)
    message = str(e.value)
    assert message.startswith('unk.toml: fleet.devices[0]: unknown device "R58NOTHERE": not attached to adb server '
                              f"127.0.0.1:{adb_port}")
    assert phones["roomy"].serial in message and "\n" not in message


def test_one_phone_under_two_names_takes_one_lock(tmp_path, phones, adb_port, phone_home, mid_model):
    by_name = resolve_devices(vcampaign("a", ["virtual:roomy"], mid_model, adb_port, phone_home, {"cache_mb": [0]}))
    by_serial = vcampaign("b", [], mid_model, adb_port, phone_home, {"cache_mb": [0]}, connect=[phones["roomy"].serial])
    (ref,) = resolve_devices(by_serial)
    assert ref.serial == by_name[0].serial and ref.lock_key == by_name[0].lock_key
    lock = device_lock(fleet_home(), by_name[0])
    lock.acquire(0, {"pid": os.getpid(), "host": "here", "dir": "/elsewhere", "since": time.time()})
    try:
        with pytest.raises(LockBusy, match=f"device {phones['roomy'].serial} is in use by another campaign"):
            run_campaign(by_serial, tmp_path / "out")
    finally:
        lock.release()
    assert not (tmp_path / "out").exists()


def test_run_oom_score_adj_starts_the_engine_at_an_apps_adj(tmp_path, phones, adb_port, phone_home, mid_model):
    """run.oom_score_adj = 900 (a cached app's): the engine runs at it, and the kernel's OOM killer,
    which ranks by it (lmkd never considers a shell's process, whatever its adj), names that adj when
    the resident run is killed; a userdebug phone lets the shell read the kernel's line (a user
    build would not). run.json records the adj, and the recorded argv stays the engine's own (what a
    recommendation prints)."""
    from devices.virtual import manager

    manager.up("tightdbg", 84 << 20, model="Redmi Note 12", android=13, build="userdebug", home=phone_home,
               adb_host="127.0.0.1", adb_port=adb_port)
    try:
        c = vcampaign("adj", ["virtual:tightdbg"], mid_model, adb_port, phone_home, {"cache_mb": ["resident"]},
                      run={"oom_score_adj": 900})
        assert 'oom_score_adj = 900' in c.to_toml()
        out = tmp_path / "out"
        run_campaign(c, out, progress_stream=io.StringIO())
    finally:
        manager.down("tightdbg", home=phone_home, adb_host="127.0.0.1", adb_port=adb_port)
    (killed,) = records(out)
    assert killed["outcome"] == "killed" and killed["oom_score_adj"] == 900, killed["evidence"]
    assert killed["argv"][0] == f"{WORK_DIR}/bmoe-py" and "oom_score_adj" not in " ".join(killed["argv"])
    assert not [line for line in killed["evidence"] if "lowmemorykiller" in line], killed["evidence"]
    kernel = [e for e in killed["lmk_events"] if e["source"] == "kernel-oom" and e["pid"] == killed["pid"]]
    assert kernel and kernel[0]["oom_score_adj"] == 900, killed["lmk_events"]
    with pytest.raises(CampaignError, match=r"run\.oom_score_adj.*must be at least 0, got -100"):
        vcampaign("adj-", ["virtual:tight"], mid_model, adb_port, phone_home, {"cache_mb": [0]},
                  run={"oom_score_adj": -100})
