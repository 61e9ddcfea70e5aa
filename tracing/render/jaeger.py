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
from collections.abc import Iterator
from typing import Any

from .. import keys
from ..reader.forked_helper import job
from ..verdicts.diagnose import Finding
from .jsonout import LONG, dumps, list_items

try:
    from orjson import dumps as _fast  # a span id: always a str orjson takes (``dumps`` is its fallback)
except ImportError:  # pragma: no cover - depends on the environment
    _fast = dumps
from .lane_jobs import Held, lanes_held, resolve
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


def _attr_tags(attrs: dict[str, Any], status: str | None = None, attrs_id: int = -1) -> list[dict[str, Any]]:
    """``tag`` of each attribute (then the ``otel.status_code`` tag of ``status`` when given): a span's
    attrs repeat across its copies and the ranks, so the list is built once per distinct attrs and
    status (``attrs_id``: ``Bar.attrs_id``; else keyed with the values' types: ``True`` is not ``1``
    here) and shared by the spans that have them: the document is only serialised. A caller that
    appends copies it."""
    try:
        key = (attrs_id, status) if attrs_id >= 0 else (tuple(attrs.items()), tuple(map(type, attrs.values())), status)
        hit = _attr_lists.get(key)
    except TypeError:  # a list value: not hashable
        hit = None
        key = None
    if hit is None:
        hit = [tag(k, v) for k, v in attrs.items()]
        if status is not None:
            hit.append(tag("otel.status_code", _STATUS_CODES[status]))
        if key is not None:
            if len(_attr_lists) > 100_000:
                _attr_lists.clear()
            _attr_lists[key] = hit
    return hit


_attr_lists: dict[tuple, list[dict[str, Any]]] = {}
_STATUS_CODES = {"ok": "OK", "open": "UNSET"}


def _process(lane: Lane) -> dict[str, Any]:
    proc = lane.proc
    attrs = {**proc.resource, **proc.identity, "host.name": proc.host, "process.pid": proc.pid}
    attrs[keys.PROCESS_STATE] = lane.state  # "initialised" (its launch not serving yet) vs "ready"/"serving"
    service = str(proc.resource.get("service.name") or "sglang")
    return {"serviceName": f"{service} {lane.label}", "tags": [tag(k, v) for k, v in attrs.items()]}


# A span that ended well with nothing to flag (most of them): ``dumps(_span(...))``, byte for byte,
# with its tags' JSON made once per distinct attrs (``_tags_json``) and the rest formatted in place.
_OK_SPAN = (
    b'{"traceID":%b,"spanID":%b,"operationName":%b,"references":%b,"flags":1,"startTime":%d,'
    b'"duration":%d,"tags":%b,"logs":[],"processID":%b,"warnings":null}'
)
_CHILD_OF = b'[{"refType":"CHILD_OF","traceID":%b,"spanID":%b}]'
_OK_HEAD, _, _OK_TAIL = _OK_SPAN.partition(b'%b,"logs"')  # around long tags (``jsonout.list_items``)
_OK_TAIL = b',"logs"' + _OK_TAIL
_LOGGED_TAIL = _OK_TAIL.replace(b'"logs":[]', b'"logs":%b')  # one that ended well with events (shard loads)


class _Texts(dict):
    """Text -> its JSON: trace ids and phase names repeat across every span of a run."""

    def __missing__(self, text: str) -> bytes:
        if len(self) > 100_000:
            self.clear()
        hit = self[text] = dumps(text)
        return hit


_TEXTS = _Texts()


def _tags_json(attrs: dict[str, Any], attrs_id: int) -> bytes:
    """``dumps`` of the tags of a span that ended well (``_attr_tags`` with status ok), once per ``attrs_id``."""
    hit = _tags_bytes.get(attrs_id) if attrs_id >= 0 else None
    if hit is None:
        hit = dumps(_attr_tags(attrs, "ok", attrs_id))
        if attrs_id >= 0:
            if len(_tags_bytes) > 100_000:
                _tags_bytes.clear()
            _tags_bytes[attrs_id] = hit
    return hit


_tags_bytes: dict[int, bytes] = {}  # ``Bar.attrs_id`` (never reused) -> its tags' JSON


