"""Threads that fit the device and every engine flag reachable (docs/decisions/cpu-sharing.md,
docs/decisions/flag-axes.md):
`run.threads` ("auto" or a number), `run.engine_args`, `[axes.flags]` — parsed, refused with one
line naming the key, written back, planned into exact argv — and, on this host with real engines,
the cores each run saw, the engines that shared them, and `oversubscribed`."""

from __future__ import annotations

import io
import json
import os
import shlex
import signal
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.campaign.file import load_campaign, parse_campaign
from harness.campaign.model import CampaignError
from harness.campaign.options import campaign_from_options
from harness.plan.grid import make_plan
from harness.run.cpushare import (
    CpuSeen,
    CpuShare,
    EngineProcess,
    count_cpu_list,
    cpu_set,
    engine_threads,
    host_boot_id,
    local_cpu,
    parse_cpu_report,
)
from harness.run.runner import run_campaign
from results.analysis.analyze import analyze
from results.read.table import build_table
from tests.conftest import UPSTREAM_HOST
from tests.harness.conftest import write_campaign

TINY_UPSTREAM = UPSTREAM_HOST / "tiny-qwen3moe.gguf"     # upstream's own tiny model: bmoe-cli runs it
CORES = local_cpu().cores


def data(model, **sections) -> dict:
    d = {"version": 1, "name": "tf", "fleet": {"devices": ["local"]}, "models": {"m": str(model)},
         "gate": {"max_wait_s": 1}}
    d.update(sections)
    return d


def runs(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("runs/*/*/run.json"))]


# ── the campaign file ────────────────────────────────────────────────────────────────────────


def test_threads_engine_args_and_flag_axes_read_typed_and_write_back(tmp_path, tiny_model):
    path = write_campaign(tmp_path, f"""
version = 1
[fleet]
devices = ["local"]
[models]
tiny = "{tiny_model}"
[axes]
cache_mb = [0]
[axes.flags]
"--prefetch" = [false, 2]
"--drop-cold-experts" = [0, 0.1, 1e-5]
"--no-think" = [false, true, false]
"--chat-template" = ["gemma"]
"--threads" = [1, "AUTO"]
"--io-threads" = [2, 4]
[run]
engine_args = ["--ubatch", "512", "--chatml"]
""")
    c = load_campaign(path)
    assert c.run.threads == "auto"                                   # the default
    assert c.run.engine_args == ("--ubatch", "512", "--chatml")
    assert c.axes.threads == (1, "auto") and c.axes.io_threads == (2, 4)   # mapped onto their axes
    assert c.axes.flags == (("--prefetch", (False, 2)), ("--drop-cold-experts", (0, 0.1, 1e-5)),
                            ("--no-think", (False, True)), ("--chat-template", ("gemma",)))
    # values keep their TOML types: 0 stays an integer, false stays a boolean
    assert [type(v) for v in c.axes.flags[1][1]] == [int, float, float]
    assert [type(v) for v in c.axes.flags[0][1]] == [bool, int]

    text = c.to_toml()
    back = tomllib.loads(text)
    assert back["axes"]["flags"] == {"-t": [1, "auto"], "--prefetch": [False, 2],
                                     "--drop-cold-experts": [0, 0.1, 1e-5], "--no-think": [False, True],
                                     "--chat-template": ["gemma"]}
    assert back["run"]["threads"] == "auto" and back["run"]["engine_args"] == ["--ubatch", "512", "--chatml"]
    again = load_campaign(write_campaign(tmp_path, text, "campaign.toml"))
    assert again == c and json.dumps(again.to_dict()) == json.dumps(c.to_dict())   # types too (1 is not true)

    fixed = parse_campaign(data(tiny_model, run={"threads": 2}))
    assert fixed.run.threads == 2 and fixed.axes.threads == () and fixed.axes.flags == ()
    assert "flags" not in fixed.to_dict()["axes"]


