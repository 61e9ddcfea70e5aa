"""A run laid out once for every renderer: one lane per process, spans as bars with run-unique ids.

The terminal timeline, the HTML report, the Jaeger/OTLP/Perfetto exports and the compare tables
all read this layout, so "open", "depth", "phase key" and the run's time bounds mean the same
everywhere. Ids are made unique across processes here: our writer draws span ids from the OS
(``runtime.PrivateIdGenerator``), but a journal from an older version or written by hand may
repeat one across processes.
Attributes, errors and events are redacted here, once for all of them: a journal written by hand
or by another version may hold what ours never writes.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import itertools
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import msgspec

from .. import keys
from ..files import pwrite_all
from ..reader.load import ChildLost, Split
from ..reader.run import ProcessRec, RunView, SpanRec, key_text, node_label, phase_key_of
from ..redact import is_secret_key, redact

OPEN_ATTR = "phasetrace.open"  # set on exported spans that never ended


_MEMO: dict[tuple[str, str], Any] = {}  # (key, text) -> redacted: values repeat across spans and ranks


def _redacted(key: str, value: Any) -> Any:
    if isinstance(value, str):
        hit = _MEMO.get((key, value))
        if hit is None:
            if len(_MEMO) > 100_000:
                _MEMO.clear()
            hit = _MEMO[(key, value)] = redact(value, key)
        return hit
    if isinstance(value, (bool, int, float)) or value is None:
        return redact(value, key) if value not in (None, False) and key and _secret_key(key) else value
    return redact(value, key)


_SECRET_KEYS: dict[str, bool] = {}


def _secret_key(key: str) -> bool:
    hit = _SECRET_KEYS.get(key)
    if hit is None:
        hit = _SECRET_KEYS[key] = is_secret_key(key)
    return hit


_CLEAN: set[tuple] = set()  # items of attrs known to need no redaction: they repeat across copies and ranks


def _clean(values: dict[str, Any]) -> dict[str, Any] | None:
    """``values`` redacted, or None when nothing changes."""
    try:
        items = tuple(values.items())
        if items in _CLEAN:
            return None
    except TypeError:  # a list value: not hashable
        items = None
    clean = {k: _redacted(str(k), v) for k, v in values.items()}
    if clean != values:
        return clean
    if items is not None:
        if len(_CLEAN) > 100_000:
            _CLEAN.clear()
        _CLEAN.add(items)
    return None


_IDS: dict[tuple, int] = {}  # attrs as read (items, value types) known clean -> their id
_SHOWN_IDS: dict[tuple, int] = {}  # attrs as redacted -> their id
_NEXT_ID = itertools.count()  # ids are never reused, even once the tables above are emptied


def _attrs_key(attrs: dict[str, Any]) -> tuple | None:
    """Equal attrs, value types included (``True`` is not ``1`` to an export), have equal keys."""
    key = (tuple(attrs.items()), tuple(map(type, attrs.values())))
    try:
        hash(key)
    except TypeError:  # a list value
        return None
    return key


def _new_id(table: dict[tuple, int], key: tuple | None) -> int:
    if key is None:
        return -1
    if len(table) > 100_000:
        table.clear()
    new = table[key] = next(_NEXT_ID)
    return new


def _scrub(span: SpanRec) -> None:
    """Redact what every renderer shows of ``span`` (in place; a no-op on already clean values)."""
    attrs = _clean(span.attrs)
    if attrs is not None:
        span.attrs = attrs
    if isinstance(span.error, dict):
        error = _clean(span.error)
        if error is not None:
            span.error = error
    for event in span.events:
        if isinstance(event, dict) and isinstance(event.get("attrs"), dict):
            clean = _clean(event["attrs"])
            if clean is not None:
                event["attrs"] = clean


_RAW_KEYS: dict[tuple, str] = {}  # (phase, draft, group) as written -> the phase key, redacted


def _raw_key(attrs: dict[str, Any], name: str) -> str:
    """``phase_key`` of a span whose attrs were not redacted: as it reads once they are."""
    phase, draft, group = attrs.get(keys.PHASE), attrs.get(keys.IS_DRAFT) is True, attrs.get(keys.GROUP_NAME)
    raw: tuple | None = (phase, draft, group, name)
    try:
        hit = _RAW_KEYS.get(raw)
    except TypeError:  # a list value (a hand-written journal)
        hit, raw = None, None
    if hit is None:
        phase = (_redacted(keys.PHASE, phase) if phase else phase) or name
        group = _redacted(keys.GROUP_NAME, group) if group else group
        hit = key_text(phase, draft, group)
        if raw is not None:
            if len(_RAW_KEYS) > 100_000:
                _RAW_KEYS.clear()
            _RAW_KEYS[raw] = hit
    return hit


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
        ``running`` (something still open), or ``exited`` (nothing open, no root)."""
        proc = self.proc
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
    split: _Part | None = None  # a split run: lanes whose bars a forked child holds (``lanes_map``)

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
    """The latest record or span time of ``procs`` (``bounds``: a split run's child's, of all its spans)."""
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

    A ``split`` run (``RunView.split``): here the lanes of the processes a forked child holds have
    only the bars every verdict reads; whatever needs all of a lane's bars goes through ``lanes_map``."""
    split = run.split
    if split is not None and split.lost:
        split.whole()  # the child was lost: its processes are read here
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
    part = _Part.start(split, procs, untils, labels, trace_map, depth, attrs) if split is not None else None
    work = _Work(trace_map, depth, attrs)
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
        for parent_id in wanted - first_owner.keys():
            if parent_id in own:
                first_owner[parent_id] = own[parent_id]
    for bar, parent_id in elsewhere:
        bar.parent = first_owner.get(parent_id)
    starts = [min(map(_BAR_START, lane.bars)) for lane in lanes if lane.bars]
    starts += [min(bounds[p.path][0][: None if depth is None else depth + 1]) for p in procs if p.path in bounds]
    start = min(starts) if starts else horizon
    return Layout(run, lanes, start, max(horizon, start), part)


