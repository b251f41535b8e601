"""The error the results commands raise (the CLI turns it into a one-line message, exit 1)."""

from engine.errors import BmoeError


class ResultsError(BmoeError):
    """Campaign directories cannot be read, or a table/report/comparison cannot be made from them."""
