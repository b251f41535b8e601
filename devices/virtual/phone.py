"""A virtual phone: its identity, its folder, and how its commands run.

Folder (default ~/.bmoe-fleet/virtual/NAME/, the phone's `/` for sync):
  data/local/tmp/          the shell user's /data/local/tmp (uid 2000, mode 0771)
  data/misc/logd/*.log     logcat buffers main, system, events, crash, kernel (logbuf.py)
  system/bin/              mksh (sh -> mksh), toybox and its applets as symlinks, getprop, logcat, dumpsys
  system/etc/              passwd, group (Android's ids), system/lib/bmoe-vphone/ the tools' Python
  system/build.prop        the getprop table
  bin -> system/bin, etc -> system/etc   as on Android 10+
  proc/meminfo, sys/class/thermal/, sys/devices/system/cpu/cpufreq/   generated each second
  .vphone/                 spec.json, state.json, daemon.log, the namespace's staging mount

Commands run as Android's adbd runs them: `/system/bin/sh -c CMD` (mksh), as uid/gid 2000 (shell)
with adbd's supplementary groups, in the phone's mount namespace (namespace.py: the phone's own
`/`), after the child has moved itself into the phone's memory cgroup (so every descendant is
counted and OOM-killed there, and the daemon never is). Without the namespace (the fallback) they
run as the daemon's user with the phone's /system/bin as their PATH.

Long because: it holds what a phone is made of in the order it is made (its spec and folder
layout, the folder built from them, the running phone that spawns commands and regenerates its
files), each part reading the one before; a split moving the folder building (prepare, _userland,
install_tools and the toybox applet table, some 150 lines) into a module of its own would be
clean, and is the one this module should get next.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from devices.android import HOST_ABI
from devices.lmkd_policy import LmkProps
from devices.virtual import cpuinfo, logbuf, namespace, pacedfs, thermal, zram
from devices.virtual.cgroup import MemoryCgroup, MemStat, SwapTraffic
from devices.virtual.cgroup import reclaim_orphans as reclaim_orphan_cgroups
from devices.virtual.meminfo import (
    MEMINFO_PATH,
    VMSTAT_PATH,
    ZONEINFO_PATH,
    MemInfo,
    compute,
    vmstat_text,
    write_in_place,
    zoneinfo_text,
)
from devices.virtual.variant import build_variant_props
from devices.virtual.zram import Zram, ram_for
from devices.virtual.zram_charge import Ballast
from engine.fsutil import atomic_write, fleet_home, replacing
from engine.units import is_digits

SDK_FOR_RELEASE = {9: 28, 10: 29, 11: 30, 12: 31, 13: 33, 14: 34, 15: 35, 16: 36}
INTERNAL = ".vphone"
STACKS_SIGNAL = signal.SIGUSR1   # a daemon sent it writes every thread's Python stack to its log
# Android's PATH as `adb shell` gets it (bionic libc/include/paths.h `_PATH_DEFPATH`); a phone keeps the folders it has.
ANDROID_PATH = ("/product/bin:/apex/com.android.runtime/bin:/apex/com.android.art/bin:/system_ext/bin:"
                "/system/bin:/system/xbin:/odm/bin:/vendor/bin:/vendor/xbin")
PHONE_BIN_DIRS = ("/system/bin",) + tuple("/" + d for d in namespace.EMPTY_BIN_DIRS)
PASSTHROUGH_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS", "LANG", "TZ")
PHONE_TOOLS = ("getprop", "logcat", "dumpsys")
TOOL_MODULES = ("tools.py", "logbuf.py", "thermal.py", "servicecmd.py")

# Android's ids (system/core/libcutils/include/private/android_filesystem_config.h)
SHELL_UID = SHELL_GID = 2000
# adbd's adj (init's -1000 for a service without oom_score_adjust) and what adbd writes into every
# shell child (packages/modules/adb daemon/shell_service.cpp: "Increase oom_score_adj from -1000, so
# that the child is visible to the OOM-killer"); child_setup says why in this order
ADBD_OOM_SCORE_ADJ, SHELL_OOM_SCORE_ADJ = b"-1000", b"-950"
ANDROID_IDS = {"root": 0, "system": 1000, "input": 1004, "log": 1007, "adb": 1011, "sdcard_rw": 1015,
               "sdcard_r": 1028, "ext_data_rw": 1078, "ext_obb_rw": 1079, "shell": 2000, "net_bt_admin": 3001,
               "net_bt": 3002, "inet": 3003, "net_bw_stats": 3006, "readproc": 3009, "uhid": 3011,
               "readtracefs": 3012, "nobody": 9999}
# adbd's drop_privileges() (packages/modules/adb daemon/main.cpp): the shell user's extra groups
SHELL_GROUPS = tuple(ANDROID_IDS[g] for g in ("input", "log", "adb", "sdcard_rw", "sdcard_r", "ext_data_rw",
                                                "ext_obb_rw", "net_bt_admin", "net_bt", "inet", "net_bw_stats",
                                                "readproc", "uhid", "readtracefs"))
# The applets Android links to toybox in /system/bin (external/toybox Android.bp `symlinks`, plus
# grep/egrep/fgrep, which newer releases also take from toybox). A phone gets those that this
# host's toybox build has.
ANDROID_TOYBOX_APPLETS = frozenset(["acpi", "base64", "basename", "bc", "blockdev", "cal", "cat", "chcon", "chgrp", "chmod", "chown", "chroot", "chrt", "cksum", "clear", "comm", "cmp", "cp", "cpio", "cut", "date", "dd", "devmem", "df", "diff", "dirname", "dmesg", "dos2unix", "du", "echo", "egrep", "env", "expand", "expr", "fallocate", "false", "fgrep", "file", "find", "flock", "fmt", "free", "fsync", "getconf", "getenforce", "grep", "groups", "gunzip", "gzip", "head", "hostname", "hwclock", "i2cdetect", "i2cdump", "i2cget", "i2cset", "iconv", "id", "ifconfig", "inotifyd", "insmod", "install", "ionice", "iorenice", "kill", "killall", "load_policy", "ln", "log", "logname", "losetup", "ls", "lsmod", "lsof", "lspci", "lsusb", "md5sum", "mkdir", "mkfifo", "mknod", "mkswap", "mktemp", "microcom", "modinfo", "modprobe", "more", "mount", "mountpoint", "mv", "nc", "netcat", "netstat", "nice", "nl", "nohup", "nproc", "nsenter", "od", "paste", "patch", "pgrep", "pidof", "pkill", "pmap", "printenv", "printf", "ps", "pwd", "readlink", "realpath", "renice", "restorecon", "rm", "rmdir", "rmmod", "runcon", "sed", "sendevent", "seq", "setenforce", "setprop", "setsid", "sha1sum", "sha224sum", "sha256sum", "sha384sum", "sha512sum", "sleep", "sort", "split", "start", "stat", "stop", "strings", "stty", "swapoff", "swapon", "sync", "sysctl", "tac", "tail", "tar", "taskset", "tee", "time", "timeout", "top", "touch", "tr", "true", "truncate", "tty", "ulimit", "umount", "uname", "uniq", "unix2dos", "unlink", "unshare", "uptime", "usleep", "uudecode", "uuencode", "uuidgen", "vmstat", "watch", "wc", "which", "whoami", "xargs", "xxd", "yes", "zcat"])


class UserlandMissing(Exception):
    """mksh or toybox is not installed on this host (Debian: apt-get install mksh toybox)."""


class NotLinux(Exception):
    """This Python is not on Linux: a virtual phone needs its memory cgroups, mount namespaces and
    ptys (fcntl, termios)."""


def require_linux() -> None:
    """Raise NotLinux unless virtual phones can run here. They are Linux-only by nature; the rest of
    the package imports anywhere, so the POSIX-only modules are imported where a phone uses them."""
    try:
        import fcntl  # noqa: F401
        import termios  # noqa: F401
    except ModuleNotFoundError as e:
        raise NotLinux(f"virtual phones need Linux (memory cgroups, mount namespaces, ptys): this Python has "
                       f"no {e.name} module ({sys.platform}); on Windows, run bmoe-fleet in WSL") from None
    if not sys.platform.startswith("linux"):
        raise NotLinux(f"virtual phones need Linux (memory cgroups, mount namespaces), not {sys.platform}")


def default_home() -> Path:
    """Where virtual phones live: $BMOE_FLEET_HOME/virtual, else ~/.bmoe-fleet/virtual."""
    return fleet_home() / "virtual"


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
    record_commands: bool = False  # every shell/exec command line to .vphone/commands.jsonl (tests)
    apps: tuple[str, ...] = ()     # other open apps, "STATE:SIZE[:compressible][:active]" (apps.py)
    lmk: dict = field(default_factory=dict)  # ro.lmk.* overrides of Android 14's defaults (lmkd_policy)
    zram_bytes: int = 0            # the phone's own zram swap device (0: none, memsw = RAM)
    zram_algorithm: str = "lz4"    # its comp_algorithm, Android's default
    swappiness: int = 100          # its memory cgroup's swappiness where it has zram (Android's vm.swappiness)
    cpus: int = 0                  # cores of its own (a cpuset); 0: every core of the host, shared
    storage_mbps: int = 0          # its /data paced at this read rate, MiB/s (pacedfs.py; 0: none)
    profile: str = ""              # the real phone its figures came from (profiles.py), "" for none
    build: str = "user"            # ro.build.type: "user" or "userdebug" (the kernel buffer: tools.logcat)
    page_size_bytes: int = 4096    # the page size its shell sees (getconf, /proc/vmstat's page counters)
    data_quota_bytes: int = 0      # its /data (and /sdcard) on a file system of this size (dataquota.py; 0: none)
    thermal_unit: str = "mC"       # what its CPU zones count in: "mC" (m°C), "dC" (tenths) or "C" (thermal.py)

    @property
    def sdk(self) -> int:
        return SDK_FOR_RELEASE.get(self.android, 34)

    @property
    def device(self) -> str:
        return "vphone_" + "".join(ch if ch.isalnum() else "_" for ch in self.name.lower())

    def props(self) -> dict[str, str]:
        abilist = {"arm64-v8a": "arm64-v8a,armeabi-v7a,armeabi", "x86_64": "x86_64,x86"}.get(self.abi, self.abi)
        fingerprint = (f"{self.manufacturer}/{self.device}/{self.device}:{self.android}/VP1A.000000/1:"
                       f"{self.build}/release-keys")
        return {
            "ro.product.model": self.model, "ro.product.manufacturer": self.manufacturer,
            "ro.product.brand": self.manufacturer, "ro.product.name": self.device,
            "ro.product.device": self.device, "ro.product.board": self.soc, "ro.board.platform": self.soc,
            "ro.soc.model": self.soc, "ro.soc.manufacturer": self.manufacturer, "ro.hardware": self.soc,
            "ro.build.version.release": str(self.android), "ro.build.version.sdk": str(self.sdk),
            "ro.build.fingerprint": fingerprint, "ro.build.type": self.build,
            "ro.debuggable": "1" if self.build == "userdebug" else "0",
            **build_variant_props(self.build, self.page_size_bytes, self.android, self.thermal_unit),
            "ro.product.cpu.abi": self.abi, "ro.product.cpu.abilist": abilist,
            "ro.product.cpu.abilist64": self.abi if "64" in self.abi else "",
            "ro.serialno": self.device, "ro.boot.serialno": self.device, "ro.kernel.qemu": "0",
            "sys.boot_completed": "1", "dev.bootcomplete": "1", "ro.config.low_ram": "false",
            "ro.bmoe.virtual": "1", "ro.bmoe.ram_bytes": str(self.ram_bytes), "ro.bmoe.host_abi": self.host_abi,
            "persist.sys.timezone": time.tzname[0] or "UTC",
            **LmkProps.from_json(self.lmk).props(),
        }

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> PhoneSpec:
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if "apps" in fields:
            fields["apps"] = tuple(fields["apps"])
        return cls(**fields)


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
    def commands_log(self) -> Path:
        return self.internal / "commands.jsonl"

    @property
    def staging(self) -> Path:
        return self.internal / "nsroot"

    @property
    def data_tmp(self) -> Path:
        return self.root / "data/local/tmp"

    @property
    def system_bin(self) -> Path:
        return self.root / "system/bin"

    @property
    def system_etc(self) -> Path:
        return self.root / "system/etc"

    @property
    def tools_dir(self) -> Path:
        return self.root / "system/lib/bmoe-vphone"


def _chown(path: Path, uid: int, gid: int, mode: int) -> None:
    """Ownership and mode as on a phone; only root can give files away (else: mode only)."""
    with contextlib.suppress(PermissionError):
        os.chown(path, uid, gid, follow_symlinks=False)
    os.chmod(path, mode)


def _install_file(src: str, dst: Path) -> None:
    """Copy unless the same size and mtime are there; by rename, so a running copy is never
    rewritten in place (text file busy)."""
    st = os.stat(src)
    try:
        have = os.stat(dst, follow_symlinks=False)
        if have.st_size == st.st_size and int(have.st_mtime) == int(st.st_mtime) and not dst.is_symlink():
            return
    except FileNotFoundError:
        pass
    with open(src, "rb") as fh, replacing(dst, mode=0o755) as out:
        shutil.copyfileobj(fh, out)
        out.flush()                              # every byte down before the times are copied
        shutil.copystat(src, out.name)


def _link(path: Path, target: str) -> None:
    if path.is_symlink() and os.readlink(path) == target:
        return
    if path.is_symlink() or path.exists():
        path.unlink()
    path.symlink_to(target)


def host_userland() -> tuple[str, str]:
    """This host's mksh and toybox (what Android's /system/bin/sh and toolbox are)."""
    found = [shutil.which(name) or next((p for p in (f"/bin/{name}", f"/usr/bin/{name}") if os.path.isfile(p)), None)
             for name in ("mksh", "toybox")]
    mksh, toybox = found
    if mksh is None or toybox is None:
        missing = [name for name, path in zip(("mksh", "toybox"), found) if path is None]
        raise UserlandMissing(f"{' and '.join(missing)} not installed: a virtual phone's shell is mksh and its "
                              "toolbox is toybox, as on Android (Debian: apt-get install mksh toybox; run.sh "
                              "installs them)")
    return os.path.realpath(mksh), os.path.realpath(toybox)


def toybox_applets(toybox: str) -> set[str]:
    """The applets this toybox build has (it lists them when run without arguments)."""
    out = subprocess.run([toybox], capture_output=True, text=True, timeout=30).stdout
    return set(out.split())


def _userland(layout: Layout) -> None:
    """mksh as /system/bin/sh, toybox's applets as symlinks to it, like Android's /system/bin."""
    mksh, toybox = host_userland()
    _install_file(mksh, layout.system_bin / "mksh")
    _install_file(toybox, layout.system_bin / "toybox")
    _link(layout.system_bin / "sh", "mksh")
    for applet in sorted(ANDROID_TOYBOX_APPLETS & toybox_applets(toybox)):
        if applet not in PHONE_TOOLS:
            _link(layout.system_bin / applet, "toybox")
    layout.system_etc.mkdir(parents=True, exist_ok=True)
    users = "".join(f"{name}:x:{uid}:{uid}::/:/system/bin/sh\n" for name, uid in ANDROID_IDS.items())
    groups = "".join(f"{name}:x:{gid}:{'shell' if gid in SHELL_GROUPS else ''}\n" for name, gid in ANDROID_IDS.items())
    (layout.system_etc / "passwd").write_text(users)
    (layout.system_etc / "group").write_text(groups)
    (layout.system_etc / "nsswitch.conf").write_text("passwd: files\ngroup: files\n")
    for name, target in (("bin", "system/bin"), ("etc", "system/etc")):
        _link(layout.root / name, target)


def reclaim_left(internal: Path) -> None:
    """What a daemon of this phone (its `.vphone` folder: `internal`) killed before its stop left,
    and any phone's orphaned zram device and cgroups: a start's first step (run.py setup), and what
    up() does for a daemon it killed (manager.py)."""
    zram.reclaim(internal)
    zram.reclaim_orphans()
    reclaim_orphan_cgroups()
    pacedfs.reclaim(internal)


def prepare(spec: PhoneSpec, root: Path) -> Layout:
    """Create (or refresh) the phone's folder. Idempotent: files in data/ survive restarts."""
    layout = Layout(Path(root).resolve())
    for d in (layout.internal, layout.data_tmp, layout.root / logbuf.LOGD_DIR, layout.system_bin,
              layout.tools_dir, layout.root / "proc", layout.staging, layout.root / "sdcard",
              layout.root / "dev/socket"):   # lmkd's and the services' sockets (lmkd.py, am.py)
        d.mkdir(parents=True, exist_ok=True)
    layout.spec_file.write_text(json.dumps(spec.to_json(), indent=2, allow_nan=False) + "\n")
    from devices.virtual import tools as phone_tools

    props = spec.props()
    (layout.root / phone_tools.BUILD_PROP).write_text(phone_tools.build_prop_text(props), encoding="utf-8")
    for buffer in logbuf.BUFFERS:
        path = logbuf.buffer_path(layout.root, buffer)
        path.touch()
        _chown(path, 0, ANDROID_IDS["log"], 0o660)   # logcat runs as shell, a member of `log`
    _userland(layout)
    here = Path(__file__).resolve().parent
    for module in TOOL_MODULES:
        shutil.copyfile(here / module, layout.tools_dir / module)
    # Android's modes: /data and /data/local are walk-only for shell; /data/local/tmp is shell's
    for rel, uid, gid, mode in (("data", 0, 0, 0o771), ("data/local", 0, 0, 0o751),
                                ("data/local/tmp", SHELL_UID, SHELL_GID, 0o771), ("data/misc", 0, 0, 0o771),
                                (str(logbuf.LOGD_DIR), 0, ANDROID_IDS["log"], 0o750),
                                # shell's, so sync (file access as uid 2000, without groups) can push there
                                ("sdcard", SHELL_UID, ANDROID_IDS["sdcard_rw"], 0o770)):
        _chown(layout.root / rel, uid, gid, mode)
    thermal.ThermalModel(spec.soc, spec.ambient_c, spec.thermal_unit).write(layout.root)
    write_in_place(layout.root / MEMINFO_PATH, compute(spec.ram_bytes, MemStat(usage_bytes=0)).text())
    write_in_place(layout.root / VMSTAT_PATH, vmstat_text({}))
    write_in_place(layout.root / ZONEINFO_PATH, zoneinfo_text(spec.ram_bytes // 1024, spec.ram_bytes // 1024,
                                                              spec.page_size_bytes))
    cpuinfo.write(layout.root, cpuinfo.host_cpus()[:spec.cpus] if spec.cpus else cpuinfo.host_cpus())
    return layout