def _logs(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A span's events as Jaeger logs."""
    return [
        {
            "timestamp": e["t"] // 1000,
            "fields": [tag("event", e.get("name") or "event"), *(tag(k, v) for k, v in (e.get("attrs") or {}).items())],
        }
        for e in events
    ]


def _span(bar: Bar, process_id: str, flags: Marks) -> dict[str, Any]:
    """A span's whole form: those that need more than their attributes as tags (open, failed,
    flagged) are written as it; ``lane_spans`` formats the others' bytes in place."""
    s = bar.span
    tags = list(_attr_tags(s.attrs, None, bar.attrs_id))
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
    tags.extend(tag(k, v) for k, v in flags.waits_on.get(bar.uid, {}).items())
    logs = _logs(s.events)
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
    """``found``: the run's verdicts (``verdicts.findings``), root cause first; its culprit is flagged.
    The document ``jaeger_chunks`` writes, as a value."""
    return json.loads(b"".join(resolve(jaeger_chunks(lay, found))))


def jaeger_chunks(lay: Layout, found: list[Finding] | None = None) -> Iterator[bytes | Held]:
    """``to_jaeger``'s document as compact JSON (the same bytes as ``jsonout.dumps`` of it with
    orjson), each lane's spans made by the process holding them (``lanes_held``: a split run's
    helper writes its own into the file, ``lane_jobs.write_pieces``): a 1024-rank run's 270 k span
    objects never exist at once, nor its 250 MB in one process."""
    flags = marks(lay, found or [])
    processes = {lane.index: _process(lane) for lane in lay.lanes}
    traces: dict[str, list[tuple[Lane, bytes | Held]]] = {}  # trace id -> (lane, its spans there), by first appearance
    arg = (flags.culprit, flags.word, flags.waiting_for, flags.waits_on)
    for lane, parts in zip(lay.lanes, lanes_held(lay, lane_spans, arg), strict=True):
        for trace_id, chunk in parts:
            traces.setdefault(trace_id, []).append((lane, chunk))
    yield b'{"data":['
    for n, (trace_id, lanes) in enumerate(traces.items()):
        yield b'{"traceID":' if n == 0 else b',{"traceID":'
        yield dumps(trace_id) + b',"spans":['
        for i, (_, chunk) in enumerate(lanes):
            if i:
                yield b","
            yield chunk
        yield b'],"processes":' + dumps({f"p{lane.index + 1}": processes[lane.index] for lane, _ in lanes})
        yield b',"warnings":null}'
    yield b"]}"


@job
def lane_spans(lane: Lane, arg: tuple[dict[str, str], str, dict[str, str], dict[str, Any]]) -> list[tuple[str, bytes]]:
    """(trace id, the lane's spans in it as JSON list items) for each trace the lane's bars are in,
    in order of first appearance (``lanes_map``: in the process holding them). A quarter of a
    million spans at 1024 ranks: what repeats (a trace's JSON, a parent's reference) is made once."""
    flags = Marks(*arg)
    process_id = f"p{lane.index + 1}"
    pid_json, texts, tags_of, ok_span, child_of = dumps(process_id), _TEXTS, _tags_bytes, _OK_SPAN, _CHILD_OF
    ok_head, ok_tail, fast = _OK_HEAD, _OK_TAIL, _fast
    flagged = flags.culprit.keys() | flags.waiting_for.keys() | flags.waits_on.keys()
    groups: dict[str, list[bytes]] = {}
    trace, items, trace_json, refs = None, [], b"", {}  # refs: id(parent bar) -> its reference, in this trace
    for bar in lane.bars:
        s = bar.span
        if s.trace_id != trace:  # a lane's bars are nearly always in one trace
            trace = s.trace_id
            items = groups.setdefault(trace, [])
            trace_json, refs = texts[trace], {}
        end, events = s.end, s.events
        if s.status != "ok" or end is None or s.error or (flagged and bar.uid in flagged):
            items.append(dumps(_span(bar, process_id, flags)))
            continue
        aid, parent, start = bar.attrs_id, bar.parent, s.start
        if parent is None:
            ref = b"[]"
        elif (ref := refs.get(id(parent))) is None:
            ref = refs[id(parent)] = (
                child_of % (trace_json, dumps(parent.uid)) if parent.span.trace_id == trace else b"[]"
            )
        tags = tags_of.get(aid) if aid >= 0 else None
        if tags is None:
            tags = _tags_json(s.attrs, aid)
        took = (end - start) // 1000 if end > start else 0
        if events:  # shard loads: their logs in the tail
            head = ok_head % (trace_json, fast(bar.uid), texts[s.name], ref, start // 1000, took)
            tail = _LOGGED_TAIL % (dumps(_logs(events)), pid_json)
            items.append(head + tags + tail if len(tags) < LONG else (head, tags, tail))
        elif len(tags) < LONG:
            items.append(ok_span % (trace_json, fast(bar.uid), texts[s.name], ref, start // 1000, took, tags, pid_json))
        else:  # written from its one copy (``files.Gathered``)
            head = ok_head % (trace_json, fast(bar.uid), texts[s.name], ref, start // 1000, took)
            items.append((head, tags, ok_tail % pid_json))
    return [(trace, list_items(items)) for trace, items in groups.items()]
