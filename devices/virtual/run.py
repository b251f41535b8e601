"""A virtual phone's daemon process: `python -m devices.virtual.run --root PHONE_FOLDER [--port P]`.

Started detached by manager.up(). Order matters: the memory cgroup and the mount namespace are
set up while the process is still single-threaded, then asyncio serves adb, polls lmkd at 10 Hz
(100 Hz while swap is low or after a kill, as lmkd does) and refreshes meminfo with it, thermal
and cpufreq at 1 Hz. state.json (pid, port, cgroup, warnings) is written only once the port
listens, which is what up() waits for. SIGTERM stops everything and removes the cgroup (killing
what is still in it).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import faulthandler
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import warnings as warnings_module
from pathlib import Path

from devices.android import parse_apps
from devices.lmkd_policy import POLL_SHORT_S, LmkProps, Policy, watermarks
from devices.virtual import cpuinfo, dataquota, logbuf, namespace, pacedfs, shellsvc, syncsvc, zram
from devices.virtual.adbd import Banner, Connection, Daemon, Service, Stream
from devices.virtual.am import ActivityManager
from devices.virtual.cgroup import CgroupUnavailable, MemoryCgroup, leaf_name
from devices.virtual.lmkd import Lmkd
from devices.virtual.phone import (
    SHELL_GID,
    SHELL_UID,
    STACKS_SIGNAL,
    Layout,
    PhoneSpec,
    UserlandMissing,
    VirtualPhone,
    install_tools,
    prepare,
    reclaim_left,
)
from devices.virtual.zram_charge import Ballast
from engine.fsutil import atomic_write

log = logging.getLogger("bmoe.vphone")
TICK_S = 1.0
CAP_SYS_RESOURCE = 24       # linux/capability.h


def may_lower_oom_score_adj() -> bool:
    """May this daemon give the shell adbd's -1000 and -950 (phone.child_setup)? Lowering an
    oom_score_adj below its floor takes CAP_SYS_RESOURCE (fs/proc/base.c __set_oom_adj), which
    root has unless a container took it from the bounding set."""
    try:
        status = Path("/proc/self/status").read_text()
        cap_eff = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("CapEff:")), 16)
    except (OSError, StopIteration, ValueError):
        return False
    return bool(cap_eff >> CAP_SYS_RESOURCE & 1)


def install_getconf(layout: Layout, page_size_bytes: int, in_namespace: bool) -> None:
    """A phone's `getconf` answers its page size (tools.getconf_script) where toybox's would not:
    on a phone of another page size than this host's, or where this host's toybox has no getconf
    (Android's has it). Elsewhere it stays toybox's applet (_userland links it at every start)."""
    from devices.virtual import tools
    from devices.virtual.meminfo import HOST_PAGE_BYTES

    path = layout.system_bin / "getconf"
    applet = path.is_symlink() and os.readlink(path) == "toybox"
    if applet and page_size_bytes == HOST_PAGE_BYTES:
        return
    bin_dir = "/system/bin" if in_namespace else str(layout.system_bin)
    script = tools.getconf_script(page_size_bytes, f"{bin_dir}/toybox" if applet else None)
    path.unlink(missing_ok=True)
    atomic_write(path, f"#!{bin_dir}/sh\n{script}", mode=0o755)


def make_router(phone: VirtualPhone):
    sync_root = syncsvc.root_handle(phone.layout.root)

    def route(name: str, conn: Connection) -> Service | None:
        request = shellsvc.parse_service(name)
        if request is not None:
            if phone.spec.record_commands:
                _record(phone.layout.commands_log, name.split(":", 1)[0], request.command)
            return lambda stream: shellsvc.serve_shell(stream, request, phone)
        if name == "sync:":
            # adbd serves sync as the shell user too (without the namespace: as the daemon)
            as_user = (SHELL_UID, SHELL_GID) if phone.in_namespace else None
            return lambda stream: syncsvc.serve_sync(stream, sync_root, as_user)
        if name == "reconnect":
            async def reconnect(stream: Stream) -> None:
                # adbd answers "done" and kicks the transport; the server then reconnects.
                await stream.write(b"done")
                await stream.flushed()
                conn.writer.close()
            return reconnect
        return None  # unknown service: CLSE, like adbd
    return route


def _record(path: Path, service: str, command: str | None) -> None:
    """One JSON line per command, one write(2) on an O_APPEND file (streams open concurrently)."""
    line = json.dumps({"t": time.time(), "service": service, "command": command}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, line.encode("utf-8", "surrogateescape"))
    finally:
        os.close(fd)


def _warn_once(warnings: list[str], text: str) -> None:
    warnings.append(text)
    print(f"vphone: {text}", file=sys.stderr, flush=True)


class SetupError(Exception):
    """What the phone was asked for cannot be given here (its zram, cores or flash): it does not start."""


def setup(spec: PhoneSpec, layout: Layout, warnings: list[str]) -> tuple[MemoryCgroup | None, int | None,
                                                                          zram.Zram | None, pacedfs.Flash | None]:
    """The memory cgroup (with the phone's cpuset group), its zram device, the phone's mount
    namespace (a file descriptor of it) and its paced flash (pacedfs.py, with --storage-mbps), each
    None where unavailable (said once on stderr).
    What the phone asked for explicitly (zram, cores, a read rate) raises SetupError instead."""
    cgroup = None
    reclaim_left(layout.internal)
    if not spec.isolated:
        if spec.zram_bytes or spec.cpus or spec.storage_mbps or spec.data_quota_bytes:
            raise SetupError("zram, --cpus, --storage-mbps and --data-quota need isolation (cgroups)")
        _warn_once(warnings, "isolation off: no memory cgroup (an RSS watchdog SIGKILLs above "
                             f"{spec.ram_bytes} bytes), no mount namespace (commands run as this user and "
                             f"see the host's filesystem; the phone's /data/local/tmp is {layout.data_tmp}) and "
                             "no network namespace (they reach the host's loopback)")
        return None, None, None, None
    if not may_lower_oom_score_adj():
        _warn_once(warnings, "this host's root lacks CAP_SYS_RESOURCE, so no process here may lower its "
                             "oom_score_adj below 0: the shell's commands keep 0, not adbd's -950 "
                             "(docs/virtual-phones.md)")
    z = None
    if spec.zram_bytes:
        try:
            z = zram.Zram.create(spec.zram_bytes, spec.zram_algorithm, layout.root)
        except zram.ZramUnavailable as e:
            raise SetupError(f"--zram {spec.zram_bytes}: {e}") from None
        zram.record(layout.internal, z)
    try:
        cgroup = MemoryCgroup.create(spec.name, layout.root, spec.ram_bytes, spec.zram_bytes if z else 0,
                                     spec.swappiness)
    except CgroupUnavailable as e:
        if z is not None or spec.cpus or spec.storage_mbps or spec.data_quota_bytes:
            _remove_zram(layout, z)
            raise SetupError(f"{e}: a phone's zram, cores, flash or /data quota need its cgroups") from None
        _warn_once(warnings, f"{e}; falling back to an RSS watchdog that SIGKILLs above "
                             f"{spec.ram_bytes} bytes (still logged as lmkd kills)")
    own_cpus: list[int] = []            # the cores the phone has to itself (--cpus), if any
    if cgroup is not None:
        leaf = leaf_name(spec.name, layout.root)
        try:
            cpus = cpuinfo.host_cpus()
            if spec.cpus:
                cpus = own_cpus = cpuinfo.allocate(spec.cpus, leaf)
                cgroup.add_extra(cpuinfo.make_cpuset(leaf, cpus))
            cpuinfo.write(layout.root, cpus)
        except (cpuinfo.ResourceUnavailable, OSError) as e:
            cgroup.remove()
            _remove_zram(layout, z)
            raise SetupError(str(e)) from None
    if spec.data_quota_bytes and cgroup is not None:
        # after the cgroup, whose creation killed what a crashed daemon of this phone left (the
        # holders of its old mount), and before the phone's `/` is built on what this mounts
        try:
            dataquota.mount(layout.root, layout.internal, spec.data_quota_bytes, logbuf.LOGD_DIR, "sdcard")
        except dataquota.QuotaUnavailable as e:
            _remove_all(layout, cgroup, z)
            raise SetupError(f"--data-quota {spec.data_quota_bytes}: {e}") from None
        prepare(spec, layout.root)      # the phone's /data skeleton, now on its own file system
    ns_fd = None
    try:
        ns_fd, missing = namespace.enter(layout.root, layout.staging, namespace.HostPaths.for_engines())
        if missing:
            _warn_once(warnings, "not overlaid (missing on this host): " + ", ".join(missing))
    except (namespace.NamespaceUnavailable, OSError) as e:
        if spec.storage_mbps:
            _remove_all(layout, cgroup, z)
            raise SetupError(f"--storage-mbps needs the phone's mount namespace ({e})") from None
        _warn_once(warnings, f"mount namespace unavailable ({e}); commands run as this user, see the host's "
                             f"filesystem and the phone's /data/local/tmp is {layout.data_tmp}")
    flash = None
    if spec.storage_mbps and ns_fd is not None:
        try:
            flash = pacedfs.Flash.start(layout.root / "data", ns_fd, spec.storage_mbps, layout.internal,
                                        cpus=own_cpus)
        except pacedfs.FlashUnavailable as e:
            _remove_all(layout, cgroup, z)
            raise SetupError(f"--storage-mbps {spec.storage_mbps}: {e}") from None
    return cgroup, ns_fd, z, flash


def _remove_all(layout: Layout, cgroup: MemoryCgroup | None, z: zram.Zram | None) -> None:
    if cgroup is not None:
        cgroup.remove()
    _remove_zram(layout, z)


def _remove_zram(layout: Layout, z: zram.Zram | None) -> None:
    if z is not None:
        z.remove()
        zram.record(layout.internal, None)


def charge_zram(spec: PhoneSpec, cgroup: MemoryCgroup) -> Ballast:
    """What the phone's zram holds lives in its RAM (compressed pages, as on a phone): a ballast in
    its cgroup holds as much (zram_charge.py); the limit grows by the ballast's own pages only, so
    the phone keeps the RAM it was given. Called single-threaded (it forks)."""
    ballast = Ballast.start([str(p) for p in cgroup.procs_files()], lambda: cgroup.mem_stat().usage_bytes)
    cgroup.set_limit(spec.ram_bytes + ballast.own_bytes, spec.zram_bytes, spec.swappiness)
    log.info("zram's use charged by ballast %d (its own pages: %d bytes)", ballast.pid, ballast.own_bytes)
    return ballast


def network(spec: PhoneSpec, warnings: list[str]) -> int | None:
    """The phone's own network namespace (a file descriptor of it), so its processes reach no host
    port; None where unavailable (said once on stderr) or isolation is off (said with that)."""
    if not spec.isolated:
        return None
    try:
        return namespace.new_network()
    except (namespace.NamespaceUnavailable, OSError) as e:
        _warn_once(warnings, f"network namespace unavailable ({e}); the phone's processes share the host's "
                             "network and reach its loopback (its adb server, the other phones)")
        return None


APP_UID_BLOCK = 500          # a phone's app uids: FIRST_APP_UID + its block's offset and up
APP_UID_BLOCKS = 19          # 10100 + 18 * 500 + INSTALLED's stays under LAST_APPLICATION_UID (19999)


def claim_app_uids(warnings: list[str]) -> tuple[int, socket.socket | None]:
    """A block of app uids of this phone's own, none another phone running on this host has (as
    two phones' app uids are their own), held by an abstract unix socket named after the block
    for the daemon's life: the kernel drops the name with the daemon, whatever ends it, and leaves
    nothing on the host. Returns (the block's offset, the socket); offset 0 and a warning when
    every block is taken."""
    for k in range(APP_UID_BLOCKS):
        holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            holder.bind(f"\0bmoe-vphone-app-uids-{k}")
        except OSError:
            holder.close()
            continue
        return k * APP_UID_BLOCK, holder
    _warn_once(warnings, f"{APP_UID_BLOCKS} phones are up on this host: this one shares the first's app uids")
    return 0, None


EXECUTOR_THREADS = 4


def started_executor(threads: int) -> concurrent.futures.ThreadPoolExecutor:
    """A thread pool whose `threads` threads are all running now (a pool starts its threads one
    submit at a time, and after the phone's pid namespace this thread may start none)."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="vphone")
    gate = threading.Barrier(threads + 1)
    for _ in range(threads):
        pool.submit(gate.wait)
    gate.wait()
    return pool


def pid_namespace(ns_fd: int | None, warnings: list[str]) -> tuple[int, int] | None:
    """The phone's own pid namespace (namespace.new_pid_namespace): (its init's host pid, the pipe
    that keeps it alive); None without the phone's mount namespace, or where unavailable (said)."""
    if ns_fd is None:
        return None
    try:
        return namespace.new_pid_namespace(ns_fd)
    except (namespace.NamespaceUnavailable, OSError) as e:
        _warn_once(warnings, f"pid namespace unavailable ({e}); the phone's processes see the host's")
        return None


async def serve(spec: PhoneSpec, layout: Layout, cgroup: MemoryCgroup | None, ns_fd: int | None,
                port: int, warnings: list[str], net_fd: int | None = None, z: zram.Zram | None = None,
                ballast: Ballast | None = None, pid_ns: tuple[int, int] | None = None,
                executor: concurrent.futures.ThreadPoolExecutor | None = None, uid_offset: int = 0) -> None:
    if executor is not None:
        syncsvc.EXECUTOR = executor
    if pid_ns is not None:
        # this thread forks into the phone's pid namespace, where the kernel lets it start no
        # thread (CLONE_THREAD across pid namespaces): children are waited for by pidfd, not by
        # asyncio's default watcher's thread per child
        watcher = asyncio.PidfdChildWatcher()
        watcher.attach_loop(asyncio.get_running_loop())
        with warnings_module.catch_warnings():
            warnings_module.simplefilter("ignore", DeprecationWarning)
            asyncio.set_child_watcher(watcher)
    phone = VirtualPhone(spec, layout, cgroup, ns_fd, zram=z, ballast=ballast)
    phone.net_namespace_fd = net_fd
    banner = Banner(product_name=spec.device, model=spec.model, device=spec.device)
    daemon = Daemon(banner, make_router(phone), port=port)
    actual_port = await daemon.start()
    # Android 14 lmkd's own policy where the kernel's OOM killer can be its backstop (a cgroup)
    policy = Policy(LmkProps.from_json(spec.lmk), watermarks(spec.ram_bytes // 1024)) if cgroup is not None else None
    lmkd = Lmkd(layout.root, spec.android, spec.ram_bytes, phone.pids,
                cgroup.oom_kills if cgroup is not None else None, phone.meminfo,
                memcg_leaf=cgroup.path.name if cgroup is not None else "", policy=policy,
                vmstat=getattr(phone, "vmstat", None),
                headroom_bytes=(lambda: cgroup.limit_bytes() - cgroup.mem_stat().usage_bytes) if cgroup else None)
    # the phone's ActivityManager: the --apps, the apps `am` starts, each registered with lmkd (am.py)
    lmkd.watch_control(asyncio.get_running_loop())
    activity = ActivityManager(layout.root, parse_apps(spec.apps), [str(p) for p in cgroup.procs_files()] if cgroup
                               else [], ns_fd, net_fd, uid_offset)
    await activity.start()
    logbuf.append(layout.root, "main", "vphone", f"{spec.model} ({spec.soc}, Android {spec.android}) up, "
                  f"RAM {spec.ram_bytes} bytes, adbd on 127.0.0.1:{actual_port}")
    logbuf.append(layout.root, "system", "ActivityManager", "System now ready")
    state = {"name": spec.name, "pid": os.getpid(), "port": actual_port, "serial": f"127.0.0.1:{actual_port}",
             "started_at": time.time(), "namespace": ns_fd is not None,
             # the phone's mount namespace as /proc/PID/ns/mnt names it: how the host tells its processes
             "mount_namespace": os.readlink(f"/proc/self/fd/{ns_fd}") if ns_fd is not None else None,
             "net_namespace": os.readlink(f"/proc/self/fd/{net_fd}") if net_fd is not None else None,
             # the phone's pid namespace, and its init's host pid
             "pid_namespace": os.readlink(f"/proc/{pid_ns[0]}/ns/pid") if pid_ns is not None else None,
             "init_pid": pid_ns[0] if pid_ns is not None else None,
             # its own app uids: FIRST_APP_UID + this and up (claim_app_uids)
             "app_uid_offset": uid_offset,
             "warnings": warnings,
             "cgroup": None if cgroup is None else {"version": cgroup.version, "path": str(cgroup.path),
                                                    "cpu_path": str(cgroup.cpu_path) if cgroup.cpu_path else None,
                                                    "extra": [str(p) for p in cgroup.extra]},
             "zram": None if z is None else {"device": z.dev, "bytes": spec.zram_bytes,
                                             "algorithm": spec.zram_algorithm, "swappiness": spec.swappiness},
             "cpus": cpuinfo.parse_list((layout.root / cpuinfo.ONLINE_PATH).read_text())
             if (layout.root / cpuinfo.ONLINE_PATH).exists() else None,
             "storage_mbps": spec.storage_mbps or None}
    atomic_write(layout.state_file, json.dumps(state, indent=2, allow_nan=False) + "\n")

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)

    async def every(period_s, fn) -> None:
        while True:
            try:
                fn()
            except Exception:  # housekeeping must never stop the phone
                log.exception("%s failed", getattr(fn, "__name__", fn))
            await asyncio.sleep(period_s() if callable(period_s) else period_s)

    def fast() -> None:
        if ballast is not None:
            ballast.hold(phone.zram_used_bytes())
        lmkd.poll()
        phone.refresh_meminfo()  # 10 Hz: a reader sees its own allocations within 0.1 s

    # lmkd's own pace (10 ms while swap is low or after a kill, else 100 ms); meminfo with it
    tasks = [asyncio.create_task(every(lambda: lmkd.poll_interval_s, fast)),
             asyncio.create_task(every(TICK_S, phone.tick))]
    # and woken by the phone's own reclaim, as a phone's lmkd by its PSI triggers: at most once per
    # PSI_POLL_PERIOD_SHORT_MS (the cgroup's vmpressure stands in for per-phone PSI, which v1 lacks)
    pressure_fd = cgroup.pressure_events() if cgroup is not None and policy is not None else None
    woken = [0.0]

    def on_pressure() -> None:
        assert pressure_fd is not None
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(pressure_fd)
        now = time.monotonic()
        if now - woken[0] >= POLL_SHORT_S:
            woken[0] = now
            try:
                fast()
            except Exception:
                log.exception("lmkd woken by pressure failed")
    if pressure_fd is not None:
        loop.add_reader(pressure_fd, on_pressure)
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        for t in tasks:
            t.cancel()
        if pressure_fd is not None:
            loop.remove_reader(pressure_fd)
            os.close(pressure_fd)
        await daemon.close()
        if cgroup is None:      # what the shells left running (with a cgroup, its removal kills it)
            shellsvc.kill_sessions()
        await activity.stop()
        lmkd.close()
        if ballast is not None:
            ballast.stop()
        if cgroup is not None:
            cgroup.remove()
        _remove_zram(layout, z)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="devices.virtual.run")
    p.add_argument("--root", required=True, help="the phone's folder (holds .vphone/spec.json)")
    p.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any free port)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # the manager asks a daemon that has not written its state in time where it is (manager.py
    # _wait_for_state): every thread's Python stack, to the log
    faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True)
    log.info("daemon %d starting", os.getpid())
    root = Path(args.root).resolve()
    spec = PhoneSpec.from_json(json.loads(Path(root, ".vphone/spec.json").read_text()))
    try:
        layout = prepare(spec, root)
    except UserlandMissing as e:
        print(f"vphone: {e}", file=sys.stderr)
        return 1
    warnings: list[str] = []
    log.info("setting up its cgroups, zram, namespaces and flash")
    try:
        cgroup, ns_fd, z, flash = setup(spec, layout, warnings)
    except SetupError as e:
        print(f"vphone: {e}", file=sys.stderr)
        return 1
    try:
        ballast = None
        if z is not None and cgroup is not None:
            try:
                ballast = charge_zram(spec, cgroup)
            except OSError as e:
                print(f"vphone: --zram: its use cannot be charged to the RAM: {e}", file=sys.stderr)
                cgroup.remove()
                _remove_zram(layout, z)
                return 1
        net_fd = network(spec, warnings)
        uid_offset, uid_claim = claim_app_uids(warnings)
        install_tools(layout, ns_fd is not None)
        install_getconf(layout, spec.page_size_bytes, ns_fd is not None)
        # the sync service's threads (syncsvc.EXECUTOR), started while this thread may still start them
        executor = started_executor(EXECUTOR_THREADS)
        pid_ns = pid_namespace(ns_fd, warnings)      # last: every fork from here on is the phone's
        log.info("set up; starting its services")
        try:
            asyncio.run(serve(spec, layout, cgroup, ns_fd, args.port, warnings, net_fd, z, ballast, pid_ns,
                              executor, uid_offset))
        except OSError as e:
            print(f"vphone: {e}", file=sys.stderr)
            if ballast is not None:
                ballast.stop()
            if cgroup is not None:
                cgroup.remove()
            _remove_zram(layout, z)
            return 1
        finally:
            executor.shutdown(wait=False)
            if uid_claim is not None:
                uid_claim.close()
            if pid_ns is not None:
                os.close(pid_ns[1])         # init ends, and every process of the phone with it
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid_ns[0], 0)
    finally:
        if flash is not None:
            flash.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