def install_tools(layout: Layout, in_namespace: bool) -> None:
    """getprop, logcat, dumpsys: shell scripts that run tools.py on this host's interpreter, except
    getprop, which the shell serves from a table of build.prop written here (tools.getprop_script:
    no interpreter start). In the namespace they name phone paths; without it (the fallback) host
    paths of the phone's folder."""
    import py_compile

    from devices.virtual import tools as phone_tools

    if in_namespace:
        sh, lib, root = "/system/bin/sh", "/system/lib/bmoe-vphone", "/"
    else:
        sh, lib, root = str(layout.system_bin / "sh"), str(layout.tools_dir), str(layout.root)
    # compiled here, once: the shell user cannot write their __pycache__, and a tool run as a
    # script (or a module without its .pyc) would be compiled again on every call (a folder this
    # user cannot write either only costs that)
    for module in TOOL_MODULES:
        with contextlib.suppress(OSError):
            py_compile.compile(str(layout.tools_dir / module), doraise=True)
    table = phone_tools.props_table(layout.root)
    if table is not None:
        atomic_write(layout.tools_dir / phone_tools.PROPS_TABLE, table, mode=0o644)
    code = f"import sys; sys.path.insert(0, {lib!r}); import tools; sys.exit(tools.main(sys.argv[1:]))"
    for tool in PHONE_TOOLS:
        run = f"exec {shlex.quote(sys.executable)} -I -S -c {shlex.quote(code)} {shlex.quote(root)} {tool} \"$@\""
        if tool == "getprop" and table is not None:
            run = phone_tools.getprop_script(f"{lib}/{phone_tools.PROPS_TABLE}",
                                             os.path.join(root, phone_tools.BUILD_PROP), run)
        script = f"#!{sh}\n{run}\n"
        path = layout.system_bin / tool
        if path.is_symlink():
            path.unlink()
        atomic_write(path, script, mode=0o755)
    # cmd, and am and pm over it: the phone's ActivityManager (am.py) through servicecmd.py
    from devices.virtual import servicecmd

    for tool, script in servicecmd.scripts(sh, lib, root, sys.executable).items():
        atomic_write(layout.system_bin / tool, script, mode=0o755)


