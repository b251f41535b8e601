"""The phone-side commands on a virtual phone's PATH: getprop, logcat, dumpsys.

logcat and dumpsys run as `python -I -S tools.py ROOT TOOL ARGS...` from the wrappers in the
phone's /system/bin (ROOT is the phone's folder on the host). Each call costs one bare interpreter
start plus the imports its tool needs, and nothing else: os and sys up front, logbuf (json) and
argparse for logcat, thermal for dumpsys; no dataclasses, pathlib or typing, each of which costs
about as much as the start itself. getprop starts no interpreter: the phone's shell serves it
(getprop_script) from a table of build.prop that props_table makes when the phone starts; the
Python getprop here is what that table must agree with, and answers when build.prop is newer.
Only the standard library and the two standalone sibling modules are imported.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
if not __package__:     # run as a script on the phone: logbuf and thermal sit beside this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

BUILD_PROP = "system/build.prop"     # under the phone's root
PROPS_TABLE = "getprop.table"        # beside tools.py: what the shell's getprop serves


def build_prop_text(props: dict[str, str]) -> str:
    """system/build.prop as the phone's folder is made with it (UTF-8): read_props reads these back
    as given when no value holds a line break or a space at either end (devices/virtual/checks.py)."""
    return "".join(f"{key}={value}\n" for key, value in props.items())


def read_props(root: str | Path) -> dict[str, str]:
    """The phone's getprop table (system/build.prop)."""
    props: dict[str, str] = {}
    try:
        with open(os.path.join(root, BUILD_PROP), encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
    except OSError:
        return props
    for line in text.splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            props[key.strip()] = value.strip()
    return props


def getprop_text(props: dict[str, str], args: list[str]) -> str:
    """What `getprop [KEY [DEFAULT]]` prints: one property, or every one as `[key]: [value]`."""
    if not args:
        return "".join(f"[{key}]: [{props[key]}]\n" for key in sorted(props))
    return props.get(args[0], args[1] if len(args) > 1 else "") + "\n"


def getprop(root: str | Path, args: list[str]) -> int:
    sys.stdout.write(getprop_text(read_props(root), args))
    return 0


def props_table(root: str | Path) -> str | None:
    """The table getprop_script serves: the properties as read_props reads them, sorted, one
    `key=value` a line (a key holds no `=`, a value no line break: read_props split at both).
    None when the shell could not serve it byte for byte (a NUL, which its `read` drops)."""
    props = read_props(root)
    table = "".join(f"{key}={props[key]}\n" for key in sorted(props))
    return None if "\0" in table else table


def getprop_script(table: str, build_prop: str, fallback: str) -> str:
    """getprop as an mksh script over `table` (props_table's, a phone path): `getprop` prints it
    as `[key]: [value]` lines, `getprop KEY [DEFAULT]` the key's value or DEFAULT ("" without),
    as getprop_text does, with no interpreter start. `fallback` (the command running the Python
    tool) answers when build.prop is newer than the table, or the table is not there."""
    import shlex  # the daemon's side, writing the script: the tools themselves never quote

    t, b = shlex.quote(table), shlex.quote(build_prop)
    return (f"if [ {b} -nt {t} ] || [ ! -r {t} ]; then {fallback}; fi\n"
            "if [ $# -eq 0 ]; then\n"
            f"  while IFS= read -r l; do print -r -- \"[${{l%%=*}}]: [${{l#*=}}]\"; done <{t}\n"
            "  exit 0\n"
            "fi\n"
            "case $1 in\n"
            "*=*) ;;  # no key holds '=' (build.prop's lines split at the first)\n"
            f"*) while IFS= read -r l; do case $l in \"$1=\"*) print -r -- \"${{l#*=}}\"; exit 0;; esac; done <{t};;\n"
            "esac\n"
            "print -r -- \"${2-}\"\n")


def getconf_script(page_size_bytes: int, toybox: str | None) -> str:
    """getconf as an mksh script: the phone's page size for PAGESIZE and PAGE_SIZE (alone or in
    `getconf -a`), everything else toybox's getconf (`toybox`, a phone path; None where this
    host's toybox has no getconf: then the other names are refused as toybox refuses them)."""
    import shlex  # the daemon's side, writing the script

    page = str(page_size_bytes)
    if toybox is None:
        rest = ("if [ \"$1\" = -a ]; then print -r -- \"PAGE_SIZE                          " + page + "\"; "
                "print -r -- \"PAGESIZE                           " + page + "\"; exit 0; fi\n"
                "print -ru2 -- \"getconf: bad '$1'\"\nexit 1\n")
    else:
        t = shlex.quote(toybox)
        rest = ("if [ \"$1\" = -a ]; then\n"
                f"  {t} getconf \"$@\" | while IFS= read -r l; do\n"
                f"    case $l in \"PAGESIZE \"*|\"PAGE_SIZE \"*) l=\"${{l%%+([0-9])}}{page}\";; esac\n"
                "    print -r -- \"$l\"\n"
                "  done\n"
                "  exit 0\n"
                "fi\n"
                f"exec {t} getconf \"$@\"\n")
    return f"case $1 in\nPAGESIZE|PAGE_SIZE) print -r -- {page}; exit 0;;\nesac\n" + rest


# The logcat options this logcat reads, by kind (others are ignored, as parse_known_args does).
_LOGCAT_FLAGS = ("-d", "-c", "-s", "-g")
_LOGCAT_LISTS = ("-b", "-v")                 # repeatable: each value appended
_LOGCAT_INTS = ("-t", "--pid")
_LOGCAT_STRS = ("-e",)


def logcat_options(args: list[str]) -> dict:
    """logcat's options as argparse's parse_known_args reads them (a dict of dests: d c s g b v t
    e pid specs). The plain forms every caller here uses (`-d`, `-b main,events`, `-v epoch`,
    `TAG:P` specs in one run) are read directly; anything else (`-dbmain`, `--pid=3`, a prefix,
    a value starting with '-', specs in two runs) goes to argparse, whose start costs more than
    the rest of logcat's (it loads gettext, locale and shutil)."""
    fast = _plain_options(args)
    if fast is not None:
        return fast
    import argparse

    p = argparse.ArgumentParser(prog="logcat", add_help=False)
    for flag in _LOGCAT_FLAGS:
        p.add_argument(flag, action="store_true")
    for option in _LOGCAT_LISTS:
        p.add_argument(option, action="append", default=[])
    for option in _LOGCAT_INTS:
        p.add_argument(option, type=int)
    for option in _LOGCAT_STRS:
        p.add_argument(option)
    p.add_argument("specs", nargs="*")
    return vars(p.parse_known_args(args)[0])


def _plain_options(args: list[str]) -> dict | None:
    """logcat_options for the plain forms only (None: not all plain): each option whole and its
    value the next word, not starting with '-', an int as ASCII digits, the specs one run."""
    opts: dict = {flag.lstrip("-"): False for flag in _LOGCAT_FLAGS}
    opts.update({o.lstrip("-"): [] for o in _LOGCAT_LISTS}, **{o.lstrip("-"): None for o in _LOGCAT_INTS + _LOGCAT_STRS})
    opts["specs"] = []
    runs, i, after_spec = 0, 0, False
    while i < len(args):
        word = args[i]
        if not word.startswith("-"):
            runs += not after_spec
            if runs > 1:
                return None     # argparse leaves a second run unread: its rules, not ours
            opts["specs"].append(word)
            after_spec, i = True, i + 1
            continue
        after_spec, dest = False, word.lstrip("-")
        if word in _LOGCAT_FLAGS:
            opts[dest], i = True, i + 1
            continue
        if word not in _LOGCAT_LISTS + _LOGCAT_INTS + _LOGCAT_STRS or i + 1 == len(args) \
                or args[i + 1].startswith("-"):
            return None
        value = args[i + 1]
        if word in _LOGCAT_INTS:
            if not (value.isascii() and value.isdigit()):
                return None
            opts[dest] = int(value)
        elif word in _LOGCAT_LISTS:
            opts[dest].append(value)
        else:
            opts[dest] = value
        i += 2
    return opts


def kernel_log_kept(props: dict[str, str]) -> bool:
    """Does this phone's logd keep the kernel's log? logd/main.cpp: `ro.logd.kernel`, by default
    `ro.debuggable && !ro.config.low_ram` (devices/virtual/variant.py sets it on userdebug)."""
    def boolean(key: str, default: bool) -> bool:    # android-base GetBoolProperty
        value = props.get(key, "")
        return True if value in ("1", "y", "yes", "on", "true") else \
            False if value in ("0", "n", "no", "off", "false") else default

    return boolean("ro.logd.kernel", boolean("ro.debuggable", False) and not boolean("ro.config.low_ram", False))


def logcat(root: str | Path, args: list[str]) -> int:
    import time

    if TYPE_CHECKING or __package__:
        from devices.virtual import logbuf
    else:
        import logbuf
    opts = logcat_options(args)
    buffers: list[str] = []
    for b in opts["b"]:
        for name in b.split(","):
            if name == "all":
                buffers.extend(logbuf.BUFFERS)
            elif name == "default":
                buffers.extend(logbuf.DEFAULT_BUFFERS)
            elif name in logbuf.BUFFERS and name not in buffers:
                buffers.append(name)
            elif name not in logbuf.BUFFERS:
                print(f"logcat: unknown buffer {name}", file=sys.stderr)
                return 1
    buffers = list(dict.fromkeys(buffers)) or list(logbuf.UNNAMED_BUFFERS)
    if "kernel" in buffers and not kernel_log_kept(read_props(root)):
        # logd reads the kernel's log only where ro.logd.kernel says so (userdebug): a user
        # build's kernel buffer is empty, never refused (logcat opens it, it holds nothing)
        buffers.remove("kernel")
    if opts["c"]:
        logbuf.clear(root, buffers)
        return 0
    if opts["g"]:
        for b in buffers:
            size = logbuf.buffer_path(root, b).stat().st_size if logbuf.buffer_path(root, b).exists() else 0
            print(f"{b}: ring buffer is 256 KiB ({size // 1024} KiB consumed), max entry is 5120 B, "
                  f"max payload is 4068 B")
        return 0
    fmt = "threadtime"
    epoch = False
    for v in opts["v"]:
        for word in v.split(","):
            if word in ("threadtime", "time", "brief", "tag", "process", "raw"):
                fmt = word
            elif word == "epoch":  # a modifier: seconds since 1970 instead of MM-DD HH:MM:SS
                epoch = True
    env_specs = os.environ.get("ANDROID_LOG_TAGS", "").replace("'", "").split()
    filt = logbuf.Filter(env_specs + opts["specs"], silent_default=opts["s"])
    pattern = None
    if opts["e"]:
        import re
        pattern = re.compile(opts["e"])

    def keep(e: logbuf.Entry) -> bool:
        return filt.accepts(e) and (opts["pid"] is None or e.pid == opts["pid"]) and \
            (pattern is None or pattern.search(e.message) is not None)

    offsets: dict[str, int] = {}
    seen: set[str] = set()
    entries = [e for e in logbuf.read(root, buffers, offsets) if keep(e)]
    if opts["t"] is not None:
        entries = entries[-opts["t"]:] if opts["t"] > 0 else []
    out = sys.stdout
    try:
        for line in logbuf.render(entries, fmt, seen, epoch):
            out.write(line + "\n")
        out.flush()
        if opts["d"] or opts["t"] is not None:
            return 0
        while True:  # follow, like logcat without -d, until the reader goes away
            time.sleep(0.2)
            for line in logbuf.render([e for e in logbuf.read(root, buffers, offsets) if keep(e)], fmt, seen, epoch):
                out.write(line + "\n")
            out.flush()
    except (BrokenPipeError, KeyboardInterrupt):
        return 0


def dumpsys(root: str | Path, args: list[str]) -> int:
    """`dumpsys battery|thermalservice`: the phone's battery and thermal state as Android prints them."""
    if TYPE_CHECKING or __package__:
        from devices.virtual import thermal
    else:
        import thermal
    props = read_props(root)
    # the HAL knows its sensors' unit, and speaks °C; the trip zones are none of its temperatures
    unit = props.get(thermal.UNIT_PROP, "mC")
    zones = thermal.read_zones(root, unit if unit in thermal.UNITS else "mC")
    battery_c = next((t for name, t in zones if name == "battery"), 25.0)
    cpu = [t for name, t in zones if name.startswith("cpu-")]
    status = thermal.thermal_status(max(cpu) if cpu else battery_c)
    service = args[0] if args else ""
    if service == "battery":
        level = props.get("bmoe.vphone.battery_level", "85")
        print("Current Battery Service state:\n  AC powered: false\n  USB powered: true\n"
              "  Wireless powered: false\n  Dock powered: false\n  Max charging current: 500000\n"
              "  Max charging voltage: 5000000\n  Charge counter: 3500000\n  status: 2\n  health: 2\n"
              f"  present: true\n  level: {level}\n  scale: 100\n  voltage: 4123\n"
              f"  temperature: {round(battery_c * 10)}\n  technology: Li-ion")
        return 0
    if service == "thermalservice":
        kinds = {z.type_name: z.kind for z in thermal.zone_specs(props.get("ro.soc.model", "generic"))}
        lines = ["IsStatusOverride: false", "ThermalEventListeners:", "\tcallbacks: 1", "\tkilled: false",
                 "\tbroadcasts count: -1", "ThermalStatusListeners:", "\tcallbacks: 1", "\tkilled: false",
                 "\tbroadcasts count: -1", f"Thermal Status: {status}", "Cached temperatures:"]
        temps = [f"\tTemperature{{mValue={t:.1f}, mType={kinds.get(name, thermal.TYPE_SKIN)}, mName={name}, "
                 f"mStatus={thermal.thermal_status(t) if name.startswith('cpu-') else 0}}}" for name, t in zones]
        lines += temps + ["HAL Ready: true", "HAL connection:", "\tThermalHAL AIDL 2  connected: yes",
                          "Current temperatures from HAL:"] + temps
        print("\n".join(lines))
        return 0
    if service in ("-l", ""):
        print("Currently running services:\n  battery\n  thermalservice")
        return 0
    print(f"Can't find service: {service}")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: tools.py ROOT TOOL [ARGS...]", file=sys.stderr)
        return 2
    root, tool, args = argv[0], argv[1], argv[2:]
    tools = {"getprop": getprop, "logcat": logcat, "dumpsys": dumpsys}
    if tool not in tools:
        print(f"{tool}: not found", file=sys.stderr)
        return 127
    return tools[tool](root, args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
