"""A phone read and written as a real one is, through the real adb server and a virtual phone:
pushes past 4 GiB, the room on the phone, adbd's refusals, the pushed copy verified; the thermal
zone the gate and the sampler use; the page size; the engines lost runs leave behind, killed by pid.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from devices.adb.phone import AdbPhone
from devices.adb.runs import RUN_PID_PREFIX
from devices.base import DeviceError, PushRefused, RunInterrupted
from harness.campaign.model import GateSettings
from harness.run.gate import cool
from tests.devices.conftest import host_pid

SPARSE_BYTES = 5 << 30                 # past sync STAT v1's 32-bit size
HUGE_BYTES = 8 << 40                   # more than any test host's disk has free
# sha256 of SPARSE_BYTES zero bytes (`truncate -s 5G f && sha256sum f`)
ZEROS_5GIB_SHA256 = "7f06c62352aebd8125b2a1841e2b9e1ffcbed602f381c3dcb3200200e383d1d5"


@pytest.fixture(scope="module")
def phone(phones, server) -> AdbPhone:
    return AdbPhone(phones["b"].serial, server)


def on_phone(phones, remote: str) -> Path:
    """A phone's file as this host sees it (its folder is the phone's `/`)."""
    return Path(phones["b"].root) / remote.lstrip("/")


def test_a_model_past_4_gib_the_phone_holds_is_not_pushed_again(phone, phones, tmp_path):
    """sync's STAT v1 answers a 32-bit size: a 5 GiB model (sparse here, on both sides) read as
    1 GiB there and was sent again on every check. The phone's copy is put in place and stamped
    directly, as an earlier push would have left it; the push then sends 0 bytes."""
    remote = "/data/local/tmp/bmoe/big/sparse5g.gguf"
    local = tmp_path / "sparse5g.gguf"
    with open(local, "wb") as fh:
        fh.truncate(SPARSE_BYTES)
    copy = on_phone(phones, remote)
    assert phone.shell("mkdir -p /data/local/tmp/bmoe/big")[0] == 0      # the shell user's folders, as a push's
    with open(copy, "wb") as fh:
        fh.truncate(SPARSE_BYTES)
    os.chown(copy, 2000, 2000)
    try:
        # the stamp a push of these bytes left, and this host's hash of them as the push keeps it (reading
        # 5 GiB of holes costs ~12 s here: the hash is not what this test is about, the size check is)
        st = local.stat()
        phone._hash_cache[(str(local), st.st_size, st.st_mtime_ns)] = ZEROS_5GIB_SHA256
        phone._stamp(remote, ZEROS_5GIB_SHA256)
        sent: list[tuple[int, int]] = []
        inode = copy.stat().st_ino
        assert phone.push(str(local), remote, progress=lambda d, t: sent.append((d, t))) is False
        assert sent == [] and copy.stat().st_ino == inode and phone.file_size(remote) == SPARSE_BYTES
    finally:
        copy.unlink(missing_ok=True)


def test_a_push_the_phone_has_no_room_for_is_refused_before_a_byte_is_sent(phone, phones, tmp_path):
    remote = "/data/local/tmp/bmoe/huge/huge.gguf"
    local = tmp_path / "huge.gguf"
    with open(local, "wb") as fh:
        fh.truncate(HUGE_BYTES)
    st = os.statvfs(phones["b"].root)
    assert st.f_bfree * st.f_frsize < HUGE_BYTES          # else this host could hold it: no refusal to see
    sent: list[int] = []
    with pytest.raises(PushRefused) as refused:
        phone.push(str(local), remote, progress=lambda d, t: sent.append(d))
    said = str(refused.value)
    assert said.startswith(f"{phone.serial}: no room for huge.gguf in /data/local/tmp/bmoe/huge: it needs "
                           f"{HUGE_BYTES / (1 << 20):,.1f} MiB, the phone has ")
    assert said.endswith(" MiB free there") and "\n" not in said
    assert sent == [] and not on_phone(phones, remote + ".partial").exists()


def test_adbds_refusal_is_read_whole_and_a_permanent_one_is_marked_so(phone, phones, tmp_path):
    """adbd's FAIL carries its reason ("couldn't create file: Permission denied",
    daemon/file_sync_service.cpp); one another try cannot change is a PushRefused."""
    local = tmp_path / "x.bin"
    local.write_bytes(os.urandom(200 << 10))
    with pytest.raises(PushRefused, match=r": push of x\.bin to /data/misc/x\.bin\.partial refused: couldn't create "
                                          r"file: Permission denied \(not retried: another try cannot change it\)$"):
        phone.push(str(local), "/data/misc/x.bin")          # root's folder, 0771: the shell user may not write
    # a directory where the file should go: EISDIR, also for good
    assert phone.shell("mkdir -p /data/local/tmp/bmoe/isdir/x.bin.partial")[0] == 0
    blocker = on_phone(phones, "/data/local/tmp/bmoe/isdir/x.bin.partial")
    (blocker / "keep").write_text("x")
    with pytest.raises(PushRefused, match=r"couldn't create file: Is a directory"):
        phone.push(str(local), "/data/local/tmp/bmoe/isdir/x.bin")


def test_the_pushed_copy_is_verified_before_it_is_used(phone, phones, tmp_path):
    """The file changes on this host while it is sent (its first 64 KiB go out as they were): the
    phone's copy is not the file, the push says so naming both sums, and nothing is put in place."""
    local = tmp_path / "moving.bin"
    local.write_bytes(os.urandom(1 << 20))
    remote = "/data/local/tmp/bmoe/verify/moving.bin"

    def rewrite(done: int, total: int) -> None:
        if done == 64 << 10:
            with open(local, "r+b") as fh:
                fh.write(os.urandom(1 << 20))
    with pytest.raises(DeviceError) as bad:
        phone.push(str(local), remote, progress=rewrite)
    said = str(bad.value)
    new_sha = hashlib.sha256(local.read_bytes()).hexdigest()
    assert "the phone's copy of moving.bin is not the file sent" in said and new_sha in said
    assert not isinstance(bad.value, PushRefused)          # a retry may well succeed
    assert not on_phone(phones, remote).exists() and not on_phone(phones, remote + ".partial").exists()
    # sent again unchanged, it is verified, placed and skipped the next time
    assert phone.push(str(local), remote) is True and on_phone(phones, remote).read_bytes() == local.read_bytes()
    assert phone.push(str(local), remote) is False


