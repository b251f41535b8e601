"""The results database at lab scale: N runs made as renamed copies of one real campaign, ingested,
then `table` and `report` read from the database (target: 15 s each at 10,000 runs), against the
files for a slice; and one more campaign ingested into the full database, against the same
campaign into an empty one (its cost must follow its own runs, not the database's size).

    .venv/bin/python benchmarks/bench_results_db.py --campaign DIR [--runs 10000] [--db URL] [--work /var/tmp/x]

DIR is any campaign directory (one `bmoe-fleet sweep --device local` made with bmoe-py on a
tiny model, or the test suite's local campaign); each copy gets its own campaign name. `--db`
defaults to an SQLite file in the work folder; give postgresql://… for PostgreSQL. With
`--profile`, `report --db` runs under cProfile and the top functions by cumulative time are
printed (where a report's time goes beyond the run table). Prints a table of timings and ratios.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results.db.ingest import ingest  # noqa: E402


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


def cli(*args: str) -> float:
    t = time.perf_counter()
    subprocess.run([str(ROOT / ".venv" / "bin" / "bmoe-fleet"), *args], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--campaign", required=True, type=Path)
    ap.add_argument("--runs", type=int, default=10000)
    ap.add_argument("--db")
    ap.add_argument("--work", type=Path)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="bench-results-db-"))
    work.mkdir(parents=True, exist_ok=True)
    per = sum(1 for p in (a.campaign / "runs").glob("*/*/run.json"))
    n = max(1, a.runs // per)
    dirs = copies(a.campaign, work, n, "c")
    extra = copies(a.campaign, work, 1, "extra")[0]
    db = a.db or str(work / "results.sqlite")
    empty = str(work / "empty.sqlite")
    rows: list[tuple[str, float, str]] = []

    t = time.perf_counter()
    ingest(dirs, db)
    rows.append((f"ingest {n} campaigns, {n * per} runs", time.perf_counter() - t, ""))
    t = time.perf_counter()
    again = ingest(dirs, db)
    rows.append(("ingest again (nothing new)", time.perf_counter() - t, f"{sum(d.unchanged for d in again)} unchanged"))
    strs = [str(d) for d in dirs]
    t_table = cli("table", *strs, "--db", db, "--format", "csv", "-o", str(work / "table.csv"))
    rows.append((f"table --db ({n * per} runs)", t_table, "target 15 s"))
    t_report = cli("report", *strs, "--db", db, "-o", str(work / "site"))
    rows.append((f"report --db ({n * per} runs)", t_report, "target 15 s"))
    k = max(1, min(n, 500 // per))
    t_files = cli("table", *strs[:k], "--format", "csv", "-o", str(work / "table-files.csv"))
    rows.append((f"table from files ({k * per} runs)", t_files,
                 f"{t_files / (k * per) * 1000:.1f} ms/run; x{n // k} = {t_files * n / k:.0f} s"))
    t_rfiles = cli("report", *strs[:k], "-o", str(work / "site-files"))
    rows.append((f"report from files ({k * per} runs)", t_rfiles,
                 f"{t_rfiles / (k * per) * 1000:.1f} ms/run; x{n // k} = {t_rfiles * n / k:.0f} s"))
    t = time.perf_counter()
    ingest([extra], empty)
    t_empty = time.perf_counter() - t
    t = time.perf_counter()
    ingest([extra], db)
    t_full = time.perf_counter() - t
    rows.append((f"ingest one more campaign ({per} runs) into an empty db", t_empty, ""))
    rows.append((f"… into the db of {n * per} runs", t_full, f"ratio {t_full / t_empty:.2f}"))
    width = max(len(r[0]) for r in rows)
    print(f"{'step':{width}}  {'seconds':>8}  note")
    for name, secs, note in rows:
        print(f"{name:{width}}  {secs:8.2f}  {note}")
    print(f"table --db against the files' projection: x{t_files * n / k / t_table:.1f}; "
          f"report --db against the files': x{t_rfiles * n / k / t_report:.1f}")
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
