"""Virtual phones through the REAL adb server and CLI (from the adbutils wheel) and adbutils.

Phones run real commands in a real memory cgroup; the OOM test gets a real kernel OOM kill. The
commands run as Android runs them: mksh and toybox, as the shell user, in the phone's own `/`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from devices.adb.files import recv_exactly
from devices.virtual import manager, wire
from devices.virtual.phone import Layout
from engine.errors import BmoeError
from engine.units import MIB
from harness.cli.virtual import virtual
from tests.devices.conftest import app_uid, wait_for

PY = shlex.quote(sys.executable)  # a phone has no python3 on its PATH; bmoe-py's interpreter is reachable


def sh(server, phone, command: str, **kw):
    return server.run("-s", phone.serial, "shell", command, **kw)



# -- the adb CLI ---------------------------------------------------------------------------------

def test_adb_devices_lists_every_phone_with_its_model(adb_server, phones):
    out = adb_server.run("devices", "-l").stdout.decode()
    for phone in phones.values():
        line = next((ln for ln in out.splitlines() if ln.startswith(phone.serial + " ")), None)
        assert line is not None, out
        assert " device " in line
        assert f"model:{phone.model.replace(' ', '_')}" in line


def test_shell_exit_status_and_separate_streams(adb_server, phones):
    a = phones["a"]
    assert sh(adb_server, a, "exit 3").returncode == 3
    r = sh(adb_server, a, "echo out; echo err >&2; exit 0")
    assert (r.returncode, r.stdout, r.stderr) == (0, b"out\n", b"err\n")
    # a command killed by a signal reports 128+N, like adbd
    assert sh(adb_server, a, "kill -TERM $$").returncode == 128 + 15


def test_shell_runs_in_the_phones_own_filesystem_view(adb_server, phones):
    a, b = phones["a"], phones["b"]
    assert sh(adb_server, a, "echo mark-a > /data/local/tmp/mark && cat /data/local/tmp/mark").stdout == b"mark-a\n"
    assert (a.root / "data/local/tmp/mark").read_text() == "mark-a\n"
    seen_by_b = sh(adb_server, b, "cat /data/local/tmp/mark")
    assert seen_by_b.returncode != 0 and not (b.root / "data/local/tmp/mark").exists()
    r = sh(adb_server, a, "for t in getprop logcat dumpsys; do command -v $t; done; pwd")
    assert r.stdout.decode().split()[:3] == ["/system/bin/getprop", "/system/bin/logcat", "/system/bin/dumpsys"]
    assert r.stdout.decode().rstrip().endswith("\n/")


def test_getprop_prints_the_model_and_the_android_listing(adb_server, phones):
    b = phones["b"]
    assert sh(adb_server, b, "getprop ro.product.model").stdout == b"Galaxy S24\n"
    listing = sh(adb_server, b, "getprop").stdout.decode()
    assert "[ro.product.model]: [Galaxy S24]" in listing.splitlines()
    assert "[ro.build.version.sdk]: [34]" in listing.splitlines()
    assert re.search(r"^\[ro\.bmoe\.host_abi\]: \[\S+\]$", listing, re.M)
    assert sh(adb_server, phones["c"], "getprop ro.build.version.release").stdout == b"13\n"


def test_meminfo_shows_each_phones_ram(adb_server, phones):
    for phone in phones.values():
        text = sh(adb_server, phone, "cat /proc/meminfo").stdout.decode()
        fields = {k: int(v.split()[0]) for k, v in (ln.split(":", 1) for ln in text.splitlines())}
        assert fields["MemTotal"] == phone.ram_bytes // 1024
        assert 0 < fields["MemAvailable"] <= fields["MemTotal"]
        assert fields["SwapTotal"] == 0


def test_meminfo_available_drops_while_the_phone_holds_memory(adb_server, phones):
    a = phones["a"]
    script = ("import time; b = bytearray(160 << 20); b[::4096] = b'x' * (len(b) // 4096); time.sleep(0.3); "
              "print([l for l in open('/proc/meminfo') if l.startswith('MemAvailable')][0].split()[1])")
    before = int(re.search(r"MemAvailable:\s+(\d+)", sh(adb_server, a, "cat /proc/meminfo").stdout.decode())[1])
    during = int(sh(adb_server, a, f"{PY} -c {shlex.quote(script)}").stdout.decode())
    assert before - during >= 150 * 1024, (before, during)


def test_push_then_pull_200_mib_round_trips(adb_server, phones):
    a = phones["a"]
    src = Path("/var/tmp") / f"vphone-push-{os.getpid()}.bin"
    back = Path("/var/tmp") / f"vphone-pull-{os.getpid()}.bin"
    try:
        digest = hashlib.sha256()
        with open(src, "wb") as f:
            for _ in range(200):
                chunk = os.urandom(MIB)
                digest.update(chunk)
                f.write(chunk)
        t0 = time.monotonic()
        push = adb_server.run("-s", a.serial, "push", str(src), "/data/local/tmp/big.bin")
        push_s = time.monotonic() - t0
        assert push.returncode == 0, push.stderr
        assert (a.root / "data/local/tmp/big.bin").stat().st_size == 200 * MIB
        pull = adb_server.run("-s", a.serial, "pull", "/data/local/tmp/big.bin", str(back))
        assert pull.returncode == 0, pull.stderr
        h = hashlib.sha256()
        with open(back, "rb") as f:
            while chunk := f.read(MIB):
                h.update(chunk)
        assert h.hexdigest() == digest.hexdigest()
        print(f"adb push of 200 MiB: {200 / push_s:.0f} MiB/s")
    finally:
        src.unlink(missing_ok=True)
        back.unlink(missing_ok=True)
        (a.root / "data/local/tmp/big.bin").unlink(missing_ok=True)


def test_logcat_dump_shows_the_phones_log(adb_server, phones):
    c = phones["c"]
    out = adb_server.run("-s", c.serial, "logcat", "-d").stdout.decode()
    assert "--------- beginning of main" in out
    line = next(ln for ln in out.splitlines() if " vphone  : " in ln)
    assert re.match(r"^\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} +\d+ +\d+ I vphone  : Redmi Note 12 ", line)
    brief = adb_server.run("-s", c.serial, "logcat", "-d", "-v", "brief", "-s", "vphone").stdout.decode()
    assert [ln for ln in brief.splitlines() if not ln.startswith("-")] and \
        all(ln.startswith("I/vphone  (") for ln in brief.splitlines() if not ln.startswith("-"))


def test_pty_shell(adb_server, phones):
    r = adb_server.run("-s", phones["a"].serial, "shell", "-t", "-t", "tty; echo $TERM")
    lines = r.stdout.decode().replace("\r", "").split("\n")
    assert lines[0].startswith("/dev/pts/"), r.stdout


def test_interactive_shell_without_a_command_and_exec_out(adb_server, phones):
    a = phones["a"]
    r = adb_server.run("-s", a.serial, "shell", input=b"echo hi from stdin\nexit 4\n")
    assert r.returncode == 4 and b"hi from stdin\n" in r.stdout
    binary = bytes(range(256)) * 64
    (a.root / "data/local/tmp/bytes.bin").write_bytes(binary)
    out = adb_server.run("-s", a.serial, "exec-out", "cat /data/local/tmp/bytes.bin")
    assert out.returncode == 0 and out.stdout == binary  # exec: is byte-exact, no pty, no framing
    piped = adb_server.run("-s", a.serial, "shell", "-T", "wc -c", input=b"x" * 300000)
    assert piped.stdout.strip() == b"300000"  # stdin reaches the command, then close-stdin ends it


def test_many_concurrent_streams_on_one_phone(adb_server, phones):
    from concurrent.futures import ThreadPoolExecutor

    d = adb_server.client().device(phones["a"].serial)

    def work(i: int) -> tuple[int, int, bytes, bytes]:
        r = d.shell2(f"head -c {100000 * (i + 1)} /dev/zero | wc -c; exit {i}", v2=True)
        blob = os.urandom(200000 + i)
        d.sync.push(blob, f"/data/local/tmp/concurrent-{i}.bin")
        return r.returncode, int(r.stdout), blob, d.sync.read_bytes(f"/data/local/tmp/concurrent-{i}.bin")

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(work, range(12)))
    for i, (code, count, sent, got) in enumerate(results):
        assert (code, count) == (i, 100000 * (i + 1))
        assert got == sent
    big = d.shell2("head -c 3000000 /dev/zero", v2=True, encoding=None)
    assert len(big.stdout) == 3000000  # several max-payload WRTEs, each acknowledged


def test_dumpsys_and_thermal_files(adb_server, phones):
    b = phones["b"]
    battery = sh(adb_server, b, "dumpsys battery").stdout.decode()
    assert re.search(r"^  temperature: \d{3}$", battery, re.M)
    thermal = sh(adb_server, b, "dumpsys thermalservice").stdout.decode()
    assert re.search(r"^Thermal Status: [0-6]$", thermal, re.M)
    types = sh(adb_server, b, "cat /sys/class/thermal/thermal_zone*/type").stdout.decode().split()
    assert "cpu-0-0" in types and "battery" in types
    freq = sh(adb_server, b, "cat /sys/devices/system/cpu/cpufreq/policy7/cpuinfo_max_freq").stdout
    assert freq == b"3302400\n"  # sm8650's prime core


def test_cpu_work_heats_the_cpu_zones(adb_server, phones):
    b = phones["b"]

    def cpu_temp_mc() -> int:
        return int(sh(adb_server, b, "cat /sys/class/thermal/thermal_zone0/temp").stdout)

    before = cpu_temp_mc()
    spin = "import time\nt = time.time() + 2.5\nwhile time.time() < t: pass"
    burn = sh(adb_server, b, f"{PY} -c " + shlex.quote(spin))
    assert burn.returncode == 0
    assert wait_for(lambda: cpu_temp_mc() - before > 300, timeout_s=3), (before, cpu_temp_mc())


# -- adbutils ------------------------------------------------------------------------------------

def test_adbutils_shell2_and_sync(adb_server, phones, tmp_path):
    d = adb_server.client().device(phones["b"].serial)
    assert d.shell2("exit 7", v2=True).returncode == 7
    r = d.shell2("echo o; echo e >&2; exit 4", v2=True)
    assert (r.returncode, r.stdout, r.stderr) == (4, "o\n", "e\n")
    assert d.shell2("true").returncode == 0  # shell v1 + adbutils' echo trick
    payload = os.urandom(3 * MIB + 17)
    d.sync.push(payload, "/data/local/tmp/sub/dir/blob.bin")  # fixed_push_mkdir: parents created
    assert d.sync.read_bytes("/data/local/tmp/sub/dir/blob.bin") == payload
    assert d.sync.pull("/data/local/tmp/sub/dir/blob.bin", tmp_path / "blob.bin") == len(payload)
    assert (tmp_path / "blob.bin").read_bytes() == payload
    st = d.sync.stat("/data/local/tmp/sub/dir/blob.bin")
    assert st.size == len(payload) and st.mode & 0o100000
    names = [f.path for f in d.sync.list("/data/local/tmp/sub/dir")]
    assert "blob.bin" in names
    assert d.sync.stat("/data/local/tmp/missing").mtime is None


# -- memory: real OOM kills logged like lmkd -----------------------------------------------------

# the pause lets the phone's lmkd (10 Hz) sample the process before the kernel kills it
# waits 1 s before allocating: the phone's lmkd learns a process's cmdline (the name it logs) from
# its ~10 Hz samples, and a loaded host can stretch those (an engine's load takes seconds anyway)
ALLOC = ("import os, sys, time; print(os.getpid(), flush=True); mib = int(sys.argv[1]); "
         "time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 1.0); "
         "b = bytearray(mib << 20); b[::4096] = b'x' * (len(b) // 4096); print('survived', flush=True)")


def alloc_engine(phone, name: str) -> str:
    """ALLOC as an executable `#!` script in the phone's /data/local/tmp, staged the way bmoe-py is
    (a file whose #! line is the host interpreter); returns its path on the phone."""
    path = phone.root / "data/local/tmp" / name
    path.write_text(f"#!{sys.executable}\n{ALLOC}\n")
    path.chmod(0o755)
    return f"/data/local/tmp/{name}"


def test_allocating_past_ram_is_killed_by_the_kernel_not_by_lmkd(adb_server, phones):
    """A shell's engine is no process lmkd may kill (it kills only what ActivityManager registered,
    devices/virtual/lmkd.py): past the phone's RAM the kernel's memcg OOM killer takes it, a line
    in the kernel buffer and in no buffer the shell reads."""
    from devices import lmk
    from devices.virtual import logbuf

    c = phones["c"]  # 256 MiB
    engine = alloc_engine(c, "alloc")
    ok = sh(adb_server, c, f"{engine} 64")
    assert ok.returncode == 0 and b"survived" in ok.stdout
    r = sh(adb_server, c, f"{engine} 1024")
    assert r.returncode == 137, (r.returncode, r.stdout, r.stderr)
    assert b"survived" not in r.stdout
    pid = int(r.stdout.split()[0])

    def kernel_lines() -> list[str]:
        return [e.message for e in logbuf.read(c.root, ["kernel"]) if f"Killed process {pid} " in e.message]

    lines = wait_for(kernel_lines, timeout_s=5)
    assert lines, f"no kernel line for the killed process; {_lmkd_evidence(adb_server, c)}"
    event = lmk.parse_line(lines[0])
    # the kernel names the task by its comm, the script the shell ran; what it held when killed:
    # its anon pages fill the 256 MiB, its file-backed pages (the interpreter, libraries) on top
    assert event is not None and (event.source, event.name) == ("kernel-oom", "alloc"), lines[0]
    assert event.rss_kb is not None and 200 * 1024 < event.rss_kb <= (256 + 64) * 1024, lines[0]
    out = adb_server.run("-s", c.serial, "logcat", "-d", "-b", "main,events", "-v", "threadtime").stdout.decode()
    assert not [ln for ln in out.splitlines() if f"({pid})" in ln or f"[{pid}," in ln or "Killed process" in ln]
    # the other phones did not notice
    assert sh(adb_server, phones["a"], "echo alive").stdout == b"alive\n"
    assert f"({pid})" not in adb_server.run("-s", phones["a"].serial, "logcat", "-d").stdout.decode()


# -- robustness ----------------------------------------------------------------------------------

def _raw_connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return s


def _send(s: socket.socket, command: int, arg0: int, arg1: int, payload: bytes = b"") -> None:
    s.sendall(wire.pack_header(command, arg0, arg1, payload, with_checksum=True) + payload)


def _recv_message(s: socket.socket) -> tuple[wire.Header, bytes]:
    raw = recv_exactly(s, wire.HEADER_BYTES)
    h = wire.parse_header(raw, wire.MAX_PAYLOAD)
    return h, recv_exactly(s, h.data_length)



def _closed_by_peer(s: socket.socket) -> bool:
    s.settimeout(5)
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _handshake(port: int) -> tuple[socket.socket, str]:
    s = _raw_connect(port)
    _send(s, wire.A_CNXN, wire.A_VERSION, wire.MAX_PAYLOAD, b"host::features=shell_v2\0")
    h, payload = _recv_message(s)
    assert h.command == wire.A_CNXN
    return s, payload.decode()


@pytest.mark.parametrize("garbage", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",                             # not adb at all
    struct.pack("<6I", wire.A_CNXN, wire.A_VERSION, 4096, 0, 0, 0),     # bad magic
    struct.pack("<6I", wire.A_WRTE, 1, 1, 64 << 20, 0, wire.A_WRTE ^ 0xFFFFFFFF),  # oversize payload
    struct.pack("<6I", 0x5A5A5A5A, 0, 0, 0, 0, 0x5A5A5A5A ^ 0xFFFFFFFF),  # unknown command
])
def test_malformed_packets_cost_only_their_connection(adb_server, phones, garbage):
    a = phones["a"]
    with _raw_connect(a.port) as s:
        s.sendall(garbage)
        assert _closed_by_peer(s)
    fresh, banner = _handshake(a.port)  # the daemon still accepts and speaks adb
    fresh.close()
    assert banner.startswith("device::") and "ro.product.model=Pixel 8" in banner
    assert "features=shell_v2,cmd,stat_v2,ls_v2,fixed_push_mkdir" in banner
    assert sh(adb_server, a, "echo still-here").stdout == b"still-here\n"
    assert sh(adb_server, phones["b"], "echo b-here").stdout == b"b-here\n"


