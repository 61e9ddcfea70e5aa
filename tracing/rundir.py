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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import keys
from .journal import JournalTail, _loads, read_regular
from .records import validate

JOURNAL_DIR, STATUS_DIR, STACKS_DIR = "journal", "status", "stacks"
STATUS_MAX = 1 << 20  # bytes read of a status file (a heartbeat is a few KiB)
_PROGRESS_KINDS = frozenset({"begin", "end", "event", "collective"})


@dataclass(slots=True)
class SpanRec:
    span_id: str
    parent_id: str | None
    trace_id: str
    name: str
    start: int  # ns
    attrs: dict[str, Any]
    thread: str = ""
    end: int | None = None  # ns; None while open (or when the process died inside it)
    status: str = "open"  # open | ok | error | incomplete
    error: dict[str, Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def phase(self) -> str:
        """The stable phase name (rank roots are named per rank; their phase is ``rank``)."""
        return self.attrs.get(keys.PHASE, self.name)

    def duration_ns(self, now: int | None = None) -> int | None:
        end = self.end if self.end is not None else now
        return None if end is None else max(0, end - self.start)


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
    last_progress_t: int = 0  # latest phase begin/end/event, collective, or heartbeat progress change
    coll_counts: dict[str, int] = field(default_factory=dict)  # group -> collectives entered
    coll_ops: dict[str, dict[int, str]] = field(default_factory=dict)  # group -> seq -> op (recent)
    coll_open: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)  # entered, not left
    start_ticks: int | None = None  # with boot_id: recognises the process later (``tracing.procs``)
    boot_id: str | None = None
    exit: dict[str, Any] | None = None  # the ``exit`` record another process wrote about this one
    told: list[dict[str, Any]] = field(default_factory=list)  # ``exit`` records about others

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
            self._collective(r, t)
        elif kind == "begin":
            self.spans[r["span"]] = SpanRec(
                r["span"],
                r.get("parent"),
                r.get("trace") or "",
                r["name"],
                t,
                dict(r.get("attrs") or {}),
                r.get("thread") or "",
            )
        elif kind == "end":
            span = self.spans.get(r["span"])
            if span is not None:
                span.end, span.status = t, r.get("status") or "ok"
                span.attrs.update(r.get("attrs") or {})
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

    def _collective(self, r: dict[str, Any], t: int) -> None:
        group, seq, op = r["group"], r["seq"], r["op"]
        if r["edge"] == "exit":
            self.coll_open.pop((group, seq), None)
            return
        self.coll_counts[group] = max(self.coll_counts.get(group, 0), seq)
        ops = self.coll_ops.setdefault(group, {})
        ops[seq] = op
        if len(ops) > self.OPS_KEPT:
            del ops[min(ops)]
        self.coll_open[(group, seq)] = {"op": op, "group": group, "seq": seq, "t": t}

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
    def last_heartbeat(self) -> dict[str, Any] | None:
        return self.heartbeats[-1] if self.heartbeats else None

    def sort_key(self) -> tuple:
        i = self.identity
        order = {"launcher": 0, "rank": 1}.get(self.role, 2)
        ranks = tuple(
            i.get(k, -1) if isinstance(i.get(k), int) else -1
            for k in (keys.DP_RANK, keys.PP_RANK, keys.TP_RANK, keys.WORLD_RANK)
        )
        return (order, ranks, self.host, self.pid)


def _progress(heartbeat: dict[str, Any]) -> list:
    return [(p.get("span"), p["progress"]) for p in heartbeat.get("phases") or () if p.get("progress")]


class RunView:
    """A run directory as processes; ``refresh()`` reads only what was appended since last time."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._tails: dict[Path, tuple[JournalTail, ProcessRec]] = {}
        self._status_problems: dict[Path, str] = {}  # status file -> the problem said about it
        self._told: list[tuple[ProcessRec, dict[str, Any]]] = []  # (teller, ``exit`` record)

    @property
    def run_id(self) -> str:
        return self.path.name

    def refresh(self, final: bool = False) -> RunView:
        journal_dir = self.path / JOURNAL_DIR
        for path in sorted(journal_dir.glob("*.jsonl")) if journal_dir.is_dir() else ():
            if path not in self._tails:
                self._tails[path] = (JournalTail(path), ProcessRec(path))
            tail, proc = self._tails[path]
            told = len(proc.told)
            _apply_all(tail, proc, tail.read(final=final))
            self._told += [(proc, r) for r in proc.told[told:]]
        if self._told:
            self._place_told()
        return self

    def _place_told(self) -> None:
        """Put each ``exit`` record on the process it is about."""
        by_id = {(p.host, p.pid): p for _, p in self._tails.values() if p.pid}
        for teller, r in self._told:
            proc = by_id.get((r.get("host") or teller.host, r["pid"]))
            if proc is not None:
                proc.exit = r

    @property
    def processes(self) -> list[ProcessRec]:
        return sorted((p for _, p in self._tails.values() if p.pid and p.shown), key=ProcessRec.sort_key)

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
        is a valid ``heartbeat`` record; a bad one is reported once in ``problems``."""
        path = self.path / STATUS_DIR / f"{proc.path.stem}.json"
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
        return record if why is None else self._status_problem(path, f"heartbeat: {why}")

    def _status_problem(self, path: Path, why: str) -> None:
        self._status_problems.setdefault(path, f"{path}:1: {why}")
        return None


def _apply_all(tail: JournalTail, proc: ProcessRec, records: list[dict[str, Any]]) -> None:
    """Apply a chunk's records; one that ``apply`` cannot use (a gap between ``records.validate``
    and ``apply``: a bug) is reported as ``file:line`` and the rest of the chunk is still used."""
    spans = proc.spans
    for i, r in enumerate(records):
        try:
            kind = r["kind"]
            if kind == "begin" or kind == "end":  # most of a journal: ``apply``'s work, inline
                t = r["t"]
                if t > proc.last_t:
                    proc.last_t = t
                if t > proc.last_progress_t:
                    proc.last_progress_t = t
                if kind == "begin":  # the record is ours alone: its attrs are used, not copied
                    attrs = r.get("attrs") or {}
                    spans[r["span"]] = SpanRec(
                        r["span"], r.get("parent"), r.get("trace") or "", r["name"], t, attrs, r.get("thread") or ""
                    )
                elif (span := spans.get(r["span"])) is not None:
                    span.end, span.status = t, r.get("status") or "ok"
                    if attrs := r.get("attrs"):
                        span.attrs.update(attrs)
                    span.error = r.get("error")
            else:
                proc.apply(r)
        except Exception as exc:
            tail.problems.append(f"{tail.path}:{tail.line_of(i)}: {r['kind']} record not used ({exc!r})")


def load_run(path: Path | str) -> RunView:
    """Everything in a finished (or abandoned) run directory."""
    path = Path(path)
    if not (path / JOURNAL_DIR).is_dir():
        raise FileNotFoundError(f"{path}: not a phasetrace run directory (no {JOURNAL_DIR}/ inside)")
    return RunView(path).refresh(final=True)