REFUSED = {
    "a flag the harness sets": ({"axes": {"flags": {"--cache-mb": [0, 100]}}},
                                'axes.flags."--cache-mb": --cache-mb is set by the harness: use axes.cache_mb'),
    "the model": ({"axes": {"flags": {"-m": ["x.gguf"]}}}, 'axes.flags."-m": -m is set by the harness: use [models]'),
    "the CSV": ({"axes": {"flags": {"--csv": ["/tmp/x.csv"]}}},
                'axes.flags."--csv": --csv is set by the harness: it writes the metrics CSV itself'),
    "not a flag": ({"axes": {"flags": {"prefetch": [1]}}}, 'axes.flags."prefetch": "prefetch" is not a flag'),
    "a flag with its value": ({"axes": {"flags": {"--prefetch=2": [True]}}}, "is not a flag"),
    "no run": ({"axes": {"flags": {"--session": [True]}}},
               'axes.flags."--session": --session makes no measurement run'),
    "an axis given twice": ({"axes": {"io_threads": [4], "flags": {"--io-threads": [2]}}},
                            'axes.flags."--io-threads": sets axes.io_threads twice'),
    "-t twice": ({"axes": {"flags": {"-t": [1], "--threads": [2]}}}, 'axes.flags."--threads": sets the -t axis twice'),
    "a mapped value checked as its axis": ({"axes": {"flags": {"--io-threads": [9]}}},
                                           'axes.flags."--io-threads"[0]: must be in 1..8, got 9'),
    "no values": ({"axes": {"flags": {"--prefetch": []}}}, 'axes.flags."--prefetch": is empty'),
    "a list value": ({"axes": {"flags": {"--prefetch": [[1, 2]]}}},
                     'axes.flags."--prefetch"[0]: expected true, false, a number or a string'),
    "an empty string": ({"axes": {"flags": {"--chat-template": [""]}}}, 'axes.flags."--chat-template"[0]: is empty'),
    "an infinite number": ({"axes": {"flags": {"--temp": [float("inf")]}}}, "inf is not a number an engine can take"),
    "not a table": ({"axes": {"flags": ["--prefetch"]}}, "axes.flags: expected a table"),
    "engine_args with -t": ({"run": {"engine_args": ["-t", "8"]}},
                            'run.engine_args[0]: -t is set by the harness: use run.threads or [axes.flags] "-t"'),
    "engine_args with --cache-mb": ({"run": {"engine_args": ["--no-think", "--cache-mb", "4000"]}},
                                    "run.engine_args[1]: --cache-mb is set by the harness: use axes.cache_mb"),
    "engine_args with --n-expert-used": ({"run": {"engine_args": ["--n-expert-used", "2"]}},
                                         "run.engine_args[0]: --n-expert-used is set by the harness: use "
                                         "axes.n_expert_used"),
    "engine_args as a string": ({"run": {"engine_args": "--no-think"}}, "run.engine_args: expected a list"),
    "a flag in both": ({"run": {"engine_args": ["--prefetch", "2"]}, "axes": {"flags": {"--prefetch": [0, 2]}}},
                       'axes.flags."--prefetch": is in run.engine_args too'),
    "threads neither a number nor auto": ({"run": {"threads": "all"}},
                                          'run.threads: expected an integer or "auto" (the device\'s cores), '
                                          'got "all"'),
    "no threads": ({"run": {"threads": 0}}, "run.threads: must be at least 1, got 0"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_flag_the_harness_sets_or_not_a_flag_is_one_line_naming_the_key(case, tmp_path, tiny_model, cli):
    sections, message = REFUSED[case]
    with pytest.raises(CampaignError) as err:
        parse_campaign(data(tiny_model, **sections), source="f.toml")
    assert str(err.value).startswith("f.toml: ") and message in str(err.value) and "\n" not in str(err.value)
    if case == "a flag the harness sets":     # the CLI says the same in one line and writes nothing
        path = write_campaign(tmp_path, f'version = 1\n[fleet]\ndevices = ["local"]\n[models]\ntiny = "{tiny_model}"\n'
                                        '[axes.flags]\n"--cache-mb" = [0, 100]\n')
        result = CliRunner().invoke(cli, ["run", str(path), "--dry-run"])
        assert result.exit_code == 1 and result.output.count("\n") == 1 and message in result.output
        assert sorted(tmp_path.iterdir()) == [path]


# ── the plan ─────────────────────────────────────────────────────────────────────────────────


def test_flag_axes_multiply_the_cells_and_render_exactly_into_argv(tiny_model):
    # a float flag that needs no cache (one that does is left out of the cache-0 cells: test_quality.py)
    c = parse_campaign(data(tiny_model, axes={"cache_mb": [0, "knee"], "flags": {
        "--mtp-p-min": [0, 0.1], "--no-think": [False, True], "-t": [1, "auto"]}},
        run={"engine_args": ["--ubatch", "512"], "n_predict": 4}))
    plan = make_plan(c)
    assert len(plan.cells) == 2 * 2 * 2 * 2
    assert plan == make_plan(c)                                       # deterministic: same ids, same argv
    assert len({cell.cell_id for cell in plan.cells}) == 16
    for cell in plan.cells:
        argv = list(cell.argv)
        flags = cell.config.engine_flags
        assert argv[argv.index("-t") + 1] == ("<auto>" if cell.config.threads == "auto" else "1")
        tail = argv[argv.index("--dense-weights") + 2: argv.index("--csv")]
        expected = ["--ubatch", "512", "--mtp-p-min", {0: "0", 0.1: "0.1"}[flags["--mtp-p-min"]]]
        assert tail == expected + (["--no-think"] if flags["--no-think"] else [])   # false: absent; true: alone
        assert cell.config.engine_args == ("--ubatch", "512")
        assert f"t={cell.config.threads}" in cell.label() and "--mtp-p-min" in cell.label()
    # the knee probe keeps the pass-through args, not the flag axis (a --prefetch needs a cache it lacks)
    (probe,) = plan.probes
    assert "engine_flags" not in probe.config.keys and probe.config.engine_args == ("--ubatch", "512")
    assert probe.argv[probe.argv.index("--dense-weights") + 2: probe.argv.index("--csv")] == ("--ubatch", "512")

    # a campaign without any keeps exactly the config (so the cell ids) it always had
    plain = make_plan(parse_campaign(data(tiny_model, axes={"cache_mb": [0]}, run={"threads": 4})))
    assert set(plain.cells[0].config.keys) == {
        "moe_stream", "no_mmap", "cache_mb", "cache_auto", "cache_ceil_mb", "cache_floor_mb", "force_cache",
        "force_cache_auto", "dense_weights", "n_expert_used", "io_threads", "threads", "n_predict", "prompt",
        "o_direct", "route_trace", "budget_spec", "cycle_mb"}


def test_the_sweep_takes_threads_engine_args_and_flags(tmp_path, tiny_model, cli):
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, [
        "sweep", "--device", "local", "--model", str(tiny_model), "--cache-mb", "0", "-n", "2", "-o", str(out),
        "-t", "2", "--engine-arg", "--ubatch 512", "--engine-arg", "--no-think", "--flag", "--prefetch=false,2",
        "--flag", "--io-threads=1,4", "--flag", "--temp=0.5", "--dry-run", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    cells = json.loads(result.output)["cells"]
    assert len(cells) == 2 * 2
    for cell in cells:
        argv = cell["argv"]
        assert argv[argv.index("-t") + 1] == "2" and cell["config"]["engine_args"] == ["--ubatch", "512", "--no-think"]
        assert cell["config"]["engine_flags"]["--temp"] == 0.5 and "--temp" in argv and "0.5" in argv
        assert ("--prefetch" in argv) == (cell["config"]["engine_flags"]["--prefetch"] == 2)
    assert {c["config"]["io_threads"] for c in cells} == {1, 4}
    assert not out.exists()
    same = campaign_from_options(["local"], [str(tiny_model)], ["0"], threads="2", engine_args=["--ubatch 512"],
                                 flags=["--prefetch=false,2"])
    assert same.run.engine_args == ("--ubatch", "512") and same.axes.flags == (("--prefetch", (False, 2)),)
    bad = CliRunner().invoke(cli, ["sweep", "--device", "local", "--model", str(tiny_model), "-o", str(out),
                                   "--flag", "--moe-stream=true", "--dry-run"])
    assert bad.exit_code == 1 and bad.output.count("\n") == 1
    assert 'axes.flags."--moe-stream": --moe-stream is set by the harness' in bad.output
    bad = CliRunner().invoke(cli, ["sweep", "--device", "local", "--model", str(tiny_model), "-o", str(out),
                                   "--flag", "--prefetch", "--dry-run"])
    assert bad.exit_code == 1 and "--flag: expected NAME=V1,V2" in bad.output


# ── cores, shares and oversubscription ───────────────────────────────────────────────────────


def test_cpu_lists_and_engine_threads_are_read_as_the_kernel_and_the_engines_mean_them():
    assert [count_cpu_list(t) for t in ("0", "0-1", "0-3,6,8-9", "", "x")] == [1, 2, 7, None, None]
    assert engine_threads("bmoe-cli", ["bmoe-cli", "-m", "x", "-t", "3"]) == 3
    assert engine_threads("bmoe-cli", ["/py", "/x/bmoe-cli", "--threads", "6"]) == 6
    assert engine_threads("bmoe-cli", ["bmoe-cli", "-m", "x"]) == 4          # bmoe-cli's default
    assert engine_threads("bmoe-py", ["bmoe-py", "-t", "8"]) == 8              # its kernels run on -t threads
    assert engine_threads("bmoe-py", ["/py", "/x/bmoe-py", "-m", "x"]) == 4    # the same default
    seen = local_cpu()
    assert seen.boot_id == host_boot_id() and seen.cores == len(os.sched_getaffinity(0)) >= 1
    assert seen.cores_online == count_cpu_list(Path("/sys/devices/system/cpu/online").read_text())


def test_engines_count_together_only_on_one_kernel():
    share = CpuShare()
    phone_a, phone_b = CpuSeen(8, 8, "a" * 32), CpuSeen(8, 8, "b" * 32)     # two real phones: two kernels
    host_a, host_b = CpuSeen(2, 2, "c" * 32), CpuSeen(2, 2, "c" * 32)       # two virtual phones on one host
    runs = [share.begin("p1", "c-1", phone_a, 4, "/o/c-1.csv"), share.begin("p2", "c-2", phone_b, 8, "/o/c-2.csv"),
            share.begin("v1", "c-3", host_a, 2, "/o/c-3.csv")]
    late = share.begin("v2", "c-4", host_b, 1, "/o/c-4.csv")
    records = [share.end(r) for r in runs + [late]]
    assert [r["threads_sum"] for r in records] == [4, 8, 3, 3]
    assert [r["oversubscribed"] for r in records] == [False, False, True, True]
    assert records[2]["engines"] == [{"device": "v2", "cell_id": "c-4", "threads": 1}]
    assert records[0]["engines"] == [] and records[1]["engines"] == []
    # after v1 ended, a new run on that host sees only itself
    alone = share.end(share.begin("v2", "c-5", host_b, 2, "/o/c-5.csv"))
    assert alone["threads_sum"] == 2 and alone["oversubscribed"] is False and alone["engines"] == []
    unknown = share.end(share.begin("x", "c-6", CpuSeen(None, None, None), 4, "/o/c-6.csv"))
    assert unknown["oversubscribed"] is None and unknown["shares_host"] is False


def test_engines_on_disjoint_cpusets_of_one_kernel_do_not_count_each_other():
    """Two virtual phones on cores of their own (virtual up --cpus 1 each) share a kernel but no
    core; a third on both cores, and an outside engine pinned to core 1, meet the second one."""
    assert cpu_set("0-3,6") == frozenset({0, 1, 2, 3, 6}) and cpu_set("3-1") is None and cpu_set("x") is None
    assert cpu_set("\u0661") is None and count_cpu_list("0-1") == 2
    seen = parse_cpu_report("0\n@@BMOE-CPU\n1\n@@BMOE-CPU\n" + "c" * 32 + "\n@@BMOE-CPU\nCpus_allowed_list:\t1\n")
    assert seen.cores == 1 and seen.cpus == frozenset({1}) and seen.boot_id == "c" * 32
    assert parse_cpu_report("0-1\n@@BMOE-CPU\n2\n@@BMOE-CPU\n" + "c" * 32).cpus is None   # a phone that does not say
    outside = [EngineProcess(99, "bmoe-cli", 1, ("bmoe-cli", "-t", "1"), frozenset({1}))]
    share = CpuShare(scan=lambda: outside)
    share.host_boot = "c" * 32
    core0, core1 = CpuSeen(1, 1, "c" * 32, frozenset({0})), CpuSeen(1, 1, "c" * 32, frozenset({1}))
    a = share.begin("v1", "c-1", core0, 1, "/o/c-1.csv")
    b = share.begin("v2", "c-2", core1, 1, "/o/c-2.csv")
    both = share.begin("v3", "c-3", CpuSeen(2, 2, "c" * 32, frozenset({0, 1})), 1, "/o/c-3.csv")
    ra, rb, rboth = share.end(a), share.end(b), share.end(both)
    assert ra["cpu_list"] == [0] and rb["cpu_list"] == [1]
    assert [e.get("device", e.get("pid")) for e in ra["engines"]] == ["v3"]            # not v2, not pid 99
    assert ra["threads_sum"] == 2 and ra["oversubscribed"] is True                     # v3 shares core 0
    assert {e.get("device", e.get("pid")) for e in rb["engines"]} == {"v3", 99} and rb["threads_sum"] == 3
    alone = share.end(share.begin("v1", "c-4", core0, 1, "/o/c-4.csv"))
    assert alone["threads_sum"] == 1 and alone["oversubscribed"] is False and alone["engines"] == []
    assert rboth["threads_sum"] == 4 and rboth["oversubscribed"] is True                # v1, v2, itself, pid 99


def test_a_run_whose_threads_exceed_the_cores_is_marked_and_one_that_fits_is_not(tmp_path, bmoe_cli):
    """The real bmoe-cli on this host: -t 1, -t auto and -t cores+1 (2 tokens: a spinning pool is
    short-lived). Asserted on the recorded threads and cores, never on speed."""
    over = CORES + 1
    c = parse_campaign(data(TINY_UPSTREAM, engine={"kind": "native", "native": {"host": {"cli": str(bmoe_cli)}}},
                            axes={"cache_mb": [0], "flags": {"-t": [1, "auto", over]}},
                            run={"n_predict": 2, "engine_args": ["--ubatch", "64"]}), source="t.toml")
    out = tmp_path / "out"
    status = run_campaign(c, out, progress_stream=io.StringIO())
    assert status.outcomes == {"ok": 3}
    by_threads = {}
    for r in runs(out):
        cpu = r["cpu"]
        assert cpu["cores"] == CORES and cpu["boot_id"] == host_boot_id() and cpu["shares_host"] is True
        assert cpu["threads"] == r["config"]["threads"] == int(r["argv"][r["argv"].index("-t") + 1])
        assert "--ubatch" in r["argv"] and "<auto>" not in r["argv"]
        # no other engine of the campaign ran with it; an engine outside it (if any ran) is named
        assert all(e.get("outside") for e in cpu["engines"])
        # the sum is of one moment; engines lists every one seen while the run lived
        assert cpu["threads"] <= cpu["threads_sum"] <= cpu["threads"] + sum(e["threads"] for e in cpu["engines"])
        if not cpu["engines"]:
            assert cpu["threads_sum"] == cpu["threads"]
        assert cpu["oversubscribed"] is (cpu["threads_sum"] > CORES)
        by_threads[r["config"].get("threads_auto", False), r["config"]["threads"]] = r
    auto = by_threads[True, min(CORES, 4)]
    assert auto["config"]["threads_auto"] is True
    assert by_threads[False, over]["cpu"]["oversubscribed"] is True
    fitting = by_threads[False, 1]

    table = build_table([out])
    a = analyze(table)
    flagged = {t.run_ids[0]: t for t in a.tells if t.kind == "oversubscribed"}
    row = table[table["cell_id"] == by_threads[False, over]["cell_id"]].iloc[0]
    assert bool(row["oversubscribed"]) and "oversubscribed" in row["flags"].split(",") and row["cores"] == CORES
    assert f"{row['threads_sum']:g} compute threads on {CORES} cores (this run {over}" in flagged[row["run_id"]].message
    assert a.table[a.table["run_id"] == row["run_id"]]["tells"].iloc[0] == "oversubscribed"
    fit_row = table[table["cell_id"] == fitting["cell_id"]].iloc[0]
    assert bool(fit_row["oversubscribed"]) is fitting["cpu"]["oversubscribed"]
    if not fitting["cpu"]["engines"]:          # nothing else ran on this host meanwhile: it fits, no tell
        assert not fit_row["oversubscribed"] and fit_row["run_id"] not in flagged
    # -t values are one series each: the runs of a flag never pool
    assert {p.series for g in a.groups for p in g.points} == {f"threads={t}" for t in sorted({1, min(CORES, 4), over})}


def test_an_engine_started_outside_the_campaign_is_counted(tmp_path, tiny_model, bmoe_cli):
    """A real bmoe-cli with -t cores+1 sits idle in --session mode (loaded, waiting on stdin) while a
    bmoe-py campaign runs: the run records it by pid and counts its threads."""
    threads = CORES + 1
    idle = subprocess.Popen([str(bmoe_cli), "-m", str(TINY_UPSTREAM), "-t", str(threads), "--session"],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{idle.pid}/comm").read_text().strip() != "bmoe-cli" and time.monotonic() < deadline:
            time.sleep(0.05)
        c = parse_campaign(data(tiny_model, axes={"cache_mb": [0]}, run={"n_predict": 2}))
        run_campaign(c, tmp_path / "out", progress_stream=io.StringIO())
    finally:
        os.killpg(idle.pid, signal.SIGKILL)
        idle.wait()
        idle.stdin.close()
    (r,) = runs(tmp_path / "out")
    assert r["outcome"] == "ok" and r["cpu"]["threads"] == r["config"]["threads"]   # bmoe-py: its -t
    (seen,) = [e for e in r["cpu"]["engines"] if e.get("pid") == idle.pid]
    assert seen == {"pid": idle.pid, "name": "bmoe-cli", "threads": threads, "outside": True,
                    "command": shlex.join([str(bmoe_cli), "-m", str(TINY_UPSTREAM), "-t", str(threads), "--session"])}
    assert r["cpu"]["threads_sum"] >= 1 + threads and r["cpu"]["oversubscribed"] is True
    (tell,) = [t for t in analyze(build_table([tmp_path / "out"])).tells if t.kind == "oversubscribed"]
    assert f"pid {idle.pid} bmoe-cli outside the campaign: {threads} threads" in tell.message


def test_a_flag_bmoe_py_does_not_implement_is_a_config_error_as_in_bmoe_cli(tmp_path, tiny_model):
    c = parse_campaign(data(tiny_model, axes={"cache_mb": [0], "flags": {"--ngram": [False, True]}},
                            run={"n_predict": 2}))
    status = run_campaign(c, tmp_path / "out", progress_stream=io.StringIO())
    assert status.outcomes == {"ok": 1, "config_error": 1}
    (refused,) = [r for r in runs(tmp_path / "out") if r["outcome"] == "config_error"]
    assert "--ngram" in refused["argv"] and refused["exit_status"] == 1
    assert refused["evidence"] == ["exit status 1", "unknown arg: --ngram"]       # bmoe-cli's own words


def test_auto_threads_are_capped_at_4_on_a_phone_and_at_run_host_threads_max_here(tiny_model):
    """Upstream's community protocol runs min(8, cores) on a computer and 4 on a phone: "auto"
    follows it per device, with the host's cap a run setting (4 unless a campaign says)."""
    from harness.plan.grid import resolve_threads

    def resolved(run: dict) -> dict[str, int]:
        c = parse_campaign(data(tiny_model, fleet={"devices": ["local", "virtual:p"]}, run=run))
        plan = make_plan(c)
        return {cell.device: resolve_threads(c, cell, 16).config.threads for cell in plan.cells}

    assert resolved({}) == {"local": 4, "virtual:p": 4}
    assert resolved({"host_threads_max": 8}) == {"local": 8, "virtual:p": 4}
    c = parse_campaign(data(tiny_model, run={"host_threads_max": 8}))
    assert tomllib.loads(c.to_toml())["run"]["host_threads_max"] == 8
    assert "host_threads_max" not in tomllib.loads(parse_campaign(data(tiny_model)).to_toml())["run"]
    with pytest.raises(CampaignError, match=r"run\.host_threads_max"):
        parse_campaign(data(tiny_model, run={"host_threads_max": 0}))
