"""The launch's other processes judged like its ranks: the launcher and every helper it started
(detokenizer, tokenizer workers, DP controller …), and who the launch waits on when its ranks are idle.

On processes of the launch that are neither ranks nor ready:

* **silent**: no heartbeat for ``silent_s`` (as a rank; the launcher cannot say it of itself);
* **blocked**: idle for ``blocked_bound`` (its heartbeats agree) in a phase of its own, held by an
  outside cause the OS shows — a lock, or a TCP peer that sends nothing (a tokenizer fetched through
  a dead proxy) — named with it, like a rank; or idle that long, asleep, in an init step that waits
  for no other process (``keys.WORKS_ALONE``), whatever it waits on, unless what it waits on moves
  (a socket that still receives, a busy child) or is the launch (a pipe or IPC socket);
* **holds the launch**: every rank is initialised and idle, the launcher is idle, and a helper has
  not entered its loop (its own init is not done) and is idle: the launch waits on it, whatever it
  waits on (the detokenizer that never entered its loop, a tokenizer worker that never registered);
* **no progress**: no rank is starting any more and nothing moved for ``no_progress_s``: the
  process the launch waits on is named, with what it waits on.

A launcher in a phase that waits for the other processes (``keys.WAITS_FOR_OTHERS``) is never the
one named blocked: its next step is theirs.
"""

from __future__ import annotations

from .. import keys
from ..reader.view import ProcessRec, RunView
from .diagnose import (
    NS,
    Finding,
    Read,
    Thresholds,
    _beats,
    _heartbeat_t,
    _initialising,
    _silent,
    _still,
    _where,
    awaited,
    doing,
    os_state,
    receives,
    said,
    starting,
    waits_for,
)


def _own_phase(run: RunView, proc: ProcessRec) -> bool:
    """The launcher in a step of its own: a phase that does not wait for the others, or its root
    before it started any (past that, between phases, it serves them: uvicorn's supervisor of the
    tokenizer workers, the HTTP server)."""
    span = proc.current
    if span is None or span.phase in keys.WAITS_FOR_OTHERS:
        return False
    return span is not proc.root or not any(p.role == "rank" or p.helper for p in run.processes)


def _outside(ev: object, th: Thresholds) -> bool:
    """A lock, or a TCP peer that sends nothing: a process's pipes and IPC sockets to its own launch
    are how it waits for the others, and a listening socket (the HTTP server's, among the open
    sockets of a process whose system call names none) is its own, not an outside cause."""
    if ev is None or not _still(ev, th):  # type: ignore[arg-type]
        return False
    sockets = ev.sockets  # type: ignore[attr-defined]
    return ev.cause == "lock" or any(s.proto != "unix" and s.state != "LISTEN" for s in sockets)  # type: ignore[attr-defined]


def _asleep(beats: list[dict], proc: ProcessRec, now: int, th: Thresholds) -> bool:
    """Every heartbeat of the blocked bound, since it last progressed, saw its main thread asleep
    (``S``): a process that a busy host starves of CPU is runnable (``R``), not idle, however
    little CPU it got."""
    since = max(proc.last_progress_t, now - int(th.blocked_bound * NS))
    window = [b for b in beats if b["t"] > since and isinstance(b.get("main"), dict)]
    return bool(window) and all(b["main"].get("state") == "S" for b in window)


def _moves_or_waits_on_launch(ev: object, th: Thresholds) -> bool:
    """What it waits on still moves (a socket that received within the blocked bound, a busy child)
    or is its own launch (a pipe or IPC socket; a listening socket waits for whoever connects): not a
    stall of its own."""
    if ev is None:
        return False
    if ev.busy:  # type: ignore[attr-defined]
        return True
    return any(s.proto == "unix" or s.state == "LISTEN" or receives(s, th) for s in ev.sockets)  # type: ignore[attr-defined]


def _context(proc: ProcessRec, ranks: list[ProcessRec], launcher: ProcessRec | None, now: int) -> str:
    """Who waits for it: the launcher in its waiting phase, the ranks initialised."""
    parts = []
    if launcher is not None and launcher is not proc and (span := launcher.current) is not None:
        if span.phase in keys.WAITS_FOR_OTHERS:
            parts.append(f"the launcher waits in '{span.phase}' for {(now - span.start) / NS:.0f} s")
        else:
            parts.append("the launcher waits")
    waiting = [r.label for r in ranks if r.initialised]
    if waiting:
        parts.append(f"{', '.join(waiting)} {'is' if len(waiting) == 1 else 'are'} initialised and wait")
    return f"; {', '.join(parts)}" if parts else ""


