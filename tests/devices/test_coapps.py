"""Other apps beside the engine (devices/coapps.py, devices/coapp.c): built here, pushed through the
real adb server to a virtual phone, started at their state's oom_score_adj inside the phone,
holding their memory, stopped; leftovers of a crashed campaign killed by the next start; and
lmkd's hard kills of other processes told apart from its soft ones."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import time
from pathlib import Path

import pytest

from devices import coapps
from devices.adb.phone import AdbPhone
from devices.adb.server import AdbServer as Server
from devices.android import HOST_ABI, AppSpecError, parse_apps, parse_load
from devices.lmk import LmkEvent, hard_kills_of_others
from engine.units import MIB
from tests.devices.conftest import host_pid


def status_of(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def test_the_app_holds_its_memory_under_its_name(tmp_path):
    binary = coapps.build(HOST_ABI[platform.machine()], tmp_path)
    assert coapps.build(HOST_ABI[platform.machine()], tmp_path) == binary          # cached by source and ABI
    for compressible, active in ((False, False), (True, True)):
        proc = subprocess.Popen([str(binary), "co.cached1", str(24 * MIB), str(int(compressible)), str(int(active)),
                                 "4", "100"], stdout=subprocess.PIPE)
        try:
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
            st = status_of(proc.pid)
            assert st["Name"] == "co.cached1" and int(st["VmRSS"].split()[0]) >= 24 * 1024, st
            held = _held(proc.pid, 24 * MIB)
            pages = [held[i:i + 4096] for i in range(0, len(held), 4096)]
            if compressible:       # each page: 1365 random bytes, then zeros
                assert all(page[1365:] == bytes(4096 - 1365) and page[:1365].count(0) < 50 for page in pages)
            else:                  # random bytes throughout: a zero in 256
                assert held.count(0) < len(held) // 100
        finally:
            proc.kill()
            proc.communicate()
    bad = subprocess.run([str(binary), "x", "0", "0", "0", "4", "100"], capture_output=True, text=True)
    assert bad.returncode == 2 and "bad size" in bad.stderr


def _held(pid: int, size: int) -> bytes:
    """The app's memory: its one anonymous mapping of `size` bytes, read through /proc (its parent may)."""
    with open(f"/proc/{pid}/maps") as f:
        spans = [[int(x, 16) for x in line.split()[0].split("-")] for line in f if len(line.split()) == 5]
    (start, _), = [(a, b) for a, b in spans if b - a == size]
    with open(f"/proc/{pid}/mem", "rb") as mem:
        mem.seek(start)
        return mem.read(size)


def test_loads_parse_as_apps():
    assert parse_load("none") == [] and parse_load("") == []
    cached, perceptible = parse_load("cached:64MiB + perceptible:32MiB:active")
    assert (cached.oom_score_adj, cached.size_bytes, perceptible.oom_score_adj, perceptible.active) == \
        (900, 64 * MIB, 200, True)
    assert [coapps.process_name(a) for a in (cached, perceptible)] == ["co.cached1", "co.perceptible1"]



@pytest.mark.parametrize("load", ["cached:32MiB+", "+cached:32MiB", "a++b", "cached:1MiB++visible:2MiB", " + "])
def test_a_load_with_an_empty_item_is_refused_not_shortened(load):
    with pytest.raises(AppSpecError, match="an empty item"):
        parse_load(load)
    with pytest.raises(AppSpecError, match="an empty item"):
        parse_apps(load.replace("+", ","))


@pytest.mark.parametrize("size", ["9" * 400, "9" * 400 + "MiB", "1" * 5000 + "G", "2000GiB", "１２MiB", "٣٠٠MiB",
                                  "1_000MiB", "1e3MiB", "0MiB", "0.0000001K", "32MiB\nx"])
def test_an_app_size_is_ascii_digits_above_0_and_below_a_tib_with_one_clean_error(size):
    with pytest.raises(AppSpecError) as error:
        parse_load(f"cached:{size}")
    message = str(error.value)
    assert "\n" not in message and len(message) < 300 and "size" in message, message

