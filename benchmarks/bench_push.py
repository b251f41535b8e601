"""Benchmark pushing a model to a phone: bmoe-fleet's push vs the `adb push` CLI, and the skip.

    .venv/bin/python benchmarks/bench_push.py [--size 1GiB] [--dir /var/tmp] [--sparse] [--no-cli]

Starts its own adb server (the real binary from the adbutils wheel) on a free port and one
virtual phone, writes a synthetic model of --size (with --sparse: a file of zeros made with
truncate, nothing written here, though every byte still crosses adb: how a 5 GiB model, past
sync STAT v1's 32-bit size, is pushed without 5 GiB of synthesis), then times, counting the bytes
each push sends (its progress callback):
  1. AdbPhone.push of the new file (room checked with df, sync SEND in 64 KiB DATA chunks, the
     copy's size and sha256 verified on the phone, renamed into place, stamped); the verification
     is timed again alone (sha256sum reads the whole copy on the phone),
  2. `adb push` of the same file to another path (the peer; --no-cli skips it),
  3. AdbPhone.push again, unchanged: its size (`stat`, 64-bit) and stamped sha256 match, 0 bytes sent,
  4. AdbPhone.push after one byte changed: re-sent.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devices.adb.phone import AdbPhone
from devices.adb.server import AdbServer, adb_binary, free_server_port
from devices.virtual import manager
from engine.gguf.synth import synth_options, write_model
from engine.units import GIB, MIB, parse_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--sparse", action="store_true", help="a sparse file of zeros instead of a synthetic model")
    ap.add_argument("--no-cli", action="store_true", help="skip the `adb push` CLI comparison")
    args = ap.parse_args()
    port = free_server_port()
    env = dict(os.environ, ANDROID_ADB_SERVER_PORT=str(port), ADB_MDNS="0")
    adb = [adb_binary(), "-P", str(port)]
    subprocess.run(adb + ["start-server"], check=True, env=env, capture_output=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        home = os.path.join(tmp, "phones")
        try:
            serial = manager.up("pushbench", GIB, home=home, adb_host="127.0.0.1", adb_port=port)
            phone = AdbPhone(serial, AdbServer("127.0.0.1", port))
            model = os.path.join(tmp, "model.gguf")
            if args.sparse:
                with open(model, "wb") as fh:
                    fh.truncate(parse_bytes(args.size))
            else:
                write_model(model, synth_options("gpt-oss", size_bytes=parse_bytes(args.size)))
            size_mib = os.path.getsize(model) / MIB
            remote = "/data/local/tmp/bmoe/model.gguf"
            counted = [0]

            def count(done: int, _total: int) -> None:
                counted[0] = done

            def push() -> tuple[bool, int, float]:
                counted[0] = 0
                t0 = time.perf_counter()
                pushed = phone.push(model, remote, progress=count)
                return pushed, counted[0], time.perf_counter() - t0

            sent, sent_bytes, ours = push()
            cli = float("nan")
            if not args.no_cli:
                t0 = time.perf_counter()
                subprocess.run(adb + ["-s", serial, "push", model, "/data/local/tmp/bmoe/cli.gguf"], check=True,
                               env=env, capture_output=True)
                cli = time.perf_counter() - t0
            t0 = time.perf_counter()
            phone.verify_copy(model, remote)          # what the push's own check of its copy costs
            verify_s = time.perf_counter() - t0
            pushed_again, again_bytes, skip_s = push()
            skipped = not pushed_again
            with open(model, "r+b") as fh:
                fh.seek(-1, os.SEEK_END)
                last = fh.read(1)
                fh.seek(-1, os.SEEK_END)
                fh.write(bytes([last[0] ^ 0xFF]))
            resent, resent_bytes, resend_s = push()
            print(f"file      {size_mib:,.0f} MiB ({os.path.getsize(model):,} bytes{', sparse' if args.sparse else ''}) "
                  f"to virtual phone {serial}")
            print(f"push      bmoe-fleet {size_mib / ours:7.1f} MiB/s ({ours:.1f} s, sent={sent}, {sent_bytes:,} bytes "
                  "sent, verified on the phone)" + ("" if args.no_cli else
                                                   f"; adb push CLI {size_mib / cli:7.1f} MiB/s ({cli:.1f} s); "
                                                   f"ratio {cli / ours:.2f}"))
            print(f"verify    {verify_s:.1f} s of the push's time: the copy's size and sha256sum on the phone "
                  f"({size_mib / verify_s:,.0f} MiB/s)")
            print(f"unchanged skipped={skipped} in {skip_s:.1f} s ({again_bytes:,} bytes sent: size and stamp matched)")
            print(f"changed   re-sent={resent} in {resend_s:.1f} s ({resent_bytes:,} bytes sent)")
        finally:
            manager.down(all_phones=True, home=home, adb_host="127.0.0.1", adb_port=port)
            subprocess.run(adb + ["kill-server"], env=env, capture_output=True)


if __name__ == "__main__":
    main()
