"""The declared run table (results/read/columns.py) and the results database (results/db/):
columns as declared, ingest incremental and transactional, the table read back byte for byte, and
SQLite and PostgreSQL answering alike (PostgreSQL: tests/results/pg.py)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from results.db import ingest as ingest_mod
from results.db import schema
from results.db.load import run_table, stored_folders, stored_pages
from results.read import columns as cols
from results.read import series as run_series
from results.read.columns import C
from results.read.parse import ParseError
from results.read.rundir import read_campaign
from results.read.table import ShapeCache, build_table, render_table, run_row
from results.site import fanout
from results.site.run_pages import store_run_pages
from results.site.site_format import Urls
from tests.results import pg

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def pg_server():
    """A PostgreSQL server's URL: BMOE_TEST_PG_URL (.ci/run's cluster), else a cluster of our own."""
    if os.environ.get(pg.ENV):
        yield os.environ[pg.ENV]
        return
    if pg.binaries() is None:
        pytest.skip(f"no PostgreSQL: {pg.ENV} is unset and no initdb/pg_ctl on this host (apt-get install postgresql)")
    # in /tmp itself: as root the server runs as postgres, which cannot enter pytest's 0700 folders
    folder = Path(tempfile.mkdtemp(prefix="bmoe-test-pg-"))
    try:
        url = pg.start(folder)
    except Exception as e:                # a host that cannot run one: say why
        pg.stop(folder)
        pytest.skip(f"no PostgreSQL: {pg.ENV} is unset and a cluster would not start here ({e})")
    try:
        yield url
    finally:
        pg.stop(folder)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        yield str(tmp_path / "results.sqlite")
        return
    with pg.database(request.getfixturevalue("pg_server")) as url:
        yield url


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


# ── the declared columns ────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("which", ["local_campaign", "imported", "quality_campaign"])
def test_the_run_table_has_exactly_the_declared_columns_in_order_and_types(which, request):
    folder = request.getfixturevalue(which)
    table = build_table([folder])
    camp = read_campaign(folder)
    keys = [list(r.record.config.keys) for r in camp.runs]
    assert list(table.columns) == cols.expected_columns(keys)
    undeclared = [c for c in table.columns if c not in cols.BY_NAME]
    assert not undeclared, f"run_row makes columns results/read/columns.py does not declare: {undeclared}"
    # each value as run_row made it (the frame turns an int column with gaps into floats)
    shapes = ShapeCache()
    rows = [run_row(camp, run, shapes) for run in camp.runs]
    problems = [p for row in rows for c, v in row.items() if (p := cols.type_problem(cols.BY_NAME[c], v))]
    assert not problems, problems[:5]
    assert cols.get_fields()[:3] == ["device", "model", "engine"] and cols.get_field_type("latest") == "bool"


def test_every_declared_column_has_a_type_a_group_and_a_meaning():
    assert len(set(cols.get_fields())) == len(cols.COLUMNS)
    for c in cols.COLUMNS:
        assert c.type in cols.TYPES and c.group in cols.GROUPS and c.meaning and c.meaning != cols.ENGINE, c
    # an engine output's column says which bmoe-cli release first writes it, from its declaration
    assert cols.BY_NAME["prefill_cpu_s"].engine_release == "0.23.0"


def test_the_column_list_in_docs_results_md_is_made_from_the_declaration(cli, tmp_path):
    doc = (ROOT / "docs" / "results.md").read_text()
    assert cols.updated_doc(doc) == doc, "run: bmoe-fleet db columns --update docs/results.md"
    stale = tmp_path / "results.md"
    stale.write_text(doc.replace("| `tok_s` |", "| `tok_s_old` |"))
    out = CliRunner().invoke(cli, ["db", "columns", "--update", str(stale)])
    assert out.exit_code == 0 and stale.read_text() == doc


# ── the database ────────────────────────────────────────────────────────────────────────────────

def test_the_run_table_from_the_database_is_the_files_table(local_campaign, imported, quality_campaign, db_url, cli):
    runner = CliRunner()
    dirs = [local_campaign, imported, quality_campaign]
    got = runner.invoke(cli, ["db", "ingest", *map(str, dirs), "--db", db_url, "--json"])
    assert got.exit_code == 0, got.output
    done = json.loads(got.stdout)["campaigns"]
    assert [(d["added"], d["unchanged"]) for d in done] == [(20, 0), (57, 0), (8, 0)]
    files = build_table(dirs)
    from_db = run_table(dirs, db_url)
    pd.testing.assert_frame_equal(from_db, files, check_exact=True)
    # the quality columns, which set a run against another, from the outputs the database kept
    drops = from_db[from_db["lossy_levers"] != ""]
    assert len(drops) and drops["quality_ref_run"].str.len().min() > 0 and (drops["agree_tokens"] >= 0).all()
    for fmt in ("csv", "json", "md"):
        assert render_table(from_db, fmt) == render_table(files, fmt)
    again = runner.invoke(cli, ["db", "ingest", str(local_campaign), "--db", db_url, "--json"])
    assert json.loads(again.stdout)["campaigns"][0] == {**done[0], "added": 0, "unchanged": 20}


def test_table_report_recommend_and_compare_with_db_write_the_same_bytes(local_campaign, cli, tmp_path):
    runner = CliRunner()
    db = str(tmp_path / "r.sqlite")
    camp = str(_copy(local_campaign, tmp_path / "camp"))
    assert runner.invoke(cli, ["db", "ingest", camp, "--db", db]).exit_code == 0
    for args in (["table", camp, "--format", "csv"], ["recommend", camp, "--json"],
                 ["compare", camp, camp, "--json"], ["report", camp, "--format", "community", "--json"]):
        files = runner.invoke(cli, args)
        with _runs_hidden(camp) if args[0] in ("table", "recommend") else contextlib.nullcontext():
            from_db = runner.invoke(cli, [*args, "--db", db])  # (table and recommend --db read no run folder)
        assert files.exit_code == from_db.exit_code == 0, from_db.output
        if args[0] == "recommend":      # the same, but the rule is the database's: this host is left out of it,
            doc, plain = json.loads(from_db.stdout), json.loads(files.stdout)   # floor and all
            rule = doc["rules"]["unmeasured"]
            (host,) = rule.pop("left_out")
            assert host["device"] == "local" and rule.pop("drawn_from")["devices"] == 1
            assert rule.pop("cache_floor_mb") is None and plain["rules"]["unmeasured"].pop("cache_floor_mb") == 1536
            assert doc == plain
            continue
        assert from_db.stdout == files.stdout and len(files.stdout) > 100, args
    sites = {}
    for name, extra in (("files", []), ("db", ["--db", db])):
        if name == "db":
            # report --db reads no per-token CSV or samples: the database kept them at ingest (the files
            # are spoilt with their size and mtime kept, so ingest would not see them change either)
            for path in [*Path(camp).glob("runs/*/*/metrics.csv"), *Path(camp).glob("runs/*/*/samples.csv")]:
                st = path.stat()
                path.write_bytes(b"#" * st.st_size)
                os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        with _runs_hidden(camp) if name == "db" else contextlib.nullcontext():
            out = runner.invoke(cli, ["report", camp, "-o", str(tmp_path / name), "--json", *extra])
        assert out.exit_code == 0, out.output
        # from the database: every run page as db ingest made and kept it (results.site.run_pages)
        assert json.loads(out.stdout)["stored"] == (20 if name == "db" else 0)
        sites[name] = {p.relative_to(tmp_path / name): p.read_bytes() for p in (tmp_path / name).rglob("*")
                       if p.is_file()}
    assert len(sites["files"]) > 20 and sites["db"] == sites["files"]
    # every run has its page, and its charts drew from the kept rows
    run_pages = [p for p in sites["db"] if p.parts[0] == "runs"]
    assert len(run_pages) == 20 and all(b"per-token decode time split" in sites["db"][p] for p in run_pages)
    # the run pages made by forked processes (results.site.fanout, as a long build makes them) are the
    # same bytes (a copy of the database with no page kept: every page made)
    bare = tmp_path / "bare.sqlite"
    shutil.copyfile(db, bare)
    engine = schema.connect(str(bare), create=False)
    with engine.begin() as conn:
        conn.execute(schema.folders.update().values(page=None, page_digest=None))
    engine.dispose()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fanout, "PROCESSES_FROM", 1)
        mp.setattr(fanout, "CHUNK", 3)
        made = fanout.Started.results
        workers: list[set[int]] = []
        mp.setattr(fanout.Started, "results", lambda self, *a, **k: workers.append((d := made(self, *a, **k)).pids) or d)
        with _runs_hidden(camp):
            out = runner.invoke(cli, ["report", camp, "-o", str(tmp_path / "forked"), "--db", str(bare), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["stored"] == 0 and json.loads(out.stdout)["kept"] == 0
    assert {p.relative_to(tmp_path / "forked"): p.read_bytes()
            for p in (tmp_path / "forked").rglob("*") if p.is_file()} == sites["db"]
    (pids,) = workers
    assert os.getpid() not in pids or fanout.cores() == 1, pids        # one core: no fork (fanout's doc)

    def build(name: str) -> tuple[dict, dict]:
        out = runner.invoke(cli, ["report", camp, "--db", db, "-o", str(tmp_path / name), "--json"])
        assert out.exit_code == 0, out.output
        files = {p.relative_to(tmp_path / name): p.read_bytes() for p in (tmp_path / name).rglob("*") if p.is_file()}
        return json.loads(out.stdout), files

    # built again over itself: every run page's inputs are unchanged, so each is kept, and the bytes are the same
    summary, again = build("db")
    assert summary["kept"] == 20 and again == sites["db"]
    # one run's files changed and ingested again (its spoilt CSV now read: no tokens, and the runs set
    # against it change too): the pages whose inputs changed are made again, the rest kept, and
    # the site is the one a fresh build makes
    changed = next(Path(camp).glob("runs/*/*/metrics.csv"))
    os.utime(changed, ns=(changed.stat().st_atime_ns, changed.stat().st_mtime_ns + 10**9))
    assert runner.invoke(cli, ["db", "ingest", camp, "--db", db]).exit_code == 0
    summary, again = build("db")
    fresh = build("db-fresh")[1]
    page = Path(Urls.run(f"local-sweep/{changed.parent.parent.name}/{changed.parent.name}"))
    assert again == fresh and again[page] != sites["db"][page] and 0 < summary["kept"] < 20
    assert summary["kept"] <= sum(again[p] == sites["db"][p] for p in run_pages)      # kept: unchanged


@contextlib.contextmanager
def _runs_hidden(camp: str) -> Iterator[None]:
    """The campaign's run folders replaced, while inside, by folders holding only their route
    traces: `report --db` reads no run.json, CSV or samples and lists no run folder (a page listing
    one would name only route.csv), only the route traces the replay chooses, which stay in their
    folders (docs/decisions/report-speed.md)."""
    runs, away = Path(camp) / "runs", Path(camp) / "runs.away"
    runs.rename(away)
    try:
        for trace in away.glob("*/*/route.csv"):
            (runs / trace.relative_to(away)).parent.mkdir(parents=True)
            os.link(trace, runs / trace.relative_to(away))
        yield
    finally:
        shutil.rmtree(runs, ignore_errors=True)
        away.rename(runs)


@pytest.mark.parametrize("which", ["local_campaign", "imported"])
def test_the_kept_series_are_the_files_read_again(which, request, tmp_path):
    """What ingest keeps of each run's metrics CSV and samples reads back as reading the files gives
    it (every column's dtype and values), and a CSV that did not parse keeps the parser's message."""
    camp = read_campaign(request.getfixturevalue(which))
    for run in camp.runs:
        want = run_series.read_series(run.path)
        got = run_series.decode(run_series.encode(want))
        assert (got.metrics is None) == (want.metrics is None) and got.metrics_error == want.metrics_error
        for a, b in ((got.metrics and got.metrics.rows, want.metrics and want.metrics.rows), (got.samples, want.samples)):
            if b is None:
                assert a is None
                continue
            assert a is not None and len(a) == len(b)
            pd.testing.assert_frame_equal(a.frame(), b.frame(), check_exact=True)
        if want.metrics is not None:
            assert dict(got.metrics.preamble) == dict(want.metrics.preamble)
    broken = _copy(Path(camp.runs[0].path), tmp_path / "run")
    (broken / "metrics.csv").write_text("step,wall_ms\n1,2\n")
    kept = run_series.decode(run_series.encode(run_series.read_series(broken)))
    assert kept.metrics is None and "header lacks" in kept.metrics_error
    with run_series.provided({str(broken): kept}), pytest.raises(ParseError, match="header lacks"):
        run_series.token_rows(broken / "metrics.csv")


def test_ingest_adds_new_attempts_updates_changed_ones_and_drops_removed_ones(local_campaign, db_url, tmp_path):
    camp = _copy(local_campaign, tmp_path / "camp")
    assert ingest_mod.ingest([camp], db_url)[0].added == 20
    cells = sorted(p for p in (camp / "runs").iterdir() if p.is_dir())
    # a second attempt of one cell (attempt 1 is then no longer its latest) …
    second = cells[0] / "2"
    shutil.copytree(cells[0] / "1", second)
    rec = json.loads((second / "run.json").read_text())
    (second / "run.json").write_text(json.dumps({**rec, "attempt": 2, "outcome": "killed"}))
    # … an attempt re-reconciled (its outcome rewritten) and one whose folder is gone
    changed = cells[1] / "1" / "run.json"
    changed.write_text(json.dumps({**json.loads(changed.read_text()), "evidence": ["reconciled again"]}))
    shutil.rmtree(cells[2])
    done = ingest_mod.ingest([camp], db_url)[0]
    assert (done.added, done.updated, done.removed, done.unchanged) == (1, 1, 1, 18)
    from_db = run_table([camp], db_url)
    pd.testing.assert_frame_equal(from_db, build_table([camp]), check_exact=True)
    assert len(from_db) == 20 and (from_db["evidence"] == "reconciled again").sum() == 1
    assert from_db.loc[from_db["cell_id"] == cells[0].name, ["attempt", "latest"]].values.tolist() == \
        [[1, False], [2, True]]


def test_an_ingest_interrupted_mid_write_leaves_the_database_as_it_was(local_campaign, db_url, tmp_path,
                                                                        monkeypatch):
    camp = _copy(local_campaign, tmp_path / "camp")
    ingest_mod.ingest([camp], db_url)
    before = run_table([camp], db_url)
    for run_json in (camp / "runs").glob("*/*/run.json"):      # every attempt changed: deleted, then re-inserted
        run_json.write_text(json.dumps({**json.loads(run_json.read_text()), "evidence": ["changed"]}))
    real, calls = ingest_mod.db_row, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt          # Ctrl-C after the old rows were deleted in the transaction
        return real(*args, **kwargs)

    monkeypatch.setattr(ingest_mod, "db_row", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ingest_mod.ingest([camp], db_url)
    pd.testing.assert_frame_equal(run_table([camp], db_url), before, check_exact=True)
    monkeypatch.setattr(ingest_mod, "db_row", real)
    assert ingest_mod.ingest([camp], db_url)[0].updated == 20
    assert set(run_table([camp], db_url)["evidence"]) == {"changed"}


def test_sqlite_and_postgresql_give_the_same_answers(local_campaign, pg_server, tmp_path):
    lite = str(tmp_path / "r.sqlite")
    with pg.database(pg_server) as pg_url:
        answers = []
        for url in (lite, pg_url):
            ingest_mod.ingest([local_campaign], url)
            engine = schema.connect(url, create=False)
            r = schema.runs
            queries = [
                select(r.c.dense_weights, r.c.outcome, func.count(), func.max(r.c.tok_s))
                .group_by(r.c.dense_weights, r.c.outcome).order_by(r.c.dense_weights, r.c.outcome),
                select(r.c.cell_id, r.c.attempt, r.c.cache_mb, r.c.cache_hit_pct, r.c.latest)
                .where(r.c.cache_mb > 0).order_by(r.c.cell_id, r.c.attempt),
                select(func.count()).where(r.c.under_cycle.is_(True), r.c.moe_stream.is_(True)),
                select(r.c.cell_id, r.c.budget_spec, r.c.n_predict, r.c.config_cache_auto, r.c.threads)
                .order_by(r.c.cell_id),
            ]
            with engine.connect() as conn:
                answers.append([[tuple(row) for row in conn.execute(q)] for q in queries])
            engine.dispose()
            answers.append(run_table([local_campaign], url))
            # the run pages ingest keeps (results.site.run_pages), the same in both
            assert store_run_pages(url, [local_campaign]) == 20
            kept = stored_pages(url, [(d, m) for d, m in zip(answers[-1][C.device], answers[-1][C.model])])
            answers.append({run: (digest, schema.unpacked(page)) for run, (digest, page) in kept.items()})
        lite_rows, lite_table, lite_pages, pg_rows, pg_table, pg_pages = answers
        assert lite_rows == pg_rows and len(lite_rows[1]) > 5 and lite_rows[2][0][0] > 0
        pd.testing.assert_frame_equal(lite_table, pg_table, check_exact=True)
        assert lite_pages == pg_pages and len(lite_pages) == 20


def test_bad_input_is_one_line_and_changes_nothing(local_campaign, cli, tmp_path):
    runner = CliRunner()
    db = tmp_path / "r.sqlite"
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = runner.invoke(cli, ["db", "ingest", str(empty), "--db", str(db)])
    assert bad.exit_code == 1 and "not a campaign directory" in bad.output and len(bad.output.splitlines()) == 1
    missing = runner.invoke(cli, ["table", str(local_campaign), "--db", str(db)])
    assert missing.exit_code == 1 and "not in the database" in missing.output
    nowhere = runner.invoke(cli, ["table", str(local_campaign), "--db", str(tmp_path / "none.sqlite")])
    assert nowhere.exit_code == 1 and "no results database there" in nowhere.output
    assert not (tmp_path / "none.sqlite").exists()
    with_model = runner.invoke(cli, ["table", str(local_campaign), "--db", str(db), "--model-file", "a=b"])
    assert with_model.exit_code == 2 and "--model-file" in with_model.output
    # a database made for another run-table schema is refused until rebuilt (from the folders it holds)
    assert runner.invoke(cli, ["db", "ingest", str(local_campaign), "--db", str(db)]).exit_code == 0
    engine = schema.connect(str(db))
    with engine.begin() as conn:
        conn.execute(schema.meta.update().values(value="older"))
    engine.dispose()
    refused = runner.invoke(cli, ["table", str(local_campaign), "--db", str(db)])
    assert refused.exit_code == 1 and "db rebuild" in refused.output
    rebuilt = runner.invoke(cli, ["db", "rebuild", "--db", str(db)])
    assert rebuilt.exit_code == 0 and "20 added" in rebuilt.stdout
    assert runner.invoke(cli, ["table", str(local_campaign), "--db", str(db)]).exit_code == 0
    # a campaign renamed since it was ingested: report --db names it and says to ingest it again
    camp = _copy(local_campaign, tmp_path / "renamed")
    assert runner.invoke(cli, ["db", "ingest", str(camp), "--db", str(db)]).exit_code == 0
    plan = json.loads((camp / "plan.json").read_text())
    plan["campaign"] = "another-name"
    (camp / "plan.json").write_text(json.dumps(plan))
    stale = runner.invoke(cli, ["report", str(camp), "--db", str(db), "-o", str(tmp_path / "site")])
    assert stale.exit_code == 1 and "renamed since it was ingested" in stale.output, stale.output
    assert len(stale.output.splitlines()) == 1 and not (tmp_path / "site").exists()
    assert runner.invoke(cli, ["db", "ingest", str(camp), "--db", str(db)]).exit_code == 0
    assert runner.invoke(cli, ["report", str(camp), "--db", str(db), "-o", str(tmp_path / "site")]).exit_code == 0


def _site_files(root: Path) -> dict[Path, bytes]:
    return {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_report_db_takes_the_run_pages_ingest_kept_and_they_are_the_pages_it_would_make(local_campaign, cli,
                                                                                          tmp_path, monkeypatch):
    """results.site.run_pages: db ingest makes the run pages of what it changed and keeps them; a
    report --db takes each whose inputs are the ones it would make it from, for a site of more
    campaigns too, and the site is byte for byte the one made from the files."""
    runner = CliRunner()
    db = str(tmp_path / "r.sqlite")
    a = _copy(local_campaign, tmp_path / "a")
    b = _copy(local_campaign, tmp_path / "b")
    plan = json.loads((b / "plan.json").read_text())
    (b / "plan.json").write_text(json.dumps({**plan, "campaign": "local-sweep-b"}))

    def ingested(*dirs: Path) -> str:
        out = runner.invoke(cli, ["db", "ingest", *map(str, dirs), "--db", db, "--json"])
        assert out.exit_code == 0, out.output
        made = json.loads(out.stdout)["run_pages_made"]
        assert (f"db: {made} run pages made and kept" in out.stderr) == (made > 0)
        return out.stderr

    def built(name: str, *dirs: Path, db_args: bool = True) -> tuple[dict, dict]:
        args = ["report", *map(str, dirs), "-o", str(tmp_path / name), "--json", *(["--db", db] if db_args else [])]
        out = runner.invoke(cli, args)
        assert out.exit_code == 0, out.output
        return json.loads(out.stdout), _site_files(tmp_path / name)

    assert "db: 20 run pages made and kept" in ingested(a)
    # (that they are the pages a build from the files makes: the same-bytes test above)
    summary, site = built("a-db", a)
    assert summary["stored"] == 20 and summary["kept"] == 0
    # a second campaign: only its pages are made; a site of both takes a's pages as a's ingest made
    # them (their redaction named nothing of b's), and is the site the files make
    assert "db: 20 run pages made and kept" in ingested(b)
    summary, both = built("ab-db", a, b)
    _, from_files = built("ab-files", a, b, db_args=False)
    assert both == from_files and summary["stored"] > 20, summary
    # built in another time zone than ingest's (the pages show local times): no page kept serves it
    try:
        monkeypatch.setenv("TZ", "UTC" if time.localtime().tm_gmtoff else "Asia/Kolkata")
        time.tzset()
        summary, elsewhere = built("a-elsewhere", a)
        assert summary["stored"] == 0 and elsewhere == built("a-elsewhere-files", a, db_args=False)[1] != site
    finally:
        monkeypatch.undo()
        time.tzset()
    # what the pages of one campaign read of the database is that campaign's (an ingest's cost follows its own runs)
    pairs = list(zip(run_table([a, b], db)[C.device], run_table([a, b], db)[C.model]))
    assert len(stored_pages(db, pairs)) == 40 and set(stored_pages(db, pairs, [a])) == \
        {str(p.parent) for p in a.glob("runs/*/*/run.json")} == set(stored_folders(db, pairs, dirs=[a])[1])
    # nothing changed: nothing made
    assert "run pages made" not in ingested(a, b)
    # pages lost with a crash after the rows were written (their own transaction): the next ingest makes them
    c = _copy(b, tmp_path / "c")
    (c / "plan.json").write_text(json.dumps({**plan, "campaign": "local-sweep-c"}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("results.db.ingest.store_pages", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
        crashed = runner.invoke(cli, ["db", "ingest", str(c), "--db", db])
    assert crashed.exit_code != 0 and len(run_table([c], db)) == 20
    # ... but not while it is renamed since (its pages cannot be made as a report would make them):
    # said, and the ingest asked for goes on
    (c / "plan.json").write_text(json.dumps({**plan, "campaign": "local-sweep-c2"}))
    said = ingested(a)
    assert "run pages of 1 other campaign(s) left unmade" in said and "renamed since it was ingested" in said
    (c / "plan.json").write_text(json.dumps({**plan, "campaign": "local-sweep-c"}))
    assert "db: 20 run pages made and kept" in ingested(a, b)
    # a bmoe-fleet of other code makes every page again
    monkeypatch.setattr("results.site.run_pages.code_fingerprint", lambda: "other code")
    assert "db: 60 run pages made and kept" in ingested(a)
