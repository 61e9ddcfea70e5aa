"""Phase durations per rank, and their comparison within a run (skew) or between two runs (delta).

A phase that one rank runs several times under the same key (e.g. three warm-up passes) counts
as the sum of its occurrences; ``count`` says how many there were. Open phases count up to the
run's horizon and are listed in ``open`` so readers can show the figure as a lower bound.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from .lanes import Layout


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
    for lane in lay.lanes:
        label = lane.label
        counts: dict[str, int] = {}
        for bar in lane.bars:
            if depths is not None and bar.depth not in depths:
                continue
            key = bar.key
            stat = stats.get(key)
            if stat is None:
                stat = stats[key] = PhaseStat(key)
            per = stat.per_rank
            per[label] = per.get(label, 0.0) + (bar.end - bar.span.start) / 1e9
            counts[key] = counts.get(key, 0) + 1
            if bar.span.end is None and label not in stat.open:
                stat.open.append(label)
        for key, n in counts.items():
            if n > stats[key].count:
                stats[key].count = n
    return stats


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
