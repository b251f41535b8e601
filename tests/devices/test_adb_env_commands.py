"""Commands honour adb's environment end to end: a real adb server on a non-default port, a virtual
phone, and nothing ever on adb's default port 5037 — checked with a real socket held on 5037 that
counts every connection, and by the adb processes running.

The test body runs in a network namespace of its own (the test re-runs itself under
`unshare --net` with its loopback up), so a user's adb server on the host's 5037 neither makes it
fail nor hides a knock: inside, 127.0.0.1:5037 is the test's own socket, whatever runs outside.

Each command runs as its own `bmoe-fleet` process with only the environment to go on (no --adb,
no --device): `devices` starts the one server the environment names, `virtual up` connects the
phone to it, and `devices`, `sweep` (a real run) and `virtual down` find both through it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import adb_server_pids as all_adb_server_pids
from tests.conftest import free_port, stop_adb_server

ADB_DEFAULT_PORT = 5037
IN_OWN_NETNS = "BMOE_TEST_IN_OWN_NETNS"       # set in the re-run inside the private network namespace
ADB_VARS = ("ADB_SERVER_SOCKET", "ANDROID_ADB_SERVER_ADDRESS", "ANDROID_ADB_SERVER_PORT", "ANDROID_SERIAL",
            "ANDROID_ADB_SERVER_HOST")


def _netns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def adb_server_pids(port: int) -> list[int]:
    """The adb servers on `port` in this process's network namespace (one on the host's 5037 is not ours)."""
    mine = _netns("self")
    return [pid for pid in all_adb_server_pids(port) if _netns(pid) == mine]


def run_in_own_network_namespace(test_id: str, tmp_path: Path) -> None:
    """Re-run the test `test_id` under `unshare --net` with only a loopback, up; fail with its output."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    assert unshare and ip, "this test needs unshare(1) and ip(8) to give itself a network namespace"
    root = Path(__file__).resolve().parents[2]
    argv = [unshare, "--net", "--", "sh", "-c", f'{ip} link set lo up && exec "$@"', "sh",
            sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--basetemp",
            str(tmp_path / "in-netns"), test_id]
    proc = subprocess.Popen(argv, env=dict(os.environ, **{IN_OWN_NETNS: "1"}), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, cwd=root)
    try:
        stdout, stderr = proc.communicate(timeout=900)
    except BaseException:
        # interrupted (Ctrl-C, a timeout): the inner pytest tears its phone and adb server down on
        # SIGINT, as this one does; a SIGKILL would leave the phone's daemon running
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        raise
    assert proc.returncode == 0, f"in its own network namespace:\n{stdout[-6000:]}{stderr[-2000:]}"
    assert "1 passed" in stdout, stdout[-2000:]


@contextlib.contextmanager
def knocks_on_default_port():
    """Hold 127.0.0.1:5037 (and [::1]:5037 where there is IPv6) and record every connection made
    to it: a client looking for adb's default server knocks here, and no adb server can start on it."""
    held: list[socket.socket] = []
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        s = socket.socket(family, socket.SOCK_STREAM)
        # a server stopped just before (its connections in TIME_WAIT) does not hold the port; a live
        # listener still does (Linux refuses the bind then, SO_REUSEADDR or not)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, ADB_DEFAULT_PORT))
        except OSError as e:
            s.close()
            if family == socket.AF_INET6 and e.errno != 98:     # no IPv6 loopback here: nothing to hold
                continue
            for other in held:
                other.close()
            raise AssertionError(f"{host}:{ADB_DEFAULT_PORT} is already in use (adb server pids "
                                 f"{adb_server_pids(ADB_DEFAULT_PORT)}): this test needs adb's default port "
                                 "free to show that nothing uses it") from None
        s.listen(16)
        s.settimeout(0.1)
        held.append(s)
    knocks: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for s in held:
                try:
                    conn, peer = s.accept()
                except TimeoutError:
                    continue
                knocks.append(str(peer))
                conn.close()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield knocks
    finally:
        stop.set()
        watcher.join(timeout=5)
        for s in held:
            s.close()


