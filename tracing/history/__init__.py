"""Memory of normal: every start, recorded as it ends, keyed by what makes starts comparable.

``fingerprint``: the launch fingerprint of a run (model, parallel layout, versions, devices, the
server arguments that change start time). ``measure``: a run's start as the history keeps it
(outcome, times, each phase's time per process). ``store``: the SQLite history (``record`` one
run; ``History`` to query). ``live``: ``usual`` and ``eta`` for a start in progress.
"""

from __future__ import annotations

from .fingerprint import Fingerprint, of_run
from .live import Eta, eta, usual, usuals
from .store import ENV_HISTORY, History, HistoryError, Recorded, Usual, forget, location, record

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
    "record",
    "usual",
    "usuals",
]
