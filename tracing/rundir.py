"""A run directory, read back: processes, their phases as span records, heartbeats, diagnoses.

Layout (one run = one launch)::

    RUN_DIR/
      journal/<host>-<pid>.jsonl          one journal per process (see ``tracing.journal``)
      journal/watch-<host>-<pid>.jsonl    a ``phasetrace watch``'s own (its diagnoses)
      status/<host>-<pid>.json            latest heartbeat of each process, atomically replaced
      stacks/<host>-<pid>.txt             faulthandler stack dumps, on the watchdog's request or a user's signal
      stacks/<host>-<pid>-py-spy-<t>.txt  a py-spy dump the watchdog took (``t``: Unix time in seconds)

Shared by the watchdog (live, incremental ``refresh()``) and the CLI (one ``load_run``). Journals
may be cut by ``kill -9`` or hold a corrupt line or a record of the wrong shape: each such line is
reported once as ``file:line: why`` in ``problems`` and skipped, and everything else is used. What
reaches ``ProcessRec.apply`` passed ``records.validate``, so it can rely on the schema's types.
"""

from __future__ import annotations

import importlib
import marshal
import os
import socket
import sys
import threading
import weakref
from collections.abc import Callable, Container
from dataclasses import dataclass, field, fields
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec

from . import keys
from .journal import JournalTail, _loads, read_regular
from .records import SpanRec, span_from, trim, validate

__all__ = ["ProcessRec", "RunView", "SpanRec", "load_run"]

JOURNAL_DIR, STATUS_DIR, STACKS_DIR = "journal", "status", "stacks"
STATUS_MAX = 1 << 20  # bytes read of a status file (a heartbeat is a few KiB)
_PROGRESS_KINDS = frozenset({"begin", "end", "event", "collective", "process"})  # ``process``: its journal began


