"""A store a caller provides for a while, answering run folders (keyed by str(folder)) in place of
their files: what the results database keeps of each run folder, so `report --db` reads none
(results.read.series for the metrics CSV and samples, results.read.rundir for run.json and the
file names; results.db.load makes the stores)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Generic, TypeVar

V = TypeVar("V")


class Provided(Generic[V]):
    """One kind of store: set while inside `providing`, looked up by run folder."""

    def __init__(self, name: str) -> None:
        self._var: ContextVar[Mapping[str, V] | None] = ContextVar(name, default=None)

    @contextlib.contextmanager
    def providing(self, store: Mapping[str, V]) -> Iterator[None]:
        """Answer the run folders of `store` from it, while inside."""
        token = self._var.set(store)
        try:
            yield
        finally:
            self._var.reset(token)

    def store(self) -> Mapping[str, V] | None:
        """The store provided now, None outside."""
        return self._var.get()

    def of(self, folder: str | Path) -> V | None:
        """What the store provided now holds of a run folder, None when none holds it."""
        store = self._var.get()
        return None if store is None else store.get(str(folder))
