"""A virtual phone is an Android 12-15 production phone where the harness can tell: each test here
failed on the virtual phone before it was made so (docs/virtual-phones.md, "What a virtual phone
is faithful to").

- adbd writes -950 into every shell child (daemon/shell_service.cpp), its floor staying adbd's -1000;
- a closed stream hangs up the shell alone (Subprocess::PassDataStreams: SIGHUP to the pid, the
  pipes closed, no SIGKILL), so what it started in the background lives on until `virtual down`;
- `logcat -v epoch` pads the seconds as liblog does ("%19lld");
- killinfo carries lmkd's five PSI floats from Android 13 (killinfo_log);
- a constant 95000 `cpu-hw-trip-0` zone on every phone, and a vendor whose CPU zones count °C;
- `--page-size 16k`: getconf, the getprop table and /proc/vmstat's page counters in 16 KiB pages;
- `--data-quota`: a full /data fails pushes and shell writes with ENOSPC, and df shows the quota;
- `--build user|userdebug`: only a userdebug build's logd keeps the kernel's log.
"""

from __future__ import annotations

import os
import re
import shlex
import struct
import subprocess
import time
from pathlib import Path

import adbutils
import pytest
from click.testing import CliRunner

from devices.virtual import dataquota, logbuf, manager, tools
from devices.virtual.cgroup import MemStat
from devices.virtual.lmkd import Kill, Lmkd
from devices.virtual.meminfo import HOST_PAGE_BYTES, compute, vmstat_text
from devices.virtual.run import may_lower_oom_score_adj
from harness.cli.main import main as cli
from tests.devices.conftest import host_pid, start_phone, wait_for

QUOTA_BYTES = 48 << 20
needs_adj = pytest.mark.skipif(not may_lower_oom_score_adj(), reason="this host's root lacks CAP_SYS_RESOURCE, so no "
                               "process here may lower an oom_score_adj below 0 (the phone warns so)")


def sh(server, phone, command: str) -> subprocess.CompletedProcess:
    return server.run("-s", phone.serial, "shell", command)


def out(server, phone, command: str) -> str:
    r = sh(server, phone, command)
    assert r.returncode == 0, (command, r)
    return r.stdout.decode()



def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture(scope="module")
def debug_phone(adb_server, phone_home):
    """An Android 15 userdebug phone with 16 KiB pages, a 48 MiB /data and CPU zones in °C."""
    phone = start_phone(adb_server, phone_home, f"dbg{os.getpid()}", 256 << 20, android=15, soc="sm8650",
                        build="userdebug", page_size_bytes=16384, data_quota_bytes=QUOTA_BYTES, thermal_unit="C")
    try:
        yield phone
    finally:
        manager.down(phone.name, home=phone_home, adb_host="127.0.0.1", adb_port=adb_server.port)


# -- adbd's -950 ---------------------------------------------------------------------------------

@needs_adj
def test_every_shell_service_starts_its_command_at_adbds_minus_950(adb_server, phones):
    a = phones["a"]
    read = "cat /proc/self/oom_score_adj"
    assert out(adb_server, a, read) == "-950\n"                                    # shell,v2:
    assert adb_server.run("-s", a.serial, "exec-out", read).stdout == b"-950\n"    # exec:
    device = adbutils.AdbClient(host="127.0.0.1", port=adb_server.port).device(a.serial)
    assert device.shell(read).strip() == "-950"                                      # shell: (no v2)
    assert out(adb_server, a, f"sh -c {shlex.quote(read)}") == "-950\n"             # its children too
    # it may raise its adj (an app's), and lower it again, down to adbd's own -1000: adbd's write
    # was unprivileged, so the kernel's floor (oom_score_adj_min) is still init's -1000
    moves = ("echo 900 > /proc/self/oom_score_adj; cat /proc/self/oom_score_adj; "
             "echo -1000 > /proc/self/oom_score_adj && cat /proc/self/oom_score_adj")
    assert out(adb_server, a, moves).split() == ["900", "-1000"]


