"""The virtual lmkd with Android 14's policy, on real processes: it kills the highest oom_score_adj
of what was registered with it (LMK_PROCPRIO on its socket), never an unregistered process, itself
with lmkd's low-swap reason; a kill it did not make (the kernel's OOM killer, the backstop)
is the kernel's line in the kernel buffer, not an lmkd line; and classify tells the two apart.

The phone's meminfo is given as recorded values (a phone whose zram is nearly full): the numbers
lmkd reads, not a stand-in for the processes or the kills, which are real."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import time
from pathlib import Path

from devices import lmk
from devices.base import RunOutcome
from devices.lmkd_policy import LmkProps, Policy, watermarks
from devices.virtual import logbuf
from devices.virtual.cgroup import MemStat
from devices.virtual.lmkd import Lmkd
from devices.virtual.lmkd_registry import CONTROL_SOCKET, connect_seqpacket, procprio_packet
from devices.virtual.meminfo import MemInfo, compute
from harness.run.classify import classify
from store import outcomes

RAM = 512 << 20


@dataclasses.dataclass(frozen=True)
class Recorded(MemInfo):
    """meminfo of a 512 MiB phone with 128 MiB of zram, SwapFree as given."""
    swap_total: int = 131072
    swap_free: int = 131072

    @property
    def fields(self) -> dict[str, int]:
        return {**super().fields, "SwapTotal": self.swap_total, "SwapFree": self.swap_free}


def recorded(free_kb: int, swap_free_kb: int) -> Recorded:
    base = compute(RAM, MemStat(usage_bytes=RAM - free_kb * 1024))
    return Recorded(**dataclasses.asdict(base), swap_free=swap_free_kb)


def holder(adj: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", f"open('/proc/self/oom_score_adj','w').write('{adj}'); "
                          "b = bytearray(8 << 20); b[::4096] = b'x' * 2048; print(1, flush=True); "
                          "import time; time.sleep(60)"], stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"1\n"
    p.stdout.close()
    return p


def phone_root(tmp_path: Path) -> Path:
    for b in logbuf.BUFFERS:
        logbuf.buffer_path(tmp_path, b).parent.mkdir(parents=True, exist_ok=True)
        logbuf.buffer_path(tmp_path, b).touch()
    return tmp_path


def lines(root: Path, buffer: str) -> list[str]:
    return [e.message for e in logbuf.read(root, [buffer])]


def test_lmkd_kills_the_highest_adj_on_low_swap_and_stays_silent_while_swap_is_free(tmp_path):
    root = phone_root(tmp_path)
    procs = [holder(0), holder(900), holder(200), holder(1000)]
    mi = {"now": recorded(free_kb=1000, swap_free_kb=60000)}     # swapping, 46 % of zram free
    lmkd = Lmkd(root, 14, RAM, lambda: [p.pid for p in procs], lambda: 0, lambda: mi["now"],
                policy=Policy(LmkProps(), watermarks(RAM // 1024)))
    # ActivityManager registers the first three as apps (uids 10100+) over lmkd's socket; the
    # fourth raised its own adj to 1000 and registered nothing: no candidate, highest adj or not
    am = connect_seqpacket(root / CONTROL_SOCKET)
    try:
        for n, p in enumerate(procs[:3]):
            am.send(procprio_packet(p.pid, 10100 + n, [0, 900, 200][n]))
        for _ in range(5):
            lmkd.poll()
        assert sorted(lmkd.registry.records) == sorted(p.pid for p in procs[:3])
        assert all(p.poll() is None for p in procs) and not lmkd.kills       # silent
        mi["now"] = recorded(free_kb=1000, swap_free_kb=4000)                 # zram nearly full
        lmkd.poll()
        assert procs[1].wait(timeout=5) == -signal.SIGKILL
        assert procs[0].poll() is None and procs[2].poll() is None and procs[3].poll() is None
        (kill,) = [ln for ln in lines(root, "main") if ln.startswith("Kill ")]
        assert f"({procs[1].pid}), uid 10101, oom_score_adj 900 to free " in kill
        assert kill.endswith("; reason: min watermark is breached and swap is low (4000kB < 13107kB)")
        (info,) = [ln for ln in lines(root, "events") if ln.startswith("[")]
        assert info.strip("[]").split(",")[5] == "3"                          # LOW_MEM_AND_SWAP
    finally:
        am.close()
        for p in procs:
            p.kill()
            p.wait()
        lmkd.close()


def test_a_kernel_oom_kill_on_a_phone_with_swap_is_a_kernel_line_and_classified_killed(tmp_path):
    root = phone_root(tmp_path)
    victim = holder(0)
    count = {"n": 0}
    lmkd = Lmkd(root, 14, RAM, lambda: [victim.pid] if victim.poll() is None else [], lambda: count["n"],
                lambda: recorded(free_kb=1000, swap_free_kb=60000), policy=Policy(LmkProps(), watermarks(RAM // 1024)))
    try:
        lmkd.poll()
        victim.send_signal(signal.SIGKILL)      # what the memcg OOM killer does, counted in oom_kill
        victim.wait()
        count["n"] = 1
        deadline = time.monotonic() + 3
        while not lmkd.kills and time.monotonic() < deadline:
            lmkd.poll()
            time.sleep(0.1)
        assert not [ln for ln in lines(root, "main") if ln.startswith("Kill ")]   # no lmkd line
        (kernel,) = [ln for ln in lines(root, "kernel") if f"Killed process {victim.pid} " in ln]
        event = lmk.parse_line(kernel)
        assert event is not None and event.source == "kernel-oom" and event.pid == victim.pid
    finally:
        lmkd.close()
    outcome = RunOutcome(("engine",), 137, victim.pid, False, 1.0, b"", b"", (), 0.0)
    c = classify(outcome, [event], None, False, False)
    assert c.outcome == outcomes.KILLED and "kernel OOM killer" in c.evidence[0] and kernel in c.evidence
    lmkd_event = lmk.parse_line(f"Kill 'engine' ({victim.pid}), uid 2000, oom_score_adj 0 to free 1kB rss, 0kB swap; "
                                "reason: min watermark is breached and swap is low (1kB < 2kB)")
    assert lmkd_event is not None
    assert classify(outcome, [lmkd_event, event], None, False, False).outcome == outcomes.LMK_KILLED
