"""bmoe-py held to the real bmoe-cli 0.19.0, flag by flag (docs/decisions/bmoe-py-matches-bmoe-cli.md).

Every case runs both engines with the same arguments (bmoe-cli always with `-t 1`: on this 2-core
machine ggml's thread pool spins above the free cores) and compares what bmoe-cli emits: generated
bytes, stdout lines (timings masked, token counts, MiB read, hit %, evictions, re-reads and
prefetch counts kept), the CSV preamble (keys and values; `engine` and bmoe-py's `cache_cycle_mb`
aside), per-token columns that are not timings, the summary keys and its non-timing values, the
route trace (header, every row; weights within a tolerance, see below), the `bmoe:` / `warning:` /
`error:` lines of stderr, and exit codes. The differences docs/decisions/bmoe-py-differences.md records as choices are
subtracted explicitly (`_documented`), so each is asserted to be exactly what the docs say.

The grid is a covering design, not a cartesian product (that would be thousands of runs):

* upstream's tiny model (qwen3moe, F32): an 18-run strength-2 covering array over cache (0, forced
  1 MiB under the cycle, forced 4 MiB above it, auto, auto with a 3 MiB ceiling and a floor, auto
  with a floor larger than RAM) x dense (mmap/warm/anon) x top-k (model's 2, 1, 3) x prefetch
  (none, `--prefetch 2 --prefetch-sync`, `--prefetch 1` asynchronous): run r = 3c + j takes cache c,
  dense j, top-k (j + c) mod 3 and prefetch (j + 2c) mod 3, so every pair of values of any two of
  those axes meets, in particular cache x prefetch, cache x dense and top-k x cache. The other axes
  rotate with r: `--io-threads` 4/1, `--no-odirect` every third run, `--route-trace` on two runs in
  three, `--progress` every fourth. Prefetch with cache 0 is refused by both engines (crossed too).
* synthetic qwen3moe with Q8_0 experts and synthetic gpt-oss with MXFP4 experts (engine.gguf.synth,
  4 layers x 8 experts, 13 MiB of experts): one run per cache level, the other axes rotating.
* odd inputs on the tiny model (special-token and UTF-8 prompts, a long prompt with prefetch, a
  budget beyond the bank at top-k = n_expert, junk numbers, the resident mode, flags ignored
  without --moe-stream, 34-token runs where the dense-residency sensor fires);
* refusals (bad values, missing values, unknown and unimplemented flags, env overrides, files that
  are not models, unwritable telemetry paths), compared line for line.

Numerics. On the tiny model bmoe-py reproduces ggml's rounding, so bytes, routing and counters are
equal and routing weights agree to 1e-5. The synthetic models are random and small, and amplify
the last-ulp differences between ggml's float32 SIMD sums and bmoe-py's float64-then-round dot
products: changing only bmoe-py's own summation order moves their routing weights by ~1e-3 (qwen3moe
Q8_0) to ~1e-2 (gpt-oss MXFP4) within four layers, the same size as the bmoe-cli difference. Where
that flips a near-tie the expert ids (and everything after) legitimately differ. So the synthetic
cases use seeds, prompts and top-k where both engines route every token identically (checked here,
and both engines are deterministic at -t 1): qwen3moe Q8_0 at top-k 1, 2 and 3, gpt-oss MXFP4 at
top-k 1. Their routing weights are compared at a relative 2e-2. A gpt-oss run at its own top-k 2 is
compared structurally only (load lines, preamble, summary keys, line shapes, n_prompt, trace header
and the prefill routing of layer 0, which no expert has touched yet).

Asynchronous `--prefetch` races the reads against compute in both engines (bmoe-cli's C++ compute is
so fast its guesses rarely land; bmoe-py's do): there only the bytes, the shapes and the refusals
are compared; `--prefetch-sync` makes prefetch deterministic and is compared exactly.

Runtime: about 115 bmoe-py processes (and as many bmoe-cli ones), two at a time: 65-85 s on this
2-core machine while other work shared it.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engine.contract.config import NOT_IMPLEMENTED, implemented_flags
from engine.gguf.synth import synth_options, write_model
from tests.conftest import UPSTREAM_HOST
from tests.engine.test_engine_cli import BMOE_PY, bmoe_py

UPSTREAM_DIR = UPSTREAM_HOST.parent
TINY_REL = f"{UPSTREAM_HOST.name}/tiny-qwen3moe.gguf"  # relative: the route trace names the -m path as given


# ---- running both engines -----------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    id: str
    model: str                     # "tiny", "qwen", "gptoss"
    args: tuple[str, ...]
    n: int = 24
    csv: bool = True
    trace: bool = False
    env: tuple[tuple[str, str], ...] = ()
    full: bool = True              # compare everything, not only the structure
    racy: bool = False             # asynchronous prefetch: counters and read bytes race
    weight_rel: float = 1e-5       # route-trace weight tolerance (absolute on tiny, relative otherwise)


@dataclass
class Run:
    code: int
    stdout: bytes
    stderr: str
    csv: str | None
    trace: str | None
    argv: list[str] = field(default_factory=list)


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without BMOE_* overrides (as the harness scrubs them), plus `extra`."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("BMOE_")}, **extra}


def _run(prefix: list[str], case: Case, model_path: str, out_dir: Path, cwd: Path) -> Run:
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = [*prefix]
    if case.model is not None:
        argv += ["-m", model_path]
    argv += ["-n", str(case.n), *case.args]
    csv_path, trace_path = out_dir / "run.csv", out_dir / "run.route.csv"
    if case.csv:
        argv += ["--csv", str(csv_path)]
    if case.trace:
        argv += ["--route-trace", str(trace_path)]
    r = subprocess.run(argv, capture_output=True, env=_clean_env(**dict(case.env)), cwd=cwd, timeout=300,
                       stdin=subprocess.DEVNULL)
    read = lambda p: p.read_text(encoding="utf-8", errors="replace") if p.exists() else None  # noqa: E731
    return Run(r.returncode, r.stdout, r.stderr.decode("utf-8", "replace"), read(csv_path), read(trace_path), argv)


def run_pairs(bmoe_cli: Path, cases: list[Case], models: dict[str, str], root: Path) -> dict[str, tuple[Run, Run]]:
    """Both engines on every case, two processes at a time (bmoe-cli at -t 1 spins nothing)."""
    jobs = []
    for case in cases:
        model_path = models.get(case.model, case.model or "")
        jobs.append((case.id, "cli", [str(bmoe_cli), "-t", "1"], case, model_path))
        jobs.append((case.id, "py", BMOE_PY + ["-t", "1"], case, model_path))

    def one(job):
        cid, engine, prefix, case, model_path = job
        return cid, engine, _run(prefix, case, model_path, root / cid / engine, UPSTREAM_DIR)

    out: dict[str, dict[str, Run]] = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        for cid, engine, run in pool.map(one, jobs):
            out.setdefault(cid, {})[engine] = run
    return {cid: (d["cli"], d["py"]) for cid, d in out.items()}


# ---- the grid -------------------------------------------------------------------------------------
CACHE_TINY = [
    ("c0", ["--cache-mb", "0"]),
    ("small", ["--cache-mb", "1", "--force-cache"]),        # under the cycle at top-k 2 and 3
    ("above", ["--cache-mb", "4", "--force-cache"]),        # above every cycle, under the 6 MiB bank
    ("auto", ["--cache-mb", "auto"]),
    ("autoceil", ["--cache-mb", "auto", "--cache-ceil-mb", "3", "--cache-floor-mb", "64"]),
    ("autofloor", ["--cache-mb", "auto", "--cache-floor-mb", "100000000"]),  # floor > RAM: the cap
]
DENSE = ["mmap", "warm", "anon"]
TOPK = [[], ["--n-expert-used", "1"], ["--n-expert-used", "3"]]
PREFETCH = [[], ["--prefetch", "2", "--prefetch-sync"], ["--prefetch", "1"]]


def _rotating(r: int) -> tuple[list[str], bool]:
    """The axes that rotate with the run index: (extra args, route trace on)."""
    extra = ["--io-threads", "4" if r % 2 == 0 else "1"]
    if r % 3 == 1:
        extra.append("--no-odirect")
    if r % 4 == 3:
        extra.append("--progress")
    return extra, r % 3 != 2


def tiny_cases() -> list[Case]:
    cases = []
    for c, (cache_id, cache_args) in enumerate(CACHE_TINY):
        for j, dense in enumerate(DENSE):
            r = 3 * c + j
            topk, prefetch = TOPK[(j + c) % 3], PREFETCH[(j + 2 * c) % 3]
            extra, trace = _rotating(r)
            args = ["--moe-stream", *cache_args, "--dense-weights", dense, *topk, *prefetch, *extra]
            pid = ["", "pfsync", "pfasync"][(j + 2 * c) % 3]
            # With one I/O lane no guess is ever read (no idle lane, in both engines): not a race.
            racy = pid == "pfasync" and "1" not in extra[1:2]
            cases.append(Case(f"tiny-{cache_id}-{dense}-k{['d', '1', '3'][(j + c) % 3]}{'-' + pid if pid else ''}",
                              "tiny", tuple(args), trace=trace, racy=racy))
    cases.append(Case("tiny-resident", "tiny", ()))
    cases.append(Case("tiny-resident-flags-ignored", "tiny",  # streaming flags without --moe-stream
                      ("--cache-mb", "auto", "--cache-floor-mb", "100", "--cache-ceil-mb", "50", "--force-cache",
                       "--prefetch", "2", "--io-threads", "2", "--no-odirect", "--dense-weights", "warm")))
    cases.append(Case("tiny-ahwb-without-stream", "tiny", ("--dense-weights", "ahwb")))
    cases.append(Case("tiny-sampling-preamble", "tiny",  # greedy: ranges unchecked, %.4g in the preamble
                      ("--temp", "0", "--top-p", "1.5", "--top-k", "7", "--seed", "-1")))
    cases.append(Case("tiny-empty-prompt", "tiny", ("-p", "", "--moe-stream", "--cache-mb", "2", "--force-cache")))
    cases.append(Case("tiny-deprecated-alias", "tiny", ("--moe-stream", "--no-warm-dense", "--cache-mb", "0"), n=4))
    # odd prompts (special-token text, multi-byte UTF-8), a long prompt's prefill with prefetch,
    # a legal budget beyond the bank, top-k = n_expert, junk numbers read as C's atoi reads them
    cases.append(Case("tiny-prompt-special-utf8", "tiny", ("-p", "<s>Привет</s>, 日本の首都は", "--moe-stream",
                                                          "--cache-mb", "2", "--force-cache"), n=8, trace=True))
    cases.append(Case("tiny-long-prompt-prefetch", "tiny", ("-p", "word " * 150, "--moe-stream", "--cache-mb", "4",
                                                           "--force-cache", "--prefetch", "3", "--prefetch-sync"),
                      n=8, trace=True))
    cases.append(Case("tiny-budget-1500", "tiny", ("--moe-stream", "--cache-mb", "1500", "--n-expert-used", "8"), n=8,
                      trace=True))
    cases.append(Case("tiny-junk-numbers", "tiny", ("--moe-stream", "--cache-mb", "3abc", "--force-cache", "--seed",
                                                   "abc", "--top-k", "x"), n=4))
    # dense_resident_frac is sampled every 128 layer loads: 4 prefill + 4 x 31 decode loads
    for dense in ("anon", "mmap"):
        cases.append(Case(f"tiny-residency-{dense}", "tiny", ("--moe-stream", "--cache-mb", "auto", "--dense-weights",
                                                             dense, "--progress"), n=34))
    return cases


SYNTH_TOPK = {"qwen": [[], ["--n-expert-used", "1"], ["--n-expert-used", "3"]], "gptoss": [["--n-expert-used", "1"]]}
# MiB: both synthetic models stream 408 KiB per expert; cycle at top-k 1/2/3 = 1.6/3.2/4.8 MiB, bank 12.75.
CACHE_SYNTH = [
    ("c0", ["--cache-mb", "0"]),
    ("small", ["--cache-mb", "1", "--force-cache"]),
    ("above", ["--cache-mb", "8", "--force-cache"]),
    ("auto", ["--cache-mb", "auto"]),
    ("autoceil", ["--cache-mb", "auto", "--cache-ceil-mb", "5", "--cache-floor-mb", "64"]),
    ("autofloor", ["--cache-mb", "auto", "--cache-floor-mb", "100000000"]),
]


def synth_cases() -> list[Case]:
    cases = []
    for model in ("qwen", "gptoss"):
        for c, (cache_id, cache_args) in enumerate(CACHE_SYNTH):
            topks = SYNTH_TOPK[model]
            topk = topks[c % len(topks)]
            dense = DENSE[c % 3]
            prefetch = PREFETCH[1] if cache_id in ("small", "autoceil") else []
            extra, trace = _rotating(c + (1 if model == "gptoss" else 0))
            args = ["--moe-stream", *cache_args, "--dense-weights", dense, *topk, *prefetch, *extra]
            cases.append(Case(f"{model}-{cache_id}-{dense}", model, tuple(args), n=16, trace=trace, weight_rel=2e-2))
    cases.append(Case("gptoss-k2-structure", "gptoss", ("--moe-stream", "--cache-mb", "2", "--force-cache"), n=8,
                      trace=True, full=False))
    return cases


REFUSALS = [
    # bmoe-cli's validate(), in its order
    ("n0", ("-n", "0")), ("t0", ("-t", "0")), ("c0", ("-c", "0")), ("kneg", ("--n-expert-used", "-1")),
    ("topk-neg", ("--temp", "0.5", "--top-k", "-1")), ("topp0", ("--temp", "0.5", "--top-p", "0")),
    ("topp-big", ("--temp", "0.5", "--top-p", "1.5")),
    ("n0-before-stream", ("-n", "0", "--moe-stream", "--io-threads", "9")),
    ("band", ("--moe-stream", "--cache-mb", "1000")),
    ("auto-and-number", ("--moe-stream", "--cache-mb", "auto", "--cache-mb", "2000")),
    ("io9", ("--moe-stream", "--io-threads", "9")), ("io0", ("--moe-stream", "--io-threads", "0")),
    ("cache-neg", ("--moe-stream", "--cache-mb", "-5")), ("pf-nocache", ("--moe-stream", "--prefetch", "1")),
    ("pf9", ("--moe-stream", "--cache-mb", "4", "--force-cache", "--prefetch", "9")),
    ("floor-neg", ("--moe-stream", "--cache-mb", "auto", "--cache-floor-mb", "-1")),
    ("ceil-neg", ("--moe-stream", "--cache-mb", "auto", "--cache-ceil-mb", "-1")),
    # parse errors: missing values are named as bmoe-cli names them
    ("dense-bad", ("--dense-weights", "odirect")), ("unknown", ("--frobnicate",)),
    *[(f"missing{flag}", (flag,)) for flag in ("-n", "--n-predict", "--threads", "--ctx-size", "--model", "--prompt",
                                               "--cache-mb", "--csv", "--dense-weights", "--temp", "--seed")],
    # load and run failures
    ("k9", ("--n-expert-used", "9")), ("k9-stream", ("--moe-stream", "--n-expert-used", "9")),
    ("ctx-small", ("-c", "40")), ("ahwb", ("--moe-stream", "--dense-weights", "ahwb")),
    ("ahwb-auto", ("--moe-stream", "--cache-mb", "auto", "--dense-weights", "ahwb")),
    # telemetry paths that cannot be written: a warning, and the run goes on
    ("trace-unwritable", ("--moe-stream", "--route-trace", "/nonexistent-dir/x.route.csv")),
    ("csv-unwritable", ("--moe-stream", "--csv", "/nonexistent-dir/x.csv")),
    ("trace-without-stream", ("--route-trace", "/nonexistent-dir/x.route.csv")),
]


def refusal_cases() -> list[Case]:
    cases = [Case(f"bad-{cid}", "tiny", args, n=4, csv=False) for cid, args in REFUSALS]
    cases += [
        Case("bad-no-model", None, (), n=4, csv=False),
        Case("bad-missing-file", "/nonexistent-dir/model.gguf", (), n=4, csv=False),
        Case("bad-not-gguf", "notes", (), n=4, csv=False),
        Case("env-overlap-no-stream", "tiny", (), n=4, csv=False, env=(("BMOE_OVERLAP", "1"),)),
        Case("env-cache", "tiny", ("--moe-stream",), n=4, csv=False, env=(("BMOE_CACHE_MB", "1000"),)),
        Case("env-cache-flag-wins", "tiny", ("--moe-stream", "--cache-mb", "0"), n=4, csv=False,
             env=(("BMOE_CACHE_MB", "1000"),)),
        Case("help", None, ("--help",), n=4, csv=False),
        Case("list-archs", None, ("--list-archs",), n=4, csv=False),
    ]
    return cases


# ---- models ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def diff_models(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("diff-models")
    qwen, gptoss = d / "synth-qwen-q8.gguf", d / "synth-gptoss-mxfp4.gguf"
    write_model(qwen, synth_options("qwen3moe", layers=4, experts=8, top_k=2, hidden=256, expert_ffn=512, vocab=300,
                                    quant="Q8_0", seed=1))
    write_model(gptoss, synth_options("gpt-oss", layers=4, experts=8, top_k=2, hidden=512, expert_ffn=512,
                                      vocab=260, seed=1))
    notes = d / "notes.gguf"
    notes.write_text("not a model\n")
    return {"tiny": TINY_REL, "qwen": str(qwen), "gptoss": str(gptoss), "notes": str(notes)}


ALL_CASES = tiny_cases() + synth_cases() + refusal_cases()


@pytest.fixture(scope="module")
def results(bmoe_cli, diff_models, tmp_path_factory) -> dict[str, tuple[Run, Run]]:
    return run_pairs(bmoe_cli, ALL_CASES, diff_models, tmp_path_factory.mktemp("diff-runs"))


# ---- normalising what is compared -----------------------------------------------------------------
_NUM = r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?"


def _mask(text: str) -> str:
    return re.sub(_NUM, "N", text)


def _mask_groups(line: str, pattern: str) -> str:
    """Mask the numbers of `line` matched by `pattern`'s groups (the timings), keep the rest."""
    m = re.match(pattern, line)
    if not m:
        return line
    out, last = [], 0
    for g in range(1, (m.lastindex or 0) + 1):
        out += [line[last:m.start(g)], "T"]
        last = m.end(g)
    return "".join(out) + line[last:]