@pytest.mark.skipif(may_lower_oom_score_adj(), reason="this host's root may lower an oom_score_adj: the phone has -950")
def test_a_host_whose_root_may_not_lower_adj_says_its_shell_keeps_0(adb_server, phones):
    a = phones["a"]
    assert out(adb_server, a, "cat /proc/self/oom_score_adj") == "0\n"
    assert any("CAP_SYS_RESOURCE" in w and "-950" in w for w in manager.info(a.name, a.root.parent).warnings)


# -- a closed stream hangs up the shell alone -----------------------------------------------------

def open_shell(server, phone, command: str, pids: int):
    """A shell,v2 stream running `command`, and the first `pids` numbers it printed."""
    device = adbutils.AdbClient(host="127.0.0.1", port=server.port).device(phone.serial)
    conn = device.open_transport(timeout=10)
    conn.send_command(f"shell,v2,raw:{command}")
    conn.check_okay()
    got = b""
    while got.count(b"\n") < pids:
        kind, length = struct.unpack("<BI", conn.conn.recv(5, socket_flags()))
        data = b""
        while len(data) < length:
            data += conn.conn.recv(length - len(data))
        if kind == 1:
            got += data
    return conn, [int(x) for x in got.split()[:pids]]


def socket_flags() -> int:
    import socket

    return socket.MSG_WAITALL


def test_a_closed_stream_hangs_up_the_shell_alone_and_closes_its_pipes(adb_server, phones):
    a = phones["a"]
    tag = f"1000.{os.getpid()}"
    cmd = (f"echo $$; sleep {tag} & echo $!; (while :; do sleep 0.2; echo tick; done) & echo $!; wait")
    conn, pids = open_shell(adb_server, a, cmd, 3)
    shell, sleeper, ticker = (host_pid(a.root, p) for p in pids)     # the phone's are its own namespace's
    try:
        assert all(alive(p) for p in (shell, sleeper, ticker))
        conn.close()
        # SIGHUP to the shell: gone; the ticker's next write meets the closed pipe (SIGPIPE)
        assert wait_for(lambda: not alive(shell) and not alive(ticker)), (alive(shell), alive(ticker))
        # the sleeper, silent and not the shell, lives on; no SIGKILL follows (adbd's took 1 s here)
        time.sleep(1.5)
        assert alive(sleeper) and Path(f"/proc/{sleeper}/cmdline").read_bytes() == f"sleep\0{tag}\0".encode()
    finally:
        for p in (shell, sleeper, ticker):
            if alive(p):
                os.kill(p, 9)


def test_a_shell_that_ignores_sighup_outlives_its_stream(adb_server, phones):
    a = phones["a"]
    conn, (in_phone,) = open_shell(adb_server, a, f"trap '' HUP; echo $$; sleep 1000.{os.getpid()}1", 1)
    shell = host_pid(a.root, in_phone)
    try:
        conn.close()
        time.sleep(1.5)      # adbd only waits for it (WaitForExit): nothing kills it
        assert alive(shell)
    finally:
        subprocess.run(["pkill", "-9", "-s", str(shell)], check=False)


@pytest.mark.parametrize("isolated", [True, False], ids=["cgroup", "no-isolation"])
def test_virtual_down_kills_what_outlived_its_stream(adb_server, make_phone, phone_home, isolated):
    phone = make_phone(f"orphans{int(isolated)}", 128 << 20, isolated=isolated,
                       data_quota_bytes=dataquota.MIN_BYTES if isolated else 0)
    conn, pids = open_shell(adb_server, phone, f"echo $$; sleep 1000.{os.getpid()}2 & echo $!; wait", 2)
    shell, sleeper = (host_pid(phone.root, p) for p in pids)
    conn.close()
    assert wait_for(lambda: not alive(shell)) and alive(sleeper)
    manager.down(phone.name, home=phone_home, adb_host="127.0.0.1", adb_port=adb_server.port)
    assert wait_for(lambda: not alive(sleeper)), "virtual down left a process of the phone running"
    if isolated:   # its /data image's loop device and mount went with the phone
        image = dataquota.image_path(phone.root / ".vphone")
        assert wait_for(lambda: not dataquota.attached(image)), dataquota.attached(image)
        assert not [ln for ln in Path("/proc/mounts").read_text().splitlines() if str(phone.root) in ln]


# -- logcat -v epoch, killinfo -------------------------------------------------------------------

