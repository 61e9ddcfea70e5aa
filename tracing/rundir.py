"""A run directory, read back: processes, their phases as span records, heartbeats, diagnoses.

Layout (one run = one launch)::

    RUN_DIR/
      journal/<host>-<pid>.jsonl   one journal per process (see ``tracing.journal``)
      status/<host>-<pid>.json     latest heartbeat of each process, atomically replaced
      stacks/<label>-<pid>-<n>.txt stack dumps taken by the watchdog or on request

Shared by the watchdog (live, incremental ``refresh()``) and the CLI (one ``load_run``). Journals
may be cut by ``kill -9`` or hold a corrupt line: each such line is reported once as
``file:line: why`` in ``problems`` and everything else is used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .journal import JournalTail

JOURNAL_DIR, STATUS_DIR, STACKS_DIR = "journal", "status", "stacks"
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
        return self.attrs.get("sglang.phase", self.name)

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

    HEARTBEATS_KEPT = 8
    OPS_KEPT = 256

    def apply(self, r: dict[str, Any]) -> None:
        kind, t = r["kind"], r["t"]
        if t > self.last_t:
            self.last_t = t
        if t > self.last_progress_t and kind in _PROGRESS_KINDS:
            self.last_progress_t = t
        if kind == "collective":
            self._collective(r, t)
        elif kind == "begin":
            self.spans[r.get("span", "")] = SpanRec(
                r.get("span", ""), r.get("parent"), r.get("trace", ""), r.get("name", "?"), t,
                dict(r.get("attrs") or {}), r.get("thread", ""))
        elif kind == "end":
            span = self.spans.get(r.get("span", ""))
            if span is not None:
                span.end, span.status = t, r.get("status", "ok")
                span.attrs.update(r.get("attrs") or {})
                span.error = r.get("error")
        elif kind == "event":
            span = self.spans.get(r.get("span", ""))
            if span is not None:
                span.events.append({"t": t, "name": r.get("name"), "attrs": r.get("attrs") or {}})
        elif kind == "heartbeat":
            if self.heartbeats and _progress(r) != _progress(self.heartbeats[-1]):
                self.last_progress_t = max(self.last_progress_t, t)
            self.heartbeats.append(r)
            del self.heartbeats[:-self.HEARTBEATS_KEPT]
        elif kind == "identity":
            self.role, self.label = r.get("role", self.role), r.get("label", self.label)
            self.identity = dict(r.get("attrs") or {})
        elif kind == "process":
            self.pid, self.host = r.get("pid", 0), r.get("host", "")
            self.boot_t, self.resource = r.get("boot_t"), dict(r.get("resource") or {})
            self.label = self.label or f"pid{self.pid}"
        elif kind == "diagnosis":
            self.diagnoses.append(r)
        elif kind == "warning":
            self.warnings.append(str(r.get("message", "")))

    def _collective(self, r: dict[str, Any], t: int) -> None:
        group, seq, op = str(r.get("group")), int(r.get("seq", 0)), str(r.get("op"))
        if r.get("edge") == "exit":
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
            if span.attrs.get("sglang.phase") in ("rank", "launch.engine", "launch.server"):
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
        ranks = tuple(i.get(k, -1) if isinstance(i.get(k), int) else -1
                      for k in ("sglang.dp_rank", "sglang.pp_rank", "sglang.tp_rank", "sglang.world_rank"))
        return (order, ranks, self.host, self.pid)


def _progress(heartbeat: dict[str, Any]) -> list:
    return [(p.get("span"), p.get("progress")) for p in heartbeat.get("phases") or () if p.get("progress")]


class RunView:
    """A run directory as processes; ``refresh()`` reads only what was appended since last time."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._tails: dict[Path, tuple[JournalTail, ProcessRec]] = {}

    @property
    def run_id(self) -> str:
        return self.path.name

    def refresh(self, final: bool = False) -> RunView:
        journal_dir = self.path / JOURNAL_DIR
        for path in sorted(journal_dir.glob("*.jsonl")) if journal_dir.is_dir() else ():
            if path not in self._tails:
                self._tails[path] = (JournalTail(path), ProcessRec(path))
            tail, proc = self._tails[path]
            for record in tail.read(final=final):
                proc.apply(record)
        return self

    @property
    def processes(self) -> list[ProcessRec]:
        return sorted((p for _, p in self._tails.values() if p.pid), key=ProcessRec.sort_key)

    @property
    def ranks(self) -> list[ProcessRec]:
        return [p for p in self.processes if p.role == "rank"]

    @property
    def problems(self) -> list[str]:
        return [problem for tail, _ in self._tails.values() for problem in tail.problems]

    def status_file(self, proc: ProcessRec) -> dict[str, Any] | None:
        """The process's latest heartbeat from its status file (fresher than the journal's)."""
        try:
            return json.loads((self.path / STATUS_DIR / f"{proc.path.stem}.json").read_text())
        except (OSError, ValueError):
            return None


def load_run(path: Path | str) -> RunView:
    """Everything in a finished (or abandoned) run directory."""
    path = Path(path)
    if not (path / JOURNAL_DIR).is_dir():
        raise FileNotFoundError(f"{path}: not a phasetrace run directory (no {JOURNAL_DIR}/ inside)")
    return RunView(path).refresh(final=True)
