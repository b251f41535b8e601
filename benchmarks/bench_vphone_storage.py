"""Benchmark a virtual phone's flash read rate (issue 24, item 4): `--storage-mbps` against none.

    BMOE_CLI=…/bmoe-cli .venv/bin/python benchmarks/bench_vphone_storage.py [--limit 200] [--tokens 8]

Starts its own adb server and two virtual phones: one with `--storage-mbps LIMIT` (a blkio read
throttle on the disk under its /data), one without. Writes a ~96 MiB synthetic qwen3moe (uniform
routing) and runs it at --cache-mb 0 (every token streams its experts from flash) with bmoe-cli
(O_DIRECT, as it runs on a phone) and bmoe-py (skipped without BMOE_CLI: bmoe-py only), -t 1, on
both phones one after the other. Per engine and phone it prints the engine's own flash rate
(its summary's read_MiB / io_s), read_MiB over the run's wall, and for the throttled phone what
its blkio group counted (blkio.throttle.io_service_bytes Read) against the limit.

First it probes each phone's flash at the engine's timescale: a child process joined to the
phone's blkio group reads bursts of BURST MiB (O_DIRECT, 1 MiB preads, as bmoe-cli's lanes do)
from a file in the phone's /data, idle IDLE ms between bursts, and prints the rate within a burst
and over the wall. bmoe-cli's io_s is the wall its eval thread waits on each layer's reads (the
serial path), so the in-burst rate is the one its summary reports. v1 blk-throttle is a budget
that idle time earns (about limit x idle, up to ~15 MiB here): the rate over the wall holds, the
rate within a burst after compute does not (docs/decisions.md, issue 24 item 4).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devices.adb import AdbServer, adb_binary, ensure_server
from devices.virtual import manager
from engine.synth import synth_options, write_model
from harness.campaign_file import parse_campaign
from harness.runner import run_campaign


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def blkio_read_bytes(home: Path, name: str) -> int:
    group = blkio_group(home, name)
    if group is None:
        return 0
    return sum(int(line.split()[2]) for line in (group / "blkio.throttle.io_service_bytes").read_text().splitlines()
               if len(line.split()) == 3 and line.split()[1] == "Read")


PROBE = """
import mmap, os, sys, time
path, burst, idle_s, n = sys.argv[1], int(float(sys.argv[2]) * (1 << 20)), float(sys.argv[3]) / 1e3, int(sys.argv[4])
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
size, chunk, off, rates, total = os.fstat(fd).st_size, 1 << 20, 0, [], 0
buf = mmap.mmap(-1, chunk)
start = time.monotonic()
for _ in range(n):
    got, t0 = 0, time.monotonic()
    while got < burst:
        off = 0 if off + chunk > size else off
        r = os.preadv(fd, [buf], off)
        off, got = off + r, got + r
    rates.append(got / (time.monotonic() - t0) / (1 << 20))
    total += got
    time.sleep(idle_s)
