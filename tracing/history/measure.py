"""What a run says about its start, in the terms the history keeps: when it began and ended, how
it ended, and each phase's time on each process.

Phase keys and process labels are ``compare``'s (``reader.view.phase_key``: a phase a rank runs
several ways is split by its variant; repeats of one key in a process are summed; a phase still
open counts up to the run's latest record and is flagged), so ``compare RUN --baseline`` and the
history speak of the same rows. Read straight from the spans, without laying the run out: at
1024 ranks x 270 spans this is one pass over the spans (see ``store.record`` for its cost).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

from .. import keys
from ..reader.view import ProcessRec, RunView, node_label, phase_key
from ..redact import redact

NS = 1_000_000_000
OUTCOMES = ("ready", "failed", "stalled", "interrupted")


@dataclass
class PhaseRow:
    """One phase key of one start, over the processes that ran it."""

    key: str
    role: str  # the role of the first process that ran it (rank, launcher)
    depth: int  # the least depth it ran at: 0 a process's root, 1 a step of it (what an ETA adds up)
    start_s: float  # its earliest start, seconds after the start began (the order phases come in)
    per_rank: dict[str, float] = field(default_factory=dict)  # process label -> seconds
    count: int = 0  # most occurrences in one process
    open: bool = False  # some process had not ended it: its time is a lower bound

    @property
    def max(self) -> float:
        """The slowest process's time: what every other one waits for, and what the history compares."""
        return max(self.per_rank.values())

    @property
    def median(self) -> float:
        return statistics.median(self.per_rank.values())

    @property
    def min(self) -> float:
        return min(self.per_rank.values())

    @property
    def slowest(self) -> str:
        return max(self.per_rank, key=self.per_rank.__getitem__)


@dataclass
class Measured:
    run_id: str
    started_ns: int  # the launch's first process start (its root is backdated to it)
    ended_ns: int  # ready, else the latest record
    outcome: str  # one of OUTCOMES
    labels: list[str]  # every process label, in the run's order
    phases: list[PhaseRow]  # in order of first start
    host: str

    @property
    def total_s(self) -> float:
        return max(0.0, (self.ended_ns - self.started_ns) / NS)


def measure(run: RunView) -> Measured:
    """The start ``run`` holds. It must be read whole (not ``shallow``): a shallow read leaves out
    most spans that ended well, and their times with them."""
    procs = [p for p in run.processes if p.spans or p.role != "watchdog"]
    names = Counter(p.label for p in procs)
    labels = [node_label(p, f"{p.label}@{p.host}:{p.pid}" if names[p.label] > 1 else p.label) for p in procs]
    labels = [redact(label, keys.RANK_LABEL) for label in labels]  # from journals: free text (35 ms at 1024)
    starts = [p.boot_t for p in procs if p.boot_t] + [s.start for p in procs for s in p.spans.values()]
    horizon = max([p.last_t for p in procs] + [s.end or s.start for p in procs for s in p.spans.values()] or [0])
    started = min(starts) if starts else horizon
    rows: dict[str, PhaseRow] = {}
    for proc, label in zip(procs, labels, strict=True):
        _add(proc, label, rows, started, horizon)
    clean = {key: redact(key, keys.PHASE) for key in rows}
    for key, row in rows.items():
        row.key = clean[key]
    outcome, ready_ns = _outcome(procs)
    host = redact(next((p.host for p in procs if p.role == "launcher"), procs[0].host if procs else ""), "host.name")
    return Measured(
        run.run_id,
        started,
        ready_ns if ready_ns is not None else horizon,
        outcome,
        labels,
        sorted(rows.values(), key=lambda r: r.start_s),
        host,
    )


def _add(proc: ProcessRec, label: str, rows: dict[str, PhaseRow], started: int, horizon: int) -> None:
    depth: dict[str | None, int] = {}  # span id -> depth in this process (a parent comes before its children)
    keyed: dict[tuple, str] = {}  # what a phase key is made of -> the key
    phase_of, group_of, draft_of = keys.PHASE, keys.GROUP_NAME, keys.IS_DRAFT
    mine: dict[str, list] = {}  # key -> [ns, occurrences, least depth, earliest start, open]
    after_ready = keys.AFTER_READY
    for sid, span in proc.spans.items():
        level = depth[sid] = depth.get(span.parent_id, -1) + 1  # a parent elsewhere (the launcher's): 0
        attrs = span.attrs
        if after_ready in attrs:  # serving, not starting (a request's work, a weight update)
            continue
        try:
            made = (attrs.get(phase_of), attrs.get(group_of), attrs.get(draft_of), span.name)
            key = keyed.get(made)
            if key is None:
                key = keyed[made] = phase_key(span)
        except TypeError:  # a list value (a hand-written journal)
            key = phase_key(span)
        end, start = span.end, span.start
        got = mine.get(key)
        if got is None:
            mine[key] = [(end if end is not None else horizon) - start, 1, level, start, end is None]
            continue
        got[0] += (end if end is not None else horizon) - start
        got[1] += 1
        if level < got[2]:
            got[2] = level
        if start < got[3]:
            got[3] = start
        if end is None:
            got[4] = True
    for key, (ns, count, level, first, opened) in mine.items():
        row = rows.get(key)
        if row is None:
            row = rows[key] = PhaseRow(key, proc.role, level, (first - started) / NS)
        else:
            row.depth = min(row.depth, level)
            row.start_s = min(row.start_s, (first - started) / NS)
        row.per_rank[label] = ns / NS
        row.count = max(row.count, count)
        row.open = row.open or opened


def _outcome(procs: list[ProcessRec]) -> tuple[str, int | None]:
    """(how the start ended, when it was ready). ``ready``: every rank's root ended well and the
    launcher (if any) ended its root or a ready phase well; ``stalled``: the watchdog recorded a
    stall (whatever ended the start after it); ``interrupted``: a Ctrl-C (KeyboardInterrupt) ended
    a root; ``failed``: an error ended a root, or a rank died or failed (the watchdog's record, or
    an ``exit`` record before ready); ``interrupted`` also when none of these (stopped from outside)."""
    ranks = [p for p in procs if p.role == "rank"]
    launchers = [p for p in procs if p.role == "launcher"]
    ready_at: list[int] = []
    for proc in launchers:
        ends = [
            s.end
            for s in proc.spans.values()
            if s.end is not None
            and s.status == "ok"
            and (s.attrs.get(keys.PHASE) in keys.READY_PHASES or s.attrs.get(keys.PHASE) in keys.ROOT_PHASES)
        ]
        if not ends:
            break
        ready_at.append(min(ends))
    else:
        roots = [p.root for p in ranks]
        if ranks and all(r is not None and r.status == "ok" for r in roots):
            return "ready", max([r.end for r in roots if r is not None and r.end] + ready_at)
        if not ranks and ready_at:
            return "ready", max(ready_at)
    kinds = {d.get("finding") for p in procs for d in p.diagnoses}
    if "stopped" in kinds:
        return "interrupted", None
    if kinds - {"busy", "slow", "unusual", "died", "failed", None}:
        return "stalled", None
    errors = [p.root.error for p in procs if p.root is not None and p.root.status == "error"]
    if any(isinstance(e, dict) and e.get("type") == "KeyboardInterrupt" for e in errors):
        return "interrupted", None
    exits = any(p.exit is not None and not p.ready and (p.exit.get("code") or 0) != 0 for p in ranks)
    if errors or exits or kinds & {"died", "failed"}:
        return "failed", None
    return "interrupted", None
