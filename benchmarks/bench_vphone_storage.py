"""Benchmark a virtual phone's flash read rate (issue 24, item 4): `--storage-mbps` against none.

    BMOE_CLI=…/bmoe-cli .venv/bin/python benchmarks/bench_vphone_storage.py [--limit 200] [--tokens 8]

Starts its own adb server and two virtual phones: one with `--storage-mbps LIMIT` (a blkio read
throttle on the disk under its /data), one without. Writes a ~96 MiB synthetic qwen3moe (uniform
routing) and runs it at --cache-mb 0 (every token streams its experts from flash) with bmoe-cli
(O_DIRECT, as it runs on a phone) and bmoe-py (skipped without BMOE_CLI: bmoe-py only), -t 1, on
both phones one after the other. Per engine and phone it prints the engine's own flash rate
(its summary's read_MiB / io_s), read_MiB over the run's wall, and for the throttled phone what
its blkio group counted (blkio.throttle.io_service_bytes Read) against the limit.
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
    state = json.loads((home / name / ".vphone/state.json").read_text())
    for path in (state.get("cgroup") or {}).get("extra") or ():
        f = Path(path, "blkio.throttle.io_service_bytes")
        if f.exists():
            return sum(int(line.split()[2]) for line in f.read_text().splitlines()
                       if len(line.split()) == 3 and line.split()[1] == "Read")
    return 0


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
            print(f"load {os.getloadavg()[0]:.2f}; limit {args.limit} MiB/s; model {model.stat().st_size >> 20} MiB; "
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
