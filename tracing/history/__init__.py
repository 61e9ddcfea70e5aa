"""Memory of normal: every start, recorded as it ends, keyed by what makes starts comparable.

``fingerprint``: the launch fingerprint of a run (model, parallel layout, versions, devices, the
server arguments that change start time). ``measure``: a run's start as the history keeps it
(outcome, times, each phase's time per process). ``store``: the SQLite history (``record`` one
run; ``History`` to query). ``where``: the database's place. ``keeper``: a start recorded from a
thread as it ends. ``live``: ``usual`` and ``eta`` for a start in progress. ``baseline``: one run
against its launch's history.

Names are imported on first use (PEP 562): a launcher that asks ``where`` or makes a ``keeper``
does not import SQLite on its way.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .fingerprint import Fingerprint, of_run
    from .live import Eta, eta, usual, usuals
    from .store import History, HistoryError, Recorded, Usual, forget, record
    from .where import ENV_HISTORY, location, of_run_dir

_WHERE = {
    "Fingerprint": "fingerprint",
    "of_run": "fingerprint",
    "Eta": "live",
    "eta": "live",
    "usual": "live",
    "usuals": "live",
    "History": "store",
    "HistoryError": "store",
    "Recorded": "store",
    "Usual": "store",
    "forget": "store",
    "record": "store",
    "ENV_HISTORY": "where",
    "location": "where",
    "of_run_dir": "where",
}

__all__ = [
    "ENV_HISTORY",
    "Eta",
    "Fingerprint",
    "History",
    "HistoryError",
    "Recorded",
    "Usual",
    "eta",
    "forget",
    "location",
    "of_run",
    "of_run_dir",
    "record",
    "usual",
    "usuals",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