def bmoe_fleet(env: dict[str, str], *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-c", "from harness.cli.main import main; main()", *args], env=env,
                          capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, f"bmoe-fleet {' '.join(args)}: {done.stderr}{done.stdout}"
    return done


@pytest.mark.phone
def test_commands_reach_the_server_adbs_environment_names_and_never_5037(tmp_path, request):
    if os.environ.get(IN_OWN_NETNS) != "1":
        run_in_own_network_namespace(request.node.nodeid, tmp_path)
        return
    tiny_model = request.getfixturevalue("tiny_model")
    port, decoy = free_port(), free_port()
    base = {k: v for k, v in os.environ.items() if k not in ADB_VARS}
    base.update(ADB_MDNS="0", ANDROID_USER_HOME=str(tmp_path / "android-home"))
    # ADB_SERVER_SOCKET wins: the port variable beside it points at nothing and must not be used
    by_socket = dict(base, ADB_SERVER_SOCKET=f"tcp:127.0.0.1:{port}", ANDROID_ADB_SERVER_PORT=str(decoy))
    home = tmp_path / "phones"
    serial = None
    with knocks_on_default_port() as knocks:
        try:
            assert adb_server_pids(port) == []
            listed = json.loads(bmoe_fleet(by_socket, "devices", "--json").stdout)
            assert [d["identity"]["serial"] for d in listed["devices"]] == ["local"]
            assert len(adb_server_pids(port)) == 1 and adb_server_pids(decoy) == []     # started, once, there

            serial = bmoe_fleet(by_socket, "virtual", "up", "--name", "envphone", "--ram", "384MiB",
                                "--model", "Pixel 7", "--home", str(home)).stdout.strip()
            # the other spelling of the same server, and the phone as the default device
            by_address = dict(base, ANDROID_ADB_SERVER_ADDRESS="127.0.0.1", ANDROID_ADB_SERVER_PORT=str(port),
                              ANDROID_SERIAL=serial)
            listed = json.loads(bmoe_fleet(by_address, "devices", "--json").stdout)
            phones = {d["identity"]["serial"]: d["identity"]["model"] for d in listed["devices"]}
            assert phones == {"local": phones["local"], serial: "Pixel 7"}

            out = tmp_path / "sweep"
            end = json.loads(bmoe_fleet(by_address, "sweep", "--model", str(tiny_model), "--cache-mb", "0", "-n", "2",
                                        "-t", "1", "-o", str(out), "--json").stdout)
            assert end["exit_status"] == 0, end
            written = (out / "campaign.toml").read_text(encoding="utf-8")
            import tomllib

            fleet = tomllib.loads(written)["fleet"]
            assert fleet["devices"] == [serial] and fleet["adb"] == [{"host": "127.0.0.1", "port": port}]
            runs = [json.loads(p.read_text()) for p in out.glob("runs/*/*/run.json")]
            assert [(r["device"], r["outcome"]) for r in runs] == [(serial, "ok")]

            bmoe_fleet(by_socket, "virtual", "down", "envphone", "--home", str(home))
            serial = None
            assert len(adb_server_pids(port)) == 1
        finally:
            if serial is not None:
                subprocess.run([sys.executable, "-c", "from harness.cli.main import main; main()", "virtual", "down",
                                "envphone", "--home", str(home)], env=by_socket, capture_output=True, timeout=60)
            stop_adb_server(port, by_socket)
        assert knocks == [], f"something reached for adb's default port: {knocks}"
    assert adb_server_pids(ADB_DEFAULT_PORT) == []


def test_a_malformed_port_variable_is_one_line_naming_it_not_adbutils_traceback():
    # adbutils reads ANDROID_ADB_SERVER_PORT with int() when it is imported: the import must not
    # be what fails (devices/adb/adbutils_import.py)
    env = {**os.environ, "ANDROID_ADB_SERVER_PORT": "abc"}
    env.pop("ADB_SERVER_SOCKET", None)
    done = subprocess.run([sys.executable, "-c", "from harness.cli.main import main; main()", "devices"], env=env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 1, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "ANDROID_ADB_SERVER_PORT" in lines[0] and "abc" in lines[0], done.stderr
    assert "Traceback" not in done.stderr
