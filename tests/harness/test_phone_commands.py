"""Every command line the harness sends to a phone works on Android's userland (docs/decisions/vphone-userland.md).

The phone here is a virtual phone as a phone is: mksh as /system/bin/sh, toybox as the toolbox
(Debian's build: no dd, tr, expr, ...), the shell user (uid 2000), Android's PATH, its own `/`.
Its adbd records every shell/exec command line it is sent (manager.up(record_commands=True)).
A small campaign runs on it: the engine pushed, checked by sha256 and placed; a model priced from
the header of a copy already on the phone (`device:`, read in pieces); the gate (strays stopped,
sync, state polled); the CPU report; runs sampled while they last; lmkd evidence; a run killed at
its timeout; outputs pulled and removed. Then each distinct command line runs again under the
phone's shell with its `2>/dev/null` taken off, so nothing the phone lacks can hide: none may be
unknown to the shell or the toolbox (exit 126/127, "not found", "Unknown option", "usage:", a
syntax error). The campaigns' own outcomes say the commands did their work.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
from pathlib import Path

import adbutils
import pytest

from devices.adb.files import STAMP_DIR
from devices.adb.phone import AdbPhone
from devices.adb.server import AdbServer
from harness.campaign.file import parse_campaign
from harness.run.runner import run_campaign
from tests.harness.conftest import one_phone, the_phone

PHONE = "cmdrec"
REPLAY_S = 8
MODELS_DIR = "/data/local/tmp/models"
# what a shell or a toolbox says when it does not know a command or an option
UNKNOWN = re.compile(r"not found|inaccessible|[Uu]nknown (option|command)|[Uu]sage:|syntax error|"
                     r"[Ii]nvalid option|[Ii]llegal option|unrecognized option|bad substitution|"
                     r"[Nn]eeds? \d+ arg")


@pytest.fixture(scope="module")
def phone(adb_port, phone_home):
    with one_phone(PHONE, 384 << 20, adb_port, phone_home, model="Pixel 6a", android=12,
                   record_commands=True) as info:
        yield info


def campaign(name, models, adb_port, phone_home, axes, run=None, engine=None):
    data = {"version": 1, "name": name,
            "fleet": {"devices": [f"virtual:{PHONE}"], "virtual_home": str(phone_home),
                      "adb": [{"host": "127.0.0.1", "port": adb_port}]},
            "models": models, "axes": axes, "run": {"n_predict": 4, "threads": 1, **(run or {})},
            "gate": {"max_wait_s": 2}}
    if engine:
        data["engine"] = engine
    return parse_campaign(data, source=f"{name}.toml")


def outcomes(out: Path) -> list[str]:
    return sorted(json.loads(p.read_text())["outcome"] for p in out.glob("runs/*/*/run.json"))


def sent_since(phone_home, start: int) -> list[str]:
    from devices.virtual import manager

    return list(dict.fromkeys(manager.recorded_commands(PHONE, phone_home)[start:]))


def replay_under_the_phones_shell(adb_port: int, serial: str, lines: list[str]) -> list[str]:
    """Run each line again and return those the phone's shell or toolbox did not understand, with
    what it said. A line still running after REPLAY_S (the timed-out engine run) is killed with its
    process group by a watchdog of mksh's own: it started, so its words were understood."""
    device = adbutils.AdbClient(host="127.0.0.1", port=adb_port).device(serial)
    problems = []
    for line in lines:
        visible = line.replace("2>/dev/null", "")
        watched = (f"(sleep {REPLAY_S}; kill -9 0) </dev/null >/dev/null 2>&1 & w=$!; sh -c {shlex.quote(visible)}; "
                   "s=$?; kill -9 $w; exit $s")
        r = device.shell2(watched, v2=True, timeout=REPLAY_S + 30, encoding=None)
        said = (r.stderr or b"").decode("utf-8", "replace")
        if r.returncode == 137 and not said:
            continue                     # the watchdog's kill: the line ran past REPLAY_S
        if r.returncode in (126, 127) or UNKNOWN.search(said):
            problems.append(f"{line[:200]!r} -> exit {r.returncode}: {said.strip()[:300]}")
    return problems


def test_every_command_a_bmoe_py_campaign_sends_works_under_mksh_and_toybox(tmp_path, phone, adb_port, phone_home,
                                                                           tiny_model, mid_model):
    from devices.virtual import manager

    start = len(manager.recorded_commands(PHONE, phone_home))
    device = the_phone(adb_port, phone)
    device.push(str(tiny_model), f"{MODELS_DIR}/ondevice.gguf")           # a copy already on the phone
    models = {"tiny": str(tiny_model), "ondevice": f"device:{MODELS_DIR}/ondevice.gguf"}
    c = campaign("cmds", models, adb_port, phone_home, {"cache_mb": [0, "cycle*1.2"]})
    run_campaign(c, tmp_path / "out", progress_stream=io.StringIO())
    assert outcomes(tmp_path / "out") == ["ok"] * 4
    # the pushes stamped each file's sha256; without the stamps (files put there by hand) the next
    # campaign hashes them on the phone, and stamps them again
    shutil.rmtree(phone.root / STAMP_DIR.lstrip("/"))
    again = campaign("cmds-again", {"tiny": str(tiny_model)}, adb_port, phone_home, {"cache_mb": [0]})
    run_campaign(again, tmp_path / "again", progress_stream=io.StringIO())
    assert outcomes(tmp_path / "again") == ["ok"]
    # a run that outlives the 1 s pressure sampling and then its timeout (the streamed mid model
    # takes milliseconds a token: 2000 tokens are seconds however fast the engine gets)
    slow = campaign("cmds-timeout", {"mid": str(mid_model)}, adb_port, phone_home, {"cache_mb": [0]},
                    run={"n_predict": 2000, "timeout_s": 2.5})
    run_campaign(slow, tmp_path / "slow", progress_stream=io.StringIO())
    assert outcomes(tmp_path / "slow") == ["timeout"]

    lines = sent_since(phone_home, start)
    # the campaign really sent each kind of command (else the replay below proves little)
    for kind in (r"^getprop; .*; cat /proc/meminfo; .*; uname -r$", r"^sha256sum ", r"^mkdir -p ", r"^mv -f ",
                 r"^stat -c '%s\|%y\|%i' -- .* && cat -- ", r"k=\$\(stat -c .*printf '%s %s\\n' \"\$k\" ",
                 r"^stat -L -c %s ", r"command -v dd", r"nproc", r"readlink /proc/self/ns/mnt",
                 r"dumpsys thermalservice", r"logcat -d -b main,events,kernel -v epoch", r"^date \+%s$",
                 r"grep -E '\^\(VmHWM\|VmRSS\):' /proc/\d+/status", r"^kill -9 \d+$", r"@@BMOEPID",
                 r"'chmod' '755'|chmod 755", r"'rm' '-f'|rm -f", r"/data/local/tmp/bmoe/bmoe-py' '--version'|"
                 r"bmoe-py --version"):
        assert any(re.search(kind, line) for line in lines), f"no command matching {kind!r} was sent"
    problems = replay_under_the_phones_shell(adb_port, phone.serial, lines)
    assert not problems, "\n".join(problems)


