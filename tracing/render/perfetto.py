"""Chrome/Perfetto trace-event JSON: one process track per rank, named, phases as slices.

Finished phases are complete (``X``) events; a phase that never ended is a lone ``B`` (begin)
event, which Perfetto and chrome://tracing show as "did not end". Timestamps are microseconds
from the run's first span (the absolute start is in ``otherData``), so nesting is exact. The
verdict's culprit phase (its rank only) is named ``⚠ STALL <phase>`` (the verdict's word), in category
``phasetrace.verdict``, colored ``terrible``, the verdict in its args; waiting peers are not
marked, their open phase's args say ``phasetrace.waiting_for``. The verdict is in ``otherData``.
"""

from __future__ import annotations

from typing import Any

from ..verdicts.diagnose import Finding
from .jaeger import VERDICT_ATTR, WAITING_ATTR
from .lanes import Layout
from .verdict import marks

VERDICT_CATEGORY = "phasetrace.verdict"


def _args(attrs: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, (str, int, float, bool)) or v is None else str(v) for k, v in attrs.items()}


def to_perfetto(lay: Layout, found: list[Finding] | None = None) -> dict[str, Any]:
    """``found``: the run's verdicts (``cli.findings``), root cause first; its culprit is flagged."""
    flags = marks(lay, found or [])
    events: list[dict[str, Any]] = []
    for lane in lay.lanes:
        proc = lane.proc
        pid = lane.index + 1
        flagged = f"\u26a0 {flags.word} " if any(b.uid in flags.culprit for b in lane.bars) else ""  # seen collapsed
        events.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": pid,
                "args": {"name": f"{flagged}{lane.label} ({proc.host}:{proc.pid})"},
            }
        )
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": lane.index}})
        threads: dict[str, int] = {}
        for bar in lane.bars:
            s = bar.span
            tid = threads.get(s.thread)
            if tid is None:
                tid = threads[s.thread] = len(threads) + 1
                events.append(
                    {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": s.thread or "thread"}}
                )
            args = _args(s.attrs)
            args["status"] = s.status
            if s.error:
                args["error"] = str(s.error.get("message") or s.error.get("type"))
            if bar.uid in flags.waiting_for:
                args[WAITING_ATTR] = flags.waiting_for[bar.uid]
            event = {
                "name": s.name,
                "cat": s.phase,
                "ph": "X",
                "ts": (s.start - lay.start) / 1000,
                "dur": (bar.end - s.start) / 1000,
                "pid": pid,
                "tid": tid,
                "args": args,
            }
            verdict = flags.culprit.get(bar.uid)
            if verdict:
                args[VERDICT_ATTR] = verdict
                event.update(
                    name=f"\u26a0 {flags.word} {s.phase}", cat=f"{VERDICT_CATEGORY},{s.phase}", cname="terrible"
                )
            if bar.open:
                del event["dur"]
                event["ph"] = "B"
            events.append(event)
            events.extend(
                {
                    "name": e.get("name") or "event",
                    "ph": "i",
                    "s": "t",
                    "pid": pid,
                    "tid": tid,
                    "ts": (e["t"] - lay.start) / 1000,
                    "args": _args(e.get("attrs") or {}),
                }
                for e in s.events
            )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "run": lay.run.run_id,
            "start_unix_ns": lay.start,
            **({"verdict": next(iter(flags.culprit.values()))} if flags.culprit else {}),
        },
    }
