"""Stall analysis over a run directory (placeholder API; the watchdog work fills it in).

``analyze(run, now_ns, thresholds)`` returns findings; pure, no side effects, so the live watchdog,
``phasetrace watch`` and ``phasetrace status`` share it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .rundir import RunView


@dataclass(frozen=True)
class Thresholds:
    heartbeat_s: float = 5.0
    silent_s: float = 15.0  # no heartbeat for this long
    stall_s: float = 30.0  # no progress while peers wait / moved on
    no_progress_s: float = 120.0  # nothing anywhere


@dataclass
class Finding:
    kind: str  # "silent" | "straggler" | "divergence" | "no_progress"
    label: str  # the rank it names, e.g. "tp1"
    pid: int
    phase: str | None
    since_s: float
    message: str  # the one-line diagnosis
    waiting: dict[str, str] = field(default_factory=dict)  # peer label -> what it waits in
    stacks: list[str] = field(default_factory=list)  # stack dump paths, when taken


def analyze(run: RunView, now_ns: int, thresholds: Thresholds | None = None) -> list[Finding]:
    return []
