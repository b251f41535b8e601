"""A fleet demonstration: a campaign on three virtual phones (2, 3 and 4 GiB) plus this host.

    .venv/bin/python benchmarks/campaign_fleet.py [--dir /var/tmp/fleetdemo] [--tokens 8]

Everything goes through the CLI, as a user would run it, against a real adb server (the binary
in the adbutils wheel, on a free port) and virtual phones:
  1. a synthetic qwen3moe (2.9 GiB) larger than the smallest phone's RAM;
  2. cache_mb = [0, cycle*0.9, cycle*1.2, auto, 2600] x dense_weights = [anon, warm] x 2 repeats
     on local + three phones; prints every device's outcomes, the kill evidence, and the campaign
     wall time against the slowest device's own total (parallelism);
  3. a second campaign where one phone is stopped mid-way: its cells are device_lost while the
     others finish; the phone comes back and a rerun runs only its missing cells.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devices.adb.server import adb_binary, free_server_port
from results.read.run_keys import budget_label
from store.ledger import was_attempted
from store.outcomes import KILLS

BIN = Path(sys.executable).parent
PHONES = {"p2g": ("2GiB", "Moto G 2GB"), "p3g": ("3GiB", "Galaxy A 3GB"), "p4g": ("4GiB", "Pixel 4GB")}


def fleet(*args: str, env: dict, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "bmoe-fleet"), *args], env=env, capture_output=True, text=True, check=check)


def campaign_toml(path: Path, model: Path, devices: list[str], port: int, home: Path, cache_mb: list[str],
                  repeats: int, n_predict: int) -> None:
    """Write the campaign file, built the way `bmoe-fleet sweep` builds one."""
    from harness.campaign.options import campaign_from_options

    campaign = campaign_from_options(
        devices, [str(model)], cache_mb, dense_weights=["anon", "warm"], repeats=repeats, n_predict=n_predict,
        adb=[f"127.0.0.1:{port}"], name=path.stem, timeout_s=900,
        extra={"fleet": {"virtual_home": str(home)}, "run": {"prompt": PROMPT},
               "gate": {"cpu_temp_max_c": 95.0, "max_wait_s": 10}})
    path.write_text(campaign.to_toml())


# A long prompt of many scripts and symbols: prefill routes every token at every layer but the last,
# and diverse tokens reach most of each layer's 116 experts (a synthetic router concentrates on
# fewer experts in deeper layers; 126 plain-English tokens filled only 1.5 of 2.9 GiB). This one,
# 579 tokens, fills 2.0 GiB: a 2600 MiB cache outgrows the 2 GiB phone.
PROMPT = ("In the early morning the fishermen of the northern coast pushed their boats into the grey water. "
          "Quartz jumps vex; 7 wily gnomes fix 42 BIG zebras @ dawn! Kiwi yaks & 9 Xylophones quiz Pjotr — "
          "ünïcødé ЖЩ 漢字 ∑∫ 0x3F; {\"k\": [1, 2.5e-3, null]} SELECT * FROM t WHERE id=7; λx.x+1 → ℝ³ ¿qué? "
          "«ça» 東京 ĀĒĪŌŪ ♠♣♥♦ #!/bin/sh\nПока ветер гнал волны, 3 кита пели; Ωμέγα δέλτα ψ! "
          "def f(x): return x**2 % 17 // 3 | ~0 ^ 0xFF; <a href='#'>ok</a> 😀🚀🌍 नमस्ते दुनिया 안녕하세요 "
          "مرحبا بالعالم ¼½¾ ₿€£¥ \\n\\t\\\\ 2026-11-29T23:59:60Z")


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines() if line.strip()]


def run_json(out: Path, rec: dict) -> dict:
    return json.loads((out / rec["run_dir"] / "run.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/var/tmp/fleetdemo")
    ap.add_argument("--tokens", type=int, default=8)
    args = ap.parse_args()
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    port = free_server_port()
    home = root / "phones"
    env = dict(os.environ, ANDROID_ADB_SERVER_PORT=str(port), ADB_MDNS="0", BMOE_FLEET_HOME=str(root / "fleet-home"))
    subprocess.run([adb_binary(), "-P", str(port), "start-server"], env=env, check=True, capture_output=True)
    try:
        for name, (ram, model_name) in PHONES.items():
            print(fleet("virtual", "up", "--name", name, "--ram", ram, "--model", model_name, "--home", str(home),
                        env=env).stdout.strip(), f"({name}, {ram})")
        model = root / "demo.gguf"
        # Larger than the 2 GiB phone through its expert bank (116 experts a layer), while a token
        # still costs what 4 experts of hidden 1024 cost: fast runs, real streaming.
        print(fleet("model", "synth", str(model), "--preset", "qwen3moe", "--layers", "8", "--experts", "116",
                    "--top-k", "4", "--hidden", "1024", "--expert-ffn", "1024", "--router-skew", "0", "--quiet",
                    env=env).stdout.strip())
        print(fleet("model", "inspect", str(model), env=env).stdout.strip())

        # ---- 1. the full sweep -----------------------------------------------------------------
        devices = ["local", *(f"virtual:{n}" for n in PHONES)]
        camp = root / "fleet.toml"
        campaign_toml(camp, model, devices, port, home, ["0", "cycle*0.9", "cycle*1.2", "auto", "2600"], 2,
                      args.tokens)
        t0 = time.monotonic()
        done = fleet("run", str(camp), "-o", str(root / "fleet-out"), env=env, check=False)
        wall = time.monotonic() - t0
        print(done.stdout.strip()[-3000:])
        if done.returncode:
            print(done.stderr[-3000:])
        recs = records(root / "fleet-out")
        per_device: dict[str, float] = {}
        table: dict[tuple[str, str], list[str]] = {}
        for rec in recs:
            run = run_json(root / "fleet-out", rec)
            per_device[run["device"]] = per_device.get(run["device"], 0.0) + (rec["ended_at"] - rec["started_at"])
            key = (run["device"], str(run["config"].get("budget_spec", run["config"].get("cache_mb"))))
            table.setdefault(key, []).append(rec["outcome"])
            if rec["outcome"] in KILLS:
                lmkd = [e for e in run["evidence"] if "lowmemorykiller" in e] or run["evidence"][-1:]
                print(f"  {run['device']} {budget_label(run['config'].get('cache_mb'))} {run['config'].get('dense_weights')}: "
                      f"{rec['outcome']}, peak RSS {run['pressure'].get('peak_rss_kb', 0) / 1024:.0f} MiB — "
                      f"{lmkd[0][:170]}")
        print("\noutcomes (device, budget): " + "; ".join(f"{d} {b}: {','.join(o)}" for (d, b), o in sorted(table.items())))
        slowest = max(per_device.values())
        print(f"campaign wall {wall:.0f} s; per-device totals " +
              ", ".join(f"{d} {s:.0f} s" for d, s in sorted(per_device.items())) +
              f"; wall / slowest device = {wall / slowest:.2f}")

        # ---- 2. a phone lost mid-campaign, then back -------------------------------------------
        camp2 = root / "lossy.toml"
        campaign_toml(camp2, model, ["virtual:p3g", "virtual:p4g"], port, home, ["0", "cycle*1.2"], 2, args.tokens)
        out2 = root / "lossy-out"

        def stop_p3g_after_first_run() -> None:
            while not (out2 / "ledger.jsonl").exists() or not records(out2):
                time.sleep(0.5)
            fleet("virtual", "down", "p3g", "--home", str(home), env=env)

        killer = threading.Thread(target=stop_p3g_after_first_run)
        killer.start()
        fleet("run", str(camp2), "-o", str(out2), env=env, check=False)
        killer.join()
        first = records(out2)
        print("\nwith p3g stopped after the first run: " + ", ".join(
            f"{run_json(out2, r)['device']}:{r['outcome']}{'' if was_attempted(r) else ' (not attempted)'}"
            for r in first))
        fleet("virtual", "up", "--name", "p3g", "--ram", PHONES["p3g"][0], "--model", PHONES["p3g"][1],
              "--home", str(home), env=env)
        fleet("run", str(camp2), "-o", str(out2), env=env, check=False)
        second = records(out2)[len(first):]
        print("rerun after bringing p3g back ran: " + ", ".join(
            f"{run_json(out2, r)['device']}:{r['outcome']}" for r in second))
        lines = first + second
        unrun = sum(1 for r in lines if not was_attempted(r))
        print(f"ledger: {len(lines)} lines: {len(lines) - unrun} attempts, {unrun} cells recorded not attempted")
        print(fleet("status", str(out2), env=env, check=False).stdout.strip())
    finally:
        fleet("virtual", "down", "--all", "--home", str(home), env=env, check=False)
        subprocess.run([adb_binary(), "-P", str(port), "kill-server"], env=env, capture_output=True)


if __name__ == "__main__":
    main()
