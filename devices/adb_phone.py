"""One Android phone behind one adb server (adbutils): shell, files, runs, evidence — virtual phones included.

Everything sent to `adb shell` is quoted with shlex.quote. Commands run under a small
device-side wrapper that reports the engine's pid and exit status on stderr, so the status is
known even where adb relays none (no shell_v2); with shell_v2 the protocol's exit packet is used
and the wrapper's line is the cross-check. The server side (its address, adb's environment
variables, starting one) is devices.adb.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from devices import reclaim, sections
from devices.adb import TRANSPORT_ERRORS, AdbServer, default_server
from devices.adbutils_import import AdbDevice, AdbError, AdbTimeout
from devices.base import (
    RANGE_ALIGN,
    CpuFreqPolicy,
    DeviceError,
    DeviceIdentity,
    DeviceLost,
    DeviceState,
    OutputFn,
    PressureSample,
    RunInterrupted,
    RunOutcome,
    StdinFeeder,
    parse_battery_temp_dc,
    parse_getprop,
    parse_meminfo_kb,
    parse_thermal_status,
)
from devices.lmk import LmkEvent, parse_log
from devices.local import file_sha256
from engine.fsutil import replacing
from engine.safetext import one_line

WORK_DIR = "/data/local/tmp/bmoe"
_MARK = "@@BMOE"
# shell v2 packet ids (adb's shell_protocol.h): stdin, stdout, stderr, exit, close-stdin
_SHELL_STDIN, _SHELL_STDOUT, _SHELL_STDERR, _SHELL_EXIT, _SHELL_CLOSE_STDIN = 0, 1, 2, 3, 4
SYNC_DATA_MAX = 64 * 1024
DEVICE_TIMEOUT_S = 30.0     # run.device_timeout_s's default: a phone silent this long is lost
STAMP_DIR = "/data/local/tmp/.bmoe-sha256"     # AdbPhone.stamped_sha256: what each pushed file hashed to
SHA256_SILENCE_S = 600.0    # remote_sha256's bound: a whole model read at ~10 MiB/s or better
_READ_TICK_S = 0.5          # run() wakes this often to check the watch and the stop event


def read_range_command(remote_path: str, offset: int, nbytes: int) -> str:
    """One shell line printing `nbytes` of a file from `offset` (a multiple of RANGE_ALIGN): `dd`
    where the phone has it (toolbox or toybox: every Android release), else toybox `xxd`, which
    seeks to the offset, with `xxd -r` turning its hex back into bytes (a toybox built without dd,
    as Debian's is on a virtual phone). pipefail keeps the first xxd's failure (a missing file)."""
    q = shlex.quote(remote_path)
    return (f"if command -v dd >/dev/null; then dd if={q} bs={RANGE_ALIGN} skip={offset // RANGE_ALIGN} "
            f"count={nbytes // RANGE_ALIGN} 2>/dev/null; "
            f"else set -o pipefail; xxd -s {offset} -l {nbytes} -p {q} | xxd -r -p; fi")


def _q(args: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)



@dataclass(frozen=True)
class PhoneReads:
    """What AdbPhone.reads() read in its one shell call."""

    before: str                                # the output of its `before` commands
    state: DeviceState
    lmk_events: list[LmkEvent] | None          # None: not asked for


class _ChunkedReader:
    """A file whose read() ignores adbutils' 4 KiB request and returns up to 64 KiB (sync's
    maximum DATA size): an order of magnitude fewer round trips, and a progress hook."""

    def __init__(self, path: str, progress: Callable[[int, int], None] | None):
        self.fh = open(path, "rb")  # noqa: SIM115 - held across read() calls, closed by close()
        self.total = os.path.getsize(path)
        self.done = 0
        self.progress = progress

    def read(self, _n: int = -1) -> bytes:
        try:
            chunk = self.fh.read(SYNC_DATA_MAX)
        except OSError as e:    # this host's file, not the phone: not a lost device
            raise DeviceError(f"push: cannot read {self.fh.name}: {e.strerror or e}") from None
        self.done += len(chunk)
        if self.progress and chunk:
            self.progress(self.done, self.total)
        return chunk

    def close(self) -> None:
        self.fh.close()


def _lost_or_error(device: AdbDevice, server: AdbServer, what: str, e: BaseException) -> DeviceError:
    """A FAIL answer from a phone the server still lists is that phone refusing one request
    (DeviceError: a missing file to pull …). Anything else — the stream cut, a reset, a timeout, a
    garbled reply, the server gone, or a phone no longer listed — is DeviceLost, which the runner
    retries and records as `device_lost`: the link failed, not the phone's answer."""
    serial = device.serial
    reason = one_line(str(e) or type(e).__name__, 200)
    if isinstance(e, AdbError) and not isinstance(e, AdbTimeout):
        try:
            present = any(d.serial == serial and d.state == "device" for d in server.client().list())
        except TRANSPORT_ERRORS:
            present = False
        if present:
            return DeviceError(f"{serial}: {what} failed: {reason}")
    return DeviceLost(f"{serial}: device lost during {what} ({reason})")


