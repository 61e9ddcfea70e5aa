"""The journal's record schema, for readers: one msgspec ``Struct`` per kind (``Record``, tagged by
``kind``), whose types and constraints say what each field may hold; msgspec checks them in C.

Every record is one JSON object with ``kind`` (one of ``KINDS``) and ``t`` (Unix time, integer ns).
A required field must be present with its type; an optional field may be missing or null (readers
treat both as "not known"); fields not listed here are ignored and dropped (``trim``), so a newer
writer can add some. Readers (``journal.tail.JournalTail``, ``reader.view.RunView.status_file``)
skip a record that fails ``validate`` and report it once as ``file:line: why`` (the why worded by
``journal.refusals``); what they use
afterwards is the record's own dict, which may rely on the types below, so code downstream never
sees an ``attrs`` that is a string or a ``seq`` that is null. Numbers are bounded too: times are ns in
int64 (``TIME_MAX``), seconds within ``SECONDS_MAX``, counts and pids non-negative, attribute numbers
int64 (OTel's), so no reader's arithmetic overflows (``since_s: 1e308`` times 1e9 is inf). Types
cannot say two things, checked after them: the span attributes readers use as names are strings
(``span_names_why``), and a key a nested object's type does not know (kept, not typed) nests at
most ``DEPTH_MAX`` deep.

Kinds (schema version 1):

``process``    first line: ``pid``; ``v``, ``ppid``, ``host``, ``run_id``, ``boot_t``, ``resource``,
               ``start_ticks`` and ``boot_id`` (recognise the process later: ``tracing.other_processes``)
``identity``   who this process is, once known: ``label`` (``tp1``, ``launcher``), ``role``, ``attrs``
``begin``      a phase started: ``span``, ``name``; ``parent`` (16 hex or null), ``trace`` (32 hex),
               ``attrs``, ``thread``
``event``      inside a phase: ``span``; ``name``, ``attrs``
``end``        a phase ended: ``span``; ``status`` (ok/error/incomplete), ``attrs`` (set after begin),
               ``error`` (``type``, ``message``, ``stack``) when it failed
``heartbeat``  liveness and progress: ``seq``; ``pid``, ``label``, ``ready``, ``interval_s``, ``phases``
               (``span``, ``name``, ``phase``, ``since_s``, ``progress``), ``collective``, ``collectives``,
               ``cpu_s``, ``rss``, ``threads``, ``gpu``, ``runtime_calls``; what the process did since its
               previous beat (``tracing.recorder.activity``): ``dt_s``, ``main`` (``state``, ``cpu_s``), ``majflt``,
               ``io_b``, ``child_cpu_s``; in the status file only, ``journal_unwritten`` (``error``,
               ``since``, ``held``, ``dropped``) while journal writes fail
``collective`` an init collective entered or left: ``edge`` (enter/exit), ``op``, ``group``, ``seq``;
               ``span`` (the phase it ran in), ``dur_s`` on exit
``diagnosis``  a stall the watchdog found: ``message``; ``finding``, ``label``, ``pid``, ``phase``,
               ``since_s``, ``waiting`` (label -> what it waits in), ``stacks`` (file names),
               ``evidence`` (label -> what that rank waits on: ``journal.waits_on.Evidence``)
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

import json
from collections.abc import Iterator
from itertools import chain, compress, repeat
from typing import Annotated, Any, Literal, get_args, get_origin

import msgspec
from msgspec import Meta, Struct

from .. import keys
from .refusals import reason
from .waits_on import MAX_EVIDENCE, Evidence

TIME_MAX = 2**63 - 1  # ns (int64, as OTel and the exporters hold times: the year 2262)
INT_MAX = 2**63 - 1  # counts, attribute integers (OTel's are int64)
PID_MAX = 2**31 - 1  # pid_t
SECONDS_MAX = 1e9  # any duration a record states (~31 years): times 1e9 it is still an int64 of ns
DEPTH_MAX = 16  # levels of a value the schema does not type (a nested object's unknown key)

# -- what a field may hold (bounds: msgspec constraints) -----------------------------------------------

TimeNs = Annotated[int, Meta(ge=0, le=TIME_MAX)]
Count = Annotated[int, Meta(ge=0, le=INT_MAX)]
Pid = Annotated[int, Meta(ge=0, le=PID_MAX)]
Int64 = Annotated[int, Meta(ge=-INT_MAX - 1, le=INT_MAX)]
Float64 = Annotated[float, Meta(ge=-(2.0**63), lt=2.0**63)]  # finite, within int64's range (NaN fails)
Number = Int64 | Float64
Seconds = (
    Annotated[int, Meta(ge=-int(SECONDS_MAX), le=int(SECONDS_MAX))]
    | Annotated[float, Meta(ge=-SECONDS_MAX, le=SECONDS_MAX)]
)
SpanId = Annotated[
    str, Meta(pattern=r"^[0-9a-fA-F]{16}\Z", description="16 hex digits")
]  # exporters parse ids as numbers
TraceId = Annotated[str, Meta(pattern=r"^[0-9a-fA-F]{32}\Z", description="32 hex digits")]
Scalar = str | Int64 | Float64 | bool | None
Attrs = dict[str, Scalar | list[Scalar]]  # span, resource and identity attributes: what OTel allows
Status = Literal["ok", "error", "incomplete"]
Edge = Literal["enter", "exit"]


SPAN_KINDS = frozenset({"begin", "end"})  # their attrs are a span's: readers use two as names
SPAN_NAMES = (keys.PHASE, keys.GROUP_NAME)


def span_names_why(attrs: dict[str, Any] | None) -> str | None:
    """Why span ``attrs`` are unusable: an attribute readers use as a name is not a string (a type
    cannot say it of one key of an object)."""
    for key in SPAN_NAMES:
        if attrs and attrs.get(key) is not None and type(attrs[key]) is not str:
            return f"'attrs[\"{key}\"]' must be a string"
    return None


# -- the records: one Struct per kind -----------------------------------------------------------------


class _Kind(Struct, tag_field="kind", gc=False):
    t: TimeNs


class Process(_Kind, tag="process"):
    pid: Pid
    v: Count | None = None
    ppid: Pid | None = None
    host: str | None = None
    run_id: str | None = None
    boot_t: TimeNs | None = None
    resource: Attrs | None = None
    start_ticks: Count | None = None
    boot_id: str | None = None


class Identity(_Kind, tag="identity"):
    label: str | None = None
    role: str | None = None
    attrs: Attrs | None = None


class Begin(_Kind, tag="begin"):
    span: SpanId
    name: str
    parent: SpanId | None = None
    trace: TraceId | None = None
    attrs: Attrs | None = None
    thread: str | None = None


class Event(_Kind, tag="event"):
    span: SpanId
    name: str | None = None
    attrs: Attrs | None = None


class Error(Struct, gc=False):
    type: str | None = None
    message: str | None = None
    stack: str | None = None


class End(_Kind, tag="end"):
    span: SpanId
    status: Status | None = None
    attrs: Attrs | None = None
    error: Error | None = None


class BeatPhase(Struct, gc=False):
    span: str | None = None
    name: str | None = None
    phase: str | None = None
    since_s: Seconds | None = None
    progress: Attrs | None = None


class BeatCollective(Struct, gc=False):
    op: str | None = None
    group: str | None = None
    seq: Count | None = None
    since_s: Seconds | None = None


class BeatMain(Struct, gc=False):
    state: str | None = None
    cpu_s: Seconds | None = None


class Unwritten(Struct, gc=False):
    error: str | None = None
    since: TimeNs | None = None
    held: Count | None = None
    dropped: Count | None = None


class Heartbeat(_Kind, tag="heartbeat"):
    seq: Count
    pid: Pid | None = None
    label: str | None = None
    ready: bool | None = None
    interval_s: Seconds | None = None
    phases: list[BeatPhase] | None = None
    collective: BeatCollective | None = None
    collectives: dict[str, Count | None] | None = None
    cpu_s: Seconds | None = None
    rss: Count | None = None
    threads: Count | None = None
    gpu: dict[str, Number | None] | None = None
    runtime_calls: dict[str, dict[str, Number]] | None = None  # phase -> calls, seconds (after ready)
    dt_s: Seconds | None = None
    main: BeatMain | None = None
    majflt: Count | None = None
    io_b: Count | None = None
    child_cpu_s: Seconds | None = None
    journal_unwritten: Unwritten | None = None


class Collective(_Kind, tag="collective"):
    edge: Edge
    op: str
    group: str
    seq: Count
    span: SpanId | None = None
    dur_s: Seconds | None = None


class Diagnosis(_Kind, tag="diagnosis"):
    message: str
    finding: str | None = None
    label: str | None = None
    pid: Pid | None = None
    phase: str | None = None
    since_s: Seconds | None = None
    waiting: dict[str, str | None] | None = None
    stacks: list[str] | None = None
    evidence: Annotated[dict[str, Evidence], Meta(max_length=MAX_EVIDENCE)] | None = None  # label -> what it waits on


class WarningRecord(_Kind, tag="warning"):
    message: str


class Exit(_Kind, tag="exit"):
    pid: Pid
    host: str | None = None
    label: str | None = None
    code: Int64 | None = None
    signal: str | None = None


class Launch(_Kind, tag="launch"):
    trace: TraceId
    local_trace: TraceId | None = None
    launch_id: str | None = None
    source: str | None = None
    node_rank: Count | None = None
    nnodes: Count | None = None
    rendezvous: str | None = None


Record = Process | Identity | Begin | Event | End | Heartbeat | Collective | Diagnosis | WarningRecord | Exit | Launch
TYPES: dict[str, type[Struct]] = {cls.__struct_config__.tag: cls for cls in get_args(Record)}
KINDS = frozenset(TYPES)
FIELDS = {
    kind: frozenset({"kind", *(f.encode_name for f in msgspec.structs.fields(cls))}) for kind, cls in TYPES.items()
}


def _open(tp: Any, steps: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], frozenset[str] | None]]:
    """Where a value of type ``tp`` holds what its type leaves open: each object of a nested Struct
    (its other keys are kept, untyped) with the keys it knows, each ``Any`` (None): the steps there,
    a key, ``[]`` (every item) or ``{}`` (every value)."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return [(steps, None)]
    if origin is Annotated:
        return _open(args[0], steps)
    if origin is list or origin is dict:
        return _open(args[-1], (*steps, "[]" if origin is list else "{}"))
    if isinstance(tp, type) and issubclass(tp, Struct):
        fields = msgspec.structs.fields(tp)
        here = [(steps, frozenset(f.encode_name for f in fields))] if steps else []  # a record's own: ``trim``
        return here + [p for f in fields for p in _open(f.type, (*steps, f.encode_name))]
    return [p for arg in args for p in _open(arg, steps)]  # a union


