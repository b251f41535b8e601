"""A virtual phone is confined as a phone is (docs/decisions/vphone-confinement.md): a process on the phone can neither
win the sync service's race against a symlink it swaps, nor reach the host's loopback.

Real parts: the real adb server and CLI (adbutils wheel), a real phone daemon, a real phone-side
process (the venv's interpreter run by `adb shell` as the shell user in the phone's namespaces).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devices.adb.files import recv_exactly
from tests.devices.conftest import ADB
from tests.devices.test_virtual_adbd import RawSync

PY = shlex.quote(sys.executable)
HOST_SECRET = b"HOST SECRET: never to be read through a phone\n"
PHONE_BYTES = b"the phone's own file\n"
ROUNDS = 250
DNT2 = struct.Struct("<4sIQQIIIIQqqqI")

# Swap `d` (a folder holding the phone's `x`) with `alt` (a symlink to a host folder) as fast as
# rename can, atomically (renameat2 RENAME_EXCHANGE), until told to stop or the time bound runs out.
FLIPPER = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
os.chdir(sys.argv[1])
end = time.monotonic() + float(sys.argv[2])
n = 0
print("flipping", flush=True)
while time.monotonic() < end and not os.path.exists("stop"):
    for _ in range(100):
        if libc.renameat2(-100, b"d", -100, b"alt", 2) != 0:
            raise OSError(ctypes.get_errno(), "renameat2")
        n += 1
print(n, flush=True)
"""


@pytest.fixture
def host_folder():
    """A world-writable host folder holding a world-readable file: what a phone must never reach
    (not under pytest's 0700 temp folders, which would stop the shell user for the wrong reason)."""
    folder = Path(f"/tmp/vphone-race-{os.getpid()}")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    folder.chmod(0o1777)
    (folder / "x").write_bytes(HOST_SECRET)
    (folder / "x").chmod(0o644)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _list_inodes(sync: RawSync) -> list[int]:
    """The inodes of a LIS2 reply's entries (DNT2 ... DONE)."""
    inodes: list[int] = []
    while True:
        head = recv_exactly(sync.s, DNT2.size)
        fields = DNT2.unpack(head)
        if fields[0] == b"DONE":
            return inodes
        recv_exactly(sync.s, fields[-1])
        inodes.append(fields[3])