def analyze(run: RunView, now: int, th: Thresholds, read: Read | None, explained: bool) -> list[Finding]:
    """Alarms on the launch's processes that are not ranks (``explained``: a rank verdict stands,
    so neither the chain nor the catch-all is looked for)."""
    ranks = run.ranks
    others = [p for p in run.processes if starting(p) and p.exit is None and os_state(p) not in ("exited", "zombie")]
    if not others:
        return []
    launcher = next((p for p in run.processes if p.role == "launcher" and _initialising(p)), None)
    out: list[Finding] = []
    named: set[int] = set()
    for p in others:
        beats = _beats(run, p)
        age = (now - _heartbeat_t(beats, p)) / NS
        if age >= th.silent_s and beats:
            out.append(_silent(p, age, [], now, th, read))
            named.add(p.pid)
            continue
        quiet = (now - p.last_progress_t) / NS
        if quiet < th.blocked_bound or (p.role == "launcher" and not _own_phase(run, p)):
            continue
        what = doing(beats, p.last_progress_t, now, th, False, children=False)
        if what.state != "blocked":
            continue
        ev = read(p) if read is not None else None
        phase, where, _ = _where(p, now)
        if _outside(ev, th):
            message = f"{p.title} ({p.who}) is blocked {where} for {quiet:.0f} s and {said(ev)}"
            doing_text = f"blocked ({ev.cause})"  # type: ignore[union-attr]
        elif phase in keys.WORKS_ALONE and _asleep(beats, p, now, th) and not _moves_or_waits_on_launch(ev, th):
            held = _holds_launch(run, ranks, launcher, now, th, read) if p.helper else []
            if held and held[0].label == p.label:  # the ranks wait too: the launch waits on it
                out += held
                named.add(p.pid)
                continue
            loop = "it has not entered its loop, " if p.helper else ""
            more = said(ev)
            message = f"{p.title} ({p.who}) is blocked {where} for {quiet:.0f} s: {loop}idle ({what.text})" + (
                f" and {more}" if more else ""
            )
            doing_text = f"blocked ({what.text})"
        else:
            continue
        out.append(
            Finding(
                "blocked",
                p.label,
                p.pid,
                phase,
                quiet,
                message + _context(p, ranks, launcher, now),
                procs=[p.ident],
                doing=doing_text,
            ).keep({p.label: ev} if ev is not None else {})
        )
        named.add(p.pid)
    if explained or out:
        return out
    out += _holds_launch(run, ranks, launcher, now, th, read)
    if not out:
        out += _no_progress(run, ranks, now, th, read)
    return out


def _ranks_wait(ranks: list[ProcessRec], now: int, th: Thresholds, bound: float) -> bool:
    """No rank has work of its own left: there are ranks (none yet: the launch still spawns them, as
    a DP controller does while its ranks import), and each is ready, or initialised and idle for
    ``bound``."""
    return bool(ranks) and all(
        r.ready or not _initialising(r) or (r.initialised and (now - r.last_progress_t) / NS >= bound) for r in ranks
    )


def _holds_launch(
    run: RunView,
    ranks: list[ProcessRec],
    launcher: ProcessRec | None,
    now: int,
    th: Thresholds,
    read: Read | None,
) -> list[Finding]:
    bound = th.blocked_bound
    if not _ranks_wait(ranks, now, th, bound):
        return []
    if launcher is not None and (now - launcher.last_progress_t) / NS < bound:
        return []
    for h in sorted((p for p in run.processes if p.helper and starting(p)), key=lambda p: p.last_progress_t):
        quiet = (now - h.last_progress_t) / NS
        if quiet < bound or os_state(h) in ("exited", "zombie"):
            continue
        what = doing(_beats(run, h), h.last_progress_t, now, th, False, children=False)
        if what.state == "busy":
            continue
        ev = read(h) if read is not None else None
        if ev is not None and ev.busy:  # it waits on its own busy child: busy, not stuck
            continue
        more = said(ev)
        phase, where, _ = _where(h, now)
        return [
            Finding(
                "blocked",
                h.label,
                h.pid,
                phase,
                quiet,
                f"{h.title} ({h.who}) holds the launch: it has not entered its loop, {what.state} {where} for "
                f"{quiet:.0f} s ({what.text})" + (f" and {more}" if more else "") + _context(h, ranks, launcher, now),
                procs=[h.ident, *(p.ident for p in ([launcher] if launcher is not None else []))],
                doing=f"{what.state} ({what.text})",
            ).keep({h.label: ev} if ev is not None else {})
        ]
    return []


def _no_progress(run: RunView, ranks: list[ProcessRec], now: int, th: Thresholds, read: Read | None) -> list[Finding]:
    """No rank is starting (``diagnose`` says it when some are) and nothing moved for
    ``no_progress_s``: the process the launch waits on, named first, with what it waits on."""
    if any(_initialising(r) and not r.ready for r in ranks):
        return []
    others = [p for p in run.processes if starting(p)]
    quiet = min((now - p.last_progress_t) / NS for p in others)
    target = awaited(run, now)
    if quiet < th.no_progress_s or target is None:
        return []
    return [waits_for(target, quiet, now, read)]
