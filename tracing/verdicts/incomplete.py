"""In-flight phases of a (possibly stuck) rank as finished OTel spans marked incomplete: built from
the rank's journal by whoever watches it, with the rank's own trace and span ids and resource, so
Jaeger shows the stalled phase where it belongs even if the rank never ends it."""

from __future__ import annotations

from collections.abc import Iterator

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags

from .. import keys
from ..reader.view import ProcessRec


def _context(trace_id: str, span_id: str) -> SpanContext:
    return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def incomplete_spans(proc: ProcessRec, now_ns: int, reason: str) -> Iterator[ReadableSpan]:
    resource = Resource(proc.resource)
    for span in proc.open_spans:
        parent = span.parent_id and _context(span.trace_id, span.parent_id)
        yield ReadableSpan(
            name=span.name,
            context=_context(span.trace_id, span.span_id),
            parent=parent or None,
            resource=resource,
            start_time=span.start,
            end_time=now_ns,
            attributes={**span.attrs, **proc.identity, keys.INCOMPLETE: True, keys.SNAPSHOT: True},
            status=Status(StatusCode.ERROR, f"incomplete: in flight when the watchdog reported: {reason}"[:1000]),
        )