def test_every_command_a_native_campaign_sends_works_under_mksh_and_toybox(tmp_path, phone, adb_port, phone_home,
                                                                          tiny_model, bmoe_cli):
    from devices.virtual import manager

    start = len(manager.recorded_commands(PHONE, phone_home))
    c = campaign("cmds-native", {"tiny": str(tiny_model)}, adb_port, phone_home, {"cache_mb": [0]},
                 engine={"kind": "native", "native": {"host": {"cli": str(bmoe_cli)}}})
    run_campaign(c, tmp_path / "out", progress_stream=io.StringIO())
    assert outcomes(tmp_path / "out") == ["ok"]
    lines = sent_since(phone_home, start)
    launches = [line for line in lines if "LD_LIBRARY_PATH=/data/local/tmp/bmoe/lib" in line]
    assert launches and any("bmoe-cli' '-m'" in line or "bmoe-cli -m" in line for line in launches)
    problems = replay_under_the_phones_shell(adb_port, phone.serial, lines)
    assert not problems, "\n".join(problems)


def test_stray_engines_are_stopped_on_their_own_phone_only(tmp_path, phone, adb_port, phone_home):
    """Virtual phones share this host's /proc and all run as the shell user: a stray `bmoe-py` of
    this phone is killed, the same name on another phone and on this host is left alone."""
    import subprocess
    import time

    from devices.virtual import manager
    from harness.run.gate import stop_strays

    stray = "#!/system/bin/sh\nsleep 300\n"          # a #! script: its process is named after it
    manager.up("cmdrec2", 128 << 20, home=phone_home, adb_host="127.0.0.1", adb_port=adb_port)
    host_stray = tmp_path / "bmoe-py"
    host_stray.write_text("#!/bin/sh\nsleep 300\n")
    host_stray.chmod(0o755)
    host_proc = subprocess.Popen([str(host_stray)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        server = AdbServer("127.0.0.1", adb_port)
        mine, other = AdbPhone(phone.serial, server), AdbPhone(manager.info("cmdrec2", phone_home).serial, server)
        for device, info in ((mine, phone), (other, manager.info("cmdrec2", phone_home))):
            folder = info.root / "data/local/tmp/strays"
            folder.mkdir(exist_ok=True)
            (folder / "bmoe-py").write_text(stray)
            (folder / "bmoe-py").chmod(0o755)
            assert device.shell("/data/local/tmp/strays/bmoe-py </dev/null >/dev/null 2>&1 &")[0] == 0

        namespaces = {mine: phone.mount_namespace, other: manager.info("cmdrec2", phone_home).mount_namespace}
        for device, ns in namespaces.items():      # what the phone's shell sees is what `info` says
            assert device.shell("readlink /proc/self/ns/mnt")[1].decode().strip() == ns

        def strays(device: AdbPhone | None) -> set[int]:
            """This host's view of the `bmoe-py` processes in a phone's mount namespace (None: ours)."""
            ns = namespaces[device] if device is not None else os.readlink("/proc/self/ns/mnt")
            found = set()
            for entry in os.listdir("/proc"):
                try:
                    if entry.isdigit() and Path(f"/proc/{entry}/comm").read_text().strip() == "bmoe-py" and \
                            os.readlink(f"/proc/{entry}/ns/mnt") == ns:
                        found.add(int(entry))
                except OSError:
                    pass
            return found

        deadline = time.monotonic() + 5
        while not (strays(mine) and strays(other)) and time.monotonic() < deadline:
            time.sleep(0.05)
        before_other, before_host = strays(other), strays(None)
        assert len(strays(mine)) == 1 and len(before_other) == 1 and host_proc.pid in before_host
        assert stop_strays(mine, ["bmoe-cli", "bmoe-py"]) == 1
        assert not strays(mine) and strays(other) == before_other and host_proc.poll() is None
        assert stop_strays(other, ["bmoe-cli", "bmoe-py"]) == 1      # the other phone's own
        assert not strays(other) and host_proc.poll() is None and stop_strays(mine, ["bmoe-py"]) == 0
    finally:
        host_proc.kill()
        host_proc.wait()
        manager.down("cmdrec2", home=phone_home, adb_host="127.0.0.1", adb_port=adb_port)
