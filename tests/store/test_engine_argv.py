"""store.engine_argv writes every cell's command line from its typed config: the argv an older
campaign directory stored is what it writes today, element for element."""

from __future__ import annotations

from pathlib import Path

from harness.plan.grid import read_plan
from store.campaign_dir import CampaignDir
from store.engine_argv import engine_argv, settings_argv

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "store"


def test_an_older_directorys_argv_is_what_the_typed_config_writes_today():
    plan = read_plan(CampaignDir(FIXTURES))
    assert plan is not None
    kinds = set()
    for cell in plan.cells + plan.probes:
        argv = list(cell.argv)
        csv = argv[argv.index("--csv") + 1]
        route = argv[argv.index("--route-trace") + 1] if "--route-trace" in argv else None
        assert engine_argv(argv[0], argv[argv.index("-m") + 1], cell.config, csv, route) == argv, cell.cell_id
        settings = settings_argv(cell.config)
        assert argv[7:7 + len(settings)] == settings       # after the engine, -m, -p and -n
        kinds.add(("auto" if cell.config.cache_auto else "fixed" if cell.config.moe_stream else "mmap",
                   bool(cell.config.force_cache)))
    assert {("auto", False), ("fixed", True), ("mmap", False)} <= kinds, kinds
