"""Fixtures: the real adb server from the adbutils wheel on a free port, and virtual phones.

Everything started here is stopped here, test failures or not: phones (daemons, cgroups) by
manager.down(), the adb server by `adb kill-server` and, failing that, by its pid.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import adbutils
import pytest

from devices.adb.server import AdbServer as DeviceAdbServer
from devices.virtual import manager, zram
from engine.gguf.synth import synth_options, write_model
from tests.conftest import adb_server_binary, running_adb_server

ADB = adb_server_binary()
NO_ZRAM = zram.available()
needs_zram = pytest.mark.skipif(NO_ZRAM is not None, reason=f"no zram on this host: {NO_ZRAM}")
UNIFORM_MODEL_BYTES = 128 << 20
# The reclaim war's model: its dense set is about half a 256 MiB phone's RAM, as gpt-oss-120b's
# 4.14 GiB is a third to a half of the phones upstream ran it on (docs/decisions/reclaim-war.md).
WAR_MODEL_BYTES, WAR_MODEL_VOCAB = 384 << 20, 32768


@dataclass(frozen=True)
class AdbServer:
    port: int
    env: dict

    def run(self, *args: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        """The real adb CLI against this server."""
        if "input" not in kw:
            kw["stdin"] = subprocess.DEVNULL
        return subprocess.run([str(ADB), "-P", str(self.port), *args], env=self.env, capture_output=True,
                              timeout=timeout, **kw)

    def client(self) -> adbutils.AdbClient:
        return adbutils.AdbClient(host="127.0.0.1", port=self.port)


@dataclass(frozen=True)
class Phone:
    name: str
    serial: str
    ram_bytes: int
    model: str
    root: Path
    port: int
    cgroup_path: str | None


@pytest.fixture(scope="session")
def adb_server(tmp_path_factory) -> AdbServer:
    with running_adb_server(tmp_path_factory.mktemp("android-user-home")) as (port, env):
        yield AdbServer(port, env)



@pytest.fixture(scope="session")
def server(adb_server) -> DeviceAdbServer:
    """The adb server as the harness's devices/adb client sees it."""
    return DeviceAdbServer("127.0.0.1", adb_server.port)

@pytest.fixture(scope="session")
def phone_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vphones")


def host_pid(phone_root: Path, pid: int) -> int:
    """The host's pid of a process the phone at `phone_root` knows as `pid` (its own pid
    namespace's: devices/virtual/namespace.py); -1 when it has none (gone)."""
    from devices.virtual import namespace

    ns = json.loads((Path(phone_root) / ".vphone/state.json").read_text()).get("pid_namespace")
    if ns is None:
        return pid
    found = namespace.host_pid(ns, pid)
    return -1 if found is None else found


def app_uid(phone_root: Path, uid: int) -> int:
    """An app uid as the phone at `phone_root` assigns it: each phone up at a time has its own
    block of app uids (devices.virtual.run.claim_app_uids), `uid` being the first block's."""
    state = json.loads((Path(phone_root) / ".vphone/state.json").read_text())
    return uid + int(state.get("app_uid_offset") or 0)


def wait_for(predicate, timeout_s: float = 5.0, step_s: float = 0.1):
    """`predicate()`'s first true value, polled every `step_s`, or its last value after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step_s)


def start_phone(server: AdbServer, home: Path, name: str, ram_bytes: int, **kw) -> Phone:
    serial = manager.up(name, ram_bytes, home=home, adb_host="127.0.0.1", adb_port=server.port, **kw)
    info = manager.info(name, home)
    return Phone(name=name, serial=serial, ram_bytes=ram_bytes, model=info.model, root=info.root,
                 port=info.port, cgroup_path=info.cgroup_path)


@pytest.fixture
def make_phone(adb_server, phone_home):
    """Start extra phones inside one test; they are stopped after it, pass or fail."""
    made: list[Phone] = []

    def make(name: str, ram_bytes: int, **kw) -> Phone:
        made.append(start_phone(adb_server, phone_home, name, ram_bytes, **kw))
        return made[-1]

    try:
        yield make
    finally:
        for phone in made:
            manager.down(phone.name, home=phone_home, adb_host="127.0.0.1", adb_port=adb_server.port)
            assert phone.cgroup_path is None or not Path(phone.cgroup_path).exists()


@pytest.fixture(scope="session")
def phones(adb_server, phone_home) -> dict[str, Phone]:
    """Three phones with different RAM, models and Android releases, up at the same time."""
    tag = f"t{os.getpid()}"
    specs = {"a": (512 << 20, dict(model="Pixel 8", soc="tensor-g3", android=14)),
             "b": (384 << 20, dict(model="Galaxy S24", soc="sm8650", android=14)),
             "c": (256 << 20, dict(model="Redmi Note 12", soc="mt6989", android=13))}
    started: dict[str, Phone] = {}
    try:
        for key, (ram, kw) in specs.items():
            started[key] = start_phone(adb_server, phone_home, f"{tag}{key}", ram, **kw)
        yield started
    finally:
        cgroup_paths = [p.cgroup_path for p in started.values() if p.cgroup_path]
        manager.down(all_phones=True, home=phone_home, adb_host="127.0.0.1", adb_port=adb_server.port)
        leftovers = [p for p in cgroup_paths if Path(p).exists()]
        assert not leftovers, f"cgroups left behind: {leftovers}"


@pytest.fixture(params=["bmoe-py", "bmoe-cli"])
def engine(request) -> dict:
    """A campaign's engine table, once for bmoe-py and once for the real bmoe-cli (BMOE_CLI)."""
    if request.param == "bmoe-cli":
        return {"kind": "native", "native": {"host": {"cli": str(request.getfixturevalue("bmoe_cli"))}}}
    return {"kind": "python"}


@pytest.fixture
def real_engine(bmoe_cli) -> dict:
    """The campaign engine table of the real bmoe-cli alone: for a test of what the phone does around
    any engine (lmkd, the kernel, the replayed verdict), where bmoe-py's run adds time and no
    behaviour (docs/decisions/test-suite.md)."""
    return {"kind": "native", "native": {"host": {"cli": str(bmoe_cli)}}}


@pytest.fixture(scope="session")
def uniform_model(tmp_path_factory) -> Path:
    """qwen3moe of 128 MiB with uniform routing (cycle 14.2 MiB at top-k 2, 28.4 at its own 4): the
    model the swapping phones run."""
    path = tmp_path_factory.mktemp("swap-models") / "uniform128.gguf"
    write_model(path, synth_options("qwen3moe", size_bytes=UNIFORM_MODEL_BYTES, seed=1, router_skew=0))
    return path


@pytest.fixture(scope="session")
def war_model(tmp_path_factory) -> Path:
    """qwen3moe of 384 MiB, uniform routing, a 32768-token vocabulary: 127 MiB of dense weights (96 of
    them the embeddings and the output head), 258 MiB of experts, cycle 64.5 MiB at its top-k 4."""
    path = tmp_path_factory.mktemp("war-models") / "war384.gguf"
    write_model(path, synth_options("qwen3moe", size_bytes=WAR_MODEL_BYTES, seed=1, router_skew=0,
                                    vocab=WAR_MODEL_VOCAB))
    return path
