"""Fixtures for campaign tests: an isolated ~/.bmoe-fleet, small real models, campaign files, a CLI
group holding the campaign commands, and (for the virtual-phone tests) the real adb server from
the adbutils wheel on a free port with virtual phones connected to it.

Everything started here is stopped here, pass or fail.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import adbutils
import click
import pytest

from engine.synth import synth_options, write_model
from harness.cli import _Group
from harness.cli_campaign import COMMANDS

ADB = Path(adbutils.__file__).parent / "binaries" / "adb"


@pytest.fixture(scope="session", autouse=True)
def fleet_home(tmp_path_factory) -> Path:
    """Locks, staged engines and the local work dir go to a temp folder, never ~/.bmoe-fleet."""
    home = tmp_path_factory.mktemp("fleet-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BMOE_FLEET_HOME", str(home))
        yield home


@pytest.fixture(scope="session")
def harness_models(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("harness-models")


@pytest.fixture(scope="session")
def tiny_model(harness_models) -> Path:
    """0.6 MiB qwen3moe, 3 layers x 8 experts, top-2: a run of a few tokens takes ~0.3 s."""
    path = harness_models / "tiny.gguf"
    write_model(path, synth_options("qwen3moe", layers=3, experts=8, top_k=2, hidden=64, expert_ffn=96, vocab=300,
                                    seed=7))
    return path


@pytest.fixture(scope="session")
def mid_model(harness_models) -> Path:
    """~49 MiB qwen3moe (4 layers x 16 experts, top-4, token cycle ~11 MiB): resident, it needs
    ~110 MiB of RAM; streamed, ~70 MiB."""
    path = harness_models / "mid.gguf"
    write_model(path, synth_options("qwen3moe", size_bytes=48 << 20, seed=1))
    return path


@pytest.fixture(scope="session")
def gptoss_120b_shape(harness_models) -> Path:
    """gpt-oss-120b's real header on a sparse file (prices only; no weights on disk)."""
    path = harness_models / "gpt-oss-120b.gguf"
    write_model(path, synth_options("gpt-oss-120b", shape_only=True))
    return path


def write_campaign(folder: Path, text: str, name: str = "camp.toml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


@pytest.fixture
def cli() -> click.Group:
    """A bmoe-fleet group holding the campaign commands (registered here, not in harness/cli.py)."""
    group = _Group("bmoe-fleet")
    for command in COMMANDS:
        group.add_command(command)
    return group


# ── adb server and virtual phones ─────────────────────────────────────────────────────────────


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_pids(port: int) -> list[int]:
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


@pytest.fixture(scope="module")
def adb_port(tmp_path_factory) -> int:
    port = free_port()
    home = tmp_path_factory.mktemp("android-home")
    env = dict(os.environ, ANDROID_ADB_SERVER_PORT=str(port), ADB_MDNS="0", ANDROID_USER_HOME=str(home))
    started = subprocess.run([str(ADB), "-P", str(port), "start-server"], env=env, capture_output=True, timeout=60,
                             stdin=subprocess.DEVNULL)
    assert started.returncode == 0, started.stderr
    with pytest.MonkeyPatch.context() as mp:
        for key in ("ANDROID_ADB_SERVER_PORT", "ADB_MDNS", "ANDROID_USER_HOME"):
            mp.setenv(key, env[key])
        try:
            yield port
        finally:
            subprocess.run([str(ADB), "-P", str(port), "kill-server"], env=env, capture_output=True, timeout=30,
                           stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + 5
            while _server_pids(port) and time.monotonic() < deadline:
                time.sleep(0.1)
            for pid in _server_pids(port):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def phone_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("harness-vphones")


@pytest.fixture(scope="module")
def phones(adb_port, phone_home):
    """Two virtual phones up at once: `roomy` (384 MiB) and `tight` (96 MiB, Android 13)."""
    from devices.virtual import manager

    started = []
    try:
        for name, ram, kw in (("roomy", 384 << 20, {"model": "Pixel 8"}),
                              ("tight", 96 << 20, {"model": "Redmi Note 12", "android": 13})):
            manager.up(name, ram, home=phone_home, adb_host="127.0.0.1", adb_port=adb_port, **kw)
            started.append(name)
        yield {name: manager.info(name, phone_home) for name in started}
    finally:
        infos = [manager.info(n, phone_home) for n in started]
        manager.down(all_phones=True, home=phone_home, adb_host="127.0.0.1", adb_port=adb_port)
        leftovers = [i.cgroup_path for i in infos if i.cgroup_path and Path(i.cgroup_path).exists()]
        assert not leftovers, f"cgroups left behind: {leftovers}"