class AdbPhone:
    """One phone behind one adb server."""

    def __init__(self, serial: str, server: AdbServer | None = None, work_dir: str = WORK_DIR):
        self.serial = serial
        self.server = server if server is not None else default_server()
        self._work_dir = work_dir
        self._device = self.server.client().device(serial)
        self._clock_offset_s: float | None = None
        self._hash_cache: dict[tuple[str, int, int], str] = {}
        # the transport watch of run(): seconds without an answer before the phone is lost, and
        # an event that ends a run at once (the campaign's Ctrl-C); set by watch()
        self.device_timeout_s = DEVICE_TIMEOUT_S
        self.stop_event: threading.Event | None = None

    def watch(self, device_timeout_s: float, stop: threading.Event | None = None) -> None:
        """How run() watches the transport: `device_timeout_s` without an answer (no output, no
        sample, no ping) is DeviceLost; `stop` set ends the run within a second (RunInterrupted)."""
        self.device_timeout_s = device_timeout_s
        self.stop_event = stop
        # every call outside run() is bounded by the same silence: shell() by default, the sync
        # service's stat/push/pull through the client's socket timeout
        self._device = self.server.client(device_timeout_s).device(self.serial)

    # ---- plumbing -------------------------------------------------------------------------------
    def shell(self, command: str, timeout_s: float | None = None) -> tuple[int, bytes, bytes]:
        """Run one shell command line (already quoted by the caller) and return (status, out, err).
        The phone may stay silent `timeout_s` (default: the watch's device_timeout_s) before it is
        lost; a command that is silent for longer by nature (a checksum of a model) says so."""
        try:
            r = self._device.shell2(command, timeout=timeout_s or self.device_timeout_s, encoding=None, v2=True)
        except TRANSPORT_ERRORS as e:
            raise _lost_or_error(self._device, self.server, f"shell {command[:60]!r}", e) from None
        return r.returncode, r.stdout if r.stdout is not None else r.output, r.stderr or b""

    def open_shell(self, command: str):
        """A shell command line (already quoted) left running: its adbutils connection, to read
        from and to close. Closing it hangs up the command (adbd kills its process group)."""
        try:
            return self._device.shell(command, stream=True)
        except TRANSPORT_ERRORS as e:
            raise _lost_or_error(self._device, self.server, f"shell {command[:60]!r}", e) from None

    def _text(self, command: str, timeout_s: float | None = None) -> str:
        return self.shell(command, timeout_s)[1].decode("utf-8", "replace")

    def work_dir(self) -> str:
        """Where engine, models and outputs are staged on the phone."""
        return self._work_dir

    # ---- identity and state ---------------------------------------------------------------------
    def identity(self) -> DeviceIdentity:
        """Who the phone is (getprop, meminfo, uname, in one shell call); a virtual phone also says
        its host ABI."""
        sections = _sections(self._text(f"getprop; echo {_MARK}MEMINFO; cat /proc/meminfo; echo {_MARK}UNAME; "
                                        "uname -r"))
        props = parse_getprop(sections.get("", ""))
        mem = parse_meminfo_kb(sections.get("MEMINFO", ""))
        soc = props.get("ro.soc.model") or props.get("ro.board.platform") or props.get("ro.hardware") or "unknown"
        sdk = props.get("ro.build.version.sdk", "")
        return DeviceIdentity(
            serial=self.serial, backend="adb", model=props.get("ro.product.model", "unknown"),
            manufacturer=props.get("ro.product.manufacturer", "unknown"), soc=soc,
            abi=props.get("ro.product.cpu.abi", "unknown"),
            android_release=props.get("ro.build.version.release", ""), sdk=_int_or_none(sdk),
            ram_total_kb=mem.get("MemTotal", 0), swap_total_kb=mem.get("SwapTotal", 0),
            kernel=sections.get("UNAME", "").strip(),
            # a virtual phone (devices/virtual/phone.py) runs this host's binaries
            host_abi=props.get("ro.bmoe.host_abi", "") if props.get("ro.bmoe.virtual") == "1" else "",
        )

    def state(self) -> DeviceState:
        """One snapshot: memory, thermal zones, cpufreq caps, battery and thermal status (one shell call)."""
        return self.reads().state

    def reads(self, before: str = "", lmk_since_s: float | None = None, timeout_s: float | None = None,
              services: bool = True) -> PhoneReads:
        """One shell call for what a cell reads around its run: `before` first (a command line
        whose output is kept: the gate's stray stop and sync, clearing old outputs), then the
        state, and the low-memory killer's lines since `lmk_since_s` when given (lmk_events). The
        slow reads (dumpsys battery and thermalservice, logcat: a binder call or a log dump each)
        run at once (_at_once), so the call costs about the slowest of them, not their sum.
        `services=False` skips the two dumpsys (the state's battery_temp_dc and thermal_status are
        then None: the caller has them from a read moments ago)."""
        since_phone = None if lmk_since_s is None else lmk_since_s + self.clock_offset_s() - 2.0
        slow = [("BATTERY", "dumpsys battery"), ("THERMALSERVICE", "dumpsys thermalservice 2>/dev/null | head -n 20")]
        slow = slow if services else []
        if since_phone is not None:
            slow.append(("LMK", _LMK_LOGCAT))
        script = (f"{before}\necho {_READS}STATE; {_STATE_FAST}; "
                  + _at_once(slow, fast=_LMK_FAST if since_phone is not None else ""))
        text = self.shell(script, timeout_s)[1].decode("utf-8", "replace")
        before_text, _, rest = text.partition(f"{_READS}STATE\n")
        state = self._parse_state(rest)
        events = None
        if since_phone is not None:
            sections = _sections(rest)
            events = self._parse_lmk(sections.get("LMKCLOCK", "") + "\n" + sections.get("LMK", ""),
                                     sections.get("DMESG", ""), since_phone)
        return PhoneReads(before_text, state, events)

    def _parse_state(self, text: str) -> DeviceState:
        sections = _sections(text)
        mem = parse_meminfo_kb(sections.get("", ""))
        thermal: dict[str, int] = {}
        for line in sections.get("THERMAL", "").splitlines():
            kind, _, temp = line.partition("=")
            if re.fullmatch(r"-?[0-9]{1,12}", temp.strip()):
                key, n = kind, 1
                while key in thermal:
                    n += 1
                    key = f"{kind}#{n}"
                thermal[key] = int(temp)
        policies = []
        for line in sections.get("CPUFREQ", "").splitlines():
            name, _, freqs = line.partition("=")
            scaling, _, cpuinfo = freqs.partition(",")
            policies.append(CpuFreqPolicy(name, _int_or_none(scaling), _int_or_none(cpuinfo)))
        return DeviceState(taken_at_s=time.time(), mem_available_kb=mem.get("MemAvailable"),
                           mem_free_kb=mem.get("MemFree"), swap_free_kb=mem.get("SwapFree"), thermal_mc=thermal,
                           battery_temp_dc=parse_battery_temp_dc(sections.get("BATTERY", "")),
                           thermal_status=parse_thermal_status(sections.get("THERMALSERVICE", "")),
                           cpufreq=tuple(policies), vmstat=reclaim.vmstat_counters(sections.get("VMSTAT", "")))

    # ---- files ----------------------------------------------------------------------------------
    def _local_sha(self, path: str) -> str:
        st = os.stat(path)
        key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
        if key not in self._hash_cache:
            self._hash_cache[key] = file_sha256(path)
        return self._hash_cache[key]

    def remote_sha256(self, remote_path: str) -> str | None:
        """The sha256 of a file on the phone (None when it has none or no sha256sum)."""
        # silent while it reads the whole file: a GiB model on a slow phone's flash takes minutes
        status, out, _ = self.shell(f"sha256sum {shlex.quote(remote_path)} 2>/dev/null", timeout_s=SHA256_SILENCE_S)
        token = out.split()[0].decode() if status == 0 and out.split() else ""
        return token if re.fullmatch(r"[0-9a-f]{64}", token) else None

    def push(self, local_path: str, remote_path: str, progress: Callable[[int, int], None] | None = None) -> bool:
        """Push unless the phone already has a file of the same size and sha256; atomic on the phone."""
        if not os.path.isfile(local_path):
            raise DeviceError(f"push: {local_path}: no such file")
        size = os.path.getsize(local_path)
        try:
            remote = self._device.sync.stat(remote_path)
        except TRANSPORT_ERRORS as e:
            raise _lost_or_error(self._device, self.server, "stat", e) from None
        if remote.size == size and remote.mode:
            local = self._local_sha(local_path)
            stamped = self.stamped_sha256(remote_path)
            if stamped == local:
                return False
            if stamped is None and self.remote_sha256(remote_path) == local:
                self._stamp(remote_path, local)
                return False
        folder = remote_path.rsplit("/", 1)[0] or "/"
        self.shell(f"mkdir -p {shlex.quote(folder)}")
        partial = remote_path + ".partial"
        reader = _ChunkedReader(local_path, progress)
        try:
            self._device.sync.push(reader, partial, mode=0o644)
        except TRANSPORT_ERRORS as e:
            raise _lost_or_error(self._device, self.server, f"push of {local_path}", e) from None
        finally:
            reader.close()
        status, _, err = self.shell(f"mv -f {shlex.quote(partial)} {shlex.quote(remote_path)}")
        if status != 0:
            raise DeviceError(f"{self.serial}: push could not place {remote_path}: {err.decode(errors='replace')}")
        self._stamp(remote_path, self._local_sha(local_path))
        return True

    # A file's sha256 is kept on the phone (STAMP_DIR, one file per path: "size|mtime|inode sha256"),
    # so the next campaign's check of a model it already holds is one stat, not a whole read (a 60 GB
    # model's sha256sum takes a minute or more; a 1 GiB one on a 300 MiB/s virtual flash, 25 s). A
    # stamp counts only while the file's size, mtime (ns) and inode are the ones it recorded: a push
    # (a new inode) or any write (a new mtime) makes it stale and the file is hashed again. The
    # stamps live in a folder of their own, so no folder the user or the engine reads gains a file.
    @staticmethod
    def _stamp_path(remote_path: str) -> str:
        return f"{STAMP_DIR}/{hashlib.sha256(remote_path.encode()).hexdigest()[:32]}"

    @staticmethod
    def _file_key(remote_path: str) -> str:
        return f"stat -c '%s|%y|%i' -- {shlex.quote(remote_path)}"

    def stamped_sha256(self, remote_path: str) -> str | None:
        """The sha256 the file's stamp records while the stamp is the file's own (None otherwise)."""
        status, out, _ = self.shell(f"{self._file_key(remote_path)} 2>/dev/null && "
                                    f"cat -- {shlex.quote(self._stamp_path(remote_path))} 2>/dev/null")
        lines = out.decode(errors="replace").splitlines()
        if status != 0 or len(lines) != 2:
            return None
        key, _, sha = lines[1].rpartition(" ")
        return sha if key == lines[0] and key.count("|") == 2 and re.fullmatch(r"[0-9a-f]{64}", sha) else None

    def _stamp(self, remote_path: str, sha: str) -> None:
        """Record the file's sha256 in STAMP_DIR (atomically; a phone that refuses is only slower next time)."""
        stamp = self._stamp_path(remote_path)
        tmp = shlex.quote(stamp + ".partial")
        self.shell(f"mkdir -p {STAMP_DIR} && k=$({self._file_key(remote_path)}) && "
                   f"printf '%s %s\\n' \"$k\" {shlex.quote(sha)} > {tmp} && "
                   f"mv -f {tmp} {shlex.quote(stamp)}")

    def pull(self, remote_path: str, local_path: str) -> None:
        """Stream a phone's file into local_path (whole or not at all). The phone's errors and this
        host's are told apart: a write that fails here (a full disk) raises OSError as it is."""
        tmp = local_path + ".partial"
        chunks = self._device.sync.iter_content(remote_path)
        try:
            with replacing(local_path, tmp=tmp) as fh:
                while True:
                    try:
                        chunk = next(chunks, None)
                    except TRANSPORT_ERRORS as e:
                        raise _lost_or_error(self._device, self.server, f"pull of {remote_path}", e) from None
                    if chunk is None:
                        break
                    try:
                        fh.write(chunk)
                    except OSError as e:     # this host's disk (full?): said as such, naming the file
                        raise OSError(e.errno, e.strerror, tmp) from None
        except BaseException:
            chunks.close()
            raise

    def file_size(self, remote_path: str) -> int | None:
        """A file's size on the phone in bytes (None when it is not there)."""
        # stat, not sync's STAT: that reply's size field is 32 bits, and models pass 4 GiB
        status, out, _ = self.shell(f"stat -L -c %s {shlex.quote(remote_path)} 2>/dev/null")
        size = _int_or_none(out.decode("ascii", "replace").strip())
        return size if status == 0 else None

    def read_range(self, remote_path: str, offset: int, nbytes: int) -> bytes:
        """`nbytes` of a phone's file from `offset` (a multiple of RANGE_ALIGN), in one round trip."""
        if offset % RANGE_ALIGN or offset < 0 or nbytes < 0:
            raise DeviceError(f"read_range: offset {offset} is not a multiple of {RANGE_ALIGN}")
        if nbytes == 0:
            return b""
        blocks = -(-nbytes // RANGE_ALIGN)
        # the shell protocol keeps stdout binary-clean (no pty, no CRLF)
        status, out, err = self.shell(read_range_command(remote_path, offset, blocks * RANGE_ALIGN), timeout_s=300)
        if status != 0:
            raise DeviceError(f"{self.serial}: cannot read {remote_path} (exit status {status}): "
                              f"{err.decode('utf-8', 'replace').strip()[:200]}")
        return out[:nbytes]

    # ---- running --------------------------------------------------------------------------------
    def wrapper_command(self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None,
                        scrub_prefix: str | None, stdin: bool = False) -> str:
        """The device-side wrapper: scrub, cd, start in the background, report pid and status.
        The engine's stdin is /dev/null, or with `stdin` the shell's own (adb's stdin packets): a
        background command of a shell without job control gets /dev/null unless redirected, so
        the shell's stdin is kept on fd 3 first and given back to it from there."""
        parts = ["exec 3<&0"] if stdin else []
        if scrub_prefix:
            parts.append(f"for v in $(env | sed -n 's/^\\({re.escape(scrub_prefix)}[A-Za-z0-9_]*\\)=.*/\\1/p'); "
                         "do unset \"$v\"; done")
        if cwd:
            parts.append(f"cd {shlex.quote(cwd)} || exit 126")
        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
        redirect = "<&3 3<&-" if stdin else "</dev/null"
        parts.append(f"{assigns + ' ' if assigns else ''}{_q(argv)} {redirect} & p=$!")
        parts.append(f"echo {_MARK}PID $p >&2")
        parts.append(f"wait $p; s=$?; echo {_MARK}EXIT $s >&2; exit $s")
        return "; ".join(parts)

    def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None, timeout_s: float | None = None,
            cwd: str | None = None, on_stdout: OutputFn | None = None, on_stderr: OutputFn | None = None,
            sample_period_s: float = 1.0, feeder: StdinFeeder | None = None,
            scrub_prefix: str | None = "BMOE_") -> RunOutcome:
        """Run argv on the phone under the wrapper: output streamed, pressure sampled, killed at the
        timeout; `feeder` writes its stdin through the shell protocol's stdin packets."""
        command = self.wrapper_command(argv, env, cwd, scrub_prefix, stdin=feeder is not None)
        started_at, t0 = time.time(), time.monotonic()
        conn = None
        try:
            conn = self._device.open_transport(timeout=min(30.0, self.device_timeout_s))
            conn.send_command(f"shell,v2,raw:{command}")
            conn.check_okay()
        except TRANSPORT_ERRORS as e:
            if conn is not None:
                conn.close()
            raise _lost_or_error(self._device, self.server, "run", e) from None
        out, err = bytearray(), bytearray()
        pid_box: dict[str, int] = {}
        err_tail = bytearray()
        stop = threading.Event()
        samples: list[PressureSample] = []
        timed_out = False
        heard = [time.monotonic()]      # the latest answer of any kind from the phone (the watch)
        watch_s = self.device_timeout_s
        beat_s = max(0.2, min(sample_period_s, watch_s / 3))

        def on_err(chunk: bytes) -> None:
            nonlocal err_tail
            err_tail += chunk
            while b"\n" in err_tail:
                line, _, rest = bytes(err_tail).partition(b"\n")
                err_tail = bytearray(rest)
                text = line.decode("utf-8", "replace")
                mark = re.fullmatch(_MARK + r"(PID|EXIT) ([0-9]{1,10})", text.strip())
                if mark:
                    pid_box["pid" if mark[1] == "PID" else "exit"] = int(mark[2])
                else:
                    err.extend(line + b"\n")
                    if on_stderr:
                        on_stderr(line + b"\n")

        def sampler() -> None:
            # a pressure sample every sample_period_s; between samples (and before the engine's pid
            # is known) a ping, so the watch hears from the phone at least every beat_s
            last_sample = time.monotonic()
            while not stop.wait(beat_s):
                pid = pid_box.get("pid")
                try:
                    if pid is not None and time.monotonic() - last_sample >= sample_period_s - 1e-3:
                        last_sample = time.monotonic()
                        s = self._sample(pid, last_sample - t0, timeout_s=watch_s)
                        if s is not None:
                            samples.append(s)
                    else:
                        self.shell("echo", timeout_s=watch_s)
                except DeviceLost:
                    continue                    # no answer: the watch in the reading loop decides
                except DeviceError:
                    return
                heard[0] = max(heard[0], time.monotonic())

        def killer() -> None:
            nonlocal timed_out
            if timeout_s is not None and not stop.wait(timeout_s):
                timed_out = True
                pid = pid_box.get("pid")
                if pid is not None:
                    with contextlib.suppress(DeviceError):
                        self.shell(f"kill -9 {pid}", timeout_s=watch_s)

        threads = [threading.Thread(target=sampler, daemon=True), threading.Thread(target=killer, daemon=True)]
        for t in threads:
            t.start()
        if feeder is not None:
            feeder.attach(*_stdin_packets(conn), t0)
        exit_status: int | None = None
        ended = False                   # the stream ended as it should (its exit packet)
        try:
            exit_status = self._read_shell(conn, out, on_stdout, on_err, heard, watch_s, argv[0], feeder)
            ended = True
        finally:
            stop.set()
            if feeder is not None:
                feeder.finish()
            conn.close()
            for t in threads:           # a thread stuck on a silent phone is a daemon: not waited for
                t.join(timeout=5 if ended else 0.1)
        if err_tail:
            err.extend(err_tail)
        # The wrapper's own report wins: it is the engine's status, not the shell's.
        status = pid_box.get("exit", exit_status)
        return RunOutcome(tuple(argv), status, pid_box.get("pid"), timed_out, time.monotonic() - t0, bytes(out),
                          bytes(err), tuple(samples), started_at)

    def _read_shell(self, conn, out: bytearray, on_stdout: OutputFn | None, on_err: Callable[[bytes], None],
                    heard: list[float], watch_s: float, what: str, feeder: StdinFeeder | None = None) -> int | None:
        """The shell protocol's packets until its exit packet (returns its status). The socket is
        read in ticks of _READ_TICK_S, never blocking longer: between reads the watch (no answer for
        watch_s, heard[0] being the latest) and the stop event are checked."""
        sock = conn.conn
        sock.settimeout(_READ_TICK_S)
        buf = bytearray()
        while True:
            while len(buf) >= 5:
                kind, length = buf[0], int.from_bytes(buf[1:5], "little")
                if len(buf) < 5 + length:
                    break
                data = bytes(buf[5:5 + length])
                del buf[:5 + length]
                if kind == _SHELL_STDOUT:
                    out.extend(data)
                    if on_stdout:
                        on_stdout(data)
                    if feeder is not None:
                        feeder.on_stdout(data)
                elif kind == _SHELL_STDERR:
                    on_err(data)
                elif kind == _SHELL_EXIT:
                    return data[0] if data else None
            if self.stop_event is not None and self.stop_event.is_set():
                raise RunInterrupted(f"{self.serial}: run of {what} interrupted")
            silent = time.monotonic() - heard[0]
            if silent > watch_s:
                raise DeviceLost(f"{self.serial}: device lost during run of {what} (no answer from the adb "
                                 f"transport for {silent:.0f} s; run.device_timeout_s is {watch_s:g})")
            try:
                chunk = sock.recv(1 << 16)
            except TimeoutError:
                continue
            except TRANSPORT_ERRORS as e:
                # the shell stream died before its exit packet: whatever the server lists, the run's
                # status is unknown and the link failed (adbd killed, USB pulled, server gone)
                raise DeviceLost(f"{self.serial}: device lost during run of {what} "
                                 f"({one_line(str(e) or type(e).__name__, 200)})") from None
            if not chunk:
                raise DeviceLost(f"{self.serial}: device lost during run of {what} (the shell stream ended "
                                 "before its exit status)")
            heard[0] = time.monotonic()
            buf += chunk

    def _sample(self, pid: int, t_s: float, timeout_s: float | None = None) -> PressureSample | None:
        text = self._text(
            f"grep -E '^(VmHWM|VmRSS):' /proc/{pid}/status 2>/dev/null; grep '^MemAvailable:' /proc/meminfo; "
            "for z in /sys/class/thermal/thermal_zone*; do t=; { IFS= read -r t <\"$z/type\"; } 2>/dev/null; "
            "case \"$t\" in cpu*) v=; IFS= read -r v <\"$z/temp\"; echo \"CPU=$v\";; esac; done; "
            + reclaim.command(pid), timeout_s
        )
        parts = reclaim.split(text)
        head = parts.get("", "")
        kb = parse_meminfo_kb(head)
        cpu = [int(m[1]) for m in re.finditer(r"^CPU=(-?\d+)", head, re.MULTILINE)]
        if "VmRSS" not in kb:
            return None
        return PressureSample(t_s, kb.get("MemAvailable"), kb.get("VmHWM"), kb.get("VmRSS"), max(cpu) if cpu else None,
                              reclaim=reclaim.parse(parts))

    # ---- evidence -------------------------------------------------------------------------------
    def clock_offset_s(self) -> float:
        """Phone clock minus host clock (seconds), measured once."""
        if self._clock_offset_s is None:
            before = time.time()
            text = self._text("date +%s").strip()
            phone = float(text) if re.fullmatch(r"[0-9]{1,12}", text) else before  # no clock said: none
            self._clock_offset_s = phone - (before + time.time()) / 2
        return self._clock_offset_s

    def lmk_events(self, since_s: float) -> list[LmkEvent]:
        """lmkd lines and killinfo events (logcat main+events), the kernel's OOM kills (logcat's
        kernel buffer, and dmesg where readable), since
        `since_s` (host epoch seconds; the phone's clock offset and boot time are accounted for)."""
        since_phone = since_s + self.clock_offset_s() - 2.0
        text = self._text(f"{_LMK_FAST}; echo {_MARK}LMK; {_LMK_LOGCAT}")
        sections = _sections(text)
        return self._parse_lmk(sections.get("LMKCLOCK", "") + "\n" + sections.get("LMK", ""),
                               sections.get("DMESG", ""), since_phone)

    def _parse_lmk(self, head: str, dmesg: str, since_phone: float) -> list[LmkEvent]:
        """lmk_events' parse: `head` is the phone's epoch seconds and uptime, then logcat's lines."""
        lines = head.strip("\n").splitlines()
        try:
            boot_s = float(lines[0]) - float(lines[1])
        except (IndexError, ValueError):
            boot_s = None
        events = []
        for e in parse_log(lines[2:]):
            at = _at(e.timestamp, 0.0)
            if at is None or at >= since_phone:     # a line without an epoch stamp is kept
                events.append(e)
        if boot_s is not None:  # dmesg stamps are seconds since boot
            events += [e for e in parse_log(dmesg) if (_at(e.timestamp, boot_s) or 0.0) >= since_phone]
        return events

    def stop_strays(self, names: Sequence[str]) -> int:
        """Kill leftover engine processes (by process name) that share this shell's mount
        namespace: on a phone every process adb started, on a virtual phone only its own (virtual
        phones share this host's /proc and all run as the shell user, so `pidof NAME` would name
        the engine another phone is measuring). Returns how many were killed."""
        status, out, _ = self.shell(self.strays_command(names))
        return strays_killed(out.decode("utf-8", "replace")) if status == 0 else 0

    @staticmethod
    def strays_command(names: Sequence[str]) -> str:
        """stop_strays' command line (for reads() to run it in the same call): it prints the
        number killed on its last line (strays_killed)."""
        return f"sh -c {shlex.quote(_STRAYS_SH)} {shlex.quote(' '.join(names))}"


