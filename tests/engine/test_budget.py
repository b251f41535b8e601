"""engine/stream/budget.py: bmoe-cli 0.19.0's cache flags, refusals, `auto` sizing and the cycle guard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from engine.gguf.model import load_model_shape
from engine.stream.budget import (
    CACHE_MIN_MB,
    AvailableMemory,
    CacheFlags,
    ConfigError,
    auto_budget,
    available_memory,
    cgroup_headroom_bytes,
    cycle_warning,
    mem_available_from_meminfo,
    resolve_budget,
    validate,
)
from engine.units import MIB

PROJECT = Path(__file__).parents[2]
UPSTREAM = PROJECT / "tests" / "fixtures" / "upstream" / "host-v2-0.19.0"
TINY = UPSTREAM / "tiny-qwen3moe.gguf"

BAND_1000 = (
    "config error: moe.cache_mb=1000 is in the pathological band (< 1500 MiB): a cache smaller than one "
    "token's routed working set thrashes and is slower than no cache. Use 0 to disable the cache, a value "
    ">= 1500, or set force_cache to override."
)


def refusal(flags: CacheFlags) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        validate(flags)
    assert info.value.exit_status == 1
    return info.value


# ---- refusals -------------------------------------------------------------------------------
def test_the_pathological_band_is_refused_with_bmoe_clis_exact_text():
    err = refusal(CacheFlags(cache_mb=1000))
    assert err.line == BAND_1000
    assert err.line == (UPSTREAM / "bad.err").read_text().rstrip("\n")


@pytest.mark.parametrize(
    "flags, text",
    [
        (CacheFlags(cache_mb=1), "moe.cache_mb=1 is in the pathological band (< 1500 MiB): "),
        (CacheFlags(cache_mb=1499), "moe.cache_mb=1499 is in the pathological band (< 1500 MiB): "),
        (CacheFlags(cache_mb=-1), "moe.cache_mb must be >= 0"),
        (CacheFlags(io_threads=0), "moe.io_threads must be in [1, 8]"),
        (CacheFlags(io_threads=9), "moe.io_threads must be in [1, 8]"),
        (CacheFlags(prefetch_layers=9, cache_mb=2000), "moe.prefetch_layers must be in [0, 8]"),
        (
            CacheFlags(cache_mb=2000, cache_auto=True),
            "moe.cache_auto and an explicit moe.cache_mb are mutually exclusive: choose auto-sizing "
            "(cache_mb = 0, cache_auto) or a fixed budget (cache_mb > 0).",
        ),
        (CacheFlags(cache_auto=True, cache_floor_mb=-1), "moe.cache_floor_mb must be >= 0"),
        (CacheFlags(cache_auto=True, cache_ceil_mb=-1), "moe.cache_ceil_mb must be >= 0 (0 = no explicit ceiling)"),
        (
            CacheFlags(prefetch_layers=2),
            "moe.prefetch_layers requires the LRU cache (cache_mb > 0 or cache_auto): speculative reads land "
            "in the per-layer cache buffers, which do not exist with the cache off.",
        ),
    ],
)
def test_each_refused_combination(flags, text):
    err = refusal(flags)
    assert str(err).startswith(text) and err.line == f"config error: {err}"


def test_refusals_come_in_bmoe_clis_order():
    # auto with a number in the band: the band check runs first, exactly as validate() is written.
    assert "pathological band" in str(refusal(CacheFlags(cache_mb=1000, cache_auto=True)))
    # --force-cache admits the band, which then exposes the auto conflict.
    assert "mutually exclusive" in str(refusal(CacheFlags(cache_mb=1000, cache_auto=True, force_cache=True)))
    assert "io_threads" in str(refusal(CacheFlags(io_threads=0, cache_mb=5)))


def test_legal_combinations_pass():
    for flags in (
        CacheFlags(),
        CacheFlags(cache_mb=CACHE_MIN_MB),  # exactly cache_min_mb needs no --force-cache
        CacheFlags(cache_mb=1000, force_cache=True),
        CacheFlags(cache_auto=True, prefetch_layers=8),  # auto is a real LRU cache
        CacheFlags(cache_mb=1500, prefetch_layers=1, io_threads=8),
        CacheFlags(moe_stream=False, cache_mb=1000, io_threads=99, prefetch_layers=3),  # all ignored
    ):
        validate(flags)


# ---- auto sizing ----------------------------------------------------------------------------
def test_auto_reproduces_the_upstream_run_on_the_tiny_model():
    shape = load_model_shape(TINY)
    dense = sum(t.nbytes for t in shape.dense_tensors)
    lines = [ln for ln in (UPSTREAM / "tiny_auto.err").read_text().splitlines() if ln.startswith("bmoe: cache auto")]
    assert lines == [
        "bmoe: cache auto — reserving 1 MiB for the dense-weight conversion",
        "bmoe: cache auto — 23807 MiB available, leaving 1536 MiB free → 6 MiB budget (cap 6 MiB)",
    ]
    # That run passed --cache-ceil-mb 3000 (its CSV preamble says so) under the default anon mode.
    flags = CacheFlags(cache_auto=True, cache_ceil_mb=3000)
    b = resolve_budget(flags, shape, top_k=2, available=AvailableMemory(23807 * MIB + dense, None))
    assert list(b.auto_messages) == lines and b.warning is None
    assert b.budget_bytes == shape.expert_bytes == 6 * MIB and b.cache_mb == 6
    assert b.dense_reserved_bytes == dense and b.available_bytes == 23807 * MIB
    assert (b.cache_auto, b.cache_floor_mb, b.cache_ceil_mb, b.force_cache) == (True, 1536, 3000, False)


def test_auto_line_without_a_ceiling_prints_the_expert_bank_as_the_cap():
    a = auto_budget(total_expert_bytes=60_000 * MIB, available_bytes=9_000 * MIB)
    assert a.messages == (
        "bmoe: cache auto — 9000 MiB available, leaving 1536 MiB free → 7464 MiB budget (cap 60000 MiB)",
    )
    assert a.budget_bytes == 7464 * MIB and a.cap_bytes == 60_000 * MIB


@pytest.mark.parametrize(
    "total_mb, avail_mb, floor_mb, ceil_mb, budget_mb, cap_mb",
    [
        (60_000, 9_000, 1536, 3000, 3000, 3000),  # the ceiling binds
        (60_000, 2_500, 1536, 0, 1500, 60_000),  # avail − floor = 964 → raised to cache_min_mb
        (60_000, 1_000, 1536, 0, 1500, 60_000),  # avail below the floor → still cache_min_mb
        (60_000, 9_000, 1536, 1000, 1000, 1000),  # a ceiling under 1500 lowers the minimum with it
        (800, 9_000, 1536, 0, 800, 800),  # never more than the whole expert bank
        (800, 1_000, 1536, 0, 800, 800),  # ... even when the minimum would ask for more
        (60_000, 9_000, 0, 0, 9_000, 60_000),
    ],
)
def test_auto_clamps(total_mb, avail_mb, floor_mb, ceil_mb, budget_mb, cap_mb):
    a = auto_budget(total_mb * MIB, avail_mb * MIB, floor_mb, ceil_mb)
    assert (a.budget_bytes, a.cap_bytes) == (budget_mb * MIB, cap_mb * MIB)
    assert a.messages[-1].endswith(f"→ {budget_mb} MiB budget (cap {cap_mb} MiB)")


def test_auto_with_unknown_memory_uses_the_floor():
    a = auto_budget(60_000 * MIB, None)
    assert a.budget_bytes == 1500 * MIB and a.available_bytes is None
    assert a.messages == ("bmoe: cache auto — available memory unknown, using the 1500 MiB floor",)
    assert auto_budget(700 * MIB, None).budget_bytes == 700 * MIB  # min(1500, cap)


def test_dense_reservation_rules():
    # Only tensors that fit in what is available are converted, so only they are reserved.
    a = auto_budget(60_000 * MIB, 8_000 * MIB, dense_tensor_bytes=[500 * MIB, 1 * MIB, 9_000 * MIB])
    assert a.dense_reserved_bytes == 501 * MIB
    assert a.messages[0] == "bmoe: cache auto — reserving 501 MiB for the dense-weight conversion"
    assert a.messages[1].startswith("bmoe: cache auto — 7499 MiB available, leaving 1536 MiB free → 5963 MiB")
    shape = load_model_shape(TINY)
    avail = AvailableMemory(4000 * MIB, None)
    for mode, reserved in (("anon", True), ("ahwb", True), ("warm", False), ("mmap", False)):
        b = resolve_budget(CacheFlags(cache_auto=True, dense_weights=mode), shape, 2, avail)
        assert (b.dense_reserved_bytes > 0) == reserved, mode
        assert len(b.auto_messages) == (2 if reserved else 1)


def test_fixed_budget_and_streaming_off():
    shape = load_model_shape(TINY)
    b = resolve_budget(CacheFlags(cache_mb=1500), shape, 2, AvailableMemory(None, None))
    assert b.budget_bytes == 1500 * MIB and b.messages == () and not b.cache_auto
    off = resolve_budget(CacheFlags(moe_stream=False, cache_mb=1000, cache_auto=True), shape, 2)
    assert off.budget_bytes == 0 and not off.cache_auto and off.messages == ()
    with pytest.raises(ConfigError):
        resolve_budget(CacheFlags(cache_mb=1000), shape, 2)


# ---- the cycle guard ------------------------------------------------------------------------
def test_cycle_warning_text_and_rounding():
    gpt_oss_k4 = 13_219_200 * 36 * 4  # 1815.4 MiB: reported rounded UP, as upstream's preamble does
    assert cycle_warning(1500 * MIB, gpt_oss_k4, 4) == (
        "bmoe: WARNING expert cache 1500 MiB is below this model's worst-case token cycle of 1816 MiB\n"
        "at top-k 4 — no entry can survive to the next token, so expect a hit rate near zero."
    )
    assert cycle_warning(1816 * MIB, gpt_oss_k4, 4) is None
    assert cycle_warning(1815 * MIB + MIB // 2, gpt_oss_k4, 4) is not None  # 1815 MiB whole < 1816
    assert cycle_warning(0, gpt_oss_k4, 4) is None  # cache off: nothing to warn about
    assert cycle_warning(MIB // 2, gpt_oss_k4, 4) is None  # under 1 MiB is cache_mb 0 upstream
    assert cycle_warning(1500 * MIB, 13_219_200 * 36 * 2, 2) is None  # 908 MiB at top-k 2


def test_the_record_prices_the_cycle_at_the_applied_top_k():
    shape = load_model_shape(TINY)  # 4 layers × 196608 B per expert
    flags = CacheFlags(cache_mb=2, force_cache=True)
    at2 = resolve_budget(flags, shape, 2)
    assert at2.cycle_bytes == 4 * 196_608 * 2 and at2.cache_cycle_mb == 2 and at2.warning is None
    at8 = resolve_budget(flags, shape, 8)
    assert at8.cache_cycle_mb == 6
    assert at8.messages == (
        "bmoe: WARNING expert cache 2 MiB is below this model's worst-case token cycle of 6 MiB\nat top-k 8 — "
        "no entry can survive to the next token, so expect a hit rate near zero.",
    )


# ---- available memory -----------------------------------------------------------------------
MEMINFO = "MemTotal:       11534336 kB\nMemFree:          812344 kB\nMemAvailable:    6291456 kB\nBuffers: 1 kB\n"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_meminfo_parsing(tmp_path):
    assert mem_available_from_meminfo(MEMINFO) == 6_291_456 * 1024
    assert mem_available_from_meminfo("MemTotal: 5 kB\n") is None
    write(tmp_path / "meminfo", MEMINFO)
    fake = available_memory(str(tmp_path / "meminfo"), str(tmp_path / "none"), str(tmp_path / "none"))
    assert fake == AvailableMemory(6 * 1024 * MIB, None) and fake.bytes == 6 * 1024 * MIB
    a = auto_budget(60_000 * MIB, fake.bytes)
    assert a.messages[0] == (
        "bmoe: cache auto — 6144 MiB available, leaving 1536 MiB free → 4608 MiB budget (cap 60000 MiB)"
    )


def test_cgroup_v2_takes_the_tightest_ancestor_and_counts_file_pages(tmp_path):
    root = tmp_path / "sys" / "fs" / "cgroup"
    write(tmp_path / "cgroup", "0::/phones/p1/engine\n")
    write(tmp_path / "mountinfo", f"30 23 0:26 / {root} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")
    write(root / "phones" / "memory.max", f"{4096 * MIB}\n")
    write(root / "phones" / "memory.current", f"{1024 * MIB}\n")
    write(root / "phones" / "memory.stat", "anon 1\ninactive_file 0\nactive_file 0\n")
    write(root / "phones" / "p1" / "memory.max", f"{2048 * MIB}\n")
    write(root / "phones" / "p1" / "memory.high", "max\n")
    write(root / "phones" / "p1" / "memory.current", f"{1500 * MIB}\n")
    write(root / "phones" / "p1" / "memory.stat", f"anon 5\ninactive_file {300 * MIB}\nactive_file {100 * MIB}\n")
    write(root / "phones" / "p1" / "engine" / "memory.max", "max\n")
    write(root / "phones" / "p1" / "engine" / "memory.current", f"{10 * MIB}\n")
    # p1: 2048 − 1500 + 400 file = 948 MiB; phones: 3072; engine: no limit → 948
    headroom = cgroup_headroom_bytes(str(tmp_path / "cgroup"), str(tmp_path / "mountinfo"))
    assert headroom == 948 * MIB
    write(root / "phones" / "p1" / "memory.high", f"{1600 * MIB}\n")  # high binds before max
    assert cgroup_headroom_bytes(str(tmp_path / "cgroup"), str(tmp_path / "mountinfo")) == 500 * MIB
    write(tmp_path / "meminfo", MEMINFO)
    both = available_memory(str(tmp_path / "meminfo"), str(tmp_path / "cgroup"), str(tmp_path / "mountinfo"))
    assert both.bytes == 500 * MIB < both.mem_available_bytes


def test_cgroup_v1_reads_the_memory_hierarchy(tmp_path):
    mem = tmp_path / "cg" / "memory"
    write(tmp_path / "cgroup", "9:name=systemd:/\n4:memory:/box/run\n0::/\n")
    write(
        tmp_path / "mountinfo",
        f"31 23 0:28 / {tmp_path / 'cg'} rw - tmpfs tmpfs rw\n"
        f"35 31 0:32 / {mem} rw,relatime - cgroup cgroup rw,memory\n",
    )
    write(mem / "memory.limit_in_bytes", "9223372036854771712\n")  # the root: unlimited
    write(mem / "memory.usage_in_bytes", f"{9000 * MIB}\n")
    write(mem / "box" / "memory.limit_in_bytes", f"{3000 * MIB}\n")
    write(mem / "box" / "memory.usage_in_bytes", f"{2900 * MIB}\n")
    stat = f"inactive_file 1\ntotal_inactive_file {200 * MIB}\ntotal_active_file {50 * MIB}\n"
    write(mem / "box" / "memory.stat", stat)  # hierarchical totals win over the local counts
    write(mem / "box" / "run" / "memory.limit_in_bytes", "9223372036854771712\n")
    write(mem / "box" / "run" / "memory.usage_in_bytes", f"{100 * MIB}\n")
    assert cgroup_headroom_bytes(str(tmp_path / "cgroup"), str(tmp_path / "mountinfo")) == 350 * MIB
    write(mem / "box" / "memory.limit_in_bytes", "9223372036854771712\n")
    assert cgroup_headroom_bytes(str(tmp_path / "cgroup"), str(tmp_path / "mountinfo")) is None
    assert cgroup_headroom_bytes(str(tmp_path / "nope"), str(tmp_path / "mountinfo")) is None


# ---- for real, in a memory cgroup -----------------------------------------------------------
def _memory_controller() -> tuple[str, Path]:
    """('v1'|'v2', directory under which a test cgroup with a memory limit can be made)."""
    cgroup_lines = Path("/proc/self/cgroup").read_text().splitlines()
    mounts = [ln.split(" - ") for ln in Path("/proc/self/mountinfo").read_text().splitlines() if " - " in ln]
    for pre, post in mounts:
        fstype, _src, opts = post.split()[:3]
        point = Path(pre.split()[4])
        if fstype == "cgroup" and "memory" in opts.split(","):
            own = next(ln.split(":", 2)[2] for ln in cgroup_lines if "memory" in ln.split(":", 2)[1].split(","))
            return "v1", point / own.lstrip("/")
    for pre, post in mounts:
        point = Path(pre.split()[4])
        if post.split()[0] == "cgroup2" and "memory" in (point / "cgroup.controllers").read_text().split():
            # The v2 root may hold processes and still delegate controllers; our own cgroup may not.
            control = point / "cgroup.subtree_control"
            if "memory" not in control.read_text().split():
                control.write_text("+memory")
            return "v2", point
    raise AssertionError("no writable memory cgroup controller (v1 or v2) is mounted")


CHILD = """
import json, sys
from pathlib import Path
Path(sys.argv[1], "cgroup.procs").write_text(str(__import__("os").getpid()))
from engine.stream.budget import auto_budget, available_memory
from engine.units import MIB
am = available_memory()
auto = auto_budget(64 * 1024 * MIB, am.bytes, cache_floor_mb=64)
print(json.dumps({"mem": am.mem_available_bytes, "cg": am.cgroup_headroom_bytes, "avail": am.bytes,
                  "budget": auto.budget_bytes, "line": auto.messages[-1],
                  "cgroup": Path("/proc/self/cgroup").read_text()}))
