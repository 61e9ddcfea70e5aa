"""Phase durations per rank, and their comparison within a run (skew) or between two runs (delta).

A phase that one rank runs several times under the same key (e.g. three warm-up passes) counts
as the sum of its occurrences; ``count`` says how many there were. Open phases count up to the
run's horizon and are listed in ``open`` so readers can show the figure as a lower bound.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ..reader.forked_helper import job
from .lane_jobs import lanes_map
from .lanes import Lane, Layout


@dataclass
class PhaseStat:
    key: str
    per_rank: dict[str, float] = field(default_factory=dict)  # lane label -> seconds
    count: int = 0  # most occurrences in one rank
    open: list[str] = field(default_factory=list)  # labels where the phase had not ended

    @property
    def min(self) -> float:
        return min(self.per_rank.values())

    @property
    def max(self) -> float:
        return max(self.per_rank.values())

    @property
    def median(self) -> float:
        return statistics.median(self.per_rank.values())

    @property
    def skew(self) -> float:
        """Max - min across ranks: how long the fastest rank waits for the slowest."""
        return self.max - self.min

    @property
    def slowest(self) -> str:
        return max(self.per_rank, key=self.per_rank.__getitem__)

    @property
    def fastest(self) -> str:
        return min(self.per_rank, key=self.per_rank.__getitem__)

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.key,
            "ranks": len(self.per_rank),
            "count": self.count,
            "min_s": round(self.min, 6),
            "median_s": round(self.median, 6),
            "max_s": round(self.max, 6),
            "skew_s": round(self.skew, 6),
            "slowest": self.slowest,
            "fastest": self.fastest,
            "open": self.open,
            "per_rank_s": {k: round(v, 6) for k, v in self.per_rank.items()},
        }


def phase_stats(lay: Layout, depths: range | None = None) -> dict[str, PhaseStat]:
    """Every phase key of the run (or of bars at ``depths``), in order of first start."""
    stats: dict[str, PhaseStat] = {}
    among = None if depths is None else (depths.start, depths.stop)
    for lane, rows in zip(lay.lanes, lanes_map(lay, lane_phases, among), strict=True):
        label = lane.label
        for key, seconds, count, opened in rows:
            stat = stats.get(key)
            if stat is None:
                stat = stats[key] = PhaseStat(key)
            per = stat.per_rank
            per[label] = per[label] + seconds if label in per else seconds
            if count > stat.count:
                stat.count = count
            if opened and label not in stat.open:
                stat.open.append(label)
    return stats


@job
def lane_phases(lane: Lane, among: tuple[int, int] | None) -> list[tuple[str, float, int, bool]]:
    """(phase key, seconds, occurrences, open) for each key of ``lane``'s bars (at depths ``among``,
    a range's start and stop), in order of first start (``lanes_map``: in the process holding them)."""
    rows: dict[str, list] = {}
    for bar in lane.bars:
        if among is not None and not among[0] <= bar.depth < among[1]:
            continue
        row = rows.get(bar.key)
        if row is None:
            row = rows[bar.key] = [bar.key, 0.0, 0, False]
        row[1] += (bar.end - bar.span.start) / 1e9
        row[2] += 1
        if bar.span.end is None:
            row[3] = True
    return [tuple(row) for row in rows.values()]


def within_run(lay: Layout) -> list[PhaseStat]:
    """Phases by skew across ranks, largest first (then by the slowest rank's time)."""
    return sorted(phase_stats(lay).values(), key=lambda s: (-s.skew, -s.max, s.key))


@dataclass
class PhaseDelta:
    key: str
    a: PhaseStat | None
    b: PhaseStat | None

    @property
    def delta(self) -> float | None:
        """Change of the slowest rank's time from run A to run B."""
        return None if self.a is None or self.b is None else self.b.max - self.a.max

    @property
    def weight(self) -> float:
        """What sorts first: the largest change, or the longest phase present in one run only."""
        if self.delta is not None:
            return abs(self.delta)
        return (self.a or self.b).max  # type: ignore[union-attr]

    def to_json(self) -> dict[str, Any]:
        d = self.delta
        pct = None if d is None or not self.a or not self.a.max else round(100 * d / self.a.max, 2)
        return {
            "phase": self.key,
            "a": self.a.to_json() if self.a else None,
            "b": self.b.to_json() if self.b else None,
            "delta_s": None if d is None else round(d, 6),
            "delta_pct": pct,
        }


def between_runs(a: Layout, b: Layout) -> list[PhaseDelta]:
    """Phases of both runs, the largest change of the slowest rank's time first."""
    sa, sb = phase_stats(a), phase_stats(b)
    keys = list(sa) + [k for k in sb if k not in sa]
    return sorted((PhaseDelta(k, sa.get(k), sb.get(k)) for k in keys), key=lambda d: (-d.weight, d.key))
