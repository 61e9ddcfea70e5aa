"""The journal's record schema, in one place: a constructor per kind for writers, ``validate`` for readers.

Every record is one JSON object with ``kind`` (one of ``KINDS``) and ``t`` (Unix time, integer ns).
A required field must be present with its type; an optional field may be missing or null (readers
treat both as "not known"); fields not listed here are ignored and dropped (``trim``), so a newer
writer can add some. Readers (``journal.JournalTail``, ``rundir.RunView.status_file``) skip a record
that fails ``validate`` and report it once as ``file:line: why``; everything they use afterwards may
rely on the types below, so code downstream never sees an ``attrs`` that is a string or a ``seq`` that
is null. Numbers are bounded too (``Range``): times are ns in int64 (``TIME_MAX``), seconds within
``SECONDS_MAX``, counts and pids non-negative, attribute integers int64 (OTel's), so no reader's
arithmetic overflows (``since_s: 1e308`` times 1e9 is inf); a value the schema does not type (an
object's unknown key, ``runtime_calls``) nests at most ``DEPTH_MAX`` deep.

Kinds (schema version 1):

``process``    first line: ``pid``; ``v``, ``ppid``, ``host``, ``run_id``, ``boot_t``, ``resource``,
               ``start_ticks`` and ``boot_id`` (recognise the process later: ``tracing.procs``)
``identity``   who this process is, once known: ``label`` (``tp1``, ``launcher``), ``role``, ``attrs``
``begin``      a phase started: ``span``, ``name``; ``parent`` (16 hex or null), ``trace`` (32 hex),
               ``attrs``, ``thread``
``event``      inside a phase: ``span``; ``name``, ``attrs``
``end``        a phase ended: ``span``; ``status`` (ok/error/incomplete), ``attrs`` (set after begin),
               ``error`` (``type``, ``message``, ``stack``) when it failed
``heartbeat``  liveness and progress: ``seq``; ``pid``, ``label``, ``ready``, ``interval_s``, ``phases``
               (``span``, ``name``, ``phase``, ``since_s``, ``progress``), ``collective``, ``collectives``,
               ``cpu_s``, ``rss``, ``threads``, ``gpu``, ``runtime_calls``; what the process did since its
               previous beat (``tracing.activity``): ``dt_s``, ``main`` (``state``, ``cpu_s``), ``majflt``,
               ``io_b``, ``child_cpu_s``; in the status file only, ``journal_unwritten`` (``error``,
               ``since``, ``held``, ``dropped``) while journal writes fail
``collective`` an init collective entered or left: ``edge`` (enter/exit), ``op``, ``group``, ``seq``;
               ``span`` (the phase it ran in), ``dur_s`` on exit
``diagnosis``  a stall the watchdog found: ``message``; ``finding``, ``label``, ``pid``, ``phase``,
               ``since_s``, ``waiting`` (label -> what it waits in), ``stacks`` (file names)
``warning``    something we could not do: ``message``
``launch``     which launch this node belongs to (multi-node), written by the node's launcher once it
               knows: ``trace`` (32 hex, the launch's trace id); ``local_trace`` (the trace id this
               node's spans started with, when it differs: readers and exports map it to ``trace``),
               ``launch_id``, ``source`` (an environment variable's name, or ``rendezvous``),
               ``node_rank``, ``nnodes``, ``rendezvous`` (HOST:PORT)
``exit``       how another process ended, written by the one that saw it go (its parent, a watcher):
               ``pid``; ``host``, ``label``, ``code`` (exit status) or ``signal`` (its name)
"""

from __future__ import annotations

from itertools import chain, compress, repeat
from math import isnan
from operator import attrgetter, is_, is_not
from typing import Annotated, Any, Literal

import msgspec

from .. import keys
from .records import Record

STATUSES = frozenset({"ok", "error", "incomplete"})
EDGES = frozenset({"enter", "exit"})
TIME_MAX = 2**63 - 1  # ns (int64, as OTel and the exporters hold times: the year 2262)
INT_MAX = 2**63 - 1  # counts, attribute integers (OTel's are int64)
PID_MAX = 2**31 - 1  # pid_t
SECONDS_MAX = 1e9  # any duration a record states (~31 years): times 1e9 it is still an int64 of ns
DEPTH_MAX = 16  # levels of a value the schema does not type (ours nest 2)


