"""`bmoe-fleet report DIR… -o SITE`: the static benchmark site, recomputed from campaign directories.

SITE/index.html (campaigns, devices, models, the recommendations table), SITE/devices/*.html (a
device's identity, recommendations, and per model and top-k the hit % and tok/s against the
budget with the cycle, the LMK boundary, the kills and the replayed LRU curve; per model with a lossy
setting measured, tok/s against quality loss: results.site.quality_view), SITE/models/*.html
(shape, cycle per top-k, the same quality charts per device), SITE/runs/<campaign>/<cell>-<attempt>.html (per-token wall/io/compute/
mgmt and hit %, memory over time, entry and exit state, evidence, the exact argv), plus
SITE/history/*.html (built from a results database: a device and model across engine releases,
results.site.history_view), recommendations.json, runs.csv, and assets/ (plotly.min.js copied from the plotly package, so the
site works offline from file://).

Pages are made through the one jinja Environment (results.site.environment), autoescaped; a run
page whose inputs are unchanged is taken from the last build or the results database
(results.site.run_pages). File names derived from device and model strings go through slug().
The site is written into a temporary folder and swapped in whole, so a reader never sees half a site; an existing folder that is not a site is
refused rather than overwritten. A symlink named by `-o` is replaced by the site, its target left
as it was, as every `-o` treats a link (docs/decisions/output-formats.md).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
from jinja2 import Environment

from results.analysis.analyze import Analysis, analyze, shared_analyses
from results.analysis.history import History
from results.analysis.quality import quality_front
from results.analysis.recommend import recommendations_for
from results.analysis.recommend_records import Recommendations
from results.errors import ResultsError
from results.publish import Redactor
from results.read.columns import C, written_frame
from results.read.frames import frame_csv, row_digests
from results.read.rundir import CampaignData, RunFolder, provided_folders, read_campaigns
from results.read.series import provided
from results.read.table import build_table
from results.site import fanout
from results.site.environment import code_fingerprint, make_environment, render, templates_dir
from results.site.history_view import history_links, history_pages
from results.site.page_views import Ids, device_page, index_page, model_page
from results.site.pages import Link
from results.site.run_pages import RunPages
from results.site.site_format import Urls
from store import names
from store.versioned import write_json

# run-table columns a published runs.csv leaves out: where the campaign lived on this host
HOST_COLUMNS = (C.run_dir, C.campaign_dir)

SITE_MARKER = ".bmoe-fleet-site"
PAGES_MANIFEST = ".bmoe-fleet-site-pages.json"     # the run pages' inputs, for the next build (_Kept)


# ── writing ──────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class SiteReport:
    """What `report` wrote: the folder and how many pages, runs, devices and models."""

    out_dir: str
    pages: int
    runs: int
    devices: int
    models: int
    kept: int = 0            # run pages whose inputs had not changed, taken from the previous build
    stored: int = 0          # … taken from the results database (results.site.run_pages)

    def text(self) -> str:
        """One line for the terminal."""
        return (f"wrote {self.pages} pages ({self.devices} devices, {self.models} models, {self.runs} runs) to "
                f"{self.out_dir}/index.html" + (f"; {self.kept} run pages kept from the last build" if self.kept
                                                else "")
                + (f"; {self.stored} run pages from the results database" if self.stored else ""))

    def to_dict(self) -> dict[str, Any]:
        """The summary as `report --json` prints it."""
        return {"format": "bmoe-fleet.site", "version": 1, "dir": self.out_dir, "pages": self.pages,
                "runs": self.runs, "devices": self.devices, "models": self.models, "kept": self.kept,
                "stored": self.stored}


def _plotly_js() -> Path:
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise ResultsError(f"plotly.min.js not found at {path}: the installed plotly does not ship it")
    return path


def _prepare_out(out: Path) -> Path:
    if out.is_symlink():
        pass                  # replaced by the site, whatever it points to (module doc)
    elif out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / SITE_MARKER).exists())):
        raise ResultsError(f"{out}: exists and is not a bmoe-fleet site; choose another -o folder")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def _swap_in(tmp: Path, out: Path) -> None:
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.is_symlink():
        out.unlink()
    elif out.exists():
        os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def build_site(dirs: Sequence[str | Path], out: str | Path, model_files: Mapping[str, str] | None = None,
               recommendations: Recommendations | None = None, table: pd.DataFrame | None = None,
               history: History | None = None, progress: Callable[[str], None] | None = None) -> SiteReport:
    """Render the site for these campaign directories into `out` (with `recommendations` made of
    the same directories, e.g. verified ones, instead of computing them again; with `table`, their
    run table as the results database gave it; with `history`, the database's releases of the
    site's devices and models: a history page for each with more than one); `progress` hears how
    many run pages are made, on long builds."""
    with _uncollected():
        return _site(read_campaigns(list(dirs)), out, model_files, recommendations, table, history, progress)


def _site(camps: Sequence[CampaignData], out: str | Path, model_files: Mapping[str, str] | None,
          recommendations: Recommendations | None, table: pd.DataFrame | None, history: History | None,
          progress: Callable[[str], None] | None, stored: Mapping[str, tuple[str, bytes]] | None = None) -> SiteReport:
    table = build_table(camps, model_files) if table is None else table
    out = Path(os.path.abspath(out))           # not resolved: a symlink named is replaced, not followed
    tmp = _prepare_out(out)
    kept = _Kept(out if out.is_dir() and not out.is_symlink() and (out / SITE_MARKER).is_file() else None, stored)
    try:
        pages = _render(tmp, camps, table, recommendations, history, kept, progress)
        _swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return SiteReport(str(out), pages, len(table), table[C.device].nunique(), table[C.model].nunique(), kept.kept,
                      kept.stored_taken)


def build_site_from_db(dirs: Sequence[str | Path], out: str | Path, db: str | None,
                       progress: Callable[[str], None] | None = None) -> SiteReport:
    """`report --db`: the site of these campaign directories with their runs and run table, the
    history of their devices and models, and what the run pages and predictions read of each run's
    folder (its run.json, its files' names, its metrics CSV and samples), all from the results
    database: no run folder is listed or read (results.db.load.stored_folders), only each
    directory's name and device and model records; a run page the database keeps, made from the
    inputs the page would be made from now, is taken as it is (results.site.run_pages). Where the
    history's runs of a release are the site's runs, their analysis is made once (shared_analyses)."""
    from results.analysis.history import site_history
    from results.db.load import run_table, stored_campaigns, stored_folders, stored_pages

    with _uncollected():
        table = run_table(dirs, db)
        pairs = list(zip(table[C.device], table[C.model]))
        series, folders = stored_folders(db, pairs)
        with provided(series), provided_folders(folders), shared_analyses():
            return _site(stored_campaigns(dirs, table), out, None, None, table, site_history(db, table, progress),
                         progress, stored_pages(db, pairs, dirs))


@contextlib.contextmanager
def _uncollected() -> Iterator[None]:
    """Python's cyclic garbage collector off while a site is built (as it was when left): each of its
    full collections walked every object the run table, the analysis and the pages hold, a few
    hundred thousand, over and over; the build makes little cyclic garbage (at 10,028 runs the
    largest process peaked at the same 664 MiB either way) and ends (docs/decisions/report-speed.md)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def published_runs(table: pd.DataFrame, redactor: Redactor) -> pd.DataFrame:
    """The run table as the site publishes it: no host folders, host paths in its text replaced,
    and this host's command lines with file names only."""
    out = written_frame(table.drop(columns=[c for c in HOST_COLUMNS if c in table.columns]))   # as JSON text
    local = out[C.device_kind] == "local" if C.device_kind in out.columns else pd.Series(False, index=out.index)
    out[C.argv] = [json.dumps(redactor.argv(json.loads(a or "[]"), bool(is_local)))
                   for a, is_local in zip(out[C.argv], local)]
    for column in out.columns:
        if out[column].dtype == object and column != C.argv:
            out[column] = [redactor.text(v) if isinstance(v, str) else v for v in out[column]]
    return out


class _Kept:
    """The run pages (and runs.csv) of the previous build (the site folder being replaced) whose
    inputs are unchanged (results.site.run_pages.RunPages.digest; runs.csv: every row and the
    redactor): each is taken as it is (a hard link, else a copy) instead of made again; else a run
    page the results database keeps with the same digest (`stored`, by run folder: results.db.load.stored_pages).
    PAGES_MANIFEST, written into the new site before it is swapped in whole, holds each one's
    digest; one of another code_fingerprint keeps nothing. A page's chart ids are its own (Ids), so
    a page depends on no other."""

    def __init__(self, previous: Path | None, stored: Mapping[str, tuple[str, bytes]] | None = None) -> None:
        self.previous = previous
        self.stored = stored or {}
        self.before: dict[str, Any] = {}
        self.now: dict[str, str] = {}
        self.kept = 0                                  # run pages taken from the previous build
        self.stored_taken = 0                          # … from the results database
        try:
            doc = json.loads((previous / PAGES_MANIFEST).read_text()) if previous is not None else {}
        except (OSError, ValueError):
            doc = {}
        if isinstance(doc, dict) and doc.get("format") == 2 and doc.get("code") == code_fingerprint() \
                and isinstance(doc.get("pages"), dict):
            self.before = doc["pages"]

    @staticmethod
    def digest(inputs: str) -> str:
        """What the manifest keeps of a page's inputs."""
        return hashlib.sha256(inputs.encode()).hexdigest()

    def taken(self, site: Path, rel: str, digest: str) -> bool:
        """File `rel` of `site` taken from the previous build when the digest of its inputs is
        unchanged (True); False: the caller makes it. The caller puts the digest in `now`."""
        return self.before.get(rel) == digest and self._take(rel, site)

    def taken_stored(self, site: Path, rel: str, digest: str, run: RunFolder) -> bool:
        """Run page `rel` of `site` written as the results database keeps it when it was made from
        inputs of this digest (True); False: the caller makes it."""
        held = self.stored.get(str(run.path))
        if held is None or held[0] != digest:
            return False
        from results.db.schema import unpacked  # (the database's modules only on a build from one)

        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(unpacked(held[1]))
        return True

    def _take(self, rel: str, site: Path) -> bool:
        assert self.previous is not None
        src, dst = self.previous / rel, site / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            try:
                shutil.copyfile(src, dst)
            except OSError:
                return False
        return True

    def write(self, site: Path) -> None:
        write_json(site / PAGES_MANIFEST, {"format": 2, "code": code_fingerprint(), "pages": self.now})


def _render(site: Path, camps: Sequence[CampaignData], table: pd.DataFrame, recs: Recommendations | None,
            history: History | None = None, kept: _Kept | None = None,
            progress: Callable[[str], None] | None = None) -> int:
    """The site's pages into `site`: the run pages are begun first (on every core, results.site.fanout),
    and this process analyses the table and makes the other pages while they are made."""
    env = make_environment()
    redactor = Redactor(camps)
    kept, digest_redactor = kept or _Kept(None), redactor.fingerprint()
    # a run page reads its row of the run table as read (the analysis adds no column it shows) and its tells
    made = RunPages(env, table, redactor)

    def one(run: RunFolder) -> tuple[str, str, str]:
        # a run page: taken from the last build or the results database when its inputs are
        # unchanged, else made (in a child, on a long build)
        rel = Urls.run(run.run_id)
        digest = made.digest(run)
        if kept.taken(site, rel, digest):
            return rel, digest, "kept"
        if kept.taken_stored(site, rel, digest, run):
            return rel, digest, "stored"
        _write(site / rel, made.html(run))
        return rel, digest, ""

    with fanout.started([run for camp in camps for run in camp.runs], one) as run_pages:
        analysis = analyze(table, tells=made.found)
        pages = _other_pages(site, env, camps, analysis, recs if recs is not None else recommendations_for(
            camps, analysis), history, kept, redactor, digest_redactor)
        said = None if progress is None else lambda done, of: progress(f"report: run pages {done}/{of}")
        for rel, page_digest, source in run_pages.results(said).results:
            kept.now[rel] = page_digest
            kept.kept += source == "kept"
            kept.stored_taken += source == "stored"
            pages += 1
    kept.write(site)
    return pages


def _other_pages(site: Path, env: Environment, camps: Sequence[CampaignData], analysis: Analysis,
                 recs: Recommendations, history: History | None, kept: _Kept, redactor: Redactor,
                 digest_redactor: str) -> int:
    """Everything but the run pages: assets, recommendations.json, runs.csv, the device, model and
    history pages, the index. Returns how many pages."""
    table = analysis.table
    (site / "assets").mkdir()
    shutil.copyfile(_plotly_js(), site / "assets" / "plotly.min.js")
    for name in ("site.css", "site.js"):
        shutil.copyfile(templates_dir() / name, site / "assets" / name)
    (site / SITE_MARKER).write_text("written by bmoe-fleet report; safe to replace\n")
    _write(site / names.SITE_RECOMMENDATIONS_JSON, recs.to_json())
    # runs.csv: the whole analysed table's rows and the redactor are its inputs
    table_digest = kept.digest("\n".join([digest_redactor, *row_digests(table)]))
    kept.now[names.SITE_RUNS_CSV] = table_digest
    if not kept.taken(site, names.SITE_RUNS_CSV, table_digest):
        _write(site / names.SITE_RUNS_CSV, frame_csv(published_runs(table, redactor)))
    pages = 0
    rec_by_key = {r.key: r for r in recs.all()}
    front = quality_front(table)           # the quality charts' settings, for every device and model page
    for device in sorted(set(table[C.device])):
        page = device_page(device, camps, analysis, recs, rec_by_key, Ids(), redactor, front)
        if history is not None:
            page = replace(page, histories=history_links(history, device))
        _write(site / Urls.device(device), render(env, "device.html", page))
        pages += 1
    for model in sorted(set(table[C.model])):
        _write(site / Urls.model(model),
               render(env, "model.html", model_page(model, camps, table, analysis, Ids(), rec_by_key, redactor, front)))
        pages += 1
    histories = []
    for path, hp in history_pages(history) if history is not None else []:
        _write(site / path, render(env, "history.html", hp))
        histories.append(Link(f"{hp.model.text} on {hp.device.text}", path, f"{len(hp.rows)} release rows"))
        pages += 1
    _write(site / "index.html", render(env, "index.html", replace(index_page(analysis, recs),
                                                                     histories=tuple(histories))))
    return pages + 1
