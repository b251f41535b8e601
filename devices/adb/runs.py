"""Running a command on a phone: a device-side wrapper that reports the command's pid and exit
status, the shell protocol's packets read in ticks under the transport watch, pressure sampled
while it runs, stdin fed through the protocol's stdin packets, the timeout's kill, and strays."""

from __future__ import annotations

import contextlib
import re
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from devices import lmkd_inputs, reclaim, thermal_zones
from devices.adb.link import MARK, WORK_DIR, PhoneLink, lost_or_error
from devices.adb.server import TRANSPORT_ERRORS, AdbServer
from devices.base import (
    DeviceError,
    DeviceLost,
    OutputFn,
    PressureSample,
    RunInterrupted,
    RunOutcome,
    StdinFeeder,
    parse_meminfo_kb,
)
from engine.safetext import one_line
from engine.units import KIB, is_digits

# shell v2 packet ids (adb's shell_protocol.h): stdin, stdout, stderr, exit, close-stdin
_SHELL_STDIN, _SHELL_STDOUT, _SHELL_STDERR, _SHELL_EXIT, _SHELL_CLOSE_STDIN = 0, 1, 2, 3, 4
STDIN_DATA_MAX = 64 * KIB   # one stdin packet's data at most (as sync's DATA)
_READ_TICK_S = 0.5          # run() wakes this often to check the watch and the stop event


# every thermal zone as `TYPE=VALUE` (devices.thermal_zones.parse_zones), one line per zone; each
# one-line sysfs file read with the shell's own `read`, not `$(cat FILE)`: a phone has ~15 zones,
# and a fork and exec of toybox per file would be most of the call
ZONES_COMMAND = ("for z in /sys/class/thermal/thermal_zone*; do "
                 "[ -r \"$z/temp\" ] && { y=; t=; IFS= read -r y <\"$z/type\"; IFS= read -r t <\"$z/temp\"; "
                 "echo \"$y=$t\"; } 2>/dev/null; done")


def _q(args: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)



class PhoneRuns(PhoneLink):
    """Commands run on a phone under the wrapper."""

    def __init__(self, serial: str, server: AdbServer | None = None, work_dir: str = WORK_DIR):
        super().__init__(serial, server, work_dir)
        # what the phone's thermal zones read so far, by the state's reads and the run's samples:
        # the zones that never move (devices.thermal_zones)
        self.zones = thermal_zones.ZoneHistory()
        self._shell_v2: bool | None = None          # whether adbd has the shell protocol v2 (asked once)

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
        # the run's pid file (pid and start time, /proc/PID/stat field 22): it outlives a run whose
        # stream was cut, so the next contact can kill what the run left (reap_lost)
        pid_file = f"{shlex.quote(self._work_dir)}/{RUN_PID_PREFIX}$p"
        parts.append(f"{{ l=; read -r l </proc/$p/stat; l=${{l##*) }}; set -f; set -- $l; set +f; "
                     f"echo \"$p ${{20}}\" >{pid_file}; }} 2>/dev/null")
        parts.append(f"echo {MARK}PID $p >&2")
        parts.append(f"wait $p; s=$?; rm -f {pid_file}; echo {MARK}EXIT $s >&2; exit $s")
        return "; ".join(parts)

    def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None, timeout_s: float | None = None,
            cwd: str | None = None, on_stdout: OutputFn | None = None, on_stderr: OutputFn | None = None,
            sample_period_s: float = 1.0, feeder: StdinFeeder | None = None,
            scrub_prefix: str | None = "BMOE_") -> RunOutcome:
        """Run argv on the phone under the wrapper: output streamed, pressure sampled, killed at the
        timeout; `feeder` writes its stdin through the shell protocol's stdin packets."""
        command = self.wrapper_command(argv, env, cwd, scrub_prefix, stdin=feeder is not None)
        self._need_shell_v2()
        started_at, t0 = time.time(), time.monotonic()
        conn = None
        try:
            conn = self._device.open_transport(timeout=min(30.0, self.device_timeout_s))
            conn.send_command(f"shell,v2,raw:{command}")
            conn.check_okay()
        except TRANSPORT_ERRORS as e:
            if conn is not None:
                conn.close()
            raise lost_or_error(self._device, self.server, "run", e) from None
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
                mark = re.fullmatch(MARK + r"(PID|EXIT) ([0-9]{1,10})", text.strip())
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

    def _need_shell_v2(self) -> None:
        """run() speaks the shell protocol v2 (stdout, stderr and the exit status apart, stdin
        packets): a phone whose adbd lacks it (`shell_v2` came with Android 7.0; upstream's
        bmoe-cli needs API 29) is refused in one line (docs/decisions/shell-protocol.md)."""
        if self._shell_v2 is None:
            try:
                features = self._device.get_features()
            except TRANSPORT_ERRORS as e:
                raise lost_or_error(self._device, self.server, "features", e) from None
            self._shell_v2 = "shell_v2" in features.split(",")
        if not self._shell_v2:
            raise DeviceError(f"{self.serial}: its adbd lacks the shell protocol v2 (adb feature shell_v2, Android "
                              "7.0 and later), which runs need to tell the engine's output, errors and exit apart")

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
            f"grep -E '^(VmHWM|VmRSS):' /proc/{pid}/status 2>/dev/null; {lmkd_inputs.MEMINFO_GREP}; "
            f"echo {reclaim.MARK}THERMAL; {ZONES_COMMAND}; " + reclaim.command(pid), timeout_s
        )
        parts = reclaim.split(text)
        kb = parse_meminfo_kb(parts.get("", ""))
        if "VmRSS" not in kb:
            return None
        # the same zone as the gate's (devices.thermal_zones), the zones' history shared with it
        zones, _ = thermal_zones.parse_zones(parts.get("THERMAL", ""))
        constant = self.zones.observe(zones, time.monotonic())
        zone, _ = thermal_zones.cpu_zone(zones, constant)
        return PressureSample(t_s, kb.get("MemAvailable"), kb.get("VmHWM"), kb.get("VmRSS"),
                              zones[zone] if zone is not None else None, reclaim=reclaim.parse(parts),
                              lmkd=lmkd_inputs.parse_sample(kb, parts.get("VMSTAT", ""), parts.get("PSI", "")))

    def stop_strays(self, names: Sequence[str]) -> int:
        """Kill what lost runs left (reap_lost's pid files), then leftover engine processes (by
        process name) that share this shell's mount namespace: on a phone every process adb
        started, on a virtual phone only its own (virtual phones share this host's /proc and all run
        as the shell user, so `pidof NAME` would name the engine another phone is measuring).
        Returns how many were killed by name (the reaped are reaped_pids' of the same output)."""
        status, out, _ = self.shell(self.strays_command(names))
        return strays_killed(out.decode("utf-8", "replace")) if status == 0 else 0

    def reap_lost(self, names: Sequence[str]) -> list[int]:
        """Kill, by pid, the engines runs left behind when their stream was cut (a device lost, an
        interrupt: adbd hangs up the shell alone, packages/modules/adb daemon/shell_service.cpp, so
        the engine may live on with its gigabytes). Each run leaves a pid file in the work dir with
        the process's start time; a process is killed only while its start time is the recorded one
        (a reused pid is another process) and its name (comm) is one of `names`. Returns the pids."""
        status, out, _ = self.shell(f"sh -c {shlex.quote(_REAP_SH)} {shlex.quote(' '.join(names))} "
                                    f"{shlex.quote(self._work_dir)}")
        return reaped_pids(out.decode("utf-8", "replace")) if status == 0 else []

    def strays_command(self, names: Sequence[str]) -> str:
        """stop_strays' command line (for reads() to run it in the same call): lost runs reaped by
        pid first (a `@@BMOEREAPED PID` line each, reaped_pids), then strays by name; it prints the
        number killed by name on its last line (strays_killed)."""
        return (f"sh -c {shlex.quote(_REAP_SH + '; ' + _STRAYS_SH)} {shlex.quote(' '.join(names))} "
                f"{shlex.quote(self._work_dir)}")


