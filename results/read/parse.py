"""Lenient readers for every bmoe-cli output format seen in the wild (entry point).

One job per module, all re-exported here:

- `parse_csv`: `--csv` metrics files, no preamble (7-12 columns), `# bmoe_metrics v1`, `v2`;
- `parse_console`: `.log` / `.out` / `.err` captures (end-of-run lines, `bmoe:` load lines, errors,
  `BMOE_*` JSON), multi-run captures split at their `==== TAG ====` separators, into the records
  of `console_records`;
- `parse_device`: `.metrics` pressure sidecars, `.state` snapshots, driver logs' `ENTRY STATE`;
- `parse_config`: run configuration from file names, driver tags, echoed command lines, and the
  engine's own lines;
- `parse_discover`: grouping a folder's files into runs;
- `parse_values`: what a value of each key can be (the range checks every reader applies).

Lenient about what they read (unknown keys kept, optional columns, `-1` = not measured, UTF-8 BOM,
CRLF, invalid UTF-8, runs killed mid-write); a file that is not the format asked for raises a
one-line ParseError. Numbers are range-checked as they are read: one no engine prints is a
NumberError (a ParseError naming file, line and key); nan, inf and values impossible for their key
are stored as missing, with a note in the reader's `notes`. docs/formats.md lists the variants with
an example line each.
"""

from results.read.console_records import (
    CacheAuto,
    CacheChurn,
    ComputeUse,
    ConsoleRun,
    CycleWarning,
    DenseAnon,
    DenseWarmup,
    Generation,
    MoeCache,
    MoeStream,
    Prefetch,
    Prefill,
    SpecGate,
    StreamingOn,
)
from results.read.parse_config import config_from_command, config_from_log, config_from_name, config_from_tag, run_stem
from results.read.parse_console import parse_console, read_console, read_console_runs, split_runs
from results.read.parse_csv import NOT_MEASURED, REQUIRED_COLUMNS, MetricsFile, looks_like_metrics_csv, read_metrics_csv
from results.read.parse_device import entry_exit, read_driver_log, read_sidecar, read_state
from results.read.parse_discover import RunFiles, discover
from results.read.parse_text import NumberError, ParseError

__all__ = [
    "NOT_MEASURED",
    "REQUIRED_COLUMNS",
    "CacheAuto",
    "CacheChurn",
    "ComputeUse",
    "ConsoleRun",
    "CycleWarning",
    "DenseAnon",
    "DenseWarmup",
    "Generation",
    "MetricsFile",
    "MoeCache",
    "MoeStream",
    "NumberError",
    "ParseError",
    "Prefetch",
    "Prefill",
    "RunFiles",
    "SpecGate",
    "StreamingOn",
    "config_from_command",
    "config_from_log",
    "config_from_name",
    "config_from_tag",
    "discover",
    "entry_exit",
    "looks_like_metrics_csv",
    "parse_console",
    "read_console",
    "read_console_runs",
    "read_driver_log",
    "read_metrics_csv",
    "read_sidecar",
    "read_state",
    "run_stem",
    "split_runs",
]