def test_apps_start_in_the_phone_at_their_adj_and_stop(adb_server, make_phone, tmp_path):
    phone_info = make_phone("coapps", 256 * MIB)
    phone = AdbPhone(phone_info.serial, Server("127.0.0.1", adb_server.port))
    binary = coapps.build(HOST_ABI[platform.machine()], tmp_path)
    apps = parse_load("cached:24MiB+perceptible:16MiB:active")
    session = coapps.start(phone, apps, binary)
    running = session.running
    try:
        assert [r.ready for r in running] == [True, True]
        for r, want_adj in zip(running, (900, 200)):
            pid = host_pid(phone_info.root, r.pid)       # the phone's pid is its own namespace's
            st = status_of(pid)
            assert st["Name"] == r.process_name and int(st["VmRSS"].split()[0]) >= r.app.size_bytes // 1024 * 0.9
            with open(f"/proc/{pid}/oom_score_adj") as f:
                assert int(f.read()) == want_adj
            with open(f"/proc/{pid}/cgroup") as f:     # in the phone's memory cgroup, charged to its RAM
                assert any(phone_info.name in line for line in f if ":memory:" in line)
            assert int(st["Uid"].split()[0]) == 2000      # the shell user that started it
        # a campaign that died leaves them running: the next start of these names kills them first
        again = coapps.start(phone, apps, binary)
        assert _all_gone(running, phone_info.root) and not _all_gone(again.running, phone_info.root, 0.5)
        for conn in session.connections:               # (the lost phone's shells, here still open)
            conn.close()
        session, running = again, again.running
    finally:
        gone = coapps.stop(phone, session)
    assert gone == [] and _all_gone(running, phone_info.root)
    assert coapps.stop(phone, session) == [r.process_name for r in running]       # already gone: named
    # a campaign that dies closes the shell with it: the phone hangs up the apps
    crashed = coapps.start(phone, apps[:1], binary)
    assert not _all_gone(crashed.running, phone_info.root, 0.5)
    crashed.connections[0].close()
    assert _all_gone(crashed.running, phone_info.root)


def _all_gone(running, phone_root, wait_s: float = 5.0) -> bool:
    deadline = time.monotonic() + wait_s
    while any(_alive(host_pid(phone_root, r.pid)) for r in running):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return re.sub(r"^.*\) ", "", f.read())[0] not in "ZX"
    except FileNotFoundError:
        return False


def test_lmkds_kills_past_its_soft_level_are_told_apart():
    def kill(pid, name, adj, source="lmkd"):
        return LmkEvent(source=source, fmt="android12+", pid=pid, name=name, oom_score_adj=adj)

    engine = kill(10, "/data/local/tmp/bmoe/bmoe-cli", 0)
    events = [kill(11, "co.cached1", 900), kill(12, "co.perceptible1", 200), kill(12, None, 200, "killinfo"),
              kill(13, "com.android.systemui", 0), engine, kill(14, "x", 200, "kernel-oom")]
    assert hard_kills_of_others(events, [engine]) == ["co.perceptible1 (oom_score_adj 200)",
                                                      "com.android.systemui (oom_score_adj 0)"]
    assert hard_kills_of_others([kill(11, "co.cached1", 900)], []) == []


def test_two_campaigns_building_the_app_at_once_both_get_it(tmp_path):
    """Two sweeps on one host (a lab, or the suite's two engines side by side) build the app into
    the same cache at the same moment: each writes a partial of its own, neither loses its rename."""
    import threading

    abi = HOST_ABI[platform.machine()]
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(_build_or_error(abi, tmp_path))) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert len(results) == 4 and all(isinstance(r, Path) for r in results), results
    assert len(set(results)) == 1 and os.access(results[0], os.X_OK)
    assert [p.name for p in results[0].parent.iterdir()] == [results[0].name]      # no partial left