def test_dropped_connection_kills_its_commands_and_the_daemon_carries_on(adb_server, phones):
    a = phones["a"]
    marker = f"60.{os.getpid()}"  # a sleep duration no other process has on its command line
    s, _ = _handshake(a.port)
    try:
        _send(s, wire.A_OPEN, 5, 0, f"shell,v2,raw:sleep {marker}\0".encode())
        h, _ = _recv_message(s)
        assert h.command == wire.A_OKAY and h.arg1 == 5

        def running() -> bool:
            for p in os.listdir("/proc"):
                try:
                    if p.isdigit() and Path(f"/proc/{p}/cmdline").read_bytes() == f"sleep\0{marker}\0".encode():
                        return True
                except OSError:
                    pass
            return False

        assert wait_for(running, timeout_s=3)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST, no FIN
    finally:
        s.close()
    assert wait_for(lambda: not running(), timeout_s=5), "the orphaned command is still running"
    fresh, _ = _handshake(a.port)
    try:
        _send(fresh, wire.A_OPEN, 9, 0, b"no-such-service:\0")
        h, _ = _recv_message(fresh)
        assert (h.command, h.arg0, h.arg1) == (wire.A_CLSE, 0, 9)  # unknown services are refused politely
    finally:
        fresh.close()
    assert sh(adb_server, a, "echo ok").stdout == b"ok\n"
    assert sh(adb_server, phones["c"], "echo ok").stdout == b"ok\n"