_OPEN = {kind: spec for kind, cls in TYPES.items() if (spec := _open(cls))}  # kind -> its open places
_CHECKED = SPAN_KINDS | _OPEN.keys()  # kinds with more to check than their types


# -- validation (readers) -------------------------------------------------------------------------------


def validate(record: Any) -> str | None:
    """None when ``record`` is a usable record of a known kind, else a short reason (no location)."""
    if type(record) is not dict:
        return "not a JSON object"
    kind = record.get("kind")
    if type(kind) is not str:
        return "'kind' must be a string"
    cls = TYPES.get(kind)
    if cls is None:
        return f"unknown record kind {kind!r}"
    names = span_names_why(record.get("attrs")) if kind in SPAN_KINDS and type(record.get("attrs")) is dict else None
    try:
        msgspec.convert(record, cls)
    except msgspec.ValidationError:
        return names or reason(record, cls)  # a name's reason is the more exact one
    return names or untyped_why(kind, record)


def all_valid(records: list[Any]) -> bool:
    """True when ``validate`` accepts every record: one msgspec conversion of them all (C), then
    what types cannot say, by column with C-level maps; False when one is bad (the reader then
    finds which, and why, with ``validate``)."""
    if not set(map(type, records)) <= _DICT:
        return False
    kinds = list(map(dict.get, records, repeat("kind")))
    present = set(kinds)
    if not present <= KINDS:
        return False
    try:
        msgspec.convert({"records": records}, _Records)
    except msgspec.ValidationError:
        return False
    for kind in present & _CHECKED:
        group = records if len(present) == 1 else list(compress(records, map(kind.__eq__, kinds)))
        if kind in SPAN_KINDS:
            attrs = list(filter(None, map(dict.get, group, repeat("attrs"))))
            if any(not set(map(type, map(dict.get, attrs, repeat(key)))) <= _STR_OR_NONE for key in SPAN_NAMES):
                return False
        for steps, known in _OPEN.get(kind, ()):
            values = _gather(group, steps)
            if not (all(map(known.issuperset, values)) if known is not None else not any(map(too_deep, values))):
                if any(untyped_why(kind, r) for r in group):
                    return False
    return True


