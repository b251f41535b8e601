"""This host as a Device: psutil, /proc, /sys/class/thermal, and the kernel's log for OOM kills."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import mmap
import os
import platform
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import psutil

from devices import reclaim
from devices.base import (
    CpuFreqPolicy,
    DeviceError,
    DeviceIdentity,
    DeviceState,
    OutputFn,
    PressureSample,
    RunOutcome,
    StdinFeeder,
    parse_status_kb,
)
from devices.lmk import LmkEvent, parse_line
from engine.fsutil import fleet_home, replacing
from engine.units import MIB, ascii_int

LOCAL_SERIAL = "local"


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def _read_int(path: str) -> int | None:
    text = _read(path)
    try:
        return ascii_int(text) if text is not None else None
    except ValueError:
        return None


def thermal_zones_mc(root: str = "/sys/class/thermal") -> dict[str, int]:
    """Zone type -> milli-°C; a second zone of the same type gets a `#n` suffix."""
    out: dict[str, int] = {}
    for zone in sorted(glob.glob(os.path.join(root, "thermal_zone*"))):
        kind, temp = _read(os.path.join(zone, "type")), _read_int(os.path.join(zone, "temp"))
        if kind is None or temp is None:
            continue
        key, n = kind, 1
        while key in out:
            n += 1
            key = f"{kind}#{n}"
        out[key] = temp
    return out


def cpufreq_policies(root: str = "/sys/devices/system/cpu/cpufreq") -> tuple[CpuFreqPolicy, ...]:
    return tuple(
        CpuFreqPolicy(os.path.basename(p), _read_int(os.path.join(p, "scaling_max_freq")),
                      _read_int(os.path.join(p, "cpuinfo_max_freq")))
        for p in sorted(glob.glob(os.path.join(root, "policy*")))
    )


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(4 * MIB):
            h.update(chunk)
    return h.hexdigest()


def _cpu_model() -> str:
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if line.lower().startswith(("model name", "hardware", "cpu model")):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


class _Sampler(threading.Thread):
    """~1 Hz pressure samples of one process until it exits."""

    def __init__(self, pid: int, period_s: float, state_fn: Callable[[], DeviceState]):
        super().__init__(daemon=True)
        self.pid, self.period_s, self.state_fn = pid, period_s, state_fn
        self.started = time.monotonic()
        self.samples: list[PressureSample] = []
        self.stop = threading.Event()

    def sample_once(self) -> None:
        status = _read(f"/proc/{self.pid}/status")
        if status is None:
            return
        kb = parse_status_kb(status)
        st = self.state_fn()
        self.samples.append(PressureSample(time.monotonic() - self.started, st.mem_available_kb,
                                           kb.get("VmHWM"), kb.get("VmRSS"), st.cpu_temp_mc,
                                           reclaim=reclaim.read_local(self.pid)))

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample_once()
            self.stop.wait(self.period_s)


def _pump(stream, sink: list[bytes], callback: OutputFn | None, feeder: StdinFeeder | None = None) -> None:
    for chunk in iter(lambda: stream.read1(65536), b""):
        sink.append(chunk)
        if callback:
            callback(chunk)
        if feeder is not None:
            feeder.on_stdout(chunk)


def _stdin_of(proc: subprocess.Popen) -> tuple[Callable[[bytes], None], Callable[[], None]]:
    """A feeder's write and close on a child's stdin pipe: a child that has exited (a broken
    pipe) is not an error here; run() reports how it ended."""
    lock = threading.Lock()

    def write(data: bytes) -> None:
        with lock:
            if proc.stdin is not None and not proc.stdin.closed:
                try:
                    proc.stdin.write(data)
                    proc.stdin.flush()
                except (BrokenPipeError, ValueError):
                    pass

    def close() -> None:
        with lock:
            if proc.stdin is not None and not proc.stdin.closed:
                with contextlib.suppress(BrokenPipeError):
                    proc.stdin.close()

    return write, close


class LocalDevice:
    """This host. Runs commands as child processes; models are used where they are."""

    serial = LOCAL_SERIAL

    def __init__(self, work_dir: str | None = None):
        self._work_dir = work_dir or str(fleet_home() / "local")

    def identity(self) -> DeviceIdentity:
        vm, swap = psutil.virtual_memory(), psutil.swap_memory()
        model = _read("/sys/devices/virtual/dmi/id/product_name") or platform.node()
        vendor = _read("/sys/devices/virtual/dmi/id/sys_vendor") or "unknown"
        return DeviceIdentity(serial=self.serial, backend="local", model=model, manufacturer=vendor,
                              soc=_cpu_model(), abi=platform.machine(), android_release="", sdk=None,
                              ram_total_kb=vm.total // 1024, swap_total_kb=swap.total // 1024,
                              kernel=platform.release(), host_abi=platform.machine(),
                              page_size_bytes=mmap.PAGESIZE)

    def state(self) -> DeviceState:
        vm, swap = psutil.virtual_memory(), psutil.swap_memory()
        return DeviceState(taken_at_s=time.time(), mem_available_kb=vm.available // 1024,
                           mem_free_kb=vm.free // 1024, swap_free_kb=swap.free // 1024,
                           thermal_mc=thermal_zones_mc(), cpufreq=cpufreq_policies(),
                           vmstat=reclaim.vmstat_counters(_read("/proc/vmstat") or ""))

    def work_dir(self) -> str:
        return self._work_dir

    def push(self, local_path: str, remote_path: str, progress: Callable[[int, int], None] | None = None) -> bool:
        """Copy unless the destination already holds the same bytes (size, then sha256)."""
        if os.path.abspath(local_path) == os.path.abspath(remote_path):
            return False
        if not os.path.isfile(local_path):
            raise DeviceError(f"push: {local_path}: no such file")
        if (os.path.isfile(remote_path) and os.path.getsize(remote_path) == os.path.getsize(local_path)
                and file_sha256(remote_path) == file_sha256(local_path)):
            return False
        os.makedirs(os.path.dirname(remote_path) or ".", exist_ok=True)
        total = os.path.getsize(local_path)
        done = 0
        with open(local_path, "rb") as src, replacing(remote_path, tmp=remote_path + ".partial") as dst:
            while chunk := src.read(8 * MIB):
                dst.write(chunk)
                done += len(chunk)
                if progress:
                    progress(done, total)
            dst.flush()                          # every byte down before the times are copied
            shutil.copystat(local_path, dst.name)
        return True

    def pull(self, remote_path: str, local_path: str) -> None:
        if not os.path.isfile(remote_path):
            raise DeviceError(f"pull: {remote_path}: no such file")
        if os.path.abspath(remote_path) != os.path.abspath(local_path):
            shutil.copyfile(remote_path, local_path)

    def file_size(self, remote_path: str) -> int | None:
        return os.path.getsize(remote_path) if os.path.isfile(remote_path) else None

    def read_range(self, remote_path: str, offset: int, nbytes: int) -> bytes:
        try:
            with open(remote_path, "rb") as fh:
                fh.seek(offset)
                return fh.read(nbytes)
        except OSError as e:
            raise DeviceError(f"cannot read {remote_path}: {e.strerror}") from None

    def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None, timeout_s: float | None = None,
            cwd: str | None = None, on_stdout: OutputFn | None = None, on_stderr: OutputFn | None = None,
            sample_period_s: float = 1.0, feeder: StdinFeeder | None = None) -> RunOutcome:
        started_at = time.time()
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(list(argv), env=dict(env) if env is not None else None, cwd=cwd,
                                    stdin=subprocess.PIPE if feeder is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as e:
            raise DeviceError(f"cannot start {argv[0]}: {e.strerror}") from None
        sampler = _Sampler(proc.pid, sample_period_s, self.state)
        sampler.start()
        stdin = _stdin_of(proc) if feeder is not None else None
        if feeder is not None and stdin is not None:
            feeder.attach(*stdin, sampler.started)
        out: list[bytes] = []
        err: list[bytes] = []
        pumps = [threading.Thread(target=_pump, args=(proc.stdout, out, on_stdout, feeder), daemon=True),
                 threading.Thread(target=_pump, args=(proc.stderr, err, on_stderr), daemon=True)]
        for p in pumps:
            p.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            if feeder is not None and stdin is not None:
                feeder.finish()
                stdin[1]()
            sampler.stop.set()
            sampler.join()
            for p in pumps:
                p.join()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:          # both are pipes (Popen above)
                    stream.close()
        rc = proc.returncode
        # A shell reports death by signal N as 128+N; so do adb's shell protocol and our reports.
        status = 128 - rc if rc < 0 else rc
        return RunOutcome(tuple(argv), status, proc.pid, timed_out, time.monotonic() - t0, b"".join(out),
                          b"".join(err), tuple(sampler.samples), started_at)

    def lmk_events(self, since_s: float) -> list[LmkEvent]:
        """Kernel kill lines (OOM killer, old lowmemorykiller) logged since `since_s` (epoch)."""
        events = []
        boot_s = psutil.boot_time()
        try:
            fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return []
        try:
            while True:
                try:
                    record = os.read(fd, 8192).decode("utf-8", "replace")
                except BlockingIOError:
                    break
                except OSError:  # EPIPE: a record was overwritten while reading; keep going
                    continue
                head, _, message = record.partition(";")
                parts = head.split(",")
                if len(parts) < 3:
                    continue
                at_s = boot_s + int(parts[2]) / 1e6
                if at_s + 1.0 < since_s:
                    continue
                event = parse_line(message.splitlines()[0] if message else "")
                if event is not None:
                    events.append(event)
        finally:
            os.close(fd)
        return events

    def stop_strays(self, names: Sequence[str]) -> int:
        killed = 0
        me = os.getpid()
        for p in psutil.process_iter(["name", "pid"]):
            if p.info["pid"] != me and p.info["name"] in names:
                try:
                    p.kill()
                    killed += 1
                except psutil.Error:
                    pass
        return killed