_TIMED = [
    (r"generation: \d+ tokens, (\S+) s/token \((\S+) tok/s\)", False),
    (r"compute: (\S+)% CPU occupancy \((\S+) cpu-s/token over \d+ threads\), (\S+) major faults/token", False),
    (r"prefill: \d+ tokens, (\S+) s \((\S+) tok/s\) \| model load (\S+) s \| TTFT (\S+) s", False),
    (r"moe-stream: read \S+ MiB \(\S+ MiB/token\), decode (\S+) s/token \(compute (\S+) \+ cache mgmt (\S+) \+ "
     r"flash I/O (\S+) s/token, (\S+) MiB/s\)", False),
]


def stdout_lines(out: bytes, racy: bool) -> tuple[bytes, list[str]]:
    """(generated text, end-of-run lines normalised). Progress lines keep their counters and text."""
    if b"=== answer ===\n" in out:
        head, rest = out.split(b"=== answer ===\n", 1)
        text, perf = rest.split(b"\n=== perf ===\n", 1)
        # Racing reads land in whichever token they land in: BMOE_LOAD lines come and go with them.
        lines = [_progress_line(line, racy) for line in head.split(b"\n")
                 if line and not (racy and line.startswith(b"BMOE_LOAD "))]
    else:
        text, _, perf = out.partition(b"\n\ngeneration:")
        perf = b"generation:" + perf
        lines = []
    for line in perf.decode("utf-8", "replace").splitlines():
        if line.startswith("moe-waits:"):
            continue  # bmoe-cli only, when its drain/adopt waits pass 0.5 ms/token (bmoe-py has neither)
        for pattern, _ in _TIMED:
            line = _mask_groups(line, pattern)
        if racy and line.startswith(("moe-stream:", "moe-cache:", "moe-prefetch:")):
            line = _mask(line)
        lines.append(line)
    return text, lines