def _gather(values: list[Any], steps: tuple[str, ...]) -> list[Any]:
    """What is at ``steps`` (``_open``) in each of ``values`` (types already checked), by C-level maps."""
    for step in steps:
        if step == "[]":
            values = list(chain.from_iterable(values))
        elif step == "{}":
            values = list(chain.from_iterable(map(dict.values, values)))
        else:
            values = list(map(dict.get, values, repeat(step)))
        values = list(filter(None, values))  # an empty object or list holds nothing to check
    return values


_DICT, _STR_OR_NONE = {dict}, {str, type(None)}


class _Records(Struct, gc=False):
    """Records to convert at once: msgspec keeps what it learnt of a Struct's types, not of a
    ``list[Record]``'s (a union of 11 kinds: 30 µs a call, more than 600 records take)."""

    records: list[Record]


def trim(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Valid ``records`` without the fields the schema does not list: no reader uses them (the bulk
    decoders drop them too), and one nested deep must not reach code that recurses (a renderer, a
    ``marshal`` to the split read's child, another node). Most records have none: the same dicts."""
    return [r if FIELDS[r["kind"]].issuperset(r) else _known(r) for r in records]


def _known(record: dict[str, Any]) -> dict[str, Any]:
    known = FIELDS[record["kind"]]
    return {k: v for k, v in record.items() if k in known}


def too_deep(value: Any, levels: int = DEPTH_MAX) -> bool:
    """Whether ``value`` nests objects or lists more than ``levels`` deep (it looks no deeper):
    readers, renderers and the bundle's redaction recurse into what they keep."""
    kind = type(value)
    if kind is not dict and kind is not list:
        return False
    if levels == 0:
        return True
    return any(too_deep(v, levels - 1) for v in (value.values() if kind is dict else value))


def untyped_why(kind: str, record: dict[str, Any]) -> str | None:
    """Why a record msgspec accepted is unusable: what its types leave open (a key a nested object's
    type does not know, which msgspec skips and the record's dict keeps; a value typed ``Any``) nests
    deeper than ``DEPTH_MAX``."""
    for steps, known in _OPEN.get(kind, ()):
        for where, value in _places(record, steps, ""):
            if known is None:
                if too_deep(value):
                    return f"'{where}' nests deeper than {DEPTH_MAX} levels"
            elif not known.issuperset(value):
                for key in value.keys() - known:
                    if too_deep(value[key]):
                        return f"'{where}.{key}' nests deeper than {DEPTH_MAX} levels"
    return None


def _places(value: Any, steps: tuple[str, ...], where: str) -> Iterator[tuple[str, Any]]:
    """``_gather`` of one value, with where each thing is (``phases[0]``, ``evidence["tp1"]``)."""
    if value is None:
        return
    if not steps:
        yield where, value
        return
    step, rest = steps[0], steps[1:]
    if step == "[]":
        for i, item in enumerate(value):
            yield from _places(item, rest, f"{where}[{i}]")
    elif step == "{}":
        for key, item in value.items():
            yield from _places(item, rest, f"{where}[{json.dumps(key, ensure_ascii=False)}]")
    else:
        yield from _places(value.get(step), rest, f"{where}.{step}" if where else step)
