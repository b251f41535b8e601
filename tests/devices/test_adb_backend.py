"""devices.adb.server against virtual phones through the real adb server: the same code path as a phone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from devices.adb.files import STAMP_DIR
from devices.adb.phone import AdbPhone
from devices.base import Device, DeviceLost, pressure_metrics
from devices.virtual import manager
from harness.cli.main import main

# the pause lets the phone's lmkd (10 Hz) see the process before the kernel kills it: a process it
# never saw is named by its comm ("python"), as the kernel's line names it
ALLOC = ("import time; time.sleep(0.3); b = bytearray({mib} << 20); b[::4096] = b'x' * len(b[::4096]); "
         "print('held', flush=True); time.sleep({hold_s})")


@pytest.fixture(scope="module")
def phone(phones, server) -> AdbPhone:
    return AdbPhone(phones["a"].serial, server)


def test_satisfies_the_device_protocol(phone):
    assert isinstance(phone, Device)


def test_identity_and_state_come_from_the_phone(phone, phones):
    ident = phone.identity()
    assert (ident.model, ident.manufacturer, ident.abi) == ("Pixel 8", "bmoe", "arm64-v8a")
    assert ident.soc == "tensor-g3" and ident.android_release == "14" and ident.sdk == 34
    assert ident.ram_total_kb == phones["a"].ram_bytes // 1024
    st = phone.state()
    assert 0 < st.mem_available_kb <= ident.ram_total_kb
    assert st.cpu_temp_mc is not None and st.battery_temp_dc is not None
    assert st.cpufreq and all(p.cpuinfo_max_khz for p in st.cpufreq)


def test_run_status_streams_and_quoting(phone):
    chunks = []
    out = phone.run(["sh", "-c", "echo out; echo err >&2; exit 3"], on_stdout=chunks.append)
    assert out.exit_status == 3 and out.stdout == b"out\n" and out.stderr == b"err\n"
    assert b"".join(chunks) == b"out\n" and out.pid
    tricky = ["a b", "$HOME", "'q'", '"dq"', "x;y", "`id`", "*"]
    out = phone.run(["sh", "-c", 'printf "%s|" "$@"', "sh", *tricky])
    assert out.stdout.decode() == "|".join(tricky) + "|"


def test_environment_is_set_and_bmoe_variables_are_scrubbed(phone):
    out = phone.run(["sh", "-c", 'echo "[$FOO][${BMOE_CACHE_MB-unset}]"'], env={"FOO": "bar baz"})
    assert out.stdout == b"[bar baz][unset]\n"
    # The wrapper itself, run by a local sh whose environment carries BMOE_* variables.
    cmd = phone.wrapper_command(["sh", "-c", 'env | grep ^BMOE_ | sort; echo done'], None, None, "BMOE_")
    local = subprocess.run(["sh", "-c", cmd], capture_output=True,
                           env={"PATH": os.environ["PATH"], "BMOE_CACHE_MB": "1000", "BMOE_IO_THREADS": "8"})
    assert local.stdout == b"done\n" and local.returncode == 0


def test_timeout_kills_the_process(phone):
    out = phone.run(["sleep", "30"], timeout_s=1.0)
    assert out.timed_out and out.exit_status == 137 and out.wall_s < 15


def test_pressure_is_sampled(phone):
    before = phone.state()
    out = phone.run([sys.executable, "-c", ALLOC.format(mib=64, hold_s=2.5)], sample_period_s=0.5)
    after = phone.state()
    assert out.exit_status == 0 and out.samples
    m = pressure_metrics(before, out.samples, after)
    assert m["peak_rss_kb"] > 64 * 1024
    assert m["mem_avail_floor_kb"] < m["mem_avail_before_kb"]


def test_push_skips_what_is_there_and_resends_what_changed(phone, tmp_path):
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(3 << 20))
    remote = "/data/local/tmp/bmoe/test/model.bin"
    progress = []
    assert phone.push(str(src), remote, progress=lambda d, t: progress.append((d, t))) is True
    assert progress[-1] == (3 << 20, 3 << 20)
    assert phone.push(str(src), remote) is False
    src.write_bytes(os.urandom(3 << 20))
    assert phone.push(str(src), remote) is True
    back = tmp_path / "back.bin"
    phone.pull(remote, str(back))
    assert back.read_bytes() == src.read_bytes()
    assert phone.remote_sha256(remote) is not None


def test_a_files_stamp_spares_the_next_check_and_goes_stale_when_the_file_changes(phone, phones, tmp_path):
    """The sha256 a push records beside the file answers the next check without reading the file;
    a stamp is trusted only while the file is the one it describes (size, mtime, inode)."""
    import hashlib
    import shlex

    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(2 << 20))
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    remote = "/data/local/tmp/bmoe/stamped/stamped.bin"
    stamp = phone._stamp_path(remote)
    assert stamp.startswith(STAMP_DIR + "/")
    assert phone.push(str(src), remote) is True
    assert phone.stamped_sha256(remote) == sha
    assert phone.push(str(src), remote) is False
    # the file's own folder gains nothing
    assert phone.shell("ls -a /data/local/tmp/bmoe/stamped")[1].split() == [b".", b"..", b"stamped.bin"]
    # the stamp is what answers: one that names other bytes (the file unchanged) makes it send again
    status, out, _ = phone.shell(f"cat {shlex.quote(stamp)}")
    assert status == 0
    key = out.decode().rpartition(" ")[0]
    phone.shell(f"echo {shlex.quote(key + ' ' + '0' * 64)} > {shlex.quote(stamp)}")
    assert phone.stamped_sha256(remote) == "0" * 64
    assert phone.push(str(src), remote) is True and phone.stamped_sha256(remote) == sha
    # a write in place, same size, in the same second (through the phone's folder on this host: its
    # shell has no dd): the stamp is stale, the file is hashed again
    with open(Path(phones["a"].root) / remote.lstrip("/"), "r+b") as fh:
        fh.seek(7)
        fh.write(b"x")
    assert phone.stamped_sha256(remote) is None
    assert phone.push(str(src), remote) is True
    back = tmp_path / "back.bin"
    phone.pull(remote, str(back))
    assert back.read_bytes() == src.read_bytes() and phone.stamped_sha256(remote) == sha
    # no stamp at all (a file put there by hand): hashed, and stamped for next time
    phone.shell(f"rm -f {shlex.quote(stamp)}")
    assert phone.push(str(src), remote) is False and phone.stamped_sha256(remote) == sha


def test_a_process_past_the_phones_ram_is_killed_by_the_kernel_and_lmkd_says_nothing(phones, server):
    """lmkd kills only what ActivityManager registered (devices/virtual/lmkd.py): a process the
    shell started past the phone's RAM is the kernel's OOM kill, with no lmkd line or killinfo for
    the harness to find (a kernel line at most, where the shell may read the kernel's log)."""
    from devices.virtual import logbuf

    small = AdbPhone(phones["c"].serial, server)  # 256 MiB
    since = time.time()
    out = small.run([sys.executable, "-c", ALLOC.format(mib=700, hold_s=5)])
    assert out.exit_status == 137 and b"held" not in out.stdout
    assert {e.source for e in small.lmk_events(since) if e.pid == out.pid} <= {"kernel-oom"}
    deadline = time.monotonic() + 5
    while not [e for e in logbuf.read(phones["c"].root, ["kernel"]) if f"Killed process {out.pid} " in e.message]:
        assert time.monotonic() < deadline, "no kernel line for the killed process in the phone's kernel buffer"
        time.sleep(0.1)
    # an earlier kill is not reported as this one's
    assert all(e.pid != out.pid for e in small.lmk_events(time.time() + 60))


def test_the_kernel_oom_killers_line_in_logcats_kernel_buffer_reaches_the_harness(phones, server, make_phone):
    """dmesg is refused to the shell user, so the kernel's own OOM kill (the backstop on a phone
    with swap) reaches the harness only through logcat's kernel buffer, which lmk_events reads:
    on a userdebug build, whose logd keeps the kernel's log. A user build's (phones["b"], as phones
    are sold) holds none (logd/main.cpp ro.logd.kernel): there the kill reaches it as a bare SIGKILL."""
    from devices.virtual import logbuf

    debug = make_phone("kernlog", 128 << 20, build="userdebug")
    for p, shown in ((debug, True), (phones["b"], False)):
        phone = AdbPhone(p.serial, server)
        since = time.time()
        pid = 4_000_000 + os.getpid() % 100_000          # no process of this host has it
        logbuf.append(p.root, "kernel", "kernel",
                      f"Memory cgroup out of memory: Killed process {pid} (bmoe-py) total-vm:0kB, anon-rss:123456kB, "
                      "file-rss:0kB, shmem-rss:0kB, UID:2000 pgtables:0kB oom_score_adj:0", priority="E", pid=0, tid=0)
        events = [e for e in phone.lmk_events(since) if e.pid == pid]
        assert [(e.source, e.name, e.rss_kb) for e in events] == ([("kernel-oom", "bmoe-py", 123456)] if shown else [])
        assert not [e for e in phone.lmk_events(time.time() + 60) if e.pid == pid]   # an old line is not new


def test_a_phone_that_vanishes_mid_run_raises_device_lost(make_phone, server, adb_server, phone_home):
    p = make_phone("vanish", 256 << 20)
    dev = AdbPhone(p.serial, server)
    errors = []

    def run():
        try:
            dev.run(["sleep", "60"])
        except Exception as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    time.sleep(1.5)
    manager.down(p.name, home=phone_home, adb_host="127.0.0.1", adb_port=adb_server.port)
    t.join(timeout=30)
    assert not t.is_alive() and errors and isinstance(errors[0], DeviceLost)


def test_calls_to_a_phone_the_server_does_not_know_leave_no_socket_open(server):
    import gc
    import warnings

    gone = AdbPhone("127.0.0.1:9", server)                  # never connected: the server answers FAIL
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for call in (lambda: gone.shell("true"), lambda: gone.run(["true"]), gone.state):
            with pytest.raises(DeviceLost, match="device lost"):
                call()
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_devices_command_lists_host_and_phones(phones, adb_server):
    result = CliRunner().invoke(main, ["devices", "--adb", f"127.0.0.1:{adb_server.port}", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    serials = {d["identity"]["serial"]: d for d in data["devices"]}
    assert "local" in serials
    for p in phones.values():
        assert serials[p.serial]["identity"]["model"] == p.model
        assert serials[p.serial]["state"]["mem_available_kb"] > 0
    text = CliRunner().invoke(main, ["devices", "--adb", f"127.0.0.1:{adb_server.port}"]).output
    assert "Galaxy S24" in text and "local" in text


def test_a_frozen_phone_is_lost_outside_a_run_within_the_watchs_silence(make_phone, server, phone_home, tmp_path):
    """Between runs too: the gate's state read, a push's stat and a pull on a phone
    whose adbd is frozen (SIGSTOP) each fail as DeviceLost after the watch's silence (2 s here),
    not after the 30-60 s socket timeouts they had."""
    import signal

    p = make_phone("frz", 128 << 20)
    dev = AdbPhone(p.serial, server)
    dev.watch(2.0)
    dev.state()                                      # answers while it runs
    src = tmp_path / "m.bin"
    src.write_bytes(b"x" * 4096)
    daemon = manager.info("frz", phone_home).pid
    os.kill(daemon, signal.SIGSTOP)
    try:
        for call in (dev.state, lambda: dev.push(str(src), "/data/local/tmp/m.bin"),
                     lambda: dev.pull("/data/local/tmp/nothing", str(tmp_path / "back"))):
            t0 = time.monotonic()
            with pytest.raises(DeviceLost):
                call()
            assert time.monotonic() - t0 < 8.0
    finally:
        os.kill(daemon, signal.SIGCONT)
    dev.state()                                      # and answers again after the thaw