def strays_killed(text: str) -> int:
    """How many strays the strays command said it killed (0 when it said nothing)."""
    lines = text.strip().splitlines()
    return int(lines[-1]) if lines and lines[-1].isdigit() else 0


def shell_packet(kind: int, data: bytes = b"") -> bytes:
    """One shell v2 packet: its id, the length (32 bits, little-endian), the data."""
    return bytes([kind]) + len(data).to_bytes(4, "little") + data


def _stdin_packets(conn) -> tuple[Callable[[bytes], None], Callable[[], None]]:
    """A feeder's write and close on a run's shell stream: stdin packets, then one close-stdin
    packet (adbd closes the command's stdin: EOF). Sent from the feeder's thread while run()
    reads the same socket (a socket is full duplex); a stream already gone drops what is sent
    (run() reports how it ended), and nothing goes out after the close."""
    lock = threading.Lock()
    closed = [False]

    def send(packet: bytes) -> None:
        with contextlib.suppress(OSError):
            conn.conn.sendall(packet)

    def write(data: bytes) -> None:
        with lock:
            if not closed[0]:
                for i in range(0, len(data), SYNC_DATA_MAX):
                    send(shell_packet(_SHELL_STDIN, data[i:i + SYNC_DATA_MAX]))

    def close() -> None:
        with lock:
            if not closed[0]:
                closed[0] = True
                send(shell_packet(_SHELL_CLOSE_STDIN))

    return write, close


