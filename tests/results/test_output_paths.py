"""Every output option writes where the user points it (docs/decisions/output-formats.md): `-o /dev/stdout` prints,
`--csv /dev/full` is refused in one line (a device is no output file) and leaves /dev/full a device,
`-o link.json` replaces the link with the output and leaves the link's target as it was.

The commands run as root in a private mount namespace whose /dev is a fresh tmpfs holding only
the nodes they need (null, zero, full, random, urandom; stdout, stderr, stdin and fd as the links
the host has). A write that wrongly replaced /dev/stdout or /dev/full replaces a node of that
tmpfs, gone with the namespace; the host's /dev is compared before and after all the same.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.results.conftest import PROJECT, UPSTREAM

HOST_DEV = ("/dev/stdout", "/dev/stderr", "/dev/stdin", "/dev/fd", "/dev/full", "/dev/null")

CHILD = r'''
import json, os, stat, subprocess, sys
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "bmoe-test-dev", "/dev"], check=True)
for name, minor in (("null", 3), ("zero", 5), ("full", 7), ("random", 8), ("urandom", 9)):
    os.mknod("/dev/" + name, stat.S_IFCHR | 0o666, os.makedev(1, minor))
for name, to in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                 ("stderr", "/proc/self/fd/2")):
    os.symlink(to, "/dev/" + name)
os.mkdir("/dev/shm")
work, campaign, trace = sys.argv[1:4]
def fleet(*args):
    done = subprocess.run([sys.executable, "-c", "from harness.cli.main import main; main()", *args], cwd=work,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    return {"rc": done.returncode, "out": done.stdout, "err": done.stderr}
results = {
    "recommend": fleet("recommend", campaign, "--format", "json", "-o", "/dev/stdout"),
    "community": fleet("report", campaign, "--format", "community", "--json", "-o", "/dev/stdout"),
    "replay": fleet("replay", trace, "--csv", "/dev/stdout"),
    "full": fleet("replay", trace, "--csv", "/dev/full"),
    "link": fleet("recommend", campaign, "--format", "json", "-o", "link.json"),
}
results["dev"] = {name: [os.readlink("/dev/" + name) if os.path.islink("/dev/" + name) else None,
                         stat.S_IFMT(os.lstat("/dev/" + name).st_mode)]
                  for name in ("stdout", "full", "null")}
results["dev_listing"] = sorted(os.listdir("/dev"))
print(json.dumps(results))
'''


def _host_dev() -> dict[str, tuple]:
    out = {}
    for p in HOST_DEV:
        st = os.lstat(p)
        out[p] = (st.st_ino, st.st_mode, st.st_rdev, os.readlink(p) if os.path.islink(p) else None)
    return out


@pytest.mark.root("mounts over /dev in a private mount namespace")
def test_outputs_print_to_dev_stdout_fail_on_dev_full_and_follow_a_link_in_a_private_mount_namespace(
        imported, tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("mount"):
        pytest.skip("needs root and unshare(1)/mount(8) for a private mount namespace over /dev")
    work = tmp_path / "work"
    work.mkdir()
    (work / "real").mkdir()
    (work / "real" / "recs.json").write_text("old\n")
    (work / "link.json").symlink_to("real/recs.json")
    trace = UPSTREAM / "2026-07-15-route-trace" / "gptoss.route.csv"
    before = _host_dev()
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-c", CHILD,
                           str(work), str(imported), str(trace)], capture_output=True, text=True, timeout=600,
                          cwd=PROJECT, stdin=subprocess.DEVNULL)
    assert _host_dev() == before, "the host's /dev changed"
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)

    rec = got["recommend"]
    assert rec["rc"] == 0, rec
    assert json.loads(rec["out"][:rec["out"].rindex("}") + 1])     # the recommendations themselves, on stdout
    assert got["community"]["rc"] == 0 and got["community"]["out"].lstrip().startswith(("{", "[")), got["community"]
    replay = got["replay"]
    assert replay["rc"] == 0 and "budget_mib,policy,hit_pct_cum,hit_pct_decode,read_mib" in replay["out"], replay
    full = got["full"]
    assert full["rc"] == 1 and full["out"] == "", full
    (line,) = full["err"].strip().splitlines()
    assert line.startswith("Error: ") and "/dev/full" in line and "is a character device, not a file" in line, line
    assert got["link"]["rc"] == 0, got["link"]
    # the namespace's own /dev: still the links and devices it was, nothing added beside them
    assert got["dev"] == {"stdout": ["/proc/self/fd/1", 0o120000], "full": [None, 0o020000],
                          "null": [None, 0o020000]}, got["dev"]
    assert got["dev_listing"] == ["fd", "full", "null", "random", "shm", "stderr", "stdin", "stdout", "urandom",
                                  "zero"]
    # -o link.json: the link is replaced by the recommendations, its target left as it was
    assert not os.path.islink(work / "link.json") and json.loads((work / "link.json").read_text())
    assert (work / "real" / "recs.json").read_text() == "old\n"
    assert sorted(os.listdir(work)) == ["link.json", "real"] and os.listdir(work / "real") == ["recs.json"]
