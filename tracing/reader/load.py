"""Loading a run directory for the CLI: ``load_run``, and on a large run the read shared with a
forked helper (``refresh_parallel``, ``Child``: ``forked_helper`` does the forking and the talking),
which can keep its half whole and render its lanes itself (``Split``); ``index_run`` and the
spawned index writer's entry point (``_main``)."""

from __future__ import annotations

import os
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import fields
from itertools import repeat
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec

from .. import keys
from ..journal.bulk_decode import SpanRec, without_attrs
from ..journal.layout import JOURNAL_DIR
from ..journal.tail import JournalTail
from . import index
from .forked_helper import Helper, HelperLost, can_fork, job
from .view import ProcessRec, RunView, _apply_all, read_status, status_of


def refresh_parallel(
    view: RunView,
    final: bool = False,
    shallow: int | None = None,
    split: bool = False,
    write: bool = True,
    alone: bool = False,
) -> RunView:
    """``view.refresh``, a first read of a large run shared with a forked child (``Child``): the
    CLI's one-shot read, never a live watcher's thread (later reads: ``view.refresh``). ``shallow``:
    the reader draws spans down to that depth only (``status``, ``timeline``): the child leaves out
    the deeper ones that ended well (they are not needed, and are most of what it would send back).
    ``split``: the child keeps whole what it read and sends back what every verdict reads (a
    ``shallow`` read), and lays out and renders its processes' lanes on request (``view.split``,
    ``render.lane_jobs.lanes_map``): a verb that renders every span of a large run.

    A run directory's index (``reader.index``) stands for the journals it covers: each is decoded
    rather than parsed (only a tail it grew by is read), and a split read's parent takes the
    shallow state of the child's from it. ``write``: a finished run read without a usable index
    has one written (a small run's here, a large run's by a process that starts once this one is
    done with the view: ``index.spawn_writer``), and a first read waits (bounded) for such a process
    at work on it (``index.await_writer``). ``alone``: no child: a whole read (neither ``shallow``
    nor ``split``), which a child would send back entire, is quicker in one process (1.4 s against
    1.9 s at 1024 ranks)."""
    if view._tails:
        return view.refresh(final)
    view._status = {}
    if write:  # a writer at work on the index: it is cheaper to wait for it than to read beside it
        for path in view.paths:
            index.await_writer(path)
    journals = view.journals()
    used = {path: index.open_index(path, [j for j in journals if j.parent.parent == path]) for path in view.paths}
    try:
        _first_read(view, journals, used, final, shallow, split, alone)
    except index.Stale as exc:  # a part found damaged where it was decoded: said, and the journals read
        index.warn(exc.path, str(exc))
        if view.split is not None:
            view.split.child.abandon()
        view._tails, view._told, view.split = {}, [], None
        used = dict.fromkeys(view.paths)
        _first_read(view, journals, used, final, shallow, split, alone)
    tails = view._tails  # in the journals' order, as one process reads them (problems, exits told)
    view._tails = {path: tails[path] for path in journals if path in tails}
    view._told = [(proc, r) for _, proc in view._tails.values() for r in proc.told]
    if view._told:
        view._place_told()
    if write and index.needed(view, used):
        _write_index(view)
    return view


def _first_read(
    view: RunView,
    journals: list[Path],
    used: dict[Path, index.Loaded | None],
    final: bool,
    shallow: int | None,
    split: bool,
    alone: bool = False,
) -> None:
    """``refresh_parallel``'s read: each journal from its index (``used``) where one holds it."""
    indexed = view.indexed = {path: loaded for loaded in used.values() if loaded for path in loaded.journals}
    as_is = set() if split else {path for path in journals if _fresh(indexed, path)}
    rest = [path for path in journals if path not in as_is]  # to read: the child may take a share
    more = {"indexed": indexed} if indexed else {}
    if alone:
        child = None
    elif split:
        child = Child.start(rest, final, 0, serve=True, **more)
    else:
        child = Child.start(rest, final, shallow, **more)
    try:
        for path in as_is:  # decoded as indexed; a shallow reader takes the shallow state
            view._tails[path] = indexed[path].restore(path, shallow=shallow == 0)
        for path in rest[: child.first] if child is not None else rest:
            view._tails[path] = _read_whole(path, final, indexed)
        if child is not None:
            safe = split and _index_safe(view, journals, indexed)  # the index checked it when written
            got = child.collect(indexed, ids=not safe)
            if got is not None and child.serving and not safe and not _split_ok(view._tails, got, child.extras):
                got = _whole_from(child, got)  # a span id twice, or a reference into what it left out
                child.serving = False
            if got is None or not child.serving:
                child.abandon()
            else:
                view.split = Split(view, child, final)
            child = None
            for path, (tail, proc) in (got or {}).items():
                view._tails[path] = (tail, proc)
            for path in rest:  # what the child did not bring back (it failed): read here
                if path not in view._tails:
                    view._tails[path] = _read_whole(path, final, indexed)
    finally:
        if child is not None:  # interrupted while the child works: end it
            child.abandon()