def _int_or_none(text: str) -> int | None:
    """A device's decimal number (ASCII digits only: str.isdigit() also takes '²', which int() refuses)."""
    return int(text) if re.fullmatch(r"[0-9]{1,20}", text) else None


# $0: the engine names. mksh and toybox only; a process is ours when its comm is a name AND its
# mount namespace is this shell's (readlink fails on other users' processes: not ours either).
_STRAYS_SH = (
    'me=$(readlink /proc/self/ns/mnt); n=0; '
    'for d in /proc/[0-9]*; do '
    'c=; read -r c 2>/dev/null < "$d/comm" || continue; '
    'case " $0 " in *" $c "*) ;; *) continue;; esac; '
    '[ "$(readlink "$d/ns/mnt" 2>/dev/null)" = "$me" ] || continue; '
    'kill -9 "${d#/proc/}" 2>/dev/null && n=$((n+1)); '
    'done; echo "$n"'
)


# What reads() prints, in sections split at @@BMOE markers (_sections): the fast reads of the
# state (meminfo first, in the unnamed section) ... Each one-line sysfs file is read with the
# shell's own `read`, not `$(cat FILE)`: a phone has ~15 zones and policies, and a fork and exec of
# toybox per file made this the slowest part of the call (~50 ms of ~75 on a virtual phone).
_STATE_FAST = (
    "cat /proc/meminfo; echo " + _MARK + "THERMAL; "
    "for z in /sys/class/thermal/thermal_zone*; do "
    "[ -r \"$z/temp\" ] && { y=; t=; IFS= read -r y <\"$z/type\"; IFS= read -r t <\"$z/temp\"; "
    "echo \"$y=$t\"; } 2>/dev/null; done; "
    "echo " + _MARK + "CPUFREQ; "
    "for p in /sys/devices/system/cpu/cpufreq/policy*; do "
    "[ -d \"$p\" ] && { s=; c=; IFS= read -r s <\"$p/scaling_max_freq\"; IFS= read -r c <\"$p/cpuinfo_max_freq\"; "
    "echo \"${p##*/}=$s,$c\"; } 2>/dev/null; done; "
    "echo " + _MARK + "VMSTAT; " + reclaim.VMSTAT_GREP
)
# ... and lmk_events' reads: the phone's clock and uptime (dmesg stamps are seconds since boot),
# dmesg where readable, and logcat's main, events and kernel buffers (the slow one; the kernel
# buffer holds the kernel OOM killer's line where dmesg is refused to the shell, and a phone whose
# logd keeps no kernel buffer refuses the whole call before printing: then main and events alone)
_LMK_FAST = ("echo " + _MARK + "LMKCLOCK; date +%s; cut -d' ' -f1 /proc/uptime; "
             "echo " + _MARK + "DMESG; dmesg 2>/dev/null | tail -n 400")
