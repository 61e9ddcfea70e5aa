"""Chrome/Perfetto trace-event JSON: one process track per rank, named, phases as slices.

Finished phases are complete (``X``) events; a phase that never ended is a lone ``B`` (begin)
event, which Perfetto and chrome://tracing show as "did not end". Timestamps are microseconds
from the run's first span (the absolute start is in ``otherData``), so nesting is exact.
"""

from __future__ import annotations

from typing import Any

from .lanes import Layout


def _args(attrs: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, (str, int, float, bool)) or v is None else str(v) for k, v in attrs.items()}


def to_perfetto(lay: Layout) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    for lane in lay.lanes:
        proc = lane.proc
        pid = lane.index + 1
        events.append({"ph": "M", "name": "process_name", "pid": pid,
                       "args": {"name": f"{lane.label} ({proc.host}:{proc.pid})"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": lane.index}})
        threads: dict[str, int] = {}
        for bar in lane.bars:
            s = bar.span
            tid = threads.get(s.thread)
            if tid is None:
                tid = threads[s.thread] = len(threads) + 1
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                               "args": {"name": s.thread or "thread"}})
            args = _args(s.attrs)
            args["status"] = s.status
            if s.error:
                args["error"] = str(s.error.get("message") or s.error.get("type"))
            event = {"name": s.name, "cat": s.phase, "ph": "X", "ts": (s.start - lay.start) / 1000,
                     "dur": (bar.end - s.start) / 1000, "pid": pid, "tid": tid, "args": args}
            if bar.open:
                del event["dur"]
                event["ph"] = "B"
            events.append(event)
            events.extend({"name": e.get("name") or "event", "ph": "i", "s": "t", "pid": pid, "tid": tid,
                           "ts": (e["t"] - lay.start) / 1000, "args": _args(e.get("attrs") or {})}
                          for e in s.events)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"run": lay.run.run_id, "start_unix_ns": lay.start}}
