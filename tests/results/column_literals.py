"""Where the run table's readers spell a column's name as a string literal of their own
(`row["tok_s"]`), outside the declaration: test_column_literals.py fails on any not allowed below,
each with its reason; and every `C.<name>` of the tree, which must name a declared column.

The names: every column results/read/columns.py declares but the configuration columns (`FIXED`,
`AFTER_CONFIG` and `QUALITY`). A configuration column is named after its key of run.json's
`config`, and the readers read those keys from the typed `CellConfig` (attributes, not strings);
a literal equal to one (`"threads"`, `"prompt"`) says nothing about which of the two it is.

The files: the packages and modules that read the run table (`READERS`) and `run_row`'s own
module. Not the rest of the tree: there the same words are other formats' keys, each declared
where it belongs: a campaign file's keys and sweep options (harness/campaign/), the engine's
output names (engine/interface/outputs.py), run.json's fields (store/run_record.py), the
parsers' own fields (results/read/parse*.py), a device's state (devices/). A docstring is
documentation."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.engine.flag_literals import _docstrings, string_constants

READERS = ("results/analysis", "results/site", "results/db", "results/replay", "harness/cli",
           "harness/demo.py", "harness/run/verify.py", "results/read/table.py")

# the CSV preamble's keys run_row reads a column from (engine/interface/outputs.py declares them)
_PREAMBLE = {"arch", "n_layer", "n_expert", "n_expert_used", "cache_cycle_mb", "moe_stream", "cache_auto",
             "cache_mb", "cache_ceil_mb", "dense_weights", "engine"}

# a device record's keys (devices/<id>.json, results.analysis.fleet_rules.identity_of), not the table's columns
_IDENTITY = {"model", "android_release", "ram_total_kb"}

# file -> names it may spell that are not the run table's column there, and why
ALLOWED: dict[str, set[str]] = {
    "results/read/table.py": (
        _PREAMBLE
        # the summary trailer's keys (engine/interface/outputs.py) and run.json's result's
        | {"tokens", "cache_hit_pct"}
        # run.json's pressure, reclaim and cpu keys (store/run_record.py), a device record's, a model record's
        | {"mem_avail_floor_kb", "peak_rss_kb", "mem_avail_before_kb", "mem_avail_after_kb", "psi_some_avg10_max",
           "psi_full_avg10_max", "cores", "threads_sum", "oversubscribed"} | _IDENTITY
        # a cpu record's other engine (harness/run/cpushare.py): its device and cell; an app verdict's `killed`
        | {"device", "cell_id", "killed"}
        # the console's line names and fields (results/read/parse_console.py)
        | {"mode", "ppl", "plan_flags", "plan_cache_mb"}
        # results.read.run_keys.budget_asked's keys
        | {"planner"}
        # words of the `flags` column, and `o_direct_basis`'s value `outcome`
        | {"under_cycle", "probe", "gate_gave_up", "outcome"}
        # columns.GROUPS names, the run_row functions' keys
        | {"turns", "config", "apps"}
    ),
    # the `campaign_dir` argument's name; the --device option's default label
    "harness/cli/campaign.py": {"campaign_dir", "imported"},
    # the --apps option's parameter name; a virtual phone's getprop identity key
    "harness/cli/virtual.py": {"apps", "model"},
    # the demo's folders under its output
    "harness/demo.py": {"campaign", "turns"},
    # keys of verify's own result record (its JSON)
    "harness/run/verify.py": {"campaign", "engine", "exit_status"},
    # the app verdict's word
    "results/analysis/android_app.py": {"killed"},
    # a device record's keys (`device` its label)
    "results/analysis/community.py": {"android_release", "ram_total_kb", "device"},
    # compare's own rows (ROW_COLUMNS, its JSON)
    "results/analysis/compare.py": {"device", "model"},
    # a device's identity record (keys) and the left-out devices' JSON
    "results/analysis/fleet_db.py": _IDENTITY | {"device"},
    # a device's identity record, the fleet rule's points and models (its JSON)
    "results/analysis/fleet_rules.py": _IDENTITY | {"device"},
    # history's own table (COLUMNS, _HEADERS, its JSON)
    "results/analysis/history.py": {"apps", "device", "engine", "model", "tok_s"},
    # a setting's JSON key `argv`; `ppl`, a quality loss's basis
    "results/analysis/quality.py": {"argv", "ppl"},
    # a dense mode's JSON keys; an identity record's RAM
    "results/analysis/recommend.py": {"majflt_per_tok", "mode", "tok_s", "ram_total_kb"},
    # CellConfig.from_dict's keys (store/cells.py), a configuration rebuilt from the row's columns
    "results/analysis/recommend_argv.py": {"cache_auto", "cache_ceil_mb", "cache_mb", "dense_weights", "engine_args",
                                           "moe_stream", "n_expert_used"},
    # the recommendations JSON schema and its table's columns (ROW_COLUMNS); a rule point's device, identity's model
    "results/analysis/recommend_records.py": {"argv", "cache_ceil_mb", "device", "imported", "model", "ram_total_kb"},
    # tell names (results/analysis/tells.py TELLS)
    "results/analysis/tells.py": {"gate_gave_up", "oversubscribed"},
    # the campaigns table's column (results/db/schema.py)
    "results/db/ingest.py": {"imported"},
    # the --device / --model option a message names
    "results/db/load.py": {"device", "model"},
    # a declared type's name (columns.TYPES); the campaigns table's column
    "results/db/schema.py": {"config", "imported"},
    # the drop replay's JSON keys
    "results/replay/drop_replay.py": {"drop_pct", "read_mib", "under_cycle"},
    # the LRU replay's JSON keys
    "results/replay/lru_replay.py": {"read_mib", "under_cycle"},
    # a route trace's JSON keys
    "results/replay/replay.py": {"arch", "model", "n_expert", "n_expert_used", "n_layer"},
    # bmoe-py's config field a flag sets (engine.interface.flags); plotly's trace key; a quality loss's basis
    "results/site/charts.py": {"drop_cold_frac", "mode", "ppl"},
    # the device page: a device record's keys and labels; the run page: run.json's turns and cpu keys and labels;
    # a campaign summary's `imported`
    "results/site/page_views.py": _IDENTITY | {"device", "apps", "outcome", "tokens", "cache_hit_pct", "read_mib",
                                               "majflt_per_tok", "cores", "threads_sum", "oversubscribed", "imported"},
}


def _text_of_f_strings(tree: ast.AST) -> set[int]:
    """The literal text of f-strings (`f"planner{series}: …"`): words, not names."""
    return {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values
            if isinstance(v, ast.Constant)}


def literal_columns(root: Path, names: set[str]) -> dict[str, set[str]]:
    """{file: the column names it holds as whole string literals} of the reader files (docstrings
    and the text of f-strings aside)."""
    out: dict[str, set[str]] = {}
    for entry in READERS:
        where = root / entry
        for path in [where] if where.suffix == ".py" else sorted(where.rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            hits = string_constants(tree, names, _docstrings(tree) | _text_of_f_strings(tree))
            if hits:
                out[path.relative_to(root).as_posix()] = hits
    return out


def attributes_of_c(root: Path, folders: tuple[str, ...]) -> dict[str, set[str]]:
    """{file: the attribute names it reads of `C`} of every module that imports `C` from
    results.read.columns (and columns.py itself)."""
    out: dict[str, set[str]] = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if "C." not in text:
                continue
            tree = ast.parse(text)
            rel = path.relative_to(root).as_posix()
            imports_c = rel == "results/read/columns.py" or any(
                isinstance(n, ast.ImportFrom) and n.module == "results.read.columns"
                and any(a.name == "C" and a.asname in (None, "C") for a in n.names) for n in ast.walk(tree))
            if not imports_c:
                continue
            used = {n.attr for n in ast.walk(tree)
                    if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "C"}
            if used:
                out[rel] = used
    return out