def test_other_users_cannot_connect(phones):
    """No auth (as on an adbd with auth off), so only the daemon's own user or root gets in."""
    assert os.getuid() == 0, "this suite runs as root (cgroups, namespaces, acting as another user)"
    probe = ("import socket, struct, sys\n"
             "s = socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5)\n"
             "c = int.from_bytes(b'CNXN', 'little'); p = b'host::\\0'\n"
             "try:\n"
             "    s.sendall(struct.pack('<6I', c, 0x01000001, 4096, len(p), sum(p), c ^ 0xFFFFFFFF) + p)\n"
             "    print(len(s.recv(4096)))\n"
             "except (ConnectionResetError, BrokenPipeError):\n    print(0)\n")  # closed on us, RST or not
    as_nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "/usr/bin/python3", "-c", probe]
    port = str(phones["a"].port)
    refused = subprocess.run(as_nobody + [port], capture_output=True, timeout=30)
    assert refused.returncode == 0 and refused.stdout.strip() == b"0", refused.stderr  # closed, no CNXN
    as_root = subprocess.run(["/usr/bin/python3", "-c", probe, port], capture_output=True, timeout=30)
    assert int(as_root.stdout) >= 24  # the same probe as root gets the CNXN answer


# -- sync: the phone's folder is its `/`, refusals are adbd's -----------------------------------