def _index_safe(view: RunView, journals: list[Path], indexed: dict[Path, index.Loaded]) -> bool:
    """Every journal of the run (one directory) is as its index holds it, and the index found any
    split of them safe (``index._split_safe``: what ``_split_ok`` checks)."""
    return (
        len(view.paths) == 1
        and all(_fresh(indexed, path) for path in journals)
        and all(loaded.index.split_safe for loaded in {id(x): x for x in indexed.values()}.values())
    )


def _fresh(indexed: dict[Path, index.Loaded], path: Path) -> bool:
    loaded = indexed.get(path)
    return loaded is not None and loaded.journals[path][1] == index.FRESH


def _write_index(view: RunView) -> None:
    """A finished run's index, written for the next viewer: a small run's now (a few ms), a large
    one's by a detached process once this one closes the view (``index.spawn_writer``)."""
    try:
        size = sum(os.stat(path).st_size for path in view._tails)
    except OSError:
        return
    if size <= index.INLINE_BYTES:
        index_run(list(view.paths))
        return
    fd = index.spawn_writer(list(view.paths), "closed")
    if fd is not None:
        weakref.finalize(view, os.close, fd)


def index_run(
    paths: list[Path], allow_serving: bool = False, wait_s: float = 0.0, held: Sequence[int] = ()
) -> list[Path]:
    """Read the run (its index where usable) and write its index once the run has ended (waiting
    up to ``wait_s`` for its processes to end), or, with ``allow_serving``, while it serves; the
    paths written. The read is not ``final``: the index is right for live and final readers alike.
    ``held``: the run's lock (``index.hold``), let go before waiting for its end: a viewer waits
    for a writer at work, not for a launch to end."""
    view = refresh_parallel(RunView(*paths), final=False, write=False, alone=True)
    deadline = time.monotonic() + wait_s
    # a launcher's ranks end a moment after it; a launch_server's ranks learn within a beat that it serves
    while not (index.finished(view) or (allow_serving and index.serving(view))) and time.monotonic() < deadline:
        for fd in held:
            os.close(fd)
        held = ()
        time.sleep(0.5)
        view.refresh(final=False)
    done = index.finished(view)
    if not done and not (allow_serving and index.serving(view)):
        return []
    view.refresh(final=False)  # what was appended meanwhile
    return index.write(view, done, _levels, _shallow)


def load_run(
    path: Path | str, *more: Path | str, parallel: bool = False, shallow: int | None = None, split: bool = False
) -> RunView:
    """Everything in a finished (or abandoned) run directory, or in several as one launch (one
    directory per node). ``parallel``, ``shallow``, ``split``: see ``refresh_parallel`` (the CLI's verbs)."""
    paths = [Path(p) for p in (path, *more)]
    for p in paths:
        if not (p / JOURNAL_DIR).is_dir():
            raise FileNotFoundError(f"{p}: not a phasetrace run directory (no {JOURNAL_DIR}/ inside)")
    view = RunView(*paths)
    return refresh_parallel(view, True, shallow, split) if parallel else view.refresh(final=True)


_SPAN_ID = attrgetter("span_id")
_ATTRS_OF = attrgetter("attrs")
_PROC_FIELDS = tuple(f.name for f in fields(ProcessRec) if f.name not in ("path", "spans"))


