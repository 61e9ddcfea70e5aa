"""What one node tells the others (``verdicts.crossnode``, through the launch's store): a snapshot
of its processes, checked by msgspec as the bytes are decoded, so nothing another party wrote
reaches a reader unless it has the shape node 0's watchdog relies on.

The records inside are the journal's own types (``journal.schema``), of the kinds
``crossnode.snapshot`` sends, made stricter for what crosses the network (``_for_network``): every
string, list and object has a size bound, a process is never pid 0, and the fields it never sends
are left out. Being derived, they cannot drift from the journal's: what this schema takes, the
journal's ``schema.validate`` takes (``tests/test_relay.py`` checks it on the journal's corpus of
bad records), so readers rely on the journal's types as they do for a journal. Depth is fixed by
the types (an unknown field is skipped, and one nested past the interpreter's recursion limit is
refused), numbers are integers or finite floats in a range.
"""

from __future__ import annotations

import functools
import operator
from typing import Annotated, Any, Literal, get_args, get_origin

import msgspec

from ..journal import schema
from ..journal.waits_on import Evidence

# -- what a node tells the others -----------------------------------------------------------------

VERSION = 1
MAX_NODES = 1 << 16
MAX_PROCS = 1024  # processes in one node's snapshot (its ranks and its launcher)
MAX_RECORDS = 4096  # records of one process (identity, open phases, a few heartbeats, collectives)
MAX_ITEMS = 1024  # entries of any object or list inside a record
MAX_STR = 1024  # characters of any string (labels, hosts, phase and group names, attribute values)

Str = Annotated[str, msgspec.Meta(max_length=MAX_STR)]
Time, Count = schema.TimeNs, schema.Count
TraceId = Annotated[str, msgspec.Meta(pattern=r"^(?!0{32}\Z)[0-9a-f]{32}\Z")]  # never 0 (OTel: invalid)
NodePid = Annotated[int, msgspec.Meta(ge=1, le=schema.PID_MAX)]  # a process another node names

LEFT_OUT = {"end": {"error"}, "heartbeat": {"journal_unwritten"}}  # fields ``crossnode.snapshot`` never sends
STRICTER = {  # fields with other bounds than the journal's (and than ``_bounded``)
    ("process", "pid"): NodePid,
    ("heartbeat", "pid"): NodePid | None,
    ("exit", "pid"): NodePid,
    ("begin", "trace"): Annotated[str, msgspec.Meta(pattern=r"^(?:[0-9a-fA-F]{32})?\Z")] | None,  # "": not known
}


def _bounded(tp: Any) -> Any:
    """``tp`` (a journal field's type) with a size bound on every string (``MAX_STR``), list and
    object (``MAX_ITEMS``), its Structs ``_for_network``."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is str:
        return Str
    if origin is Annotated:
        return Annotated[(_bounded(args[0]), *tp.__metadata__)]
    if origin is list or origin is dict:
        return Annotated[origin[tuple(map(_bounded, args))], msgspec.Meta(max_length=MAX_ITEMS)]
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return _for_network(tp)
    if origin is not Literal and args:  # a union
        return functools.reduce(operator.or_, map(_bounded, args))
    return tp


def _span_names(self: Any) -> None:
    """The ``__post_init__`` of a span's record: the attrs readers use as names are strings."""
    if (why := schema.span_names_why(self.attrs)) is not None:
        raise ValueError(why)


@functools.cache
def _for_network(cls: type[msgspec.Struct]) -> type[msgspec.Struct]:
    """The journal's Struct ``cls`` as it crosses the network: each field ``_bounded`` (or as
    ``STRICTER`` says), those in ``LEFT_OUT`` left out, a span's names checked as it is decoded;
    fields at their default are not sent."""
    tag = cls.__struct_config__.tag
    fields: list[tuple[Any, ...]] = []
    for f in msgspec.structs.fields(cls):
        if f.name in LEFT_OUT.get(tag, ()):
            continue
        tp = STRICTER.get((tag, f.name)) or _bounded(f.type)
        if f.default is not msgspec.NODEFAULT:
            fields.append((f.name, tp, f.default))
        elif f.default_factory is not msgspec.NODEFAULT:
            fields.append((f.name, tp, msgspec.field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, tp))
    span = tag in schema.SPAN_KINDS
    return msgspec.defstruct(
        cls.__name__,
        fields,
        tag_field=cls.__struct_config__.tag_field,
        tag=tag,
        omit_defaults=True,
        namespace={"__post_init__": _span_names} if span else None,
        module=__name__,
    )


Process, Identity, Begin, End, Heartbeat, Collective, Exit = map(
    _for_network,
    (schema.Process, schema.Identity, schema.Begin, schema.End, schema.Heartbeat, schema.Collective, schema.Exit),
)
Record = Process | Identity | Begin | End | Heartbeat | Collective | Exit


class Proc(msgspec.Struct, omit_defaults=True):
    """One process of the node: its records, when it last made progress, of its phases that ended
    and were not sent, how many per phase and the latest end (``ProcessRec.ended_phases``), and what
    it waits on when that node's launcher suspects it (read there: node 0 never reads another node)."""

    records: Annotated[list[Record], msgspec.Meta(max_length=MAX_RECORDS)]
    progress_t: Time | None = None
    ended: Annotated[dict[Str, tuple[Count, Time]], msgspec.Meta(max_length=MAX_RECORDS)] = {}
    evidence: Evidence | None = None


class Snapshot(msgspec.Struct):
    """A node's processes, at its clock's ``now``; ``seq`` grows with every snapshot it sends."""

    v: Literal[1]
    node: Annotated[int, msgspec.Meta(ge=0, lt=MAX_NODES)]
    seq: Count
    now: Time
    procs: Annotated[list[Proc], msgspec.Meta(max_length=MAX_PROCS)]


class Launch(msgspec.Struct, omit_defaults=True):
    """The launch identity every node shares (the store's ``phasetrace/launch``; first value wins)."""

    trace: TraceId
    launch_id: Str | None = None
    source: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.-]{1,64}\Z")] = "rendezvous"


class LaunchFile(msgspec.Struct):
    """``RUN_DIR/launch.json``: the launch's trace id, for this node's processes' exporters."""

    trace: TraceId
    local_trace: TraceId