# -- constructors (writers) ------------------------------------------------------------------------


# -- validation (readers) --------------------------------------------------------------------------

_NONE = type(None)
STR, INT, NUM, BOOL, OBJ, LIST = (str,), (int,), (int, float), (bool,), (dict,), (list,)
_SCALAR = (str, int, float, bool, _NONE)
_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    dict: "an object",
    list: "a list",
}
Why = tuple[str, str]  # (where inside the field, e.g. ``[0].since_s``; what is wrong)


def _kind_of(types: tuple[type, ...]) -> str:
    return "a number" if types == NUM else " or ".join(_NAMES[t] for t in types)


class Deep:
    """A check of a field's value beyond its type: ``check`` one value (with the reason), ``all_ok``
    a column of them (the fast path: override with C-level work where the column is long)."""

    def check(self, value: Any) -> Why | None:
        raise NotImplementedError

    def all_ok(self, values: list[Any]) -> bool:
        return all(self.check(v) is None for v in values)


class Range(Deep):
    """A number from ``lo`` to ``hi`` (not NaN, which the stdlib's JSON parser takes): readers do
    arithmetic with them (seconds to ns, rates), which a ``1e308`` or a 400-digit integer overflows."""

    def __init__(self, lo: float, hi: float, what: str) -> None:
        self.lo, self.hi, self.why = lo, hi, f"must be {what}"

    def check(self, value: float) -> Why | None:
        return None if self.lo <= value <= self.hi else ("", self.why)  # NaN fails both

    def all_ok(self, values: list[float]) -> bool:
        return not values or (self.lo <= min(values) and max(values) <= self.hi and not any(map(isnan, values)))


_TIME = Range(0, TIME_MAX, "a time in ns from 0 to 2^63-1")
_SECONDS = Range(-SECONDS_MAX, SECONDS_MAX, "seconds within ±1e9")
_COUNT = Range(0, INT_MAX, "from 0 to 2^63-1")
_PID = Range(0, PID_MAX, "a pid from 0 to 2^31-1")
_INT64 = Range(-INT_MAX - 1, INT_MAX, "a 64-bit integer")
_NUMBER = Range(-INT_MAX - 1, INT_MAX, "a number within ±2^63")
_ATTR_NUMBER = {int: _INT64, float: _NUMBER}  # orjson reads an integer past 2^64 as a float


def too_deep(value: Any, levels: int = DEPTH_MAX) -> bool:
    """Whether ``value`` nests objects or lists more than ``levels`` deep (it looks no deeper):
    readers, renderers and the bundle's redaction recurse into what they keep."""
    kind = type(value)
    if kind is not dict and kind is not list:
        return False
    if levels == 0:
        return True
    return any(too_deep(v, levels - 1) for v in (value.values() if kind is dict else value))


class Nested(Deep):
    """A value the schema does not type: at most ``DEPTH_MAX`` deep."""

    def check(self, value: Any) -> Why | None:
        return ("", f"nests deeper than {DEPTH_MAX} levels") if too_deep(value) else None