class _Work:
    """One process's bars (``layout``), in whichever process holds its spans whole."""

    def __init__(self, trace_map: dict[str, str], depth: int | None, attrs: bool) -> None:
        self.trace_map, self.depth, self.scrub = trace_map, depth, attrs
        # id(attrs as read) -> (attrs id, as shown, as read, a span name, its phase key): spans share
        # attrs objects (``bulk_decode._AttrsCache``), and their copies a name
        self.by_object: dict[int, tuple[int, dict[str, Any], dict[str, Any], str, str]] = {}
        self.taken: set[str] = set()

    def bars(self, proc: ProcessRec, until: int, elsewhere: list[tuple[Bar, str]]) -> tuple[list[Bar], dict[str, Bar]]:
        """``proc``'s bars in start order and by span id; those whose parent is elsewhere go in ``elsewhere``."""
        depth, scrub, trace_map, taken, by_object = self.depth, self.scrub, self.trace_map, self.taken, self.by_object
        ids = _IDS
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
                    _scrub(span)  # its attrs are clean: its error and events may not be
            elif scrub:  # most spans: attrs already seen clean (they repeat across copies and ranks)
                raw = attrs
                try:
                    seen = (tuple(attrs.items()), tuple(map(type, attrs.values())))
                    aid = ids.get(seen)
                except TypeError:  # a list value
                    seen = aid = None
                if aid is None:
                    _scrub(span)
                    if span.attrs is attrs:  # nothing to redact
                        aid = _new_id(ids, seen)
                    else:
                        attrs = span.attrs
                        shown = _attrs_key(attrs)
                        aid = _SHOWN_IDS.get(shown) if shown is not None else -1
                        if aid is None:
                            aid = _new_id(_SHOWN_IDS, shown)
                elif span.error is not None or span.events:
                    _scrub(span)  # its attrs are clean: its error and events may not be
                key = phase_key_of(attrs, span.name)
                by_object[id(raw)] = (aid, attrs, raw, span.name, key)  # ``raw`` held: its id is not reused meanwhile
            if trace_map and span.trace_id in trace_map:
                span.trace_id = trace_map[span.trace_id]
            if sid and sid not in taken:
                uid = sid
            else:
                uid = _rehash(sid, proc, taken)
            taken.add(uid)
            parent = own.get(parent_id) if parent_id else None
            end = span.end if span.end is not None else max(until, span.start)
            if not scrub:  # a phase key per attrs object and name (spans share attrs: ``bulk_decode._AttrsCache``)
                hit = by_object.get(id(attrs))
                if hit is not None and hit[3] == span.name:
                    key = hit[4]
                else:
                    key = _raw_key(attrs, span.name)
                    by_object[id(attrs)] = (-1, attrs, attrs, span.name, key)  # ``attrs`` held: its id stays its
            bar = Bar(span, uid, parent, level, end, key, aid)
            if parent_id and up is None:
                elsewhere.append((bar, parent_id))
            own[sid] = bar
            bars.append(bar)
        return bars, own


