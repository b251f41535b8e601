"""Benchmark a virtual phone's flash read rate (docs/decisions/vphone-paced-flash.md): `--storage-mbps` against none.

    BMOE_CLI=…/bmoe-cli .venv/bin/python benchmarks/bench_vphone_storage.py [--limit 200] [--tokens 8]

Starts its own adb server and three virtual phones: one at `--storage-mbps LIMIT`, one at the
Redmi Note 12 profile's UFS 2.2 rate (1000 MiB/s) and one without a limit. A paced /data
(devices/virtual/pacedfs.py) serves each read at its bytes over the rate, on a clock idle time
does not advance. First a reader inside each phone (its own shell, its own namespace) reads a
64 MiB file of the phone's /data O_DIRECT in 1 MiB preads, as bmoe-cli's lanes do: back to back,
and in bursts of BURST MiB after IDLE ms of idle (where a v1 blk-throttle let bursts run at the
disk's rate), and prints the rate within a burst. Then each engine (bmoe-cli -t 1 when BMOE_CLI
is set, bmoe-py -t 1) runs two synthetic models at --cache-mb 0 (every token streams its experts
from flash): the I/O-bound ~96 MiB one (2 ms of compute per token) and one that computes between
reads (hidden 1024, vocab 262144: ~26 ms per token), and prints its own flash rate (summary
read_MiB / io_s, what the run table shows) and read_MiB over the run's wall, against the limit.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devices.adb.server import AdbServer, adb_binary, ensure_server, free_server_port
from devices.virtual import manager
from engine.gguf.synth import synth_options, write_model
from engine.units import GIB, MIB
from harness.campaign.file import parse_campaign
from harness.run.runner import run_campaign

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


def probe(serial: str, port: int, path: str, burst_mib: float, idle_ms: float, n: int) -> tuple[float, float]:
    """(median MiB/s within a burst, MiB/s over the wall) of the paced reader, run by the phone's shell."""
    out = subprocess.run([adb_binary(), "-P", str(port), "-s", serial, "shell",
                          " ".join(shlex.quote(a) for a in (sys.executable, "-c", PROBE, path, str(burst_mib),
                                                             str(idle_ms), str(n)))],
                         capture_output=True, text=True, timeout=300, check=True).stdout.split()
    return float(out[0]), float(out[1])


MODELS = {  # name: synth options (uniform routing: every token reads its experts)
    "io-bound 96 MiB": dict(size_bytes=96 * MIB),
    "computing 1.1 GiB": dict(layers=4, experts=16, top_k=4, hidden=1024, vocab=262144),
}
UFS22_MIBS = 1000    # devices/virtual/profiles.py: the Redmi Note 12's UFS 2.2


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=200, help="MiB/s of the slow phone")
    ap.add_argument("--tokens", type=int, default=8)
    args = ap.parse_args()
    cli = os.environ.get("BMOE_CLI", "")
    engines = ([("bmoe-cli", {"kind": "native", "native": {"host": {"cli": cli}}})] if cli else []) + [
        ("bmoe-py", {"kind": "python"})]
    with tempfile.TemporaryDirectory(prefix="bench-storage-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        models = {}
        for label, opts in MODELS.items():
            models[label] = work / f"{len(models)}.gguf"
            write_model(models[label], synth_options("qwen3moe", seed=1, router_skew=0, **opts))
        server = AdbServer("127.0.0.1", free_server_port())
        port = server.port
        ensure_server(server)
        home = work / "phones"
        phones = {"slow": args.limit, "ufs22": UFS22_MIBS, "free": 0}
        serials = {}
        try:
            for name, mbps in phones.items():
                serials[name] = manager.up(name, 2 * GIB, home=home, adb_host="127.0.0.1", adb_port=port,
                                           storage_mbps=mbps)
            print(f"load {loadavg()}; limit {args.limit} MiB/s; nothing else of this project running")
            for name, mbps in phones.items():
                target = home / name / "data" / "local" / "tmp" / "flash-probe.bin"
                with open(target, "wb") as f:
                    f.write(os.urandom(64 * MIB))
                    f.flush()
                    os.fsync(f.fileno())
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                for burst_mib, idle_ms, n in PROBE_CASES:
                    inside, over_wall = probe(serials[name], port, "/data/local/tmp/flash-probe.bin", burst_mib,
                                              idle_ms, n)
                    print(f"probe    {name:<6} limit {f'{mbps} MiB/s' if mbps else 'none':<10} bursts of {burst_mib:>2} "
                          f"MiB, idle {idle_ms:>3} ms: {inside:5.0f} MiB/s within a burst, {over_wall:5.0f} MiB/s "
                          "over the wall")
                target.unlink()
            print(f"load {loadavg()}; cache 0; {args.tokens} tokens; -t 1")
            for mlabel, model in models.items():
                for label, engine in engines:
                    for name, mbps in phones.items():
                        data = {"version": 1, "name": f"{label}-{name}",
                                "fleet": {"devices": [f"virtual:{name}"], "virtual_home": str(home),
                                          "adb": [{"host": "127.0.0.1", "port": port}]},
                                "models": {"bank": str(model)}, "engine": engine, "axes": {"cache_mb": [0]},
                                "run": {"n_predict": args.tokens, "threads": 1, "retries": 0},
                                "gate": {"max_wait_s": 2}}
                        out = work / f"{label}-{name}-{model.stem}"
                        run_campaign(parse_campaign(data, source="bench.toml"), out, progress_stream=io.StringIO())
                        (rec_path,) = list(out.glob("runs/*/*/run.json"))
                        rec = json.loads(rec_path.read_text())
                        s = rec.get("summary") or {}
                        read_mib, io_s, wall = s.get("read_MiB"), s.get("io_s"), rec.get("wall_s")
                        own = read_mib / io_s if read_mib and io_s else float("nan")
                        over_wall = read_mib / wall if read_mib and wall else float("nan")
                        limit = f"{mbps} MiB/s" if mbps else "none"
                        print(f"{mlabel:<17} {label:<8} {name:<6} limit {limit:<10} {rec['outcome']:<4} read "
                              f"{read_mib} MiB in io {io_s} s: {own:.0f} MiB/s (its own), {over_wall:.0f} MiB/s over "
                              f"wall {wall:.1f} s{'' if not mbps else f'; ratio to limit {own / mbps:.2f}'}")
            print(f"load {loadavg()}")
        finally:
            manager.down(all_phones=True, home=home, adb_host="127.0.0.1", adb_port=port)
            subprocess.run([adb_binary(), "-P", str(port), "kill-server"], capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