_PROGRESS_TIMED = ("wall_ms", "io_ms", "compute_ms", "mgmt_ms", "stall_ms", "majflt", "cpu_ms", "ms")


def _progress_line(line: bytes, racy: bool) -> str:
    text = line.decode("utf-8", "replace")
    keys = _PROGRESS_TIMED + (("read_mb", "cache_hit_pct", "mb") if racy else ())
    for key in keys:
        text = re.sub(rf'"{key}":{_NUM}', f'"{key}":T', text)
    return text


def parse_csv(text: str) -> tuple[dict[str, str], list[str], list[dict[str, str]], dict[str, str]]:
    preamble, header, rows, summary = {}, [], [], {}
    for line in text.splitlines():
        if line.startswith("# summary "):
            summary = dict(kv.split("=", 1) for kv in line[len("# summary "):].split())
        elif line.startswith("# ") and "=" in line:
            preamble.update(kv.split("=", 1) for kv in line[2:].split())
        elif line.startswith("step,"):
            header = line.split(",")
        elif line and line[0].isdigit():
            rows.append(dict(zip(header, line.split(","))))
    return preamble, header, rows, summary


SUMMARY_EXACT = ("tokens", "n_prompt", "cache_budget_MiB", "cache_resizes", "token_demand_MiB", "layer_demand_MiB",
                 "experts_routed", "experts_dropped", "mtp_drafted", "mtp_accepted", "mtp_decodes", "drafted_steps",
                 "ra_committed", "ra_passthrough", "ra_agree_pct", "stall_s/tok")
