"""A virtual phone's getprop, logcat and dumpsys print what they printed, at a fraction of the cost
(docs/decisions/vphone-fast-tools.md), and a state read sees the phone's files as they are.

getprop is served by the phone's shell (mksh) from a table written when the phone starts: it must
print byte for byte what the Python tool prints from build.prop, for generated properties and
arguments, with the Python tool made unusable (so the shell really answered), and it must hand
over to the Python tool once build.prop is newer than the table. logcat reads its plain options
without argparse: exactly what argparse reads, whenever it takes them. Each tool loads only what
it needs. dumpsys and AdbPhone.state() read the zones and policies the phone's files hold.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devices.adb import phone as adb_phone  # the logcat command it runs
from devices.adb.phone import AdbPhone
from devices.adb.server import AdbServer
from devices.virtual import thermal, tools
from devices.virtual.phone import TOOL_MODULES, Layout, _userland, install_tools

HERE = Path(tools.__file__).resolve().parent
# what a tool that must stay cheap may not load (each costs about an interpreter start)
HEAVY = {"argparse", "dataclasses", "pathlib", "typing"}


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Layout:
    """A phone's folder as `virtual up` makes it, tools and userland (mksh, toybox), no daemon:
    its scripts name host paths (install_tools' fallback form), so they run here as they are."""
    lay = Layout(tmp_path_factory.mktemp("vtools").resolve())
    for d in (lay.system_bin, lay.tools_dir):
        d.mkdir(parents=True, exist_ok=True)
    _userland(lay)
    return lay


def write_build_prop(lay: Layout, text: str, age_s: float) -> None:
    path = lay.root / tools.BUILD_PROP
    path.write_bytes(text.encode("utf-8"))
    t = time.time() - age_s
    os.utime(path, (t, t))


def install(lay: Layout) -> None:
    for module in TOOL_MODULES:
        shutil.copyfile(HERE / module, lay.tools_dir / module)
    install_tools(lay, in_namespace=False)


def break_python_tools(lay: Layout) -> None:
    """Any call that reaches tools.py now exits 99: an answer must have come from the shell."""
    (lay.tools_dir / "tools.py").write_text("raise SystemExit(99)\n")
    for pyc in (lay.tools_dir / "__pycache__").glob("tools.*.pyc"):
        pyc.unlink()


def getprop(lay: Layout, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(lay.system_bin / "getprop"), *args], capture_output=True, timeout=30,
                          env={"PATH": str(lay.system_bin)})


KEY_CHARS = st.characters(codec="utf-8", exclude_characters="\n\r\x00=#", exclude_categories=("Cs", "Zl", "Zp", "Cc"))
VALUE_CHARS = st.characters(codec="utf-8", exclude_characters="\n\r\x00", exclude_categories=("Cs", "Zl", "Zp", "Cc"))
SPECIAL = st.sampled_from(["ro.product.model", "ro.a", "", " ro.a ", "a=b", "ro.*", "[x]", "ro.a]: [b", "-x", "$HOME",
                           "it's", '"q"', "\\n", "ro.product"])
SPECIAL_VALUES = st.sampled_from(["-n", "-e", "-", "--", "a\\tb\\c", "\\", "%s %d", "  padded  ", "[v]", "x=y=z", "*"])


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(props=st.lists(st.tuples(st.one_of(SPECIAL, st.text(KEY_CHARS, max_size=12)),
                                st.one_of(SPECIAL_VALUES, st.text(VALUE_CHARS, max_size=20))), max_size=12),
       extra=st.lists(st.sampled_from(["# a comment", "", "   ", "no equals sign", "=only a value", "  spaced = out  "]),
                      max_size=3),
       asks=st.lists(st.lists(st.one_of(SPECIAL, st.text(KEY_CHARS, max_size=8)), max_size=3), min_size=1, max_size=4))
def test_getprop_from_the_shell_prints_what_the_python_tool_prints(layout, props, extra, asks):
    lines = [f"{k}={v}" for k, v in props] + extra
    if props:
        lines.append(f"{props[0][0]}=a later value wins")
    write_build_prop(layout, "\n".join(lines) + "\n", age_s=60)
    install(layout)
    break_python_tools(layout)
    expected = tools.read_props(layout.root)
    for args in [[], ["ro.product.model"], ["nope", "fallback value"], *([k] for k, _ in props[:4]), *asks]:
        r = getprop(layout, args)
        assert (r.returncode, r.stdout, r.stderr) == (0, tools.getprop_text(expected, args).encode(), b""), args


