"""run.json typed (store.run_record.RunRecord): every version bmoe-fleet has written reads into it
and writes back byte for byte; a wrong type or an unknown outcome is one line naming the file and key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from store import outcomes, versioned
from store.campaign_dir import CampaignDir
from store.cells import CellConfig
from store.errors import StoreError
from store.ledger import was_attempted
from store.run_record import RunRecord, thawed

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "run-json"
FILES = sorted(FIXTURES.glob("*.json"))


def test_the_fixtures_cover_the_writers():
    """tests/fixtures/run-json/README.md lists where each came from: the oldest worker, two later
    ones, today's (a run, a knee probe and its cell, a cell recorded without running), the importer,
    and phones (other apps, lmkd's collateral and verdicts, reclaim)."""
    readme = (FIXTURES / "README.md").read_text()
    assert len(FILES) >= 10 and all(f"`{p.name}`" in readme for p in FILES)
    docs = [json.loads(p.read_text()) for p in FILES]
    keys = {k for d in docs for k in d}
    assert {"pass", "attempted", "reclaim", "cpu", "oom_score_adj", "imported_from", "notes", "turns", "provenance",
            "apps", "collateral", "lmkd_setting", "app_verdicts"} <= keys
    assert {outcomes.OK, outcomes.KILLED, outcomes.CONFIG_ERROR, outcomes.ENGINE_ERROR} <= {d["outcome"] for d in docs}
    assert any("attempted" not in d for d in docs) and any(d.get("attempted") is False for d in docs)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_stored_run_json_reads_into_the_record_and_writes_back_byte_for_byte(path, tmp_path):
    raw = json.loads(path.read_text())
    record = RunRecord.read(path)
    assert record.cell_id == raw["cell_id"] and record.attempt == raw["attempt"] >= 1
    assert record.outcome in outcomes.OUTCOMES and record.outcome == raw["outcome"]
    assert isinstance(record.config, CellConfig) and record.config.to_dict() == raw["config"]
    assert record.argv == tuple(raw["argv"]) and all(isinstance(a, str) for a in record.argv)
    assert record.evidence == tuple(raw["evidence"]) and record.pass_no == raw["pass"]
    assert record.started_at == raw["started_at"] and record.ended_at == raw["ended_at"]
    # a key the file predates reads as its empty value
    assert thawed(record.reclaim) == raw.get("reclaim") and thawed(record.cpu) == raw.get("cpu")
    assert thawed(record.apps) == (raw.get("apps") or []) and thawed(record.quality) == raw.get("quality")
    assert thawed(record.collateral) == (raw.get("collateral") or []) and thawed(record.turns) == (raw.get("turns") or [])
    assert thawed(record.app_verdicts) == (raw.get("app_verdicts") or []) and record.notes == tuple(raw.get("notes") or ())
    assert was_attempted(record) is (raw.get("attempted", True) is not False)
    assert thawed(record.engine) == raw["engine"] and thawed(record.summary) == raw["summary"]
    assert record.to_dict() == raw and list(record.to_dict()) == list(raw)
    versioned.write_json(tmp_path / "run.json", record.to_dict())
    assert (tmp_path / "run.json").read_bytes() == path.read_bytes()
    assert RunRecord.from_dict(record.to_dict(), path) == record


def test_nested_parts_are_read_only():
    record = RunRecord.read(FIXTURES / "653e80b-local-ok.json")
    with pytest.raises(TypeError):
        record.pressure["peak_rss_kb"] = 0          # type: ignore[index]
    assert isinstance(record.gate, type(record.pressure)) and isinstance(record.lmk_events, tuple)
    with pytest.raises(AttributeError):
        record.outcome = outcomes.KILLED            # type: ignore[misc]


def _doc(**changes):
    doc = json.loads((FIXTURES / "653e80b-local-ok.json").read_text())
    doc.update(changes)
    return doc


@pytest.mark.parametrize(("changes", "says"), [
    ({"outcome": "exploded"}, "'outcome' is 'exploded', not one of ok,"),
    ({"attempt": "1"}, "'attempt' is str '1', not an integer"),
    ({"evidence": "one line"}, "'evidence' is str 'one line', not an array of strings"),
    ({"timed_out": 0}, "'timed_out' is int 0, not a boolean"),
    ({"config": [1]}, "'config' is list, not an object"),
    ({"wall_s": "fast"}, "'wall_s' is str 'fast', not a number or null"),
    ({"cell_id": ""}, "'cell_id' is missing or empty"),
])
def test_a_wrong_value_is_one_line_naming_the_file_and_the_key(changes, says):
    with pytest.raises(StoreError) as e:
        RunRecord.from_dict(_doc(**changes), "runs/c-1/1/run.json")
    text = str(e.value)
    assert "\n" not in text and text.startswith("runs/c-1/1/run.json: run.json key ") and says in text


def test_a_newer_version_is_refused_and_unknown_keys_are_kept_in_their_place():
    with pytest.raises(StoreError, match="newer than this bmoe-fleet reads"):
        RunRecord.from_dict(_doc(version=versioned.RUN.version + 1), "run.json")
    doc = _doc()
    doc = {**{k: v for k, v in list(doc.items())[:5]}, "from_the_future": {"x": [1]}, **doc}
    record = RunRecord.from_dict(doc, "run.json")
    assert record.extra == {"from_the_future": {"x": [1]}} and list(record.to_dict()) == list(doc)
    assert record.with_(order=7).order == 7 and list(record.with_(order=7).to_dict()) == list(doc)


def test_commit_takes_a_record_and_read_run_gives_it_back(tmp_path):
    cdir = CampaignDir(tmp_path)
    record = RunRecord.read(FIXTURES / "653e80b-local-ok.json")
    tmp = cdir.start_attempt(record.cell_id, record.attempt)
    cdir.commit_attempt(tmp, record)
    assert cdir.read_run(record.cell_id, record.attempt) == record
    assert [(cell, attempt) for cell, attempt, _ in cdir.attempt_paths()] == [(record.cell_id, 1)]
    (line,) = cdir.ledger.read()
    assert line["outcome"] == record.outcome and line["attempted"] is True
    with pytest.raises(StoreError, match=r"/2/run\.json: cannot read"):
        cdir.read_run(record.cell_id, 2)


def test_a_campaign_read_for_its_runs_reads_each_record_when_asked_and_checks_its_folder(tmp_path):
    from results.errors import ResultsError
    from results.read.rundir import read_campaign

    cdir = CampaignDir(tmp_path)
    record = RunRecord.read(FIXTURES / "653e80b-local-ok.json")
    for attempt in (1, 2):
        cdir.commit_attempt(cdir.start_attempt(record.cell_id, attempt), record.with_(attempt=attempt))
    folder = tmp_path / "runs" / record.cell_id
    (folder / "2" / "run.json").write_text((folder / "1" / "run.json").read_text())   # attempt 1's record, moved
    first, second = read_campaign(tmp_path).runs                   # listed from the folders: nothing read yet
    assert (first.run_id.split("/")[1:], second.run_id.split("/")[1:]) == ([record.cell_id, "1"], [record.cell_id, "2"])
    assert (first.latest, second.latest) == (False, True) and "record" not in vars(first)
    assert first.record.attempt == 1 and "record" in vars(first)
    with pytest.raises(ResultsError, match=r"/2: its run\.json does not read as attempt 2 of "):
        _ = second.record
    (folder / "1" / "run.json").write_text("{")
    with pytest.raises(StoreError, match=r"/1/run\.json: cannot read"):
        _ = read_campaign(tmp_path).runs[0].record
