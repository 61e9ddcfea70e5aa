"""Stall analysis over a run directory: which rank stopped, where, who waits for it, and what it is doing.

Reads a ``RunView``, the clock and, for processes of this host, their state from the OS (psutil:
exited, stopped, zombie); changes nothing, so the live watchdog, ``phasetrace watch`` and
``phasetrace status`` share it. On ranks that are neither ready nor finished:

* **silent**: no heartbeat for ``silent_s`` (its Python threads cannot run: GIL held in C, or the
  process is stopped or dead);
* **straggler**: peers wait in a collective this rank never entered and it made no progress —
  named after ``blocked_s`` when its own heartbeats agree that it waits (asleep, no CPU, no I/O,
  no GPU work, no child at work): "blocked"; after ``stall_s`` when they cannot say (no figures).
  A rank still in a phase all peers left, without progress, is named after ``stall_s``;
* **divergence**: ranks of one group entered different collectives at the same sequence number;
* **no progress**: nothing moved on any rank for ``no_progress_s``;
* **waits on**: no rank is in a collective, every one is idle (its heartbeats agree) for
  ``blocked_s``, and what the OS shows (``evidence``) is the same outside cause for each: one
  lock's holder, one remote address that does not answer.

What a named rank waits on (``evidence``: a lock and its holder, a busy child, a socket, its native
call) is read by the caller's ``read`` (``evidence.ranks.RankReader``), only for the ranks a rule is about
to name or finds idle, and said after the verdict; a rank that waits on its own busy child is never
a stall (a *busy* notice naming the child).

Not alarms (``Finding.alarm`` is False; returned with ``notices=True``, once per phase by key):

* **busy**: peers wait, the rank makes no progress but works (CPU, I/O, GPU, a child process) —
  it may be computing legitimately: said after ``busy_s``, never called stuck;
* **slow**: peers wait on a rank whose progress counters move (shards loaded, graph shapes
  captured): an estimate, never a stall.

Progress is any phase begin/end/event, collective, or a heartbeat whose phase progress changed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from .. import keys
from ..journal.waits_on import MAX_EVIDENCE
from ..other_processes import this_host
from ..reader.view import ProcessRec, ProcId, RunView, where_detail
from .evidence import Evidence, cause_key, from_builtins, labels_text, phrase, shared_cause

NS = 1_000_000_000
Read = Callable[[ProcessRec], "Evidence | None"]  # what a rank waits on, read when a rule needs it
_P2P = {"send", "recv", "send_object", "recv_object", "send_tensor_dict", "recv_tensor_dict"}  # paired, not divergent
_MEMBERS = re.compile(r"\[(\d+(?:,\d+)*)\]$")
RENDEZVOUS = "dist.init_process_group"  # the phase where ranks meet at the launch's rendezvous (HOST:PORT)
# What counts as working, per heartbeat interval (a rank blocked in gloo/NCCL uses ~1 % of a core).
CPU_BUSY_PCT, GPU_BUSY_PCT, IO_BUSY_BPS, MAJFLT_BUSY = 25.0, 10.0, 64 * 1024, 8
_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "disk-sleep",
    "T": "stopped",
    "t": "traced",
    "Z": "zombie",
    "I": "idle",
}


@dataclass(frozen=True)
class Thresholds:
    """Seconds. Defaults name a blocked rank ~10 s after its peers start waiting for it (beat 2 s:
    ≈ 0.03 % of a core per rank), a silent one ~10 s after its last beat."""

    heartbeat_s: float = keys.HEARTBEAT_S
    silent_s: float = 8.0  # no heartbeat this long: 3 beats missed (default: 4 heartbeats)
    stall_s: float = 30.0  # no progress while peers wait / moved on, the rank's own figures unknown
    no_progress_s: float = 120.0  # nothing anywhere
    blocked_s: float = 8.0  # no progress while peers wait, and its heartbeats say it waits (capped at stall_s)
    busy_s: float = 60.0  # no progress while peers wait, and it works: "busy", not an alarm (at least stall_s)

    @classmethod
    def from_env(cls) -> Thresholds:
        """``SGLANG_PHASETRACE_{HEARTBEAT,SILENT,STALL,NO_PROGRESS,BLOCKED,BUSY}_S``; silent defaults to
        4 beats (3 missed)."""

        num = keys.env_seconds
        hb = num("HEARTBEAT", cls.heartbeat_s)
        return cls(
            hb,
            num("SILENT", max(4 * hb, 2.0)),
            num("STALL", cls.stall_s),
            num("NO_PROGRESS", cls.no_progress_s),
            num("BLOCKED", max(cls.blocked_s, 4 * hb)),
            num("BUSY", cls.busy_s),
        )

    @property
    def blocked_bound(self) -> float:
        return min(self.blocked_s, self.stall_s)

    @property
    def busy_bound(self) -> float:
        return max(self.busy_s, self.stall_s)


NOTICES = ("busy", "slow", "unusual")  # kinds that are not alarms (``unusual``: ``verdicts.usual``)
PREFIX = "sglang-phasetrace:"  # every verdict line a user sees, wherever the watchdog runs
# a finding's kind -> its word; else STALL
VERDICT = {"died": "DIED", "failed": "FAILED", "not_started": "NOT STARTED", "stopped": "STOPPED"}


@dataclass
class Finding:
    kind: str  # alarms: "silent" | "straggler" | "divergence" | "no_progress"; notices: "busy" | "slow"
    label: str  # the rank it names, e.g. "tp1"
    pid: int
    phase: str | None
    since_s: float
    message: str  # the one-line diagnosis, verdict first
    waiting: dict[str, str] = field(default_factory=dict)  # peer label -> what it waits in
    stacks: list[str] = field(default_factory=list)  # stack dump paths, when taken
    # every process involved (named rank first), as read: never bare pids, which another node's report
    # may share with a process of this host (``watchdog.act`` resolves these, and acts on local ones only)
    procs: list[ProcId] = field(default_factory=list)
    doing: str = ""  # what the named rank does, in words ("blocked (0 % CPU, sleeping; no GPU figures)")
    evidence: dict[str, dict[str, Any]] = field(default_factory=dict)  # label -> what it waits on (builtins)

    @property
    def key(self) -> tuple:
        """Same stall, same key: the watchdog reports each once (a notice: once per phase)."""
        return (self.kind, self.label, self.phase)

    @property
    def proc(self) -> ProcId | None:
        """The process it names, as read (None: a recorded verdict, which says a pid and a label only)."""
        return self.procs[0] if self.procs else None

    @property
    def pids(self) -> list[int]:
        """The involved processes' pids, for display (``procs`` says whose)."""
        return [p.pid for p in self.procs]

    @property
    def alarm(self) -> bool:
        """False for notices (busy, slow): a rank that works or progresses is not stuck."""
        return self.kind not in NOTICES

    def keep(self, found: dict[str, Evidence], *, replace: bool = False) -> Finding:
        """Keep what the named ranks wait on (``MAX_EVIDENCE`` of them), as builtins the schema takes
        (a value past a bound is left out here rather than the whole record refused by its readers)."""
        for label, ev in found.items():
            if len(self.evidence) < MAX_EVIDENCE or (replace and label in self.evidence):
                value = msgspec.to_builtins(ev)
                if from_builtins(value) is not None:
                    self.evidence[label] = value
        return self


