"""The results database: the run table of many campaigns, kept in SQLite or PostgreSQL.

The campaign directories stay the source of truth; the database holds their run table
(results/read/columns.py declares it) so that `table`, `report`, `recommend` and `compare` need
not rebuild it from the files each time (`--db URL`). `schema` makes the tables, `ingest` loads
campaign directories incrementally, `load` reads the run table back.
"""
