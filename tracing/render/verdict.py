"""The one-line verdict on a run (stalled, failed, ready, starting), shared by every summary."""

from __future__ import annotations

from ..diagnose import Finding
from .lanes import Lane, Layout
from .units import duration


def rank_lanes(lay: Layout) -> list[Lane]:
    return [lane for lane in lay.lanes if lane.proc.role == "rank"] or lay.lanes


def headline(lay: Layout, found: list[Finding]) -> tuple[str, str]:
    """(``stalled`` | ``failed`` | ``ready`` | ``running``, the sentence)."""
    ranks = rank_lanes(lay)
    if found:
        f = found[0]
        where = f" in {f.phase}" if f.phase else ""
        more = f" (+{len(found) - 1} more findings)" if len(found) > 1 else ""
        return "stalled", f"STALLED — {f.label or 'a rank'}{where} for {duration(f.since_s)}: {f.message}{more}"
    failed = [lane for lane in ranks if lane.state in ("failed", "incomplete")]
    if failed:
        lane = failed[0]
        where = lane.where
        err = (where.span.error or {}).get("message") if where else None
        return "failed", (f"{lane.state.upper()} — {lane.label} in {where.key if where else '?'}"
                          + (f": {err}" if err else "") + (f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""))
    if ranks and all(lane.state == "ready" for lane in ranks):
        slow = max(ranks, key=lambda lane: lane.root.seconds if lane.root else 0)
        took = duration(slow.root.seconds) if slow.root else ""
        return "ready", f"READY — {len(ranks)} ranks ready; slowest {slow.label} in {took}"
    running = [lane for lane in ranks if lane.state == "running"]
    return "running", f"RUNNING — {len(running)} of {len(ranks)} ranks still starting"