rates.sort()
print(rates[len(rates) // 2], total / (time.monotonic() - start) / (1 << 20))
"""
PROBE_CASES = ((64, 0, 2), (4, 30, 8), (4, 150, 8), (20, 150, 4))   # (burst MiB, idle ms, bursts)


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def blkio_group(home: Path, name: str) -> Path | None:
    state = json.loads((home / name / ".vphone/state.json").read_text())
    for path in (state.get("cgroup") or {}).get("extra") or ():
        if Path(path, "blkio.throttle.io_service_bytes").exists():
            return Path(path)
    return None


def probe(group: Path | None, path: Path, burst_mib: float, idle_ms: float, n: int) -> tuple[float, float]:
    """(median MiB/s within a burst, MiB/s over the wall) of the paced reader, in the phone's blkio group."""
    def join() -> None:
        if group is not None:
            Path(group, "cgroup.procs").write_text(str(os.getpid()))
    out = subprocess.run([sys.executable, "-c", PROBE, str(path), str(burst_mib), str(idle_ms), str(n)],
                         capture_output=True, text=True, timeout=300, preexec_fn=join, check=True).stdout.split()
    return float(out[0]), float(out[1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=200, help="MiB/s of the throttled phone")
    ap.add_argument("--tokens", type=int, default=8)
    args = ap.parse_args()
    cli = os.environ.get("BMOE_CLI", "")
    engines = ([("bmoe-cli", {"kind": "native", "native": {"host": {"cli": cli}}})] if cli else []) + [
        ("bmoe-py", {"kind": "python"})]
    with tempfile.TemporaryDirectory(prefix="bench-storage-") as tmp:
        work = Path(tmp)
        model = work / "uniform96.gguf"
        write_model(model, synth_options("qwen3moe", size_bytes=96 << 20, seed=1, router_skew=0))
        server = AdbServer("127.0.0.1", free_port())
        port = server.port
        ensure_server(server)
        home = work / "phones"
        phones = {"throttled": args.limit, "free": 0}
        try:
            for name, mbps in phones.items():
                manager.up(name, 512 << 20, home=home, adb_host="127.0.0.1", adb_port=port, storage_mbps=mbps)
            print(f"load {loadavg()}; limit {args.limit} MiB/s")
            for name, mbps in phones.items():
                target = home / name / "data" / "flash-probe.bin"
                with open(target, "wb") as f:
                    f.write(os.urandom(64 << 20))
                group = blkio_group(home, name)
                for burst_mib, idle_ms, n in PROBE_CASES:
                    inside, over_wall = probe(group, target, burst_mib, idle_ms, n)
                    print(f"probe    {name:<9} limit {f'{mbps} MiB/s' if mbps else 'none':<10} bursts of {burst_mib:>2} MiB, "
                          f"idle {idle_ms:>3} ms: {inside:5.0f} MiB/s within a burst, {over_wall:5.0f} MiB/s over the wall")
                target.unlink()
            print(f"load {loadavg()}; model {model.stat().st_size >> 20} MiB; "
                  f"cache 0; {args.tokens} tokens; -t 1")
            for label, engine in engines:
                for name, mbps in phones.items():
                    before = blkio_read_bytes(home, name)
                    data = {"version": 1, "name": f"{label}-{name}",
                            "fleet": {"devices": [f"virtual:{name}"], "virtual_home": str(home),
                                      "adb": [{"host": "127.0.0.1", "port": port}]},
                            "models": {"bank": str(model)}, "engine": engine, "axes": {"cache_mb": [0]},
                            "run": {"n_predict": args.tokens, "threads": 1, "retries": 0}, "gate": {"max_wait_s": 2}}
                    out = work / f"{label}-{name}"
                    run_campaign(parse_campaign(data, source="bench.toml"), out, progress_stream=io.StringIO())
                    (rec_path,) = list(out.glob("runs/*/*/run.json"))
                    rec = json.loads(rec_path.read_text())
                    s = rec.get("summary") or {}
                    read_mib, io_s, wall = s.get("read_MiB"), s.get("io_s"), rec.get("wall_s")
                    own = read_mib / io_s if read_mib and io_s else float("nan")
                    over_wall = read_mib / wall if read_mib and wall else float("nan")
                    counted = (blkio_read_bytes(home, name) - before) / (1 << 20)
                    limit = f"{mbps} MiB/s" if mbps else "none"
                    extra = (f", blkio counted {counted:.0f} MiB = {counted / wall:.0f} MiB/s over the wall"
                             if mbps and wall else "")
                    print(f"{label:<8} {name:<9} limit {limit:<10} {rec['outcome']:<4} read {read_mib} MiB in io "
                          f"{io_s} s: {own:.0f} MiB/s (its own), {over_wall:.0f} MiB/s over wall {wall:.1f} s"
                          f"{'' if not mbps else f'; ratio to limit {own / mbps:.2f}'}{extra}")
        finally:
            manager.down(all_phones=True, home=home, adb_host="127.0.0.1", adb_port=port)
            subprocess.run([adb_binary(), "-P", str(port), "kill-server"], capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