@dataclass
class ProcessRec:
    path: Path
    pid: int = 0
    host: str = ""
    boot_t: int | None = None
    role: str = "process"
    label: str = ""
    identity: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)
    spans: dict[str, SpanRec] = field(default_factory=dict)  # in start order
    heartbeats: list[dict[str, Any]] = field(default_factory=list)  # the latest few
    diagnoses: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    last_t: int = 0  # time of the latest record of any kind
    # latest phase begin/end/event, collective, heartbeat progress change, or the journal's start (a
    # rank's ``rank.bootstrap`` begins backdated to its process start: its import time is not a stall)
    last_progress_t: int = 0
    coll_counts: dict[str, int] = field(default_factory=dict)  # group -> collectives entered
    coll_ops: dict[str, dict[int, str]] = field(default_factory=dict)  # group -> seq -> op (recent)
    coll_open: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)  # entered, not left
    start_ticks: int | None = None  # with boot_id: recognises the process later (``tracing.procs``)
    boot_id: str | None = None
    exit: dict[str, Any] | None = None  # the ``exit`` record another process wrote about this one
    told: list[dict[str, Any]] = field(default_factory=list)  # ``exit`` records about others
    launch: dict[str, Any] | None = None  # the ``launch`` record a node's launcher wrote (multi-node)
    remote: str | None = None  # set for a process another node reported (``tracing.crossnode``)
    # phase -> [how many, latest end] of the spans that ended well and a shallow read left out (``_shallow``)
    dropped: dict[str, list[int]] = field(default_factory=dict)

    HEARTBEATS_KEPT = 8
    OPS_KEPT = 256

    def apply(self, r: dict[str, Any]) -> None:
        """Use one record that ``records.validate`` accepted (never raises on one): optional
        fields may be missing or null, and mean "not known"."""
        kind, t = r["kind"], r["t"]
        if t > self.last_t:
            self.last_t = t
        if t > self.last_progress_t and kind in _PROGRESS_KINDS:
            self.last_progress_t = t
        if kind == "collective":
            self._collective(r["group"], r["seq"], r["op"], r["edge"], t)
        elif kind == "begin":
            span = self.spans[r["span"]] = span_from(r)
            span.attrs = dict(span.attrs)
        elif kind == "end":
            span = self.spans.get(r["span"])
            if span is not None:
                span.end, span.status = t, r.get("status") or "ok"
                span.attrs = {**span.attrs, **(r.get("attrs") or {})}  # shared (``records._AttrsCache``)
                span.error = r.get("error")
        elif kind == "event":
            span = self.spans.get(r["span"])
            if span is not None:
                span.events.append({"t": t, "name": r.get("name"), "attrs": r.get("attrs") or {}})
        elif kind == "heartbeat":
            if self.heartbeats and _progress(r) != _progress(self.heartbeats[-1]):
                self.last_progress_t = max(self.last_progress_t, t)
            self.heartbeats.append(r)
            del self.heartbeats[: -self.HEARTBEATS_KEPT]
        elif kind == "identity":
            self.role, self.label = r.get("role") or self.role, r.get("label") or self.label
            self.identity = dict(r.get("attrs") or {})
        elif kind == "process":
            self.pid, self.host = r["pid"], r.get("host") or ""
            self.boot_t, self.resource = r.get("boot_t"), dict(r.get("resource") or {})
            self.start_ticks, self.boot_id = r.get("start_ticks"), r.get("boot_id")
            self.label = self.label or f"pid{self.pid}"
        elif kind == "diagnosis":
            self.diagnoses.append(r)
        elif kind == "warning":
            self.warnings.append(r["message"])
        elif kind == "exit":
            self.told.append(r)
        elif kind == "launch":
            self.launch = r

    def _collective(self, group: str, seq: int, op: str, edge: str, t: int) -> None:
        if edge == "exit":
            self.coll_open.pop((group, seq), None)
            return
        self.coll_counts[group] = max(self.coll_counts.get(group, 0), seq)
        ops = self.coll_ops.setdefault(group, {})
        ops[seq] = op
        if len(ops) > self.OPS_KEPT:
            del ops[min(ops)]
        self.coll_open[(group, seq)] = {"op": op, "group": group, "seq": seq, "t": t}

    def ended(self, phase: str) -> tuple[int, int | None]:
        """How many spans of ``phase`` ended, and the latest end: those a shallow read left out included."""
        ends = [s.end for s in self.spans.values() if s.end is not None and s.phase == phase]
        n, last = self.dropped.get(phase, (0, 0))
        return len(ends) + n, max([*ends, last]) if ends or n else None

    def ended_phases(self, sent: Container[str] = ()) -> dict[str, list[int]]:
        """Per phase, how many of its spans ended and the latest end: those not in ``sent`` (span
        ids kept elsewhere) and those a shallow read already left out (``dropped``)."""
        out = {phase: list(n_last) for phase, n_last in self.dropped.items()}
        for sid, span in self.spans.items():
            if span.end is not None and sid not in sent:
                got = out.setdefault(span.phase, [0, 0])
                got[0] += 1
                if span.end > got[1]:
                    got[1] = span.end
        return out

    @property
    def waiting_in(self) -> dict[str, Any] | None:
        """The oldest collective this process entered and has not left."""
        return min(self.coll_open.values(), key=lambda c: c["t"]) if self.coll_open else None

    @property
    def shown(self) -> bool:
        """Readers list it: a rank, a launcher, or any process with phases or something to say. An SGLang
        helper process that started tracing early (at import) and never ran a phase is left out."""
        return self.role != "process" or bool(self.spans or self.warnings or self.diagnoses or self.told)

    @property
    def open_spans(self) -> list[SpanRec]:
        return [s for s in self.spans.values() if s.status == "open"]

    @property
    def current(self) -> SpanRec | None:
        """The innermost open phase (latest started among open ones)."""
        spans = self.open_spans
        return spans[-1] if spans else None

    @property
    def root(self) -> SpanRec | None:
        for span in self.spans.values():
            if span.attrs.get(keys.PHASE) in keys.ROOT_PHASES:
                return span
        return None

    @property
    def ready(self) -> bool:
        root = self.root
        return root is not None and root.status == "ok"

    @property
    def node(self) -> int | None:
        """The node of a multi-node launch this process runs on (None: single node, or not known)."""
        value = self.identity.get(keys.NODE_RANK)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def who(self) -> str:
        """``pid 4242``, or ``pid 4242 on node-1`` in a multi-node launch: how verdicts name a process."""
        node = self.node
        return f"pid {self.pid}" if node is None else f"pid {self.pid} on node-{node}"

    @property
    def last_heartbeat(self) -> dict[str, Any] | None:
        return self.heartbeats[-1] if self.heartbeats else None

    def sort_key(self) -> tuple:
        i = self.identity
        order = {"launcher": 0, "rank": 1}.get(self.role, 2)
        ranks = tuple(
            i.get(k, -1) if isinstance(i.get(k), int) else -1
            for k in (keys.DP_RANK, keys.PP_RANK, keys.TP_RANK, keys.WORLD_RANK)
        )
        return (order, self.node or 0, ranks, self.host, self.pid)


