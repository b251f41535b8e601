"""The errors the results commands raise (the CLI turns each into a one-line message, exit 1)."""

from engine.errors import BmoeError
from engine.safetext import printable

MESSAGE_CHARS = 1000


def safe_message(message: str) -> str:
    """One terminal-safe line: control characters escaped (newlines too), at most MESSAGE_CHARS."""
    text = printable(str(message).replace("\n", "\\n"))
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + "…"


class ResultsError(BmoeError):
    """Campaign directories cannot be read, or a table/report/comparison cannot be made from them."""


class ReplayError(BmoeError):
    """A replay cannot run with the traces or options given (one terminal-safe line)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(safe_message(message))