def test_a_phone_side_process_never_wins_the_sync_race(adb_server, phones, host_folder, tmp_path):
    phone = phones["b"]
    race = phone.root / "data/local/tmp/race"
    shutil.rmtree(race, ignore_errors=True)
    (race / "d").mkdir(parents=True)
    (race / "d/x").write_bytes(PHONE_BYTES)
    os.symlink(str(host_folder), race / "alt")           # an absolute host path
    for path in (race, race / "d", race / "d/x"):
        os.chown(path, 2000, 2000)
    os.lchown(race / "alt", 2000, 2000)
    flipper = subprocess.Popen([str(ADB), "-P", str(adb_server.port), "-s", phone.serial, "shell",
                                f"{PY} -c {shlex.quote(FLIPPER)} /data/local/tmp/race 45"],
                               env=adb_server.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    outcomes = {"phone": 0, "refused": 0, "host": 0}
    leaks: list[str] = []
    local = Path(f"/tmp/vphone-race-pull-{os.getpid()}")

    def host_created(what: str) -> None:
        extra = sorted(p.name for p in host_folder.iterdir() if p.name != "x")
        if extra:
            leaks.append(f"{what} created on the host: {extra}")
            for name in extra:
                path = host_folder / name
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()

    try:
        assert flipper.stdout is not None and flipper.stdout.readline() == b"flipping\n", flipper.stderr
        target = "/data/local/tmp/race/d/x"
        pushed = tmp_path / "pushed"
        pushed.write_bytes(b"pushed by the test\n")
        host_inodes = {host_folder.stat().st_ino, (host_folder / "x").stat().st_ino}
        t0 = time.monotonic()
        for i in range(ROUNDS):
            # adb pull: STAT (stat_v2) then RECV; adb push: STAT then SEND, parents created
            local.unlink(missing_ok=True)
            pull = adb_server.run("-s", phone.serial, "pull", target, str(local), timeout=30)
            got = local.read_bytes() if pull.returncode == 0 else b""
            outcomes["host" if HOST_SECRET in got else "phone" if got == PHONE_BYTES else "refused"] += 1
            adb_server.run("-s", phone.serial, "push", str(pushed), f"/data/local/tmp/race/d/sub/pushed-{i}",
                           timeout=30)
            host_created(f"push {i}")
        local.unlink(missing_ok=True)
        # stat and list requests in one session (they never FAIL, so it goes on), hundreds of them
        sync = RawSync(adb_server, phone.serial)
        try:
            for i in range(ROUNDS):
                for ident in (b"STA2", b"LST2"):
                    sync.request(ident, target)
                    _, body = sync.reply()      # errno, dev, ino, ...
                    if struct.unpack_from("<I", body)[0] == 0 and struct.unpack_from("<Q", body, 12)[0] in host_inodes:
                        leaks.append(f"{ident.decode()} {i} saw the host file")
                sync.request(b"LIS2", "/data/local/tmp/race/d")
                if host_inodes & set(_list_inodes(sync)):
                    leaks.append(f"LIS2 {i} listed the host folder")
        finally:
            sync.close()
        print(f"sync race: {time.monotonic() - t0:.1f} s")
    finally:
        (race / "stop").touch()
        local.unlink(missing_ok=True)
        try:
            out, err = flipper.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            flipper.kill()
            out, err = flipper.communicate()
        shutil.rmtree(race, ignore_errors=True)
    swaps = int(out.split()[-1]) if out.split() else 0
    print(f"sync race: {outcomes} with {swaps} swaps")
    assert flipper.returncode == 0, err
    assert sorted(p.name for p in host_folder.iterdir()) == ["x"]
    assert (host_folder / "x").read_bytes() == HOST_SECRET
    assert outcomes["host"] == 0 and not leaks, (outcomes, leaks)
    # the race was run: the folder was swapped under the pulls, both ways, many times
    assert swaps > 1000 and outcomes["phone"] > 0 and outcomes["refused"] > 0, (outcomes, swaps)


# Connect to each (family, address, port) of argv[1] (JSON) and to the abstract unix socket argv[2];
# for the adb server's port, ask it what the adb client asks first (host:version). One JSON line.
PROBE = """
import json, socket, sys
out = {}
for family, host, port, adb in json.loads(sys.argv[1]):
    s = socket.socket(socket.AF_INET6 if family == 6 else socket.AF_INET)
    s.settimeout(3)
    try:
        s.connect((host, port))
        if adb:
            s.sendall(b"000chost:version")
            out[f"{host}:{port}"] = "answered " + s.recv(4).decode()
        else:
            out[f"{host}:{port}"] = "connected"
    except OSError as e:
        out[f"{host}:{port}"] = type(e).__name__
    s.close()
u = socket.socket(socket.AF_UNIX)
try:
    u.connect("\\0" + sys.argv[2])
    out["unix"] = "connected"
except OSError as e:
    out["unix"] = type(e).__name__
print(json.dumps(out))
"""


def _listening_tcp_ports() -> set[tuple[int, str, int]]:
    """Every TCP port this host listens on at a loopback address or at all addresses (/proc/net/tcp*),
    as (family, loopback address to knock at, port)."""
    found = set()
    for family, name in ((4, "/proc/net/tcp"), (6, "/proc/net/tcp6")):
        with contextlib.suppress(OSError):
            for line in Path(name).read_text().splitlines()[1:]:
                fields = line.split()
                address, port = fields[1].split(":")
                if fields[3] != "0A":          # LISTEN
                    continue
                if family == 4 and (address == "00000000" or address.endswith("7F")):   # 0.0.0.0, 127/8
                    host = "127.0.0.1" if address == "00000000" else socket.inet_ntoa(bytes.fromhex(address)[::-1])
                    found.add((4, host, int(port, 16)))
                elif family == 6 and address in ("0" * 32, "0" * 24 + "01000000"):     # ::, ::1
                    found.add((6, "::1", int(port, 16)))
    return found


def test_a_phone_side_process_reaches_no_host_loopback_port(adb_server, phones):
    phone = phones["a"]
    listener = socket.create_server(("127.0.0.1", 0))
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0vphone-probe-{os.getpid()}")
    abstract.listen()
    try:
        port = listener.getsockname()[1]
        targets = {(4, "127.0.0.1", adb_server.port, True), (4, "127.0.0.1", port, False),
                   (4, "127.0.0.1", phone.port, False)}
        targets |= {(f, h, p, p == adb_server.port) for f, h, p in _listening_tcp_ports()}
        args = [json.dumps(sorted(targets)), f"vphone-probe-{os.getpid()}"]
        # the same probe on the host reaches them: it is a probe that could succeed
        on_host = json.loads(subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True,
                                            timeout=60, check=True).stdout)
        assert on_host[f"127.0.0.1:{adb_server.port}"] == "answered OKAY", on_host
        assert on_host[f"127.0.0.1:{port}"] == on_host[f"127.0.0.1:{phone.port}"] == "connected"
        assert on_host["unix"] == "connected"
        r = adb_server.run("-s", phone.serial, "shell", f"{PY} -c {shlex.quote(PROBE)} "
                           + " ".join(shlex.quote(a) for a in args), timeout=60)
        assert r.returncode == 0, r.stderr   # adb shell itself still works
        on_phone = json.loads(r.stdout)
        reached = {k: v for k, v in on_phone.items() if v not in ("ConnectionRefusedError", "OSError")}
        assert not reached, reached
        assert len(on_phone) == len(targets) + 1
    finally:
        listener.close()
        abstract.close()
    # the phone's processes are in a network namespace of their own, its loopback up, nothing else
    state = json.loads((phone.root / ".vphone/state.json").read_text())
    ns = adb_server.run("-s", phone.serial, "shell", "readlink /proc/self/ns/net; cat /proc/net/dev").stdout.decode()
    assert ns.splitlines()[0] == state["net_namespace"] != os.readlink("/proc/self/ns/net")
    interfaces = {ln.split(":")[0].strip() for ln in ns.splitlines()[3:] if ":" in ln}
    assert interfaces == {"lo"}, ns