def test_getprop_hands_over_to_the_python_tool_when_build_prop_is_newer(layout):
    write_build_prop(layout, "ro.product.model=Old\nro.x=1\n", age_s=60)
    install(layout)
    assert getprop(layout, ["ro.product.model"]).stdout == b"Old\n"
    # rewritten after the phone started (here: a second later than the table, which -nt sees)
    write_build_prop(layout, "ro.product.model=New one\nro.y=2\n", age_s=-5)
    assert getprop(layout, ["ro.product.model"]).stdout == b"New one\n"
    assert getprop(layout, []).stdout == b"[ro.product.model]: [New one]\n[ro.y]: [2]\n"
    break_python_tools(layout)        # and it really was the Python tool that answered
    assert getprop(layout, ["ro.product.model"]).returncode == 99


def test_getprop_on_a_phone_with_a_hostile_model_name(adb_server, make_phone):
    # a model may hold no ':' (adb's banner splits at it: devices/virtual/checks.py); the SoC may,
    # and getprop's `[key]: [value]` shows both as given
    model = "It's a \"phone\" $HOME `id` \\n ] [x *"
    soc = "x]: [ro.secure]: [0 $(id)"
    phone = make_phone(f"gp{os.getpid()}", 96 << 20, model=model, soc=soc)
    expected = tools.read_props(phone.root)
    assert expected["ro.product.model"] == model and expected["ro.soc.model"] == soc

    def shell(*args: str) -> bytes:
        r = adb_server.run("-s", phone.serial, "shell", " ".join(shlex.quote(a) for a in ("getprop", *args)))
        assert r.returncode == 0 and r.stderr == b"", r
        return r.stdout

    for args in ([], ["ro.product.model"], ["ro.bmoe.ram_bytes"], ["no.such.key"], ["no.such.key", "d e f"],
                 ["ro.product.model=x"]):
        assert shell(*args) == tools.getprop_text(expected, list(args)).encode(), args
    assert shell("ro.product.model") == model.encode() + b"\n"
    assert shell("ro.soc.model") == soc.encode() + b"\n"


# -- logcat's options -----------------------------------------------------------------------------

def argparse_options(args: list[str]) -> dict | str:
    """What logcat's argparse reads from args ('exit' where it refuses them)."""
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            return _argparse(args)
        except SystemExit:
            return "exit"


def _argparse(args: list[str]) -> dict:
    import argparse

    p = argparse.ArgumentParser(prog="logcat", add_help=False)
    for flag in tools._LOGCAT_FLAGS:
        p.add_argument(flag, action="store_true")
    for option in tools._LOGCAT_LISTS:
        p.add_argument(option, action="append", default=[])
    for option in tools._LOGCAT_INTS:
        p.add_argument(option, type=int)
    for option in tools._LOGCAT_STRS:
        p.add_argument(option)
    p.add_argument("specs", nargs="*")
    return vars(p.parse_known_args(args)[0])


WORDS = st.sampled_from(["-d", "-c", "-s", "-g", "-b", "-v", "-t", "-e", "--pid", "main", "events,kernel", "all",
                         "epoch", "brief", "5", "0", "007", "x:V", "*:S", "", "-x", "--p", "--pid=3", "-1", "٣",
                         "-dbmain", "-b=main", "--", "-"])


@settings(max_examples=1000, deadline=None, derandomize=True, database=None)
@given(args=st.lists(st.one_of(WORDS, st.text(max_size=6)), max_size=7))
def test_logcats_plain_options_are_what_argparse_reads(args):
    plain, want = tools._plain_options(args), argparse_options(args)
    if plain is not None:             # taken without argparse: then exactly what argparse reads
        assert plain == want
    if want != "exit":
        assert tools.logcat_options(args) == want


def test_the_harness_logcat_commands_take_the_plain_path():
    for command in adb_phone._LMK_LOGCAT.split("||"):
        words = shlex.split(command)
        args = words[1:words.index("2>/dev/null")]
        assert words[0] == "logcat" and tools._plain_options(args) == _argparse(args), command


