"""Shared fixtures: real GGUF files written with engine.gguf.synth (small, so the suite stays fast)."""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path

import pytest

from engine.gguf.synth import synth_options, write_model

FIXTURES = Path(__file__).parent / "fixtures"
UPSTREAM_HOST = FIXTURES / "upstream" / "host-v2-0.19.0"


# The tests that measure this host's memory, swap, page cache or speed (marked `serial`): `run.sh test`
# runs them first, with no other test at normal priority beside them (only tests at nice 19 that start
# no phone and make no cgroup: docs/decisions/test-suite.md). Beside another test they fail
# as a phone beside another phone would not: swap areas are the kernel's, so another phone's pages
# fill this one's zram device (its counters stay its own: devices/virtual/cgroup.py SwapTraffic),
# the host's free memory and page cache are shared, and two decodes share two cores. A file, or one
# test in it.
SERIAL = (
    "devices/test_app_verdict_phone.py",
    "devices/test_lmk_backstop.py", "devices/test_lmkd_apps.py", "devices/test_lmkd_registry.py",
    "devices/test_lmkd_zram.py",
    "devices/test_local.py", "devices/test_reclaim.py", "devices/test_vphone_fought.py",
    "devices/test_vphone_memory.py", "devices/test_vphone_page_cache.py", "devices/test_vphone_profiles.py",
    "devices/test_vphone_storage.py", "devices/test_vphone_swap_counters.py", "devices/test_vphone_swapping.py",
    "devices/test_vphone_turns.py",
    "engine/test_larger_than_ram.py",
    "harness/test_adaptive.py",
    "harness/test_preset_app.py", "harness/test_turns.py",
    "results/test_analyze.py", "results/test_app_rung.py", "results/test_fought.py",
    "results/test_outputs.py::test_the_run_table_carries_each_runs_reclaim", "results/test_predict.py",
    "results/test_site_turns.py",
)


# What a test needs of this host, as markers (pyproject.toml declares them; `run.sh test --quick`
# runs what is marked none of them, nor serial). A test that uses one of these fixtures is marked by
# it; a test that needs a marker without such a fixture (it starts phones itself, makes a memory
# cgroup) carries it (a decorator, a module's pytestmark), and tests/test_markers.py checks that it does.
# tests/*/conftest.py's: the phones they start, and phone_home, the folder a test starts its own in
PHONE_FIXTURES = ("phones", "make_phone", "phone_home", "vphone_campaign")
MARKED_BY_FIXTURE = {"phone": PHONE_FIXTURES, "browser": ("browser",), "bmoe_cli": ("bmoe_cli",),
                     "after_serial": ("local_campaign", "compare_pair", "failing_twin", "quality_campaign",
                                      "native_campaign")}
# `after_serial`: run.sh runs most non-serial tests at nice 19 beside the serial part, where a burst
# of the serial tests' decodes can stop them for seconds; these run after it instead, at normal
# priority (docs/decisions/test-suite.md). A test that reads local_campaign, which the serial part
# builds alone, first (docs/decisions/test-shared-builds.md: built beside other tests, a run
# sampled no file pages), and the tests whose assertions rest on decode rates measured here by the
# campaigns they run or read (a recommendation, a comparison, a history, a knee, a run marked as
# oversubscribed; the shared campaigns of tests/results/conftest.py whose rates are compared):
# starved for a moment, a run beside the serial part was slower than cache 0.
AFTER_SERIAL = (
    "harness/test_knee.py", "harness/test_threads_flags.py",
    "results/test_compare.py", "results/test_history.py", "results/test_quality.py", "results/test_recommend_v2.py",
)
# Virtual phones need root: without it their memory cgroup, mount and network namespaces fall back
# to weaker stand-ins (devices/virtual/run.py says so on stderr), so they would not fail where a
# phone fails. The other root tests say what they need in their marker: pytest.mark.root("why").
PHONE_NEEDS = "a virtual phone's memory cgroup and mount and network namespaces"


def needs_root_reason(item) -> str | None:
    """Why `item` is skipped here (it is marked root or phone and this process is not root), or None."""
    if os.geteuid() == 0:
        return None
    marker = item.get_closest_marker("root")
    if marker is None and item.get_closest_marker("phone") is None:
        return None
    why = marker.args[0] if marker is not None and marker.args else PHONE_NEEDS
    return f"needs root (this is uid {os.geteuid()}): {why}"


