"""What ``phasetrace run`` prints: a one-line live status while ranks start, a summary at the end.

Every line is returned through ``term.clean``: labels, phase names and errors come from journals."""

from __future__ import annotations

from collections import Counter

from ..verdicts import usual
from ..verdicts.diagnose import Finding
from .lanes import DONE, Lane, Layout
from .term import clean
from .units import duration
from .verdict import headline, rank_lanes, state

FEW = 4  # up to this many ranks are listed one by one


def _where(lane: Lane, lay: Layout, known: usual.Known | None = None) -> str:
    where = lane.where
    if lane.state in DONE or where is None:
        return lane.state
    u = known.usuals.get(where.key) if known is not None else None
    took = f" ({usual.said(u)})" if u is not None else ""
    return f"{where.key} {duration(lay.rel(lay.end) - lay.rel(where.span.start))}{took}"


def status_line(lay: Layout, verdicts: dict[int, Finding], known: usual.Known | None = None) -> str:
    """``tp0 model.load_weights 3.2 s · tp1 ready`` or, for many ranks, counts per phase; with the
    launch's earlier starts (``known``), how long each phase usually takes and the start's ETA:
    ``tp0 model.load_weights 3.2 s (usually 41 s, p95 55 s, 6 starts) · … · ready in ≈ 3 min``."""
    ranks = rank_lanes(lay)
    if not ranks:
        return "waiting for the first rank…"
    named: dict[str, list[str]] = {}  # "DIED" -> ["tp1"]: verdicts only, not notices
    for lane in ranks:
        finding = verdicts.get(lane.proc.pid)
        if finding is not None and finding.alarm:
            named.setdefault(state(finding).upper(), []).append(lane.label)
    if len(ranks) <= FEW:
        parts = [f"{lane.label} {_where(lane, lay, known)}" for lane in ranks]
    else:
        counts = Counter(lane.where.key if lane.state == "running" and lane.where else lane.state for lane in ranks)
        parts = [f"{n} {what}" for what, n in counts.most_common(4)]
        if len(counts) > 4:
            parts.append("…")
    singular, plural = ("rank", "ranks") if ranks[0].proc.role == "rank" else ("process", "processes")
    line = f"{len(ranks)} {singular if len(ranks) == 1 else plural}: " + " · ".join(parts)
    line += "".join(f" · {what}: {', '.join(labels[:4])}" for what, labels in named.items())
    outlook = usual.eta_text(usual.eta(lay.run, lay.end, known), lay.end) if known is not None and not named else ""
    return clean(line + (f" · {outlook}" if outlook else ""))


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
        where = lane.where if now not in DONE else None
        lines.append(
            f"  {lane.label:<10} {now:<11} {duration(root.seconds) if root else '':>8}"
            + (f"  longest {longest.key} {duration(longest.seconds)}" if longest else "")
            + (f"  {'in' if now in ('running', 'initialised') else 'stopped in'} {where.key}" if where else "")
        )
    return [clean(line) for line in lines]