def test_the_gate_and_the_sampler_use_one_zone_never_a_trip_point(phone, phones):
    """A `cpu-hw-trip-*` zone reads a constant 95 °C on production phones; a vendor zone in °C.
    The gate's state and the run's samples take the same CPU zone, never the trip point, and the
    gate's record (run.json `gate`) names it."""
    base = Path(phones["b"].root) / "sys/class/thermal"
    added = [base / "thermal_zone90", base / "thermal_zone91"]
    for zone, (kind, value) in zip(added, (("cpu-hw-trip-9", "95000"), ("cpuss-vendor-c", "30"))):
        zone.mkdir(exist_ok=True)
        (zone / "type").write_text(kind + "\n")
        (zone / "temp").write_text(value + "\n")
    try:
        state = phone.state()
        assert state.thermal_mc["cpu-hw-trip-9"] == 95000 and state.thermal_mc["cpuss-vendor-c"] == 30000
        assert state.cpu_zone is not None and "trip" not in state.cpu_zone and state.cpu_temp_mc < 95000
        assert state.to_dict()["zones_ignored"]["cpu-hw-trip-9"].startswith("a trip point")
        gate = cool(phone, GateSettings(cpu_temp_max_c=45.0, max_wait_s=2.0, poll_s=0.5), ["bmoe-py"])
        assert not gate.gave_up and gate.to_dict()["cpu_zone"] == gate.entry_state.cpu_zone
        out = phone.run(["sleep", "2.5"], sample_period_s=0.5)
        temps = [s.cpu_temp_mc for s in out.samples]
        assert temps and all(t is not None and t < 95000 for t in temps)
    finally:
        for zone in added:
            shutil.rmtree(zone, ignore_errors=True)