_TAIL_FIELDS = ("offset", "lines", "problems", "unknown_kinds", "_unreadable", "_long", "_capped")


class Child:
    """The last part of a run's journals (``SHARE`` of the bytes), read by a forked helper
    (``forked_helper.Helper``) while this process reads the rest; the helper answers with each
    journal's state (``ProcessRec``, the reader's position and problems: ``_pack``). Used only where
    it pays and is safe: a run of ``MIN_BYTES`` or more, two usable cores, and a process that may
    fork (``forked_helper.can_fork``). Anything wrong (the helper failed, died, sent what cannot be
    unpacked) and this process reads those journals itself.

    ``serve``: the helper answers with a shallow state (what verdicts read), keeps the whole one, and
    then runs the jobs asked of it on its processes by path (``call``: ``fn(processes, arg)``, or
    ``fn(processes, arg, fd)`` with a file it writes its part of) until it is closed."""

    MIN_BYTES = 32 << 20
    SHARE = 0.45  # of the bytes: the parent also unpacks what the child read
    SHALLOW_SHARE = 0.5  # a ``shallow`` read: little is sent back
    # ``serve``: each lays out and renders what it read (the parent also opens the index and puts
    # the verdicts together); an indexed 1024-rank export at 0.6 had the parent wait 0.15 s for the
    # child, at 0.5 0.01-0.04 s. Journals not indexed: the child also packs the shallow state it
    # sends (0.14 s of 0.9 at 1024 ranks), and at 0.5 the parent waited 0.3 s for it
    SPLIT_SHARE = 0.5
    SPLIT_READ_SHARE = 0.45

    def __init__(self, helper: Helper, first: int, journals: list[Path]) -> None:
        self.helper, self.first, self.journals = helper, first, journals
        self.serving = helper.serving
        self.extras: dict[Path, tuple] = {}  # ``serve``: path -> (span ids, earliest starts by depth, latest time)

    @classmethod
    def start(
        cls,
        journals: list[Path],
        final: bool,
        shallow: int | None = None,
        serve: bool = False,
        indexed: dict[Path, index.Loaded] | None = None,
    ) -> Child | None:
        if not can_fork() or _cores() < 2:
            return None
        sizes = []
        for path in journals:
            try:
                sizes.append(os.stat(path).st_size)
            except OSError:
                sizes.append(0)
        total = sum(sizes)
        if total < cls.MIN_BYTES:
            return None
        first, done, known = len(journals), 0, indexed or {}
        if serve:
            share = cls.SPLIT_SHARE if all(_fresh(known, path) for path in journals) else cls.SPLIT_READ_SHARE
        else:
            share = cls.SHARE if shallow is None else cls.SHALLOW_SHARE
        while first > 1 and done + sizes[first - 1] <= total * share:
            first -= 1
            done += sizes[first]
        if first == len(journals):
            return None
        mine = journals[first:]

        def setup(answer: Callable[[Any], None]) -> dict[str, ProcessRec]:
            """In the helper: read, answer, and (``serve``) keep every process whole."""
            later = {path for path in mine if serve and _fresh(known, path)}  # the parent takes these from the index
            read = {path: _read_whole(path, final, known) for path in mine if path not in later}
            table: dict[int, int] = {}
            objects: list[dict[str, Any]] = []  # the attrs objects of every span sent, once each
            packs = [None if path in later else _pack(*read[path], shallow, serve, (table, objects)) for path in mine]
            answer((packs, objects))
            for path in later:  # decoded while the parent decodes its own
                read[path] = _read_whole(path, final, known)
            return {str(path): read[path][1] for path in mine}

        helper = Helper.start(setup, serve)
        return None if helper is None else cls(helper, first, mine)

    def collect(
        self, indexed: dict[Path, index.Loaded] | None = None, ids: bool = True
    ) -> dict[Path, tuple[JournalTail, ProcessRec]] | None:
        """The child's journals, or None when it failed (those it sent as None: from ``indexed``)."""
        try:
            packed, objects = self.helper.reply()
            if not self.serving and not self.helper.ended_well():
                return None
            got = {}
            for path, item in zip(self.journals, packed, strict=True):
                if item is None:
                    loaded = (indexed or {})[path]
                    got[path] = loaded.restore(path, shallow=True)
                    self.extras[path] = loaded.extras(path, ids)
                    continue
                got[path] = _unpack(path, item[:4], objects)
                if self.serving:
                    self.extras[path] = item[4]
            return got
        except (HelperLost, OSError, ValueError, TypeError, KeyError, msgspec.DecodeError):
            return None

    def call(self, fn: Callable[..., Any], arg: Any, fd: int | None = None) -> None:
        """Ask the child for ``fn(its processes, arg)`` (``reply`` takes the answer; ``Helper.call``)."""
        self.helper.call(fn, arg, fd)

    def reply(self) -> Any:
        """The answer to the oldest ``call``; ``HelperLost`` when there is none (it failed or died)."""
        return self.helper.reply()

    def abandon(self) -> None:
        self.helper.close()


