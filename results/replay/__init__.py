"""Replaying route traces: the exact LRU (and other policies') hit curve at every budget, and the
predictions built on it."""
