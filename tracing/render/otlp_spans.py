"""A run as OpenTelemetry SDK spans, so the standard OTLP exporters (gRPC or HTTP/protobuf) can
send a finished run to any collector, exactly as the traced processes would have live."""

from __future__ import annotations

import json
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from ..verdicts.diagnose import Finding
from .jaeger import VERDICT_ATTR, WAITING_ATTR
from .lanes import OPEN_ATTR, Bar, Layout
from .otlp_json import SCOPE, resource_attrs
from .verdict import marks

_SCOPE = InstrumentationScope(SCOPE["name"], SCOPE["version"])


def _value(value: Any) -> Any:
    if isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, bool, int, float)) for v in value):
        return list(value)
    return json.dumps(value, default=str)


def _attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    return {str(k): _value(v) for k, v in attrs.items() if v is not None}


def _context(bar: Bar) -> SpanContext:
    return SpanContext(
        int(bar.span.trace_id or "0", 16), int(bar.uid, 16), is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED)
    )


def _status(bar: Bar, verdict: str | None) -> Status:
    s = bar.span
    if verdict:
        return Status(StatusCode.ERROR, verdict)
    if s.status == "ok":
        return Status(StatusCode.OK)
    if bar.open:
        return Status(StatusCode.UNSET)
    return Status(StatusCode.ERROR, str((s.error or {}).get("message") or s.status))


def to_sdk_spans(lay: Layout, found: list[Finding] | None = None) -> list[ReadableSpan]:
    """``found``: the run's verdicts; the culprit's phase gets status ERROR with the verdict."""
    flags = marks(lay, found or [])
    spans = []
    for lane in lay.lanes:
        proc = lane.proc
        resource = Resource(_attrs(resource_attrs(proc)))
        for bar in lane.bars:
            s = bar.span
            attrs = _attrs(s.attrs)
            if bar.open:
                attrs[OPEN_ATTR] = True
            verdict = flags.culprit.get(bar.uid)
            if verdict:
                attrs[VERDICT_ATTR] = verdict
            if bar.uid in flags.waiting_for:
                attrs[WAITING_ATTR] = flags.waiting_for[bar.uid]
            attrs.update(flags.waits_on.get(bar.uid, {}))
            events = [Event(str(e.get("name") or "event"), _attrs(e.get("attrs") or {}), e["t"]) for e in s.events]
            if s.error:
                events.append(
                    Event(
                        "exception",
                        _attrs(
                            {
                                "exception.type": s.error.get("type"),
                                "exception.message": s.error.get("message"),
                                "exception.stacktrace": s.error.get("stack"),
                            }
                        ),
                        bar.end,
                    )
                )
            spans.append(
                ReadableSpan(
                    s.name,
                    _context(bar),
                    _context(bar.parent) if bar.parent is not None else None,
                    resource,
                    attrs,
                    events,
                    kind=SpanKind.INTERNAL,
                    status=_status(bar, verdict),
                    start_time=s.start,
                    end_time=bar.end,
                    instrumentation_scope=_SCOPE,
                )
            )
    return spans
