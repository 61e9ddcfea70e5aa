"""A start recorded as it ends, off its critical path: the launcher hands its watchdog's view to a
``Keeper`` at ready (and at its first stall: a launcher killed after it still leaves its start in
the history), and ``phasetrace run`` its own at the end. One daemon thread records, the requests
made meanwhile coalesced into one more; whoever is about to exit waits for it at most
``EXIT_WAIT_S``. Recording the same run again replaces it (``store.record``), and never raises.

Cost: the thread refreshes the view (what was appended since the last pass) and records it —
5-7 ms for a real tp=2 start, ≈ 0.5 s for 1024 ranks x 270 spans in one directory (``store.record``).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import where

if TYPE_CHECKING:
    from ..reader.view import RunView

log = logging.getLogger("sglang_phasetrace")
EXIT_WAIT_S = 1.0  # the longest an exiting process waits for its start to be recorded


def off(run_dir: str | Path) -> bool:
    """The history is off for this run (``SGLANG_PHASETRACE_HISTORY=0``): asked on the launch's ready
    path, so no filesystem is touched (where the history is, the keeper's thread finds out)."""
    return where.off()


class Keeper:
    """Records ``view`` (read whole) in its history. ``lock``: held while the view is refreshed and
    read (the watchdog's, whose thread refreshes the same view). ``path``: the database (default:
    the run's base directory's, ``store.of_run_dir``)."""

    def __init__(self, view: RunView, lock: threading.Lock | None = None, path: Path | where.Dsn | None = None) -> None:
        self.view, self.lock, self.path = view, lock or threading.Lock(), path
        self.final = False  # a request said the start has ended (ready, or the process exits)
        self.recorded: Any = None  # ``store.Recorded``, once recorded
        self._wanted: tuple[str | None] | None = None  # the next recording's outcome, while one is asked for
        self._busy = False
        self._cv = threading.Condition()

    def record(self, outcome: str | None = None, final: bool = True) -> None:
        """Record the run now, from the keeper's thread (``outcome``: see ``store.record``); while a
        recording runs, once more after it. ``final``: the start has ended (not a provisional
        record, as at a first stall)."""
        with self._cv:
            self.final = self.final or final
            self._wanted = (outcome,)
            if self._busy:
                return
            self._busy = True
        try:
            threading.Thread(target=self._work, name="phasetrace-history", daemon=True).start()
        except RuntimeError as exc:  # no thread at interpreter shutdown: not recorded, said quietly
            log.debug("sglang-phasetrace: history: not recorded: %r", exc)
            with self._cv:
                self._busy = False
                self._cv.notify_all()

    def _work(self) -> None:
        while True:
            with self._cv:
                if self._wanted is None:
                    self._busy = False
                    self._cv.notify_all()
                    return
                (outcome,), self._wanted = self._wanted, None
            try:
                from . import store  # here, on this thread: SQLite is imported off the start's path

                with self.lock:  # the run read under the watchdog's lock; the database written outside it
                    self.view.refresh()
                    prepared = store.prepare(self.view, outcome)
                done = store.save(prepared, self.path) if prepared is not None else None
                self.recorded = done or self.recorded
            except Exception as exc:  # record() never raises; a view that cannot be read is said here
                log.debug("sglang-phasetrace: history: recording %s failed: %r", self.view.path, exc)

    def wait(self, timeout: float = EXIT_WAIT_S) -> bool:
        """Until nothing is left to record, for at most ``timeout`` s; whether it got there."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._busy, timeout)