# run.sh's serial parts set this: they collect only the modules SERIAL names (the rest would be
# collected to be deselected, their imports and items several seconds of each part)
SERIAL_ONLY = "BMOE_TEST_SERIAL_ONLY"
SERIAL_FILES = frozenset(entry.partition("::")[0] for entry in SERIAL)


def pytest_ignore_collect(collection_path, config) -> bool | None:
    if not os.environ.get(SERIAL_ONLY) or collection_path.suffix != ".py" \
            or not collection_path.name.startswith("test_"):
        return None
    rel = collection_path.resolve().relative_to(Path(__file__).resolve().parent).as_posix()
    return True if rel not in SERIAL_FILES else None


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        node = item.nodeid.removeprefix("tests/")
        for marker, listed in (("serial", SERIAL), ("after_serial", AFTER_SERIAL)):
            if any(node == s or node.startswith(s + "::") for s in listed):
                item.add_marker(getattr(pytest.mark, marker))
        used = set(getattr(item, "fixturenames", ()))
        # a fixture a parametrized test takes by name (request.getfixturevalue(which)) marks it too
        callspec = getattr(item, "callspec", None)
        if callspec is not None:
            used |= {v for v in callspec.params.values() if isinstance(v, str)}
        for marker, fixtures in MARKED_BY_FIXTURE.items():
            if used.intersection(fixtures) and item.get_closest_marker(marker) is None:
                item.add_marker(marker)
        reason = needs_root_reason(item)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


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


# ---- what one test run builds once (the campaigns the results tests read, their models) -------------
# `run.sh test` points SHARED_ENV at a folder it makes for the run and removes afterwards; both of its
# pytest parts (and both workers of the first) then build each such folder once, under a file lock,
# instead of once per process. Plain pytest, without it, builds in its own temp folder, as before.
SHARED_ENV = "BMOE_TEST_SHARED"
_BUILT = ".built"               # written last: a folder without it is a build that failed half way
_KEYED = ("engine", "devices", "harness", "results", "store", "templates", "tests")


