"""The phone-side commands on a virtual phone's PATH: getprop, logcat, dumpsys.

Run as `python -I -S tools.py ROOT TOOL ARGS...` from the wrappers in the phone's /system/bin
(ROOT is the phone's folder on the host). Only the standard library and the two standalone
sibling modules are imported, so a call costs one bare interpreter start.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if TYPE_CHECKING:   # the same files, as the package names them (on the phone they sit beside this one)
    from devices.virtual import logbuf, thermal
else:
    import logbuf
    import thermal

BUILD_PROP = Path("system/build.prop")


def read_props(root: Path) -> dict[str, str]:
    """The phone's getprop table (system/build.prop)."""
    props: dict[str, str] = {}
    try:
        text = (root / BUILD_PROP).read_text()
    except OSError:
        return props
    for line in text.splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            props[key.strip()] = value.strip()
    return props


def getprop(root: Path, args: list[str]) -> int:
    """`getprop [KEY [DEFAULT]]`: one property, or every one as `[key]: [value]`."""
    props = read_props(root)
    if not args:
        for key in sorted(props):
            print(f"[{key}]: [{props[key]}]")
    else:
        print(props.get(args[0], args[1] if len(args) > 1 else ""))
    return 0


def logcat(root: Path, args: list[str]) -> int:
    p = argparse.ArgumentParser(prog="logcat", add_help=False)
    p.add_argument("-d", action="store_true")
    p.add_argument("-c", action="store_true")
    p.add_argument("-s", action="store_true")
    p.add_argument("-g", action="store_true")
    p.add_argument("-b", action="append", default=[])
    p.add_argument("-v", action="append", default=[])
    p.add_argument("-t", type=int)
    p.add_argument("-e")
    p.add_argument("--pid", type=int)
    p.add_argument("specs", nargs="*")
    opts, _unknown = p.parse_known_args(args)
    buffers: list[str] = []
    for b in opts.b:
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
    buffers = list(dict.fromkeys(buffers)) or list(logbuf.DEFAULT_BUFFERS)
    if opts.c:
        logbuf.clear(root, buffers)
        return 0
    if opts.g:
        for b in buffers:
            size = logbuf.buffer_path(root, b).stat().st_size if logbuf.buffer_path(root, b).exists() else 0
            print(f"{b}: ring buffer is 256 KiB ({size // 1024} KiB consumed), max entry is 5120 B, "
                  f"max payload is 4068 B")
        return 0
    fmt = "threadtime"
    epoch = False
    for v in opts.v:
        for word in v.split(","):
            if word in ("threadtime", "time", "brief", "tag", "process", "raw"):
                fmt = word
            elif word == "epoch":  # a modifier: seconds since 1970 instead of MM-DD HH:MM:SS
                epoch = True
    env_specs = os.environ.get("ANDROID_LOG_TAGS", "").replace("'", "").split()
    filt = logbuf.Filter(env_specs + opts.specs, silent_default=opts.s)
    pattern = None
    if opts.e:
        import re
        pattern = re.compile(opts.e)

    def keep(e: logbuf.Entry) -> bool:
        return filt.accepts(e) and (opts.pid is None or e.pid == opts.pid) and \
            (pattern is None or pattern.search(e.message) is not None)

    offsets: dict[str, int] = {}
    seen: set[str] = set()
    entries = [e for e in logbuf.read(root, buffers, offsets) if keep(e)]
    if opts.t is not None:
        entries = entries[-opts.t:] if opts.t > 0 else []
    out = sys.stdout
    try:
        for line in logbuf.render(entries, fmt, seen, epoch):
            out.write(line + "\n")
        out.flush()
        if opts.d or opts.t is not None:
            return 0
        while True:  # follow, like logcat without -d, until the reader goes away
            time.sleep(0.2)
            for line in logbuf.render([e for e in logbuf.read(root, buffers, offsets) if keep(e)], fmt, seen, epoch):
                out.write(line + "\n")
            out.flush()
    except (BrokenPipeError, KeyboardInterrupt):
        return 0


def dumpsys(root: Path, args: list[str]) -> int:
    """`dumpsys battery|thermalservice`: the phone's battery and thermal state as Android prints them."""
    zones = thermal.read_zones(root)
    battery_c = next((t for name, t in zones if name == "battery"), 25.0)
    cpu = [t for name, t in zones if name.startswith("cpu-")]
    status = thermal.thermal_status(max(cpu) if cpu else battery_c)
    service = args[0] if args else ""
    if service == "battery":
        level = read_props(root).get("bmoe.vphone.battery_level", "85")
        print("Current Battery Service state:\n  AC powered: false\n  USB powered: true\n"
              "  Wireless powered: false\n  Dock powered: false\n  Max charging current: 500000\n"
              "  Max charging voltage: 5000000\n  Charge counter: 3500000\n  status: 2\n  health: 2\n"
              f"  present: true\n  level: {level}\n  scale: 100\n  voltage: 4123\n"
              f"  temperature: {round(battery_c * 10)}\n  technology: Li-ion")
        return 0
    if service == "thermalservice":
        kinds = {z.type_name: z.kind for z in thermal.zone_specs(read_props(root).get("ro.soc.model", "generic"))}
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
    root, tool, args = Path(argv[0]), argv[1], argv[2:]
    tools = {"getprop": getprop, "logcat": logcat, "dumpsys": dumpsys}
    if tool not in tools:
        print(f"{tool}: not found", file=sys.stderr)
        return 127
    return tools[tool](root, args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
