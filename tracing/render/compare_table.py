"""Compare tables for the terminal: phases across the ranks of one run, or between two runs.

Phase keys, rank labels and the title come from journals and paths: shown through ``term.text``
(no escape sequences, never read as rich markup)."""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from .phase_stats import PhaseDelta, PhaseStat
from .term import text
from .units import duration, signed


def _open_mark(stat: PhaseStat | None) -> str:
    return " (open)" if stat is not None and stat.open else ""


def _skew(stat: PhaseStat | None) -> str:
    return duration(stat.skew) if stat is not None and len(stat.per_rank) > 1 else ""


def ranks_table(stats: list[PhaseStat], title: str, limit: int | None = None) -> Table:
    """One row per phase: min / median / max across ranks, skew, and who was slowest."""
    table = Table(title=text(title), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("phase", "ranks", "min", "median", "max", "skew", "slowest", "fastest"):
        table.add_column(name, justify="left" if name in ("phase", "slowest", "fastest") else "right", no_wrap=True)
    for s in stats[:limit]:
        several = len(s.per_rank) > 1
        table.add_row(
            text(s.key + (f" x{s.count}" if s.count > 1 else "")),
            str(len(s.per_rank)),
            duration(s.min),
            duration(s.median),
            duration(s.max) + _open_mark(s),
            Text(_skew(s), style="bold" if several and s.skew > 0.1 * s.max else ""),
            text(s.slowest if several else ""),
            text(s.fastest if several else ""),
        )
    return table


def runs_table(deltas: list[PhaseDelta], title: str, limit: int | None = None) -> Table:
    """One row per phase: the slowest rank's time in A and B, the change, and each run's skew."""
    table = Table(title=text(title), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("phase", "A", "B", "Δ", "Δ%", "skew A", "skew B"):
        table.add_column(name, justify="left" if name == "phase" else "right", no_wrap=True)
    for d in deltas[:limit]:
        j = d.to_json()
        change = d.delta
        style = "" if change is None else ("red" if change > 0 else "green")
        table.add_row(
            text(d.key),
            duration(d.a.max) + _open_mark(d.a) if d.a else "—",
            duration(d.b.max) + _open_mark(d.b) if d.b else "—",
            Text(signed(change), style=style),
            f"{j['delta_pct']:+.0f}%" if j["delta_pct"] is not None else "",
            _skew(d.a),
            _skew(d.b),
        )
    return table