_LMK_LOGCAT = ("logcat -d -b main,events,kernel -v epoch 2>/dev/null"
               " || logcat -d -b main,events -v epoch 2>/dev/null")
_READS = _MARK + "READS"        # reads(): where the output of its `before` commands ends
_AT_ONCE_DIR = "/data/local/tmp/.bmoe-reads.$$"


def _at_once(slow: Sequence[tuple[str, str]], fast: str = "") -> str:
    """A script running the `slow` commands at once in the background, each into a file of a
    scratch folder, and `fast` meanwhile, then printing each slow output after its marker; one
    after another where the folder cannot be made (the output is the same either way)."""
    if not slow:
        return fast or ":"
    d = _AT_ONCE_DIR
    started = " ".join(f"{{ {cmd}; }} >\"{d}/{i}\" 2>/dev/null &" for i, (_, cmd) in enumerate(slow))
    shown = "; ".join(f"echo {_MARK}{name}; cat \"{d}/{i}\"" for i, (name, _) in enumerate(slow))
    serial = "; ".join(f"echo {_MARK}{name}; {{ {cmd}; }} 2>/dev/null" for name, cmd in slow)
    fast_ = f"{fast}; " if fast else ""
    return (f"if mkdir \"{d}\" 2>/dev/null; then {started} {fast_}wait; {shown}; rm -rf \"{d}\"; "
            f"else {fast_}{serial}; fi")


def _at(timestamp: str | None, base_s: float) -> float | None:
    try:
        return base_s + float(timestamp) if timestamp else None
    except ValueError:  # an MM-DD HH:MM:SS stamp: logcat was not asked for epoch times
        return None


def _sections(text: str) -> dict[str, str]:
    """Split the state script's output at its @@BMOE markers."""
    return sections.split(text, _MARK)


def list_phones(servers: Sequence[AdbServer]) -> list[AdbPhone]:
    """Every phone ready to run commands ("device" state) on the servers, in their order."""
    phones = []
    for server in servers:
        try:
            for d in server.client().list():
                if d.state == "device":
                    phones.append(AdbPhone(d.serial, server))
        except TRANSPORT_ERRORS as e:
            raise DeviceError(f"adb server {server.host}:{server.port}: {one_line(str(e), 200)}") from None
    return phones
