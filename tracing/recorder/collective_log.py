"""Init collectives: which collective/barrier each thread is in, per-group sequence numbers.

Recorded only while the process initialises (the patches are removed at ready), as ``collective``
journal records (``edge`` enter/exit) and as heartbeat state, so the watchdog can tell which
rank has not entered the collective its peers wait in, or entered a different one.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .. import process_state
from ..journal import records
from . import runtime


class Collectives:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}  # group -> collectives entered
        self.current: dict[int, dict[str, Any]] = {}  # thread id -> the one it is in

    def enter(self, op: str, group: str) -> dict[str, Any]:
        with self.lock:
            seq = self.counts[group] = self.counts.get(group, 0) + 1
            entry = {"op": op, "group": group, "seq": seq, "t": time.time_ns()}
            self.current[threading.get_ident()] = entry
        return entry

    def exit(self, entry: dict[str, Any]) -> int:
        with self.lock:
            if self.current.get(threading.get_ident()) is entry:
                del self.current[threading.get_ident()]
        return time.time_ns()

    def in_flight(self, now: int) -> tuple[dict[str, Any] | None, dict[str, int]]:
        """The oldest collective any thread is in (with its age), and per-group counts."""
        with self.lock:
            entries = sorted(self.current.values(), key=lambda e: e["t"])
            counts = dict(self.counts)
        if not entries:
            return None, counts
        e = entries[0]
        return {"op": e["op"], "group": e["group"], "seq": e["seq"], "since_s": round((now - e["t"]) / 1e9, 3)}, counts


def state() -> Collectives:
    """This process's collectives (``process_state``: a forked child starts with none)."""
    return process_state.part("collectives", Collectives)


def enter(op: str, group: str) -> dict[str, Any] | None:
    """Record entering a collective; None when nested in another one or before tracing started."""
    rt = runtime.current()
    local = process_state.STATE.local
    if not rt.started or rt.ready or getattr(local, "collective_depth", 0):
        return None
    local.collective_depth = 1
    entry = state().enter(op, group)
    rt.write(records.collective(entry["t"], "enter", op, group, entry["seq"], span=_current_span(rt)))
    return entry


def exit(entry: dict[str, Any]) -> None:
    process_state.STATE.local.collective_depth = 0
    t = state().exit(entry)
    dur_s = round((t - entry["t"]) / 1e9, 6)
    runtime.current().write(records.collective(t, "exit", entry["op"], entry["group"], entry["seq"], dur_s=dur_s))


def _current_span(rt: runtime.Runtime) -> str | None:
    spans = rt.open.listed()
    return runtime.hexid(spans[-1][0].get_span_context().span_id) if spans else None
