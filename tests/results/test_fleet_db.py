"""The rule for phones never measured drawn from the whole results database (`recommend --db`,
results/analysis/fleet_db.py, docs/decisions/fleet-rule-db.md).

The database holds the suite's local campaign (this host: not a phone), two copies of it whose
device record says a virtual phone of 3 GiB and of 6 GiB (each its own campaign), and an accepted
community report (tests/fixtures/community/good-form.md, imported with an issue's address). The
recommendations are asked for one phone only; the rule rests on both phones, each point saying
which campaign and engine release it came from, and lists the host and the report as left out,
with why and where they came from.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from harness.community_import import import_reports
from results.analysis.fleet_db import database_rules
from results.analysis.recommend import recommend
from results.db.ingest import ingest
from tests.results import pg
from tests.results.test_recommend_v2 import validate
from tests.results.test_results_db import pg_server  # noqa: F401  (the fixture, shared)

PROJECT = Path(__file__).resolve().parents[2]
ISSUE = "https://github.com/Helldez/BigMoeOnEdge/issues/9001"
PHONES = {"phone-a": ("Phone A", 3 * 1024 * 1024), "phone-b": ("Phone B", 6 * 1024 * 1024)}


def as_phone(src: Path, dst: Path, model: str, ram_kb: int) -> Path:
    """A copy of a campaign of `local` whose device record says a virtual phone, under its own name."""
    shutil.copytree(src, dst, symlinks=True)
    record = dst / "devices" / "local.json"
    doc = json.loads(record.read_text())
    record.write_text(json.dumps({**doc, "kind": "virtual", "model": model, "ram_total_kb": ram_kb}))
    plan = json.loads((dst / "plan.json").read_text())
    (dst / "plan.json").write_text(json.dumps({**plan, "campaign": dst.name}))
    return dst


@pytest.fixture(scope="module")
def fleet(local_campaign, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fleet-db")
    out = {name: as_phone(local_campaign, root / name, model, ram) for name, (model, ram) in PHONES.items()}
    imported = import_reports([PROJECT / "tests" / "fixtures" / "community" / "good-form.md"], root / "community",
                              url=ISSUE)
    assert len(imported.accepted) == 1
    out["community"] = root / "community"
    out["local"] = local_campaign
    return out


def _cli(*args: object):
    from harness.cli.main import main

    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _check_rule(rule: dict, fleet: dict[str, Path]) -> None:
    """Both phones are points, each with the default its own campaign's files give and its provenance;
    the host and the community report are left out, saying why and where they came from."""
    points = {p["provenance"]["campaigns"][0]: p for p in rule["points"]}
    assert sorted(points) == ["phone-a", "phone-b"]
    for name, (model, ram_kb) in PHONES.items():
        p = points[name]
        (files,) = recommend([fleet[name]]).devices          # the default from that campaign's own files
        assert (p["model"], p["mem_total_mib"], p["ceiling_mib"]) == (model, ram_kb / 1024,
                                                                     files.default.cache_ceil_mb)
        assert p["provenance"]["engines"] == ["bmoe-py 0.1.0"] and p["provenance"]["releases"] == ["0.19.0"]
        assert p["provenance"]["runs"] == 20 and p["provenance"]["reports"] == []
    assert rule["drawn_from"] == {"campaigns": 4, "devices": 4}
    left = {o["device"]: o for o in rule["left_out"]}
    (host,) = [o for d, o in left.items() if d.startswith("local (local,")]
    assert host["reason"].startswith("not a phone") and host["provenance"]["campaigns"] == ["local-sweep"]
    report = left["community:Helldez/BigMoeOnEdge#9001"]
    assert "no MemTotal" in report["reason"] and report["provenance"]["reports"] == [ISSUE]
    assert report["provenance"]["campaigns"] == ["community"] and report["provenance"]["releases"] == ["0.19.0"]


def test_recommend_db_draws_the_rule_from_every_device_with_its_provenance(fleet, tmp_path):
    db = str(tmp_path / "fleet.sqlite")
    ingest([fleet[n] for n in ("local", "phone-a", "phone-b", "community")], db)
    got = _cli("recommend", fleet["phone-a"], "--db", db, "--json")
    assert got.exit_code == 0, got.output
    doc = json.loads(got.stdout)
    validate(doc)
    assert [d["identity"]["model"] for d in doc["devices"]] == ["Phone A"]     # recommended for one phone
    rule = doc["rules"]["unmeasured"]
    _check_rule(rule, fleet)
    for broken in (lambda r: r["points"][0]["provenance"].pop("releases"),      # the schema holds the new fields
                   lambda r: r["left_out"][0].pop("reason"), lambda r: r["drawn_from"].update(devices=-1)):
        copy = json.loads(json.dumps(doc))
        broken(copy["rules"]["unmeasured"])
        with pytest.raises(jsonschema.ValidationError):
            validate(copy)
    assert rule["knots_mib"][1:] and set(rule["rests_on"]) <= {p["device"] for p in rule["points"]}
    # without --db: the rule of DIRS alone, as before (one point, no provenance, nothing left out)
    plain = json.loads(_cli("recommend", fleet["phone-a"], "--json").stdout)
    (point,) = plain["rules"]["unmeasured"]["points"]
    assert "provenance" not in point and "left_out" not in plain["rules"]["unmeasured"]
    assert plain["devices"] == doc["devices"]
    # --db and no DIRS: the same rule alone
    alone = json.loads(_cli("recommend", "--db", db, "--json").stdout)
    validate(alone)
    assert alone["devices"] == [] and alone["rules"] == doc["rules"]
    text = _cli("recommend", fleet["phone-a"], "--db", db).stdout
    assert "the rule is drawn from the results database: 4 device(s) of 4 campaign(s)" in text
    assert ("left out community:Helldez/BigMoeOnEdge#9001: not a phone an app runs on (kind imported); its "
            "record has no MemTotal") in text and ISSUE in text
    assert "run(s) of campaign phone-b; bmoe-py 0.1.0 (release 0.19.0)" in text
    # bad input: one line, non-zero
    for args, says in ((["recommend"], "give campaign directories DIRS, or --db URL"),
                       (["recommend", "--db", str(tmp_path / "none.sqlite")], "no results database there")):
        bad = _cli(*args)
        assert bad.exit_code != 0 and says in bad.output.strip().splitlines()[-1], bad.output    # click's usage lines, one error


def test_postgresql_draws_the_rule_sqlite_draws(fleet, pg_server, tmp_path):  # noqa: F811
    dirs = [fleet[n] for n in ("local", "phone-a", "phone-b", "community")]
    sqlite = str(tmp_path / "fleet.sqlite")
    ingest(dirs, sqlite)
    with pg.database(pg_server) as url:
        ingest(dirs, url)
        rules = database_rules(url)
    _check_rule(rules["unmeasured"], fleet)
    assert rules == database_rules(sqlite)
