"""An engine line is matched in one place: results.read.parse_console.

The engine's stdout and stderr lines (`bmoe: …` load lines, refusals, the end-of-run block) are read
by the console parser, and the verdicts the harness and the reports make of a run (did O_DIRECT
hold, was the command line taken or refused, why a flag was refused, did it stream) are the parser's
functions. A module of harness/, results/, devices/ or store/ that spells an engine line itself, in a
regex or a plain string, is found here by the line starts the parser declares; its docstrings and
comments may name the lines. The engine writes the lines, so engine/ is not read.
"""

from __future__ import annotations

import ast
from pathlib import Path

from devices.base import RunOutcome
from harness.campaign import engine_probe
from harness.run.classify import Classified, classify, judge_single_run, o_direct_in_effect
from results.read import parse_console as pc
from store import outcomes

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "results", "devices", "store")
READER = Path("results/read/parse_console.py")
# how the engine's lines begin, as the parser declares them: its stderr prefix, the refusals, the
# end-of-run lines (the `moe-` family by each line's own name: `--moe-stream` is a flag, not a line)
MARKS = tuple(dict.fromkeys((
    "bmoe: ", pc.STREAMING_ON, pc.CONFIG_ERROR, pc.UNKNOWN_ARG, pc.MISSING_VALUE,
    *(p for p in pc.PERF_PREFIXES if p != "moe-"),
    *sorted(f"{name}:" for name in pc.HANDLED_LINES if name.startswith("moe-")))))


def _documentation(tree: ast.AST) -> set[int]:
    """The ids of a module's bare string statements: docstrings and the like, prose not code."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}


def engine_text(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """`path:line: mark in 'text'` for each string of code (not documentation) under `root`'s
    packages, the console parser aside, that holds the start of an engine line."""
    found: list[tuple[Path, int, str]] = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            if rel == READER:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            prose = _documentation(tree)
            for node in ast.walk(tree):
                if not isinstance(node, ast.Constant) or id(node) in prose:
                    continue
                value = node.value
                text = value.decode("latin-1") if isinstance(value, bytes) else value
                if not isinstance(text, str):
                    continue
                marks = [repr(mark) for mark in MARKS if mark in text]
                if marks:
                    found.append((rel, node.lineno, f"{', '.join(marks)} in {text[:60]!r}"))
    return [f"{rel}:{line}: {what}" for rel, line, what in sorted(found)]


def test_no_module_but_the_console_parser_spells_an_engine_line():
    found = engine_text(ROOT)
    assert not found, ("engine lines matched outside results/read/parse_console.py; give the parser a "
                       "function for what the caller asks and call it:\n" + "\n".join(found))


def test_the_scan_finds_an_engine_pattern_planted_in_code_and_not_in_prose(tmp_path):
    (tmp_path / "harness" / "run").mkdir(parents=True)
    (tmp_path / "harness" / "run" / "planted.py").write_text(
        '"""Reads `bmoe: expert streaming ON` lines (prose: allowed)."""\n'
        "import re\n"
        "# unknown arg: a comment is prose too\n"
        '_RE = re.compile(r"^generation: (\\d+) tokens")\n'
        "def f(err: bytes) -> bool:\n"
        '    """config error: in a docstring."""\n'
        '    return b"moe-cache:" in err\n')
    assert engine_text(tmp_path) == [
        "harness/run/planted.py:4: 'generation:' in '^generation: (\\\\d+) tokens'",
        "harness/run/planted.py:7: 'moe-cache:' in 'moe-cache:'",
    ]


# ── the callers' verdicts are the parser's ───────────────────────────────────────────────────────

STREAMING = "bmoe: expert streaming ON  n_expert=8 o_direct={} io_threads=4 cache=0 MiB shards=1"


def _outcome(status: int | None, stderr: str, stdout: str = "") -> RunOutcome:
    return RunOutcome(("bmoe-cli",), status, 1234, False, 1.0, stdout.encode(), stderr.encode(), (), 0.0)


def test_o_direct_in_effect_is_the_last_streaming_line_the_parser_reads():
    # a fallback prints the line again: the last one is what held
    stderr = "\n".join([STREAMING.format(1), "bmoe: O_DIRECT refused, falling back", STREAMING.format(0)])
    assert pc.o_direct_seen(stderr) == 0
    assert o_direct_in_effect(stderr.encode(), None) == 0
    assert pc.parse_console(stderr.splitlines()).streaming.o_direct is False
    assert o_direct_in_effect(b"no streaming line\n", None) is None and pc.o_direct_seen("") is None


def test_a_refusal_is_config_error_and_the_same_line_judges_the_single_run():
    for line in ("config error: --cache-mb 137 is below the cycle; add --force-cache",
                 "unknown arg: --overlapp", "missing value for --cache-mb",
                 "bmoe: --dense-weights expects anon, warm or mmap"):
        assert pc.is_refusal(line)
        done = classify(_outcome(2, f"bmoe: loading\n{line}\n"), (), None, True, True)
        assert done == Classified(outcomes.CONFIG_ERROR, ("exit status 2", line))
        assert judge_single_run(_outcome(2, f"{line}\n")) == ("refused", line)
    # not a refusal: an engine error, named by its own line, else the last
    assert not pc.is_refusal("error: cannot open model") and pc.is_error("  error: cannot open model")
    failed = classify(_outcome(1, "bmoe: loading\n  error: cannot open model\nbye\n"), (), None, True, True)
    assert failed.outcome == outcomes.ENGINE_ERROR and failed.evidence == ("exit status 1", "  error: cannot open model")
    assert judge_single_run(_outcome(3, "bmoe: loading\nSegfault\n")) == ("failed", "exit status 3: Segfault")


def test_an_accepted_run_is_named_by_its_streaming_or_generation_line():
    line = STREAMING.format(1)
    assert judge_single_run(_outcome(0, f"bmoe: loading\n{line}  \n")) == ("accepted", line)
    assert pc.accepted_line(f"{line}\n") == line
    generation = "generation: 1 tokens, 0.05 s/token (20.0 tok/s)"
    assert judge_single_run(_outcome(0, "bmoe: loading\n", f"text\n{generation}\n")) == ("accepted", generation)
    assert pc.parse_console([generation]).generation is not None
    assert judge_single_run(_outcome(0, "", "text\n")) == ("accepted", "exit status 0")


def test_the_probe_names_the_engines_reason_for_a_refused_flag():
    text = "bmoe-cli 0.19.0\nconfig error: --overlap needs --moe-stream\nunknown arg: --spec-gate\n"
    assert engine_probe._line(text, "spec-gate") == "unknown arg: --spec-gate"
    assert engine_probe._line(text, "absent") == "config error: --overlap needs --moe-stream"
    assert engine_probe._line("usage: …\n", "x") == "no reason given"
    assert [pc.says_why(line) for line in text.splitlines()] == [False, True, True]


def test_a_run_streamed_when_its_stderr_holds_the_streaming_line():
    assert pc.streamed(f"bmoe: loading\n{STREAMING.format(1)}\n")
    assert not pc.streamed("bmoe: dense-weights=anon: 12.0 MiB in 3 anon buffers\n")
