"""A virtual phone: its identity, its folder, and how its commands run.

Folder (default ~/.bmoe-fleet/virtual/NAME/, the phone's `/` for sync):
  data/local/tmp/          what the phone sees as /data/local/tmp
  data/misc/logd/*.log     logcat buffers main, system, events, crash, kernel (logbuf.py)
  system/build.prop        the getprop table
  system/bin/              getprop, logcat, dumpsys (+ sh -> /bin/sh), first on the phone's PATH
  proc/meminfo, sys/class/thermal/, sys/devices/system/cpu/cpufreq/   generated each second
  .vphone/                 spec.json, state.json, daemon.log, the namespace's staging mount

Commands run as `/bin/sh -c CMD` on the host inside the phone's mount namespace (namespace.py),
after the wrapper shell has moved itself into the phone's memory cgroup (so every descendant is
counted and OOM-killed there, and the daemon never is).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import platform
import shlex
import sys
import termios
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from . import logbuf, thermal
from .cgroup import MemoryCgroup, MemStat
from .meminfo import MEMINFO_PATH, MemInfo, compute, write_in_place

SDK_FOR_RELEASE = {9: 28, 10: 29, 11: 30, 12: 31, 13: 33, 14: 34, 15: 35, 16: 36}
INTERNAL = ".vphone"
HOST_ABI = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64-v8a", "arm64": "arm64-v8a",
            "armv7l": "armeabi-v7a", "i686": "x86", "riscv64": "riscv64"}
PHONE_PATH = "/system/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PASSTHROUGH_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS", "LANG", "TZ")


def default_home() -> Path:
    return Path(os.environ.get("BMOE_FLEET_HOME", Path.home() / ".bmoe-fleet")) / "virtual"


@dataclass(frozen=True)
class PhoneSpec:
    name: str
    ram_bytes: int
    model: str = "vphone"
    manufacturer: str = "bmoe"
    soc: str = "sm8550"
    android: int = 14
    abi: str = "arm64-v8a"
    host_abi: str = field(default_factory=lambda: HOST_ABI.get(platform.machine(), platform.machine()))
    ambient_c: float = 25.0
    isolated: bool = True  # False: no cgroup, no namespace (the fallback, on purpose)

    @property
    def sdk(self) -> int:
        return SDK_FOR_RELEASE.get(self.android, 34)

    @property
    def device(self) -> str:
        return "vphone_" + "".join(ch if ch.isalnum() else "_" for ch in self.name.lower())

    def props(self) -> dict[str, str]:
        abilist = {"arm64-v8a": "arm64-v8a,armeabi-v7a,armeabi", "x86_64": "x86_64,x86"}.get(self.abi, self.abi)
        fingerprint = f"{self.manufacturer}/{self.device}/{self.device}:{self.android}/VP1A.000000/1:user/release-keys"
        return {
            "ro.product.model": self.model, "ro.product.manufacturer": self.manufacturer,
            "ro.product.brand": self.manufacturer, "ro.product.name": self.device,
            "ro.product.device": self.device, "ro.product.board": self.soc, "ro.board.platform": self.soc,
            "ro.soc.model": self.soc, "ro.soc.manufacturer": self.manufacturer, "ro.hardware": self.soc,
            "ro.build.version.release": str(self.android), "ro.build.version.sdk": str(self.sdk),
            "ro.build.fingerprint": fingerprint, "ro.build.type": "user", "ro.debuggable": "0",
            "ro.product.cpu.abi": self.abi, "ro.product.cpu.abilist": abilist,
            "ro.product.cpu.abilist64": self.abi if "64" in self.abi else "",
            "ro.serialno": self.device, "ro.boot.serialno": self.device, "ro.kernel.qemu": "0",
            "sys.boot_completed": "1", "dev.bootcomplete": "1", "ro.config.low_ram": "false",
            "ro.bmoe.virtual": "1", "ro.bmoe.ram_bytes": str(self.ram_bytes), "ro.bmoe.host_abi": self.host_abi,
            "persist.sys.timezone": time.tzname[0] or "UTC",
        }

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "PhoneSpec":
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def internal(self) -> Path:
        return self.root / INTERNAL

    @property
    def spec_file(self) -> Path:
        return self.internal / "spec.json"

    @property
    def state_file(self) -> Path:
        return self.internal / "state.json"

    @property
    def daemon_log(self) -> Path:
        return self.internal / "daemon.log"

    @property
    def staging(self) -> Path:
        return self.internal / "nsroot"

    @property
    def data_tmp(self) -> Path:
        return self.root / "data/local/tmp"

    @property
    def system_bin(self) -> Path:
        return self.root / "system/bin"


def prepare(spec: PhoneSpec, root: Path) -> Layout:
    """Create (or refresh) the phone's folder. Idempotent: files in data/ survive restarts."""
    layout = Layout(Path(root).resolve())
    for d in (layout.internal, layout.data_tmp, layout.root / logbuf.LOGD_DIR, layout.system_bin,
              layout.root / "proc", layout.staging, layout.root / "sdcard"):
        d.mkdir(parents=True, exist_ok=True)
    layout.spec_file.write_text(json.dumps(spec.to_json(), indent=2) + "\n")
    props = spec.props()
    (layout.root / "system/build.prop").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    for buffer in logbuf.BUFFERS:
        logbuf.buffer_path(layout.root, buffer).touch()
    tools_py = Path(__file__).with_name("tools.py").resolve()
    for tool in ("getprop", "logcat", "dumpsys"):
        script = (f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -I -S {shlex.quote(str(tools_py))} "
                  f"{shlex.quote(str(layout.root))} {tool} \"$@\"\n")
        path = layout.system_bin / tool
        path.write_text(script)
        path.chmod(0o755)
    sh = layout.system_bin / "sh"
    if not sh.is_symlink():
        sh.symlink_to("/bin/sh")
    thermal.ThermalModel(spec.soc, spec.ambient_c).write(layout.root)
    write_in_place(layout.root / MEMINFO_PATH, compute(spec.ram_bytes, MemStat(usage_bytes=0)).text())
    return layout


