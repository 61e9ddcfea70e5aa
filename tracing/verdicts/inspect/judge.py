"""Each process of an untraced launch judged from what ``sample`` read, and the launch's verdict in
the watchdog's words and voice (``voice``: ``sglang-phasetrace: STALL tp1 (pid N) is in
'eagle.get_embed_and_head' (…), idle; tp0 waits in a barrier …``), with the hints that match.

As the watchdog: the same frame, no CPU and no I/O over the window is blocked. A rank that is in no
collective while its peers wait in one is the rank they wait for. Exit codes are ``status``'s."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ...redact import printable, redact_text
from .. import evidence as evidence_mod
from ..diagnose import PREFIX, Finding
from ..evidence.proc import age_s
from ..hints import for_finding
from ..voice import said
from . import extras
from .frames import Collective, Phase, PhaseMap, Targets, collective, loop_frame, serving, short
from .launch import Launch, Member
from .sample import Sampled, gil, main_frames, python_frames, sample, stayed, text

EXIT_OK, EXIT_ERROR, EXIT_STALLED, EXIT_FAILED = 0, 1, 3, 4
BUSY_PCT = 50.0  # CPU over the window above which a process that stays in one frame is busy
IO_BYTES = 1 << 20  # read or written over the window: it moves (loading weights)
SPIN_SILENT_S = 600.0  # a rank busy in one frame with peers waiting is a stall once the log is this silent
PTRACE_HOWTO = (
    "allow it with `sudo sysctl kernel.yama.ptrace_scope=0` (Yama), run inspect as the launch's user, "
    "or give the container CAP_SYS_PTRACE (`docker run --cap-add SYS_PTRACE`)"
)


@dataclass
class Seen:
    """One process as inspect saw it."""

    member: Member
    state: str  # serving, progressing, busy, blocked, gone
    cpu_pct: float | None
    rss: int | None
    age_s: float | None
    io_bytes: int | None
    phase: Phase | None = None
    collective: Collective | None = None
    top: str | None = None  # the innermost Python frame
    native_top: str | None = None  # the innermost native frame (a --native dump)
    gil: bool = False
    stack: str = ""  # every thread of its last dump, redacted
    evidence: evidence_mod.Evidence | None = None
    gpu: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        m = self.member
        return {
            "pid": m.pid,
            "ppid": m.ppid,
            "role": m.role,
            "label": m.label,
            "cmd": printable(m.cmd)[:300],
            "state": self.state,
            "cpu_pct": None if self.cpu_pct is None else round(self.cpu_pct, 1),
            "rss": self.rss,
            "age_s": None if self.age_s is None else round(self.age_s, 1),
            "io_bytes": self.io_bytes,
            "phase": self.phase.name if self.phase else None,
            "phase_where": self.phase.where if self.phase else None,
            "collective": self.collective.words if self.collective else None,
            "top": self.top,
            "native_top": self.native_top,
            "holds_gil": self.gil,
            "waits_on": self.evidence.text if self.evidence else None,
            "evidence": msgspec.to_builtins(self.evidence) if self.evidence else None,
            "gpu": self.gpu,
            "stack": self.stack,
        }


@dataclass
class Report:
    launch: Launch
    seen: list[Seen]
    word: str  # STALL, DIED, NOTICE, serving, progressing
    line: str  # the verdict as printed, prefix first
    exit_code: int
    hints: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what could not be read, GPU, /health, the log
    log: extras.Log | None = None
    health: str | None = None
    health_url: str | None = None
    traced: str | None = None  # run directory of a launch traced after all ("" when not named)
    window_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "launcher": self.launch.launcher.pid,
            "verdict": self.word,
            "line": self.line,
            "exit_code": self.exit_code,
            "hints": self.hints,
            "notes": self.notes,
            "log": {"path": printable(self.log.path), "silent_s": round(self.log.silent_s, 1)} if self.log else None,
            "health": {"url": self.health_url, "answer": self.health} if self.health_url else None,
            "traced": self.traced,
            "window_s": self.window_s,
            "processes": [s.to_json() for s in self.seen],
        }


def duration(s: float) -> str:
    """``7 h 52 min``, ``3 min 5 s``, ``12 s``."""
    s = int(s)
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60} min"
    if s >= 60:
        return f"{s // 60} min {s % 60} s"
    return f"{s} s"


def _frame(f: dict[str, Any]) -> str:
    return f"{f.get('name')} ({short(str(f.get('filename', '')), f.get('line'))})"


def seen_of(m: Member, s: Sampled, where: PhaseMap, locks: Any, launch_pids: set[int]) -> Seen:
    last = next((d for d in reversed(s.dumps) if d.threads is not None), None)
    frames = main_frames(last.threads, m.pid) if last else []
    py = python_frames(frames)
    native = main_frames(s.native.threads, m.pid) if s.native and s.native.threads else []
    phase = where.phase(py) if py else None
    coll = collective(py, native) if py else None
    gone = s.last.state in (None, "Z", "X") or m.zombie
    cpu, io = s.cpu_pct, s.io_bytes
    if gone:
        state = "gone"
    elif py and serving(py, phase):
        state = "serving"
    elif last is not None and not stayed(s) and all(d.threads is not None for d in s.dumps):
        state = "progressing"
    elif cpu is not None and cpu >= BUSY_PCT:
        state = "busy"
    elif io is not None and io >= IO_BYTES:
        state = "progressing"
    else:
        state = "blocked"
    native_top = next((f.get("name") for f in native if not str(f.get("filename", "")).endswith(".py")), None)
    stack = text(last.threads, m.pid) if last else ""
    if s.native and s.native.threads:
        stack += "\n=== with native frames ===\n" + text(s.native.threads, m.pid)
    ev = None
    if state in ("blocked", "busy"):
        native_text = text(s.native.threads, m.pid) if s.native and s.native.threads else None
        ev = evidence_mod.read(m.pid, launch_pids=launch_pids, native=native_text, locks=locks)
    return Seen(
        member=m,
        state=state,
        cpu_pct=cpu,
        rss=s.last.rss or s.first.rss,
        age_s=age_s(m.pid),
        io_bytes=io,
        phase=phase,
        collective=coll,
        top=printable(_frame(loop_frame(py) if state == "serving" and loop_frame(py) else py[0])) if py else None,
        native_top=printable(native_top) if native_top else None,
        gil=gil(s),
        stack=redact_text(stack, limit=None),
        evidence=ev,
    )


def inspect(launch: Launch, targets: Targets, exe: str | None, window_s: float = 3.0, rounds: int = 3) -> Report:
    """Read every process of ``launch`` over ``window_s`` and judge it (sends no signal); ``exe``:
    py-spy (``sample.py_spy_exe()``), None where it is not installed."""
    pids = [m.pid for m in launch.members]
    ranks = {m.pid for m in launch.ranks} or {launch.launcher.pid}
    url = extras.endpoint(launch.launcher.cmd)
    with ThreadPoolExecutor(max_workers=1) as side:  # /health while the window runs
        answer = side.submit(extras.health, url) if url else None
        sampled = sample(pids, window_s, exe, rounds, native=lambda s: _suspect(s, ranks))
        health = answer.result() if answer else None
    locks = evidence_mod.read_locks()
    where = PhaseMap(targets)
    seen = [seen_of(m, sampled[m.pid], where, locks, launch.pids) for m in launch.members]
    gpu, gpu_note = extras.gpus(set(pids))
    for s in seen:
        s.gpu = gpu.get(s.member.pid)
    report = Report(launch, seen, "", "", 0, window_s=window_s, health=health, health_url=url)
    report.log = extras.log_silence(pids)
    report.traced = extras.traced(pids)
    problems = [d.problem for s in sampled.values() if all(d.threads is None for d in s.dumps) for d in s.dumps]
    if exe is None:
        report.notes.append("py-spy is not installed (pip install py-spy): no stacks; judged from /proc alone")
    elif "refused" in problems:
        who = sorted({p for p, s in sampled.items() if any(d.problem == "refused" for d in s.dumps)})
        words = next(d.words for s in sampled.values() for d in s.dumps if d.problem == "refused")
        report.notes.append(
            f"could not read the Python stacks of pid {', '.join(map(str, who))} (py-spy: {words}): ptrace is not "
            f"allowed; {PTRACE_HOWTO}; judged from /proc alone"
        )
    elif any(p not in (None, "gone", "not_python") for p in problems):
        quiet = (None, "gone", "not_python")
        words = next(d.words for s in sampled.values() for d in s.dumps if d.problem not in quiet)
        report.notes.append(f"py-spy could not read every process ({words}); those judged from /proc alone")
    if gpu_note and not gpu and "NotFound" not in gpu_note:  # no NVIDIA driver here: nothing to say
        report.notes.append(gpu_note)
    judge(report)
    return report


def _suspect(s: Sampled, ranks: set[int]) -> bool:
    """Worth a --native dump (it pauses the process for the dump): a rank whose stack stayed in one
    place, in no collective and not in its loop — what it sits in is the verdict's detail."""
    if s.pid not in ranks:
        return False
    last = next((d for d in reversed(s.dumps) if d.threads is not None), None)
    py = python_frames(main_frames(last.threads, s.pid)) if last else []
    return bool(py) and collective(py) is None and not serving(py, None)