class VirtualPhone:
    """The running phone inside its daemon: spawns commands, keeps its generated files fresh."""

    def __init__(self, spec: PhoneSpec, layout: Layout, cgroup: MemoryCgroup | None,
                 namespace_fd: int | None, zram: Zram | None = None, ballast: Ballast | None = None):
        self.spec = spec
        self.zram = zram                   # its own swap device (None: no zram)
        self.ballast = ballast             # zram's use held in its cgroup (zram_charge.py)
        # its pswpin/pswpout: its memory cgroup's traffic, whichever zram device took the pages
        self.swap_traffic = SwapTraffic(cgroup) if cgroup is not None else None
        self.layout = layout
        self.cgroup = cgroup
        self.namespace_fd = namespace_fd   # the phone's mount namespace (None: the fallback)
        self.net_namespace_fd: int | None = None   # the phone's network namespace (None: the host's)
        self.thermal = thermal.ThermalModel(spec.soc, spec.ambient_c, spec.thermal_unit)
        self._last_cpu_ns: int | None = None
        self._last_tick = time.monotonic()
        self._proc_cpu: dict[int, float] = {}

    @property
    def in_namespace(self) -> bool:
        return self.namespace_fd is not None

    # -- commands ---------------------------------------------------------------------------
    def shell_path(self) -> str:
        return "/system/bin/sh" if self.in_namespace else str(self.layout.system_bin / "sh")

    def argv(self, command: str | None) -> list[str]:
        """adbd's exec: `sh -c CMD`, or a login shell (argv[0] `-/system/bin/sh`) for none."""
        sh = self.shell_path()
        return [sh, "-c", command] if command is not None else ["-" + sh]

    def env(self, term: str) -> dict[str, str]:
        if self.in_namespace:
            path = ":".join(d for d in ANDROID_PATH.split(":") if d in PHONE_BIN_DIRS)
        else:
            path = str(self.layout.system_bin)
        env = {"PATH": path, "HOME": "/" if self.in_namespace else str(self.layout.data_tmp),
               "TMPDIR": "/data/local/tmp" if self.in_namespace else str(self.layout.data_tmp),
               "ANDROID_DATA": "/data", "ANDROID_ROOT": "/system", "EXTERNAL_STORAGE": "/sdcard",
               "USER": "shell", "LOGNAME": "shell", "HOSTNAME": self.spec.device, "SHELL": "/system/bin/sh",
               "TERM": term, "PS1": f"{self.spec.device}:/ $ "}
        env.update({k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ})
        return env

    def child_setup(self, pty: bool) -> Callable[[], None]:
        """What the child does between fork and exec, in this order: join the phone's memory
        cgroup (host paths, as root), take adbd's oom_score_adj, enter the phone's mount and
        network namespaces, take the pty, drop to the shell user, write the shell's adj (-950).
        Any failure ends the child with 125 and one line on its stderr."""
        procs = [str(p) for p in self.cgroup.procs_files()] if self.cgroup is not None else []
        ns_fd = self.namespace_fd
        net_fd = self.net_namespace_fd
        # POSIX-only, imported here (before the fork: never import between fork and exec) so the
        # package itself imports on any Python; require_linux() says why a phone cannot start.
        import fcntl
        import termios

        def setup() -> None:
            step = "join the memory cgroup"
            adj_fd = -1
            try:
                join_cgroup(procs)
                # adbd's adj, written as root, which makes -1000 the floor too (the kernel's
                # oom_score_adj_min, set by a writer with CAP_SYS_RESOURCE: init's for adbd) ...
                with contextlib.suppress(OSError):
                    adj_fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
                    os.write(adj_fd, ADBD_OOM_SCORE_ADJ)
                if ns_fd is not None:
                    step = "enter the phone's namespace"
                    namespace.setns(ns_fd)
                    os.chdir("/")
                if net_fd is not None:
                    step = "enter the phone's network"
                    namespace.setns(net_fd, namespace.CLONE_NEWNET)
                if pty:
                    step = "take the terminal"
                    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
                if ns_fd is not None:
                    step = "become the shell user"
                    os.setgroups(list(SHELL_GROUPS))
                    os.setresgid(SHELL_GID, SHELL_GID, SHELL_GID)
                    os.setresuid(SHELL_UID, SHELL_UID, SHELL_UID)
                # ... then -950 as adbd writes it, without capabilities (a user build's adbd has
                # none: daemon/main.cpp drop_privileges), so the floor stays -1000: the shell may
                # raise its adj and lower it again down to adbd's, as on a phone. In the fallback
                # (no uid to drop to) a root daemon's write makes -950 the floor; a daemon that
                # may not lower its adj at all leaves its own.
                if adj_fd >= 0:
                    with contextlib.suppress(OSError):
                        os.write(adj_fd, SHELL_OOM_SCORE_ADJ)
                    os.close(adj_fd)
            except BaseException as e:
                os.write(2, f"vphone: cannot {step}: {e}\n".encode())
                os._exit(125)

        return setup

    async def spawn(self, command: str | None, *, pty_slave: int | None, merge_stderr: bool,
                    term: str) -> asyncio.subprocess.Process:
        """Start `command` (None: a login shell) as adbd would, on a pty or on pipes."""
        self.refresh_meminfo()  # a command reading /proc/meminfo first thing sees the present
        if pty_slave is not None:
            if self.in_namespace:
                os.fchown(pty_slave, SHELL_UID, SHELL_GID)   # adbd (shell) opened it: the shell's tty
            stdin = stdout = stderr = pty_slave
        else:
            stdin = stdout = asyncio.subprocess.PIPE
            stderr = asyncio.subprocess.STDOUT if merge_stderr else asyncio.subprocess.PIPE
        argv = self.argv(command)
        # in the namespace the child changes to the phone's `/` itself, after setns
        cwd = None if self.in_namespace else str(self.layout.data_tmp)
        return await asyncio.create_subprocess_exec(*argv, executable=self.shell_path(), cwd=cwd,
                                                    env=self.env(term), start_new_session=True,
                                                    preexec_fn=self.child_setup(pty_slave is not None),
                                                    stdin=stdin, stdout=stdout, stderr=stderr)

    # -- generated files --------------------------------------------------------------------
    def mem_stat(self) -> MemStat:
        """The phone's memory use: its cgroup's counters, else its processes' RSS."""
        if self.cgroup is not None:
            try:
                st = self.cgroup.mem_stat()
            except OSError:
                pass
            else:
                if self.ballast is None:
                    return st
                # the ballast's own pages are not the phone's (its limit has them on top of the RAM);
                # what it holds is zram's pool: used memory, but neither page cache nor unevictable
                held = min(self.ballast.target_bytes, st.unevictable_bytes, st.file_bytes)
                return replace(st, usage_bytes=max(0, st.usage_bytes - self.ballast.own_bytes),
                               file_bytes=st.file_bytes - held, unevictable_bytes=st.unevictable_bytes - held)
        rss = 0
        for pid in self.pids():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                rss += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")) * 1024
            except (OSError, StopIteration, ValueError):
                pass
        return MemStat(usage_bytes=rss, anon_bytes=rss, active_anon_bytes=rss)

    def meminfo(self) -> MemInfo:
        """/proc/meminfo of the phone; SwapTotal is its zram's size, SwapFree that minus what its
        cgroup has in swap (0 and 0 without zram)."""
        swap_total = self.spec.zram_bytes if self.zram is not None else 0
        swapped = self.cgroup.swap_bytes() if self.cgroup is not None and swap_total else 0
        return compute(self.spec.ram_bytes, self.mem_stat(), swap_total, swapped)

    def zram_used_bytes(self) -> int:
        """What the phone's swapped pages take in zram's RAM now: its cgroup's swap at the zram
        pool's ratio (zram.ram_for; 0 without zram). Not its device's mm_stat, which holds every
        zram phone's pages."""
        if self.zram is None or self.cgroup is None:
            return 0
        return ram_for(self.cgroup.swap_bytes())

    def vmstat(self) -> dict[str, int]:
        """The phone's /proc/vmstat counters. Per phone: pgfault, pgmajfault, workingset_refault_anon,
        workingset_refault_file (its memory cgroup's memory.stat), pswpin and pswpout (its memory
        cgroup's swap traffic, cgroup.SwapTraffic: whichever zram device took its pages, never
        another phone's; docs/virtual-phones.md, "How a phone's swap counters are derived").
        Host-wide, from the host's /proc/vmstat (cgroup v1 has no per-group counters for them):
        pgsteal_*, pgscan_*, allocstall_*, so they are the phone's only while it is the only thing
        under reclaim."""
        out: dict[str, int] = {}
        host = _host_vmstat()
        for key, value in host.items():
            if key.startswith(("pgsteal_", "pgscan_", "allocstall_")):
                out[key] = value
        counters: dict[str, int] | None = None
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                counters = self.cgroup.stat_counters()
        for key in ("pgfault", "pgmajfault", "workingset_refault_anon", "workingset_refault_file"):
            out[key] = (counters or {}).get(key, 0)
        pin, pout = self.swap_traffic.read(counters) if self.swap_traffic is not None else (0, 0)
        out["pswpin"], out["pswpout"] = pin, pout
        return out

    def refresh_meminfo(self) -> None:
        info = self.meminfo()
        write_in_place(self.layout.root / MEMINFO_PATH, info.text())
        write_in_place(self.layout.root / ZONEINFO_PATH, zoneinfo_text(self.spec.ram_bytes // 1024, info.free_kb,
                                                                       self.spec.page_size_bytes))
        write_in_place(self.layout.root / VMSTAT_PATH, vmstat_text(self.vmstat(), self.spec.page_size_bytes))

    def pids(self) -> list[int]:
        """The phone's processes (the ballast holding zram's charge is no process of the phone)."""
        if self.cgroup is not None:
            pids = self.cgroup.pids()
            return [p for p in pids if p != self.ballast.pid] if self.ballast is not None else pids
        # no cgroup: the daemon's descendants, and what a shell left running after its stream
        # closed (reparented away, still in the shell's session: shellsvc._hang_up)
        from devices.virtual import shellsvc

        return sorted(set(_descendants(os.getpid())) | set(shellsvc.session_members(shellsvc.started_sessions())))

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


def _host_vmstat() -> dict[str, int]:
    out = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/vmstat").read_text().splitlines():
            k, _, v = line.partition(" ")
            if is_digits(v.strip()):
                out[k] = int(v)
    return out


def join_cgroup(procs_files: list[str]) -> None:
    """Move the calling process into the cgroups whose cgroup.procs files are given (between fork
    and exec: no allocation beyond the write)."""
    for path in procs_files:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if is_digits(entry):
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