SUMMARY_CACHE = ("read_MiB", "cache_hit_pct", "cache_resident_MiB", "spec_read_MiB", "spec_experts", "spec_useful",
                 "evictions", "rereads")
ROW_EXACT = ("step", "steps", "turn", "cache_budget_mib", "mtp_batch", "stall_ms")
ROW_CACHE = ("read_bytes", "cache_hit_pct")


def stderr_lines(err: str) -> list[str]:
    """The engine's own stderr lines (bmoe-cli's also carry llama.cpp's log), numbers that are
    measurements masked."""
    keep = re.compile(r"^(bmoe:|warning:|error:|config error:|unknown arg:|missing value for|at top-k )")
    out = []
    for line in err.splitlines():
        if not keep.match(line):
            continue
        line = re.sub(r"cache auto — \d+ MiB available", "cache auto — A MiB available", line)
        line = re.sub(r"(dense warm-up — \d+ MiB in )\S+ s", r"\1T s", line)
        out.append(line)
    return out


def _documented(cli_err: list[str], py_err: list[str]) -> tuple[list[str], list[str]]:
    """Remove the stderr differences docs/decisions/bmoe-py-differences.md records: bmoe-cli's `dropped N MiB of
    now-unused mmap pages` (bmoe-py maps nothing it reads into anon buffers), bmoe-py's cycle
    WARNING (the seed's guard, which bmoe-cli 0.19.0 does not have) and the reason bmoe-py adds to
    a model that does not load."""
    cli_err = [line for line in cli_err if "of now-unused mmap pages" not in line]
    py_err = [line for line in py_err if not line.startswith(("bmoe: WARNING expert cache", "at top-k "))]
    # A model that does not load: bmoe-cli's line, to which bmoe-py adds ": <why>".
    py_err = [next((c for c in cli_err if c.startswith("error: failed to load model: ") and p.startswith(c + ": ")), p)
              for p in py_err]
    return cli_err, py_err


