"""Other open apps on a virtual phone: processes that hold memory at Android's oom_score_adj.

`virtual up --apps cached:300MiB,perceptible:200MiB` starts one process per item, inside the
phone (its memory cgroup and mount namespace) as an app uid (10100, 10101, ...: FIRST_APPLICATION_UID
10000 + n, `u0_aN`), named like a package (`com.bmoe.app.cached1`, what lmkd's line shows). Each
fills its own anonymous memory with random bytes, which zram cannot compress (`:compressible`:
pages of one third random bytes and two thirds zeros, which lz4 stores in about a third, the ratio
assumed for app memory: an lz4 zram device's mm_stat orig_data_size / mem_used_total, 2.9:1
measured), then marks it cold (MADV_COLD: what the kernel's LRU would have made of memory an app
has not touched for a while, the first pages reclaim takes) and sleeps. `:active` is an app in
use instead (a foreground app the user is in): it is not marked cold and reads a few % of its pages
every 100 ms in turn (ACTIVE_PERCENT, ACTIVE_PERIOD_S), so its memory stays on the active LRU and
what reclaim swaps out of it faults back in, and reclaim looks for cold pages elsewhere (the
engine's cache entries not hit lately, the mapped model's file pages).

The adj is ProcessList.java's for the state (devices/android.py). It is written by the daemon (root) before the app drops to its uid, as Android's system_server has lmkd
write it. The apps are stopped with the phone; after a crash they are in its cgroup, which the next
`up` empties.
"""

from __future__ import annotations

import os
import subprocess
import sys

from devices.android import ACTIVE_PERCENT, ACTIVE_PERIOD_S, App

# The app: fill SIZE bytes, say so on stdout, then sleep until killed.
_APP = (
    "import mmap,os,sys,time\n"
    "n=int(sys.argv[1]);step=1<<20\n"
    "buf=mmap.mmap(-1,n,flags=mmap.MAP_PRIVATE|mmap.MAP_ANONYMOUS)\n"
    "pat=b''.join(os.urandom(1365)+bytes(2731) for _ in range(step//4096))\n"
    "for i in range(0,n,step):\n"
    "    buf[i:i+step]=(pat if sys.argv[2]=='1' else os.urandom(step))[:n-i]\n"
    "if sys.argv[3]=='1':\n"
    "    print('ready',flush=True);pages=n//4096;per=max(1,pages*ACTIVE_PERCENT//100);p=0\n"
    "    while True:\n"
    "        for _ in range(per): buf[p*4096];p=(p+1)%pages\n"
    "        time.sleep(ACTIVE_PERIOD_S)\n"
    "buf.madvise(20)\n"   # MADV_COLD (Linux 5.4; the mmap module may not name it)
    "print('ready',flush=True)\n"
    "while True: time.sleep(3600)\n"
).replace("ACTIVE_PERCENT", str(ACTIVE_PERCENT)).replace("ACTIVE_PERIOD_S", str(ACTIVE_PERIOD_S))


def start(apps: list[App], procs_files: list[str], ns_fd: int | None) -> list[subprocess.Popen]:
    """Start each app in the phone (cgroup, namespace, its uid, its adj) and wait until it holds
    its memory (or died: the phone was too small for it, which the caller's lmkd logs)."""
    started = []
    for app in apps:
        started.append(subprocess.Popen([app.name, "-I", "-S", "-c", _APP, str(app.size_bytes),
                                         "1" if app.compressible else "0", "1" if app.active else "0"],
                                        executable=sys.executable, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        preexec_fn=_setup(app, procs_files, ns_fd), start_new_session=True))
    for proc in started:
        assert proc.stdout is not None
        proc.stdout.readline()   # "ready", or EOF if it was killed
        proc.stdout.close()
    return started


def _setup(app: App, procs_files: list[str], ns_fd: int | None):
    from devices.virtual import namespace
    from devices.virtual.phone import join_cgroup

    def setup() -> None:
        try:
            join_cgroup(procs_files)
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(app.oom_score_adj))
            if ns_fd is not None:
                namespace.setns(ns_fd)
                os.chdir("/")
                os.setgroups([])
                os.setresgid(app.uid, app.uid, app.uid)
                os.setresuid(app.uid, app.uid, app.uid)
        except BaseException as e:
            os.write(2, f"vphone app: {e}\n".encode())
            os._exit(125)
    return setup


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