# -- a split run: the child's lanes, laid out and rendered where their spans are --------------------


class _Part:
    """The lanes of a split run's child: what it needs to lay them out as ``layout`` would have (sent
    as ``layout`` begins, so both lay out at once), and the lanes once made here (the child lost)."""

    _TOKENS = itertools.count(1)

    def __init__(self, split: Split, ctx: dict[str, Any], indices: set[int]) -> None:
        self.split, self.ctx, self.indices = split, ctx, indices
        self.pending = False  # the child is laying out (``_part_prepare``): its answer is yet to be read
        self.here: dict[int, Lane] | None = None  # index -> lane, laid out here (the child was lost)

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
    ) -> _Part:
        theirs = [i for i, proc in enumerate(procs) if proc.path in split.paths and proc.remote is None]
        wanted = {  # parents elsewhere of the child's roots (a root is never left out of a shallow state)
            span.parent_id
            for i in theirs
            for span in procs[i].spans.values()
            if span.parent_id and span.parent_id not in procs[i].spans
        }
        parents = {}  # span id -> its trace id, of those in the processes read here (ids are unique)
        for proc in procs:
            if wanted and proc.path not in split.paths:
                for sid in [sid for sid in wanted if sid in proc.spans]:
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
            self.here = {lane.index: lane for lane in _part_lanes(self.split.whole(), self.ctx)}
        return self.here


def _part_lanes(procs: dict[str, ProcessRec], ctx: dict[str, Any]) -> list[Lane]:
    """The lanes of ``procs`` (the child's processes, whole) as ``layout`` made them in one process."""
    work = _Work(ctx["trace_map"], ctx["depth"], ctx["attrs"])
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


_PART_LANES: dict[int, list[Lane]] = {}  # in the child: token -> its lanes


def _part_prepare(procs: dict[str, ProcessRec], ctx: dict[str, Any]) -> None:
    """In the child (``reader.load.Child.call``): lay out its lanes (``_part_job`` uses them)."""
    _PART_LANES[ctx["token"]] = _part_lanes(procs, ctx)


def _part_job(procs: dict[str, ProcessRec], arg: tuple) -> list[tuple[int, Any]]:
    """In the child (``reader.load.Child.call``): ``fn(lane, arg)`` for each of its lanes."""
    token, module, name, fn_arg = arg
    fn = getattr(importlib.import_module(module), name)
    return [(lane.index, fn(lane, fn_arg)) for lane in _PART_LANES[token]]


def lanes_map(lay: Layout, fn: Callable[[Lane, Any], Any], arg: Any = None) -> list[Any]:
    """``[fn(lane, arg) for lane in lay.lanes]``, with all of each lane's bars: the lanes a split
    run's child holds are done there, at the same time as the others here. ``fn`` is a module-level
    function; ``arg`` and its results are ``marshal`` data (numbers, text, bytes, lists, dicts)."""
    return _lanes_map(lay, fn, arg, None)


def lanes_held(lay: Layout, fn: Callable[[Lane, Any], list[tuple[Any, bytes]]], arg: Any = None) -> list[Any]:
    """``lanes_map`` of an ``fn`` that makes (key, bytes) pieces of a document (a large export),
    where the child keeps the bytes of its lanes' pieces: a ``Held`` (their size) stands for each,
    and ``write_pieces`` has the child write them into the output file where they go."""
    return _lanes_map(lay, fn, arg, _Held(lay.split, fn, arg) if lay.split is not None else None)


def _lanes_map(lay: Layout, fn: Callable[[Lane, Any], Any], arg: Any, held: _Held | None) -> list[Any]:
    part = lay.split
    if part is None:
        return [fn(lane, arg) for lane in lay.lanes]
    job = (part.ctx["token"], fn.__module__, fn.__qualname__, arg)
    asked = part.here is None and (
        part.split.call(_part_job, job) if held is None else part.split.call(_part_hold, (*job, held.token))
    )
    out: list[Any] = [fn(lane, arg) if lane.index not in part.indices else None for lane in lay.lanes]
    theirs: list[tuple[int, Any]] | None = None
    if asked:
        try:
            if part.pending:
                part.pending = False
                part.split.reply()  # its lanes laid out
            theirs = part.split.reply()
        except ChildLost:
            theirs = None
    if theirs is None:
        theirs = [(index, fn(lane, arg)) for index, lane in part.lanes_here().items()]
    elif held is not None:
        theirs = [(i, [(key, Held(held, i, n, size)) for n, (key, size) in enumerate(sizes)]) for i, sizes in theirs]
    for index, value in theirs:
        out[index] = value
    return out


