"""A virtual phone's own zram, cores and cleanup (docs/decisions/vphone-zram.md), through the real adb server.

- `--cpus 1`: nproc, /sys/devices/system/cpu/online and /proc/cpuinfo all say one core, `-t auto`
  resolves to 1; two such phones get different cores.
- zram: with --zram 0, a budget that with a cached app is past the phone's RAM is killed (bmoe-cli).
  The swapping cases (a budget past the RAM left running on while swapping, zram exhausted, no
  zram) are tests/devices/test_vphone_swapping.py.
- After `down --all`, and after a daemon is SIGKILLed and the phone comes up again: no zram device,
  swap or cgroup of the phone is left; nor after a start that timed out, whose error says where
  the daemon was. A running daemon asked for its stacks writes them and serves on.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from devices.virtual import cgroup as cgroups
from devices.virtual import manager, pacedfs, zram
from engine.gguf.synth import synth_options, write_model
from engine.units import MIB
from harness.campaign.file import parse_campaign
from harness.plan.grid import auto_threads
from harness.run.cpushare import CPU_SCRIPT, parse_cpu_report
from harness.run.runner import run_campaign
from tests.devices.conftest import needs_zram

PROMPT = ("The expert cache of a mixture-of-experts model holds the weights that the router picked for recent "
          "tokens; below one token cycle it evicts what it needs next, and above the phone's memory the "
          "low-memory killer takes the process.")




def shell(adb_server, phone, command: str) -> str:
    return adb_server.run("-s", phone.serial, "shell", command).stdout.decode()


def test_a_one_core_phone_says_one_core_everywhere(adb_server, make_phone):
    a = make_phone("c1a", 64 * MIB, cpus=1)
    b = make_phone("c1b", 64 * MIB, cpus=1)
    cores = {}
    for phone in (a, b):
        assert shell(adb_server, phone, "nproc").strip() == "1"
        online = shell(adb_server, phone, "cat /sys/devices/system/cpu/online").strip()
        processors = [line for line in shell(adb_server, phone, "cat /proc/cpuinfo").splitlines()
                      if line.startswith("processor")]
        assert len(processors) == 1 and processors[0].split(":")[1].strip() == online
        # what the harness reads before a run, and what -t auto becomes
        seen = parse_cpu_report(shell(adb_server, phone, CPU_SCRIPT))
        assert seen.cores == seen.cores_online == seen.cores_usable == 1 and auto_threads(seen.cores) == 1
        assert seen.cpus == frozenset({int(online)})    # the cpuset, which the CPU ledger compares
        cores[phone.name] = online
    if len(os.sched_getaffinity(0)) >= 2:
        assert cores["c1a"] != cores["c1b"], cores       # phones share no core while the host has enough


def test_up_refuses_more_cores_than_the_host_has(adb_server, phone_home):
    too_many = len(os.sched_getaffinity(0)) + 1
    with pytest.raises(manager.VirtualPhoneError, match=f"--cpus {too_many} refused: this host has"):
        manager.up("toomany", 64 * MIB, home=phone_home, adb_host="127.0.0.1", adb_port=adb_server.port,
                   cpus=too_many)
    assert not (phone_home / "toomany" / ".vphone" / "state.json").exists()


@needs_zram
def test_a_phone_with_zram_swaps_into_it_and_its_files_say_so(adb_server, make_phone):
    phone = make_phone("swaps", 64 * MIB, zram_bytes=32 * MIB)
    # 72 MiB in a 64 MiB phone: the rest goes to its zram. Same-filled pages, which zram keeps in a few
    # bytes, so its charge to the RAM stays ~0 (random bytes would cost their size: a race with the charge)
    hold = (f"{sys.executable} -c 'import time; x = [bytes([i]) * (1 << 20) for i in range(72)]; time.sleep(1); "
            "print(open(\"/proc/self/status\").read().split(\"VmSwap:\")[1].split()[0])'")
    lines = shell(adb_server, phone, f"{hold}; cat /proc/vmstat; grep ^Swap /proc/meminfo").splitlines()
    assert lines and lines[0].strip().isdigit(), lines
    vmswap_kb = int(lines[0])
    vmstat = {f[0]: int(f[1]) for f in (line.split() for line in lines[1:]) if len(f) == 2}
    meminfo = {f[0].rstrip(":"): int(f[1]) for f in (line.split() for line in lines[1:]) if len(f) == 3}
    others = len(list(zram.REGISTRY.glob("zram*"))) > 1     # another phone's zram may take our pages
    assert vmswap_kb > 0, lines
    assert meminfo["SwapTotal"] == 32 * 1024 and 0 <= meminfo["SwapFree"] <= meminfo["SwapTotal"]
    assert vmstat["pswpout"] > 0 or others, vmstat
    assert vmstat["pgfault"] > 0 and "pgmajfault" in vmstat and "workingset_refault_anon" in vmstat


def _owned(root: Path) -> set[str]:
    """The zram devices this project made for the phone at root (other helpers' phones may swap too)."""
    out = set()
    for entry in zram.REGISTRY.glob("zram*"):
        if Path(entry.read_text().split("\n")[0]) == root.resolve():
            out.add(f"/dev/{entry.name}")
    return out


def _swaps() -> set[str]:
    return {line.split()[0] for line in Path("/proc/swaps").read_text().splitlines()[1:] if line.strip()}


def _phone_cgroups(leaf: str) -> list[Path]:
    found = []
    for mount, kind, _opts in cgroups._mounts():
        if kind == "cgroup":
            found.extend(Path(mount).rglob(leaf))
    return found


@needs_zram
def test_nothing_is_left_after_down_or_after_a_killed_daemon(adb_server, phone_home):
    kw = dict(home=phone_home, adb_host="127.0.0.1", adb_port=adb_server.port, zram_bytes=16 * MIB, cpus=1,
              storage_mbps=100)
    root = phone_home / "leak"
    manager.up("leak", 64 * MIB, **kw)
    leaf = cgroups.leaf_name("leak", root)
    try:
        state = json.loads((root / ".vphone/state.json").read_text())
        first = state["zram"]["device"]
        assert _owned(root) == {first} and first in _swaps()
        assert len(_phone_cgroups(leaf)) == 3                           # memory, cpuacct, cpuset
        flash_pid = int((root / ".vphone" / pacedfs.PID_FILE).read_text())   # its paced /data's server
        os.kill(state["pid"], signal.SIGKILL)                           # no stop: all of it is left
        while manager.info("leak", phone_home).running:
            time.sleep(0.05)
        assert _owned(root) == {first} and first in _swaps()
        assert not _alive(flash_pid), "the flash server outlived its daemon"
        manager.up("leak", 64 * MIB, **kw)                              # the next up reclaims it
        second = json.loads((root / ".vphone/state.json").read_text())["zram"]["device"]
        # the killed daemon's device is gone (its number may be reused, by this phone or another's)
        assert _owned(root) == {second} and second in _swaps()
    finally:
        # only this phone: phone_home is the session's, where phones["a"…"c"] live for later tests
        manager.down("leak", home=phone_home, adb_host="127.0.0.1", adb_port=adb_server.port)
    assert _owned(root) == set()
    assert second not in _swaps() or second in _owned_by_others(root)   # swapoff'd, unless reused since
    assert _phone_cgroups(leaf) == []
    assert not (root / ".vphone/zram.json").exists()


@needs_zram
def test_a_killed_daemon_whose_folder_is_gone_leaves_nothing_once_any_phone_comes_up(adb_server, phone_home,
                                                                                      tmp_path):
    """A daemon SIGKILLed (a host restart, a killed test run) whose phone folder was then deleted (a
    temporary folder cleaned): the next phone up, any phone, removes its zram device and its cgroups."""
    gone_home = tmp_path / "gone-home"
    kw = dict(adb_host="127.0.0.1", adb_port=adb_server.port, zram_bytes=16 * MIB, cpus=1)
    manager.up("gone", 64 * MIB, home=gone_home, **kw)
    root, leaf = gone_home / "gone", cgroups.leaf_name("gone", gone_home / "gone")
    state = json.loads((root / ".vphone/state.json").read_text())
    device = state["zram"]["device"]
    os.kill(state["pid"], signal.SIGKILL)
    while manager.info("gone", gone_home).running:
        time.sleep(0.05)
    assert len(_phone_cgroups(leaf)) == 3 and _owned(root) == {device}   # memory, cpuacct, cpuset; its zram
    shutil.rmtree(gone_home)
    try:
        manager.up("after", 64 * MIB, home=phone_home, **kw)
        assert _phone_cgroups(leaf) == [], "a dead daemon's cgroups outlived the next phone's start"
        assert not (cgroups.REGISTRY / leaf).exists()
        assert _owned(root) == set()
    finally:
        manager.down("after", home=phone_home, adb_host="127.0.0.1", adb_port=adb_server.port)
    assert _phone_cgroups(cgroups.leaf_name("after", phone_home / "after")) == []


@needs_zram
def test_a_daemon_that_does_not_serve_in_time_says_where_it_is_is_killed_and_leaves_nothing(adb_server,
                                                                                             phone_home):
    """A start that times out (a host too loaded, a daemon stuck in the kernel): the error says the
    daemon's state, it is killed, and the zram device and cgroups it had made are removed at once,
    not at some later start. Stuck here means stopped (SIGSTOP) once its zram is made."""
    root, leaf = phone_home / "stuck", cgroups.leaf_name("stuck", phone_home / "stuck")
    internal = root / ".vphone"
    (internal / "zram.json").unlink(missing_ok=True)
    stopped: list[int] = []

    def stop_it_once_its_zram_is_made():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not stopped:
            if (internal / "zram.json").exists():
                for pid in _daemons_of(root):
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
            time.sleep(0.01)

    stopper = threading.Thread(target=stop_it_once_its_zram_is_made)
    stopper.start()
    try:
        with pytest.raises(manager.VirtualPhoneError) as raised:
            manager.up("stuck", 64 * MIB, home=phone_home, adb_host="127.0.0.1", adb_port=adb_server.port,
                       zram_bytes=16 * MIB, timeout_s=4)
    finally:
        stopper.join()
    assert stopped, "the daemon never made its zram device"
    message = str(raised.value)
    assert "did not serve in 4 s (state T, " in message and "killed" in message, message
    assert "starting" in message, message           # its log's end
    assert not any(_alive(pid) for pid in stopped)
    assert _owned(root) == set() and _phone_cgroups(leaf) == [] and not (cgroups.REGISTRY / leaf).exists()
    assert not (internal / "zram.json").exists()


def test_a_running_daemon_asked_for_its_stacks_writes_them_to_its_log_and_serves_on(adb_server, make_phone):
    phone = make_phone("stacks", 64 * MIB)
    state = json.loads((Path(phone.root) / ".vphone/state.json").read_text())
    log = Path(phone.root) / ".vphone/daemon.log"
    before = log.stat().st_size
    os.kill(state["pid"], manager.STACKS_SIGNAL)
    deadline = time.monotonic() + 10
    while "(most recent call first)" not in log.read_text(errors="replace")[before:] and time.monotonic() < deadline:
        time.sleep(0.05)
    dump = log.read_text(errors="replace")[before:]
    assert "(most recent call first)" in dump and 'File "' in dump and "devices/virtual/run.py" in dump, dump
    assert shell(adb_server, phone, "echo still-serving").strip() == "still-serving"


def _daemons_of(root: Path) -> list[int]:
    """The daemons serving `root`, not their forks (its zram ballast, its pid namespace's init), which
    share its command line: a stopped fork is no stopped daemon, and the ballast stopped before it
    joins the phone's cgroups is a process no kill of the phone's reaches."""
    parents = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError, ValueError, StopIteration):
                cmdline = (proc / "cmdline").read_bytes()
                if b"devices.virtual.run" in cmdline and str(root).encode() + b"\0" in cmdline:
                    status = (proc / "status").read_text().splitlines()
                    parents[int(proc.name)] = int(next(s for s in status if s.startswith("PPid:")).split()[1])
    return [pid for pid, parent in parents.items() if parent not in parents]