def _trace(text: str) -> tuple[list[str], list[list[str]]]:
    lines = text.splitlines()
    return [line for line in lines if line.startswith("#")], [line.split(",") for line in lines[1:]
                                                             if line and not line.startswith(("#", "turn,"))]


def _diff(a: list[str], b: list[str], limit: int = 12) -> str:
    lines = [x for x in difflib.unified_diff(a, b, lineterm="", n=0) if not x.startswith(("---", "+++", "@@"))]
    return "\n".join(lines[:limit]) + ("\n…" if len(lines) > limit else "")


def _close(case: Case, a: float, b: float) -> bool:
    """Two routing weights equal within the case's tolerance (absolute on the tiny model, else relative)."""
    return abs(a - b) <= case.weight_rel * (1.0 if case.model == "tiny" else max(abs(a), 1e-9))


def _near_ties_in_order(case: Case, rows: list[list[str]]) -> list[list[str]]:
    """A route trace's rows with each run of consecutive slots of one (turn, phase, step, layer)
    whose weights are equal within the tolerance put in expert order, the slot numbers kept
    (docs/decisions/bmoe-py-differences.md). The router sorts by weight; where two experts' weights
    differ by less than the engines' last-digit differences, either order is the same routing: the
    same experts, each with its weight, summed in another order. Slot 0 is never moved: the top
    expert is what a dropped slot is repointed to."""
    out = [list(r) for r in rows]
    i = 0
    while i < len(out):
        j = i + 1
        while j < len(out) and out[j][:4] == out[i][:4] and out[j][4] != "0" and out[i][4] != "0" \
                and _close(case, float(out[j - 1][6]), float(out[j][6])):
            j += 1
        if j - i > 1:
            slots = [r[4] for r in out[i:j]]
            out[i:j] = sorted(out[i:j], key=lambda r: int(r[5]))
            for r, slot in zip(out[i:j], slots):
                r[4] = slot
        i = j
    return out