# -- what each tool loads ---------------------------------------------------------------------------

def modules_loaded(lay: Layout, args: list[str]) -> set[str]:
    """The modules a tool's call loads, run as its wrapper runs it (python -I -S, tools imported)."""
    code = (f"import sys; sys.path.insert(0, {str(lay.tools_dir)!r}); import tools; rc = tools.main(sys.argv[1:]); "
            "sys.stdout.flush(); print(' '.join(sorted(sys.modules)), file=sys.stderr); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(lay.root), *args], capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stdout, r
    return set(r.stderr.decode().split())


def test_each_tool_loads_only_what_it_needs(layout):
    write_build_prop(layout, "ro.soc.model=sm8650\nro.product.model=X\n", age_s=60)
    install(layout)
    thermal.ThermalModel("sm8650").write(layout.root)
    for args in (["dumpsys", "battery"], ["dumpsys", "thermalservice"]):
        loaded = modules_loaded(layout, args)
        assert not loaded & (HEAVY | {"json", "logbuf", "re"}), (args, loaded & (HEAVY | {"json", "logbuf", "re"}))
    (layout.root / "data/misc/logd").mkdir(parents=True, exist_ok=True)
    from devices.virtual import logbuf

    logbuf.append(layout.root, "main", "vphone", "hello")
    harness_args = shlex.split(adb_phone._LMK_LOGCAT.split("||")[0])[:-1]
    loaded = modules_loaded(layout, harness_args)
    assert "logbuf" in loaded and not loaded & HEAVY, loaded & HEAVY
    assert "argparse" in modules_loaded(layout, ["logcat", "-dbmain"])     # the other forms still parse


# -- what dumpsys and a state read see ------------------------------------------------------------

def zone_files(root: Path) -> list[tuple[str, int]]:
    base = root / "sys/class/thermal"
    zones = sorted(base.glob("thermal_zone*"), key=lambda p: int(p.name[12:]))
    return [((z / "type").read_text().strip(), int((z / "temp").read_text())) for z in zones]


def steady(read, root: Path, tries: int = 10):
    """read() between two equal reads of the phone's zone files (the daemon rewrites them each second)."""
    for _ in range(tries):
        before = zone_files(root)
        value = read()
        if zone_files(root) == before:
            return value, before
        time.sleep(0.2)
    raise AssertionError("the zone files never held still")


def test_dumpsys_and_the_state_read_see_the_phones_zone_files(adb_server, phones):
    b = phones["b"]                  # sm8650: 8 CPU zones, 3 others and the trip zone, so thermal_zone10 sorts after 9
    done, zones = steady(lambda: adb_server.run("-s", b.serial, "shell", "dumpsys thermalservice"), b.root)
    out = done.stdout.decode()
    assert len(zones) == 12 and zones[-1] == ("cpu-hw-trip-0", 95000)
    assert "Cached temperatures:\n" in out, (done.returncode, out, done.stderr)
    cached = out.split("Cached temperatures:\n", 1)[1].split("HAL Ready")[0]
    named = re.findall(r"mValue=(-?[0-9.]+), mType=\d, mName=([^,]+),", cached)
    # the HAL's temperatures: every zone but the trip point, a constant (thermal.TRIP_ZONES_MC)
    assert named == [(f"{mc / 1000:.1f}", name) for name, mc in zones[:-1]]
    battery, zones = steady(lambda: adb_server.run("-s", b.serial, "shell", "dumpsys battery").stdout.decode(), b.root)
    assert f"  temperature: {round(dict(zones)['battery'] / 1000 * 10)}\n" in battery

    phone = AdbPhone(b.serial, AdbServer("127.0.0.1", adb_server.port))
    state, zones = steady(phone.state, b.root)
    assert state.thermal_mc == dict(zones)
    policies = sorted((b.root / "sys/devices/system/cpu/cpufreq").glob("policy*"))
    assert [(p.name, p.scaling_max_khz, p.cpuinfo_max_khz) for p in state.cpufreq] == \
        [(p.name, int((p / "scaling_max_freq").read_text()), int((p / "cpuinfo_max_freq").read_text()))
         for p in policies]