class RawSync:
    """A sync: session through the adb server's host protocol (what adbutils does, minus its
    asserts), so replies can be checked as they are."""

    def __init__(self, server, serial: str):
        self.s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        for request in (f"host:transport:{serial}", "sync:"):
            self.s.sendall(f"{len(request):04x}{request}".encode())
            assert recv_exactly(self.s, 4) == b"OKAY"

    def request(self, ident: bytes, path: str) -> None:
        raw = path.encode()
        self.s.sendall(ident + struct.pack("<I", len(raw)) + raw)

    def reply(self) -> tuple[bytes, bytes]:
        """(id, body): FAIL's message, STAT's 12 bytes, STA2/LST2's 64, DATA's bytes, DONE's word."""
        ident, first = struct.unpack("<4sI", recv_exactly(self.s, 8))
        if ident in (b"FAIL", b"DATA"):
            return ident, recv_exactly(self.s, first)
        if ident == b"STAT":
            return ident, struct.pack("<I", first) + recv_exactly(self.s, 8)
        if ident in (b"STA2", b"LST2"):
            return ident, struct.pack("<I", first) + recv_exactly(self.s, 64)
        return ident, struct.pack("<I", first)

    def recv_file(self, path: str) -> tuple[bytes, bytes]:
        """RECV: (b"DATA", the file) or (b"FAIL", the message)."""
        self.request(b"RECV", path)
        data = b""
        while True:
            ident, body = self.reply()
            if ident == b"FAIL":
                return ident, body
            if ident == b"DONE":
                return b"DATA", data
            data += body

    def close(self) -> None:
        self.s.close()