def _progress(heartbeat: dict[str, Any]) -> list:
    return [(p.get("span"), p["progress"]) for p in heartbeat.get("phases") or () if p.get("progress")]


def node_of(proc: ProcessRec) -> int | None:
    """The node of a multi-node launch a journal's process runs on: its identity's, else its
    resource's (every process of a node has it from its first line; a rank's identity may not yet)."""
    node = proc.node
    if node is None:
        value = proc.resource.get(keys.NODE_RANK)
        node = value if type(value) is int else None
    return node


class RunView:
    """A run directory as processes; ``refresh()`` reads only what was appended since last time.

    Several directories make one view: a multi-node launch writes one per node (each node's launcher
    and its ranks), copied together afterwards. ``path`` is the first; each process's status file
    is looked up in its own directory. Their clocks may differ: nothing here compares times across
    processes."""

    def __init__(self, path: Path | str, *more: Path | str) -> None:
        unique: dict[str, Path] = {}  # a directory given twice (two spellings) is read once
        for p in (path, *more):
            unique.setdefault(os.path.realpath(p), Path(p))
        self.paths = tuple(unique.values())
        self.path = self.paths[0]
        self._tails: dict[Path, tuple[JournalTail, ProcessRec]] = {}
        self._status_problems: dict[Path, str] = {}  # status file -> the problem said about it
        self._status: dict[Path, dict[str, Any] | None] = {}  # status file -> as read since the last refresh
        self._told: list[tuple[ProcessRec, dict[str, Any]]] = []  # (teller, ``exit`` record)
        self.remote: dict[str, list[ProcessRec]] = {}  # source (e.g. ``node-1``) -> processes it reported
        self.split: Split | None = None  # a forked child holds some processes whole (``refresh(split=True)``)

    @property
    def run_id(self) -> str:
        """The directory's name; ``a+b`` for several (one per node)."""
        return "+".join(dict.fromkeys(p.name for p in self.paths))

    def refresh(
        self, final: bool = False, parallel: bool = False, shallow: int | None = None, split: bool = False
    ) -> RunView:
        """Read what was appended. ``parallel``: a first read of a large run is shared with a forked
        child (``_Child``): the CLI's one-shot read, never a live watcher's thread. ``shallow``: the
        reader draws spans down to that depth only (``status``, ``timeline``): the child leaves out the deeper
        ones that ended well (they are not needed, and are most of what it would send back).
        ``split`` (with ``parallel``): the child keeps whole what it read and sends back what every
        verdict reads (a ``shallow`` read), and lays out and renders its processes' lanes on request
        (``self.split``, ``render.lanes.lanes_map``): a verb that renders every span of a large run."""
        self._status = {}  # read again when next asked: fresher than the journals
        if self.split is not None:  # read more of a split view: whole, here
            self.split.whole()
            self.split = None
        journals = [
            path
            for run_path in self.paths
            if (journal_dir := run_path / JOURNAL_DIR).is_dir()
            for path in sorted(journal_dir.glob("*.jsonl"))
        ]
        if not (parallel and not self._tails):
            child = None
        elif split:
            child = _Child.start(journals, final, 0, serve=True)
        else:
            child = _Child.start(journals, final, shallow)
        try:
            for path in journals[: child.first] if child is not None else journals:
                self._read(path, final)
            if child is not None:
                got = child.collect()
                if got is not None and child.serving and not _split_ok(self._tails, got, child.extras):
                    got = _whole_from(child, got)  # a span id twice, or a reference into what it left out
                    child.serving = False
                if got is None or not child.serving:
                    child.abandon()
                else:
                    self.split = Split(self, child, final)
                child = None
                for path, (tail, proc) in (got or {}).items():
                    self._tails[path] = (tail, proc)
                    self._told += [(proc, r) for r in proc.told]
                for path in journals:  # what the child did not bring back (it failed): read here
                    if path not in self._tails:
                        self._read(path, final)
        finally:
            if child is not None:  # interrupted while the child works: end it
                child.abandon()
        if self._told:
            self._place_told()
        return self

    def _read(self, path: Path, final: bool) -> None:
        if path not in self._tails:
            self._tails[path] = (JournalTail(path), ProcessRec(path))
        tail, proc = self._tails[path]
        told = len(proc.told)
        for piece in tail.bulk_pieces(final=final):
            _apply_all(tail, proc, piece)
        self._told += [(proc, r) for r in proc.told[told:]]

    def dir_of(self, proc: ProcessRec) -> Path:
        """The run directory holding ``proc``'s journal (the first one for another node's report)."""
        if len(self.paths) > 1 and proc.remote is None and proc.path in self._tails:
            return proc.path.parent.parent
        return self.path

    def _place_told(self) -> None:
        """Put each ``exit`` record on the process it is about."""
        by_id = {(p.host, p.pid): p for _, p in self._tails.values() if p.pid}
        for teller, r in self._told:
            proc = by_id.get((r.get("host") or teller.host, r["pid"]))
            if proc is not None:
                proc.exit = r

    def set_remote(self, source: str, processes: list[ProcessRec]) -> None:
        """Processes another node reported (``tracing.crossnode``), replacing what it said before."""
        self.remote[source] = processes

    @property
    def processes(self) -> list[ProcessRec]:
        """The journals' processes and those other nodes reported. A report stands in for a journal
        with the same (host, pid) only where both say they are of the reporting node (a shared run
        directory: the report's times are on our clock); any other journal, this node's own above
        all, is judged from the journal, and the report's copy is left out (as is a second report)."""
        local = [p for _, p in self._tails.values() if p.pid and p.shown]
        if not self.remote:
            return sorted(local, key=ProcessRec.sort_key)
        journals = {(p.host, p.pid): p for p in local}
        replaced, reported = set(), {}
        for ps in self.remote.values():
            for p in ps:
                key = (p.host, p.pid)
                twin = journals.get(key)
                if not p.shown or key in reported:
                    continue
                if twin is not None:
                    owner = node_of(twin)
                    if owner is None or owner != p.node:  # not the reporter's own journal: it stays
                        continue
                    replaced.add(key)
                reported[key] = p
        local = [p for p in local if (p.host, p.pid) not in replaced]
        return sorted(local + list(reported.values()), key=ProcessRec.sort_key)

    @property
    def trace_map(self) -> dict[str, str]:
        """Trace ids a node's spans started with -> the launch's trace id (``launch`` records)."""
        out = {}
        for _, p in self._tails.values():
            r = p.launch
            if r is not None and r.get("local_trace") and r["local_trace"] != r["trace"]:
                out[r["local_trace"]] = r["trace"]
        return out

    @property
    def ranks(self) -> list[ProcessRec]:
        return [p for p in self.processes if p.role == "rank"]

    @property
    def problems(self) -> list[str]:
        return [problem for tail, _ in self._tails.values() for problem in tail.problems] + list(
            self._status_problems.values()
        )

    def status_file(self, proc: ProcessRec) -> dict[str, Any] | None:
        """The process's latest heartbeat from its status file (fresher than the journal's), if it
        is a valid ``heartbeat`` record; a bad one is reported once in ``problems``. Read once per
        ``refresh`` (every verdict of a pass reads the same)."""
        path = self.dir_of(proc) / STATUS_DIR / f"{proc.path.stem}.json"
        if path in self._status:
            return self._status[path]
        record = self._status[path] = self._read_status(path)
        return record

    def _read_status(self, path: Path) -> dict[str, Any] | None:
        try:
            record = _loads(read_regular(path, limit=STATUS_MAX))
        except FileNotFoundError:
            return None
        except OSError as exc:
            return self._status_problem(path, f"cannot read ({exc.strerror or exc})")
        except ValueError as exc:  # orjson's JSONDecodeError; UnicodeDecodeError
            return self._status_problem(path, f"not a JSON record ({exc.__class__.__name__}: {exc})")
        why = validate(record)
        if why is None and record["kind"] != "heartbeat":
            why = f"a {record['kind']} record, not a heartbeat"
        return trim([record])[0] if why is None else self._status_problem(path, f"heartbeat: {why}")

    def _status_problem(self, path: Path, why: str) -> None:
        self._status_problems.setdefault(path, f"{path}:1: {why}")
        return None


