"""bmoe-py: a Python reference implementation of BigMoeOnEdge's expert streaming and cache sizing."""

__version__ = "0.1.0"