class VirtualPhone:
    """The running phone inside its daemon: spawns commands, keeps its generated files fresh."""

    def __init__(self, spec: PhoneSpec, layout: Layout, cgroup: Optional[MemoryCgroup], in_namespace: bool):
        self.spec = spec
        self.layout = layout
        self.cgroup = cgroup
        self.in_namespace = in_namespace
        self.thermal = thermal.ThermalModel(spec.soc, spec.ambient_c)
        self._last_cpu_ns: Optional[int] = None
        self._last_tick = time.monotonic()
        self._proc_cpu: dict[int, float] = {}

    # -- commands ---------------------------------------------------------------------------
    def argv(self, command: Optional[str]) -> list[str]:
        join = []
        if self.cgroup is not None:
            join = [f"echo 0 >{shlex.quote(str(p))} || {{ echo 'vphone: cannot join the memory cgroup' >&2; "
                    f"exit 125; }}" for p in self.cgroup.procs_files()]
        run = 'exec /bin/sh -c "$0"' if command is not None else "exec /bin/sh -i"
        argv = ["/bin/sh", "-c", "; ".join(join + [run])]
        return argv + [command] if command is not None else argv

    def env(self, term: str) -> dict[str, str]:
        path = PHONE_PATH if self.in_namespace else f"{self.layout.system_bin}:{PHONE_PATH.split(':', 1)[1]}"
        env = {"PATH": path, "HOME": "/" if self.in_namespace else str(self.layout.data_tmp),
               "TMPDIR": "/data/local/tmp" if self.in_namespace else str(self.layout.data_tmp),
               "ANDROID_DATA": "/data", "ANDROID_ROOT": "/system", "EXTERNAL_STORAGE": "/sdcard",
               "USER": "shell", "LOGNAME": "shell", "HOSTNAME": self.spec.device, "SHELL": "/system/bin/sh",
               "TERM": term, "PS1": f"{self.spec.device}:/ $ ", "BMOE_VPHONE": self.spec.name,
               "BMOE_VPHONE_ROOT": str(self.layout.root)}
        env.update({k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ})
        return env

    async def spawn(self, command: Optional[str], *, pty_slave: Optional[int], merge_stderr: bool,
                    term: str) -> asyncio.subprocess.Process:
        self.refresh_meminfo()  # a command reading /proc/meminfo first thing sees the present
        cwd = "/" if self.in_namespace else str(self.layout.data_tmp)
        if pty_slave is not None:
            io = dict(stdin=pty_slave, stdout=pty_slave, stderr=pty_slave, preexec_fn=_take_ctty)
        else:
            io = dict(stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                      stderr=asyncio.subprocess.STDOUT if merge_stderr else asyncio.subprocess.PIPE)
        return await asyncio.create_subprocess_exec(*self.argv(command), cwd=cwd, env=self.env(term),
                                                    start_new_session=True, **io)

    # -- generated files --------------------------------------------------------------------
    def mem_stat(self) -> MemStat:
        if self.cgroup is not None:
            try:
                return self.cgroup.mem_stat()
            except OSError:
                pass
        rss = 0
        for pid in self.pids():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                rss += next(int(l.split()[1]) for l in status.splitlines() if l.startswith("VmRSS:")) * 1024
            except (OSError, StopIteration, ValueError):
                pass
        return MemStat(usage_bytes=rss, anon_bytes=rss, active_anon_bytes=rss)

    def meminfo(self) -> MemInfo:
        return compute(self.spec.ram_bytes, self.mem_stat())

    def refresh_meminfo(self) -> None:
        write_in_place(self.layout.root / MEMINFO_PATH, self.meminfo().text())

    def pids(self) -> list[int]:
        if self.cgroup is not None:
            return self.cgroup.pids()
        return _descendants(os.getpid())

    def _busy_cores(self, dt_s: float) -> float:
        cpu_ns = self.cgroup.cpu_usage_ns() if self.cgroup is not None else None
        if cpu_ns is not None:
            busy = 0.0 if self._last_cpu_ns is None else (cpu_ns - self._last_cpu_ns) / 1e9 / max(dt_s, 1e-3)
            self._last_cpu_ns = cpu_ns
            return max(0.0, busy)
        # No CPU accounting cgroup: per-process utime+stime deltas of the phone's processes.
        ticks = os.sysconf("SC_CLK_TCK")
        now_cpu, busy_s = {}, 0.0
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                now_cpu[pid] = (int(fields[11]) + int(fields[12])) / ticks
            except (OSError, IndexError, ValueError):
                continue
            busy_s += max(0.0, now_cpu[pid] - self._proc_cpu.get(pid, now_cpu[pid]))
        self._proc_cpu = now_cpu
        return busy_s / max(dt_s, 1e-3)

    def tick(self) -> None:
        """Once a second: thermal zones and cpufreq caps (meminfo is refreshed faster)."""
        now = time.monotonic()
        dt = now - self._last_tick
        self._last_tick = now
        self.thermal.step(dt, self._busy_cores(dt))
        self.thermal.write(self.layout.root)


def _take_ctty() -> None:
    """In the child, after setsid: make the pty (its stdin) the controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out
