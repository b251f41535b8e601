"""Reading what engines and the harness wrote: console captures, CSVs, route traces, session
transcripts and campaign directories, into the run table (table.py) and its keys (run_keys.py)."""
