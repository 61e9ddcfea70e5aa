"""One run against its launch's history (``phasetrace compare RUN --baseline``): per phase, this run's
slowest process against the median and p95 of the earlier starts, flagged when past the p95 by a
margin (both a ratio and seconds: a 3 ms phase taking 6 ms is noise, a 40 s one taking 80 s is not)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .measure import Measured
from .store import EXPLAINS, Usual

FLAG_RATIO, FLAG_MIN_S = 1.2, 1.0  # past p95 x ratio and p95 + seconds


@dataclass
class BaselineRow:
    """A phase of one run against its launch's history."""

    phase: str
    this: float  # the run's slowest process
    open: bool  # the phase had not ended (a lower bound)
    usual: Usual | None  # None: no earlier start ended it
    depth: int = 0

    @property
    def delta(self) -> float | None:
        return None if self.usual is None else self.this - self.usual.median

    @property
    def flagged(self) -> bool:
        u = self.usual
        return u is not None and self.this > u.p95 * FLAG_RATIO and self.this - u.p95 >= FLAG_MIN_S

    def to_json(self) -> dict[str, Any]:
        u, delta = self.usual, self.delta
        return {
            "phase": self.phase,
            "this_s": round(self.this, 6),
            "open": self.open,
            "usual": u.to_json() if u else None,
            "delta_s": None if delta is None else round(delta, 6),
            "past_p95": self.flagged,
        }


def against(m: Measured, usuals: dict[str, Usual]) -> list[BaselineRow]:
    """Every phase of the run, those past the p95 first, then the largest change either way (as
    ``compare`` orders two runs), phases new to this launch last, longest first."""
    rows = [BaselineRow(p.key, p.max, p.open, usuals.get(p.key), p.depth) for p in m.phases]
    return sorted(
        rows, key=lambda r: (not r.flagged, r.usual is None, -abs(r.delta if r.delta is not None else r.this))
    )


def culprit(rows: list[BaselineRow]) -> BaselineRow | None:
    """The phase to name among those flagged: the deepest of those past their p95 by nearly the most
    (``store.grew``'s rule: the step that took longer, not the root around it)."""
    flagged = [r for r in rows if r.flagged and r.delta is not None]
    if not flagged:
        return None
    most = max(r.delta for r in flagged if r.delta is not None)
    return max((r for r in flagged if (r.delta or 0.0) >= EXPLAINS * most), key=lambda r: (r.depth, r.delta or 0.0))
