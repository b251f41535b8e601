"""Which flags an engine takes, asked of the engine itself on this host before a preset's campaign
is built: each flag with `--version` after it (parsed, nothing loaded), and `--overlap`, which a
build can list and still refuse at load, tried on the model with one token."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

from engine.interface.flags import CACHE_MB, MODEL, MOE_STREAM, N_PREDICT, OVERLAP, PROMPT, THREADS, VERSION
from harness.campaign.defaults import PYTHON_ENGINE
from harness.campaign.model import CampaignError
from results.analysis.community import COMMUNITY_FLAGS
from results.read.parse_console import says_why


def _engine_command(engine: str) -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BMOE_")}
    if engine == PYTHON_ENGINE:
        return [sys.executable, "-m", "engine"], env
    path = os.path.abspath(engine)
    env["LD_LIBRARY_PATH"] = os.path.dirname(path)
    return [path], env


def protocol_flags(engine: str, model_path: str | None,
                   flags: Sequence[tuple[str, ...]] = COMMUNITY_FLAGS) -> tuple[list[tuple[str, ...]], list[str]]:
    """The protocol flags this engine takes (run on this host), and a note for each it does not.
    A flag is asked for with `--version` after it (parsed, nothing loaded); `--overlap`, which a
    build can list and still refuse at load, is also tried on the model with one token."""
    argv0, env = _engine_command(engine)
    kept: list[tuple[str, ...]] = []
    notes: list[str] = []
    for flag in flags:
        answer = _run(argv0 + list(flag) + [VERSION.typed], env)
        if answer is None:
            raise CampaignError(f"--engine {engine}: cannot be run on this host to check the protocol's flags")
        if answer[0] != 0:
            notes.append(f"{flag[0]} left out: the engine does not take it ({_line(answer[1], flag[0])})")
            continue
        kept.append(flag)
    overlap = (OVERLAP.typed,)
    if overlap in kept and model_path and os.path.isfile(model_path):
        one_token = [MODEL.typed, model_path, PROMPT.typed, "x", N_PREDICT.typed, "1", THREADS.typed, "1",
                     MOE_STREAM.typed, CACHE_MB.typed, "0", OVERLAP.typed]
        answer = _run(argv0 + one_token, env, timeout_s=600)
        if answer is not None and answer[0] != 0 and "overlap" in answer[1]:
            kept.remove(overlap)
            notes.append(f"{OVERLAP.typed} left out: the engine refuses it at load ({_line(answer[1], 'overlap')})")
    return kept, notes


def _run(argv: list[str], env: Mapping[str, str], timeout_s: float = 60) -> tuple[int, str] | None:
    try:
        done = subprocess.run(argv, env=dict(env), capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.returncode, (done.stderr + done.stdout).decode("utf-8", "replace")


def _line(text: str, needle: str) -> str:
    from engine.safetext import excerpt

    lines = [line.strip() for line in text.splitlines() if needle in line and says_why(line)]
    lines = lines or [line.strip() for line in text.splitlines() if says_why(line)]
    return excerpt(lines[0] if lines else "no reason given", 160)
