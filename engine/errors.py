"""Error types shared by every bmoe-fleet package.

Library code raises these; the two CLIs turn them into one-line messages and exit codes in one
place each (harness/cli/main.py, engine/app/cli.py).
"""


class BmoeError(Exception):
    """Base of every error bmoe-fleet reports to a user as a one-line message."""


class ModelError(BmoeError):
    """A model file is not a usable MoE GGUF (not GGUF, truncated, non-MoE, bad top-k...)."""


class SynthError(BmoeError):
    """A synthetic model cannot be written with the options given."""


class ForwardError(BmoeError):
    """The model cannot be run by the reference forward pass (arch, shape, context)."""