class _Held:
    """The pieces one ``lanes_held`` left in the child (``_HELD`` there), and how to make them here."""

    _TOKENS = itertools.count(1)

    def __init__(self, part: _Part, fn: Callable[[Lane, Any], list[tuple[Any, bytes]]], arg: Any) -> None:
        self.part, self.fn, self.arg, self.token = part, fn, arg, next(self._TOKENS)

    def here(self, pieces: list[Held]) -> list[bytes]:
        """The bytes of ``pieces``, made here (the child was lost): the same, laid out the same way."""
        lanes = self.part.lanes_here()
        made = {index: self.fn(lanes[index], self.arg) for index in {p.index for p in pieces}}
        out = [made[p.index][p.n][1] for p in pieces]
        if any(len(data) != p.size for data, p in zip(out, pieces, strict=True)):
            raise RuntimeError("a lane's output made again differs from the child's")  # a bug: never written
        return out


class Held:
    """A piece of output a split run's child made and keeps (``lanes_held``): its size here."""

    __slots__ = ("index", "job", "n", "size")

    def __init__(self, job: _Held, index: int, n: int, size: int) -> None:
        self.job, self.index, self.n, self.size = job, index, n, size

    def __len__(self) -> int:
        return self.size


def resolve(chunks: Iterable[bytes | Held]) -> list[bytes]:
    """``chunks`` with each ``Held`` piece's bytes, sent back by the child (made here if it is lost)."""
    chunks = list(chunks)
    held = [c for c in chunks if isinstance(c, Held)]
    got: dict[int, bytes] = {}
    for job, pieces in _by_job(held).items():
        data = None
        if job.part.split.call(_part_fetch, (job.token, [(p.index, p.n) for p in pieces])):
            try:
                data = job.part.split.reply()
            except ChildLost:
                pass
        got.update(zip(map(id, pieces), data if data is not None else job.here(pieces), strict=True))
    return [got[id(c)] if isinstance(c, Held) else c for c in chunks]


def write_pieces(fd: int, chunks: Iterable[bytes | Held]) -> None:
    """``chunks`` one after the other into ``fd`` (a regular file opened for writing, at its start):
    the child writes the ``Held`` ones at their offsets while this process writes the rest; what
    the child could not write (it failed or died) is then made and written here."""
    mine, theirs, offset = [], [], 0
    for chunk in chunks:
        (theirs if isinstance(chunk, Held) else mine).append((offset, chunk))
        offset += len(chunk)
    places = {id(p): off for off, p in theirs}
    jobs = _by_job([p for _, p in theirs])
    asked = {
        job: job.part.split.call(_part_write, (job.token, [(p.index, p.n, places[id(p)]) for p in pieces]), fd)
        for job, pieces in jobs.items()
    }
    for off, data in mine:
        pwrite_all(fd, data, off)
    for job, pieces in jobs.items():
        if asked[job]:
            try:
                job.part.split.reply()
                continue
            except ChildLost:
                pass
        for p, data in zip(pieces, job.here(pieces), strict=True):  # what the child did not write
            pwrite_all(fd, data, places[id(p)])


def _by_job(pieces: list[Held]) -> dict[_Held, list[Held]]:
    out: dict[_Held, list[Held]] = {}
    for p in pieces:
        out.setdefault(p.job, []).append(p)
    return out


_HELD: dict[int, dict[int, list[bytes]]] = {}  # in the child: ``lanes_held`` token -> lane index -> its pieces


def _part_hold(procs: dict[str, ProcessRec], arg: tuple) -> list[tuple[int, list[tuple[Any, int]]]]:
    """In the child: ``_part_job``, keeping the pieces' bytes (``_HELD``) and sending their sizes."""
    *job, token = arg
    held = _HELD[token] = {}
    out = []
    for index, pieces in _part_job(procs, tuple(job)):
        held[index] = [data for _, data in pieces]
        out.append((index, [(key, len(data)) for key, data in pieces]))
    return out


def _part_fetch(procs: dict[str, ProcessRec], arg: tuple) -> list[bytes]:
    token, wanted = arg
    held = _HELD[token]
    return [held[index][n] for index, n in wanted]


def _part_write(procs: dict[str, ProcessRec], arg: tuple, fd: int) -> int:
    """In the child: write held pieces into the parent's file (``fd``, its copy) at their offsets."""
    token, places = arg
    held = _HELD.pop(token)
    for index, n, offset in places:
        pwrite_all(fd, held[index][n], offset)
    return len(places)