def test_the_daemons_folder_and_fifos_lead_nowhere(adb_server, phones, tmp_path):
    """A phone-side symlink to `/.vphone` is walked inside the phone (the daemon's folder is not the
    phone's: ENOENT), and a FIFO pulled or pushed over fails at once instead of hanging the daemon."""
    b = phones["b"]
    setup = sh(adb_server, b, "cd /data/local/tmp && ln -sfn /.vphone v && rm -f fifo && mkfifo fifo")
    assert setup.returncode == 0, setup.stderr
    try:
        r = adb_server.run("-s", b.serial, "pull", "/data/local/tmp/v/state.json", str(tmp_path / "state.json"))
        assert r.returncode == 1 and not (tmp_path / "state.json").exists(), r.stderr
        sync = RawSync(adb_server, b.serial)
        try:
            sync.request(b"STA2", "/data/local/tmp/v/spec.json")
            ident, body = sync.reply()
            assert ident == b"STA2" and struct.unpack_from("<I", body)[0] == 2     # ENOENT
            sync.request(b"LIS2", "/")
            names = []
            while True:
                fields = DNT2.unpack(recv_exactly(sync.s, DNT2.size))
                if fields[0] == b"DONE":
                    break
                names.append(recv_exactly(sync.s, fields[-1]).decode())
            assert "data" in names and ".vphone" not in names, names
        finally:
            sync.close()
        t0 = time.monotonic()
        pull = adb_server.run("-s", b.serial, "pull", "/data/local/tmp/fifo", str(tmp_path / "fifo"), timeout=30)
        push = adb_server.run("-s", b.serial, "push", "/proc/version", "/data/local/tmp/fifo", timeout=30)
        assert time.monotonic() - t0 < 20 and push.returncode == 1, (pull, push)
        assert sh(adb_server, b, "echo alive").stdout == b"alive\n"
    finally:
        sh(adb_server, b, "rm -f /data/local/tmp/v /data/local/tmp/fifo")