class Split:
    """Processes a forked child read and holds whole, while this view holds them shallow (the spans
    every verdict reads, ``_shallow``): a renderer asks the child to lay out and render their lanes
    (``render.lane_jobs.lanes_map``), and only if the child is lost reads them again here (``whole``)."""

    def __init__(self, view: RunView, child: Child, final: bool) -> None:
        self.view, self.child, self.final = weakref.proxy(view), child, final  # the view holds this: no cycle
        self.paths = set(child.journals)
        # path -> (earliest start at each depth, latest end or start) of its spans (``layout``: the run's bounds)
        self.bounds = {path: (firsts, hi) for path, (_, firsts, hi) in child.extras.items() if hi is not None}
        self.lost = False
        self._whole: dict[str, ProcessRec] | None = None
        weakref.finalize(self, child.abandon)  # the view is dropped: the child ends (the CLI exits before)

    def call(self, fn: Callable[..., Any], arg: Any, fd: int | None = None) -> bool:
        """Ask the child for ``fn(its processes, arg)`` (``reply``; ``Child.call``); False when it is lost."""
        if not self.lost:
            try:
                self.child.call(fn, arg, fd)
                return True
            except HelperLost:  # it died, or the argument cannot be sent
                self.lost = True
        return False

    def reply(self) -> Any:
        try:
            return self.child.reply()
        except HelperLost:
            self.lost = True
            raise

    def whole(self) -> dict[str, ProcessRec]:
        """The child's processes, read whole in this process (the child is ended): the view then
        holds them whole too."""
        if self._whole is not None:
            return self._whole
        self.child.abandon()
        self.lost = True
        view = self.view
        old = {id(view._tails[path][1]) for path in self.paths if path in view._tails}
        view._told = [(teller, r) for teller, r in view._told if id(teller) not in old]
        for path in self.paths:
            view._tails.pop(path, None)
            try:
                read = _read_whole(path, self.final, view.indexed)
            except index.Stale as exc:  # its spans damaged in the index (the child died of it): the journal
                index.warn(exc.path, str(exc))
                read = _read_whole(path, self.final)
            _, proc = view._tails[path] = read
            view._told += [(proc, r) for r in proc.told]
        view._place_told()
        self._whole = {str(path): view._tails[path][1] for path in self.paths}
        return self._whole


def _whole_from(
    child: Child, got: dict[Path, tuple[JournalTail, ProcessRec]]
) -> dict[Path, tuple[JournalTail, ProcessRec]] | None:
    """``got`` (a shallow state) made whole with every span the child holds; None if it fails."""
    try:
        child.call(_all_spans, [str(path) for path in got])
        packed = child.reply()
        for (_, proc), spans in zip(got.values(), packed, strict=True):
            decoded = _SPANS.decode(spans)
            proc.spans, proc.dropped = dict(zip(map(_SPAN_ID, decoded), decoded, strict=True)), {}
    except (HelperLost, OSError, ValueError, TypeError, msgspec.DecodeError):
        return None
    return got


@job
def _all_spans(procs: dict[str, ProcessRec], paths: list[str]) -> list[bytes]:
    """In the child (``Child.call``): every span of each process, as ``_pack`` sends them."""
    return [msgspec.msgpack.encode(list(procs[path].spans.values())) for path in paths]


