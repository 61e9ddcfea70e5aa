"""OTLP/JSON (``ExportTraceServiceRequest``): what ``POST /v1/traces`` with JSON accepts.

Per the OTLP JSON mapping: ids are hex strings, enums are integers, 64-bit integers are decimal
strings. One ``resourceSpans`` per process, carrying that process's resource. A phase that never
ended ends at the run's horizon with status unset and ``phasetrace.open = true``. The verdict's
culprit phase (its rank only) has status ERROR with the verdict as message and
``phasetrace.verdict``; waiting peers keep their status and carry ``phasetrace.waiting_for``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from .. import keys
from ..files import Gathered
from ..reader.forked_helper import job
from ..reader.view import ProcessRec
from ..verdicts.diagnose import Finding
from .jaeger import _TEXTS, VERDICT_ATTR, WAITING_ATTR
from .jsonout import LONG, dumps, list_items

try:  # text never fails it: ``jsonout.dumps`` without its fallback, per span
    from orjson import dumps as _fast
except ImportError:  # pragma: no cover
    _fast = dumps
from .lane_jobs import Held, lanes_held, resolve
from .lanes import OPEN_ATTR, Bar, Lane, Layout
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


def _events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A span's events as OTLP span events."""
    return [
        {
            "timeUnixNano": str(e["t"]),
            "name": str(e.get("name") or "event"),
            "attributes": attributes(e.get("attrs") or {}),
        }
        for e in events
    ]


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
    attrs.update(flags.waits_on.get(bar.uid, {}))
    events = _events(s.events)
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
    """``found``: the run's verdicts (``verdicts.findings``), root cause first; its culprit is flagged.
    The document ``otlp_chunks`` writes, as a value."""
    return json.loads(b"".join(resolve(otlp_chunks(lay, found))))


def otlp_chunks(lay: Layout, found: list[Finding] | None = None) -> Iterator[bytes | Held]:
    """``to_otlp_json``'s document as compact JSON (``jsonout.dumps`` of it), one ``resourceSpans``
    item per lane, each made by the process holding its spans (``lanes_held``: a split run's child
    writes its own into the file)."""
    flags = marks(lay, found or [])
    arg = (flags.culprit, flags.word, flags.waiting_for, flags.waits_on)
    yield b'{"resourceSpans":['
    for n, pieces in enumerate(lanes_held(lay, lane_resource_spans, arg)):
        if n:
            yield b","
        for _, chunk in pieces:
            yield chunk
    yield b"]}"


_HEAD_END = b'"spans":[]}]}'


@job
def lane_resource_spans(lane: Lane, arg: tuple) -> list[tuple[int, bytes]]:
    """The lane's ``resourceSpans`` item (``lanes_map``: in the process holding its spans)."""
    flags = Marks(*arg)
    head = dumps(
        {
            "resource": {"attributes": attributes({**resource_attrs(lane.proc), keys.PROCESS_STATE: lane.state})},
            "scopeSpans": [{"scope": SCOPE, "spans": []}],
        }
    )
    flagged = flags.culprit.keys() | flags.waiting_for.keys() | flags.waits_on.keys()
    texts = _TEXTS
    items = []
    for bar in lane.bars:
        s = bar.span
        end, aid = s.end, bar.attrs_id
        if s.status != "ok" or end is None or s.error or aid < 0 or (flagged and bar.uid in flagged):
            items.append(dumps(_span(bar, flags)))
            continue
        attrs = _ok_attrs.get(aid)
        if attrs is None:
            if len(_ok_attrs) > 100_000:
                _ok_attrs.clear()
            attrs = _ok_attrs[aid] = dumps(attributes(s.attrs))
        parent = bar.parent
        fields = (texts[s.trace_id], _fast(bar.uid), texts[s.name], s.start, end)
        up = b',"parentSpanId":%b' % _fast(parent.uid) if parent is not None else b""
        rest = _LOGGED_TAIL % (dumps(_events(s.events)), up) if s.events else _OK_TAIL % up  # shard loads
        items.append(_OK_SPAN % (*fields, attrs, rest) if len(attrs) < LONG else (_OK_HEAD % fields, attrs, rest))
    spans = list_items(items)
    head = head[: -len(_HEAD_END)] + b'"spans":['
    if isinstance(spans, Gathered):
        return [(0, Gathered([head, *spans.parts, b"]}]}"]))]
    return [(0, head + spans + b"]}]}")]


# A span that ended well with nothing to flag (most of them): ``dumps(_span(...))``, byte for byte,
# its attributes' JSON made once per ``Bar.attrs_id`` and the rest formatted in place.
_OK_SPAN = (
    b'{"traceId":%b,"spanId":%b,"name":%b,"kind":1,"startTimeUnixNano":"%d","endTimeUnixNano":"%d","attributes":%b%b'
)
_OK_HEAD = _OK_SPAN.removesuffix(b"%b%b")  # before long attributes (``jsonout.list_items``)
_OK_TAIL = b',"events":[],"status":{"code":1}%b}'
_LOGGED_TAIL = _OK_TAIL.replace(b'"events":[]', b'"events":%b')

_ok_attrs: dict[int, bytes] = {}  # ``Bar.attrs_id`` (never reused) -> its attributes' JSON