class Hex(Deep):
    """An id: ``n`` hex digits (exporters parse them as numbers)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def check(self, value: str) -> Why | None:
        return None if self.all_ok([value]) else ("", f"must be {self.n} hex digits")

    def all_ok(self, values: list[str]) -> bool:
        if set(map(len, values)) != {self.n}:
            return False
        try:  # whitespace fromhex skips would shorten the result
            return len(bytes.fromhex("".join(values))) * 2 == self.n * len(values)
        except ValueError:
            return False


class OneOf(Deep):
    def __init__(self, allowed: frozenset[str]) -> None:
        self.allowed = allowed

    def check(self, value: str) -> Why | None:
        return None if value in self.allowed else ("", f"must be one of {', '.join(sorted(self.allowed))}")

    def all_ok(self, values: list[str]) -> bool:
        return set(values) <= self.allowed


class Attributes(Deep):
    """Span, identity and resource attributes: scalars or lists of scalars (what OTel allows: numbers
    within ±2^63, as its integers are int64); in span attributes, the ones readers use as names must
    be strings."""

    NAMES = (keys.PHASE, keys.GROUP_NAME)

    def __init__(self, span: bool = False) -> None:
        self.names = self.NAMES if span else ()

    def check(self, value: dict[str, Any]) -> Why | None:
        for key in self.names:
            v = value.get(key)
            if v is not None and type(v) is not str:
                return f'["{key}"]', "must be a string"
        for key, v in value.items():
            if not (_attr_scalar(v) or (type(v) is list and all(map(_attr_scalar, v)))):
                return f".{key}", "must be a string, a number within ±2^63, true/false or a list of them"
        return None

    def all_ok(self, values: list[dict[str, Any]]) -> bool:
        maps = list(filter(None, values))
        flat = list(chain.from_iterable(map(dict.values, maps)))
        types = set(map(type, flat))
        if not types <= _ATTR_VALUE or (list in types and not super().all_ok(maps)):
            return False
        for kind in types & _ATTR_NUMBER.keys():  # C-level: the numbers of that type, then their range
            if not _ATTR_NUMBER[kind].all_ok(list(compress(flat, map(is_, map(type, flat), repeat(kind))))):
                return False
        return all(set(map(type, map(dict.get, maps, repeat(key)))) <= _STR_OR_NONE for key in self.names)


def _attr_scalar(v: Any) -> bool:
    kind = type(v)
    return kind in _SCALAR and (kind not in _ATTR_NUMBER or _ATTR_NUMBER[kind].check(v) is None)


class Fields(Deep):
    """A nested object, checked field by field (all optional); its other keys nest at most ``DEPTH_MAX``."""

    def __init__(self, *spec: Field) -> None:
        self.spec = spec
        self.names = frozenset(name for name, *_ in spec)

    def check(self, value: dict[str, Any]) -> Why | None:
        for name, types, _, deep in self.spec:
            v = value.get(name)
            if v is None:
                continue
            if type(v) not in types:
                return f".{name}", f"must be {_kind_of(types)}"
            if deep is not None and (why := deep.check(v)) is not None:
                return f".{name}{why[0]}", why[1]
        if not self.names.issuperset(value):
            for key in value.keys() - self.names:
                if (why := _NESTED.check(value[key])) is not None:
                    return f".{key}", why[1]
        return None


class ListOf(Deep):
    def __init__(self, types: tuple[type, ...], deep: Deep | None = None) -> None:
        self.types, self.deep = types, deep

    def check(self, value: list[Any]) -> Why | None:
        for i, item in enumerate(value):
            if type(item) not in self.types:
                return f"[{i}]", f"must be {_kind_of(self.types)}"
            if self.deep is not None and (why := self.deep.check(item)) is not None:
                return f"[{i}]{why[0]}", why[1]
        return None


class Values(Deep):
    """An object whose values are all of ``types`` (or null), each passing ``deep``."""

    def __init__(self, types: tuple[type, ...], deep: Deep | None = None) -> None:
        self.types, self.deep = types, deep

    def check(self, value: dict[str, Any]) -> Why | None:
        for key, v in value.items():
            if v is not None and type(v) not in self.types:
                return f".{key}", f"must be {_kind_of(self.types)}"
            if v is not None and self.deep is not None and (why := self.deep.check(v)) is not None:
                return f".{key}{why[0]}", why[1]
        return None


# (name, types, required, deeper check)
Field = tuple[str, tuple[type, ...], bool, "Deep | None"]


def _f(name: str, types: tuple[type, ...], required: bool = False, deep: Deep | None = None) -> Field:
    return (name, types, required, deep)


_SPAN, _TRACE, _ATTRS, _SPAN_ATTRS = Hex(16), Hex(32), Attributes(), Attributes(span=True)
_NESTED = Nested()
_ERROR = Fields(_f("type", STR), _f("message", STR), _f("stack", STR))  # an ``end`` record's ``error``
SCHEMA: dict[str, tuple[Field, ...]] = {
    "process": (
        _f("pid", INT, True, _PID),
        _f("v", INT, deep=_COUNT),
        _f("ppid", INT, deep=_PID),
        _f("host", STR),
        _f("run_id", STR),
        _f("boot_t", INT, deep=_TIME),
        _f("resource", OBJ, deep=_ATTRS),
        _f("start_ticks", INT, deep=_COUNT),
        _f("boot_id", STR),
    ),
    "identity": (_f("label", STR), _f("role", STR), _f("attrs", OBJ, deep=_ATTRS)),
    "begin": (
        _f("span", STR, True, _SPAN),
        _f("name", STR, True),
        _f("parent", STR, deep=_SPAN),
        _f("trace", STR, deep=_TRACE),
        _f("attrs", OBJ, deep=_SPAN_ATTRS),
        _f("thread", STR),
    ),
    "event": (_f("span", STR, True, _SPAN), _f("name", STR), _f("attrs", OBJ, deep=_ATTRS)),
    "end": (
        _f("span", STR, True, _SPAN),
        _f("status", STR, deep=OneOf(STATUSES)),
        _f("attrs", OBJ, deep=_SPAN_ATTRS),
        _f("error", OBJ, deep=_ERROR),
    ),
    "heartbeat": (
        _f("seq", INT, True, _COUNT),
        _f("pid", INT, deep=_PID),
        _f("label", STR),
        _f("ready", BOOL),
        _f("interval_s", NUM, deep=_SECONDS),
        _f(
            "phases",
            LIST,
            deep=ListOf(
                OBJ,
                Fields(
                    _f("span", STR),
                    _f("name", STR),
                    _f("phase", STR),
                    _f("since_s", NUM, deep=_SECONDS),
                    _f("progress", OBJ, deep=_ATTRS),
                ),
            ),
        ),
        _f(
            "collective",
            OBJ,
            deep=Fields(
                _f("op", STR), _f("group", STR), _f("seq", INT, deep=_COUNT), _f("since_s", NUM, deep=_SECONDS)
            ),
        ),
        _f("collectives", OBJ, deep=Values(INT, _COUNT)),
        _f("cpu_s", NUM, deep=_SECONDS),
        _f("rss", INT, deep=_COUNT),
        _f("threads", INT, deep=_COUNT),
        _f("gpu", OBJ, deep=Values(NUM, _NUMBER)),
        _f("runtime_calls", OBJ, deep=_NESTED),
        _f("dt_s", NUM, deep=_SECONDS),
        _f("main", OBJ, deep=Fields(_f("state", STR), _f("cpu_s", NUM, deep=_SECONDS))),
        _f("majflt", INT, deep=_COUNT),
        _f("io_b", INT, deep=_COUNT),
        _f("child_cpu_s", NUM, deep=_SECONDS),
        _f(
            "journal_unwritten",
            OBJ,
            deep=Fields(
                _f("error", STR),
                _f("since", INT, deep=_TIME),
                _f("held", INT, deep=_COUNT),
                _f("dropped", INT, deep=_COUNT),
            ),
        ),
    ),
    "collective": (
        _f("edge", STR, True, OneOf(EDGES)),
        _f("op", STR, True),
        _f("group", STR, True),
        _f("seq", INT, True, _COUNT),
        _f("span", STR, deep=_SPAN),
        _f("dur_s", NUM, deep=_SECONDS),
    ),
    "diagnosis": (
        _f("message", STR, True),
        _f("finding", STR),
        _f("label", STR),
        _f("pid", INT, deep=_PID),
        _f("phase", STR),
        _f("since_s", NUM, deep=_SECONDS),
        _f("waiting", OBJ, deep=Values(STR)),
        _f("stacks", LIST, deep=ListOf(STR)),
    ),
    "warning": (_f("message", STR, True),),
    "exit": (
        _f("pid", INT, True, _PID),
        _f("host", STR),
        _f("label", STR),
        _f("code", INT, deep=_INT64),
        _f("signal", STR),
    ),
    "launch": (
        _f("trace", STR, True, _TRACE),
        _f("local_trace", STR, deep=_TRACE),
        _f("launch_id", STR),
        _f("source", STR),
        _f("node_rank", INT, deep=_COUNT),
        _f("nnodes", INT, deep=_COUNT),
        _f("rendezvous", STR),
    ),
}
KINDS = frozenset(SCHEMA)
FIELDS = {kind: frozenset({"kind", "t", *(name for name, *_ in spec)}) for kind, spec in SCHEMA.items()}


def trim(records: list[Record]) -> list[Record]:
    """Valid ``records`` without the fields the schema does not list: no reader uses them (the bulk
    decoders drop them too), and one nested deep must not reach code that recurses (a renderer, a
    ``marshal`` to the split read's child, another node). Most records have none: the same dicts."""
    return [r if FIELDS[r["kind"]].issuperset(r) else _known(r) for r in records]


def _known(record: Record) -> Record:
    known = FIELDS[record["kind"]]
    return {k: v for k, v in record.items() if k in known}


def validate(record: Any) -> str | None:
    """None when ``record`` is a usable record of a known kind, else a short reason (no location)."""
    if type(record) is not dict:
        return "not a JSON object"
    kind = record.get("kind")
    if type(kind) is not str:
        return "'kind' must be a string"
    spec = SCHEMA.get(kind)
    if spec is None:
        return f"unknown record kind {kind!r}"
    t = record.get("t")
    if type(t) is not int:
        return "'t' must be an integer (ns)"
    if _TIME.check(t) is not None:
        return f"'t' {_TIME.why}"
    for name, types, required, deep in spec:
        v = record.get(name)
        if v is None:
            if required:
                return f"'{name}' is missing" if name not in record else f"'{name}' must not be null"
            continue
        if type(v) not in types:
            return f"'{name}' must be {_kind_of(types)}"
        if deep is not None and (why := deep.check(v)) is not None:
            return f"'{name}{why[0]}' {why[1]}"
    return None


def all_valid(records: list[Any]) -> bool:
    """True when ``validate`` accepts every record, checked one column at a time per kind with
    C-level ``map``s (the journal reader's fast path: ~0.6 µs a record, a third of ``validate``'s);
    False when one is bad (the reader then finds which, and why, with ``validate``)."""
    if not set(map(type, records)) <= _DICT:
        return False
    kinds = list(map(dict.get, records, repeat("kind")))
    present = set(kinds)
    if not present <= KINDS:
        return False
    for kind in present:  # one C-level pass per kind (a handful) instead of a Python loop per record
        group = records if len(present) == 1 else list(compress(records, map(kind.__eq__, kinds)))
        if len(group) < 8:  # a kind seen once or twice (process, identity): columns cost more
            if any(map(validate, group)):
                return False
            continue
        times = list(map(dict.get, group, repeat("t")))
        if set(map(type, times)) != _INT or not _TIME.all_ok(times):
            return False
        for name, types, required, deep in SCHEMA[kind]:
            if deep is None:
                if not set(map(type, map(dict.get, group, repeat(name)))) <= _TYPES[required][types]:
                    return False
                continue
            column = list(map(dict.get, group, repeat(name)))
            if not set(map(type, column)) <= _TYPES[required][types]:
                return False
            if not deep.all_ok(column if required else list(compress(column, map(is_not, column, _NONES)))):
                return False
    return True


_DICT, _INT = {dict}, {int}
_NONES = repeat(None)
_STR_OR_NONE = {str, _NONE}
_ATTR_VALUE = {*_SCALAR, list}
_ALLOWED = {types: frozenset(types) for spec in SCHEMA.values() for _, types, _, _ in spec}
_TYPES = {True: _ALLOWED, False: {types: frozenset((*types, _NONE)) for types in _ALLOWED}}  # by required


# -- the readers' fast path: the bulk kinds decoded straight into objects ----------------------------
#
# ``begin``, ``end``, ``event`` and ``collective`` are nearly every line of a journal (a 1024-rank
# run: 614 k of 620 k). Their lines are decoded by msgspec straight into the objects readers keep,
# with the types of ``SCHEMA`` checked in C; ``bulk_valid`` adds what types cannot say (hex ids,
# the names readers use, fields only readers set). A chunk where either refuses a line goes the way
# of every other kind: ``validate`` per record, naming the line (``journal.JournalTail``).
# ``tests/test_bad_records.py`` checks that these decoders accept and refuse what ``validate`` does.

# The bounds of ``SCHEMA`` (``Range``) as msgspec constraints, checked in C.
_Int64 = Annotated[int, msgspec.Meta(ge=-INT_MAX - 1, le=INT_MAX)]
_TimeNs = Annotated[int, msgspec.Meta(ge=0, le=TIME_MAX)]
_Count = Annotated[int, msgspec.Meta(ge=0, le=INT_MAX)]
_Seconds = (
    Annotated[int, msgspec.Meta(ge=-int(SECONDS_MAX), le=int(SECONDS_MAX))]
    | Annotated[float, msgspec.Meta(ge=-SECONDS_MAX, le=SECONDS_MAX)]
)
_Float = Annotated[float, msgspec.Meta(ge=-(2.0**63), lt=2.0**63)]  # ``_NUMBER``
_Scalar = str | _Int64 | _Float | bool | None
_Attrs = dict[str, str | _Int64 | _Float | bool | list[_Scalar] | None]


class SpanRec(msgspec.Struct):
    """A phase, as readers keep it: its ``begin`` record (decoded straight from the line, or
    ``span_from``) and what its ``end`` and ``event`` records said."""

    span_id: str = msgspec.field(name="span")
    name: str
    start: _TimeNs = msgspec.field(name="t")  # ns
    parent_id: str | None = msgspec.field(name="parent", default=None)
    trace_id: str = msgspec.field(name="trace", default="")
    attrs: dict[str, Any] = msgspec.field(default_factory=dict)
    thread: str = ""
    # Set by readers only (a ``begin`` line carrying one of these names is refused: ``bulk_valid``).
    end: int | None = msgspec.field(name="~end", default=None)  # ns; None while open (or it died there)
    status: str = msgspec.field(name="~status", default="open")  # open | ok | error | incomplete
    error: dict[str, Any] | None = msgspec.field(name="~error", default=None)
    events: list[dict[str, Any]] = msgspec.field(name="~events", default_factory=list)

    @property
    def phase(self) -> str:
        """The stable phase name (rank roots are named per rank; their phase is ``rank``)."""
        return self.attrs.get(keys.PHASE, self.name)

    def duration_ns(self, now: int | None = None) -> int | None:
        end = self.end if self.end is not None else now
        return None if end is None else max(0, end - self.start)


def span_from(r: Record) -> SpanRec:
    """The ``SpanRec`` of a ``begin`` record that ``validate`` accepted."""
    return SpanRec(
        r["span"], r["name"], r["t"], r.get("parent"), r.get("trace") or "", r.get("attrs") or {}, r.get("thread") or ""
    )


_NO_ATTRS = msgspec.Raw(b"{}")


class _Begin(SpanRec, tag="begin", tag_field="kind"):
    """A ``begin`` line as decoded: optional fields may be null, ``attrs`` is its JSON text
    (``bulk_valid`` makes them what ``SpanRec`` holds)."""

    trace_id: str | None = msgspec.field(name="trace", default=None)
    attrs: msgspec.Raw = _NO_ATTRS
    thread: str | None = ""


class EndRec(msgspec.Struct, tag="end", tag_field="kind"):
    t: _TimeNs
    span: str
    status: Literal["ok", "error", "incomplete"] | None = None
    attrs: msgspec.Raw = _NO_ATTRS
    error: dict[str, Any] | None = None


class EventRec(msgspec.Struct, tag="event", tag_field="kind"):
    t: _TimeNs
    span: str
    name: str | None = None
    attrs: msgspec.Raw = _NO_ATTRS


class _AttrsCache(dict):
    """An ``attrs`` object's JSON text -> its value, decoded and checked once: attrs repeat across
    a run's spans and ranks (a few thousand distinct ones among 100 k spans), so this is most of a
    journal not decoded at all, and spans with equal attrs share one dict. Readers never change a
    span's attrs in place (an ``end`` record's replace them)."""

    def __init__(self, check: Attributes) -> None:
        super().__init__()
        self.check = check  # what the types do not say (span attrs: the names readers use are strings)

    def __missing__(self, raw: bytes) -> dict[str, Any]:
        value = _decode_attrs(raw) or {}
        if (why := self.check.check(value)) is not None:
            raise ValueError(f"attrs{why[0]} {why[1]}")
        if len(self) > 100_000:
            self.clear()
        self[raw] = value
        return value

    def of(self, items: list[Any]) -> list[dict[str, Any]]:
        """The attrs of each of ``items`` (their ``attrs`` is JSON text): mostly C-level lookups."""
        return list(map(self.__getitem__, map(bytes, map(_ATTRS_OF, items))))


_decode_attrs = msgspec.json.Decoder(_Attrs | None).decode
_ATTRS_OF = attrgetter("attrs")
_SPAN_ATTRS_CACHE, _ATTRS_CACHE = _AttrsCache(_SPAN_ATTRS), _AttrsCache(_ATTRS)


class CollectiveRec(msgspec.Struct, tag="collective", tag_field="kind"):
    t: _TimeNs
    edge: Literal["enter", "exit"]
    op: str
    group: str
    seq: _Count
    span: str | None = None
    dur_s: _Seconds | None = None


# the first bytes of each bulk kind's line as ``journal.dumps`` writes it -> its kind, its decoder
BULK_PREFIX = 16
BULK: dict[bytes, tuple[str, msgspec.json.Decoder]] = {
    b'{"kind":"begin",': ("begin", msgspec.json.Decoder(list[_Begin])),
    b'{"kind":"end","t': ("end", msgspec.json.Decoder(list[EndRec])),
    b'{"kind":"event",': ("event", msgspec.json.Decoder(list[EventRec])),
    b'{"kind":"collect': ("collective", msgspec.json.Decoder(list[CollectiveRec])),
}


def bulk_valid(kind: str, items: list[Any]) -> bool:
    """What msgspec's types do not check of a decoded bulk column (ids, attrs, the names readers
    use, fields only readers set), making each item what readers keep: ``begin`` items
    ``SpanRec``s (nulls as defaults), every ``attrs`` a dict. Raises ``ValueError`` or msgspec's
    ``ValidationError`` for bad attrs."""
    if not items:
        return True
    ids = list(map(attrgetter("span_id" if kind == "begin" else "span"), items))
    if kind == "collective":  # its span is optional
        ids = [s for s in ids if s is not None]
        return _SPAN.all_ok(ids) if ids else True
    if not _SPAN.all_ok(ids):
        return False
    for item, attrs in zip(items, (_ATTRS_CACHE if kind == "event" else _SPAN_ATTRS_CACHE).of(items), strict=True):
        item.attrs = attrs
    if kind == "event":
        return True
    if kind == "end":
        return all(_ERROR.check(e) is None for e in map(attrgetter("error"), items) if e)
    parents = [p for p in map(attrgetter("parent_id"), items) if p is not None]
    traces = list(map(attrgetter("trace_id"), items))
    given = [t for t in traces if t is not None]
    if (parents and not _SPAN.all_ok(parents)) or (given and not _TRACE.all_ok(given)):
        return False
    if set(map(attrgetter("end"), items)) != {None} or set(map(attrgetter("status"), items)) != {"open"}:
        return False
    if any(map(attrgetter("error"), items)) or any(map(attrgetter("events"), items)):
        return False
    if None in list(map(attrgetter("thread"), items)) or None in traces:
        for item in items:  # a null where the writer always writes a value: a hand-made journal
            item.thread, item.trace_id = item.thread or "", item.trace_id or ""
    return True
