"""A run laid out once for every renderer: one lane per process, spans as bars with run-unique ids.

The terminal timeline, the HTML report, the Jaeger/OTLP/Perfetto exports and the compare tables
all read this layout, so "open", "depth", "phase key" and the run's time bounds mean the same
everywhere. Ids are made unique across processes here: our writer draws span ids from the OS
(``runtime.PrivateIdGenerator``), but a journal from an older version or written by hand may
repeat one across processes. What a bar shows of its span is redacted as it is laid out
(``shown_attrs``).

A split run (``reader.load.Split``): the lanes of the processes a forked helper holds are laid out
there as well (``Part``: at the same time as here), where ``lane_jobs`` renders them.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
from collections import Counter
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import msgspec

from ..reader.forked_helper import job
from ..reader.load import Split
from ..reader.view import ProcessRec, RunView, SpanRec, node_label, phase_key_of
from .shown_attrs import IDS, SHOWN_IDS, attrs_key, new_id, raw_key, redact_span

OPEN_ATTR = "phasetrace.open"  # set on exported spans that never ended


class Bar(msgspec.Struct, gc=False):  # made in C: a 1024-rank run lays out 270 k of them; no cycles
    span: SpanRec
    uid: str  # span id, unique within the run
    parent: Bar | None  # the parent span when it is in this run
    depth: int  # 0 for spans whose parent is not in the same process
    end: int  # ns: the span's end, or the run's horizon while it is open
    key: str  # phase_key(span)
    attrs_id: int = -1  # equal for bars whose (redacted) attrs are equal: renderers build things once per id

    @property
    def open(self) -> bool:
        return self.span.end is None

    @property
    def seconds(self) -> float:
        return (self.end - self.span.start) / 1e9


DONE = frozenset({"ready", "serving"})  # lane states of a start that is over


def unreadable_text(proc: ProcessRec) -> str:
    """What every view says of a process whose journal cannot be read (``ProcessRec.unread``)."""
    return f"journal unreadable: {proc.unreadable}; its phases are not known"


@dataclass
class Lane:
    proc: ProcessRec
    index: int
    bars: list[Bar]
    label: str  # the process label, with ``@host:pid`` where two processes share one, ``@node-N`` (multi-node)

    @property
    def root(self) -> Bar | None:
        root = self.proc.root
        return next((b for b in self.bars if b.span is root), None) if root else None

    @property
    def state(self) -> str:
        """``ready`` (its start is over: a rank's launch serves), ``serving`` (a launcher: its launch
        serves), ``failed`` (an error ended the root), ``incomplete`` (a signal or exit ended it),
        ``initialised`` (a rank's own init is done, its launch does not serve yet: the warm-up),
        ``running`` (something still open), ``exited`` (nothing open, no root), or ``unreadable``
        (its journal cannot be read: nothing is known of its phases)."""
        proc = self.proc
        if proc.unreadable is not None:
            return "unreadable"
        root = proc.root
        if root is not None and root.status != "open":
            if root.status == "ok":
                return "serving" if proc.role == "launcher" and proc.serving else "ready"
            return {"error": "failed"}.get(root.status, root.status)
        if not any(b.open for b in self.bars):
            return "exited"
        return "initialised" if proc.initialised else "running"

    @functools.cached_property
    def where(self) -> Bar | None:
        """Where the process is or stopped: the innermost open phase, else the deepest failure
        (once per lane: several renderers ask, and a lane's bars are not changed once laid out)."""
        idle = self.proc.initialised  # an initialised rank's open root is no place it is in
        open_bars = [b for b in self.bars if b.open and not (idle and b.span is self.proc.root)]
        if open_bars:
            return max(open_bars, key=lambda b: (b.depth, b.span.start))
        failed = [b for b in self.bars if b.span.status in ("error", "incomplete")]
        return max(failed, key=lambda b: (b.depth, b.span.start)) if failed else None


@dataclass
class Layout:
    run: RunView
    lanes: list[Lane]
    start: int  # ns: the earliest span start
    end: int  # ns: the horizon (now for a live run, else the latest record)
    split: Part | None = None  # a split run: lanes whose bars a forked helper holds (``lane_jobs.lanes_map``)

    @property
    def seconds(self) -> float:
        return (self.end - self.start) / 1e9

    def rel(self, t: int) -> float:
        return (t - self.start) / 1e9


def _rehash(span_id: str, proc: ProcessRec, taken: set[str]) -> str:
    """A stable new id for a span whose id another process (or an earlier span) already uses."""
    salt = 0
    uid = span_id
    while not uid or uid in taken:
        salt += 1
        uid = hashlib.blake2b(f"{proc.host}:{proc.pid}:{span_id}:{salt}".encode(), digest_size=8).hexdigest()
    return uid


def _horizon(procs: list[ProcessRec], bounds: dict[Any, tuple[list[int], int]]) -> int:
    """The latest record or span time of ``procs`` (``bounds``: a split run's helper's, of all its spans)."""
    times = [p.last_t for p in procs] + [s.end or s.start for p in procs for s in p.spans.values()]
    times += [got[1] for p in procs if (got := bounds.get(p.path))]
    return max(times or [0])


_BAR_START = attrgetter("span.start")


def layout(run: RunView, now: int | None = None, depth: int | None = None, attrs: bool = True) -> Layout:
    """Lay out ``run``; open phases are drawn up to ``now`` (default: the latest record seen; with
    several run directories, the latest of the phase's own directory: hosts' clocks differ). A
    watcher's own journal (``phasetrace watch``/``run``: diagnoses, no phases) is not a lane.

    ``depth``: only bars down to that depth, and every open or failed one wherever it is (where a
    process is or stopped): all that ``status`` and ``timeline`` show, for a tenth of the spans of
    a run with thousands per rank. None: every span (the exports, the report, compare).
    ``attrs``: False for a verb that shows no attributes (compare): they are not redacted here
    (a fifth of the work), the phase keys built from them are.

    Spans are put in the launch's one trace (``RunView.trace_map``: a node whose spans started
    under its own trace id before the nodes agreed), and lanes of a multi-node launch are labelled
    with their node.

    A ``split`` run (``RunView.split``): here the lanes of the processes a forked helper holds have
    only the bars every verdict reads; whatever needs all of a lane's bars goes through ``lane_jobs.lanes_map``."""
    split = run.split
    if split is not None and split.lost:
        split.whole()  # the helper was lost: its processes are read here
        split = None
    procs = [p for p in run.processes if p.spans or p.role != "watchdog"]
    bounds = split.bounds if split is not None else {}
    horizon = now if now is not None else _horizon(procs, bounds)
    horizons: dict[Any, int] = {}  # run directory -> its horizon (several directories, no ``now``)
    if now is None and len(run.paths) > 1:
        by_dir: dict[Any, list[ProcessRec]] = {}
        for proc in procs:
            by_dir.setdefault(run.dir_of(proc), []).append(proc)
        horizons = {path: _horizon(ps, bounds) for path, ps in by_dir.items()}
    trace_map = run.trace_map
    untils = [horizons.get(run.dir_of(proc), horizon) if horizons else horizon for proc in procs]
    names = Counter(proc.label for proc in procs)
    labels = [
        node_label(proc, f"{proc.label}@{proc.host}:{proc.pid}" if names[proc.label] > 1 else proc.label)
        for proc in procs
    ]
    part = Part.start(split, procs, untils, labels, trace_map, depth, attrs) if split is not None else None
    work = _Work(trace_map, depth, attrs, unique=split is not None)
    lanes: list[Lane] = []
    owned: list[dict[str, Bar]] = []
    elsewhere: list[tuple[Bar, str]] = []  # bars whose parent is in another process (rank roots)
    for index, proc in enumerate(procs):
        bars, own = work.bars(proc, untils[index], elsewhere)
        owned.append(own)
        lanes.append(Lane(proc, index, bars, labels[index]))
    wanted = {parent_id for _, parent_id in elsewhere}
    first_owner: dict[str, Bar] = {}
    for own in owned:  # processes in order: a launcher's root wins over a rank's colliding id
        for parent_id in own.keys() & wanted:  # the smaller side walked: not every wanted id per process
            first_owner.setdefault(parent_id, own[parent_id])
    for bar, parent_id in elsewhere:
        bar.parent = first_owner.get(parent_id)
    starts = [min(map(_BAR_START, lane.bars)) for lane in lanes if lane.bars]
    starts += [min(bounds[p.path][0][: None if depth is None else depth + 1]) for p in procs if p.path in bounds]
    start = min(starts) if starts else horizon
    return Layout(run, lanes, start, max(horizon, start), part)


class _Work:
    """One process's bars (``layout``), in whichever process holds its spans whole."""

    def __init__(self, trace_map: dict[str, str], depth: int | None, attrs: bool, unique: bool = False) -> None:
        self.trace_map, self.depth, self.scrub = trace_map, depth, attrs
        # id(attrs as read) -> (attrs id, as shown, as read, a span name, its phase key): spans share
        # attrs objects (``bulk_decode._AttrsCache``), and their copies a name
        self.by_object: dict[int, tuple[int, dict[str, Any], dict[str, Any], str, str]] = {}
        # ids taken so far; None: the run's span ids are known to be unique and not empty (a split
        # run: ``reader.load._split_ok``, or its index's check), each span keeps its own
        self.taken: set[str] | None = None if unique else set()

    def bars(self, proc: ProcessRec, until: int, elsewhere: list[tuple[Bar, str]]) -> tuple[list[Bar], dict[str, Bar]]:
        """``proc``'s bars in start order and by span id; those whose parent is elsewhere go in ``elsewhere``."""
        depth, scrub, trace_map, taken, by_object = self.depth, self.scrub, self.trace_map, self.taken, self.by_object
        ids = IDS
        own: dict[str, Bar] = {}
        depths: dict[str, int] = {}  # span id -> depth, of every span (``depth`` leaves some out of ``own``)
        bars = []
        for span in proc.spans.values():
            sid, parent_id = span.span_id, span.parent_id
            up = depths.get(parent_id) if parent_id else None  # None: a root, or its parent is elsewhere
            level = up + 1 if up is not None else 0
            depths[sid] = level
            if depth is not None and level > depth and span.end is not None and span.status == "ok":
                continue
            attrs = span.attrs
            aid = -1
            if scrub and (hit := by_object.get(id(attrs))) is not None:  # shared by spans (``bulk_decode._AttrsCache``)
                aid, shown, _, named, key = hit
                if shown is not attrs:
                    span.attrs = attrs = shown
                if named != span.name:
                    key = phase_key_of(attrs, span.name)
                if span.error is not None or span.events:
                    redact_span(span)  # its attrs are clean: its error and events may not be
            elif scrub:  # most spans: attrs already seen clean (they repeat across copies and ranks)
                raw = attrs
                try:
                    seen = (tuple(attrs.items()), tuple(map(type, attrs.values())))
                    aid = ids.get(seen)
                except TypeError:  # a list value
                    seen = aid = None
                if aid is None:
                    redact_span(span)
                    if span.attrs is attrs:  # nothing to redact
                        aid = new_id(ids, seen)
                    else:
                        attrs = span.attrs
                        shown = attrs_key(attrs)
                        aid = SHOWN_IDS.get(shown) if shown is not None else -1
                        if aid is None:
                            aid = new_id(SHOWN_IDS, shown)
                elif span.error is not None or span.events:
                    redact_span(span)  # its attrs are clean: its error and events may not be
                key = phase_key_of(attrs, span.name)
                by_object[id(raw)] = (aid, attrs, raw, span.name, key)  # ``raw`` held: its id is not reused meanwhile
            if trace_map and span.trace_id in trace_map:
                span.trace_id = trace_map[span.trace_id]
            if taken is None:
                uid = sid
            else:
                uid = sid if sid and sid not in taken else _rehash(sid, proc, taken)
                taken.add(uid)
            parent = own.get(parent_id) if parent_id else None
            end = span.end if span.end is not None else max(until, span.start)
            if not scrub:  # a phase key per attrs object and name (spans share attrs: ``bulk_decode._AttrsCache``)
                hit = by_object.get(id(attrs))
                if hit is not None and hit[3] == span.name:
                    key = hit[4]
                else:
                    key = raw_key(attrs, span.name)
                    by_object[id(attrs)] = (-1, attrs, attrs, span.name, key)  # ``attrs`` held: its id stays its
            bar = Bar(span, uid, parent, level, end, key, aid)
            if parent_id and up is None:
                elsewhere.append((bar, parent_id))
            own[sid] = bar
            bars.append(bar)
        return bars, own


# -- a split run: the helper's lanes, laid out where their spans are -----------------------------


class Part:
    """The lanes of a split run's helper: what it needs to lay them out as ``layout`` would have (sent
    as ``layout`` begins, so both lay out at once), and the lanes once made here (the helper lost)."""

    _TOKENS = itertools.count(1)

    def __init__(self, split: Split, ctx: dict[str, Any], indices: set[int]) -> None:
        self.split, self.ctx, self.indices = split, ctx, indices
        self.pending = False  # the helper is laying out (``_part_prepare``): its answer is yet to be read
        self.here: dict[int, Lane] | None = None  # index -> lane, laid out here (the helper was lost)

    @classmethod
    def start(
        cls,
        split: Split,
        procs: list[ProcessRec],
        untils: list[int],
        labels: list[str],
        trace_map: dict[str, str],
        depth: int | None,
        attrs: bool,
    ) -> Part:
        theirs = [i for i, proc in enumerate(procs) if proc.path in split.paths and proc.remote is None]
        wanted = {  # parents elsewhere of the helper's roots (a root is never left out of a shallow state)
            span.parent_id
            for i in theirs
            for span in procs[i].spans.values()
            if span.parent_id and span.parent_id not in procs[i].spans
        }
        parents = {}  # span id -> its trace id, of those in the processes read here (ids are unique)
        for proc in procs:
            if wanted and proc.path not in split.paths:
                for sid in list(proc.spans.keys() & wanted):  # the smaller side walked, not every wanted id
                    trace = proc.spans[sid].trace_id
                    parents[sid] = trace_map.get(trace, trace)
                    wanted.discard(sid)
        ctx = {
            "token": next(cls._TOKENS),
            "lanes": [(str(procs[i].path), i, labels[i], untils[i]) for i in theirs],
            "trace_map": trace_map,
            "depth": depth,
            "attrs": attrs,
            "parents": parents,
        }
        part = cls(split, ctx, set(theirs))
        part.pending = split.call(_part_prepare, ctx)
        return part

    def lanes_here(self) -> dict[int, Lane]:
        if self.here is None:
            self.here = {lane.index: lane for lane in part_lanes(self.split.whole(), self.ctx)}
        return self.here


def part_lanes(procs: dict[str, ProcessRec], ctx: dict[str, Any]) -> list[Lane]:
    """The lanes of ``procs`` (the helper's processes, whole) as ``layout`` made them in one process."""
    work = _Work(ctx["trace_map"], ctx["depth"], ctx["attrs"], unique=True)  # a split run's
    lanes, owned, elsewhere = [], {}, []
    for path, index, label, until in ctx["lanes"]:
        proc = procs[path]
        bars, own = work.bars(proc, until, elsewhere)
        owned.update(own)  # span ids are unique in a split run (``reader.load``)
        lanes.append(Lane(proc, index, bars, label))
    parents = ctx["parents"]
    for bar, parent_id in elsewhere:
        up = owned.get(parent_id)
        if up is None and parent_id in parents:  # in the parent's lanes: what its references need
            up = Bar(SpanRec(parent_id, "", 0, None, parents[parent_id]), parent_id, None, 0, 0, "")
        bar.parent = up
    return lanes


PART_LANES: dict[int, list[Lane]] = {}  # in the helper: token -> its lanes


@job
def _part_prepare(procs: dict[str, ProcessRec], ctx: dict[str, Any]) -> None:
    """In the helper (``reader.load.Child.call``): lay out its lanes (``lane_jobs`` renders them)."""
    PART_LANES[ctx["token"]] = part_lanes(procs, ctx)
