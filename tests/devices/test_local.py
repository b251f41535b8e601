"""devices.local: this host as a Device, with real processes, real samples and real OOM kills."""

from __future__ import annotations

import os
import sys
import time
import uuid

import psutil
import pytest

from devices.base import Device, pressure_metrics
from devices.local import LocalDevice

ALLOC_AND_HOLD = ("import time; b = bytearray({mib} << 20); b[::4096] = b'x' * len(b[::4096]); "
                  "print('held', flush=True); time.sleep({hold_s})")


def test_satisfies_the_device_protocol():
    assert isinstance(LocalDevice(), Device)


def test_identity_and_state_are_the_hosts():
    dev = LocalDevice()
    ident = dev.identity()
    assert ident.serial == "local" and ident.backend == "local"
    assert ident.ram_total_kb == psutil.virtual_memory().total // 1024
    st = dev.state()
    assert 0 < st.mem_available_kb <= ident.ram_total_kb
    assert st.mem_free_kb is not None and st.taken_at_s == pytest.approx(time.time(), abs=5)


def test_run_returns_the_real_exit_status_and_separate_streams():
    chunks = []
    out = LocalDevice().run([sys.executable, "-c", "import sys; print('to out'); print('to err', file=sys.stderr); "
                             "sys.exit(3)"], on_stdout=chunks.append)
    assert out.exit_status == 3 and not out.timed_out
    assert out.stdout == b"to out\n" and out.stderr == b"to err\n"
    assert b"".join(chunks) == b"to out\n"


def test_timeout_kills_the_process_group():
    out = LocalDevice().run(["sh", "-c", "sleep 30 & sleep 30"], timeout_s=0.5)
    assert out.timed_out and out.exit_status == 137 and out.wall_s < 10


def test_pressure_is_sampled_while_the_process_lives():
    dev = LocalDevice()
    before = dev.state()
    out = dev.run([sys.executable, "-c", ALLOC_AND_HOLD.format(mib=200, hold_s=1.5)], sample_period_s=0.25)
    after = dev.state()
    assert out.exit_status == 0 and len(out.samples) >= 3
    metrics = pressure_metrics(before, out.samples, after)
    assert metrics["peak_rss_kb"] > 200 * 1024
    assert metrics["mem_avail_floor_kb"] <= metrics["mem_avail_before_kb"]
    assert set(metrics) >= {"peak_rss_kb", "mem_avail_before_kb", "mem_avail_floor_kb", "mem_avail_after_kb"}


def test_push_skips_identical_files(tmp_path):
    dev = LocalDevice()
    src, dst = tmp_path / "model.gguf", tmp_path / "staged" / "model.gguf"
    src.write_bytes(os.urandom(1 << 20))
    assert dev.push(str(src), str(dst)) is True
    assert dst.read_bytes() == src.read_bytes()
    assert dev.push(str(src), str(dst)) is False
    src.write_bytes(os.urandom(1 << 20))
    assert dev.push(str(src), str(dst)) is True and dst.read_bytes() == src.read_bytes()


def _memory_cgroup_v1() -> str:
    root = "/sys/fs/cgroup/memory"
    assert os.path.isdir(root), "this suite runs as root with a writable memory cgroup"
    path = os.path.join(root, f"bmoe-test-{uuid.uuid4().hex[:8]}")
    os.mkdir(path)
    return path


@pytest.mark.root("makes a memory cgroup")
def test_kernel_oom_kill_in_a_memory_cgroup_is_found_in_the_kernel_log():
    cg = _memory_cgroup_v1()
    try:
        with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as fh:
            fh.write(str(64 << 20))
        dev = LocalDevice()
        since = time.time()
        script = ALLOC_AND_HOLD.format(mib=256, hold_s=5)
        out = dev.run(["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$0" -c "$1"', sys.executable, script])
        assert out.exit_status == 137 and b"held" not in out.stdout
        events = [e for e in dev.lmk_events(since) if e.pid == out.pid]
        assert events and events[0].source == "kernel-oom"
        assert events[0].reason == "memory cgroup out of memory" and events[0].rss_kb > 32 * 1024
    finally:
        os.rmdir(cg)
