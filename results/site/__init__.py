"""The published benchmark pages: page views, charts, formatting and the site build (report.py)."""
