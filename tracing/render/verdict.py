"""The verdict on a run, said one way everywhere: the watchdog's words (STALL, DIED, FAILED, NOT
STARTED) and its message, as the launcher prints them; the report's first line, the exports' flag
on the culprit's phase and the run summary all come from here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..reader.ended import Ended
from ..redact import redact_text
from ..verdicts import evidence
from ..verdicts.diagnose import Finding
from ..verdicts.voice import line, word
from .lanes import DONE, Bar, Lane, Layout
from .units import duration

STATE = {
    "died": "died",
    "failed": "failed",
    "stopped": "stopped",
    "not_started": "not started",
    "busy": "busy",
    "slow": "slow",
    "unusual": "unusual",  # a notice (``verdicts.usual``): past every earlier start of its launch
}


def state(finding: Finding) -> str:
    """The rank's state in tables and lanes: ``stalled``, ``died``, ``failed``, ``not started``, ``busy``…"""
    return STATE.get(finding.kind, "stalled")


def rank_lanes(lay: Layout) -> list[Lane]:
    return [lane for lane in lay.lanes if lane.proc.role == "rank"] or lay.lanes


def headline(lay: Layout, found: list[Finding], ended: Ended | None = None) -> tuple[str, str]:
    """(``stalled`` | ``failed`` | ``ended`` | ``ready`` | ``running``, the sentence): the first
    verdict when there is one (root cause first), in the watchdog's words. ``ended``: the launch
    served and has ended since (``reader.ended.of_run``), said with when and how."""
    ranks = rank_lanes(lay)
    verdicts = [f for f in found if f.alarm]
    if verdicts:
        f = verdicts[0]
        more = f" (+{len(verdicts) - 1} more)" if len(verdicts) > 1 else ""
        return ("failed" if f.kind in ("died", "failed", "stopped") else "stalled"), line(f) + more
    failed = [lane for lane in ranks if lane.state in ("failed", "incomplete")]
    if failed:
        lane = failed[0]
        where = lane.where
        err = (where.span.error or {}).get("message") if where else None
        return "failed", (
            f"{lane.state.upper()} — {lane.label} in {where.key if where else '?'}"
            + (f": {err}" if err else "")
            + (f" (+{len(failed) - 1} more)" if len(failed) > 1 else "")
        )
    launchers = [lane for lane in lay.lanes if lane.proc.role == "launcher"]
    if ranks and all(lane.state in DONE for lane in ranks):
        slow = max(ranks, key=lambda lane: lane.root.seconds if lane.root else 0)
        took = duration(slow.root.seconds) if slow.root else ""
        serves = next((lane for lane in launchers if lane.state == "serving" and lane.root), None)
        since = f"; serving after {duration(serves.root.seconds)}" if serves is not None else ""
        were = f"{len(ranks)} ranks {'were ' if ended else ''}ready"
        if ended is not None:
            return "ended", f"ENDED — {ended.line()}; {were}, slowest {slow.label} in {took}{since}"
        return "ready", f"READY — {were}; slowest {slow.label} in {took}{since}"
    running = [lane for lane in ranks if lane.state == "running"]
    warming = [lane for lane in ranks if lane.state == "initialised"]
    if warming and not running:
        where = next((lane.where for lane in launchers if lane.state == "running" and lane.where), None)
        waits = f" (launcher in {where.key} {duration(lay.rel(lay.end) - lay.rel(where.span.start))})" if where else ""
        return "running", f"RUNNING — {len(warming)} of {len(ranks)} ranks initialised, the launch not serving{waits}"
    more = f", {len(warming)} initialised" if warming else ""
    return "running", f"RUNNING — {len(running)} of {len(ranks)} ranks still starting{more}"


@dataclass
class Marks:
    """What the exports flag: the culprit's phase (the verdict's rank and phase only) and what its
    waiting peers wait for. Keyed by ``Bar.uid``."""

    culprit: dict[str, str] = field(default_factory=dict)  # uid -> the one-line verdict
    word: str = ""  # the verdict's word (STALL, DIED, …)
    waiting_for: dict[str, str] = field(default_factory=dict)  # uid -> "tp1 (barrier #3 on group 'tp' …)"
    waits_on: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> what that rank waits on (attrs)


def _phase_bar(lane: Lane, phase: str | None) -> Bar | None:
    """The rank's span of ``phase``: the innermost open one, else the latest (a failed phase ended)."""
    if phase is None:
        return None
    bars = [b for b in lane.bars if b.span.phase == phase or b.key == phase]
    open_bars = [b for b in bars if b.open]
    pick = open_bars or bars
    return max(pick, key=lambda b: (b.depth, b.span.start)) if pick else None


def marks(lay: Layout, found: list[Finding]) -> Marks:
    """The first verdict's culprit phase, each waiting peer's innermost open phase, and what each rank
    it names waits on (``evidence.attributes``, on that rank's phase; a verdict naming ranks together
    flags each of theirs)."""
    verdicts = [f for f in found if f.alarm and f.kind not in ("divergence", "no_progress", "unknown")]
    if not verdicts:
        return Marks()
    f = verdicts[0]
    out = Marks(word=word(f))
    lanes = {lane.proc.pid: lane for lane in lay.lanes}
    by_label = {lane.proc.label: lane for lane in lay.lanes}
    lane = lanes.get(f.pid) or by_label.get(f.label)
    bar = _phase_bar(lane, f.phase) if lane is not None else None
    if bar is not None:
        out.culprit[bar.uid] = line(f)
    for label, value in f.evidence.items():
        ev = evidence.from_builtins(value)
        named = by_label.get(label)
        at = bar if named is not None and named is lane else _phase_bar(named, f.phase) if named else None
        if ev is not None and at is not None:
            out.waits_on[at.uid] = evidence.attributes(ev)
            if f.kind == "waits_on":
                out.culprit.setdefault(at.uid, line(f))
    for peer, waits in f.waiting.items():
        peer_lane = by_label.get(peer)
        open_bars = [b for b in peer_lane.bars if b.open] if peer_lane is not None else []
        if open_bars and peer_lane is not lane:
            inner = max(open_bars, key=lambda b: (b.depth, b.span.start))
            out.waiting_for[inner.uid] = redact_text(f"{f.label} ({waits})")
    return out