"""


@pytest.mark.root("makes a memory cgroup")
def test_auto_inside_a_real_memory_cgroup_sizes_from_the_cgroup_limit():
    assert os.geteuid() == 0, "this test creates a memory cgroup and must run as root"
    version, parent = _memory_controller()
    limit = 2048 * MIB
    outer = parent / f"bmoe-budget-test-{uuid.uuid4().hex[:8]}"
    inner = outer / "engine"  # unlimited itself: the limit must be found on its ancestor
    outer.mkdir()
    try:
        if version == "v1":
            (outer / "memory.limit_in_bytes").write_text(str(limit))
        else:
            (outer / "memory.max").write_text(str(limit))
            (outer / "cgroup.subtree_control").write_text("+memory")
        inner.mkdir()
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(inner)],
            cwd=PROJECT,
            env={**os.environ, "PYTHONPATH": str(PROJECT)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        got = json.loads(proc.stdout)
    finally:
        for d in (inner, outer):
            if d.exists():
                d.rmdir()
    assert inner.name in got["cgroup"] and outer.name in got["cgroup"]
    assert got["mem"] > limit, "the machine must have more MemAvailable than the test's cgroup limit"
    assert limit - 400 * MIB < got["cg"] <= limit  # the limit minus what the child itself uses
    assert got["avail"] == got["cg"]  # the cgroup binds, not MemAvailable
    assert got["budget"] == got["cg"] - 64 * MIB
    assert 1500 * MIB < got["budget"] < limit
    avail_mb = got["cg"] // MIB
    assert got["line"] == (
        f"bmoe: cache auto — {avail_mb} MiB available, leaving 64 MiB free → {got['budget'] // MIB} MiB budget "
        "(cap 65536 MiB)"
    )
    assert not outer.exists()