def _split_ok(
    tails: dict[Path, tuple[JournalTail, ProcessRec]],
    got: dict[Path, tuple[JournalTail, ProcessRec]],
    extras: dict[Path, tuple],
) -> bool:
    """Each half can lay out its lanes alone: no span id is empty or used twice in the run (a
    layout would make new ones, in process order), and no span the parent read has its parent
    among those the child left out."""
    theirs = [sid for ids, _, _ in extras.values() for sid in ids]
    mine = [sid for _, proc in tails.values() for sid in proc.spans]
    their_set, my_set = set(theirs), set(mine)
    if len(their_set) != len(theirs) or len(my_set) != len(mine) or "" in their_set or "" in my_set:
        return False
    if not their_set.isdisjoint(my_set):
        return False
    sent = {sid for _, proc in got.values() for sid in proc.spans}
    for _, proc in tails.values():
        for span in proc.spans.values():
            up = span.parent_id
            if up and up not in proc.spans and up in their_set and up not in sent:
                return False
    return True


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _read_whole(
    path: Path, final: bool, indexed: dict[Path, index.Loaded] | None = None
) -> tuple[JournalTail, ProcessRec]:
    """A journal read whole: decoded from its index up to where it was indexed, the rest read."""
    loaded = (indexed or {}).get(path)
    if loaded is None:
        tail, proc = JournalTail(path), ProcessRec(path)
    else:
        tail, proc = loaded.restore(path)
        if loaded.journals[path][1] == index.FRESH:
            return tail, proc
    for piece in tail.bulk_pieces(final=final):
        _apply_all(tail, proc, piece)
    if proc.root is not None and proc.root.status == "open":  # its root's ``end`` lost: the status file's word
        proc.mend(read_status(status_of(path))[0])
    if tail.unreadable is not None and not proc.pid:  # still a process of the run (``ProcessRec.unread``)
        proc.unread(tail.unreadable, read_status(status_of(path))[0])
    return tail, proc


def _pack(
    tail: JournalTail,
    proc: ProcessRec,
    shallow: int | None,
    extras: bool,
    attrs: tuple[dict[int, int], list[dict[str, Any]]],
) -> tuple:
    """One journal's state, as ``_unpack`` takes it back: the spans as msgpack without their attrs
    (decoded in C by the parent, straight into ``SpanRec``s), each one's attrs as its place in
    ``attrs`` (id of an attrs object -> its place; the objects, sent once for all journals: a rank
    root's 20 KB server arguments are one object shared by its copies), the rest as plain data.
    ``extras``: also every span id, the earliest start at each depth and the latest end or start
    (``Split``)."""
    levels = _levels(proc.spans) if shallow is not None or extras else {}
    spans = list(proc.spans.values()) if shallow is None else _shallow(proc, shallow, levels)
    table, objects = attrs
    ids = []
    for value in map(_ATTRS_OF, spans):
        at = table.get(id(value))
        if at is None:
            at = table[id(value)] = len(objects)
            objects.append(value)  # held: its id is not reused meanwhile
        ids.append(at)
    packed = (
        [getattr(tail, name) for name in _TAIL_FIELDS],
        [getattr(proc, name) for name in _PROC_FIELDS],
        msgspec.msgpack.encode(without_attrs(spans)),
        ids,
    )
    if not extras:
        return packed
    firsts: list[int] = []  # by depth: the earliest start of a span at that depth
    hi = None
    for sid, span in proc.spans.items():
        level = levels[sid]
        if level == len(firsts):
            firsts.append(span.start)
        elif span.start < firsts[level]:
            firsts[level] = span.start
        t = span.end or span.start
        hi = t if hi is None or t > hi else hi
    return (*packed, (list(proc.spans), firsts, hi))


def _levels(spans: dict[str, SpanRec]) -> dict[str, int]:
    """Span id -> its depth in its process (0: a root, or its parent is elsewhere), as ``layout`` counts."""
    levels: dict[str, int] = {}
    for sid, span in spans.items():
        up = levels.get(span.parent_id) if span.parent_id else None
        levels[sid] = up + 1 if up is not None else 0
    return levels