def said(ev: Evidence | None) -> str:
    """What a rank waits on, as a verdict line says it after the rank (no duration: the line has
    one); empty when the read found nothing to say."""
    if ev is None or ev.gone or ev.cause in ("none", "gone"):
        return ""
    return phrase(msgspec.structs.replace(ev, waited_s=None))


def evidence_clause(procs: list[ProcessRec], read: Read | None) -> tuple[str, dict[str, Evidence]]:
    """``tp0, tp1 wait for …`` (one cause shared) or ``tp0 waits …; tp1 …``, and what was read."""
    found = {p.label: ev for p in procs[:MAX_EVIDENCE] if read is not None and (ev := read(p)) is not None}
    shown = {label: ev for label, ev in found.items() if said(ev)}
    if not shown:
        return "", found
    shared = shared_cause(shown) if len(shown) > 1 else None
    if shared is not None and len(shared.labels) == len(shown):
        return shared.text, found
    return "; ".join(f"{label} {said(ev)}" for label, ev in shown.items()), found


def os_state(proc: ProcessRec) -> str:
    """``running``, ``sleeping``, ``disk-sleep``, ``stopped``, ``zombie``, ``exited`` or ``unknown``."""
    if proc.remote is not None or proc.host != this_host():  # another node's report: never read here
        return "unknown (other host)"
    try:
        import psutil

        return psutil.Process(proc.pid).status()
    except Exception:  # NoSuchProcess, AccessDenied
        return "exited"