def test_logcat_epoch_pads_the_seconds_as_liblog(adb_server, phones):
    a = phones["a"]
    logbuf.append(a.root, "main", "bmoeEpoch", "padded", pid=4321, tid=4322, time_s=1733450000.12345)
    lines = out(adb_server, a, "logcat -d -v epoch -s bmoeEpoch").splitlines()
    # logprint.cpp: "%19lld" seconds, ".%03ld" milliseconds, then threadtime's "%5d %5d %c %-8s: "
    assert "         1733450000.123  4321  4322 I bmoeEpoch: padded" in lines, lines
    lines = out(adb_server, a, "logcat -d -v time -v epoch -s bmoeEpoch").splitlines()
    assert "         1733450000.123 I/bmoeEpoch( 4321): padded" in lines, lines


@pytest.mark.parametrize("android, floats", [(12, 0), (13, 5), (14, 5)])
def test_killinfo_ends_with_lmkds_psi_floats_from_android_13(tmp_path, android, floats, capsys):
    for b in logbuf.BUFFERS:
        logbuf.buffer_path(tmp_path, b).parent.mkdir(parents=True, exist_ok=True)
    ram = 512 << 20
    lmkd = Lmkd(tmp_path, android, ram, lambda: [], lambda: 0, lambda: compute(ram, MemStat(usage_bytes=ram // 2)))
    try:
        lmkd._log(Kill(4321, "/data/local/tmp/bmoe-cli", 300000, 1000, 0, "lmkd"))
    finally:
        lmkd.close()
    assert tools.main([str(tmp_path), "logcat", "-d", "-b", "events"]) == 0
    (info,) = [ln for ln in capsys.readouterr().out.splitlines() if " killinfo: " in ln]
    fields = info.split(" killinfo: ", 1)[1].strip("[]").split(",")
    assert [int(f) for f in fields[:5]] == [4321, 2000, 0, 0, 300000]
    # Android 12's 33 ints (event.logtags 10195355 up to MaxThrashing), then "%f" floats
    assert len(fields) == 33 + floats and all(re.fullmatch(r"-?\d+", f) for f in fields[:33])
    assert all(re.fullmatch(r"\d+\.\d{6}", f) for f in fields[33:]), fields[33:]


# -- thermal zones ---------------------------------------------------------------------------------

def zones(server, phone) -> list[tuple[str, int]]:
    text = out(server, phone, "for z in /sys/class/thermal/thermal_zone*; do echo \"$(cat $z/type) $(cat $z/temp)\"; done")
    return [(name, int(t)) for name, t in (ln.split() for ln in text.splitlines())]


def test_every_phone_has_a_constant_95000_trip_zone_that_dumpsys_leaves_out(adb_server, phones):
    b = phones["b"]
    before = dict(zones(adb_server, b))
    time.sleep(1.2)                 # the zones are written each second
    after = dict(zones(adb_server, b))
    assert before["cpu-hw-trip-0"] == after["cpu-hw-trip-0"] == 95000
    assert all(20000 < t < 90000 for name, t in after.items() if name != "cpu-hw-trip-0"), after
    dumpsys = out(adb_server, b, "dumpsys thermalservice")
    assert "cpu-hw-trip" not in dumpsys and re.search(r"^Thermal Status: [0-2]$", dumpsys, re.M), dumpsys


def test_a_vendor_whose_cpu_zones_count_celsius(adb_server, debug_phone):
    read = zones(adb_server, debug_phone)
    cpu = [t for name, t in read if re.fullmatch(r"cpu-\d+-\d+", name)]
    assert cpu and all(20 <= t <= 90 for t in cpu), read                 # whole °C: `31`, not `31000`
    assert dict(read)["battery"] > 20000 and dict(read)["cpu-hw-trip-0"] == 95000
    assert out(adb_server, debug_phone, "getprop ro.bmoe.thermal_unit") == "C\n"
    dumpsys = out(adb_server, debug_phone, "dumpsys thermalservice")
    shown = [float(v) for v in re.findall(r"mValue=([0-9.]+), mType=0, mName=cpu-", dumpsys.split("Cached")[1])]
    assert shown and all(20 <= v <= 90 for v in shown), dumpsys          # the HAL speaks °C either way
    from devices.virtual import profiles

    assert profiles.settings("celsius-zones", {}, None, None, lambda ram: 0)[1]["thermal_unit"] == "C"


# -- 16 KiB pages ----------------------------------------------------------------------------------

def test_a_16k_phone_shows_16k_pages_to_its_shell(adb_server, debug_phone, phones):
    p = debug_phone
    assert out(adb_server, p, "getconf PAGESIZE; getconf PAGE_SIZE").split() == ["16384", "16384"]
    assert re.search(r"^PAGESIZE +16384$", out(adb_server, p, "getconf -a"), re.M)
    assert out(adb_server, phones["a"], "getconf PAGESIZE") == f"{HOST_PAGE_BYTES}\n"    # a 4 KiB phone's
    assert out(adb_server, p, "getprop ro.product.cpu.pagesize.max") == "16384\n"
    assert out(adb_server, p, "getprop ro.product.page_size") == "\n"         # Android 16's, not 15's
    assert re.search(r"^MemTotal: +262144 kB$", out(adb_server, p, "cat /proc/meminfo"), re.M)   # still kB
    stat = Path(p.cgroup_path, "memory.stat")

    def host_faults() -> int:
        keyed = dict(ln.split() for ln in stat.read_text().splitlines())
        return int(keyed.get("total_pgfault", keyed.get("pgfault", 0)))

    before = host_faults()
    shown = int(re.search(r"^pgfault (\d+)$", out(adb_server, p, "cat /proc/vmstat"), re.M)[1])
    after = host_faults()
    assert before * HOST_PAGE_BYTES // 16384 <= shown <= after * HOST_PAGE_BYTES // 16384 < before, \
        (before, shown, after)


def test_vmstat_counts_pages_in_the_phones_pages_and_the_rest_as_they_are():
    text = vmstat_text({"pswpin": 4001, "pswpout": 8, "pgmajfault": 40, "workingset_refault_file": 400,
                        "pgpgin": 4000, "allocstall_normal": 3, "pgsteal_kswapd": 4096}, 16384)
    got = dict(ln.split() for ln in text.splitlines())
    scale = HOST_PAGE_BYTES / 16384
    assert {k: int(got[k]) for k in ("pswpin", "pswpout", "pgmajfault", "workingset_refault_file", "pgsteal_kswapd")} \
        == {"pswpin": int(4001 * scale), "pswpout": int(8 * scale), "pgmajfault": int(40 * scale),
            "workingset_refault_file": int(400 * scale), "pgsteal_kswapd": int(4096 * scale)}
    assert (got["pgpgin"], got["allocstall_normal"]) == ("4000", "3")       # KiB and events: as they are
    assert vmstat_text({"pswpin": 4001}) == vmstat_text({"pswpin": 4001}, HOST_PAGE_BYTES)


# -- the /data quota ---------------------------------------------------------------------------------

def df(server, phone, path: str) -> tuple[int, int, int]:
    """(1K-blocks, used, available) of `path`'s file system, as the phone's toybox df prints them."""
    lines = out(server, phone, f"df {path}").splitlines()
    size, used, avail = lines[1].split()[1:4]
    return int(size), int(used), int(avail)


def test_df_on_a_quota_phone_shows_its_quota_for_data_and_sdcard(adb_server, debug_phone, phones):
    size_kb, _, avail_kb = df(adb_server, debug_phone, "/data/local/tmp")
    assert 0.8 * QUOTA_BYTES // 1024 < size_kb <= QUOTA_BYTES // 1024 and 0 < avail_kb <= size_kb
    assert df(adb_server, debug_phone, "/sdcard") == df(adb_server, debug_phone, "/data/local/tmp")  # /data/media/0
    assert df(adb_server, phones["a"], "/data/local/tmp")[0] > 4 * QUOTA_BYTES // 1024    # no quota: the disk


def test_a_push_past_the_quota_fails_with_enospc_and_leaves_no_file(adb_server, debug_phone, tmp_path):
    p = debug_phone
    avail = df(adb_server, p, "/data/local/tmp")[2] * 1024
    assert avail <= QUOTA_BYTES, avail         # the quota's, never the host disk's free space
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(avail + (4 << 20))          # sparse here: adb reads zeros
    r = adb_server.run("-s", p.serial, "push", str(big), "/data/local/tmp/big.bin")
    assert r.returncode != 0 and b"No space left on device" in r.stdout + r.stderr, r
    assert sh(adb_server, p, "ls /data/local/tmp/big.bin").returncode != 0     # adbd unlinks what it began
    assert df(adb_server, p, "/data/local/tmp")[2] * 1024 >= avail - (1 << 20)
    small = tmp_path / "small.bin"
    small.write_bytes(os.urandom(1 << 20))
    assert adb_server.run("-s", p.serial, "push", str(small), "/sdcard/small.bin").returncode == 0
    assert out(adb_server, p, "stat -c %s /sdcard/small.bin; rm /sdcard/small.bin") == f"{1 << 20}\n"


def test_a_shell_write_past_the_quota_fails_with_enospc(adb_server, debug_phone):
    p = debug_phone
    r = sh(adb_server, p, f"head -c {QUOTA_BYTES} /dev/zero > /data/local/tmp/fill.bin")
    sh(adb_server, p, "rm -f /data/local/tmp/fill.bin")
    assert r.returncode != 0 and b"No space left on device" in r.stderr, r


def test_a_quota_phone_keeps_its_logs_and_mounts_nothing_on_the_host(adb_server, debug_phone):
    p = debug_phone
    logbuf.append(p.root, "main", "bmoeQuota", "logged on the host folder")   # the daemon's side writes here
    assert "logged on the host folder" in out(adb_server, p, "logcat -d -s bmoeQuota")
    assert not [ln for ln in Path("/proc/mounts").read_text().splitlines() if str(p.root) in ln]


# -- user and userdebug builds ---------------------------------------------------------------------

def test_a_user_build_keeps_no_kernel_log_and_a_userdebug_build_does(adb_server, phones, debug_phone):
    line = f"Memory cgroup out of memory: Killed process {os.getpid()} (bmoe-cli) oom_score_adj:-950"
    for phone in (phones["a"], debug_phone):
        logbuf.append(phone.root, "kernel", "kernel", line, priority="E", pid=0, tid=0)
    user = phones["a"]
    assert out(adb_server, user, "getprop ro.build.type; getprop ro.debuggable").split() == ["user", "0"]
    r = sh(adb_server, user, "logcat -d -b kernel")
    assert (r.returncode, r.stdout, r.stderr) == (0, b"", b"")      # logd never read it: empty, not refused
    assert line not in out(adb_server, user, "logcat -d")
    debug = debug_phone
    assert out(adb_server, debug, "getprop ro.build.type; getprop ro.debuggable").split() == ["userdebug", "1"]
    assert line in out(adb_server, debug, "logcat -d -b kernel")
    assert line in out(adb_server, debug, "logcat -d")              # logcat's unnamed buffers include kernel
    assert line not in out(adb_server, debug, "logcat -d -b default")
    for phone in (user, debug):                                    # the shell has no syslog_read on either
        assert b"klogctl: Operation not permitted" in sh(adb_server, phone, "dmesg").stderr


# -- bad input ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--build", "eng"], "Invalid value for '--build'"),
    (["--page-size", "8k"], "Invalid value for '--page-size'"),
    (["--page-size", "16k", "--android", "14"], "Error: 16 KiB pages need Android 15 or later (this phone is Android 14)"),
    (["--data-quota", "8MiB"], "Error: --data-quota 8388608 bytes is too small (at least 16 MiB"),
    (["--data-quota", "64MiB", "--no-isolation"], "Error: --data-quota needs isolation"),
])
def test_virtual_up_refuses_what_no_phone_is_in_one_line(tmp_path, adb_server, args, message):
    env = {"ANDROID_ADB_SERVER_PORT": str(adb_server.port), "ADB_SERVER_SOCKET": None}
    try:
        r = CliRunner().invoke(cli, ["virtual", "up", "--name", "bad", "--ram", "256MiB", "--zram", "0",
                                     "--home", str(tmp_path), *args], env=env)
        assert r.exit_code != 0 and message in r.output, r.output
        assert not (tmp_path / "bad").exists()
    finally:    # were it not refused, it is a phone: stopped here, never left running
        if (tmp_path / "bad").exists():
            manager.down("bad", home=tmp_path, adb_host="127.0.0.1", adb_port=adb_server.port)
