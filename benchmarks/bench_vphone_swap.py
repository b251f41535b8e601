"""Benchmark a virtual phone that swaps to its zram (docs/decisions/reclaim-war.md), at a phone's scale.

    BMOE_CLI=…/bmoe-cli .venv/bin/python benchmarks/bench_vphone_swap.py [--ram-mib 1024] [--tokens 24]
        [--repeat N] [--engines bmoe-cli,bmoe-py] [--cases "cache 0,swapping budget,zram exhausted,zram 0"]
        [--active] [--dense-weights mmap|warm|anon] [--swap-cache-pct P] [--dense-pct D] [--zram-pct Z]

Starts its own adb server and, per case, a virtual phone (--cpus 1) of RAM (1 GiB) with zram of
half of it (512 MiB) beside one foreground app holding 30 % of the RAM in cold memory lz4
compresses ~3:1 (apps.py `:compressible`), ro.lmk.kill_heaviest_task as device trees set it. A
synthetic qwen3moe as large as the RAM (uniform routing) runs at -t 1 with bmoe-cli (skipped
without BMOE_CLI) and bmoe-py:

  cache 0             every token streams its experts from flash (the baseline)
  swapping budget     40 % of the RAM: larger than the RAM left beside the app and the engine's own,
                      it runs while the app's pages go to zram (a third of their size, charged)
  zram exhausted      95 % of the RAM, past what zram can give back: lmkd kills it on low swap
  zram 0              the swapping budget on the same phone without zram: killed

`--active`: the app is in use (apps.py `:active`: it reads a few % of its pages every 100 ms
instead of being marked cold), the reclaim war of upstream's docs/pressure.md: reclaim then takes
the engine's own cold pages and, with `--dense-weights mmap|warm`, its mapped dense weights.
`--dense-pct D`: the model's vocabulary is chosen so that its dense weights are about D % of the
RAM (gpt-oss-120b's 4.14 GiB is 36 % of upstream's 11.4 GB phone); the war of upstream's phone,
at a 1 GiB phone's sizes:

  --active --app-pct 20 --dense-weights warm --dense-pct 50 --swap-cache-pct 45 \
      --cases "cache 0,swapping budget" --repeat 2

Per run: outcome, decode tok/s and its ratio to the same engine's cache 0 on the same setup, the
engine's peak VmSwap (its /proc/PID/status, sampled at 5 Hz), its RssFile low and high and major
faults (run.json "reclaim", devices/reclaim.py; majflt from the 5 Hz watch where the run's samples
are too few), the phone's pswpout over the run (its /proc/vmstat through adb), the kill's
evidence, the load.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devices.adb.server import AdbServer, adb_binary, ensure_server, free_server_port
from devices.virtual import cgroup as cgroups
from devices.virtual import manager
from devices.virtual.swapwatch import SwapWatch
from engine.gguf.synth import plan_tensors, synth_options, write_model
from engine.units import MIB
from harness.campaign.file import parse_campaign
from harness.run.runner import run_campaign

APP_LZ4_RATIO = 2.9   # what zram keeps of an app's :compressible memory (apps.py, measured)


def pswpout(port: int, serial: str) -> int:
    out = subprocess.run([adb_binary(), "-P", str(port), "-s", serial, "shell", "cat /proc/vmstat"],
                         capture_output=True, text=True, timeout=30).stdout
    return next((int(line.split()[1]) for line in out.splitlines() if line.startswith("pswpout ")), 0)


def dense_bytes_of(o) -> int:
    """The model's dense tensors: everything but the experts (expert biases included, as the pricing does)."""
    return sum(t.nbytes for t in plan_tensors(o) if t.kind != "expert")


def model_options(model_bytes: int, dense_bytes: int):
    """A uniform qwen3moe of model_bytes; with dense_bytes, the smallest vocabulary (a multiple of
    8192) whose dense tensors (everything but the experts) reach it."""
    if not dense_bytes:
        return synth_options("qwen3moe", size_bytes=model_bytes, seed=1, router_skew=0)
    for vocab in range(8192, 128 * 8192, 8192):
        o = synth_options("qwen3moe", size_bytes=model_bytes, seed=1, router_skew=0, vocab=vocab)
        if dense_bytes_of(o) >= dense_bytes:
            return o
    raise SystemExit(f"no vocabulary gives {dense_bytes // MIB} MiB of dense weights in {model_bytes // MIB} MiB")