@pytest.fixture
def raw_sync(adb_server, phones):
    opened = []

    def open_sync() -> RawSync:
        opened.append(RawSync(adb_server, phones["b"].serial))
        return opened[-1]

    yield open_sync
    for sync in opened:
        sync.close()


def test_sync_walks_the_phones_root_like_the_kernel(raw_sync, phones):
    """`..` above `/` stays at `/` and symlinks resolve inside the phone: every path lands in the
    phone's own files (its /etc is /system/etc), never the host's."""
    b = phones["b"]
    phone_passwd = (b.root / "system/etc/passwd").read_bytes()
    assert b"shell:x:2000:" in phone_passwd
    sync = raw_sync()
    sync.request(b"STAT", "/data/local/tmp/../../../../etc/passwd")
    ident, body = sync.reply()
    mode, size, _mtime = struct.unpack("<III", body)
    assert ident == b"STAT" and mode & 0o170000 == 0o100000 and size == len(phone_passwd)
    assert sync.recv_file("/data/local/tmp/../../../../../etc/passwd") == (b"DATA", phone_passwd)
    sync.request(b"STA2", "/../etc/shadow")           # a phone has none: ENOENT, not a FAIL
    ident, body = sync.reply()
    assert ident == b"STA2" and struct.unpack_from("<I", body)[0] == 2
    sync.request(b"STAT", "/.vphone/state.json")      # the daemon's folder is not the phone's
    assert sync.reply() == (b"STAT", bytes(12))


def test_sync_refuses_what_the_shell_user_may_not(raw_sync, phones):
    """As adbd on a user build, sync runs as shell: stat and list answer with errno / nothing, only
    RECV and SEND answer FAIL, each the way adbd words it."""
    sync = raw_sync()
    sync.request(b"LST2", "/data/misc/logd/main.log")  # logd's folder is not searchable by shell here
    ident, body = sync.reply()
    assert ident == b"LST2" and struct.unpack_from("<I", body)[0] == 13   # EACCES
    sync.request(b"LIST", "/data")                      # /data is 0771: shell may not list it
    assert recv_exactly(sync.s, 20) == b"DONE" + bytes(16)   # no entries, just the closing one
    ident, message = sync.recv_file("/data/misc/logd/main.log")
    assert (ident, message) == (b"FAIL", b"open failed: Permission denied")
    sync = raw_sync()                                    # a FAIL ends the session, as in adbd
    sync.request(b"SEND", "/system/bin/evil,33261")
    data = b"should not land"
    sync.s.sendall(b"DATA" + struct.pack("<I", len(data)) + data + b"DONE" + struct.pack("<I", 0))
    ident, message = sync.reply()
    assert ident == b"FAIL" and message.startswith(b"couldn't create file: ")
    assert not (phones["b"].root / "system/bin/evil").exists()


