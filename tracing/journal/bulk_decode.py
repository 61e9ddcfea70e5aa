"""The readers' fast path: the bulk kinds decoded straight into the objects readers keep.

``begin``, ``end``, ``event`` and ``collective`` are nearly every line of a journal (a 1024-rank
run: 614 k of 620 k). Their lines are decoded by msgspec straight into the objects readers keep
(``SpanRec``, ``EndRec``…), with ``journal.schema``'s types and bounds, except two things checked
by column instead (``bulk_valid``): ids (a ``pattern`` is a regex per value: +30 % on a 1024-rank
read) and attrs (decoded once per distinct text, ``_AttrsCache``). A chunk where either refuses a
line goes the way of every other kind: ``validate`` per record, naming the line
(``journal.tail.JournalTail``). ``tests/test_bad_records.py`` checks that these decoders accept
and refuse what ``validate`` does.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

import msgspec
from msgspec import Struct, field

from .. import keys
from .schema import Attrs, Collective, Error, Status, TimeNs, span_names_why, untyped_why


class SpanRec(Struct):
    """A phase, as readers keep it: its ``begin`` record (decoded straight from the line, or
    ``span_from``) and what its ``end`` and ``event`` records said."""

    span_id: str = field(name="span")
    name: str
    start: TimeNs = field(name="t")  # ns
    parent_id: str | None = field(name="parent", default=None)
    trace_id: str = field(name="trace", default="")
    attrs: dict[str, Any] = field(default_factory=dict)
    thread: str = ""
    # Set by readers only (a ``begin`` line carrying one of these names is refused: ``bulk_valid``).
    end: int | None = field(name="~end", default=None)  # ns; None while open (or it died there)
    status: str = field(name="~status", default="open")  # open | ok | error | incomplete
    error: dict[str, Any] | None = field(name="~error", default=None)
    events: list[dict[str, Any]] = field(name="~events", default_factory=list)

    @property
    def phase(self) -> str:
        """The stable phase name (rank roots are named per rank; their phase is ``rank``)."""
        return self.attrs.get(keys.PHASE, self.name)

    def duration_ns(self, now: int | None = None) -> int | None:
        end = self.end if self.end is not None else now
        return None if end is None else max(0, end - self.start)


_NO_ATTRS_DICT: dict[str, Any] = {}
_AT = SpanRec.__struct_fields__.index("attrs")
_BEFORE_ATTRS = attrgetter(*SpanRec.__struct_fields__[:_AT])
_AFTER_ATTRS = attrgetter(*SpanRec.__struct_fields__[_AT + 1 :])


def without_attrs(spans: list[SpanRec]) -> list[SpanRec]:
    """Copies without their attrs, as plain ``SpanRec``s (a span decoded from its line is of a
    tagged subclass: its tag is not kept), for whoever sends or keeps the attrs once apart (the
    index's table, a helper's answer). Made positionally: by keyword it was a third of a 1024-rank
    index's encoding."""
    return [SpanRec(*_BEFORE_ATTRS(span), _NO_ATTRS_DICT, *_AFTER_ATTRS(span)) for span in spans]


def span_from(r: dict[str, Any]) -> SpanRec:
    """The ``SpanRec`` of a ``begin`` record that ``validate`` accepted."""
    return SpanRec(
        r["span"], r["name"], r["t"], r.get("parent"), r.get("trace") or "", r.get("attrs") or {}, r.get("thread") or ""
    )


_NO_ATTRS = msgspec.Raw(b"{}")


class _Begin(SpanRec, tag="begin", tag_field="kind"):
    """A ``begin`` line as decoded: optional fields may be null, ``attrs`` is its JSON text
    (``bulk_valid`` makes them what ``SpanRec`` holds)."""

    trace_id: str | None = field(name="trace", default=None)
    attrs: msgspec.Raw = _NO_ATTRS
    thread: str | None = ""


class EndRec(Struct, tag="end", tag_field="kind"):
    t: TimeNs
    span: str
    status: Status | None = None
    attrs: msgspec.Raw = _NO_ATTRS
    error: dict[str, Any] | None = None  # readers keep it as it is: ``Error`` checks it (``bulk_valid``)


class EventRec(Struct, tag="event", tag_field="kind"):
    t: TimeNs
    span: str
    name: str | None = None
    attrs: msgspec.Raw = _NO_ATTRS


class CollectiveRec(Collective, tag="collective"):
    span: str | None = None  # hex: by column