def _world_rank(proc: ProcessRec) -> int | None:
    value = proc.identity.get(keys.WORLD_RANK)
    return value if isinstance(value, int) else None


def _where(proc: ProcessRec, now: int) -> tuple[str | None, str, float | None]:
    """(phase, "in 'x'" or where it idles, seconds in that phase) of the innermost open phase."""
    span = proc.current
    if span is not None:
        return span.phase, f"in '{span.phase}'{where_detail(proc, span)}", (now - span.start) / NS
    ended = [s for s in proc.spans.values() if s.end is not None]
    if ended:
        last = max(ended, key=lambda s: s.end or 0)
        return None, f"between phases ('{last.phase}' ended {(now - (last.end or now)) / NS:.0f} s ago)", None
    return None, "before its first phase", None


def suspects(run: RunView, now: int, th: Thresholds) -> list[ProcessRec]:
    """Ranks still starting that made no progress for ``blocked_bound``: those whose waits are worth
    reading when no rule asks (the idle ranks ``status`` shows, a node's snapshot for node 0)."""
    return [p for p in run.ranks if _initialising(p) and (now - p.last_progress_t) / NS >= th.blocked_bound]


def _beats(run: RunView, proc: ProcessRec) -> list[dict[str, Any]]:
    """Its latest heartbeats, oldest first: the journal's few and the status file's (fresher)."""
    beats = {hb["t"]: hb for hb in proc.heartbeats}
    status = run.status_file(proc)
    if status and isinstance(status.get("t"), int):
        beats[status["t"]] = status
    return [beats[t] for t in sorted(beats)]


def _heartbeat_t(beats: list[dict[str, Any]], proc: ProcessRec) -> int:
    return beats[-1]["t"] if beats else proc.last_t


def _wait_text(coll: dict[str, Any], now: int) -> str:
    return f"{coll['op']} #{coll['seq']} on group '{coll['group']}' since {(now - coll['t']) / NS:.0f} s"


def _initialising(proc: ProcessRec) -> bool:
    """Inside init: its root (or, for root-less programs, some phase) is still open."""
    root = proc.root
    return root.status == "open" if root is not None else bool(proc.open_spans)


def starting(proc: ProcessRec) -> bool:
    """A launcher or a helper whose own start is not done: its root open and, for a helper, not in its loop."""
    return (proc.role == "launcher" or proc.helper) and _initialising(proc) and not proc.initialised


def awaited(run: RunView, now: int) -> ProcessRec | None:
    """The process whose next step the launch waits for, once its ranks have none left: a helper not
    in its loop yet (the one idle longest), else the launcher in a phase of its own (not one that
    waits for the others: ``keys.WAITS_FOR_OTHERS``), else the launcher."""
    procs = [p for p in run.processes if starting(p) and os_state(p) not in ("exited", "zombie")]
    helpers = sorted((p for p in procs if p.helper), key=lambda p: p.last_progress_t)
    launchers = [p for p in procs if p.role == "launcher"]
    own = [p for p in launchers if (c := p.current) is not None and c.phase not in keys.WAITS_FOR_OTHERS]
    return next(iter(helpers or own or launchers), None)


def waits_for(target: ProcessRec, quiet: float, now: int, read: Read | None, tail: str = "") -> Finding:
    """The catch-all, naming the process whose next step the launch waits for and what it waits on."""
    ev = read(target) if read is not None else None
    more = f", which {said(ev)}" if said(ev) else ""
    phase, where, _ = _where(target, now)
    return Finding(
        "no_progress",
        target.label,
        target.pid,
        phase,
        quiet,
        f"no progress for {quiet:.0f} s; the launch waits for {target.title} ({target.who}) {where}{more}{tail}",
        procs=[target.ident],
    ).keep({target.label: ev} if ev is not None else {})


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# -- what a rank is doing, from its heartbeats --------------------------------------------------------------


@dataclass
class Doing:
    state: str  # "blocked" | "busy" | "unknown"
    text: str  # the figures, e.g. "0 % CPU, sleeping; no GPU figures"


