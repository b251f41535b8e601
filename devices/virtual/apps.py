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

The adj is ProcessList.java's for the state (devices/android.py). It is written by the daemon (root)
before the app drops to its uid, and again by the phone's lmkd when ActivityManager (am.py, which
starts every app process: these, the installed packages `am start` opens, and `am run-as-app`'s
host) registers it (LMK_PROCPRIO): only a registered process is lmkd's candidate. The apps are
stopped with the phone; after a crash they are in its cgroup, which the next `up` empties.

`am run-as-app` runs a command as an app: the app's process is HOST below, started like the apps
(the phone's cgroup, namespaces, the app's uid and adj, named by its package), which forks the
command as its child, in its process group, on the caller's stdin, stdout and stderr, and exits
with the command's status (128 + N for a signal, as a shell reports it).
"""

from __future__ import annotations

import asyncio
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


# The app hosting a command: fork it (in the caller's folder when the app may enter it, with the
# default SIGPIPE Python's start took away), wait, exit with its status.
_HOST = (
    "import os,signal,sys\n"
    "cwd,argv=sys.argv[1],sys.argv[2:]\n"
    "pid=os.fork()\n"
    "if pid==0:\n"
    "    signal.signal(signal.SIGPIPE,signal.SIG_DFL)\n"
    "    try: os.chdir(cwd)\n"
    "    except OSError: pass\n"
    "    try: os.execvp(argv[0],argv)\n"
    "    except OSError as e:\n"
    "        os.write(2,('run-as-app: %s: %s\\n'%(argv[0],e.strerror)).encode());os._exit(127)\n"
    "while True:\n"
    "    try: st=os.waitpid(pid,0)[1];break\n"
    "    except InterruptedError: pass\n"
    "sys.exit(128+os.WTERMSIG(st) if os.WIFSIGNALED(st) else os.WEXITSTATUS(st))\n"
)


async def spawn(app: App, procs_files: list[str], ns_fd: int | None,
                net_fd: int | None = None) -> asyncio.subprocess.Process:
    """Start `app` in the phone (it then fills its memory: `ready` waits for that)."""
    return await asyncio.create_subprocess_exec(
        app.name, "-I", "-S", "-c", _APP, str(app.size_bytes), "1" if app.compressible else "0",
        "1" if app.active else "0", executable=sys.executable, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=_setup(app.uid, app.oom_score_adj, procs_files, ns_fd, net_fd))


async def ready(proc: asyncio.subprocess.Process) -> bool:
    """Wait until a spawned app holds its memory; False if it died first (the phone was too small
    for it, which the phone's lmkd or kernel logs)."""
    assert proc.stdout is not None
    return (await proc.stdout.readline()).strip() == b"ready"   # it says nothing more


async def spawn_host(package: str, uid: int, oom_score_adj: int, cwd: str, argv: list[str], env: dict[str, str],
                     stdio: tuple[int, int, int], procs_files: list[str], ns_fd: int | None,
                     net_fd: int | None = None) -> asyncio.subprocess.Process:
    """Start the app `package` hosting `argv` (HOST above) on the caller's stdio."""
    return await asyncio.create_subprocess_exec(
        package, "-I", "-S", "-c", _HOST, cwd, *argv, executable=sys.executable, env=env,
        stdin=stdio[0], stdout=stdio[1], stderr=stdio[2], start_new_session=True,
        preexec_fn=_setup(uid, oom_score_adj, procs_files, ns_fd, net_fd))


def _setup(uid: int, oom_score_adj: int, procs_files: list[str], ns_fd: int | None, net_fd: int | None):
    from devices.virtual import namespace
    from devices.virtual.phone import join_cgroup

    def setup() -> None:
        try:
            join_cgroup(procs_files)
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(oom_score_adj))
            if net_fd is not None:
                namespace.setns(net_fd, namespace.CLONE_NEWNET)
            if ns_fd is not None:
                namespace.setns(ns_fd)
                os.chdir("/")
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
        except BaseException as e:
            os.write(2, f"vphone app: {e}\n".encode())
            os._exit(125)
    return setup