def _apply_all(tail: JournalTail, proc: ProcessRec, chunk: tuple[dict[str, list[Any]], list[dict[str, Any]]]) -> None:
    """Apply a piece (``JournalTail.bulk_pieces``): its bulk begins, then its other records in order,
    then its bulk ends, events and collectives (each kind in file order: one kind never waits for
    another, but an ``end`` needs its ``begin``). A record that ``apply`` cannot use (a gap between
    the schema and ``apply``: a bug) is reported as ``file:line`` and the rest is still used."""
    bulk, records = chunk
    spans = proc.spans
    latest = 0  # of begin/end/event/collective records: their times count for ``last_t`` and progress
    if begins := bulk.get("begin"):
        spans.update(zip(map(_SPAN_ID, begins), begins, strict=True))
        latest = max(map(_START, begins))
    for i, r in enumerate(records):  # other kinds, and bulk kinds written otherwise than by ``journal.dumps``
        try:
            proc.apply(r)
        except Exception as exc:
            tail.problems.append(f"{tail.path}:{tail.line_of(i)}: {r['kind']} record not used ({exc!r})")
    for kind in ("end", "event", "collective"):
        items = bulk.get(kind)
        if not items:
            continue
        latest = max(latest, max(map(_T, items)))
        try:
            if kind == "end":
                for e in items:
                    if (span := spans.get(e.span)) is not None:
                        span.end, span.status, span.error = e.t, e.status or "ok", e.error
                        if e.attrs:
                            span.attrs = _merged(span.attrs, e.attrs)
            elif kind == "event":
                for e in items:
                    if (span := spans.get(e.span)) is not None:
                        span.events.append({"t": e.t, "name": e.name, "attrs": e.attrs or {}})
            else:
                collective = proc._collective
                for c in items:
                    collective(c.group, c.seq, c.op, c.edge, c.t)
        except Exception as exc:
            tail.problems.append(f"{tail.path}: {kind} records not used ({exc!r})")
    if latest > proc.last_t:  # both are maxima: the order records were applied in does not matter
        proc.last_t = latest
    if latest > proc.last_progress_t:
        proc.last_progress_t = latest