def compare(case: Case, cli: Run, py: Run) -> list[str]:
    """Every difference between the two runs that docs/decisions/bmoe-py-differences.md does not record."""
    bad: list[str] = []

    def want(cond: bool, what: str) -> None:
        if not cond:
            bad.append(what)

    want(cli.code == py.code, f"exit {cli.code} vs {py.code}")
    cerr, perr = _documented(stderr_lines(cli.stderr), stderr_lines(py.stderr))
    want(cerr == perr, f"stderr lines\n  cli {cerr}\n  py  {perr}")
    if cli.code != 0:
        usage = cli.stdout.startswith(b"usage: ")
        want(cerr or usage, "bmoe-cli refused without a word: the case tests nothing")
        if usage:  # the usage text itself is each engine's own
            want(py.stdout.startswith(b"usage: "), f"stdout {py.stdout[:60]!r} is not a usage text")
        else:      # nothing, or the prompt printed before the load failed
            want(cli.stdout == py.stdout, f"stdout {cli.stdout[:60]!r} vs {py.stdout[:60]!r}")
        return bad
    ctext, clines = stdout_lines(cli.stdout, case.racy)
    ptext, plines = stdout_lines(py.stdout, case.racy)
    if case.full:
        want(ctext == ptext, f"generated bytes {ctext!r} vs {ptext!r}")
        want(clines == plines, "stdout lines (-cli +py)\n" + _diff(clines, plines))
    else:
        want([_mask(x) for x in clines] == [_mask(x) for x in plines], f"stdout shapes {clines} vs {plines}")
    if case.csv:
        want((cli.csv is None) == (py.csv is None), "csv written by one engine only")
    if case.csv and cli.csv is not None and py.csv is not None:
        cpre, chead, crows, csum = parse_csv(cli.csv)
        ppre, phead, prows, psum = parse_csv(py.csv)
        for key in ("engine", "cache_cycle_mb"):
            cpre.pop(key, None), ppre.pop(key, None)
        differ = {k: (cpre.get(k), ppre.get(k)) for k in cpre.keys() | ppre.keys() if cpre.get(k) != ppre.get(k)}
        want(not differ, f"preamble differs: {differ}")
        want(chead == phead, "csv columns differ")
        want(set(csum) == set(psum), f"summary keys {set(csum) ^ set(psum)}")
        keys = SUMMARY_EXACT + (() if case.racy or not case.full else SUMMARY_CACHE)
        if not case.full:
            keys = ("tokens", "n_prompt", "cache_budget_MiB")
        diff = {k: (csum.get(k), psum.get(k)) for k in keys if csum.get(k) != psum.get(k)}
        want(not diff, f"summary values {diff}")
        want(len(crows) == len(prows), f"{len(crows)} vs {len(prows)} rows")
        cols = ROW_EXACT + (() if case.racy or not case.full else ROW_CACHE)
        for cr, pr in zip(crows, prows):
            d = {c: (cr[c], pr[c]) for c in cols if cr[c] != pr[c]}
            sampled = (cr["dense_resident_frac"] == "-1.000", pr["dense_resident_frac"] == "-1.000")
            want(not d and sampled[0] == sampled[1], f"row {cr['step']}: {d} dense_resident_frac "
                 f"{cr['dense_resident_frac']} vs {pr['dense_resident_frac']}")
            if d or sampled[0] != sampled[1]:
                break
    if case.trace:
        want((cli.trace is None) == (py.trace is None), "route trace written by one engine only")
    if case.trace and cli.trace is not None and py.trace is not None:
        chead, crows = _trace(cli.trace)
        phead, prows = _trace(py.trace)
        want(chead == phead, f"trace header {chead} vs {phead}")
        if case.full:
            want(len(crows) == len(prows), f"trace rows {len(crows)} vs {len(prows)}")
            crows, prows = _near_ties_in_order(case, crows), _near_ties_in_order(case, prows)
            cols = [0, 1, 2, 3, 4, 5] + ([] if case.racy else [7, 8, 9])
            for cr, pr in zip(crows, prows):
                same = [cr[i] for i in cols] == [pr[i] for i in cols]
                cw, pw = float(cr[6]), float(pr[6])
                fmt = pr[6] == f"{pw:.6g}"
                if not (same and _close(case, cw, pw) and fmt):
                    want(False, f"trace row {cr} vs {pr}")
                    break
        else:  # prefill routing of layer 0, before any expert has been applied
            first = lambda rows: [r[:6] for r in rows if r[1] == "0" and r[3] == "0"]  # noqa: E731
            want(first(crows) == first(prows), "layer-0 prefill routing differs")
    return bad