def _alive(pid: int, wait_s: float = 10.0) -> bool:
    deadline = time.monotonic() + wait_s
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return Path(f"/proc/{pid}").exists()


def _owned_by_others(root: Path) -> set[str]:
    out = set()
    for entry in zram.REGISTRY.glob("zram*"):
        if Path(entry.read_text().split("\n")[0]) != root.resolve():
            out.add(f"/dev/{entry.name}")
    return out


# -- swapping runs -------------------------------------------------------------------------------
RAM = 84 * MIB
APP = "cached:24MiB:compressible"   # what else is open: compressible, as most of a phone's memory is
BIG_CACHE_MB = 64           # with the engine's own ~15 MiB and the app, past the phone's RAM (76: killed)


@pytest.fixture(scope="module")
def bank_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vmem-models") / "uniform96.gguf"
    write_model(path, synth_options("qwen3moe", size_bytes=96 << 20, seed=1, router_skew=0))
    return path


def _campaign(name, phone, adb_server, phone_home, model, engine: dict):
    data = {"version": 1, "name": name,
            "fleet": {"devices": [f"virtual:{phone}"], "virtual_home": str(phone_home),
                      "adb": [{"host": "127.0.0.1", "port": adb_server.port}]},
            "models": {"bank": str(model)}, "engine": engine,
            "axes": {"cache_mb": [0, BIG_CACHE_MB]},
            "run": {"n_predict": 6, "threads": 1, "prompt": PROMPT, "retries": 0}, "gate": {"max_wait_s": 2}}
    return parse_campaign(data, source=f"{name}.toml")


def _records(out: Path) -> dict[int, dict]:
    recs = [json.loads(p.read_text()) for p in out.glob("runs/*/*/run.json")]
    return {r["config"]["cache_mb"]: r for r in recs}


def test_without_zram_the_same_budget_is_killed(tmp_path, adb_server, make_phone, phone_home, bank_model, bmoe_cli):
    make_phone("noswap", RAM, zram_bytes=0, apps=(APP,))
    engine = {"kind": "native", "native": {"host": {"cli": str(bmoe_cli)}}}
    run_campaign(_campaign("nozram", "noswap", adb_server, phone_home, bank_model, engine), tmp_path / "nozram",
                 progress_stream=io.StringIO())
    by = _records(tmp_path / "nozram")
    assert by[0]["outcome"] == "ok" and by[BIG_CACHE_MB]["outcome"] in ("lmk_killed", "killed"), {
        k: (r["outcome"], r.get("evidence")) for k, r in by.items()}
