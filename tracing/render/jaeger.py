"""The Jaeger UI's JSON upload format ("JSON File" in the search page): one entry per trace.

Times are microseconds, parents are ``CHILD_OF`` references, and every process of the run is its
own Jaeger process (service ``<service> <rank>``) so rank rows stay distinguishable. A phase that
never ended is drawn to the end of the run, tagged ``phasetrace.open`` and carries a warning. The
verdict's culprit phase (its rank only) is tagged ``error=true`` (the UI's red mark, seen without
expanding anything) and ``phasetrace.verdict``; its waiting peers are not errors, they carry
``phasetrace.waiting_for``.
"""

from __future__ import annotations

import json
from typing import Any

from ..diagnose import Finding
from .lanes import OPEN_ATTR, Bar, Lane, Layout
from .verdict import Marks, marks

OPEN_WARNING = "phase did not end: still running, or the process died here"
VERDICT_ATTR = "phasetrace.verdict"  # on the culprit's phase: the one-line verdict
WAITING_ATTR = "phasetrace.waiting_for"  # on a waiting peer's open phase: whom it waits for, in what


_TYPES = {bool: "bool", int: "int64", float: "float64", str: "string"}


def tag(key: str, value: Any) -> dict[str, Any]:
    kind = _TYPES.get(type(value))
    if kind is None:  # lists and the like: their JSON text
        return {"key": key, "type": "string", "value": json.dumps(value, default=str)}
    cache_key = (key, kind, value)
    hit = _tags.get(cache_key)
    if hit is None:  # phase names, ranks, flags repeat across ranks: one dict each, shared
        hit = _tags[cache_key] = {"key": key, "type": kind, "value": value}
    return hit


_tags: dict[tuple, dict[str, Any]] = {}


def _attr_tags(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    """``tag`` of each attribute: a span's attrs repeat across its copies and the ranks, so the list
    is built once per distinct attrs (keyed with the values' types: ``True`` is not ``1`` here)."""
    try:
        key = (tuple(attrs.items()), tuple(map(type, attrs.values())))
        hit = _attr_lists.get(key)
    except TypeError:  # a list value: not hashable
        return [tag(k, v) for k, v in attrs.items()]
    if hit is None:
        if len(_attr_lists) > 100_000:
            _attr_lists.clear()
        hit = _attr_lists[key] = [tag(k, v) for k, v in attrs.items()]
    return hit.copy()


_attr_lists: dict[tuple, list[dict[str, Any]]] = {}


def _process(lane: Lane) -> dict[str, Any]:
    proc = lane.proc
    attrs = {**proc.resource, **proc.identity, "host.name": proc.host, "process.pid": proc.pid}
    service = str(proc.resource.get("service.name") or "sglang")
    return {"serviceName": f"{service} {lane.label}", "tags": [tag(k, v) for k, v in attrs.items()]}


def _span(bar: Bar, process_id: str, flags: Marks) -> dict[str, Any]:
    s = bar.span
    tags = _attr_tags(s.attrs)
    verdict = flags.culprit.get(bar.uid)
    tags.append(tag("otel.status_code", "ERROR" if verdict else {"ok": "OK", "open": "UNSET"}.get(s.status, "ERROR")))
    warnings = None
    if bar.open:
        tags.append(tag(OPEN_ATTR, True))
        warnings = [OPEN_WARNING]
    elif s.status != "ok":
        tags.append(tag("phasetrace.status", s.status))
    if verdict or (s.status != "ok" and not bar.open):
        tags.append(tag("error", True))
    if verdict:
        tags.append(tag(VERDICT_ATTR, verdict))
        warnings = [verdict, *(warnings or ())]
    if bar.uid in flags.waiting_for:
        tags.append(tag(WAITING_ATTR, flags.waiting_for[bar.uid]))
    logs = [
        {
            "timestamp": e["t"] // 1000,
            "fields": [tag("event", e.get("name") or "event"), *(tag(k, v) for k, v in (e.get("attrs") or {}).items())],
        }
        for e in s.events
    ]
    if s.error:
        logs.append(
            {
                "timestamp": (s.end or bar.end) // 1000,
                "fields": [tag("event", "error"), *(tag(f"error.{k}", v) for k, v in s.error.items() if v is not None)],
            }
        )
    parent = bar.parent
    refs = (
        [{"refType": "CHILD_OF", "traceID": parent.span.trace_id, "spanID": parent.uid}]
        if parent is not None and parent.span.trace_id == s.trace_id
        else []
    )
    return {
        "traceID": s.trace_id,
        "spanID": bar.uid,
        "operationName": s.name,
        "references": refs,
        "flags": 1,
        "startTime": s.start // 1000,
        "duration": max(0, bar.end - s.start) // 1000,
        "tags": tags,
        "logs": logs,
        "processID": process_id,
        "warnings": warnings,
    }


def to_jaeger(lay: Layout, found: list[Finding] | None = None) -> dict[str, Any]:
    """``found``: the run's verdicts (``cli.findings``), root cause first; its culprit is flagged."""
    flags = marks(lay, found or [])
    traces: dict[str, dict[str, Any]] = {}
    for lane in lay.lanes:
        process_id = f"p{lane.index + 1}"
        process = _process(lane)
        for bar in lane.bars:
            trace = traces.setdefault(
                bar.span.trace_id, {"traceID": bar.span.trace_id, "spans": [], "processes": {}, "warnings": None}
            )
            trace["processes"][process_id] = process
            trace["spans"].append(_span(bar, process_id, flags))
    return {"data": list(traces.values())}