def test_the_real_adb_client_reports_refused_paths_and_never_aborts(adb_server, phones, tmp_path):
    """The adb client aborts (SIGABRT, `protocol fault`) when a stat is answered with FAIL: every
    refusal must come back as the client's own error line and exit status 1."""
    b = phones["b"]
    cases = [("pull", "/data/misc/logd/main.log", str(tmp_path / "main.log"), "Permission denied"),
             ("pull", "/../../etc/shadow", str(tmp_path / "shadow"), "No such file or directory"),
             ("pull", "/data/local/tmp/../../../../root/.ssh/id_rsa", str(tmp_path / "key"), "No such file")]
    for verb, remote, local, words in cases:
        r = adb_server.run("-s", b.serial, verb, remote, local)
        assert r.returncode == 1, (remote, r.returncode, r.stderr)
        assert words in r.stderr.decode() and not Path(local).exists(), (remote, r.stderr)
    src = tmp_path / "evil"
    src.write_bytes(b"#!/system/bin/sh\n")
    for remote in ("/system/bin/evil", "/../../usr/lib/evil", "/data/evil"):
        r = adb_server.run("-s", b.serial, "push", str(src), remote)
        assert r.returncode == 1 and b"failed to copy" in r.stderr, (remote, r.returncode, r.stderr)
    assert not (b.root / "system/bin/evil").exists() and not (b.root / "data/evil").exists()
    ls = adb_server.run("-s", b.serial, "ls", "/data")
    assert ls.returncode == 0                         # an empty listing, as adbd answers
    for fine in ("/data/local/tmp/fine", "/sdcard/fine"):      # where the shell user may write
        ok = adb_server.run("-s", b.serial, "push", str(src), fine)
        assert ok.returncode == 0, (fine, ok.stderr)
    assert sh(adb_server, b, "stat -c %u:%g /data/local/tmp/fine").stdout == b"2000:2000\n"  # pushed as shell


def test_push_and_symlinks_stay_inside_the_phone(adb_server, phones, tmp_path):
    b = phones["b"]
    outside = tmp_path / "escaped.txt"
    sync = RawSync(adb_server, b.serial)
    try:
        depth = "/.." * (len(b.root.parts) + 2)
        sync.request(b"SEND", f"/data/local/tmp{depth}{outside},33188")
        data = b"should not land"
        sync.s.sendall(b"DATA" + struct.pack("<I", len(data)) + data + b"DONE" + struct.pack("<I", 0))
        assert sync.reply()[0] == b"FAIL"   # it names a folder of the phone's root: not the shell's to create
    finally:
        sync.close()
    assert not outside.exists()
    assert sh(adb_server, b, "ln -sf /etc /data/local/tmp/etc-link").returncode == 0
    pulled = tmp_path / "passwd"
    r = adb_server.run("-s", b.serial, "pull", "/data/local/tmp/etc-link/passwd", str(pulled))
    assert r.returncode == 0 and pulled.read_bytes() == (b.root / "system/etc/passwd").read_bytes()
    r = adb_server.run("-s", b.serial, "pull", "/data/local/tmp/etc-link/hostname", str(tmp_path / "hostname"))
    assert r.returncode != 0 and not (tmp_path / "hostname").exists()
    # `..` that stays inside the root is an ordinary path
    sync = RawSync(adb_server, b.serial)
    try:
        sync.request(b"STAT", "/data/local/tmp/../tmp")
        ident, body = sync.reply()
        assert ident == b"STAT" and struct.unpack_from("<I", body)[0] & 0o170000 == 0o040000
    finally:
        sync.close()


# -- Android's userland and permissions ----------------------------------------------------------

def test_the_shell_is_mksh_and_toybox_as_the_shell_user(adb_server, phones):
    a = phones["a"]
    ident = sh(adb_server, a, "id").stdout.decode()
    assert ident.startswith("uid=2000(shell) gid=2000(shell) groups=2000(shell),1004(input),1007(log),1011(adb),")
    assert "3009(readproc)" in ident
    assert sh(adb_server, a, "readlink /system/bin/sh").stdout == b"mksh\n"
    assert sh(adb_server, a, "echo $KSH_VERSION").stdout.startswith(b"@(#)MIRBSD KSH")
    applets = set(sh(adb_server, a, "ls /system/bin/").stdout.decode().split())
    assert {"toybox", "mksh", "sh", "ls", "cat", "sha256sum", "stat", "pidof", "nproc", "getprop", "logcat",
            "dumpsys"} <= applets
    assert sh(adb_server, a, "readlink /system/bin/sha256sum").stdout == b"toybox\n"
    path = sh(adb_server, a, "echo $PATH").stdout.decode().strip()
    assert path == "/product/bin:/system_ext/bin:/system/bin:/odm/bin:/vendor/bin"
    assert sh(adb_server, a, "command -v python3 || command -v bash || command -v gawk").returncode != 0


