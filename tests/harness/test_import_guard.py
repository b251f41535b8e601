"""`bmoe-fleet import` keeps off campaign directories: a sweep's directory is never extended (its
plan would no longer resume), and campaign directories inside a source folder (the import's own
output among them) are skipped, not imported again as upstream runs (docs/decisions/importer.md)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.campaign.file import parse_campaign
from harness.campaign.model import CampaignError
from harness.importer import import_runs
from harness.run.runner import run_campaign
from harness.run.status import campaign_status

UPSTREAM = Path(__file__).resolve().parents[1] / "fixtures" / "upstream"


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _upstream_run(folder: Path, stem: str = "qwen_c2000_l2") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for f in (UPSTREAM / "2026-07-12").glob(f"{stem}.*"):
        shutil.copyfile(f, folder / f.name)
    return folder


def test_import_into_a_sweep_directory_is_refused_and_the_sweep_still_resumes(tmp_path, tiny_model, cli):
    campaign = parse_campaign({"version": 1, "name": "sweep", "fleet": {"devices": ["local"]},
                               "models": {"m": str(tiny_model)}, "axes": {"cache_mb": [0]},
                               "run": {"n_predict": 2}, "gate": {"max_wait_s": 1}}, source="sweep.toml")
    sweep = tmp_path / "sweep"
    run_campaign(campaign, sweep, progress_stream=io.StringIO())
    before = _snapshot(sweep)
    src = _upstream_run(tmp_path / "src")
    result = CliRunner().invoke(cli, ["import", str(src), "-o", str(sweep)])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "is a sweep's campaign directory" in result.output, result.output
    assert _snapshot(sweep) == before                       # nothing written, not even plan.json
    # the sweep is untouched: a rerun finds its plan complete and runs nothing
    run_campaign(campaign, sweep, progress_stream=io.StringIO())
    after = _snapshot(sweep)
    assert after.keys() == before.keys() and after["ledger.jsonl"] == before["ledger.jsonl"]
    assert campaign_status(sweep).complete


def test_a_folder_that_is_not_an_import_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(CampaignError, match="holds no imported campaign"):
        import_runs([_upstream_run(tmp_path / "src")], out)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_an_output_folder_inside_the_source_is_skipped_not_imported_again(tmp_path):
    src = _upstream_run(tmp_path / "data")
    out = src / "imported"
    first = import_runs([src], out)
    assert (first.found, first.added) == (1, 1) and first.skipped_dirs == ()
    # an older import kept in the data folder, under another name, is a campaign directory too
    shutil.copytree(out, src / "old-import")
    _upstream_run(src, "gemma_stream")                      # and one new upstream run
    second = import_runs([src], out)
    assert (second.found, second.added, second.skipped) == (2, 1, 1)
    assert set(second.skipped_dirs) == {str(out), str(src / "old-import")}
    assert "skipped" in second.text() and "a campaign directory, not upstream runs" in second.text()
    sources = sorted(json.loads(p.read_text())["config"]["source"] for p in out.glob("runs/*/1/run.json"))
    assert sources == ["data/gemma_stream", "data/qwen_c2000_l2"]
    assert len(json.loads((out / "plan.json").read_text())["cells"]) == 2


def test_a_source_inside_the_output_or_that_is_a_campaign_is_refused(tmp_path):
    out = tmp_path / "out"
    import_runs([_upstream_run(tmp_path / "src")], out)
    before = _snapshot(out)
    with pytest.raises(CampaignError, match="is inside the output folder"):
        import_runs([out / "runs"], out)
    with pytest.raises(CampaignError, match="is inside the output folder"):
        import_runs([out], out)
    with pytest.raises(CampaignError, match="is a bmoe-fleet campaign directory"):
        import_runs([out], tmp_path / "elsewhere")
    assert _snapshot(out) == before and not (tmp_path / "elsewhere").exists()