@functools.cache
def tree_key() -> str:
    """A hash of the source tree (the packages, templates, tests and their fixtures): a folder built
    by other sources is never reused, even where SHARED_ENV outlives a run."""
    import hashlib

    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for top in _KEYED:
        for path in sorted((root / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def built_once(tmp_path_factory, name: str, build) -> Path:
    """The folder `build(folder)` fills: built once per `run.sh test` run (SHARED_ENV), keyed by the
    source tree, else in this process's temp folder. What is built there is read, never changed: a
    test that writes into a campaign works on a copy (`copied_once`)."""
    shared = os.environ.get(SHARED_ENV)
    if not shared:
        folder = tmp_path_factory.mktemp(name)
        build(folder)
        return folder
    from filelock import FileLock

    folder = Path(shared) / f"{name}-{tree_key()}"
    with builds_alone.paused(), FileLock(f"{folder}.lock"):
        if not (folder / _BUILT).exists():
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            with builds_alone.exclusive():
                build(folder)
            (folder / _BUILT).touch()
    return folder


class BuildsAlone:
    """The cores of run.sh's rate part (BUILDS_ALONE_ENV names the lock file it makes): a shared
    build runs with no test of the part beside it, and every test of the part runs beside no build.
    A readers-writer lock over the part's processes, on flock(2): each test holds the file shared
    while it runs; a build holds it exclusive. A turnstile (a second file, taken exclusive by both
    on the way in) keeps tests that keep starting on the other workers from starving a waiting build
    (flock grants a shared lock beside shared holders however long an exclusive one has waited).
    Without the variable (plain pytest, the other parts) it does nothing."""

    def __init__(self) -> None:
        self._shared_fd: int | None = None         # this process's shared hold (a test running)
        self._exclusive = False                    # this process builds (a build within a build)

    @staticmethod
    def _path() -> str | None:
        return os.environ.get(BUILDS_ALONE_ENV) or None

    @staticmethod
    def _take(path: str, how: int) -> int:
        import fcntl

        turnstile = os.open(f"{path}.turnstile", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            fcntl.flock(fd, how)
        except BaseException:
            os.close(fd)
            raise
        finally:
            os.close(turnstile)                     # closing it unlocks it
        return fd

    def test_begins(self) -> None:
        path = self._path()
        if path and self._shared_fd is None and not self._exclusive:
            import fcntl

            self._shared_fd = self._take(path, fcntl.LOCK_SH)

    def test_ends(self) -> None:
        if self._shared_fd is not None:
            os.close(self._shared_fd)
            self._shared_fd = None

    @contextlib.contextmanager
    def paused(self):
        """This process's test lets its shared hold go (while it waits on another process's build
        of a folder it needs, or builds it) and takes it back after."""
        was_testing = self._shared_fd is not None
        self.test_ends()
        try:
            yield
        finally:
            if was_testing:
                self.test_begins()

    @contextlib.contextmanager
    def exclusive(self):
        """The cores to this build alone (within paused())."""
        path = self._path()
        if not path or self._exclusive:
            yield
            return
        import fcntl

        fd = self._take(path, fcntl.LOCK_EX)
        self._exclusive = True
        try:
            yield
        finally:
            self._exclusive = False
            os.close(fd)


# run.sh's part whose tests compare rates their builds measured (tests/conftest.py AFTER_SERIAL)
BUILDS_ALONE_ENV = "BMOE_TEST_BUILDS_ALONE"
builds_alone = BuildsAlone()


@pytest.fixture(autouse=True)
def _beside_no_build():
    """Each test of the rate part holds its cores shared while it runs (BuildsAlone)."""
    builds_alone.test_begins()
    yield
    builds_alone.test_ends()


def copied_once(tmp_path_factory, name: str, build) -> Path:
    """built_once's folder, copied into this process's temp folder (a campaign directory is plain
    files, relocatable: docs/campaign-dir.md), so no test sees what another process's test wrote."""
    import shutil

    built = built_once(tmp_path_factory, name, build)
    if not os.environ.get(SHARED_ENV):
        return built
    copy = tmp_path_factory.mktemp(name)
    shutil.copytree(built, copy, dirs_exist_ok=True, ignore=shutil.ignore_patterns(_BUILT))
    return copy


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


# The tests' one small real model (as shards too: `synth_options(**TINY_MODEL, split_count=3)`)
TINY_MODEL = dict(preset="qwen3moe", layers=3, experts=8, top_k=2, hidden=64, expert_ffn=96, vocab=300, quant="Q8_0",
                  seed=7)


@pytest.fixture(scope="session")
def tiny_model(models_dir) -> Path:
    """0.6 MiB qwen3moe: 3 layers x 8 experts, top-2, hidden 64, expert FFN 96, Q8_0 experts (TINY_MODEL);
    a run of a few tokens takes ~0.3 s. Its name is `tiny` (the file's stem)."""
    return make_model(models_dir, "tiny.gguf", **TINY_MODEL)


@pytest.fixture(scope="session")
def small_gptoss(models_dir) -> Path:
    """2 layers, 4 experts, top-2, hidden 64, expert FFN 32, MXFP4 experts."""
    return make_model(models_dir, "small-gptoss.gguf", "gpt-oss", layers=2, experts=4, top_k=2,
                      hidden=64, expert_ffn=32, vocab=260, seed=3)


# ---- memory cgroups (root only; CI runs as root) -------------------------------------------------
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
import subprocess  # noqa: E402
import time as _time  # noqa: E402


def free_port() -> int:
    """A port for an adb server a test starts (devices.adb.server.free_server_port: below the
    ephemeral range, where a client cannot connect to itself)."""
    from devices.adb.server import free_server_port

    return free_server_port()


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
    user_home.mkdir(parents=True, exist_ok=True)
    # TMPDIR: the server writes its log to $TMPDIR/adb.UID.log, else /tmp (GetLogFilePath in AOSP's
    # packages/modules/adb adb_utils.cpp): kept in this test's folder
    env = dict(os.environ, ANDROID_ADB_SERVER_PORT=str(port), ADB_MDNS="0", ANDROID_USER_HOME=str(user_home),
               TMPDIR=str(user_home))
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
