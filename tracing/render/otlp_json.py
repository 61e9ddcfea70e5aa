"""OTLP/JSON (``ExportTraceServiceRequest``): what ``POST /v1/traces`` with JSON accepts.

Per the OTLP JSON mapping: ids are hex strings, enums are integers, 64-bit integers are decimal
strings. One ``resourceSpans`` per process, carrying that process's resource. A phase that never
ended ends at the run's horizon with status unset and ``phasetrace.open = true``. The verdict's
culprit phase (its rank only) has status ERROR with the verdict as message and
``phasetrace.verdict``; waiting peers keep their status and carry ``phasetrace.waiting_for``.
"""

from __future__ import annotations

import json
from typing import Any

from .. import keys
from ..reader.run import ProcessRec
from ..verdicts.diagnose import Finding
from .jaeger import VERDICT_ATTR, WAITING_ATTR
from .lanes import OPEN_ATTR, Bar, Layout
from .verdict import Marks, marks

SCOPE = {"name": "sglang-phasetrace", "version": "0.1.0"}
KIND_INTERNAL, STATUS_UNSET, STATUS_OK, STATUS_ERROR = 1, 0, 1, 2


def any_value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [any_value(v) for v in value]}}
    return {"stringValue": json.dumps(value, default=str)}


def attributes(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    return [_attribute(k, v) for k, v in attrs.items() if v is not None]


def _attribute(key: Any, value: Any) -> dict[str, Any]:
    """Scalar attributes repeat across ranks (phase names, flags): built once, shared."""
    if type(value) not in (str, int, float, bool):
        return {"key": str(key), "value": any_value(value)}
    cache_key = (key, type(value), value)
    hit = _attrs.get(cache_key)
    if hit is None:
        hit = _attrs[cache_key] = {"key": str(key), "value": any_value(value)}
    return hit


_attrs: dict[tuple, dict[str, Any]] = {}


def resource_attrs(proc: ProcessRec) -> dict[str, Any]:
    """A process's OTLP resource: what it started with, its host and pid, and its node (multi-node)."""
    node = {keys.NODE_RANK: proc.node} if proc.node is not None else {}
    return {"service.name": "sglang", **proc.resource, **node, "host.name": proc.host, "process.pid": proc.pid}


def status(bar: Bar, verdict: str | None = None) -> dict[str, Any]:
    s = bar.span
    if verdict:
        return {"code": STATUS_ERROR, "message": verdict}
    if s.status == "ok":
        return {"code": STATUS_OK}
    if bar.open:
        return {"code": STATUS_UNSET}
    message = (s.error or {}).get("message") or s.status
    return {"code": STATUS_ERROR, "message": str(message)}


def _span(bar: Bar, flags: Marks) -> dict[str, Any]:
    s = bar.span
    attrs = dict(s.attrs)
    if bar.open:
        attrs[OPEN_ATTR] = True
    verdict = flags.culprit.get(bar.uid)
    if verdict:
        attrs[VERDICT_ATTR] = verdict
    if bar.uid in flags.waiting_for:
        attrs[WAITING_ATTR] = flags.waiting_for[bar.uid]
    events = [
        {
            "timeUnixNano": str(e["t"]),
            "name": str(e.get("name") or "event"),
            "attributes": attributes(e.get("attrs") or {}),
        }
        for e in s.events
    ]
    if s.error:
        events.append(
            {
                "timeUnixNano": str(bar.end),
                "name": "exception",
                "attributes": attributes(
                    {
                        f"exception.{k}": v
                        for k, v in (
                            ("type", s.error.get("type")),
                            ("message", s.error.get("message")),
                            ("stacktrace", s.error.get("stack")),
                        )
                    }
                ),
            }
        )
    span = {
        "traceId": s.trace_id,
        "spanId": bar.uid,
        "name": s.name,
        "kind": KIND_INTERNAL,
        "startTimeUnixNano": str(s.start),
        "endTimeUnixNano": str(bar.end),
        "attributes": attributes(attrs),
        "events": events,
        "status": status(bar, verdict),
    }
    if bar.parent is not None:
        span["parentSpanId"] = bar.parent.uid
    return span


def to_otlp_json(lay: Layout, found: list[Finding] | None = None) -> dict[str, Any]:
    """``found``: the run's verdicts (``cli.findings``), root cause first; its culprit is flagged."""
    flags = marks(lay, found or [])
    resource_spans = []
    for lane in lay.lanes:
        proc = lane.proc
        resource = resource_attrs(proc)
        resource_spans.append(
            {
                "resource": {"attributes": attributes(resource)},
                "scopeSpans": [{"scope": SCOPE, "spans": [_span(b, flags) for b in lane.bars]}],
            }
        )
    return {"resourceSpans": resource_spans}