def _shallow(proc: ProcessRec, depth: int, levels: dict[str, int]) -> list[SpanRec]:
    """The spans a reader drawing down to ``depth`` needs, and every span a verdict reads
    (``diagnose``, ``postmortem``, ``hints``, ``verdicts.findings``), in their order, with their ancestors
    (so depths read from the spans sent are the same): those down to ``depth``; the open or failed
    ones; graph-capture steps that ended under an open one (the progress estimate); each phase's latest
    (whether a recorded verdict still holds); the latest to end, and any ending at the process's
    last record (where it was when it ended). Of the rest, which all ended well, ``proc.dropped``
    keeps how many there were per phase and the latest end (whether its peers left a rank behind).
    A process that is not a rank (a launcher: a few spans) is sent whole. ``levels``: ``_levels``."""
    spans = proc.spans
    if proc.role != "rank":
        return list(spans.values())
    latest: dict[str, str] = {}  # phase -> its latest span
    last = min(proc.last_t, max((s.end for s in spans.values() if s.end is not None), default=proc.last_t))
    wanted: list[str] = []
    phase_of = keys.PHASE
    for sid, span in spans.items():
        parent_id, level = span.parent_id, levels[sid]
        attrs, end = span.attrs, span.end
        latest[attrs.get(phase_of, span.name)] = sid
        if (
            level <= depth
            or end is None
            or end >= last
            or span.status != "ok"
            or (keys.SHAPE_INDEX in attrs and (parent := spans.get(parent_id or "")) is not None and parent.end is None)
        ):
            wanted.append(sid)
    keep: set[str] = set()
    for sid in (*wanted, *latest.values()):
        while sid is not None and sid not in keep:  # with its ancestors in this process
            keep.add(sid)
            sid = spans[sid].parent_id if sid in spans else None
    proc.dropped = proc.ended_phases(keep)  # all that is not kept ended (a whole state: nothing dropped yet)
    return [span for sid, span in spans.items() if sid in keep]


def _unpack(path: Path, item: tuple, objects: list[dict[str, Any]]) -> tuple[JournalTail, ProcessRec]:
    tail_state, proc_state, spans, ids = item
    tail, proc = JournalTail(path), ProcessRec(path)
    for name, value in zip(_TAIL_FIELDS, tail_state, strict=True):
        setattr(tail, name, value)
    for name, value in zip(_PROC_FIELDS, proc_state, strict=True):
        setattr(proc, name, value)
    decoded = _SPANS.decode(spans)
    if len(ids) != len(decoded):
        raise ValueError(f"{path.name}: {len(decoded)} spans, {len(ids)} attrs")
    deque(map(setattr, decoded, repeat("attrs"), map(objects.__getitem__, ids)), 0)
    proc.spans = dict(zip(map(_SPAN_ID, decoded), decoded, strict=True))
    return tail, proc


_SPANS = msgspec.msgpack.Decoder(list[SpanRec])


def _main(argv: list[str] | None = None) -> int:
    """``python -m ...reader.load [--wait-fd N] [--serving] RUN_DIR...``: write a run's index
    (``index.spawn_writer`` starts it detached; it waits until the pipe ``N`` closes)."""
    import argparse
    import select
    import signal

    parser = argparse.ArgumentParser(prog=f"python -m {__name__}", description="write a run's index")
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--wait-fd", type=int, help="wait until this pipe closes (its writer exited)")
    parser.add_argument("--serving", action="store_true", help="also while every rank is ready and serving")
    args = parser.parse_args(argv)
    # Not a child of whoever spawned it: SGLang's shutdown kills its launcher's whole process tree.
    if hasattr(os, "fork") and os.fork() > 0:
        os._exit(0)
    if args.wait_fd is not None:
        select.select([args.wait_fd], [], [], index.WAIT_S)
        os.close(args.wait_fd)
    held = index.hold(args.run_dirs)
    if held is None:  # another writer is at work on it
        return 0
    try:
        os.nice(10)
    except OSError:
        pass
    signal.alarm(index.WRITE_LIMIT_S)
    index_run(args.run_dirs, args.serving, index.ENDED_WAIT_S, held)
    return 0


if __name__ == "__main__":  # run with -m: the module's own copy, as every importer has it
    from . import load

    raise SystemExit(load._main())