def _who(s: Seen) -> str:
    return f"{s.member.label} (pid {s.member.pid})"


def _doing(s: Seen) -> str:
    """``is in 'eagle.get_embed_and_head' (llama.py:412), idle`` / ``…, busy in C (`sre_match`) …``."""
    if s.phase is not None:
        at = f"is in '{s.phase.name}' ({s.phase.where})"
    elif s.top:
        at = f"is at {s.top}"
    else:
        at = "(no stack read)"
    if s.state == "busy":
        inside = f" in C (`{s.native_top}`)" if s.native_top else ""
        held = ", holding the GIL" if s.gil else ""
        how = f"busy{inside}{held}, {s.cpu_pct:.0f} % CPU, in one frame for the whole window"
    else:
        how = "idle" if (s.cpu_pct or 0) < 5 else f"{s.cpu_pct:.0f} % CPU"
    ev = s.evidence
    more = f", {ev.text}" if ev is not None and ev.cause in ("lock", "child", "socket") else ""
    if ev is not None and ev.cause == "native" and s.top is None:
        more = f", {ev.text}"
    return f"{at}, {how}{more}"


def _group(report: Report, c: Collective) -> str:
    ranks = report.launch.ranks
    tp_only = ranks and all(r.label.startswith("tp") and "-" not in r.label for r in ranks)
    return " on the TP group (every rank of this launch)" if tp_only and c.via.startswith("GroupCoordinator") else ""