def _build_or_error(abi, cache):
    try:
        return coapps.build(abi, cache)
    except Exception as e:   # reported by the assertion
        return e


def _elf(path: Path) -> tuple[int, bool]:
    """(e_machine, has a PT_INTERP header) of a little-endian ELF, 32- or 64-bit."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] in (1, 2) and data[5] == 1, data[:8]
    word = 4 * data[4]                      # ELFCLASS32 1, ELFCLASS64 2
    machine = int.from_bytes(data[18:20], "little")
    phoff = int.from_bytes(data[24 + word:24 + 2 * word], "little")
    phentsize, phnum = (int.from_bytes(data[30 + 3 * word:32 + 3 * word], "little"),
                        int.from_bytes(data[32 + 3 * word:34 + 3 * word], "little"))
    types = [int.from_bytes(data[phoff + i * phentsize:phoff + i * phentsize + 4], "little") for i in range(phnum)]
    return machine, 3 in types


# a phone's ABI, the ELF machine of its binary (EM_AARCH64, EM_ARM, EM_386) and the qemu that runs it here
ZIG_BUILDS = [("arm64-v8a", 183, "/usr/bin/qemu-aarch64-static"), ("armeabi-v7a", 40, "/usr/bin/qemu-arm-static"),
              ("x86", 3, "/usr/bin/qemu-i386-static")]


@pytest.mark.qemu
@pytest.mark.parametrize("abi, machine, qemu", ZIG_BUILDS, ids=[b[0] for b in ZIG_BUILDS])
def test_a_phone_without_an_ndk_gets_a_static_app_from_zig(abi, machine, qemu, tmp_path, monkeypatch):
    """A real phone is arm64 (older ones 32-bit ARM, some x86): with no NDK the app is built by
    zig's clang (the ziglang wheel) as a static binary of devices/coapp.c alone, with no libc (its
    own entry point and system calls), which Android's kernel runs with nothing of its libc. So zig
    builds no musl and no compiler-rt into its cache: the build is one file's. It is run here under
    qemu's user emulation: it names itself, fills its memory and says ready, as on a phone."""
    if not os.path.exists(qemu):
        pytest.skip(f"{qemu} is missing (Debian's qemu-user-static; run.sh test installs it)")
    monkeypatch.delenv("ANDROID_NDK_HOME", raising=False)
    monkeypatch.delenv("ANDROID_NDK_ROOT", raising=False)
    if HOST_ABI.get(platform.machine()) == abi:
        pytest.skip(f"{abi} is this host's ABI: built by its cc, not zig")
    binary = coapps.build(abi, tmp_path)
    assert _elf(binary) == (machine, False)                 # no program interpreter: static
    assert (tmp_path / "zig-cache").is_dir() and not (Path.home() / ".cache" / "zig").exists()   # its cache is ours
    built = [p.name for p in (tmp_path / "zig-cache").rglob("*") if p.suffix in (".a", ".o")]
    assert built == ["coapp.o"], built                      # no libc.a, crt1.o, libcompiler_rt.a
    with subprocess.Popen([qemu, str(binary), "co.zig1", str(4 << 20), "0", "1", "4", "100"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        try:
            line = proc.stdout.readline()
            assert line == b"ready\n", line
            assert proc.poll() is None                      # it holds its memory until killed
            assert status_of(proc.pid)["Name"] == "co.zig1"  # qemu passes its prctl on
        finally:
            proc.kill()
    bad = subprocess.run([qemu, str(binary), "co.zig1", "4096", "0", "1", "0", "100"], capture_output=True, text=True)
    assert (bad.returncode, bad.stderr) == (2, "bmoe-coapp: bad activity 0% every 100 ms\n")
    # a build no toolchain can make is refused in one line naming both ways to get one
    with pytest.raises(coapps.CoAppError, match=r"ANDROID_NDK_HOME .* or pip install ziglang"):
        coapps.build("mips", tmp_path)