def doing(
    beats: list[dict[str, Any]], since_t: int, now: int, th: Thresholds, in_collective: bool, children: bool = True
) -> Doing:
    """Blocked when every recent heartbeat since ``since_t`` (at least two, the last fresh) shows no
    work: under 25 % of a core, no I/O, no major faults, no child at work (``children=False``: its
    children are the launch's ranks, judged on their own), the GPU idle (ignored while the rank
    itself waits in a collective: NCCL spins). Busy when any shows work."""
    tol = th.heartbeat_s / 4 * NS
    window = [
        b
        for b in beats
        if b["t"] >= now - th.blocked_bound * NS - tol
        and b["t"] - (_num(b.get("dt_s")) or th.heartbeat_s) * NS >= since_t - tol
        and isinstance(b.get("main"), dict)
        and _num(b.get("dt_s"))
    ]
    fresh = bool(window) and (now - window[-1]["t"]) / NS <= 2 * th.heartbeat_s + 1
    if len(window) < 2 or not fresh:
        return Doing("unknown", "no heartbeat figures since it stopped progressing")
    busy: list[str] = []
    cpu = io = faults = child = 0.0
    gpu: list[dict[str, Any]] = []
    for b in window:
        dt = _num(b["dt_s"]) or th.heartbeat_s
        cpu = max(cpu, 100 * max(_num(b.get("cpu_s")) or 0.0, _num(b["main"].get("cpu_s")) or 0.0) / dt)
        io, faults = max(io, (_num(b.get("io_b")) or 0.0) / dt), max(faults, _num(b.get("majflt")) or 0.0)
        child = max(child, 100 * (_num(b.get("child_cpu_s")) or 0.0) / dt)
        if isinstance(b.get("gpu"), dict):
            gpu.append(b["gpu"])
    if cpu >= CPU_BUSY_PCT:
        busy.append("cpu")
    if io >= IO_BUSY_BPS or faults >= MAJFLT_BUSY:
        busy.append("io")
    if child >= CPU_BUSY_PCT and children:
        busy.append("child")
    util = max((_num(g.get("util")) or 0.0 for g in gpu), default=None)
    if util is not None and util >= GPU_BUSY_PCT and not in_collective:
        busy.append("gpu")
    parts = [f"{cpu:.0f} % CPU", _STATES.get(str(window[-1]["main"].get("state")), "state unknown")]
    if "io" in busy:
        parts.append(f"I/O {io / 2**20:.1f} MiB/s, {faults:.0f} page faults per beat")
    if "child" in busy:
        parts.append(f"child processes {child:.0f} % CPU")
    if gpu:
        last = gpu[-1]
        power = _num(last.get("power_w"))
        gpu_text = f"GPU {util:.0f} % util" + (f", {power:.0f} W" if power is not None else "")
    else:
        gpu_text = "no GPU figures"
    return Doing("busy" if busy else "blocked", f"{', '.join(parts)}; {gpu_text}")


# -- progress counters ------------------------------------------------------------------------------------

_VERBS = {"shards": "loading shards", "shapes": "capturing graph shapes"}


def progress_estimate(proc: ProcessRec, beats: list[dict[str, Any]], now: int) -> str | None:
    """ "loading shards 41/64 at 1.8 shards/min, ~13 min left" from its open phases' progress
    (heartbeats and ``done``/``total`` events); None when none of its open phases counts."""
    points: list[tuple[int, float, float, str]] = []  # (t, done, total, unit)
    open_ids = {s.span_id for s in proc.open_spans}
    for span in proc.spans.values():
        if span.span_id in open_ids:  # step events (shard_loaded k/N), the phase's start as step 0
            steps = [(ev["t"], _num(ev["attrs"].get("done")), _num(ev["attrs"].get("total"))) for ev in span.events]
            steps = [(t, done, total) for t, done, total in steps if done is not None and total]
            if steps and steps[0][1] == 1:
                steps.insert(0, (span.start, 0.0, steps[0][2]))
            points += [(t, done, total, "shards") for t, done, total in steps]
        elif span.end is not None and span.parent_id in open_ids:  # a finished step: a graph shape captured
            done, total = _num(span.attrs.get(keys.SHAPE_INDEX)), _num(span.attrs.get(keys.CAPTURE_SHAPES))
            if done is not None and total:
                points.append((span.end, done, total, "shapes"))
    for b in beats:
        for item in b.get("phases") or ():
            prog = item.get("progress") if isinstance(item, dict) else None
            if not isinstance(prog, dict) or (item.get("span") not in open_ids and b is not beats[-1]):
                continue
            done, total = _num(prog.get("done")), _num(prog.get("total"))
            if done is not None and total:
                points.append((b["t"], done, total, str(prog.get("unit") or "steps")))
    if not points:
        return None
    points.sort()
    _, done, total, unit = points[-1]
    same = [p for p in points if p[2] == total and p[3] == unit]
    first = next((p for p in same if p[1] < done), None)
    text = f"{_VERBS.get(unit, unit)} {done:.0f}/{total:.0f}"
    if first is None:
        return text
    reached = next(p[0] for p in same if p[1] >= done)  # when it got there: the rate of whole steps
    per_s = (done - first[1]) / max((reached - first[0]) / NS, 1e-3)
    left = (total - done) / per_s
    return f"{text} at {per_s * 60:.1f} {unit}/min, ~{_duration(left)} left"