# ---- the tests ------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", [c for c in ALL_CASES if c.id not in ("help", "list-archs")], ids=lambda c: c.id)
def test_bmoe_py_answers_as_bmoe_cli(results, case):
    cli, py = results[case.id]
    problems = compare(case, cli, py)
    assert not problems, f"{case.id}: " + "\n".join(problems) + f"\n  cli argv {cli.argv}\n  py argv {py.argv}"


def test_the_grid_really_exercises_the_cache(results):
    """The grid is only worth something if its runs evict, re-read, prefetch and sample residency."""
    cli_summaries = {cid: parse_csv(r[0].csv)[3] for cid, r in results.items() if r[0].csv and r[0].code == 0}
    assert any(int(s.get("evictions", 0)) > 0 for s in cli_summaries.values())
    assert any(int(s.get("spec_useful", 0)) > 0 for s in cli_summaries.values())
    assert any(float(s.get("cache_hit_pct", 0)) > 50 for s in cli_summaries.values())
    assert any(s.get("cache_hit_pct") == "-1.0" for s in cli_summaries.values())
    residencies = {row[7] for r in results.values() if r[0].trace for row in _trace(r[0].trace)[1]}
    assert residencies == {"0", "1", "2"}  # misses, hits, and hits on a prefetched entry
    for cli, py in (results["tiny-residency-anon"], results["tiny-residency-mmap"]):
        for run in (cli, py):
            fracs = [float(row["dense_resident_frac"]) for row in parse_csv(run.csv)[2]]
            assert fracs[:30] == [-1.0] * 30 and all(0.0 <= f <= 1.0 for f in fracs[30:]), fracs


def test_help_and_list_archs(results):
    cli, py = results["help"]
    assert cli.code == py.code == 0 and cli.stdout.startswith(b"usage: ") and py.stdout.startswith(b"usage: ")
    cli, py = results["list-archs"]
    assert cli.code == py.code == 0
    cli_archs, py_archs = cli.stdout.decode().splitlines(), py.stdout.decode().splitlines()
    assert cli_archs[0] == py_archs[0] == "supported MoE architectures:"
    assert set(py_archs[1:]) <= set(cli_archs[1:])  # bmoe-py lists what it runs, a subset


def _cli_flags(help_text: str) -> set[str]:
    return set(re.findall(r"^\s+(?:-\w, )?(--[a-z][a-z0-9-]*)", help_text, re.MULTILINE)) | \
        set(re.findall(r"^\s+(-\w),", help_text, re.MULTILINE))


def test_every_bmoe_cli_flag_is_implemented_or_refused_as_unknown(bmoe_cli):
    help_text = subprocess.run([str(bmoe_cli), "--help"], capture_output=True, text=True, timeout=60).stdout
    cli_flags = _cli_flags(help_text)
    assert {"--moe-stream", "--chatml", "--ubatch", "-m", "--prefetch-sync"} <= cli_flags
    ours = implemented_flags()
    assert cli_flags - ours == set(NOT_IMPLEMENTED), "a bmoe-cli flag bmoe-py neither implements nor refuses"


@pytest.fixture(scope="module")
def unknown_answer(bmoe_cli) -> subprocess.CompletedProcess:
    return subprocess.run([str(bmoe_cli), "-m", TINY_REL, "-t", "1", "--frobnicate-flag"], capture_output=True,
                          cwd=UPSTREAM_DIR, timeout=60)


