"""bmoe-cli's interface, by release: the flags each release takes (flags.py) and the outputs it
writes (outputs.py), declared once so that the engine's parser, the harness's argv, the readers of
its outputs and the recommended command lines all derive from the same table (docs/decisions/flag-table.md).

Releases are named in releases.py. The table is data: no module here imports anything outside
engine/, so every layer may read it.
"""