_SPAN_ID, _START, _T = attrgetter("span_id"), attrgetter("start"), attrgetter("t")


def _merged(attrs: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """A span's attrs with its ``end`` record's: a new dict, one per pair, since both are shared
    (``records._AttrsCache``) — spans with equal attrs keep sharing one (renderers cache by it)."""
    key = (id(attrs), id(more))
    hit = _MERGED.get(key)
    if hit is not None and hit[0] is attrs and hit[1] is more:  # both held: ids not reused meanwhile
        return hit[2]
    if len(_MERGED) > 100_000:
        _MERGED.clear()
    merged = {**attrs, **more}
    _MERGED[key] = (attrs, more, merged)
    return merged


_MERGED: dict[tuple[int, int], tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {}


def load_run(
    path: Path | str, *more: Path | str, parallel: bool = False, shallow: int | None = None, split: bool = False
) -> RunView:
    """Everything in a finished (or abandoned) run directory, or in several as one launch (one
    directory per node). ``parallel``, ``shallow``, ``split``: see ``RunView.refresh`` (the CLI's verbs)."""
    paths = [Path(p) for p in (path, *more)]
    for p in paths:
        if not (p / JOURNAL_DIR).is_dir():
            raise FileNotFoundError(f"{p}: not a phasetrace run directory (no {JOURNAL_DIR}/ inside)")
    return RunView(*paths).refresh(final=True, parallel=parallel, shallow=shallow, split=split)


# -- reading a large run on two cores -------------------------------------------------------------

_PROC_FIELDS = tuple(f.name for f in fields(ProcessRec) if f.name not in ("path", "spans"))
_TAIL_FIELDS = ("offset", "lines", "problems", "unknown_kinds", "_unreadable", "_long", "_capped")


class _Child:
    """A forked child that reads the last part of a run's journals (``SHARE`` of the bytes) while
    the parent reads the rest, and sends back each journal's state (``ProcessRec``, the reader's
    position and problems) over a pipe (``_pack``). Used only where it pays and is safe: a run of
    ``MIN_BYTES`` or more, two usable cores, Linux (``os.fork``), and no other thread in the
    process. Anything wrong (the child failed, died, sent what cannot be unpacked) and the parent
    reads those journals itself.

    ``serve``: the child sends back a shallow state (what verdicts read), keeps the whole one, and
    then runs what the parent asks of its processes (``call``: a function named by module and name,
    ``fn(processes by path, arg)``, or ``fn(processes, arg, fd)`` with a descriptor the parent
    passes over a socket: a file the child writes its part of) until the parent closes the pipe."""

    MIN_BYTES = 32 << 20
    SHARE = 0.45  # of the bytes: the parent also unpacks what the child read
    SHALLOW_SHARE = 0.5  # a ``shallow`` read: little is sent back
    PIPE_BYTES = 1 << 20
    SPLIT_SHARE = 0.5  # ``serve``: each lays out and renders what it read (the parent also unpacks the shallow state)

    def __init__(
        self, pid: int, fd: int, first: int, journals: list[Path], cmd: int = -1, fds: socket.socket | None = None
    ) -> None:
        self.pid, self.first, self.journals = pid, first, journals
        self.pipe = os.fdopen(fd, "rb")
        self.cmd = os.fdopen(cmd, "wb") if cmd >= 0 else None
        self.fds = fds  # ``serve``: descriptors for the child (``call(..., fd=)``)
        self.serving = cmd >= 0
        self.extras: dict[Path, tuple] = {}  # ``serve``: path -> (span ids, earliest starts by depth, latest time)

    @classmethod
    def start(cls, journals: list[Path], final: bool, shallow: int | None = None, serve: bool = False) -> _Child | None:
        if not sys.platform.startswith("linux") or threading.active_count() > 1 or _cores() < 2:
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
        first, done = len(journals), 0
        share = cls.SPLIT_SHARE if serve else cls.SHARE if shallow is None else cls.SHALLOW_SHARE
        while first > 1 and done + sizes[first - 1] <= total * share:
            first -= 1
            done += sizes[first]
        if first == len(journals):
            return None
        r, w = os.pipe()
        cmd_r, cmd_w = os.pipe() if serve else (-1, -1)
        fds = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) if serve else ()
        _widen(w)
        if serve:
            _widen(cmd_w)
        try:
            pid = os.fork()
        except OSError:
            for fd in (r, w, cmd_r, cmd_w):
                if fd >= 0:
                    os.close(fd)
            for sock in fds:
                sock.close()
            return None
        if pid == 0:  # the child: read, send, (serve,) exit without running anything of the parent's
            code = 1
            try:
                os.close(r)
                if serve:
                    os.close(cmd_w)
                    fds[0].close()
                mine = journals[first:]
                read = [_read_whole(path, final) for path in mine]
                with os.fdopen(w, "wb") as out:
                    _send(out, [_pack(tail, proc, shallow, serve) for tail, proc in read])
                    if serve:
                        with os.fdopen(cmd_r, "rb") as cmd:
                            procs = {str(path): proc for path, (_, proc) in zip(mine, read, strict=True)}
                            _serve(cmd, out, procs, fds[1])
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        if serve:
            os.close(cmd_r)
            fds[1].close()
        return cls(pid, r, first, journals[first:], cmd_w, fds[0] if serve else None)

    def collect(self) -> dict[Path, tuple[JournalTail, ProcessRec]] | None:
        """The child's journals, or None when it failed."""
        try:
            packed = _recv(self.pipe)
            if not self.serving:
                self.pipe.close()
                _, status = os.waitpid(self.pid, 0)
                if status != 0:
                    return None
            got = {}
            for path, item in zip(self.journals, packed, strict=True):
                got[path] = _unpack(path, item[:3])
                if self.serving:
                    self.extras[path] = item[3]
            return got
        except (OSError, ValueError, EOFError, TypeError):
            return None

    def call(self, fn: Callable[..., Any], arg: Any, fd: int | None = None) -> None:
        """Ask the child for ``fn(its processes, arg)`` (``reply`` takes the answer); ``arg`` and
        the answer are ``marshal`` data. ``fd``: ``fn(its processes, arg, a copy of fd)`` instead."""
        assert self.cmd is not None and self.fds is not None
        if fd is not None:
            socket.send_fds(self.fds, [b"f"], [fd])
        _send(self.cmd, (fn.__module__, fn.__qualname__, arg, fd is not None))

    def reply(self) -> Any:
        """The answer to the last ``call``; ``ChildLost`` when there is none (it failed or died)."""
        try:
            status, value = _recv(self.pipe)
        except (OSError, ValueError, EOFError, TypeError) as exc:
            raise ChildLost(f"no answer ({exc!r})") from None
        if status != "ok":
            raise ChildLost(value)
        return value

    def abandon(self) -> None:
        for f in (self.cmd, self.pipe, self.fds):  # closing its pipes ends it: its write or read fails
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        try:
            os.waitpid(self.pid, 0)
        except OSError:
            pass


class ChildLost(Exception):
    """The child of a ``split`` read failed or died: its processes are read again here (``Split.whole``)."""


class Split:
    """Processes a forked child read and holds whole, while this view holds them shallow (the spans
    every verdict reads, ``_shallow``): a renderer asks the child to lay out and render their lanes
    (``render.lanes.lanes_map``), and only if the child is lost reads them again here (``whole``)."""

    def __init__(self, view: RunView, child: _Child, final: bool) -> None:
        self.view, self.child, self.final = weakref.proxy(view), child, final  # the view holds this: no cycle
        self.paths = set(child.journals)
        # path -> (earliest start at each depth, latest end or start) of its spans (``layout``: the run's bounds)
        self.bounds = {path: (firsts, hi) for path, (_, firsts, hi) in child.extras.items() if hi is not None}
        self.lost = False
        self._whole: dict[str, ProcessRec] | None = None
        weakref.finalize(self, child.abandon)  # the view is dropped: the child ends (the CLI exits before)

    def call(self, fn: Callable[..., Any], arg: Any, fd: int | None = None) -> bool:
        """Ask the child for ``fn(its processes, arg)`` (``reply``; ``_Child.call``); False when it is lost."""
        if not self.lost:
            try:
                self.child.call(fn, arg, fd)
                return True
            except (OSError, ValueError):  # it died: a closed pipe; an argument marshal refuses
                self.lost = True
        return False

    def reply(self) -> Any:
        try:
            return self.child.reply()
        except ChildLost:
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
            view._read(path, self.final)
        view._place_told()
        self._whole = {str(path): view._tails[path][1] for path in self.paths}
        return self._whole


def _send(out: Any, obj: Any, data: bytes | None = None) -> None:
    """One message (``obj`` as ``marshal`` data, or ``data`` already made), length first."""
    data = marshal.dumps(obj) if data is None else data
    out.write(len(data).to_bytes(8, "little"))
    out.write(data)
    out.flush()


def _recv(pipe: Any) -> Any:
    head = pipe.read(8)
    if len(head) < 8:
        raise EOFError("the pipe closed")
    size = int.from_bytes(head, "little")
    data = pipe.read(size)
    if len(data) < size:
        raise EOFError("the pipe closed")
    return marshal.loads(data)


def _serve(cmd: Any, out: Any, procs: dict[str, ProcessRec], fds: socket.socket) -> None:
    """The child's loop (``_Child.call``): until the parent closes the pipe."""
    while True:
        try:
            module, name, arg, with_fd = _recv(cmd)
        except EOFError:
            return
        fd = None
        try:
            if with_fd:
                fd = socket.recv_fds(fds, 1, 1)[1][0]
            fn = importlib.import_module(module)
            for part in name.split("."):
                fn = getattr(fn, part)
            data = marshal.dumps(("ok", fn(procs, arg) if fd is None else fn(procs, arg, fd)))
        except Exception as exc:  # the parent does it itself
            data = marshal.dumps(("error", repr(exc)))
        finally:
            if fd is not None:
                os.close(fd)
        _send(out, None, data)


def _whole_from(
    child: _Child, got: dict[Path, tuple[JournalTail, ProcessRec]]
) -> dict[Path, tuple[JournalTail, ProcessRec]] | None:
    """``got`` (a shallow state) made whole with every span the child holds; None if it fails."""
    try:
        child.call(_all_spans, [str(path) for path in got])
        packed = child.reply()
        for (_, proc), spans in zip(got.values(), packed, strict=True):
            decoded = _SPANS.decode(spans)
            proc.spans, proc.dropped = dict(zip(map(_SPAN_ID, decoded), decoded, strict=True)), {}
    except (ChildLost, ValueError, TypeError, msgspec.DecodeError):
        return None
    return got


def _all_spans(procs: dict[str, ProcessRec], paths: list[str]) -> list[bytes]:
    """In the child (``_Child.call``): every span of each process, as ``_pack`` sends them."""
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


def _widen(fd: int) -> None:
    """A pipe that holds up to ``PIPE_BYTES`` (Linux): a large answer is not sent 64 KiB per wake-up."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), _Child.PIPE_BYTES)
    except OSError:  # above /proc/sys/fs/pipe-max-size for this user: the default then
        pass


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _read_whole(path: Path, final: bool) -> tuple[JournalTail, ProcessRec]:
    tail, proc = JournalTail(path), ProcessRec(path)
    for piece in tail.bulk_pieces(final=final):
        _apply_all(tail, proc, piece)
    return tail, proc


def _pack(tail: JournalTail, proc: ProcessRec, shallow: int | None = None, extras: bool = False) -> tuple:
    """One journal's state, as ``_unpack`` takes it back: the spans as msgpack (decoded in C by
    the parent, straight into ``SpanRec``s), the rest as ``marshal`` data. ``extras``: also every
    span id, the earliest start at each depth and the latest end or start (``Split``)."""
    levels = _levels(proc.spans) if shallow is not None or extras else {}
    spans = list(proc.spans.values()) if shallow is None else _shallow(proc, shallow, levels)
    packed = (
        [getattr(tail, name) for name in _TAIL_FIELDS],
        [getattr(proc, name) for name in _PROC_FIELDS],
        msgspec.msgpack.encode(spans),
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
    (``diagnose``, ``postmortem``, ``hints``, ``cli.findings``), in their order, with their ancestors
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


def _unpack(path: Path, item: tuple) -> tuple[JournalTail, ProcessRec]:
    tail_state, proc_state, spans = item
    tail, proc = JournalTail(path), ProcessRec(path)
    for name, value in zip(_TAIL_FIELDS, tail_state, strict=True):
        setattr(tail, name, value)
    for name, value in zip(_PROC_FIELDS, proc_state, strict=True):
        setattr(proc, name, value)
    decoded = _SPANS.decode(spans)
    proc.spans = dict(zip(map(_SPAN_ID, decoded), decoded, strict=True))
    return tail, proc


_SPANS = msgspec.msgpack.Decoder(list[SpanRec])
