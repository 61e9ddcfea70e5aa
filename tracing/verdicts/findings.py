"""The verdicts on a run, put together in one place (``live``), root cause first: ranks that died,
failed or never started (``postmortem``, ``not_started``), then a fresh ``diagnose.analyze``; for the
viewers (``findings``) after the watchdog's diagnosis records that still hold — so the watchdog,
``status``, ``report``, the exports and ``run`` give one verdict per rank, in one order."""

from __future__ import annotations

from typing import Any

from .. import other_processes
from ..reader.view import ProcessRec, RunView
from . import evidence, launch_waits, postmortem, usual
from .diagnose import VERDICT, Finding, Read, Thresholds, analyze, said
from .not_started import not_started

NS = 1_000_000_000
ENDED = ("died", "failed", "stopped")  # kinds that do not un-happen


def from_record(record: dict[str, Any]) -> Finding:
    """A ``diagnosis`` journal record (Finding's fields; the finding's kind as ``finding``)."""
    waiting = record.get("waiting")
    stacks = record.get("stacks")
    told = record.get("evidence")
    told = told if isinstance(told, dict) else {}
    return Finding(
        kind=str(record.get("finding") or "stall"),
        label=str(record.get("label") or ""),
        pid=int(record.get("pid") or 0),
        phase=record.get("phase"),
        since_s=float(record.get("since_s") or 0.0),
        message=str(record.get("message") or ""),
        waiting={str(k): str(v) for k, v in waiting.items()} if isinstance(waiting, dict) else {},
        stacks=[str(s) for s in stacks] if isinstance(stacks, list) else [],
        evidence={str(k): v for k, v in told.items() if evidence.from_builtins(v) is not None},
    )


def process_of(run: RunView, finding: Finding) -> ProcessRec | None:
    """The process a finding names: as read (``Finding.proc``); a recorded one's by pid, else label."""
    procs_ = run.processes
    if finding.proc is not None:
        return next((p for p in procs_ if p.ident == finding.proc), None)
    return next((p for p in procs_ if finding.pid and p.pid == finding.pid), None) or next(
        (p for p in procs_ if finding.label and p.label == finding.label), None
    )


def _holds(run: RunView, finding: Finding) -> bool:
    """A recorded verdict holds while its rank has not moved on: not ready, and the phase it names
    not ended well since (a phase ended *incomplete*, by the process's exit, did not move on)."""
    proc = process_of(run, finding)
    if proc is None or finding.kind in ENDED:
        return True
    if proc.ready:
        return False
    if finding.kind == "not_started":
        return not proc.spans
    spans = [s for s in proc.spans.values() if s.phase == finding.phase]
    return finding.phase is None or not spans or spans[-1].status != "ok"


def running(proc: ProcessRec) -> bool:
    """The journal's process runs on this host now, as the same process (pid, and its start time and
    boot where the journal records them): whether it is gone, never whether it may be signalled
    (``watchdog.pinned``). Another node's report is never running here."""
    return (
        proc.remote is None
        and proc.host == other_processes.this_host()
        and other_processes.alive(proc.pid)
        and (
            proc.start_ticks is None
            or other_processes.same_process(proc.pid, proc.host, proc.start_ticks, proc.boot_id)
        )
    )


def gone_ranks(run: RunView) -> dict[int, other_processes.Ended | None]:
    """Rank and helper processes of this host that are no longer running though not ready (how they
    ended is known only to their parent: None), for ``postmortem``. Those of other hosts: never guessed."""
    return {
        p.pid: None
        for p in run.processes
        if (p.role == "rank" or p.helper)
        and not p.ready
        and p.exit is None
        and p.host == other_processes.this_host()
        and not running(p)
    }


def recorded(run: RunView) -> set[tuple[int, str]]:
    """(pid, verdict word) of every diagnosis some process of the run recorded: already said."""
    out = set()
    for proc in run.processes:
        for record in proc.diagnoses:
            f = from_record(record)
            if f.alarm:
                out.add((f.pid, VERDICT.get(f.kind, "STALL")))
    return out


