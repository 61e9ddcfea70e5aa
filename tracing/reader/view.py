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
reaches ``ProcessRec.apply`` passed ``schema.validate``, so it can rely on the schema's types.
"""

from __future__ import annotations

import os
from collections.abc import Container
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any

from .. import keys
from ..journal.bulk_decode import SpanRec, span_from
from ..journal.layout import JOURNAL_DIR, STATUS_DIR
from ..journal.schema import trim, validate
from ..journal.tail import JournalTail, _loads, read_regular

__all__ = ["ProcId", "ProcessRec", "RunView", "SpanRec", "node_of"]

STATUS_MAX = 1 << 20  # bytes read of a status file (a heartbeat is a few KiB)
_PROGRESS_KINDS = frozenset({"begin", "end", "event", "collective", "process"})  # ``process``: its journal began


@dataclass(frozen=True)
class ProcId:
    """Who a verdict names. A pid alone names nobody: another node's report may carry any pid, a
    local rank's among them, so a process is its host, its pid and where it was read from."""

    host: str
    pid: int
    source: str  # the journal it was read from, or the node that reported it (``node-1``)
    reported: bool = False  # another node's report: never signalled nor read from ``/proc`` here


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
    start_ticks: int | None = None  # with boot_id: recognises the process later (``tracing.other_processes``)
    boot_id: str | None = None
    exit: dict[str, Any] | None = None  # the ``exit`` record another process wrote about this one
    told: list[dict[str, Any]] = field(default_factory=list)  # ``exit`` records about others
    launch: dict[str, Any] | None = None  # the ``launch`` record a node's launcher wrote (multi-node)
    remote: str | None = None  # set for a process another node reported (``tracing.channel.crossnode``)
    # phase -> [how many, latest end] of the spans that ended well and a shallow read left out (``_shallow``)
    dropped: dict[str, list[int]] = field(default_factory=dict)
    unreadable: str | None = None  # why its journal cannot be read: it is known by its file name and status file

    HEARTBEATS_KEPT = 8
    OPS_KEPT = 256

    def apply(self, r: dict[str, Any]) -> None:
        """Use one record that ``schema.validate`` accepted (never raises on one): optional
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
                span.attrs = {**span.attrs, **(r.get("attrs") or {})}  # shared (``bulk_decode._AttrsCache``)
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
            self.unreadable = None  # read after all
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

    def unread(self, why: str, beat: dict[str, Any] | None) -> None:
        """Its journal cannot be read (``why``): the process is still one of the run, named by the
        journal's name (``<host>-<pid>.jsonl``) and its status file's heartbeat (its label), so no view
        drops it; its phases are not known."""
        host, _, pid = self.path.stem.rpartition("-")
        if self.pid or not pid.isdigit():
            return
        self.unreadable, self.pid, self.host = why, int(pid), host
        label = beat.get("label") if beat is not None and beat.get("pid") == self.pid else None
        self.label = label if isinstance(label, str) and label else f"pid{self.pid}"

    def mend(self, beat: dict[str, Any] | None) -> None:
        """A journal that lost its root's ``end`` (its last line cut by ``kill -9``, a record a full disk
        kept out) while the status file says the start is over (``ready``: written after that ``end``):
        the root ends well, as the status file says, at the latest record the journal holds. A later
        read of the ``end`` itself puts its own time back."""
        root = self.root
        if root is None or root.status != "open" or beat is None or beat.get("ready") is not True:
            return
        if beat.get("pid") != self.pid:
            return
        root.end, root.status = max(self.last_t, root.start), "ok"
        root.attrs = {**root.attrs, keys.SERVING: True}

    @property
    def ident(self) -> ProcId:
        """This process as a verdict names it (``ProcId``)."""
        if self.remote is not None:
            return ProcId(self.host, self.pid, self.remote, reported=True)
        return ProcId(self.host, self.pid, str(self.path))

    @property
    def waiting_in(self) -> dict[str, Any] | None:
        """The oldest collective this process entered and has not left."""
        return min(self.coll_open.values(), key=lambda c: c["t"]) if self.coll_open else None

    @property
    def shown(self) -> bool:
        """Readers list it: a rank, a launcher, or any process with phases or something to say. An SGLang
        helper process that started tracing early (at import) and never ran a phase is left out."""
        return self.role != "process" or bool(
            self.spans or self.warnings or self.diagnoses or self.told or self.unreadable
        )

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
        """Its start is over: its root ended well (a rank: its launch serves; ``recorder.serving``)."""
        root = self.root
        return root is not None and root.status == "ok"

    @property
    def initialised(self) -> bool:
        """Its own init is done, and it is not over: a rank whose ``Scheduler.__init__`` returned
        while its launch does not serve yet (the server's warm-up): still starting, still watched."""
        root = self.root
        return root is not None and root.status == "open" and any(e["name"] == keys.INITIALISED for e in root.events)

    @property
    def serving(self) -> bool:
        """Its root ended because serving began (``keys.SERVING``): the launch's, for a launcher."""
        root = self.root
        return root is not None and root.status == "ok" and root.attrs.get(keys.SERVING) is True

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
    def title(self) -> str:
        """How a verdict begins on it: ``rank tp1``, ``the launcher``, ``detokenizer``, ``tokenizer-2``."""
        if self.role == "rank":
            return f"rank {self.label}"
        return "the launcher" if self.role == "launcher" else self.label

    @property
    def helper(self) -> bool:
        """A process of the launch that is neither a rank nor the launcher (detokenizer, tokenizer
        worker, DP controller …: a role it was given when spawned)."""
        return self.role not in ("rank", "launcher", "process", "watchdog")

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


def _number(procs: list[ProcessRec]) -> None:
    """Several processes of one role on a node (``--tokenizer-worker-num 2``) are told apart by the
    order they started in: ``tokenizer-1``, ``tokenizer-2``."""
    by_role: dict[tuple[str, int | None], list[ProcessRec]] = {}
    for p in procs:
        if p.helper:
            by_role.setdefault((p.role, p.node), []).append(p)
    for (role, node), same in by_role.items():
        if len(same) > 1:
            for i, p in enumerate(sorted(same, key=lambda p: (p.boot_t or 0, p.pid)), 1):
                p.label = f"{role}-{i}" if node is None else f"{role}-{i}-node{node}"


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
        self.split: Any = None  # ``reader.load.Split``: a forked child holds some processes whole
        self.indexed: dict[Path, Any] = {}  # journal -> the ``reader.index.Loaded`` it was read from (``reader.load``)
        self._order: tuple[tuple[int, ...], list[ProcessRec]] | None = None  # ``processes``, as last sorted

    @property
    def run_id(self) -> str:
        """The directory's name; ``a+b`` for several (one per node)."""
        return "+".join(dict.fromkeys(p.name for p in self.paths))

    def refresh(self, final: bool = False) -> RunView:
        """Read what was appended since the last refresh, here (a first read of a large run on two
        cores: ``reader.load.refresh_parallel``). ``final``: the run has ended, a last line without
        its newline is whole."""
        self._status = {}  # read again when next asked: fresher than the journals
        self._order = None  # a process's identity may come with what is read
        if self.split is not None:  # read more of a split view: whole, here
            self.split.whole()
            self.split = None
        for path in self.journals():
            self._read(path, final)
        if self._told:
            self._place_told()
        return self

    def journals(self) -> list[Path]:
        """Every journal of the run's directories, in a stable order."""
        return [
            path
            for run_path in self.paths
            if (journal_dir := run_path / JOURNAL_DIR).is_dir()
            for path in sorted(journal_dir.glob("*.jsonl"), key=_NAME)  # by name: Path's own order is slow
        ]

    def _read(self, path: Path, final: bool) -> None:
        if path not in self._tails:
            self._tails[path] = (JournalTail(path), ProcessRec(path))
        tail, proc = self._tails[path]
        told = len(proc.told)
        for piece in tail.bulk_pieces(final=final):
            _apply_all(tail, proc, piece)
        if proc.root is not None and proc.root.status == "open":
            proc.mend(self.status_file(proc))
        if tail.unreadable is not None and not proc.pid:
            proc.unread(tail.unreadable, self.status_file(proc))
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
        """Processes another node reported (``tracing.channel.crossnode``), replacing what it said before."""
        self.remote[source] = processes

    @property
    def processes(self) -> list[ProcessRec]:
        """The journals' processes and those other nodes reported. A report stands in for a journal
        with the same (host, pid) only where both say they are of the reporting node (a shared run
        directory: the report's times are on our clock); any other journal, this node's own above
        all, is judged from the journal, and the report's copy is left out (as is a second report)."""
        local = [p for _, p in self._tails.values() if p.pid and p.shown]
        if not self.remote:  # sorted once per read (a viewer asks a dozen times: 2-3 ms each at 1024 ranks)
            seen = tuple(map(id, local))
            if self._order is None or self._order[0] != seen:
                _number(local)
                self._order = (seen, sorted(local, key=ProcessRec.sort_key))
            return list(self._order[1])
        _number(local)
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
        record, why = read_status(path)
        if why is not None:
            self._status_problems.setdefault(path, f"{path}:1: {why}")
        return record


def status_of(journal: Path) -> Path:
    """The status file of a journal's process (in the run directory holding the journal)."""
    return journal.parent.parent / STATUS_DIR / f"{journal.stem}.json"


def read_status(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """A status file's heartbeat, if it is a valid ``heartbeat`` record; else None and why (None: there is none)."""
    try:
        record = _loads(read_regular(path, limit=STATUS_MAX))
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"cannot read ({exc.strerror or exc})"
    except ValueError as exc:  # orjson's JSONDecodeError; UnicodeDecodeError
        return None, f"not a JSON record ({exc.__class__.__name__}: {exc})"
    why = validate(record)
    if why is None and record["kind"] != "heartbeat":
        why = f"a {record['kind']} record, not a heartbeat"
    return (trim([record])[0], None) if why is None else (None, f"heartbeat: {why}")


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
    for i, r in enumerate(records):  # other kinds, and bulk kinds written otherwise than by ``journal.writer.dumps``
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


_SPAN_ID, _START, _T, _NAME = attrgetter("span_id"), attrgetter("start"), attrgetter("t"), attrgetter("name")


def _merged(attrs: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """A span's attrs with its ``end`` record's: a new dict, one per pair, since both are shared
    (``bulk_decode._AttrsCache``) — spans with equal attrs keep sharing one (renderers cache by it)."""
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


# -- reading a large run on two cores -------------------------------------------------------------


# -- names readers give phases and processes -----------------------------------------------------


def where_detail(proc: ProcessRec, span: SpanRec) -> str:
    """What a verdict adds to "in 'phase'": a warm-up pass's mode and size (`` (forward extend,
    bs 1)``), or that an initialised rank waits for its launch to serve."""
    mode, size = span.attrs.get(keys.FORWARD_MODE), span.attrs.get(keys.BATCH_SIZE)
    if isinstance(mode, str):
        return f" (forward {mode}" + (f", bs {size})" if type(size) is int else ")")
    if span is proc.root and proc.initialised:
        if proc.helper:
            return " (in its loop: its launch does not serve yet)"
        return " (initialised: its launch does not serve yet)"
    return ""


def phase_key(span: SpanRec) -> str:
    """The phase name, told apart where one rank runs it several ways (draft model, comm group)."""
    return phase_key_of(span.attrs, span.name)


def phase_key_of(attrs: dict[str, Any], name: str) -> str:
    return key_text(attrs.get(keys.PHASE) or name, attrs.get(keys.IS_DRAFT) is True, attrs.get(keys.GROUP_NAME))


def key_text(phase: str, draft: bool, group: Any) -> str:
    return f"{phase} [draft]" if draft else f"{phase} [{group}]" if group else phase


def node_label(proc: ProcessRec, label: str) -> str:
    """``tp9@node-1`` (``launcher@node-1``): a lane of a multi-node launch names its node."""
    node = proc.node
    if node is None:
        return label
    return f"{'launcher' if proc.role == 'launcher' else label}@node-{node}"
