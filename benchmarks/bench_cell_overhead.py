"""Benchmark what a cell costs outside its engine run, on a virtual phone (docs/decisions/cell-reads.md).

    BMOE_CLI=…/bmoe-cli .venv/bin/python benchmarks/bench_cell_overhead.py [--cells 8] [--tokens 4]

Starts its own adb server (the real binary from the adbutils wheel) on a free port and one
virtual phone, writes a small synthetic qwen3moe (~16 MiB), and runs a campaign of --cells cells
(repeats of one config) with bmoe-cli at -t 1 (bmoe-py when BMOE_CLI is unset). Per cell:

    overhead = cell span (ledger ended_at - started_at) - the engine's own wall (run.json wall_s)

printed as median / min / max over the cells after the first (the first also pushes the engine
and the model). Every AdbPhone call is counted and timed while the campaign runs, so the lines
after the figure say where the overhead goes: shell round trips (by what they ran), sync stats,
pushes, pulls, the gate's state polls, the lmkd evidence reads (the one-call reads() by caller:
the gate's and the one after the run).
"""

from __future__ import annotations

import argparse
import collections
import functools
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devices.adb.phone import AdbPhone
from devices.adb.server import AdbServer, adb_binary, ensure_server, free_server_port
from devices.virtual import manager
from engine.gguf.synth import synth_options, write_model
from engine.units import MIB
from harness.campaign.file import parse_campaign
from harness.run.runner import run_campaign
from store.outcomes import OK

PHONE = "cellbench"
CALLS = ("shell", "shell_in_run", "reads", "state", "push", "pull", "lmk_events", "stop_strays", "remote_sha256", "run", "identity")


class Tally:
    """Calls of AdbPhone methods while the campaign runs: count and seconds, by name (nested
    calls, e.g. state() -> shell(), are counted at each level; `shell` is the round trip)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: collections.Counter[str] = collections.Counter()
        self.secs: dict[str, float] = collections.defaultdict(float)
        self.shells: collections.Counter[str] = collections.Counter()
        self.shell_secs: dict[str, float] = collections.defaultdict(float)
        self.reads: collections.Counter[str] = collections.Counter()     # reads() by the function calling it
        self.reads_secs: dict[str, float] = collections.defaultdict(float)
        self._saved: dict[str, object] = {}

    def install(self) -> None:
        for name in CALLS:
            if name == "shell_in_run" or not hasattr(AdbPhone, name):
                continue
            original = getattr(AdbPhone, name)
            self._saved[name] = original
            setattr(AdbPhone, name, self._wrap(name, original))

    def remove(self) -> None:
        for name, original in self._saved.items():
            setattr(AdbPhone, name, original)

    def _wrap(self, name, original):
        tally = self

        @functools.wraps(original)
        def timed(self_, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_name      # reads(): the gate's (cool) or the after-run one
            t0 = time.perf_counter()
            try:
                return original(self_, *args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                key = name
                if name == "shell" and not threading.current_thread().name.startswith("bmoe-"):
                    key = "shell_in_run"     # the samplers' and killer's calls while the engine runs
                with tally.lock:
                    tally.calls[key] += 1
                    tally.secs[key] += dt
                    if key == "reads":
                        tally.reads[caller] += 1
                        tally.reads_secs[caller] += dt
                    if key == "shell":
                        word = str(args[0]).split()[0][:24] if args else "?"
                        tally.shells[word] += 1
                        tally.shell_secs[word] += dt
        return timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()
    cli = os.environ.get("BMOE_CLI", "")
    server = AdbServer("127.0.0.1", free_server_port())
    port = server.port
    ensure_server(server)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        home = os.path.join(tmp, "phones")
        os.environ["BMOE_FLEET_HOME"] = os.path.join(tmp, "fleet-home")
        try:
            manager.up(PHONE, 512 * MIB, home=home, adb_host="127.0.0.1", adb_port=port)
            model = os.path.join(tmp, "small.gguf")
            write_model(model, synth_options("qwen3moe", size_bytes=16 * MIB, seed=1))
            engine = {"kind": "native", "native": {"host": {"cli": cli}}} if cli else {"kind": "python"}
            data = {"version": 1, "name": "cellbench",
                    "fleet": {"devices": [f"virtual:{PHONE}"], "virtual_home": home,
                              "adb": [{"host": "127.0.0.1", "port": port}]},
                    "models": {"small": model}, "engine": engine, "axes": {"cache_mb": [0]},
                    "run": {"n_predict": args.tokens, "threads": 1, "repeats": args.cells, "prompt": "Hello"},
                    "gate": {"max_wait_s": 10, "cpu_temp_max_c": 95.0}}
            campaign = parse_campaign(data, source="cellbench.toml")
            out = Path(tmp) / "out"
            tally = Tally()
            tally.install()
            t0 = time.monotonic()
            try:
                status = run_campaign(campaign, out, progress_stream=io.StringIO())
            finally:
                tally.remove()
            total = time.monotonic() - t0
            runs = sorted((json.loads(p.read_text()) for p in out.glob("runs/*/*/run.json")),
                          key=lambda r: r["started_at"])
            if not status.complete or any(r["outcome"] != OK for r in runs):
                sys.exit(f"Error: the campaign did not complete: {[r['outcome'] for r in runs]}")
            over = [(r["ended_at"] - r["started_at"]) - r["wall_s"] for r in runs]
            walls = [r["wall_s"] for r in runs]
            gates = [r["gate"]["waited_s"] for r in runs]
            rest = over[1:] or over
            print(f"engine   {'bmoe-cli' if cli else 'bmoe-py'} -t 1, {args.tokens} tokens, 16 MiB qwen3moe, "
                  f"virtual phone {PHONE}; {len(runs)} cells in {total:.1f} s; load {os.getloadavg()[0]:.2f}")
            print(f"wall     engine wall per cell: median {statistics.median(walls):.3f} s")
            print(f"first    cell 1 (pushes the engine and the model): overhead {over[0]:.3f} s")
            print(f"overhead cell span - engine wall, cells 2..{len(runs)}: median {statistics.median(rest):.3f} s "
                  f"(min {min(rest):.3f}, max {max(rest):.3f})   (aim <= 0.5)")
            print(f"gate     waited_s per cell: median {statistics.median(gates):.3f} s (after strays and sync)")
            n = len(runs)
            print("calls    per cell (all cells), count and seconds: " + ", ".join(
                f"{k} {tally.calls[k] / n:.1f}x {tally.secs[k] / n:.3f}s" for k in CALLS if tally.calls[k]))
            print("reads    per cell by caller (cool: the gate's; _run_cell: after the run): " + ", ".join(
                f"{k} {v / n:.1f}x {tally.reads_secs[k] / n:.3f}s" for k, v in tally.reads.most_common()))
            print("shells   per cell by first word: " + ", ".join(
                f"{k} {v / n:.1f}x {tally.shell_secs[k] / n:.3f}s" for k, v in tally.shells.most_common()))
        finally:
            manager.down(all_phones=True, home=home, adb_host="127.0.0.1", adb_port=port)
            subprocess.run([adb_binary(), "-P", str(port), "kill-server"], capture_output=True)


if __name__ == "__main__":
    main()
