"""The one versioned JSON reader: an older document is upgraded on read, a newer one refused with
one line; the same for ledger lines; and the commands that read a directory say so in one line."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from store import versioned
from store.campaign_dir import CampaignDir
from store.errors import StoreError
from store.ledger import Ledger


@pytest.fixture
def registry(monkeypatch):
    """A private copy of the format registry (formats registered by a test go with it)."""
    monkeypatch.setattr(versioned, "_REGISTRY", dict(versioned._REGISTRY))


def test_an_older_document_is_upgraded_on_read_step_by_step(tmp_path, registry):
    def v1_to_v2(doc):                  # version 2 renamed budget to budget_mib
        doc["budget_mib"] = doc.pop("budget")
        return doc

    def v2_to_v3(doc):                  # version 3 added the unit of the speed
        doc["speed_unit"] = "tok/s"
        return doc

    versioned.register("bmoe-fleet.test-thing", 3, {1: v1_to_v2, 2: v2_to_v3})
    path = tmp_path / "thing.json"
    text = json.dumps({"format": "bmoe-fleet.test-thing", "version": 1, "budget": 512})
    path.write_text(text)
    assert versioned.read_json(path, "bmoe-fleet.test-thing") == {
        "format": "bmoe-fleet.test-thing", "version": 3, "budget_mib": 512, "speed_unit": "tok/s"}
    assert path.read_text() == text                                   # upgraded in memory, never rewritten
    path.write_text(json.dumps({"format": "bmoe-fleet.test-thing", "version": 2, "budget_mib": 7}))
    assert versioned.read_json(path, "bmoe-fleet.test-thing")["speed_unit"] == "tok/s"


def test_a_newer_document_is_refused_with_one_line_naming_it(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"format": "bmoe-fleet.run", "version": 2, "cell_id": "c-1"}))
    with pytest.raises(StoreError) as e:
        versioned.read_json(path, versioned.RUN.name)
    message = str(e.value)
    assert "\n" not in message and message.startswith(str(path))
    assert "bmoe-fleet.run version 2 is newer than this bmoe-fleet reads (1); upgrade bmoe-fleet" in message


@pytest.mark.parametrize(("doc", "says"), [
    ({"format": "bmoe-fleet.test-gap", "version": 1}, "version 1 is older than any this bmoe-fleet reads (3)"),
    ({"format": "bmoe-fleet.test-gap", "version": "2"}, "version '2' is not a version number"),
    ({"format": "bmoe-fleet.test-gap", "version": True}, "version True is not a version number"),
    ({"format": "bmoe-fleet.plan", "version": 1}, "not a bmoe-fleet.test-gap file"),
    ([1, 2], "not a bmoe-fleet.test-gap file"),
])
def test_what_no_upgrade_reaches_is_refused(tmp_path, registry, doc, says):
    versioned.register("bmoe-fleet.test-gap", 3, {2: lambda d: d})     # no way up from version 1
    path = tmp_path / "gap.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(StoreError, match=re.escape(says)):
        versioned.read_json(path, "bmoe-fleet.test-gap")


def test_an_upgrade_must_start_below_the_version_written(registry):
    with pytest.raises(ValueError, match=re.escape("upgrades must be from versions 1..1")):
        versioned.register("bmoe-fleet.test-bad", 2, {2: lambda d: d})


def test_a_newer_ledger_line_is_refused_naming_its_line(tmp_path):
    path = tmp_path / "ledger.jsonl"
    line = {"format": "bmoe-fleet.ledger", "version": 1, "cell_id": "c-1", "attempt": 1, "outcome": "ok"}
    path.write_text(json.dumps(line) + "\n" + json.dumps({**line, "attempt": 2, "version": 5}) + "\n")
    with pytest.raises(StoreError, match="^" + re.escape(f"{path}:2: bmoe-fleet.ledger version 5 is newer")):
        Ledger(path).read()
    path.write_text(json.dumps(line) + "\n" + json.dumps(line)[:20])   # a torn last line: no record
    assert Ledger(path).read() == [line]


def test_status_and_table_refuse_a_newer_directory_in_one_line(tmp_path, cli):
    root = tmp_path / "camp"
    cdir = CampaignDir(root)
    root.mkdir()
    cdir.write_plan_doc({"format": "bmoe-fleet.plan", "version": 9, "campaign": "future", "cells": []})
    for command in (["status", str(root)], ["table", str(root)]):
        result = CliRunner().invoke(cli, command)
        assert result.exit_code == 1, result.output
        assert result.output.count("\n") == 1 and "plan version 9 is newer than this bmoe-fleet reads (1)" in \
            result.output, result.output


def test_what_is_written_is_strict_json(tmp_path):
    path = tmp_path / "x.json"
    versioned.write_json(path, {**versioned.RUN.stamp(), "wall_s": float("nan"), "peak": float("inf"), "k": (1, 2)})
    assert json.loads(path.read_text()) == {"format": "bmoe-fleet.run", "version": 1, "wall_s": None, "peak": None,
                                            "k": [1, 2]}
    assert "NaN" not in path.read_text()