def test_the_page_size_is_the_phones_own(phone):
    assert phone.identity().page_size_bytes == mmap.PAGESIZE     # a virtual phone runs on this host's kernel


def test_an_engine_a_lost_run_left_is_killed_by_pid_at_the_next_contact(phone, phones, server, tmp_path):
    """adbd hangs up the shell alone when a run's stream closes (daemon/shell_service.cpp); an
    engine that lives on (here one that ignores SIGHUP) keeps its memory. The run left a pid file
    with its start time in the work dir; the next contact (the gate) kills it by pid. A pid file
    whose start time is not the process's (a reused pid), or whose process has another name, kills
    nothing."""
    assert phone.shell("mkdir -p /data/local/tmp/reap /data/local/tmp/bmoe")[0] == 0
    engine = Path(phones["b"].root) / "data/local/tmp/reap/bmoe-py"    # a #! script: named after itself
    engine.write_text("#!/system/bin/sh\ntrap '' HUP\nwhile :; do sleep 1; done\n")
    engine.chmod(0o755)
    work = Path(phones["b"].root) / "data/local/tmp/bmoe"
    stop = threading.Event()
    lost = AdbPhone(phone.serial, server)
    lost.watch(30.0, stop)
    ended: list[BaseException] = []

    def run() -> None:
        try:
            lost.run(["/data/local/tmp/reap/bmoe-py"])
        except BaseException as e:      # kept for the assertion below
            ended.append(e)
    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 20
    while not list(work.glob(RUN_PID_PREFIX + "*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    (pid_file,) = work.glob(RUN_PID_PREFIX + "*")
    pid = int(pid_file.name.rpartition(".")[2])
    stop.set()                                   # the campaign's Ctrl-C: the stream is closed
    thread.join(timeout=30)
    assert ended and isinstance(ended[0], RunInterrupted)
    other = None
    try:
        time.sleep(1.0)                          # the hang-up has reached the shell
        on_host = host_pid(phones["b"].root, pid)          # the phone's pid is its own namespace's
        assert Path(f"/proc/{on_host}/comm").read_text().strip() == "bmoe-py" and pid_file.exists()
        # a stale file naming a live process of another start time, and one of another name: left alone
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        (work / f"{RUN_PID_PREFIX}{other.pid}").write_text(f"{other.pid} 1\n")
        decoy = work / f"{RUN_PID_PREFIX}1"
        init_stat = phone.shell("cat /proc/1/stat")[1].decode()          # the phone's init, its start time
        decoy.write_text(f"1 {init_stat.rpartition(') ')[2].split()[19]}\n")
        gate = cool(phone, GateSettings(max_wait_s=1.0), ["bmoe-py"])
        assert gate.reaped == (pid,) and gate.to_dict()["reaped_pids"] == [pid] and gate.strays_stopped == 0
        deadline = time.monotonic() + 10
        while Path(f"/proc/{on_host}").exists() and Path(f"/proc/{on_host}/stat").read_text().split(") ")[1][0] != "Z" \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{on_host}").exists() or \
            Path(f"/proc/{on_host}/stat").read_text().split(") ")[1][0] == "Z"
        assert other.poll() is None and not pid_file.exists()
        assert not (work / f"{RUN_PID_PREFIX}{other.pid}").exists()     # stale: removed, its process spared
        assert decoy.exists()                                           # init lives on, not an engine: kept
        assert phone.reap_lost(["bmoe-py"]) == []
    finally:
        for f in work.glob(RUN_PID_PREFIX + "*"):
            f.unlink()
        if other is not None:
            other.kill()
            other.wait()
        with contextlib.suppress(ProcessLookupError):   # the engine, should the reap have failed
            os.kill(pid, signal.SIGKILL)
