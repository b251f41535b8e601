"""The results database at lab scale: N runs made as renamed copies of one real campaign, ingested,
then `table` and `report` read from the database (target: 15 s each at 10,000 runs), against the
files for a slice; and one more campaign ingested into the full database, against the same
campaign into an empty one (its cost must follow its own runs, not the database's size).

    .venv/bin/python benchmarks/bench_results_db.py --campaign DIR [--runs 10000] [--db URL] [--work /var/tmp/x]
        [--baseline-root CHECKOUT] [--profile]

DIR is any campaign directory (one `bmoe-fleet sweep --device local` made with bmoe-py on a
tiny model, or the test suite's local campaign); each copy gets its own campaign name. `--db`
defaults to an SQLite file in the work folder; give postgresql://… for PostgreSQL. Ingest is
timed as `db ingest` runs it, its rows and then the run pages it keeps (results.site.run_pages).
`report --db` is timed twice into the same site folder: the first build writes every page (the run
pages as the database keeps them), the repeated one keeps the run pages whose inputs did not
change (results.site.report); with an SQLite file, a first build from a copy of it with its pages
cleared is timed too (every page made). With `--baseline-root`, an
older bmoe-fleet checkout (e.g. a `git worktree` of the commit before a change) ingests the same
campaigns into a database of its own and its `report --db` is timed in the same run: the ratio
against it is the change's, on the same host at the same time. With `--profile`, `report --db`
runs under cProfile and the top functions by cumulative time are printed. Every command runs in
a child process (this checkout's code, or the baseline's); each line gives its wall seconds and
the child's CPU seconds (user + system: on a loaded host, wall time is mostly waiting for a core).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results.db.ingest import ingest  # noqa: E402
from results.site.run_pages import store_run_pages  # noqa: E402


def timed(work, *args):
    """work(*args), and its wall and CPU seconds (this process's and its children's: the run pages
    are made in forked children)."""
    before = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    t = time.perf_counter()
    out = work(*args)
    wall = time.perf_counter() - t
    after = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = sum(a.ru_utime - b.ru_utime + a.ru_stime - b.ru_stime for a, b in zip(after, before))
    return out, wall, cpu


def ingest_and_pages(dirs, db):
    """What `db ingest` does (results.site.run_pages.ingest_with_pages), its two steps timed apart."""
    done, t_rows, c_rows = timed(ingest, dirs, db)
    made, t_pages, c_pages = timed(store_run_pages, db, [d.dir for d in done if d.changed])
    return done, made, (t_rows, c_rows), (t_pages, c_pages)


def copies(src: Path, work: Path, n: int, prefix: str) -> list[Path]:
    out = []
    for i in range(n):
        dst = work / f"{prefix}{i:05d}"
        if not dst.exists():
            shutil.copytree(src, dst, symlinks=True)
            plan = dst / "plan.json"
            doc = json.loads(plan.read_text())
            doc["campaign"] = f"{doc.get('campaign') or src.name}-{prefix}{i:05d}"
            plan.write_text(json.dumps(doc))
        out.append(dst)
    return out


def old_sites(work: Path) -> Path:
    """The sites an earlier run of this benchmark left in `work`, moved aside (removed once every
    step is timed): ext4 skips an inode deleted in the last minute when it creates a file
    (recently_deleted(), while the inode table's block is cached), so a build that follows the
    removal of a 10,000-page site paid several seconds of kernel time for it
    (docs/lab-notes/2026-12-07-report-records.md)."""
    trash = work / f"old-sites-{time.time_ns()}"
    trash.mkdir()
    for name in ("site", "site-baseline", "site-files", "site-prof", "site-bare"):
        if (work / name).exists():
            (work / name).rename(trash / name)
    return trash


def cli(*args: str, root: Path = ROOT) -> tuple[float, float, str]:
    """`bmoe-fleet ARGS` with the code of checkout `root`: (wall seconds, the child's CPU seconds,
    what it printed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", "from harness.cli.main import main; main()", *args],
                          capture_output=True, text=True, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)})
    if done.returncode != 0:
        sys.exit(f"bmoe-fleet {args[0]} ({root}) failed:\n{done.stderr}")
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--campaign", required=True, type=Path)
    ap.add_argument("--runs", type=int, default=10000)
    ap.add_argument("--db")
    ap.add_argument("--work", type=Path)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--baseline-root", type=Path, help="an older bmoe-fleet checkout to time report --db against")
    a = ap.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="bench-results-db-"))
    work.mkdir(parents=True, exist_ok=True)
    per = sum(1 for p in (a.campaign / "runs").glob("*/*/run.json"))
    n = max(1, -(-a.runs // per))         # at least --runs runs
    dirs = copies(a.campaign, work, n, "c")
    # one more campaign, never ingested before (a reused --work keeps its database), into a fresh empty one too
    extra = copies(a.campaign, work, 1, f"extra{time.time_ns()}-")[0]
    db = a.db or str(work / "results.sqlite")
    empty = str(work / "empty.sqlite")
    Path(empty).unlink(missing_ok=True)
    rows: list[tuple[str, float, float, str]] = []       # (step, wall s, CPU s, note)
    trash = old_sites(work)

    _, made, (t, c), (t_p, c_p) = ingest_and_pages(dirs, db)
    rows.append((f"ingest {n} campaigns, {n * per} runs", t, c, ""))
    rows.append(("… and their run pages (db ingest's last step)", t_p, c_p, f"{made} pages made"))
    again, made, (t, c), (t_p, c_p) = ingest_and_pages(dirs, db)
    rows.append(("ingest again (nothing new), with its run pages", t + t_p, c + c_p,
                 f"{sum(d.unchanged for d in again)} unchanged, {made} pages made"))
    strs = [str(d) for d in dirs]
    t_table, c_table, _ = cli("table", *strs, "--db", db, "--format", "csv", "-o", str(work / "table.csv"))
    rows.append((f"table --db ({n * per} runs)", t_table, c_table, "target 15 s"))
    if a.baseline_root is not None:
        # the baseline's first build before this checkout's, so that neither follows a build that
        # removed a site (old_sites)
        base_db = str(work / "baseline.sqlite")
        t_bi, c_bi, _ = cli("db", "ingest", *strs, "--db", base_db, root=a.baseline_root.resolve())
        rows.append(("baseline: ingest", t_bi, c_bi, str(a.baseline_root)))
        t_base, c_base, _ = cli("report", *strs, "--db", base_db, "-o", str(work / "site-baseline"),
                                root=a.baseline_root.resolve())
    site = work / "site"
    t_report, c_report, said = cli("report", *strs, "--db", db, "-o", str(site), "--json")
    rows.append((f"report --db ({n * per} runs), first build", t_report, c_report,
                 f"target 15 s; {json.loads(said)['stored']} run pages from the db"))
    # the same first build with no page kept in the database (a copy of it, its pages cleared): every page made
    if "://" not in db:                      # an SQLite file
        import sqlite3

        bare = work / "no-pages.sqlite"
        shutil.copyfile(db, bare)
        with sqlite3.connect(bare) as conn:
            conn.execute("UPDATE folders SET page = NULL, page_digest = NULL")
        t_bare, c_bare, _ = cli("report", *strs, "--db", str(bare), "-o", str(work / "site-bare"))
        rows.append((f"report --db ({n * per} runs), first build, every page made", t_bare, c_bare,
                     "the db's pages cleared"))
        bare.unlink()
    t_again, c_again, said = cli("report", *strs, "--db", db, "-o", str(site), "--json")
    rows.append((f"report --db again, same folder ({json.loads(said)['kept']} run pages kept)", t_again, c_again,
                 "target 15 s"))
    if a.baseline_root is not None:
        rows.append((f"baseline: report --db ({n * per} runs), first build", t_base, c_base,
                     f"this checkout's first build x{t_report / t_base:.2f} wall, x{c_report / c_base:.2f} CPU"))
    k = max(1, min(n, 500 // per))
    t_files, c_files, _ = cli("table", *strs[:k], "--format", "csv", "-o", str(work / "table-files.csv"))
    rows.append((f"table from files ({k * per} runs)", t_files, c_files,
                 f"{t_files / (k * per) * 1000:.1f} ms/run; x{n // k} = {t_files * n / k:.0f} s"))
    t_rfiles, c_rfiles, _ = cli("report", *strs[:k], "-o", str(work / "site-files"))
    rows.append((f"report from files ({k * per} runs)", t_rfiles, c_rfiles,
                 f"{t_rfiles / (k * per) * 1000:.1f} ms/run; x{n // k} = {t_rfiles * n / k:.0f} s"))
    _, _, (t, c), (t_p, c_p) = ingest_and_pages([extra], empty)
    t_empty, c_empty = t + t_p, c + c_p
    _, _, (t, c), (t_p, c_p) = ingest_and_pages([extra], db)
    t_full, c_full = t + t_p, c + c_p
    rows.append((f"ingest one more campaign ({per} runs) with its pages into an empty db", t_empty, c_empty, ""))
    rows.append((f"… into the db of {n * per} runs", t_full, c_full, f"ratio {t_full / t_empty:.2f}"))
    width = max(len(r[0]) for r in rows)
    print(f"{'step':{width}}  {'wall s':>8}  {'CPU s':>8}  note")
    for name, secs, cpu, note in rows:
        print(f"{name:{width}}  {secs:8.2f}  {cpu:8.2f}  {note}")
    print(f"table --db against the files' projection: x{t_files * n / k / t_table:.1f}; "
          f"report --db against the files': x{t_rfiles * n / k / t_report:.1f} (first build), "
          f"x{t_rfiles * n / k / t_again:.1f} (repeated)")
    shutil.rmtree(trash, ignore_errors=True)
    if a.profile:
        from harness.cli.main import main as fleet

        prof = cProfile.Profile()
        prof.enable()
        try:
            fleet(["report", *strs, "--db", db, "-o", str(work / "site-prof")], standalone_mode=False)
        finally:
            prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(25)
        print(out.getvalue())


if __name__ == "__main__":
    main()