def live(
    run: RunView,
    now_ns: int,
    th: Thresholds,
    gone: dict[int, other_processes.Ended | None] | None = None,
    ends: list[postmortem.Ending] | None = None,
    *,
    notices: bool = False,
    named: set[Any] | None = None,
    read: Read | None = None,
) -> list[tuple[Finding, int]]:
    """What the journals say now, one finding per rank, each with when its trouble began (ns): ranks
    that ended during init (``postmortem``: ``gone``, pids known to be no longer running; exit
    records and error ends are used in any case), then ranks that never reached their first phase,
    then a fresh analysis of the others (``notices``: busy and slow ones too). A rank ``named``
    (pid or label) already is left out. ``read``: what a rank waits on (``evidence.ranks.RankReader``),
    asked for the ranks a verdict or notice names. The one place verdicts are put together: the
    watchdog's pass and every viewer (``findings``) both call it."""
    named = set() if named is None else named
    if ends is None:
        ends = postmortem.endings(run, gone or {})
    ended_at = {e.proc.ident: e.t for e in ends}
    out: list[tuple[Finding, int]] = []
    ranks = analyze(run, now_ns, th, notices=notices, read=read)
    explained = any(f.alarm and f.kind != "no_progress" for f in ranks)
    others = launch_waits.analyze(run, now_ns, th, read, explained)  # first: a rank verdict naming one is its copy
    for found, when in (
        (postmortem.findings(run, gone or {}, ends), ended_at),
        (not_started(run, now_ns, th.stall_s, th.no_progress_s), {}),
        (others, {}),
        (ranks, {}),
    ):
        for f in found:
            if f.proc in named or (f.pid and f.pid in named) or (f.label and f.label in named):
                continue
            # processes by identity (a report may share a local pid); bare pids only come from ``named``
            # (recorded verdicts say no host)
            named.update(x for x in (f.proc, f.label, *f.evidence, *(f.procs if f.kind == "stopped" else ())) if x)
            if f.kind == "not_started":
                _waits_on(run, f, read)
            out.append((f, when.get(f.proc, now_ns - int(f.since_s * NS))))
    known = usual.known(run)  # the launch's earlier starts: "usually N s", a phase past all of them
    if known is not None:
        involved = named | {ident for f, _ in out for ident in f.procs}  # a peer a verdict says waits is explained
        for f in usual.unusual(run, now_ns, th, known, involved) if notices else ():
            named.update(x for x in (f.proc, f.label) if x)
            out.append((f, now_ns - int(f.since_s * NS)))
        usual.annotate(run, [f for f, _ in out], now_ns, known)
    return out


def _waits_on(run: RunView, finding: Finding, read: Read | None) -> None:
    """What the rank a finding names waits on, said after its line (the rules that read it while
    judging, in ``diagnose``, say it in their own words)."""
    proc = process_of(run, finding)
    ev = read(proc) if proc is not None and read is not None else None
    if proc is not None and ev is not None:
        finding.keep({proc.label: ev})
        if said(ev):
            finding.message += f"; it {said(ev)}"


def findings(
    run: RunView,
    now_ns: int,
    thresholds: Thresholds | None = None,
    gone: dict[int, other_processes.Ended | None] | None = None,
    read: Read | None = None,
) -> list[Finding]:
    """One finding per rank, alarms before notices, the alarm that began first (the root cause)
    first: recorded diagnoses that still hold, then what the journals say now (``live``; ``read``:
    what a rank waits on, for the ranks a fresh verdict names)."""
    th = thresholds or Thresholds.from_env()
    began: dict[int, int] = {}  # id(finding) -> ns: when the trouble began
    try:
        ends: list[postmortem.Ending] | None = postmortem.endings(run, gone or {})
    except Exception:  # said below, where the same call fails again
        ends = None
    ended_at = {e.proc.pid: e.t for e in ends or ()}  # recorded verdicts say a pid, not a host
    latest: dict[tuple[int, str], tuple[Finding, int]] = {}
    for proc in run.processes:
        for record in sorted(proc.diagnoses, key=lambda r: r["t"]):
            finding = from_record(record)
            if finding.kind in ENDED:  # it began as the rank ended (its since_s: how long it was in its phase)
                t = ended_at.get(finding.pid, record["t"])
            else:
                t = record["t"] - int(finding.since_s * NS)
            latest[(finding.pid, finding.label)] = (finding, t)
    shown: list[Finding] = []
    for finding, t in latest.values():
        if _holds(run, finding):
            shown.append(finding)
            began[id(finding)] = t
    named = {f.pid for f in shown if f.pid} | {f.label for f in shown if f.label}
    named |= {label for f in shown if f.kind == "waits_on" for label in f.evidence}  # ranks named together
    try:
        for finding, t in live(run, now_ns, th, gone, ends, named=named, read=read):
            shown.append(finding)
            began[id(finding)] = t
    except Exception as exc:  # a verdict we cannot compute is said, not fatal
        shown.append(Finding("unknown", "", 0, None, 0.0, f"stall analysis failed: {exc!r}"))
    return sorted(shown, key=lambda f: (not f.alarm, began.get(id(f), now_ns)))


def alarms(found: list[Finding]) -> list[Finding]:
    """The verdicts (not the notices: a busy or progressing rank is not stuck)."""
    return [f for f in found if f.alarm]


def by_process(run: RunView, found: list[Finding]) -> dict[int, Finding]:
    """pid -> the finding that names it (the first); one that names ranks together (they wait on one
    cause) names each of them."""
    out: dict[int, Finding] = {}
    by_label = {p.label: p for p in run.processes}
    for finding in found:
        proc = process_of(run, finding)
        if proc is not None:
            out.setdefault(proc.pid, finding)
        if finding.kind == "stopped":  # every process the stop ended
            for pid in finding.pids:
                out.setdefault(pid, finding)
        if finding.kind == "waits_on":
            for label in finding.evidence:
                if label in by_label:
                    out.setdefault(by_label[label].pid, finding)
    return out
