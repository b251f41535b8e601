"""`bmoe-py --session` held to bmoe-cli 0.19.0's line protocol (docs/decisions/session-cells.md).

Both engines serve the same session on the same synthetic model (qwen3moe, Q8_0 experts, the
differential test's seed, where both route every token alike at top-k 2) with an 8 MiB cache, above
the 3.2 MiB token cycle and under the 12.75 MiB bank: three generations (the third continues the
second's KV), with a malformed line, an unknown command, a request without "cmd" and a request
over n_ctx among them, then EOF. Compared: the kind of every line in order, every line's keys in
order, and the values that are not timings (ids, token counts, n_prompt, n_past, hit %, MiB read,
the text). The expert cache stays warm across requests: the session's cumulative hit % rises past
the first request's, where a cache emptied between requests would replay the same prompt's lookups
and leave it unchanged. bmoe-cli is run with -t 1 (2-core machine)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from engine.app.protocol import CLOSE, Request, parse_request
from engine.gguf.synth import synth_options, write_model
from tests.conftest import UPSTREAM_HOST
from tests.engine.test_engine_cli import BMOE_PY

STREAM = ("--moe-stream", "--cache-mb", "8", "--force-cache")
PROMPT = "The capital of Japan is"
SESSION = b"\n".join([
    b'{"cmd":"generate","id":1,"prompt":"The capital of Japan is","n_predict":8}',
    b"this is not json",
    b'{"cmd":"frobnicate","id":99}',
    b'{"id":98,"prompt":"no cmd"}',
    b'{"cmd":"generate","id":2,"prompt":"The capital of Japan is","n_predict":6}',
    b'{"cmd":"generate","id":7,"prompt":"Hi","n_predict":5000}',
    b'{"cmd":"generate","id":3,"prompt":"Hello there","n_predict":4,"clear_kv":false}',
]) + b"\n"
# upstream's tiny model, where bmoe-py reproduces ggml's rounding: long turns, two continued
TINY_SESSION = b"\n".join([
    b'{"cmd":"generate","id":1,"prompt":"The capital of Japan is","n_predict":30}',
    b'{"cmd":"generate","id":2,"prompt":"The capital of Japan is","n_predict":20}',
    b'{"cmd":"generate","id":3,"prompt":"Hello there","n_predict":30,"clear_kv":false}',
    b'{"cmd":"generate","id":4,"prompt":"again","n_predict":30,"clear_kv":false}',
]) + b"\n"
# what the lines that are not timings must agree on
TIMED = {"load_s", "tok_s", "prefill_s", "prefill_tps", "compute_s_tok", "io_s_tok", "mgmt_s_tok", "cpu_s_tok",
         "majflt_tok", "loop_overhead_s_tok", "wall_ms", "io_ms", "compute_ms", "mgmt_ms", "cpu_ms", "majflt", "ms"}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("session-model") / "synth-qwen-q8.gguf"
    write_model(path, synth_options("qwen3moe", layers=4, experts=8, top_k=2, hidden=256, expert_ffn=512, vocab=300,
                                    quant="Q8_0", seed=1))
    return path


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("BMOE_")}


def lines_of(stdout: bytes) -> list[tuple[str, dict]]:
    """(kind, object) per line; the objects keep their key order. Token text is raw bytes, as
    the engines write it (a token may be half a UTF-8 sequence): read as latin-1."""
    out = []
    for raw in stdout.split(b"\n"):
        if not raw:
            continue
        kind, _, body = raw.decode("latin-1").partition(" ")
        out.append((kind, json.loads(body)))
    return out


def serve(prefix: list[str], model: Path, stdin: bytes, *extra: str, cwd: Path | None = None
          ) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, "-t", "1", "-m", str(model), "--session", *extra], input=stdin,
                          capture_output=True, env=_clean_env(), timeout=300, cwd=cwd)


@pytest.fixture(scope="module")
def py_run(model, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    d = tmp_path_factory.mktemp("py-session")
    return serve(BMOE_PY, model, SESSION, *STREAM, "--csv", str(d / "s.csv")), d


def _by_request(lines: list[tuple[str, dict]]) -> list[list[tuple[str, dict]]]:
    """The lines after BMOE_READY, one list per BMOE_BEGIN."""
    groups: list[list[tuple[str, dict]]] = []
    for kind, obj in lines[1:]:
        if kind == "BMOE_BEGIN":
            groups.append([])
        groups[-1].append((kind, obj))
    return groups


def test_bmoe_py_serves_the_session(py_run):
    r, _ = py_run
    assert r.returncode == 0, r.stderr
    assert b"Traceback" not in r.stderr
    lines = lines_of(r.stdout)
    kind, ready = lines[0]
    assert kind == "BMOE_READY"
    assert list(ready) == ["load_s", "arch", "n_ctx", "think_ctl", "n_expert_used"]
    assert ready["arch"] == "qwen3moe" and ready["n_ctx"] == 2048 and ready["n_expert_used"] == 2
    groups = _by_request(lines)
    # the malformed line, the unknown command and the line without "cmd" made no request
    assert [g[0][1]["id"] for g in groups] == [1, 2, 7, 3]
    assert [g[-1][0] for g in groups] == ["BMOE_DONE", "BMOE_DONE", "BMOE_ERROR", "BMOE_DONE"]
    refused = groups[2][-1][1]
    assert refused == {"id": 7, "fatal": False,
                       "msg": "prompt + n_predict exceeds the session n_ctx (2048); open the session with a larger "
                              "n_ctx"}
    for group, n_predict in zip([groups[0], groups[1], groups[3]], [8, 6, 4]):
        progress = [obj for kind, obj in group if kind == "BMOE_PROGRESS"]
        assert {kind for kind, _ in group[1:-1]} <= {"BMOE_LOAD", "BMOE_PROGRESS"}
        done = group[-1][1]
        assert len(progress) == done["tokens"] == n_predict and done["cancelled"] is False
        assert [p["step"] for p in progress] == list(range(1, n_predict + 1))
        assert {p["steps"] for p in progress} == {n_predict}
        assert "".join(p["delta_text"] for p in progress) == done["text"]
        assert done["n_past"] == done["n_prompt"] + done["tokens"]


def test_the_expert_cache_stays_warm_between_requests(py_run):
    r, _ = py_run
    dones = [obj for kind, obj in lines_of(r.stdout) if kind == "BMOE_DONE"]
    first, second, third = dones
    assert first["cache_budget_mib"] == 8
    # cumulative over the session: a cache emptied between requests would replay request 1's
    # lookups on the same prompt and leave the ratio exactly where request 1 left it
    assert second["cache_hit_pct"] > first["cache_hit_pct"] and third["cache_hit_pct"] > first["cache_hit_pct"]
    per_token = [obj for kind, obj in lines_of(r.stdout) if kind == "BMOE_PROGRESS"]
    assert per_token[8]["cache_hit_pct"] > per_token[0]["cache_hit_pct"]   # request 2's first token


def test_the_session_csv_has_one_preamble_and_a_block_per_turn(py_run):
    _, d = py_run
    text = (d / "s.csv").read_text()
    assert text.count("# bmoe_metrics v2") == 1 and text.count("\nstep,steps,") == 1
    summaries = [ln for ln in text.splitlines() if ln.startswith("# summary ")]
    assert [s.split()[2] for s in summaries] == ["tokens=8", "tokens=6", "tokens=4"]
    rows = [ln.split(",") for ln in text.splitlines() if ln[:1].isdigit()]
    header = text.splitlines()[5].split(",")
    turns = [int(row[header.index("turn")]) for row in rows]
    assert turns == [0] * 8 + [1] * 6 + [2] * 4     # the refused request is no turn


def assert_same_lines(ours: list[tuple[str, dict]], theirs: list[tuple[str, dict]]) -> None:
    assert [k for k, _ in ours] == [k for k, _ in theirs]
    for (kind, a), (_, b) in zip(ours, theirs):
        assert list(a) == list(b), kind       # same keys, same order
        assert {k: v for k, v in a.items() if k not in TIMED} == {k: v for k, v in b.items() if k not in TIMED}, kind


def test_same_lines_as_bmoe_cli(bmoe_cli, model, py_run):
    """The synthetic model amplifies last-ulp differences (test_differential's docstring): the
    continued turn is kept to the 4 tokens both engines produce alike before a near-tie flips."""
    py, _ = py_run
    cli = serve([str(bmoe_cli)], model, SESSION, *STREAM)
    assert cli.returncode == py.returncode == 0
    assert_same_lines(lines_of(py.stdout), lines_of(cli.stdout))
    # and on stderr only the load lines bmoe-py prints for a one-shot run too
    cli_bmoe = [ln for ln in cli.stderr.decode().splitlines() if ln.startswith("bmoe:") and "dropped" not in ln]
    assert py.stderr.decode().splitlines() == cli_bmoe


def test_continued_turns_same_lines_as_bmoe_cli(bmoe_cli):
    cwd = UPSTREAM_HOST.parent
    tiny = Path(UPSTREAM_HOST.name) / "tiny-qwen3moe.gguf"
    args = ("--moe-stream", "--cache-mb", "4", "--force-cache")
    py, cli = serve(BMOE_PY, tiny, TINY_SESSION, *args, cwd=cwd), serve([str(bmoe_cli)], tiny, TINY_SESSION, *args,
                                                                          cwd=cwd)
    assert cli.returncode == py.returncode == 0
    ours = lines_of(py.stdout)
    assert [obj["tokens"] for kind, obj in ours if kind == "BMOE_DONE"] == [30, 20, 30, 30]
    assert_same_lines(ours, lines_of(cli.stdout))


def test_without_streaming_same_lines_as_bmoe_cli(bmoe_cli, model):
    stdin = SESSION.split(b"\n")[0] + b"\n"
    py, cli = serve(BMOE_PY, model, stdin), serve([str(bmoe_cli)], model, stdin)
    ours, theirs = lines_of(py.stdout), lines_of(cli.stdout)
    assert [k for k, _ in ours] == [k for k, _ in theirs] == ["BMOE_READY", "BMOE_BEGIN"] + ["BMOE_PROGRESS"] * 8 + [
        "BMOE_DONE"]
    done = ours[-1][1]
    assert done["cache_hit_pct"] == -1.0 and done["read_mib"] == 0.0 and done["compute_s_tok"] == 0.0
    for (_, a), (_, b) in zip(ours, theirs):
        assert {k: v for k, v in a.items() if k not in TIMED} == {k: v for k, v in b.items() if k not in TIMED}


def _cancel_session(prefix: list[str], model: Path) -> tuple[list[tuple[str, dict]], int]:
    """A generation of 1900 tokens cancelled once its third token is out, then a short one. The
    first cancel, sent with nothing in flight, must not touch the generation after it."""
    p = subprocess.Popen([*prefix, "-t", "1", "-m", str(model), "--session", *STREAM], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_clean_env())
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(b'{"cmd":"cancel"}\n{"cmd":"generate","id":1,"prompt":"' + PROMPT.encode() + b'","n_predict":1900}\n')
    p.stdin.flush()
    out, n_progress = b"", 0
    for line in p.stdout:
        out += line
        n_progress += line.startswith(b"BMOE_PROGRESS")
        if n_progress == 3 and line.startswith(b"BMOE_PROGRESS"):
            p.stdin.write(b'{"cmd":"cancel"}\n')
            p.stdin.flush()
        if line.startswith(b"BMOE_DONE"):
            break
    p.stdin.write(b'{"cmd":"generate","id":2,"prompt":"Hello","n_predict":3}\n')
    p.stdin.close()
    out += p.stdout.read()
    p.stdout.close()
    return lines_of(out), p.wait(timeout=120)


def _check_cancelled(lines: list[tuple[str, dict]], code: int) -> None:
    assert code == 0
    dones = [obj for kind, obj in lines if kind == "BMOE_DONE"]
    assert dones[0]["id"] == 1 and dones[0]["cancelled"] is True and 3 <= dones[0]["tokens"] < 1900
    assert dones[0]["n_past"] == dones[0]["n_prompt"] + dones[0]["tokens"]
    assert dones[1]["id"] == 2 and dones[1]["cancelled"] is False and dones[1]["tokens"] == 3


def test_cancel_stops_the_generation_and_keeps_the_session(model):
    _check_cancelled(*_cancel_session(BMOE_PY, model))


def test_cancel_as_bmoe_cli(bmoe_cli, model):
    _check_cancelled(*_cancel_session([str(bmoe_cli)], model))


@pytest.mark.parametrize("engine", ["py", "cli"])
def test_close_ends_the_session_with_stdin_still_open(engine, model, request):
    prefix = BMOE_PY if engine == "py" else [str(request.getfixturevalue("bmoe_cli"))]
    p = subprocess.Popen([*prefix, "-t", "1", "-m", str(model), "--session"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_clean_env())
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(b'{"cmd":"generate","id":5,"prompt":"Hi","n_predict":2}\n{"cmd":"close"}\n'
                  b'{"cmd":"generate","id":6,"prompt":"Hi","n_predict":2}\n')
    p.stdin.flush()
    try:
        code = p.wait(timeout=120)          # a bound on the wait, not a speed: stdin stays open
        out = p.stdout.read()
    finally:
        p.stdin.close()
        p.stdout.close()
        if p.poll() is None:
            p.kill()
            p.wait()
    assert code == 0
    assert [obj["id"] for kind, obj in lines_of(out) if kind == "BMOE_BEGIN"] == [5]


def test_a_model_that_does_not_load_is_a_fatal_error_line(tmp_path):
    notes = tmp_path / "notes.gguf"
    notes.write_text("not a model\n")
    r = serve(BMOE_PY, notes, b'{"cmd":"generate","id":1}\n')
    assert r.returncode == 1 and r.stderr == b""
    [(kind, obj)] = lines_of(r.stdout)
    assert kind == "BMOE_ERROR" and obj["id"] == 0 and obj["fatal"] is True
    assert obj["msg"].startswith(f"failed to load model: {notes}")


def test_config_errors_come_before_the_session(model):
    r = serve(BMOE_PY, model, b"", "-n", "0")
    assert r.returncode == 1 and r.stdout == b"" and r.stderr == b"config error: n_predict must be positive\n"


# ---- bmoe-cli's flat request reading, field by field ----------------------------------------------
def test_requests_are_read_as_bmoe_cli_reads_them():
    assert parse_request(b'{"cmd":"cancel"}', 128) == "cancel"
    assert parse_request(b'{"cmd":"close","id":3}', 128) is CLOSE
    for ignored in (b"", b"garbage", b'{"cmd":5}', b'{"cmd":"quit"}', b'{"id":1,"prompt":"x"}', b'{"cmd" "generate"}'):
        assert parse_request(ignored, 128) is None, ignored
    # defaults: the -n flag, think and clear_kv true, id 0, an empty prompt
    assert parse_request(b'{"cmd":"generate"}', 17) == Request(n_predict=17)
    # spaces around the colon, a truncated line, atoi's junk and prefixes, bools only as `true`
    got = parse_request(b'{ "cmd" : "generate", "id": "abc", "n_predict": 12.9x, "think": false, '
                        b'"clear_kv": 1, "prompt": "unterminated', 128)
    assert got == Request(id=0, prompt=b"unterminated", n_predict=12, think=False, clear_kv=False)
    # escapes: \uXXXX is one byte (its low 8 bits), an unknown escape is its character, a short
    # \u is dropped and its digits read as text
    got = parse_request(rb'{"cmd":"generate","prompt":"a\n\t\"\\\/\u0041\u00e9\u4142\q\u12"}', 1)
    assert isinstance(got, Request) and got.prompt == b'a\n\t"\\/A\xe9Bq12'
    assert parse_request(b'{"cmd":"generate","id":-2147483649}', 1) == Request(id=2147483647, n_predict=1)
