"""Snapshots of processes: what one node tells the others, and in-flight phases as OTel spans.

**What a node tells the others** (``tracing.crossnode``, through the launch's store): one schema,
checked by msgspec as the bytes are decoded, so nothing another party wrote reaches a reader unless
it has the shape node 0's watchdog relies on. Depth is fixed by the types (no free-form JSON: an
unknown field is skipped, and one nested past the interpreter's recursion limit is refused), every
string, list and object has a size bound, numbers are integers or finite floats in a range. The
records inside are the journal's (``tracing.records``), of the kinds ``crossnode.snapshot`` sends;
what this schema takes, ``records.validate`` takes (``tests/test_relay.py`` checks it on the
journal's corpus of bad records), so readers rely on the journal's types as they do for a journal.

**In-flight phases of a (possibly stuck) rank** as finished OTel spans marked incomplete: built from
the rank's journal by whoever watches it, with the rank's own trace and span ids and resource, so
Jaeger shows the stalled phase where it belongs even if the rank never ends it.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from .. import keys

# -- what a node tells the others -----------------------------------------------------------------

VERSION = 1
MAX_NODES = 1 << 16
MAX_PROCS = 1024  # processes in one node's snapshot (its ranks and its launcher)
MAX_RECORDS = 4096  # records of one process (identity, open phases, a few heartbeats, collectives)
MAX_ITEMS = 1024  # entries of any object or list inside a record
MAX_STR = 1024  # characters of any string (labels, hosts, phase and group names, attribute values)
_I63 = (1 << 63) - 1

# the journal's bounds (``records.Range``), or tighter
Str = Annotated[str, msgspec.Meta(max_length=MAX_STR)]
Time = Annotated[int, msgspec.Meta(ge=0, le=_I63)]  # Unix ns
Count = Annotated[int, msgspec.Meta(ge=0, le=_I63)]
Int = Annotated[int, msgspec.Meta(ge=-_I63, le=_I63)]
Pid = Annotated[int, msgspec.Meta(ge=1, le=(1 << 31) - 1)]
Ppid = Annotated[int, msgspec.Meta(ge=0, le=(1 << 31) - 1)]
Num = Annotated[float, msgspec.Meta(ge=-9.2e18, le=9.2e18)]  # JSON has no inf/nan; msgspec refuses 1e400
Seconds = Annotated[float, msgspec.Meta(ge=-1e9, le=1e9)]
SpanId = Annotated[str, msgspec.Meta(pattern="^[0-9a-fA-F]{16}$")]
TraceId = Annotated[str, msgspec.Meta(pattern="^(?!0{32}$)[0-9a-f]{32}$")]  # never 0 (OTel: invalid)
Scalar = Str | Int | Num | bool | None
Attrs = Annotated[
    dict[Str, Scalar | Annotated[list[Scalar], msgspec.Meta(max_length=MAX_ITEMS)]],
    msgspec.Meta(max_length=MAX_ITEMS),
]
Numbers = Annotated[dict[Str, Int | Num], msgspec.Meta(max_length=MAX_ITEMS)]


class _Record(msgspec.Struct, tag_field="kind", omit_defaults=True):
    t: Time


class Process(_Record, tag="process"):
    pid: Pid
    v: Count | None = None
    ppid: Ppid | None = None
    host: Str | None = None
    run_id: Str | None = None
    boot_t: Time | None = None
    resource: Attrs | None = None
    start_ticks: Count | None = None
    boot_id: Str | None = None


class Identity(_Record, tag="identity"):
    label: Str | None = None
    role: Str | None = None
    attrs: Attrs | None = None


def _names(attrs: dict | None) -> None:
    """Span attributes readers use as names are strings (``records.Attributes``)."""
    for key in (keys.PHASE, keys.GROUP_NAME):
        if attrs and attrs.get(key) is not None and type(attrs[key]) is not str:
            raise ValueError(f"attrs[{key!r}] must be a string")


class Begin(_Record, tag="begin"):
    span: SpanId
    name: Str
    parent: SpanId | None = None
    trace: Annotated[str, msgspec.Meta(pattern="^([0-9a-fA-F]{32})?$")] | None = None  # "": not known
    attrs: Attrs | None = None
    thread: Str | None = None

    def __post_init__(self) -> None:
        _names(self.attrs)


class End(_Record, tag="end"):
    span: SpanId
    status: Literal["ok", "error", "incomplete"] | None = None
    attrs: Attrs | None = None

    def __post_init__(self) -> None:
        _names(self.attrs)


class BeatPhase(msgspec.Struct, omit_defaults=True):
    span: Str | None = None
    name: Str | None = None
    phase: Str | None = None
    since_s: Seconds | None = None
    progress: Attrs | None = None


class BeatCollective(msgspec.Struct, omit_defaults=True):
    op: Str | None = None
    group: Str | None = None
    seq: Count | None = None
    since_s: Seconds | None = None


class BeatMain(msgspec.Struct, omit_defaults=True):
    state: Str | None = None
    cpu_s: Seconds | None = None


class Heartbeat(_Record, tag="heartbeat"):
    seq: Count
    pid: Pid | None = None
    label: Str | None = None
    ready: bool | None = None
    interval_s: Seconds | None = None
    phases: Annotated[list[BeatPhase], msgspec.Meta(max_length=MAX_ITEMS)] | None = None
    collective: BeatCollective | None = None
    collectives: Annotated[dict[Str, Count], msgspec.Meta(max_length=MAX_ITEMS)] | None = None
    cpu_s: Seconds | None = None
    rss: Count | None = None
    threads: Count | None = None
    gpu: Numbers | None = None
    runtime_calls: Annotated[dict[Str, Numbers], msgspec.Meta(max_length=MAX_ITEMS)] | None = None
    dt_s: Seconds | None = None
    main: BeatMain | None = None
    majflt: Count | None = None
    io_b: Count | None = None
    child_cpu_s: Seconds | None = None


class Collective(_Record, tag="collective"):
    edge: Literal["enter", "exit"]
    op: Str
    group: Str
    seq: Count
    span: SpanId | None = None
    dur_s: Seconds | None = None


class Exit(_Record, tag="exit"):
    pid: Pid
    host: Str | None = None
    label: Str | None = None
    code: Int | None = None
    signal: Str | None = None


Record = Process | Identity | Begin | End | Heartbeat | Collective | Exit


class Proc(msgspec.Struct, omit_defaults=True):
    """One process of the node: its records, when it last made progress, and of its phases that
    ended and were not sent, how many per phase and the latest end (``ProcessRec.ended_phases``)."""

    records: Annotated[list[Record], msgspec.Meta(max_length=MAX_RECORDS)]
    progress_t: Time | None = None
    ended: Annotated[dict[Str, tuple[Count, Time]], msgspec.Meta(max_length=MAX_RECORDS)] = {}


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
    source: Annotated[str, msgspec.Meta(pattern="^[A-Za-z0-9_.-]{1,64}$")] = "rendezvous"


class LaunchFile(msgspec.Struct):
    """``RUN_DIR/launch.json``: the launch's trace id, for this node's processes' exporters."""

    trace: TraceId
    local_trace: TraceId


# -- in-flight phases as OTel spans ---------------------------------------------------------------
