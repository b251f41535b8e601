"""Benchmark pushing a model to a phone: bmoe-fleet's push vs the `adb push` CLI, and the skip.

    .venv/bin/python benchmarks/bench_push.py [--size 1GiB] [--dir /var/tmp]

Starts its own adb server (the real binary from the adbutils wheel) on a free port and one
virtual phone, writes a synthetic model of --size, then times:
  1. AdbPhone.push of the new file (sync SEND in 64 KiB DATA chunks),
  2. `adb push` of the same file to another path (the peer),
  3. AdbPhone.push again, unchanged: compares size + sha256 on both sides and sends nothing,
  4. AdbPhone.push after one byte changed: re-sent.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devices.adb.phone import AdbPhone
from devices.adb.server import AdbServer, adb_binary
from devices.virtual import manager
from engine.gguf.synth import synth_options, write_model
from engine.units import parse_bytes

MIB = 1 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()
    port = free_port()
    env = dict(os.environ, ANDROID_ADB_SERVER_PORT=str(port), ADB_MDNS="0")
    adb = [adb_binary(), "-P", str(port)]
    subprocess.run(adb + ["start-server"], check=True, env=env, capture_output=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        home = os.path.join(tmp, "phones")
        try:
            serial = manager.up("pushbench", 1 << 30, home=home, adb_host="127.0.0.1", adb_port=port)
            phone = AdbPhone(serial, AdbServer("127.0.0.1", port))
            model = os.path.join(tmp, "model.gguf")
            write_model(model, synth_options("gpt-oss", size_bytes=parse_bytes(args.size)))
            size_mib = os.path.getsize(model) / MIB
            remote = "/data/local/tmp/bmoe/model.gguf"

            t0 = time.perf_counter()
            sent = phone.push(model, remote)
            ours = time.perf_counter() - t0
            t0 = time.perf_counter()
            subprocess.run(adb + ["-s", serial, "push", model, "/data/local/tmp/bmoe/cli.gguf"], check=True, env=env,
                           capture_output=True)
            cli = time.perf_counter() - t0
            t0 = time.perf_counter()
            skipped = not phone.push(model, remote)
            skip_s = time.perf_counter() - t0
            with open(model, "r+b") as fh:
                fh.seek(-1, os.SEEK_END)
                last = fh.read(1)
                fh.seek(-1, os.SEEK_END)
                fh.write(bytes([last[0] ^ 0xFF]))
            t0 = time.perf_counter()
            resent = phone.push(model, remote)
            resend_s = time.perf_counter() - t0
            print(f"file      {size_mib:,.0f} MiB to virtual phone {serial}")
            print(f"push      bmoe-fleet {size_mib / ours:7.1f} MiB/s ({ours:.1f} s, sent={sent}); "
                  f"adb push CLI {size_mib / cli:7.1f} MiB/s ({cli:.1f} s); ratio {cli / ours:.2f}")
            print(f"unchanged skipped={skipped} in {skip_s:.1f} s (size + sha256 on both sides; 0 bytes sent)")
            print(f"changed   re-sent={resent} in {resend_s:.1f} s")
        finally:
            manager.down(all_phones=True, home=home, adb_host="127.0.0.1", adb_port=port)
            subprocess.run(adb + ["kill-server"], env=env, capture_output=True)


if __name__ == "__main__":
    main()