def test_the_phone_sees_its_own_root_not_the_hosts(adb_server, phones):
    a = phones["a"]
    probe = Path(f"/tmp/vphone-probe-{os.getpid()}")
    w = sh(adb_server, a, f"echo x > {probe}")
    assert w.returncode != 0 and not probe.exists()
    shadow = sh(adb_server, a, "cat /etc/shadow")
    assert shadow.returncode != 0 and shadow.stdout == b""
    assert sh(adb_server, a, "ls /data").returncode != 0                      # 0771: walk, not list
    assert sh(adb_server, a, "touch /data/local/tmp/mine && stat -c %u:%g:%a /data/local/tmp").stdout == \
        b"2000:2000:771\n"
    top = set(sh(adb_server, a, "ls /").stdout.decode().split())
    assert {"system", "data", "proc", "sys", "dev", "vendor", "sdcard"} <= top
    # host folders appear only on the way to what an engine needs (the interpreter of bmoe-py, glibc),
    # e.g. /tmp when the project's .venv lives under /tmp, and stay unwritable (the probe above)
    from devices.virtual.namespace import HostPaths

    host = HostPaths.for_engines()
    needed = {p.strip("/").split("/")[0] for p in (*host.dirs, *host.files, *(link for link, _ in host.links))}
    assert not (top & {"tmp", "home", "var", "opt", "srv", "mnt", "boot"}) - needed
    assert sh(adb_server, a, "readlink /etc /bin").stdout == b"/system/etc\n/system/bin\n"
    # what engines need from the host is there, read-only
    assert sh(adb_server, a, f"{PY} -c 'import numpy'").returncode == 0
    assert sh(adb_server, a, f"touch {PY}").returncode != 0
    assert sh(adb_server, a, "echo x > /system/bin/x").returncode != 0
    # a phone refuses to drop caches to the shell user: the harness must not depend on it
    drop = sh(adb_server, a, "echo 3 > /proc/sys/vm/drop_caches")
    assert drop.returncode != 0 and b"denied" in drop.stderr


# -- the CLI ------------------------------------------------------------------------------------

def test_cli_up_list_down(adb_server, phone_home):
    name = f"cli{os.getpid()}"
    runner = CliRunner()
    up = runner.invoke(virtual, ["up", "--name", name, "--ram", "96MiB", "--model", "Moto G", "--android", "12",
                                 "--home", str(phone_home)])
    try:
        assert up.exit_code == 0, (up.output, up.exception)
        serial = up.stdout.strip()          # what this host cannot give is said on stderr
        assert re.fullmatch(r"127\.0\.0\.1:\d+", serial)
        assert adb_server.run("-s", serial, "shell", "getprop", "ro.product.model").stdout == b"Moto G\n"
        listed = runner.invoke(virtual, ["list", "--home", str(phone_home)]).output
        assert re.search(rf"^{name} +{re.escape(serial)} +96 MiB  Moto G", listed, re.M)
        again = runner.invoke(virtual, ["up", "--name", name, "--ram", "96MiB", "--home", str(phone_home)])
        assert again.exit_code == 1 and isinstance(again.exception, BmoeError)
    finally:
        cgroup_path = manager.info(name, phone_home).cgroup_path
        twice = runner.invoke(virtual, ["down", name, "--name", "other", "--home", str(phone_home)])
        # as `up` takes it: --name NAME, the same as NAME
        down = runner.invoke(virtual, ["down", "--name", name, "--home", str(phone_home)])
    assert twice.exit_code == 2 and "two names given" in twice.output, twice.output
    assert down.exit_code == 0 and down.output == f"stopped {name}\n"
    assert cgroup_path is None or not Path(cgroup_path).exists()
    assert serial not in adb_server.run("devices").stdout.decode()
    bad = runner.invoke(virtual, ["up", "--name", "x", "--ram", "lots", "--home", str(phone_home)])
    assert bad.exit_code == 1 and isinstance(bad.exception, BmoeError)