def _duration(seconds: float) -> str:
    return (
        f"{seconds:.0f} s"
        if seconds < 90
        else f"{seconds / 60:.0f} min"
        if seconds < 5400
        else f"{seconds / 3600:.1f} h"
    )


# -- the rules --------------------------------------------------------------------------------------------


def analyze(
    run: RunView,
    now_ns: int,
    thresholds: Thresholds | None = None,
    *,
    notices: bool = False,
    read: Read | None = None,
) -> list[Finding]:
    """Alarms first-found order; with ``notices``, also ``busy`` and ``slow`` (not alarms). ``read``:
    what a rank waits on (``evidence.ranks.RankReader``), asked only for the ranks a rule names or finds idle."""
    th = thresholds or Thresholds()
    ranks = [p for p in run.processes if p.role == "rank"]
    active = [p for p in ranks if _initialising(p) and os_state(p) not in ("exited", "zombie")]
    if not active:
        return []
    findings: list[Finding] = []
    beats = {p.ident: _beats(run, p) for p in active}  # by identity: a report may share a local pid
    silent = set()
    for p in active:
        age = (now_ns - _heartbeat_t(beats[p.ident], p)) / NS
        if age >= th.silent_s:
            silent.add(p.ident)
            findings.append(_silent(p, age, active, now_ns, th, read))

    by_world = {w: p for p in ranks if (w := _world_rank(p)) is not None}
    for s in active:
        if s.ident not in silent:
            finding = _waited_on(run, s, beats[s.ident], active, ranks, by_world, now_ns, th, read)
            if finding is not None:
                findings.append(finding)
    findings += _divergence(ranks)
    findings += _rendezvous(active, ranks, now_ns, th, read)
    if not silent and not any(f.kind in EXPLAINED for f in findings):
        findings += _waiting_together(active, beats, now_ns, th, read)

    stalled = [p for p in active if (now_ns - p.last_progress_t) / NS >= th.stall_s]
    # a busy or progressing rank is not "nothing moved"; ranks waiting at the rendezvous are said so
    if len(stalled) == len(active) and not any(f.kind in EXPLAINED for f in findings):
        quiet = min((now_ns - p.last_progress_t) / NS for p in active)
        target = awaited(run, now_ns) if all(p.initialised and p.current is p.root for p in active) else None
        if quiet >= th.no_progress_s and target is not None:  # what is left is another process's step
            others = [p for p in run.processes if starting(p)]
            quiet = min([quiet, *((now_ns - p.last_progress_t) / NS for p in others)])
        if quiet >= th.no_progress_s and target is not None:
            f = waits_for(target, quiet, now_ns, read, f"; {', '.join(p.label for p in active)} initialised, waiting")
            f.procs += [p.ident for p in active]
            findings.append(f)
        elif quiet >= th.no_progress_s:
            places = "; ".join(f"{p.label} {_where(p, now_ns)[1]}" for p in active)
            clause, found = evidence_clause(active, read)
            first = active[0]
            findings.append(
                Finding(
                    "no_progress",
                    first.label,
                    first.pid,
                    _where(first, now_ns)[0],
                    quiet,
                    f"no progress on any rank for {quiet:.0f} s: {places}" + (f"; {clause}" if clause else ""),
                    procs=[p.ident for p in active],
                ).keep(found)
            )
    return findings if notices else [f for f in findings if f.alarm]