def run_case(work: Path, home: Path, port: int, model: Path, label: str, engine: dict, case: str, ram: int,
             zram_bytes: int, app: str, cache_mb: int, tokens: int, n: int = 0, dense: str = "anon") -> dict:
    name = f"{label}-{case}-{n}".replace(" ", "-")
    serial = manager.up(name, ram, home=home, adb_host="127.0.0.1", adb_port=port, zram_bytes=zram_bytes,
                        apps=(app,), lmk={"kill_heaviest_task": True}, cpus=1)
    try:
        info = manager.info(name, home)
        data = {"version": 1, "name": name,
                "fleet": {"devices": [f"virtual:{name}"], "virtual_home": str(home),
                          "adb": [{"host": "127.0.0.1", "port": port}]},
                "models": {"bank": str(model)}, "engine": engine, "axes": {"cache_mb": [cache_mb], "dense_weights": [dense]},
                "run": {"n_predict": tokens, "threads": 1, "retries": 0}, "gate": {"max_wait_s": 2}}
        before = pswpout(port, serial)
        out = work / name
        with SwapWatch(str(info.cgroup_path)) as watch:
            run_campaign(parse_campaign(data, source="bench.toml"), out, progress_stream=io.StringIO())
        after = pswpout(port, serial)
        (rec_path,) = list(out.glob("runs/*/*/run.json"))
        rec = json.loads(rec_path.read_text())
        if os.environ.get("BENCH_DEBUG"):
            sm = rec.get("summary") or {}
            print({k: sm.get(k) for k in ("tok/s", "cache_resident_MiB", "majflt/tok", "cpu_s/tok", "io_s/tok",
                                          "read_MiB")}, rec.get("pressure"), file=sys.stderr)
        reclaim = rec.get("reclaim") or {}
        return {"rss_file_min_kb": reclaim.get("rss_file_min_kb"), "rss_file_max_kb": reclaim.get("rss_file_max_kb"),
                "majflt": reclaim.get("maj_flt", watch.engine_majflt), "swap_in_kb": reclaim.get("swap_in_kb"),
                "outcome": rec["outcome"], "tok_s": (rec.get("summary") or {}).get("tok/s"),
                "vmswap_kb": watch.peak_kb.get("engine", 0), "app_vmswap_kb": watch.peak_kb.get("app", 0),
                "pswpout": after - before, "evidence": rec.get("evidence") or [], "wall_s": rec.get("wall_s"),
                "own_mib": watch.engine_own_kb // 1024,
                "resident_mib": (rec.get("summary") or {}).get("cache_resident_MiB")}
    finally:
        manager.down(name, home=home, adb_host="127.0.0.1", adb_port=port)
        assert not Path(cgroups.leaf_name(name, home / name)).exists()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ram-mib", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--engines", default="bmoe-cli,bmoe-py")
    ap.add_argument("--cases", default="cache 0,swapping budget,zram exhausted,zram 0")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--model-pct", type=int, default=150, help="the model's size, % of the RAM")
    ap.add_argument("--app-pct", type=int, default=30, help="the foreground app's compressible memory, % of the RAM")
    ap.add_argument("--swap-cache-pct", type=int, default=0,
                    help="the swapping budget, %% of the RAM (0: from the engine's own footprint at cache 0)")
    ap.add_argument("--big-cache-pct", type=int, default=0,
                    help="the zram-exhausted budget, %% of the RAM (0: 110)")
    ap.add_argument("--active", action="store_true", help="the app is in use (apps.py :active), not cold")
    ap.add_argument("--dense-weights", default="anon", choices=("anon", "mmap", "warm"))
    ap.add_argument("--dense-pct", type=int, default=0,
                    help="the model's dense weights, %% of the RAM (0: the synthesizer's own share, a few %%)")
    ap.add_argument("--zram-pct", type=int, default=50, help="the zram device, %% of the RAM")
    args = ap.parse_args()
    ram = args.ram_mib * MIB
    zram_bytes = ram * args.zram_pct // 100 // MIB * MIB
    app = f"foreground:{ram * args.app_pct // 100 // MIB}MiB:compressible" + (":active" if args.active else "")
    model_bytes = ram * args.model_pct // 100
    app_mib = ram * args.app_pct // 100 // MIB
    cli = os.environ.get("BMOE_CLI", "")
    engines = {"bmoe-cli": {"kind": "native", "native": {"host": {"cli": cli}}}, "bmoe-py": {"kind": "python"}}
    chosen = [e for e in args.engines.split(",") if e in engines and (e != "bmoe-cli" or cli)]
    with tempfile.TemporaryDirectory(prefix="bench-swap-") as tmp:
        work = Path(tmp)
        model = work / "uniform.gguf"
        options = model_options(model_bytes, ram * args.dense_pct // 100)
        write_model(model, options)
        dense_mib = dense_bytes_of(options) // MIB
        server = AdbServer("127.0.0.1", free_server_port())
        ensure_server(server)
        home = work / "phones"
        try:
            print(f"RAM {ram // MIB} MiB, zram {zram_bytes // MIB} MiB (lz4), app {app}, model "
                  f"{model.stat().st_size // MIB} MiB (dense {dense_mib} MiB, vocab {options.vocab}), "
                  f"{args.tokens} tokens, -t 1, --cpus 1, "
                  f"--dense-weights {args.dense_weights}")
            for label in chosen:
                # the engine's own footprint (anonymous, resident + swapped) at cache 0 on this phone
                base = run_case(work, home, server.port, model, label, engines[label], "footprint", ram, zram_bytes,
                                app, 0, args.tokens, dense=args.dense_weights)
                own_mib = base["own_mib"]
                left_mib = ram // MIB - app_mib - own_mib           # the RAM left beside the app and the engine
                gain_mib = int(app_mib * (1 - 1 / APP_LZ4_RATIO))   # what zram gives back from the app
                swap_mb = ram * args.swap_cache_pct // 100 // MIB if args.swap_cache_pct else left_mib + gain_mib // 2
                # a cache alone past the RAM: no zram can make room for it (its pages do not compress)
                big_mb = ram * (args.big_cache_pct or 110) // 100 // MIB
                print(f"{label}: own footprint {own_mib} MiB at cache 0; RAM left beside the app {left_mib} MiB, "
                      f"zram's gain from the app ~{gain_mib} MiB: swapping budget {swap_mb} MiB, "
                      f"zram exhausted {big_mb} MiB", flush=True)
                budgets = {"cache 0": (0, zram_bytes), "swapping budget": (swap_mb, zram_bytes),
                           "zram exhausted": (big_mb, zram_bytes), "zram 0": (swap_mb, 0)}
                base_tok = base["tok_s"]
                for case in args.cases.split(","):
                    cache_mb, z = budgets[case]
                    for n in range(args.repeat):
                        started = time.monotonic()
                        r = run_case(work, home, server.port, model, label, engines[label], case, ram, z, app,
                                     cache_mb, args.tokens, n, dense=args.dense_weights)
                        tok = f"{r['tok_s']:.2f}" if isinstance(r["tok_s"], (int, float)) else "-"
                        if case == "cache 0" and isinstance(r["tok_s"], (int, float)):
                            base_tok = r["tok_s"]
                        ratio = (f"{r['tok_s'] / base_tok:.2f}x" if isinstance(r["tok_s"], (int, float))
                                 and isinstance(base_tok, (int, float)) and base_tok else "-")
                        rf = (f"{(r['rss_file_min_kb'] or 0) // 1024}-{(r['rss_file_max_kb'] or 0) // 1024}"
                              if r["rss_file_max_kb"] is not None else "-")
                        print(f"{label:<8} {case:<16} cache {cache_mb:>5} MiB (resident {r['resident_mib']})  "
                              f"{r['outcome']:<10} {tok:>6} tok/s ({ratio} cache 0)  "
                              f"VmSwap {r['vmswap_kb'] // 1024:>4} MiB (app {r['app_vmswap_kb'] // 1024} MiB)  "
                              f"RssFile {rf} MiB  majflt {r['majflt']}  "
                              f"pswpout {r['pswpout']:>7}  {time.monotonic() - started:5.1f} s  "
                              f"load {Path('/proc/loadavg').read_text().split()[0]}  {'; '.join(r['evidence'])[:240]}",
                              flush=True)
        finally:
            manager.down(all_phones=True, home=home, adb_host="127.0.0.1", adb_port=server.port)
            subprocess.run([adb_binary(), "-P", str(server.port), "kill-server"], capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
