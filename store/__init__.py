"""The campaign store: everything that knows how a campaign directory is laid out on disk
(docs/campaign-dir.md).

One home for the directory's file names (names), its formats, versions and the one versioned
JSON reader/writer with an upgrade hook per version (versioned), the outcome vocabulary
(outcomes), a cell's typed configuration (cells), an attempt's typed record, run.json
(run_record), the ledger (ledger), the attempt folders and the records written beside them
(campaign_dir), and the lock files that keep two campaigns off one directory or one device (locks).

The runner writes through it; status, import, table and report read through it. It imports the
engine package only (for the one atomic write and the error base), so both the harness above it
and results beside the harness can use it; no other module names a file of a campaign directory.
"""
