"""The demo reruns over its own earlier output: a folder that holds an earlier release's demo (a
plan this one does not have) is kept under a free name, not deleted, and the demo starts afresh; a
folder that holds this plan resumes. A real local campaign on the tiny model."""

from __future__ import annotations

import io
import json

from harness.campaign.file import parse_campaign
from harness.demo import run_into


def campaign(model, budgets: list[int]):
    return parse_campaign({"version": 1, "name": "demo", "fleet": {"devices": ["local"]}, "models": {"m": str(model)},
                           "axes": {"cache_mb": budgets, "dense_weights": ["anon"]},
                           "run": {"n_predict": 2, "threads": 1, "retries": 0}, "gate": {"max_wait_s": 1}},
                          source="demo.toml")


def budgets_run(folder) -> list[int]:
    return sorted(json.loads(p.read_text())["config"]["cache_mb"] for p in folder.glob("runs/*/*/run.json"))


def test_an_earlier_demos_campaign_is_kept_aside_and_this_one_runs(tmp_path, tiny_model):
    out = tmp_path / "campaign"
    said = io.StringIO()
    echo = lambda line: said.write(line + "\n")   # noqa: E731
    assert run_into(campaign(tiny_model, [0]), out, echo).complete
    old_plan = (out / "plan.json").read_bytes()
    assert run_into(campaign(tiny_model, [0, 1]), out, echo).complete       # another plan: a newer demo
    kept = tmp_path / "campaign.previous-1"
    assert (kept / "plan.json").read_bytes() == old_plan and budgets_run(kept) == [0]
    assert budgets_run(out) == [0, 1]
    assert f"kept as {kept.name}" in said.getvalue()
    assert run_into(campaign(tiny_model, [0, 1]), out, echo).complete       # the same plan: resumed, nothing new
    assert budgets_run(out) == [0, 1] and not (tmp_path / "campaign.previous-2").exists()
