"""Whether a launch that served has ended: every process of it gone, when it was last heard of, and
how it ended, as far as the run directory says. A viewer of a finished run says so instead of
"serving" (``status``, ``report``, the probe's journal fallback).

A process is gone when that is proven (``index.ended``: it ran on this host and is no longer that
process, or another process recorded its exit), or, run elsewhere (a copied run directory), when
nothing was heard of it for ``QUIET_S``: a process that serves replaces its status file every
heartbeat, so a long silence is not a live process."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .. import other_processes
from . import index
from .view import ProcessRec, RunView

NS = 1_000_000_000
QUIET_S = 600.0  # 300 heartbeats missed
TEARDOWN = "launch.teardown"  # SGLang's kill_process_tree: its launcher tore the launch down


@dataclass(frozen=True)
class Ended:
    """A launch that served and has ended: ``t`` (ns) the last sign of life of any of its processes
    (its latest record, heartbeat or exit record), ``how`` it ended (what was recorded of it)."""

    t: int
    how: str

    def ago_s(self, now_ns: int) -> float:
        return max(0.0, (now_ns - self.t) / NS)

    @property
    def at(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.t / NS))

    def line(self, now_ns: int | None = None) -> str:
        """``the launch served, then ended 83 min ago (2026-12-07 02:00:01 UTC): tp0, tp1 killed by
        SIGTERM``; without ``now_ns`` (a page kept for later), ``… then ended at 2026-12-07 …``."""
        when = f"{ago(self.ago_s(now_ns))} ago ({self.at})" if now_ns is not None else f"at {self.at}"
        return f"the launch served, then ended {when}: {self.how}"

    def to_json(self, now_ns: int) -> dict[str, Any]:
        return {"t": self.t, "at": self.at, "ago_s": round(self.ago_s(now_ns), 3), "how": self.how, "line": self.line()}


def ago(seconds: float) -> str:
    """``42 s``, ``83 min``, ``5 h``, ``3 days``: how long ago, as a person says it."""
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 1.5 * size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def last_heard(view: RunView, proc: ProcessRec) -> int:
    """The latest sign of life of ``proc`` (ns): its journal's latest record, its status file's beat,
    the ``exit`` record someone wrote of it."""
    beat = view.status_file(proc) if proc.remote is None else None
    times = [proc.last_t, beat.get("t") if beat else 0, (proc.exit or {}).get("t") or 0]
    return max(t for t in times if isinstance(t, int))


def gone(view: RunView, proc: ProcessRec, now_ns: int) -> bool:
    """Proven gone, or (run on another host) not heard of for ``QUIET_S``."""
    if proc.remote is None and index.ended(proc):
        return True
    local = proc.remote is None and proc.host == other_processes.this_host()
    return not local and now_ns - last_heard(view, proc) > QUIET_S * NS


def of_run(view: RunView, now_ns: int | None = None) -> Ended | None:
    """The launch served (its launchers' and ranks' starts are over) and every process of it has
    ended (``gone``); None otherwise."""
    now = time.time_ns() if now_ns is None else now_ns
    procs = [p for p in view.processes if p.role != "watchdog"]  # a viewer's own journal is none of the launch's
    started = [p for p in procs if p.role in ("launcher", "rank")]
    if not started or not all(p.ready for p in started) or not all(gone(view, p, now) for p in procs):
        return None
    return Ended(max(last_heard(view, p) for p in procs), _how(view, procs))


def _how(view: RunView, procs: list[ProcessRec]) -> str:
    """What the run directory says of how its processes ended: ``exit`` records, the launcher's teardown."""
    said: dict[str, list[str]] = {}
    for p in procs:
        r = p.exit
        if r is not None and (r.get("signal") or r.get("code") is not None):
            words = f"killed by {r['signal']}" if r.get("signal") else f"exited with code {r['code']}"
            said.setdefault(words, []).append(p.label)
    parts = [f"{', '.join(labels)} {words}" for words, labels in said.items()]
    told = {label for labels in said.values() for label in labels}
    for p in procs:
        beat = view.status_file(p) if p.role == "launcher" and p.remote is None else None
        if beat and TEARDOWN in (beat.get("runtime_calls") or {}):
            parts.append(f"{p.title} tore it down (SGLang's kill_process_tree)")
            return "; ".join(parts)
    if len(told) < len(procs):
        parts.append(f"how {'the others' if parts else 'it'} ended is not recorded")
    return "; ".join(parts)