def _rendezvous(
    active: list[ProcessRec], ranks: list[ProcessRec], now: int, th: Thresholds, read: Read | None
) -> list[Finding]:
    """Every rank still initialising has waited ``stall_s`` in the rendezvous: no rank here to blame
    (the others, on other nodes, never joined, or the address is not reachable from here)."""
    waiting = [p for p in active if (c := p.current) is not None and c.phase == RENDEZVOUS]
    if not waiting or len(waiting) != len(active):
        return []
    since = min((now - (p.current.start if p.current else now)) / NS for p in waiting)
    if since < th.stall_s:
        return []
    first, span = waiting[0], waiting[0].current
    addr = str(span.attrs.get(keys.INIT_METHOD) or "?") if span else "?"
    world = first.identity.get(keys.WORLD_SIZE) or (span.attrs.get(keys.WORLD_SIZE) if span else None)
    nodes = {p.node for p in waiting if p.node is not None}
    on = f" on node-{'/'.join(map(str, sorted(nodes)))}" if nodes else ""
    labels = ", ".join(p.label for p in waiting)
    seen = f"{len(ranks)} rank{'' if len(ranks) == 1 else 's'} seen"
    seen = f"world size {world}, {len(ranks)} seen" if isinstance(world, int) else seen
    clause, found = evidence_clause(waiting, read)
    return [
        Finding(
            "rendezvous",
            first.label,
            first.pid,
            RENDEZVOUS,
            since,
            f"{labels}{on} {'has' if len(waiting) == 1 else 'have'} waited {since:.0f} s in '{RENDEZVOUS}' for "
            f"the rendezvous at {addr} ({seen}): the other ranks (other nodes) have not joined, or the "
            "address is not reachable from here" + (f"; {clause}" if clause else ""),
            procs=[p.ident for p in waiting],
            doing="waiting for the rendezvous",
        ).keep(found)
    ]


def _waiters(s: ProcessRec, active: list[ProcessRec], now: int, min_wait_s: float) -> dict[str, dict[str, Any]]:
    """Peers waiting at least ``min_wait_s`` in a collective of a group ``s`` belongs to and never entered."""
    waiting = {}
    world = _world_rank(s)
    for peer in active:
        coll = peer.waiting_in
        if peer is s or coll is None or (now - coll["t"]) / NS < min_wait_s:
            continue
        members = _MEMBERS.search(coll["group"])
        if members and world is not None and str(world) not in members.group(1).split(","):
            continue  # s is not in that group
        if s.coll_counts.get(coll["group"], 0) < coll["seq"]:
            waiting[peer.label] = {**coll, "node": peer.node}
    return waiting


def _detail(waiting: dict[str, dict[str, Any]], now: int) -> str:
    """``tp0..tp7 on node-0 wait in barrier #5 on group 'tp:0[0..15]' since 40 s; …``"""
    by_wait: dict[tuple[str, Any], list[str]] = {}
    for label, coll in waiting.items():
        by_wait.setdefault((_wait_text(coll, now), coll.get("node")), []).append(label)
    return "; ".join(
        f"{_labels(labels)}{'' if node is None else f' on node-{node}'} {'waits' if len(labels) == 1 else 'wait'} "
        f"in {text}"
        for (text, node), labels in by_wait.items()
    )


_labels = labels_text  # ``tp0..tp7, tp9``


