"""Fixtures for campaign tests: an isolated ~/.bmoe-fleet, small real models, campaign files, a CLI
group holding the campaign commands, and (for the virtual-phone tests) the real adb server from
the adbutils wheel on a free port with virtual phones connected to it.

Everything started here is stopped here, pass or fail.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from engine.gguf.synth import synth_options, write_model
from tests.conftest import running_adb_server


@pytest.fixture(scope="session")
def harness_models(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("harness-models")


@pytest.fixture(scope="session")
def mid_model(harness_models) -> Path:
    """~64 MiB qwen3moe (4 layers x 16 experts, top-4): resident (--no-mmap) bmoe-py holds ~93 MiB
    of anonymous memory, more than the 84 MiB `tight` phone has; streamed with an 18 MiB cache, ~62."""
    path = harness_models / "mid.gguf"
    write_model(path, synth_options("qwen3moe", size_bytes=64 << 20, seed=1))
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


@pytest.fixture(scope="module")
def adb_port(tmp_path_factory) -> int:
    with running_adb_server(tmp_path_factory.mktemp("android-home")) as (port, _env):
        yield port


@pytest.fixture(scope="module")
def phone_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("harness-vphones")


def the_phone(adb_port: int, info):
    """A virtual phone (its `manager.info`) as bmoe-fleet's AdbPhone sees it through the test's adb server."""
    from devices.adb.phone import AdbPhone
    from devices.adb.server import AdbServer

    return AdbPhone(info.serial, AdbServer("127.0.0.1", adb_port))


@contextlib.contextmanager
def one_phone(name: str, ram_bytes: int, adb_port: int, phone_home: Path, **kw):
    """A virtual phone up for a module's tests: its info, then down, its cgroup gone."""
    from devices.virtual import manager

    manager.up(name, ram_bytes, home=phone_home, adb_host="127.0.0.1", adb_port=adb_port, **kw)
    try:
        yield manager.info(name, phone_home)
    finally:
        info = manager.info(name, phone_home)
        manager.down(name, home=phone_home, adb_host="127.0.0.1", adb_port=adb_port)
        assert not (info.cgroup_path and Path(info.cgroup_path).exists()), "cgroup left behind"


@pytest.fixture(scope="module")
def phones(adb_port, phone_home):
    """Two virtual phones up at once: `roomy` (384 MiB) and `tight` (84 MiB, Android 13)."""
    from devices.virtual import manager

    started = []
    try:
        for name, ram, kw in (("roomy", 384 << 20, {"model": "Pixel 8"}),
                              ("tight", 84 << 20, {"model": "Redmi Note 12", "android": 13})):
            manager.up(name, ram, home=phone_home, adb_host="127.0.0.1", adb_port=adb_port, **kw)
            started.append(name)
        yield {name: manager.info(name, phone_home) for name in started}
    finally:
        infos = [manager.info(n, phone_home) for n in started]
        manager.down(all_phones=True, home=phone_home, adb_host="127.0.0.1", adb_port=adb_port)
        leftovers = [i.cgroup_path for i in infos if i.cgroup_path and Path(i.cgroup_path).exists()]
        assert not leftovers, f"cgroups left behind: {leftovers}"
