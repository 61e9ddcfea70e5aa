"""History tables for the terminal: a launch's starts, its phases' usual times and spread, the
trend of its newest start, and one run against its launch's history (``compare --baseline``).

Phase keys, run ids, hosts and summaries come from journals and the database: shown through
``term.text`` (no escape sequences, never read as rich markup)."""

from __future__ import annotations

import time

from rich import box
from rich.table import Table
from rich.text import Text

from ..history.baseline import BaselineRow
from ..history.store import Change, Start, Usual
from .term import text
from .units import duration, signed

OUTCOME_STYLE = {"ready": "green", "failed": "red", "stalled": "red", "interrupted": "yellow"}


def _table(title: str, columns: tuple[str, ...], left: tuple[str, ...]) -> Table:
    table = Table(title=text(title), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in columns:
        table.add_column(name, justify="left" if name in left else "right", no_wrap=True)
    return table


def when(t: float) -> str:
    """``2026-12-03 18:38``, local time (as a person remembers a restart)."""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def starts_table(starts: list[Start], title: str) -> Table:
    """One row per start, the newest first: when, how it ended, how long to ready (or to its end)."""
    table = _table(
        title, ("started", "run", "outcome", "total", "processes", "host"), ("started", "run", "outcome", "host")
    )
    for s in starts:
        table.add_row(
            when(s.started),
            text(s.run_id),
            text(s.outcome, style=OUTCOME_STYLE.get(s.outcome, "")),
            duration(s.total_s),
            str(s.processes),
            text(s.host),
        )
    return table


def phases_table(usuals: list[Usual], title: str, limit: int | None = None) -> Table:
    """One row per phase, the longest (by median) first: the slowest process's time in each start."""
    table = _table(title, ("phase", "starts", "min", "median", "p95", "max", "last"), ("phase",))
    for u in sorted(usuals, key=lambda u: (-u.median, u.phase))[:limit]:
        spread = u.p95 > 1.5 * u.median and u.p95 - u.median >= 1.0
        table.add_row(
            text(u.phase),
            str(u.n),
            duration(u.min),
            duration(u.median),
            Text(duration(u.p95), style="bold" if spread else ""),
            duration(u.max),
            duration(u.last),
        )
    return table


def hosts_table(hosts: dict[str, dict[str, Usual]], title: str, limit: int | None = None) -> Table:
    """One row per phase (the fleet's longest first), one column per host: its median and p95, and
    its median over the fleet's (``""``) where it is 1.5x or more."""
    fleet = hosts.get("", {})
    names = [h for h in hosts if h]
    table = _table(title, ("phase", "fleet", *names), ("phase",))
    for u in sorted(fleet.values(), key=lambda u: (-u.median, u.phase))[:limit]:
        cells = []
        for h in names:
            mine = hosts[h].get(u.phase)
            if mine is None:
                cells.append(Text(""))
                continue
            ratio = mine.median / u.median if u.median > 0 else 1.0
            cell = f"{duration(mine.median)} (p95 {duration(mine.p95)}, {mine.n})"
            slow = ratio >= 1.5
            cells.append(Text(cell + (f" {ratio:.1f}x" if slow else ""), style="bold red" if slow else ""))
        table.add_row(text(u.phase), f"{duration(u.median)} (p95 {duration(u.p95)})", *cells)
    return table


def trend_lines(newest: Start | None, changes: list[Change], grown: Change | None) -> list[Text]:
    """``trend: run X (newest) against the median of N earlier starts: 'p' grew 12.0 s → 40.1 s (+28.1 s)``."""
    if newest is None or not changes:
        return [text("trend: one start so far, nothing to compare with")]
    n = max(c.n for c in changes)
    head = f"trend: {newest.run_id} (newest) against the median of {n} earlier start{'s' if n > 1 else ''}: "
    if grown is None:
        top = changes[0]
        return [text(head + f"no phase grew (largest change: '{top.phase}' {signed(top.delta)})")]
    return [
        text(
            head + f"'{grown.phase}' grew {duration(grown.median)} → {duration(grown.latest)} ({signed(grown.delta)})",
            style="bold red",
        )
    ]


def baseline_table(rows: list[BaselineRow], title: str, limit: int | None = None) -> Table:
    """One row per phase: this run, the history's median and p95 (of n starts), the change, and a
    flag where this run is past the p95 by a margin."""
    table = _table(title, ("phase", "this run", "median", "p95", "starts", "Δ median", ""), ("phase", ""))
    for r in rows[:limit]:
        u = r.usual
        delta = r.this - u.median if u else None
        style = "" if delta is None else ("red" if delta > 0 else "green")
        table.add_row(
            text(r.phase),
            duration(r.this) + (" (open)" if r.open else ""),
            duration(u.median) if u else "—",
            duration(u.p95) if u else "—",
            str(u.n) if u else "0",
            Text(signed(delta), style=style),
            Text("past p95" if r.flagged else "", style="bold red"),
        )
    return table
