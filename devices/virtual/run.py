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
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

from engine.fsutil import atomic_write

from . import apps, logbuf, namespace, shellsvc, syncsvc
from .adbd import Banner, Connection, Daemon, Service, Stream
from .cgroup import CgroupUnavailable, MemoryCgroup
from .lmkd import Lmkd
from .lmkd_policy import LmkProps, Policy, watermarks
from .phone import SHELL_GID, SHELL_UID, Layout, PhoneSpec, UserlandMissing, VirtualPhone, install_tools, prepare

log = logging.getLogger("bmoe.vphone")
TICK_S = 1.0


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


def setup(spec: PhoneSpec, layout: Layout, warnings: list[str]) -> tuple[MemoryCgroup | None, int | None]:
    """The memory cgroup and the phone's mount namespace (a file descriptor of it), each None
    where unavailable (said once on stderr)."""
    cgroup = None
    if not spec.isolated:
        _warn_once(warnings, "isolation off: no memory cgroup (an RSS watchdog SIGKILLs above "
                             f"{spec.ram_bytes} bytes) and no mount namespace (commands run as this user and "
                             f"see the host's filesystem; the phone's /data/local/tmp is {layout.data_tmp})")
        return None, None
    try:
        cgroup = MemoryCgroup.create(spec.name, layout.root, spec.ram_bytes)
    except CgroupUnavailable as e:
        _warn_once(warnings, f"{e}; falling back to an RSS watchdog that SIGKILLs above "
                             f"{spec.ram_bytes} bytes (still logged as lmkd kills)")
    ns_fd = None
    try:
        ns_fd, missing = namespace.enter(layout.root, layout.staging, namespace.HostPaths.for_engines())
        if missing:
            _warn_once(warnings, "not overlaid (missing on this host): " + ", ".join(missing))
    except (namespace.NamespaceUnavailable, OSError) as e:
        _warn_once(warnings, f"mount namespace unavailable ({e}); commands run as this user, see the host's "
                             f"filesystem and the phone's /data/local/tmp is {layout.data_tmp}")
    return cgroup, ns_fd


async def serve(spec: PhoneSpec, layout: Layout, cgroup: MemoryCgroup | None, ns_fd: int | None,
                port: int, warnings: list[str]) -> None:
    phone = VirtualPhone(spec, layout, cgroup, ns_fd)
    banner = Banner(product_name=spec.device, model=spec.model, device=spec.device)
    daemon = Daemon(banner, make_router(phone), port=port)
    actual_port = await daemon.start()
    # Android 14 lmkd's own policy where the kernel's OOM killer can be its backstop (a cgroup)
    policy = Policy(LmkProps.from_json(spec.lmk), watermarks(spec.ram_bytes // 1024)) if cgroup is not None else None
    lmkd = Lmkd(layout.root, spec.android, spec.ram_bytes, phone.pids,
                cgroup.oom_kills if cgroup is not None else None, phone.meminfo,
                memcg_leaf=cgroup.path.name if cgroup is not None else "", policy=policy,
                vmstat=getattr(phone, "vmstat", None))
    running_apps = apps.start(apps.parse(spec.apps), [str(p) for p in cgroup.procs_files()] if cgroup else [],
                              ns_fd) if spec.apps else []
    logbuf.append(layout.root, "main", "vphone", f"{spec.model} ({spec.soc}, Android {spec.android}) up, "
                  f"RAM {spec.ram_bytes} bytes, adbd on 127.0.0.1:{actual_port}")
    logbuf.append(layout.root, "system", "ActivityManager", "System now ready")
    state = {"name": spec.name, "pid": os.getpid(), "port": actual_port, "serial": f"127.0.0.1:{actual_port}",
             "started_at": time.time(), "namespace": ns_fd is not None,
             # the phone's mount namespace as /proc/PID/ns/mnt names it: how the host tells its processes
             "mount_namespace": os.readlink(f"/proc/self/fd/{ns_fd}") if ns_fd is not None else None,
             "warnings": warnings,
             "cgroup": None if cgroup is None else {"version": cgroup.version, "path": str(cgroup.path),
                                                    "cpu_path": str(cgroup.cpu_path) if cgroup.cpu_path else None}}
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
        lmkd.poll()
        phone.refresh_meminfo()  # 10 Hz: a reader sees its own allocations within 0.1 s

    # lmkd's own pace (10 ms while swap is low or after a kill, else 100 ms); meminfo with it
    tasks = [asyncio.create_task(every(lambda: lmkd.poll_interval_s, fast)),
             asyncio.create_task(every(TICK_S, phone.tick))]
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        for t in tasks:
            t.cancel()
        await daemon.close()
        apps.stop(running_apps)
        lmkd.close()
        if cgroup is not None:
            cgroup.remove()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="devices.virtual.run")
    p.add_argument("--root", required=True, help="the phone's folder (holds .vphone/spec.json)")
    p.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any free port)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    root = Path(args.root).resolve()
    spec = PhoneSpec.from_json(json.loads(Path(root, ".vphone/spec.json").read_text()))
    try:
        layout = prepare(spec, root)
    except UserlandMissing as e:
        print(f"vphone: {e}", file=sys.stderr)
        return 1
    warnings: list[str] = []
    cgroup, ns_fd = setup(spec, layout, warnings)
    install_tools(layout, ns_fd is not None)
    try:
        asyncio.run(serve(spec, layout, cgroup, ns_fd, args.port, warnings))
    except OSError as e:
        print(f"vphone: {e}", file=sys.stderr)
        if cgroup is not None:
            cgroup.remove()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