class _AttrsCache(dict):
    """An ``attrs`` object's JSON text -> its value, decoded and checked once: attrs repeat across
    a run's spans and ranks (a few thousand distinct ones among 100 k spans), so this is most of a
    journal not decoded at all, and spans with equal attrs share one dict. Readers never change a
    span's attrs in place (an ``end`` record's replace them)."""

    def __init__(self, span: bool) -> None:
        super().__init__()
        self.span = span  # span attrs: the names readers use must be strings (``span_names_why``)

    def __missing__(self, raw: bytes) -> dict[str, Any]:
        value = _decode_attrs(raw) or {}
        if self.span and (why := span_names_why(value)) is not None:
            raise ValueError(why)
        if len(self) > 100_000:
            self.clear()
        self[raw] = value
        return value

    def of(self, items: list[Any]) -> list[dict[str, Any]]:
        """The attrs of each of ``items`` (their ``attrs`` is JSON text): mostly C-level lookups."""
        return list(map(self.__getitem__, map(bytes, map(_ATTRS_OF, items))))


_decode_attrs = msgspec.json.Decoder(Attrs | None).decode
_ATTRS_OF = attrgetter("attrs")
_SPAN_ATTRS_CACHE, _ATTRS_CACHE = _AttrsCache(span=True), _AttrsCache(span=False)


def _hex_ok(ids: list[str], n: int) -> bool:
    """Every one of ``ids`` is ``n`` hex digits: one ``bytes.fromhex`` of them all (C)."""
    if not ids:
        return True
    if set(map(len, ids)) != {n}:
        return False
    try:  # whitespace fromhex skips would shorten the result
        return len(bytes.fromhex("".join(ids))) * 2 == n * len(ids)
    except ValueError:
        return False


def _error_ok(error: dict[str, Any]) -> bool:
    try:
        msgspec.convert(error, Error)
    except msgspec.ValidationError:
        return False
    return untyped_why("end", {"error": error}) is None


# the first bytes of each bulk kind's line as ``journal.writer.dumps`` writes it -> its kind, its decoder
BULK_PREFIX = 16
BULK: dict[bytes, tuple[str, msgspec.json.Decoder]] = {
    b'{"kind":"begin",': ("begin", msgspec.json.Decoder(_Begin)),
    b'{"kind":"end","t': ("end", msgspec.json.Decoder(EndRec)),
    b'{"kind":"event",': ("event", msgspec.json.Decoder(EventRec)),
    b'{"kind":"collect': ("collective", msgspec.json.Decoder(CollectiveRec)),
}


def decode_lines(decoder: msgspec.json.Decoder, lines: list[bytes]) -> list[Any]:
    """One object per line of ``lines`` (none holds a newline), decoded in one call: joined by
    newlines, not made a JSON list (``b"[" + ... + b"]"`` copied a journal's bytes twice more).
    Raises ``ValueError`` where a line held other than one value (``decode_lines`` takes any
    whitespace between values): the caller then names the line."""
    items = decoder.decode_lines(b"\n".join(lines))
    if len(items) != len(lines):
        raise ValueError("not one value per line")
    return items


def bulk_valid(kind: str, items: list[Any]) -> bool:
    """What the bulk decoders leave to columns (ids, attrs, an ``end``'s error, fields only readers
    set), making each item what readers keep: ``begin`` items ``SpanRec``s (nulls as defaults),
    every ``attrs`` a dict. Raises ``ValueError`` or msgspec's ``ValidationError`` for bad attrs."""
    if not items:
        return True
    ids = list(map(attrgetter("span_id" if kind == "begin" else "span"), items))
    if kind == "collective":  # its span is optional
        return _hex_ok([s for s in ids if s is not None], 16)
    if not _hex_ok(ids, 16):
        return False
    for item, attrs in zip(items, (_ATTRS_CACHE if kind == "event" else _SPAN_ATTRS_CACHE).of(items), strict=True):
        item.attrs = attrs
    if kind == "event":
        return True
    if kind == "end":
        return all(_error_ok(e) for e in map(attrgetter("error"), items) if e is not None)
    traces = list(map(attrgetter("trace_id"), items))
    if not _hex_ok([p for p in map(attrgetter("parent_id"), items) if p is not None], 16):
        return False
    if not _hex_ok([t for t in traces if t is not None], 32):
        return False
    if set(map(attrgetter("end"), items)) != {None} or set(map(attrgetter("status"), items)) != {"open"}:
        return False
    if any(map(attrgetter("error"), items)) or any(map(attrgetter("events"), items)):
        return False
    if None in list(map(attrgetter("thread"), items)) or None in traces:
        for item in items:  # a null where the writer always writes a value: a hand-made journal
            item.thread, item.trace_id = item.thread or "", item.trace_id or ""
    return True