def strays_killed(text: str) -> int:
    """How many strays the strays command said it killed by name (0 when it said nothing)."""
    lines = text.strip().splitlines()
    return int(lines[-1]) if lines and is_digits(lines[-1]) else 0


def reaped_pids(text: str) -> list[int]:
    """The pids the reap (reap_lost, strays_command) said it killed."""
    return [int(m[1]) for m in re.finditer(rf"^{MARK}REAPED ([0-9]{{1,10}})$", text, re.MULTILINE)]


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
                for i in range(0, len(data), STDIN_DATA_MAX):
                    send(shell_packet(_SHELL_STDIN, data[i:i + STDIN_DATA_MAX]))

    def close() -> None:
        with lock:
            if not closed[0]:
                closed[0] = True
                send(shell_packet(_SHELL_CLOSE_STDIN))

    return write, close


RUN_PID_PREFIX = ".run-pid."     # in the work dir: one file per run still going, "PID STARTTIME"
# $0: the engine names, $1: the work dir. A run's pid file whose process is gone (or whose pid now
# belongs to a process started at another time: /proc/PID/stat field 22, read past the `(comm)`
# that may hold spaces) is removed; a live one under an engine name is killed (`@@BMOEREAPED PID`,
# its pid kept in $reaped for the strays loop after it to skip); any other live run is left alone,
# its file kept (a gap app's stop_strays runs while the engine runs).
_REAP_SH = (
    'reaped=; for f in "$1"/' + RUN_PID_PREFIX + '[0-9]*; do '
    '[ -f "$f" ] || continue; p=; st=; read -r p st < "$f"; '
    'case "$p" in ""|*[!0-9]*) rm -f "$f"; continue;; esac; '
    'l=; read -r l 2>/dev/null < "/proc/$p/stat" || { rm -f "$f"; continue; }; l=${l##*) }; '
    'set -f; set -- $l; set +f; [ "${20}" = "$st" ] || { rm -f "$f"; continue; }; '
    'c=; read -r c 2>/dev/null < "/proc/$p/comm"; '
    'case " $0 " in *" $c "*) ;; *) continue;; esac; '
    'kill -9 "$p" 2>/dev/null && { rm -f "$f"; reaped="$reaped $p"; echo "' + MARK + 'REAPED $p"; }; '
    'done'
)
# $0: the engine names. mksh and toybox only; a process is ours when its comm is a name AND its
# mount namespace is this shell's (readlink fails on other users' processes: not ours either).
_STRAYS_SH = (
    'me=$(readlink /proc/self/ns/mnt); n=0; '
    'for d in /proc/[0-9]*; do '
    'c=; read -r c 2>/dev/null < "$d/comm" || continue; '
    'case " $0 " in *" $c "*) ;; *) continue;; esac; '
    'case " $reaped " in *" ${d#/proc/} "*) continue;; esac; '
    '[ "$(readlink "$d/ns/mnt" 2>/dev/null)" = "$me" ] || continue; '
    'kill -9 "${d#/proc/}" 2>/dev/null && n=$((n+1)); '
    'done; echo "$n"'
)


