"""The errors the results commands raise (the CLI turns each into a one-line message, exit 1)."""

from engine.errors import BmoeError
from results.parse_text import safe_message


class ResultsError(BmoeError):
    """Campaign directories cannot be read, or a table/report/comparison cannot be made from them."""


class ReplayError(BmoeError):
    """A replay cannot run with the traces or options given (one terminal-safe line)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(safe_message(message))