def sh(server, phone, command: str):
    return server.run("-s", phone.serial, "shell", command)


def test_a_phone_sees_reads_writes_and_kills_none_of_another_phones_processes(adb_server, phones):
    """Each phone's processes are in a pid namespace of their own: from phone a, phone b's process
    (by its host pid and by the pid phone b knows it by) is not in /proc, its /proc/PID/root leads
    to none of b's files, and `kill -9` reaches it not; b's process lives on, b's file is unchanged.
    Phone a's own process is reachable the same way (the probes could succeed). And each phone's
    apps have uids of their own."""
    a, b = phones["a"], phones["b"]

    def sh(phone, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return adb_server.run("-s", phone.serial, "shell", command, timeout=timeout)

    # a long-lived process on each phone, holding a file in its /data/local/tmp
    for p in (a, b):
        assert sh(p, "echo secret-$(getprop ro.product.model) >/data/local/tmp/f").returncode == 0
    started = {p.name: sh(p, "sleep 300 </dev/null >/dev/null 2>&1 & echo $!").stdout.decode().strip() for p in (a, b)}
    try:
        b_phone_pid = int(started[b.name])
        b_host = [int(x) for x in (Path(b.cgroup_path) / "cgroup.procs").read_text().split()
                  if Path(f"/proc/{x}/cmdline").read_bytes().startswith(b"sleep")] if b.cgroup_path else []
        assert b_host, "phone b's sleep is not in its cgroup"
        b_host_pid = b_host[0]
        assert b_host_pid != b_phone_pid     # phone b knows it by its own namespace's pid
        # phone a's own process: reachable, so each probe below could succeed
        mine = int(started[a.name])
        own = sh(a, f"cat /proc/{mine}/root/data/local/tmp/f; ls /proc/{mine}/cmdline").stdout.decode()
        assert "secret-" in own and "cmdline" in own, own
        # phone a's /proc holds only its own processes
        listed = {int(x) for x in sh(a, "ls /proc").stdout.decode().split() if x.isdigit()}
        assert 1 in listed and mine in listed and b_host_pid not in listed
        for pid in {b_host_pid} | ({b_phone_pid} - listed):
            r = sh(a, f"cat /proc/{pid}/root/data/local/tmp/f; echo x >/proc/{pid}/root/data/local/tmp/x; "
                      f"kill -9 {pid}; echo done")
            out = r.stdout.decode()
            assert "secret-" not in out and out.strip().endswith("done"), out
        assert Path(f"/proc/{b_host_pid}").exists(), "phone a killed phone b's process"
        assert sh(b, f"kill -0 {b_phone_pid} && echo alive").stdout.decode().strip() == "alive"
        assert not (b.root / "data/local/tmp/x").exists()
        assert (b.root / "data/local/tmp/f").read_text().startswith("secret-")
        # each phone's apps run as uids of its own: the same package, another uid on the other phone
        uids = {p.name: sh(p, "am run-as-app --adj 0 -- sh -c 'grep ^Uid: /proc/$$/status'").stdout.decode().split()
                for p in (a, b)}
        assert all(len(u) == 5 and int(u[1]) >= 10000 for u in uids.values()), uids
        assert uids[a.name][1] != uids[b.name][1], uids
        # what each phone calls pid 1 is its own init, not the host's
        inits = {p.name: json.loads((p.root / ".vphone/state.json").read_text())["init_pid"] for p in (a, b)}
        assert len(set(inits.values())) == 2 and all(inits.values()), inits
        for p in (a, b):
            assert sh(p, "readlink /proc/self/ns/pid").stdout.decode().strip() == \
                os.readlink(f"/proc/{inits[p.name]}/ns/pid") != os.readlink("/proc/self/ns/pid")
    finally:
        for p in (a, b):
            sh(p, f"kill -9 {started[p.name]}")