def test_without_isolation_a_watchdog_enforces_ram(adb_server, make_phone, capfd):
    phone = make_phone(f"flat{os.getpid()}", 160 << 20, isolated=False)
    err = capfd.readouterr().err
    assert err.count("isolation off") == 1 and "RSS watchdog" in err  # said once, on stderr
    assert phone.cgroup_path is None
    hold = ALLOC.replace("print('survived'", "__import__('time').sleep(5); print('survived'")
    r = sh(adb_server, phone, f"{PY} -c {shlex.quote(hold)} 400")
    assert r.returncode == 137 and b"survived" not in r.stdout
    pid = int(r.stdout.split()[0])
    # the watchdog stands in for the kernel's OOM killer: a kernel line, the shell's process being
    # nothing lmkd may kill
    from devices.virtual import logbuf
    assert wait_for(lambda: [e for e in logbuf.read(phone.root, ["kernel"]) if f"Killed process {pid} (" in e.message])
    assert f"({pid})" not in adb_server.run("-s", phone.serial, "logcat", "-d").stdout.decode()
    mem = sh(adb_server, phone, "cat /proc/meminfo").stdout.decode()
    assert "MemTotal:" in mem and f"{(160 << 20) // 1024} kB" not in mem.splitlines()[0]  # the host's file
    assert sh(adb_server, phone, "getprop ro.bmoe.ram_bytes").stdout == str(160 << 20).encode() + b"\n"


def test_android_11_phone_logs_the_older_lmkd_format(adb_server, make_phone):
    phone = make_phone(f"old{os.getpid()}", 128 << 20, android=11)
    # an engine run as the app (lmkd's to kill, with its app); without swap the kernel's kill in
    # the app's process group stands in for lmkd's kill of the app
    r = sh(adb_server, phone, f"am run-as-app --adj 0 -- {alloc_engine(phone, 'alloc11')} 512")
    assert r.returncode == 137
    pid = int(r.stdout.split()[0])
    pattern = (rf"lowmemorykiller: Kill 'io\.bigmoeonedge\.example' \((\d+)\), uid {app_uid(phone.root, 10200)}, "
               r"oom_adj 0 to free \d+kB; reason: ")
    # a loaded host (the whole suite) has been seen to take over 5 s to log it: wait longer, and
    # say what was logged instead when the line never comes
    logged = wait_for(lambda: re.search(pattern, adb_server.run("-s", phone.serial, "logcat", "-d").stdout.decode()),
                      timeout_s=20)
    if not logged:
        pytest.fail(f"no lmkd line for the app of pid {pid}; {_lmkd_evidence(adb_server, phone)}")
    assert int(logged[1]) != pid


def _lmkd_evidence(adb_server, phone) -> str:
    """What a failing lmkd test should print: the phone's last lmkd and kernel lines, and its daemon's log."""
    lines = adb_server.run("-s", phone.serial, "logcat", "-d", "-b", "all").stdout.decode().splitlines()
    daemon_log = Layout(phone.root).daemon_log
    tail = daemon_log.read_text(errors="replace").splitlines()[-15:] if daemon_log.exists() else []
    return (f"lmkd/kernel lines: {[ln for ln in lines if 'lowmemorykiller' in ln or 'Killed process' in ln][-5:]}; "
            f"daemon log: {tail}")


def test_kills_in_quick_succession_are_each_named_as_lmkd_names_them(adb_server, phones):
    """Three engines run as the app, one after another, each past the RAM at once: three apps
    killed. A dying process has lost its cmdline before the kernel's line arrives; lmkd once
    sampled it then and logged the kernel's comm ('allocnow') instead of its name (seen in 1 of 3
    kills): each lmkd line names the app by its package, each kernel line the engine by its comm."""
    from devices.virtual import logbuf

    c = phones["c"]  # 256 MiB
    engine = alloc_engine(c, "allocnow")

    def named() -> list[str]:
        out = adb_server.run("-s", c.serial, "logcat", "-d", "-b", "main").stdout.decode()
        return [ln for ln in out.splitlines() if "lowmemorykiller: Kill " in ln]

    before = len(named())
    r = sh(adb_server, c, f"for i in 1 2 3; do am run-as-app --adj 0 -- {engine} 1024 0; done")
    assert r.returncode == 137, (r.returncode, r.stdout, r.stderr)
    pids = [int(x) for x in r.stdout.split()]
    assert len(pids) == 3 and b"survived" not in r.stdout
    lines = wait_for(lambda: len(named()) >= before + 3 and named()[before:], timeout_s=10)
    assert lines and len(lines) == 3, f"{lines}; {_lmkd_evidence(adb_server, c)}"
    for line in lines:
        assert "Kill 'io.bigmoeonedge.example' (" in line, f"{line}; {_lmkd_evidence(adb_server, c)}"
    kernel = [e.message for e in logbuf.read(c.root, ["kernel"]) if any(f"Killed process {p} " in e.message
                                                                        for p in pids)]
    assert len(kernel) == 3 and all(" (allocnow) " in k for k in kernel), kernel
