"""What ``phasetrace run`` prints: a one-line live status while ranks start, a summary at the end.

Every line is returned through ``term.clean``: labels, phase names and errors come from journals."""

from __future__ import annotations

from collections import Counter

from ..verdicts.diagnose import Finding
from .lanes import Lane, Layout
from .term import clean
from .units import duration
from .verdict import headline, rank_lanes, state

FEW = 4  # up to this many ranks are listed one by one


def _where(lane: Lane, lay: Layout) -> str:
    where = lane.where
    if lane.state == "ready" or where is None:
        return lane.state
    return f"{where.key} {duration(lay.rel(lay.end) - lay.rel(where.span.start))}"


def status_line(lay: Layout, verdicts: dict[int, Finding]) -> str:
    """``tp0 model.load_weights 3.2 s · tp1 ready`` or, for many ranks, counts per phase."""
    ranks = rank_lanes(lay)
    if not ranks:
        return "waiting for the first rank…"
    named: dict[str, list[str]] = {}  # "DIED" -> ["tp1"]: verdicts only, not notices
    for lane in ranks:
        finding = verdicts.get(lane.proc.pid)
        if finding is not None and finding.alarm:
            named.setdefault(state(finding).upper(), []).append(lane.label)
    if len(ranks) <= FEW:
        parts = [f"{lane.label} {_where(lane, lay)}" for lane in ranks]
    else:
        counts = Counter(lane.where.key if lane.state == "running" and lane.where else lane.state for lane in ranks)
        parts = [f"{n} {what}" for what, n in counts.most_common(4)]
        if len(counts) > 4:
            parts.append("…")
    singular, plural = ("rank", "ranks") if ranks[0].proc.role == "rank" else ("process", "processes")
    line = f"{len(ranks)} {singular if len(ranks) == 1 else plural}: " + " · ".join(parts)
    line += "".join(f" · {what}: {', '.join(labels[:4])}" for what, labels in named.items())
    return clean(line)


def summary(lay: Layout, found: list[Finding], verdicts: dict[int, Finding]) -> list[str]:
    """The headline (READY, RUNNING; not a verdict in ``found``: the watchdog's lines say those,
    once), then one line per rank: state, time to ready, its longest top-level phase."""
    lines = [] if any(f.alarm for f in found) else [headline(lay, found)[1]]
    for lane in lay.lanes:
        root = lane.root
        top = [b for b in lane.bars if b.depth == 1] or lane.bars
        longest = max(top, key=lambda b: b.seconds, default=None)
        finding = verdicts.get(lane.proc.pid)
        now = state(finding) if finding is not None else lane.state
        where = lane.where if now != "ready" else None
        lines.append(
            f"  {lane.label:<10} {now:<11} {duration(root.seconds) if root else '':>8}"
            + (f"  longest {longest.key} {duration(longest.seconds)}" if longest else "")
            + (f"  {'in' if now == 'running' else 'stopped in'} {where.key}" if where else "")
        )
    return [clean(line) for line in lines]