def _waited_on(
    run: RunView,
    s: ProcessRec,
    beats: list[dict[str, Any]],
    active: list[ProcessRec],
    ranks: list[ProcessRec],
    by_world: dict[int, ProcessRec],
    now: int,
    th: Thresholds,
    read: Read | None = None,
) -> Finding | None:
    """The straggler / busy / slow verdict on one rank that its peers wait for (or left behind)."""
    waiting = _waiters(s, active, now, th.blocked_bound)
    phase, where, in_phase = _where(s, now)
    quiet = (now - s.last_progress_t) / NS
    left = (
        _peers_left(s, ranks, now - int(th.blocked_bound * NS)) if phase and not waiting and quiet >= th.stall_s else []
    )
    if not waiting and not left:
        return None
    detail = _detail(waiting, now) or "peers left it: " + ", ".join(f"{p.label} ({_where(p, now)[1]})" for p in left)
    involved = [s.ident, *(p.ident for p in active if p.label in waiting or p in left)]
    wait_s = max((now - c["t"]) / NS for c in waiting.values()) if waiting else quiet
    own = s.waiting_in
    if own is not None:
        where += f", itself in {_wait_text(own, now)}"
    for_s = f" for {quiet:.0f} s" + (f" (in it {in_phase:.0f} s)" if in_phase and in_phase - quiet > 2 else "")
    estimate = progress_estimate(s, beats, now)
    if estimate is not None and quiet < th.blocked_bound:  # its counters moved just now: slow, not stuck
        return Finding(
            "slow",
            s.label,
            s.pid,
            phase,
            wait_s,
            f"rank {s.label} ({s.who}) is slow, not stuck: {estimate}, {where}; {detail}",
            waiting=_texts(waiting, now),
            procs=involved,
            doing=f"slow ({estimate})",
        )
    what = doing(beats, s.last_progress_t, now, th, own is not None)
    stalled = (what.state == "blocked" and waiting and min(quiet, wait_s) >= th.blocked_bound) or (
        what.state != "busy" and quiet >= th.stall_s
    )
    busy = what.state == "busy" and quiet >= th.busy_bound
    ev = read(s) if read is not None and (stalled or busy) else None
    if ev is not None and ev.busy:  # it waits on its own busy child: busy, never a stall
        if quiet < th.busy_bound:
            return None
        return Finding(
            "busy",
            s.label,
            s.pid,
            phase,
            quiet,
            f"rank {s.label} ({s.who}) {ev.text}, {where}: no progress{for_s} ({what.text}): {detail}",
            waiting=_texts(waiting, now),
            procs=involved,
            doing=f"busy ({what.text})",
        ).keep({s.label: ev})
    more = said(ev)
    if stalled:
        verdict = "is blocked" if what.state == "blocked" else "has made no progress"
        return Finding(
            "straggler",
            s.label,
            s.pid,
            phase,
            quiet,
            f"rank {s.label} ({s.who}) {verdict} {where}{for_s} ({what.text})"
            + (f" and {more}" if more else "")
            + f": {detail}",
            waiting=_texts(waiting, now),
            procs=involved,
            doing=f"{what.state} ({what.text})",
        ).keep({s.label: ev} if ev is not None else {})
    if busy:
        return Finding(
            "busy",
            s.label,
            s.pid,
            phase,
            quiet,
            f"rank {s.label} ({s.who}) is busy, not stuck, {where}: no progress{for_s} ({what.text})"
            + (f"; it {more}" if more else "")
            + f": {detail}",
            waiting=_texts(waiting, now),
            procs=involved,
            doing=f"busy ({what.text})",
        ).keep({s.label: ev} if ev is not None else {})
    return None


# no "no progress" beside these
EXPLAINED = ("straggler", "divergence", "busy", "slow", "rendezvous", "waits_on", "blocked")


def _still(ev: Evidence, th: Thresholds) -> bool:
    """An outside cause that holds it now: a lock, or a socket with nothing to read and nothing in
    for ``blocked_bound`` (where ``tcp_info`` says)."""
    if ev.gone or ev.busy or ev.cause not in ("lock", "socket"):
        return False
    return ev.cause != "socket" or not receives(ev.sockets[0], th)


def receives(sock: Any, th: Thresholds) -> bool:
    """A socket with data waiting, or that received within ``blocked_bound`` (where ``tcp_info``
    says): what waits on it is still fed."""
    return bool(sock.rx_queue) or (sock.last_recv_s is not None and sock.last_recv_s < th.blocked_bound)


