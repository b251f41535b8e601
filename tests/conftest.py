"""Shared fixtures: real GGUF files written with engine.gguf.synth (small, so the suite stays fast)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.gguf.synth import synth_options, write_model

FIXTURES = Path(__file__).parent / "fixtures"
UPSTREAM_HOST = FIXTURES / "upstream" / "host-v2-0.19.0"


# The tests that measure this host's memory, swap, page cache or speed (marked `serial`): `run.sh test`
# runs them alone, after the rest runs on two workers (pytest-xdist). Beside another test they fail
# as a phone beside another phone would not: swap devices are the kernel's, so another phone's zram
# takes a share of this one's swap-outs, and two decodes share two cores. A file, or one test in it.
SERIAL = (
    "devices/test_lmk_backstop.py", "devices/test_lmkd_apps.py", "devices/test_lmkd_zram.py",
    "devices/test_local.py", "devices/test_reclaim.py", "devices/test_vphone_fought.py",
    "devices/test_vphone_memory.py", "devices/test_vphone_page_cache.py", "devices/test_vphone_profiles.py",
    "devices/test_vphone_storage.py", "devices/test_vphone_swapping.py", "devices/test_vphone_turns.py",
    "engine/test_larger_than_ram.py",
    "harness/test_adaptive.py", "harness/test_cli.py::test_demo_writes_and_prices_a_model",
    "harness/test_preset_app.py", "harness/test_turns.py",
    "results/test_analyze.py", "results/test_app_rung.py", "results/test_fought.py",
    "results/test_outputs.py::test_the_run_table_carries_each_runs_reclaim", "results/test_predict.py",
    "results/test_site_turns.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        node = item.nodeid.removeprefix("tests/")
        if any(node == s or node.startswith(s + "::") for s in SERIAL):
            item.add_marker(pytest.mark.serial)


@pytest.fixture(scope="session", autouse=True)
def fleet_home(tmp_path_factory) -> Path:
    """Locks, staged engines and virtual phones go to a temp folder, never ~/.bmoe-fleet; HOME too,
    so what the tools write under ~ (adb records each server it starts in ~/.android/adb.PORT) stays
    out of the user's home."""
    home = tmp_path_factory.mktemp("fleet-home")
    user_home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BMOE_FLEET_HOME", str(home))
        mp.setenv("HOME", str(user_home))
        yield home


@pytest.fixture(scope="session")
def bmoe_cli() -> Path:
    """The real engine, bmoe-cli (its shared libraries beside it), from $BMOE_CLI. `.ci/run` sets it
    when ../shared/peer holds the build; a user's clone without it skips these tests, saying why."""
    path = os.environ.get("BMOE_CLI", "")
    if not path:
        pytest.skip("BMOE_CLI is not set: no real bmoe-cli to compare with (.ci/run sets it on CI)")
    cli = Path(path)
    assert cli.is_file() and os.access(cli, os.X_OK), f"BMOE_CLI={path} is not an executable file"
    return cli


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


def make_model(folder: Path, name: str, preset: str = "qwen3moe", **dims) -> Path:
    path = folder / name
    if not path.exists():
        write_model(path, synth_options(preset, **dims))
    return path


@pytest.fixture(scope="session")
def small_qwen(models_dir) -> Path:
    """3 layers, 8 experts, top-2, hidden 64, expert FFN 96, Q8_0 experts."""
    return make_model(models_dir, "small-qwen.gguf", "qwen3moe", layers=3, experts=8, top_k=2,
                      hidden=64, expert_ffn=96, vocab=300, quant="Q8_0", seed=7)


@pytest.fixture(scope="session")
def small_gptoss(models_dir) -> Path:
    """2 layers, 4 experts, top-2, hidden 64, expert FFN 32, MXFP4 experts."""
    return make_model(models_dir, "small-gptoss.gguf", "gpt-oss", layers=2, experts=4, top_k=2,
                      hidden=64, expert_ffn=32, vocab=260, seed=3)


# ---- memory cgroups (root only; CI runs as root) -------------------------------------------------
import contextlib  # noqa: E402
import signal  # noqa: E402
import uuid  # noqa: E402


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int):
    """A fresh memory cgroup (v2 or v1) limited to `limit_bytes`, no swap; removed afterwards."""
    v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
    base = "/sys/fs/cgroup" if v2 else "/sys/fs/cgroup/memory"
    assert os.access(base, os.W_OK), "these tests run as root with a writable memory cgroup"
    path = os.path.join(base, f"bmoe-test-{uuid.uuid4().hex[:8]}")
    os.mkdir(path)
    try:
        knobs = [("memory.max", limit_bytes), ("memory.swap.max", 0)] if v2 else [
            ("memory.limit_in_bytes", limit_bytes), ("memory.memsw.limit_in_bytes", limit_bytes)]
        for knob, value in knobs:
            if os.path.exists(os.path.join(path, knob)):
                with open(os.path.join(path, knob), "w") as fh:
                    fh.write(str(value))
        yield path
    finally:
        with contextlib.suppress(OSError), open(os.path.join(path, "cgroup.procs")) as fh:
            for pid in fh.read().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        for _ in range(50):
            try:
                os.rmdir(path)
                break
            except OSError:
                import time

                time.sleep(0.1)


def in_cgroup(cgroup: str, argv: list[str]) -> list[str]:
    """argv that first moves itself into `cgroup`, then execs the command."""
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup, *argv]


# ---- the real adb server (the binary in the adbutils wheel) -------------------------------------
import socket  # noqa: E402
import subprocess  # noqa: E402
import time as _time  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def adb_server_pids(port: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"adb") and b"fork-server" in cmd and str(port).encode() in b" ".join(cmd):
                pids.append(int(entry))
    return pids


def adb_server_binary() -> Path:
    """The real adb binary the tests run: the one inside the adbutils wheel."""
    import adbutils

    return Path(adbutils.__file__).parent / "binaries" / "adb"


@contextlib.contextmanager
def running_adb_server(user_home: Path):
    """Start the real adb server on a free port (its keys in `user_home`, no mDNS), point this
    process's environment at it, and stop it afterwards, pass or fail. Yields (port, env)."""
    adb = adb_server_binary()
    port = free_port()
    env = dict(os.environ, ANDROID_ADB_SERVER_PORT=str(port), ADB_MDNS="0", ANDROID_USER_HOME=str(user_home))
    started = subprocess.run([str(adb), "-P", str(port), "start-server"], env=env, capture_output=True, timeout=60,
                             stdin=subprocess.DEVNULL)
    assert started.returncode == 0, started.stderr
    with pytest.MonkeyPatch.context() as mp:
        for key in ("ANDROID_ADB_SERVER_PORT", "ADB_MDNS", "ANDROID_USER_HOME"):
            mp.setenv(key, env[key])
        try:
            yield port, env
        finally:
            stop_adb_server(port, env)


def stop_adb_server(port: int, env: dict) -> None:
    """`adb kill-server` on `port`, then SIGKILL whatever server process is still there."""
    adb = adb_server_binary()
    subprocess.run([str(adb), "-P", str(port), "kill-server"], env=env, capture_output=True, timeout=30,
                   stdin=subprocess.DEVNULL)
    deadline = _time.monotonic() + 5
    while adb_server_pids(port) and _time.monotonic() < deadline:
        _time.sleep(0.1)
    for pid in adb_server_pids(port):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def cli():
    """The bmoe-fleet click group, every command registered."""
    from harness.cli.main import main

    return main
