"""The errors the campaign store raises (the CLI turns each into one line, exit 1)."""

from engine.errors import BmoeError


class StoreError(BmoeError):
    """A campaign directory's file cannot be read or written as its format says."""


class LockBusy(StoreError):
    """A campaign directory or a device is held by another campaign."""
