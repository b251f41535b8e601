"""Benchmark a native (bmoe-cli) sweep on a virtual phone against the same bmoe-cli alone on this host.

    BMOE_CLI=…/bmoe-cli .venv/bin/python benchmarks/bench_native.py [--model tiny.gguf] [-t 1] [--runs 5] [-n 128]

Starts its own adb server (the real binary from the adbutils wheel) on a free port and one
virtual phone (1 GiB), then:
  1. runs a campaign with engine.native.host = BMOE_CLI on the phone: `--runs` repeats of one
     streamed cell (cache 0 by default), -t as given — threads that fit this host's cores, since a
     virtual phone runs on them (-t above the free cores makes ggml's pool spin: CONTRIBUTING.md);
  2. runs the same bmoe-cli directly on this host `--runs` times with the phone cells' own flags,
     on the phone's staged copy of the model as this host sees it (same bytes, same filesystem:
     only where the process runs differs);
and prints the median decode s/token of each (1 / the CSV summary's tok/s), and phone / host.
Target: the ratio is at most 2. The two sides alternate run by run, so a change in
the machine's load touches both. Quote it with what else was running.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devices.adb.server import adb_binary, free_server_port  # noqa: E402
from devices.virtual import manager  # noqa: E402
from engine.units import GIB  # noqa: E402
from harness.campaign.file import parse_campaign  # noqa: E402
from harness.run.runner import run_campaign  # noqa: E402
from results.read.parse import read_metrics_csv  # noqa: E402
from store.outcomes import OK  # noqa: E402

PEER = ROOT.parent / "shared"
DEFAULT_CLI = PEER / "peer/bmoe-cli-0.19.0-linux-x86_64/bmoe-cli"
DEFAULT_MODEL = PEER / "upstream-data/host-v2-0.19.0/tiny-qwen3moe.gguf"
PHONE = "nativebench"


def s_per_token(csv_path: Path) -> float:
    summary = read_metrics_csv(csv_path).summary
    if summary is None:
        raise SystemExit(f"{csv_path}: no summary line (the run did not finish)")
    return 1.0 / float(summary["tok/s"])   # s/tok is printed to 1 ms; tok/s keeps the digits


def phone_run(campaign_data: dict, out: Path) -> tuple[float, list[str]]:
    """One campaign run of one cell on the phone: its s/token and argv."""
    run_campaign(parse_campaign(campaign_data, source="bench_native"), out, progress_stream=io.StringIO())
    latest = max(out.glob("runs/*/*/run.json"), key=lambda p: json.loads(p.read_text())["started_at"])
    record = json.loads(latest.read_text())
    if record["outcome"] != OK:
        raise SystemExit(f"the phone run ended {record['outcome']}: {record['evidence']}")
    return s_per_token(latest.parent / "metrics.csv"), record["argv"]


def host_run(cli: Path, model: Path, phone_argv: list[str], csv_path: Path) -> float:
    """The phone cell's command line, run by this host's bmoe-cli on this host's model file."""
    argv = [str(cli)] + list(phone_argv[1:])
    argv[argv.index("-m") + 1] = str(model)
    argv[argv.index("--csv") + 1] = str(csv_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BMOE_")}
    done = subprocess.run(argv, env=env, capture_output=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"bmoe-cli on this host: exit {done.returncode}: {done.stderr.decode()[-500:]}")
    return s_per_token(csv_path)


@contextlib.contextmanager
def private_phone(tmp_path: Path, name: str):
    """A private adb server on a free port with one 1 GiB virtual phone; (port, phones' home)."""
    port = free_server_port()
    env = dict(os.environ, ANDROID_ADB_SERVER_PORT=str(port), ADB_MDNS="0")
    adb = [adb_binary(), "-P", str(port)]
    subprocess.run(adb + ["start-server"], check=True, env=env, capture_output=True)
    os.environ["ANDROID_ADB_SERVER_PORT"] = str(port)
    home = tmp_path / "phones"
    try:
        manager.up(name, GIB, home=home, adb_host="127.0.0.1", adb_port=port)
        yield port, home
    finally:
        manager.down(all_phones=True, home=home, adb_host="127.0.0.1", adb_port=port)
        subprocess.run(adb + ["kill-server"], env=env, capture_output=True)


def report(args, argv: list[str], phone_s: list[float], host_s: list[float]) -> None:
    def runs(xs: list[float]) -> str:
        return f"median {statistics.median(xs):.5f} s/token  (runs: {', '.join(f'{x:.5f}' for x in xs)})"

    version = subprocess.run([str(args.cli), "--version"], capture_output=True, text=True).stdout.strip()
    ratio = statistics.median(phone_s) / statistics.median(host_s)
    print(f"engine    {args.cli} ({version})")
    print(f"model     {args.model.name}, -n {args.n_predict}, -t {args.threads}, --cache-mb {args.cache_mb}, "
          f"{args.runs} runs each, alternating; this host has {os.cpu_count()} cores")
    print(f"phone     flags: {' '.join(argv[3:])}")
    print(f"phone     {runs(phone_s)}")
    print(f"host      {runs(host_s)}")
    print(f"ratio     phone / host = {ratio:.2f} (target <= 2): {'met' if ratio <= 2 else 'NOT met'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", type=Path, default=Path(os.environ.get("BMOE_CLI") or DEFAULT_CLI))
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cache-mb", default="0")
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()
    for path, what in ((args.cli, "bmoe-cli (--cli or BMOE_CLI)"), (args.model, "model (--model)")):
        if not path.is_file():
            raise SystemExit(f"no {what} at {path}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        tmp_path = Path(tmp)
        os.environ["BMOE_FLEET_HOME"] = str(tmp_path / "fleet-home")
        with private_phone(tmp_path, PHONE) as (port, home):
            phone_s, host_s = [], []
            for i in range(args.runs):
                data = {"version": 1, "name": f"bench-{i}",
                        "fleet": {"devices": [f"virtual:{PHONE}"], "virtual_home": str(home),
                                  "adb": [{"host": "127.0.0.1", "port": port}]},
                        "models": {"model": str(args.model.resolve())},
                        "engine": {"kind": "native", "native": {"host": {"cli": str(args.cli.resolve())}}},
                        "axes": {"cache_mb": [args.cache_mb]},
                        "run": {"n_predict": args.n_predict, "threads": args.threads},
                        "gate": {"max_wait_s": 5}}
                s, argv = phone_run(data, tmp_path / f"camp-{i}")
                phone_s.append(s)
                # the phone's own copy of the model, seen from this host: same bytes, same filesystem
                staged = home / PHONE / argv[argv.index("-m") + 1].lstrip("/")
                host_s.append(host_run(args.cli, staged, argv, tmp_path / f"host-{i}.csv"))
            report(args, argv, phone_s, host_s)


if __name__ == "__main__":
    main()