def _peers(report: Report, waiting: list[Seen]) -> str:
    by: dict[str, list[str]] = {}
    for s in waiting:
        by.setdefault(s.collective.words + _group(report, s.collective), []).append(s.member.label)
    return "; ".join(
        f"{evidence_mod.labels_text(labels)} {'waits' if len(labels) == 1 else 'wait'} in {words}"
        for words, labels in by.items()
    )


def _log(report: Report) -> str:
    return f"; log silent {duration(report.log.silent_s)}" if report.log and report.log.silent_s >= 10 else ""


def _speak(report: Report, kind: str, named: Seen, message: str, involved: list[Seen]) -> None:
    phase = named.phase.name if named.phase else None
    finding = Finding(kind, named.member.label, named.member.pid, phase, 0.0, message)
    finding.evidence = {s.member.label: msgspec.to_builtins(s.evidence) for s in involved if s.evidence is not None}
    report.word = "STALL" if finding.alarm and kind != "died" else "DIED" if kind == "died" else "NOTICE"
    report.line = printable(said(finding))
    report.hints = [printable(f"{PREFIX} {h}") for h in for_finding(finding)]


def judge(report: Report) -> None:
    """The verdict: DIED (4), STALL (3), else serving / progressing / a NOTICE (0); a launch gone
    altogether while it was read is no verdict (1)."""
    ranks = [s for s in report.seen if s.member.role == "scheduler"]
    gone = [s for s in report.seen if s.state == "gone" and s.member.role in ("scheduler", "launcher")]
    launcher = report.seen[0]
    if all(s.state == "gone" for s in report.seen):  # the whole launch stopped: nothing left to judge
        report.word, report.exit_code = "ended", EXIT_ERROR
        report.line = printable(f"{PREFIX} ended: launch pid {launcher.member.pid} ended while it was read")
        return
    if gone:
        s = gone[0]
        zombie = "is a zombie (it exited; its parent has not collected it)"
        how = zombie if s.member.zombie else "ended while it was read"
        others = [g for g in gone[1:]]
        tail = f"; also gone: {', '.join(_who(g) for g in others)}" if others else ""
        _speak(report, "died", s, f"{_who(s)} {how} (launch pid {launcher.member.pid}){tail}", gone)
        report.exit_code = EXIT_FAILED
        return
    if ranks and all(s.state == "serving" for s in ranks):
        health = f"; /health: {report.health}" if report.health else ""
        report.word, report.exit_code = "serving", EXIT_OK
        report.line = printable(
            f"{PREFIX} serving: launch pid {launcher.member.pid}, {len(ranks)} rank"
            f"{'s' if len(ranks) != 1 else ''} in their event loop{health}"
        )
        return
    if not ranks:  # the launcher has not started its ranks (or they are not named yet)
        lone = [launcher]
    else:
        lone = ranks
    active = [s for s in lone if s.state not in ("serving",)]
    waiting = [s for s in active if s.collective is not None and s.state in ("blocked", "busy")]
    culprits = [s for s in active if s.collective is None and s.state in ("blocked", "busy")]
    moving = [s for s in active if s.state == "progressing"]
    stacks = any(s.top for s in lone)
    if culprits and stacks:
        named = culprits[0]
        others = "".join(f"; {_who(c)} {_doing(c)}" for c in culprits[1:])
        peers = f"; {_peers(report, waiting)}" if waiting else ""
        message = f"{_who(named)} {_doing(named)}{others}{peers}{_log(report)}"
        spinning = all(c.state == "busy" for c in culprits)
        silent_long = report.log is not None and report.log.silent_s >= SPIN_SILENT_S
        if moving or (spinning and not silent_long):
            why = "busy, not stuck in this window" if spinning else "others progress"
            message += f" ({why}; run inspect again, or with a longer --window)"
            _speak(report, "busy", named, message, culprits)
            report.exit_code = EXIT_OK
            return
        _speak(report, "straggler", named, message, [*culprits, *waiting])
        report.exit_code = EXIT_STALLED
        return
    if waiting and not moving:
        named = waiting[0]
        message = f"every rank waits in a collective and none moved in {report.window_s:.0f} s: "
        message += _peers(report, waiting) + _log(report)
        _speak(report, "no_progress", named, message, waiting)
        report.exit_code = EXIT_STALLED
        return
    if not stacks and active and not moving and all(s.state == "blocked" for s in active):
        named = active[0]
        each = "; ".join(
            f"{_who(s)} {s.evidence.text if s.evidence else 'is idle'} ({s.cpu_pct or 0:.0f} % CPU)" for s in active
        )
        message = f"no rank moved in {report.window_s:.0f} s (no stacks: from /proc alone): {each}{_log(report)}"
        _speak(report, "no_progress", named, message, active)
        report.exit_code = EXIT_STALLED
        return
    report.word, report.exit_code = "progressing", EXIT_OK
    shown = "; ".join(f"{_who(s)} {_doing(s)}" if s.state != "progressing" else _progress(s) for s in active)
    report.line = printable(f"{PREFIX} progressing: launch pid {launcher.member.pid}: {shown or 'starting'}")


def _progress(s: Seen) -> str:
    at = f" in '{s.phase.name}' ({s.phase.where})" if s.phase else f" at {s.top}" if s.top else ""
    return f"{_who(s)} progresses{at}, {s.cpu_pct or 0:.0f} % CPU"