def _waiting_together(
    active: list[ProcessRec], beats: dict[ProcId, list[dict[str, Any]]], now: int, th: Thresholds, read: Read | None
) -> list[Finding]:
    """No rank in a collective, every one idle for ``blocked_bound`` (its heartbeats agree), and each
    held by an outside cause the OS shows (a lock, a socket): named within the blocked bound, not
    after the no-progress one. Ranks that share the cause are named together."""
    if read is None or not active:
        return []
    for p in active:
        if p.waiting_in is not None or (now - p.last_progress_t) / NS < th.blocked_bound:
            return []
        if p.current is not None and p.current.phase == RENDEZVOUS:  # said at stall_s: another node may be late
            return []
        if doing(beats[p.ident], p.last_progress_t, now, th, False).state != "blocked":
            return []
    found: dict[str, Evidence] = {}
    for p in active:
        ev = read(p)
        if ev is None or not _still(ev, th):
            return []
        found[p.label] = ev
    groups: dict[Any, list[ProcessRec]] = {}
    for p in active:
        groups.setdefault(cause_key(found[p.label]), []).append(p)
    out = []
    for procs in groups.values():
        labels = [p.label for p in procs]
        shared = shared_cause(found, idle=labels)
        if shared is None or not shared.alarm:
            return []
        first = procs[0]
        phases = {_where(p, now)[1] for p in procs}
        nodes = {p.node for p in procs}
        on = f" on node-{next(iter(nodes))}" if len(nodes) == 1 and None not in nodes else ""
        where = (
            f", {next(iter(phases))}{on}"
            if len(phases) == 1
            else "; " + "; ".join(f"{p.label} {_where(p, now)[1]}" for p in procs)
        )
        quiet = min((now - p.last_progress_t) / NS for p in procs)
        out.append(
            Finding(
                "waits_on",
                first.label,
                first.pid,
                _where(first, now)[0],
                quiet,
                f"{shared.text}{where}",
                procs=[p.ident for p in procs],
                doing=f"waiting ({shared.kind})",
            ).keep({label: found[label] for label in labels})
        )
    return out


def _texts(waiting: dict[str, dict[str, Any]], now: int) -> dict[str, str]:
    return {label: _wait_text(coll, now) for label, coll in waiting.items()}


def _silent(
    p: ProcessRec, age: float, active: list[ProcessRec], now: int, th: Thresholds, read: Read | None = None
) -> Finding:
    phase, where, in_phase = _where(p, now)
    state = os_state(p)
    if state == "stopped":
        cause = "process stopped (SIGSTOP, a debugger)"
    elif state.startswith("unknown"):
        cause = "GIL held or process stopped"
    else:  # sleeping or running, yet its heartbeat thread does not run: something holds the GIL
        cause = f"GIL held; process {state}"
    waiting = _waiters(p, active, now, 0.0)
    detail = f"; {_detail(waiting, now)}" if waiting else ""
    since = f" for {in_phase:.0f} s" if in_phase is not None else ""
    ev = read(p) if read is not None else None
    more = f"; it {said(ev)}" if said(ev) else ""
    return Finding(
        "silent",
        p.label,
        p.pid,
        phase,
        age,
        f"{p.title} ({p.who}) is silent: no heartbeat for {age:.0f} s ({cause}), {where}{since}{more}{detail}",
        waiting=_texts(waiting, now),
        procs=[p.ident],
        doing=f"silent ({cause})",
    ).keep({p.label: ev} if ev is not None else {})


def _peers_left(s: ProcessRec, ranks: list[ProcessRec], before: int) -> list[ProcessRec]:
    """Peers that ran ``s``'s current phase as often as ``s`` did and were out of it by ``before``:
    a rank that waited in a phase for a slow peer leaves it just after that peer, and another node's
    view of it lags by up to a relay interval."""
    phase = s.current.phase if s.current else None
    if phase is None:
        return []
    mine = sum(1 for span in s.open_spans if span.phase == phase) + s.ended(phase)[0]  # >= 1: it is in it
    peers = [p for p in ranks if p is not s]
    left = []
    for p in peers:
        ended, last = p.ended(phase)
        if ended >= mine and last <= before and not any(span.phase == phase for span in p.open_spans):
            left.append(p)
    return left if peers and len(left) == len(peers) else []


def _divergence(ranks: list[ProcessRec]) -> list[Finding]:
    findings = []
    groups = {g for p in ranks for g in p.coll_ops}
    for group in sorted(groups):
        members = [p for p in ranks if group in p.coll_ops]
        common = set.intersection(*(set(p.coll_ops[group]) for p in members)) if len(members) > 1 else set()
        for seq in sorted(common):
            ops = {p.label: p.coll_ops[group][seq] for p in members}
            if len({"p2p" if op in _P2P else op for op in ops.values()}) > 1:
                shown = ", ".join(f"{label} in {op}" for label, op in ops.items())
                first = members[0]
                findings.append(
                    Finding(
                        "divergence",
                        first.label,
                        first.pid,
                        None,
                        0.0,
                        f"ranks diverged on group '{group}' at #{seq}: {shown}",
                        waiting={label: f"{op} #{seq} on group '{group}'" for label, op in ops.items()},
                        procs=[p.ident for p in members],
                    )
                )
                break  # the first divergence of a group is the one that matters
    return findings
