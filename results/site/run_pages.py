"""A site's run pages: each made from its run's record, row of the run table, tells and series
(results.site.page_views.run_page) and named by a digest of all it was made from (RunPages.digest),
so a page whose inputs did not change is taken instead of made again: from the last build's site
folder (results.site.report), or from the results database, which keeps every run's page as
`db ingest` made it (store_run_pages; docs/decisions/stored-run-pages.md).

The digest covers the page's inputs (run_page_inputs: among them what the redactor replaces in the
run's own run.json, not the whole site's redactor, so a page made for one set of campaigns serves
a site of another when nothing of the others is named in it), the code and templates that make
pages (code_fingerprint) and the time zone its times are shown in.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from jinja2 import Environment

from results.analysis.analyze import measured_tells, tells_by_run
from results.errors import ResultsError
from results.publish import Redactor
from results.read.columns import C
from results.read.frames import row_digests, row_views
from results.read.rundir import RunFolder, provided_folders
from results.read.series import provided
from results.site import fanout
from results.site.environment import code_fingerprint, make_environment, render
from results.site.page_views import Ids, run_page, run_page_inputs

if TYPE_CHECKING:
    from results.db.ingest import Ingested


def zone() -> list[object]:
    """The time zone a page shows its times in (site_format.fmt_time: the local time of the build)."""
    return [list(time.tzname), time.timezone, time.altzone, time.daylight]


class RunPages:
    """The run pages of a run table: each one's digest and HTML. Made before the pages are (the
    children that make them inherit it: results.site.fanout): the table's row digests and views
    and its measured tells (results.analysis.analyze.measured_tells)."""

    def __init__(self, env: Environment, table: pd.DataFrame, redactor: Redactor) -> None:
        self.env, self.redactor = env, redactor
        self.digests, self.views = row_digests(table), row_views(table)
        self.at = {run_id: i for i, run_id in enumerate(table[C.run_id])}
        self.found = measured_tells(table)
        self.tells = tells_by_run(self.found)
        self.context = json.dumps([code_fingerprint(), zone()])

    def digest(self, run: RunFolder) -> str:
        """The digest of everything `run`'s page is made from (module doc)."""
        inputs = run_page_inputs(run, self.digests[self.at[run.run_id]], self.tells.get(run.run_id, []), self.redactor)
        return hashlib.sha256(f"{self.context}\n{inputs}".encode()).hexdigest()

    def html(self, run: RunFolder) -> str:
        """`run`'s page."""
        return render(self.env, "run.html", run_page(run, self.views[self.at[run.run_id]],
                                                     self.tells.get(run.run_id, []), Ids(), self.redactor))


def ingest_with_pages(dirs: Sequence[str | Path], db: str | None, progress: Callable[[str], None] | None = None,
                      rebuild: bool = False) -> tuple[list[Ingested], int]:
    """`bmoe-fleet db ingest` (`db rebuild` when `rebuild`): the campaign directories into the
    database (results.db.ingest), then the run pages of those it changed (store_run_pages). Returns
    what each campaign's ingest did and how many run pages were made."""
    from results.db import ingest

    done = (ingest.rebuild if rebuild else ingest.ingest)(dirs, db, progress)
    made = store_run_pages(db, [d.dir for d in done if d.changed], progress)
    if progress is not None and made:
        progress(f"db: {made} run pages made and kept")
    return done, made


def store_run_pages(db: str | None, dirs: Sequence[str | Path] = (),
                    progress: Callable[[str], None] | None = None) -> int:
    """`db ingest`'s last step: the run pages of campaign directories DIRS (those it changed) and
    of every campaign the database keeps a run of without its page, or with a page other code made,
    made as a report of those campaigns makes them and kept in the database (a page it keeps
    with the same digest is not made again). Returns how many pages were made. Another campaign
    whose pages cannot be made now (renamed since its ingest) is said and left as it is."""
    from results.db.ingest import store_pages
    from results.db.load import unpaged_dirs

    code = code_fingerprint()
    named = [d for d in dict.fromkeys(str(Path(d).resolve()) for d in dirs) if os.path.isdir(d)]
    # a folder moved away since it was ingested has no page made
    others = [d for d in unpaged_dirs(db, code) if d not in named and os.path.isdir(d)]
    try:
        made = _made_pages(db, [*named, *others], progress)
    except ResultsError as e:
        if not others:
            raise
        if progress is not None:
            progress(f"db: the run pages of {len(others)} other campaign(s) left unmade: {e}")
        made = _made_pages(db, named, progress)
    store_pages(db, made, code)
    return len(made)


def _made_pages(db: str | None, dirs: Sequence[str], progress: Callable[[str], None] | None) \
        -> list[tuple[str, str, int, str, bytes]]:
    """The pages of these campaigns' runs the database does not keep as they would be made now:
    (campaign directory, cell id, attempt, digest, the page packed)."""
    from results.db.load import page_digests, run_table, stored_campaigns, stored_folders
    from results.db.schema import packed

    if not dirs:
        return []
    table = run_table(dirs, db)
    pairs = list(zip(table[C.device], table[C.model]))
    # only these campaigns' runs: an ingest's cost follows its own campaigns, not the database's size
    series, folders = stored_folders(db, pairs, dirs=dirs)
    kept = page_digests(db, pairs, dirs)
    with provided(series), provided_folders(folders):
        camps = stored_campaigns(dirs, table)
        pages = RunPages(make_environment(), table, Redactor(camps))

        def one(run: RunFolder) -> tuple[str, str, int, str, bytes] | None:
            digest = pages.digest(run)
            if kept.get(str(run.path)) == digest:
                return None
            return str(run.root), run.cell_id, run.attempt, digest, packed(pages.html(run).encode("utf-8"))

        said = None if progress is None else lambda done, of: progress(f"db: run pages {done}/{of}")
        return [m for m in fanout.each([run for camp in camps for run in camp.runs], one, said).results
                if m is not None]