def _py(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return bmoe_py(*args, env=_clean_env(**(env or {})), cwd=UPSTREAM_DIR)


@pytest.mark.parametrize("flag", NOT_IMPLEMENTED)
def test_unimplemented_flag_is_answered_like_an_unknown_one(unknown_answer, flag):
    """A harness cell asking for a feature bmoe-py lacks must be config_error, never a measurement
    of something else: bmoe-py answers exactly as bmoe-cli answers a flag it does not know."""
    r = _py("-m", TINY_REL, "-t", "1", "-n", "4", flag, "512")
    assert unknown_answer.returncode == r.returncode == 1
    assert unknown_answer.stderr.decode().replace("--frobnicate-flag", flag) == r.stderr.decode() == \
        f"unknown arg: {flag}\n"
    assert unknown_answer.stdout.startswith(b"usage: ") and r.stdout.startswith(b"usage: ")


def test_env_features_bmoe_py_lacks_are_refused_not_ignored(bmoe_cli):
    """BMOE_OVERLAP with --moe-stream: bmoe-cli loads and fails (this build has no fork hook);
    bmoe-py refuses at validation. Both exit 1, so the harness never records a run without it."""
    cli = subprocess.run([str(bmoe_cli), "-m", TINY_REL, "-t", "1", "-n", "4", "--moe-stream"], capture_output=True,
                         cwd=UPSTREAM_DIR, env=_clean_env(BMOE_OVERLAP="1"), timeout=60)
    py = _py("-m", TINY_REL, "-t", "1", "-n", "4", "--moe-stream", env={"BMOE_OVERLAP": "1"})
    assert cli.returncode == py.returncode == 1
    assert py.stderr.decode() == (
        "config error: BMOE_OVERLAP asks for moe.overlap, which bmoe-py does not implement (unset it)\n")
    for env in ("BMOE_PREDICT_LOG", "BMOE_PREDICT_PREFETCH"):
        r = _py("-m", TINY_REL, "-n", "4", "--moe-stream", "--cache-mb", "2", "--force-cache", env={env: "1"})
        assert r.returncode == 1 and r.stderr.decode().startswith("config error: ")


def test_o_direct_on_tmpfs_is_the_documented_difference(bmoe_cli, tmp_path):
    """On tmpfs bmoe-cli opens O_DIRECT (Linux >= 6.6 accepts it there) and says o_direct=1 with
    4096-byte windows; bmoe-py reads buffered and says o_direct=0 (the file is page cache: there is
    nothing to bypass). Everything else stays equal."""
    shm = Path("/dev/shm")
    assert shm.is_dir(), "this machine has a tmpfs at /dev/shm"
    model = shm / f"bmoe-diff-{os.getpid()}.gguf"
    shutil.copyfile(UPSTREAM_DIR / TINY_REL, model)
    try:
        case = Case("tmpfs", "tmpfs", ("--moe-stream", "--cache-mb", "2", "--force-cache"), n=8)
        runs = run_pairs(bmoe_cli, [case], {"tmpfs": str(model)}, tmp_path)
    finally:
        model.unlink()
    cli, py = runs["tmpfs"]
    assert "o_direct=1 " in cli.stderr and "o_direct=0 " in py.stderr
    assert parse_csv(cli.csv)[0]["o_direct"] == "1" and parse_csv(py.csv)[0]["o_direct"] == "0"
    ctext, _ = stdout_lines(cli.stdout, False)
    ptext, _ = stdout_lines(py.stdout, False)
    assert ctext == ptext
    csum, psum = parse_csv(cli.csv)[3], parse_csv(py.csv)[3]
    assert csum["cache_hit_pct"] == psum["cache_hit_pct"] and csum["evictions"] == psum["evictions"]
    assert float(csum["read_MiB"]) > float(psum["read_MiB"])  # aligned windows vs exact slices


def test_a_near_tie_may_come_in_either_order_but_nothing_else_may():
    """The trace comparison's one leniency (_near_ties_in_order): two slots after the first whose
    weights are within the tolerance compare in expert order; the top slot and weights further
    apart keep their order, so a real difference in either still fails."""
    case = Case("synth-tie", "synth", (), weight_rel=2e-3)
    row = lambda step, slot, expert, w: ["0", "1", str(step), "2", str(slot), str(expert), w, "1", "0", "0"]  # noqa: E731
    cli = [row(27, 0, 3, "0.423762"), row(27, 1, 1, "0.288126"), row(27, 2, 5, "0.288113"), row(28, 0, 1, "0.5")]
    py = [row(27, 0, 3, "0.423752"), row(27, 1, 5, "0.288129"), row(27, 2, 1, "0.288119"), row(28, 0, 1, "0.5")]
    unweighted = lambda rows: [r[:6] + r[7:] for r in _near_ties_in_order(case, rows)]  # noqa: E731
    assert unweighted(cli) == unweighted(py) != [r[:6] + r[7:] for r in py]      # py had 5 before 1
    assert [r[4] for r in _near_ties_in_order(case, py)] == ["0", "1", "2", "0"]
    apart = [row(27, 0, 3, "0.42"), row(27, 1, 5, "0.30"), row(27, 2, 1, "0.28")]
    assert _near_ties_in_order(case, apart) == apart
    top = [row(27, 0, 5, "0.288129"), row(27, 1, 1, "0.288119")]
    assert _near_ties_in_order(case, top) == top
