"""Ranks (and the launch's other processes) that ended during init: who died or failed first (the
root cause), and who followed — or, when they ended together by one signal, that the launch was
stopped from outside (Ctrl-C, systemd, Slurm, Kubernetes): one ``stopped`` finding, no root cause.

A rank process that is gone before it was ready, or whose rank root ended with an error, is a
finding. The first one in time is the root cause; a rank that failed after it is labelled a
consequence (SGLang's peers fail within a second of a dead peer: "TP rank 0 could finish the model
loading, but there are other ranks that didn't finish loading…"). How a process ended (signal or
exit code) is known to its parent (``other_processes.child_ended``) and recorded as an ``exit`` record by
whoever saw it; other watchers read that record or say "gone".
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import keys, other_processes
from ..reader.view import ProcessRec, RunView
from ..redact import redact_text
from .diagnose import Finding

NS = 1_000_000_000


@dataclass(frozen=True)
class Ending:
    proc: ProcessRec
    t: int  # when it ended (or was last heard of)
    how: str  # "killed by SIGKILL (likely the OOM killer)", "failed: ValueError: …", "is gone"
    phase: str | None
    in_phase_s: float | None
    failed: bool  # ended with an error of its own (vs. died)
    signal: str | None = None  # the signal that ended it, where known ("SIGTERM")


def _innermost_at(proc: ProcessRec, t: int) -> tuple[str | None, float | None]:
    """The innermost phase that was open at ``t`` (open, or ended at/after t), and for how long."""
    inside = [s for s in proc.spans.values() if s.start <= t and (s.end is None or s.end >= t)]
    inside = [s for s in inside if s.phase not in keys.ROOT_PHASES] or inside
    if not inside:
        return None, None
    span = max(inside, key=lambda s: s.start)
    return span.phase, (t - span.start) / NS


def _error_phase(proc: ProcessRec) -> tuple[str | None, float | None, str]:
    failed = [s for s in proc.spans.values() if s.status == "error" and s.phase not in keys.ROOT_PHASES]
    span = max(failed, key=lambda s: s.start) if failed else proc.root
    error = (span.error if span is not None else None) or {}
    text = ": ".join(str(x) for x in (error.get("type"), error.get("message")) if x) or "an error"
    seconds = (span.end - span.start) / NS if span is not None and span.end else None
    return (span.phase if span is not None else None), seconds, redact_text(text.splitlines()[0][:300])


def endings(run: RunView, gone: dict[int, other_processes.Ended | None]) -> list[Ending]:
    """Ranks that ended before ready, oldest first. ``gone``: pid -> how it ended (None: unknown)
    for rank processes no longer running."""
    out = []
    torn = _torn_down(run)
    served = any(p.role == "launcher" and p.serving for p in run.processes)
    for proc in run.processes:
        if not (proc.role == "rank" or proc.helper) or proc.ready or (proc.helper and served):
            continue  # a helper of a launch that serves ended with it (its loop may not be traced)
        root = proc.root
        recorded = proc.exit  # an ``exit`` record someone wrote for it
        # ``gone`` names pids of this host's journals: never another node's report with the same pid
        mine = proc.remote is None and proc.host == other_processes.this_host() and proc.pid in gone
        if root is not None and root.status == "error":
            phase, seconds, text = _error_phase(proc)
            out.append(Ending(proc, root.end or proc.last_t, f"failed: {text}", phase, seconds, True))
        elif mine or recorded is not None:
            ended = gone.get(proc.pid) if mine else None
            if _finished_cleanly(proc, ended, recorded):
                continue
            raised = [s.end for s in proc.spans.values() if s.status == "error" and s.end]
            if proc.initialised and raised:
                # a warm-up pass raised: SGLang's rank process caught it and ended, its root still open
                phase, seconds, text = _error_phase(proc)
                out.append(Ending(proc, max(raised), f"failed: {text}", phase, seconds, True))
                continue
            if ended is None and recorded is not None:
                ended = other_processes.Ended(proc.pid, recorded.get("code"), _signum(recorded.get("signal")))
            how = ended.describe() if ended is not None else "is gone (exit status not visible from this process)"
            t = max(proc.last_t, torn.get((proc.host, proc.pid), 0))  # running as the teardown began: ended in it
            phase, seconds = _innermost_at(proc, t)
            sig = ended.signal_name if ended is not None and ended.signal is not None else None
            out.append(Ending(proc, t, how, phase, seconds, False, sig))
    return sorted(out, key=lambda e: e.t)


def _torn_down(run: RunView) -> dict[tuple[str | None, int], int]:
    """(host, pid) -> when SGLang began tearing the launch down, for the ranks its launcher saw running
    then: a blocked rank is last heard of seconds before it is killed, yet it ended after the
    failure that set off the teardown."""
    out: dict[tuple[str | None, int], int] = {}
    for proc in run.processes:
        for span in proc.spans.values() if proc.role == "launcher" else ():
            for pid in span.attrs.get(keys.ALIVE_AT_TEARDOWN) or ():
                out[proc.host, pid] = max(out.get((proc.host, pid), 0), span.start)
    return out


def _finished_cleanly(proc: ProcessRec, ended: other_processes.Ended | None, recorded: dict | None) -> bool:
    """A process without a rank root (a program of ranks, not a Scheduler) that ended every phase
    well and did not die of a signal or an error code: it finished, it did not fail."""
    code = ended.code if ended is not None else (recorded or {}).get("code")
    killed = (ended is not None and ended.signal is not None) or bool((recorded or {}).get("signal"))
    return (
        proc.root is None
        and not killed
        and code in (0, None)
        and bool(proc.spans)
        and all(s.status == "ok" for s in proc.spans.values())
    )


def _signum(name: object) -> int | None:
    import signal

    try:
        return int(signal.Signals[str(name)]) if name else None
    except KeyError:
        return None


def describe(ending: Ending, root: Ending | None) -> str:
    """``rank tp1 (pid 4242) was killed by SIGKILL (likely the OOM killer; last RSS 2.0 GiB) in
    'model.loader' after 12 s`` (+ ``— a consequence of tp0's death 0.4 s earlier``)."""
    p = ending.proc
    how = ending.how
    if "SIGKILL" in how:
        note = other_processes.memory_note((p.last_heartbeat or {}).get("rss"))
        if note and p.host == other_processes.this_host():
            how = how.replace("(likely the OOM killer)", f"(likely the OOM killer; {note})")
    where = f" in '{ending.phase}'" if ending.phase else " before its first phase"
    after = f" after {ending.in_phase_s:.0f} s" if ending.in_phase_s is not None else ""
    verb = "" if how.startswith(("failed", "is gone")) else "was "
    text = f"{p.title} ({p.who}) {verb}{how}{where}{after}"
    if root is not None and root is not ending:
        text += (
            f" — a consequence of {root.proc.label}'s {'failure' if root.failed else 'death'} "
            f"{(ending.t - root.t) / NS:.1f} s earlier"
        )
    return text


# Endings this close to the first, by its signal, are one stop: a process's last record (a
# heartbeat) is up to one interval before its end.
STOP_WINDOW_S = 2 * keys.HEARTBEAT_S + 1.0


def stopped(run: RunView, ends: list[Ending]) -> list[Ending] | None:
    """The endings that are one stop from outside: at least two processes ended within
    ``STOP_WINDOW_S`` of the first ending, none with an error of its own, each by one signal or
    where how is not known (a process its parent reaped before the watchdog asked), and SGLang did
    not tear the launch down (its teardown SIGKILLs the survivors of a failure: consequences).
    None otherwise."""
    if len(ends) < 2 or _torn_down(run):
        return None
    together = [e for e in ends if (e.t - ends[0].t) / NS <= STOP_WINDOW_S]
    signals = {e.signal for e in together if e.signal is not None}
    if (
        len(together) < 2
        or len(signals) != 1
        or any(e.failed or (e.signal is None and "gone" not in e.how) for e in together)
    ):
        return None
    return together


def stop_text(stop: list[Ending]) -> str:
    """``by SIGTERM from outside the launch: tp0, tp1, detokenizer ended by it together (tp0 was in
    'rank' after 199 s)``: the line after ``STOPPED``."""
    first, [signal] = stop[0], {e.signal for e in stop if e.signal is not None}
    where = f" in '{first.phase}'" if first.phase else " before its first phase"
    after = f" after {first.in_phase_s:.0f} s" if first.in_phase_s is not None else ""
    labels = ", ".join(e.proc.label for e in stop)
    was = f"{first.proc.label} was{where}{after}"
    return f"by {signal} from outside the launch: {labels} ended by it together ({was})"


def findings(
    run: RunView, gone: dict[int, other_processes.Ended | None], ends: list[Ending] | None = None
) -> list[Finding]:
    """One finding per rank that ended during init (kind ``died`` or ``failed``), root cause first
    (``ends``: ``endings(run, gone)``, when the caller has them already); one ``stopped`` finding
    for the processes a signal from outside ended together."""
    ends = endings(run, gone) if ends is None else ends
    stop = stopped(run, ends)
    if stop is not None:
        first = stop[0]
        found = Finding(
            "stopped", "launch", first.proc.pid, None, first.in_phase_s or 0.0, stop_text(stop),
            procs=[e.proc.ident for e in stop],
        )  # fmt: skip
        rest = [e for e in ends if e not in stop]
        return [found, *_each(rest, None)]
    return _each(ends, ends[0] if ends else None)


def _each(ends: list[Ending], root: Ending | None) -> list[Finding]:
    return [
        Finding(
            "failed" if e.failed else "died",
            e.proc.label,
            e.proc.pid,
            e.phase,
            e.in_phase_s or 0.0,
            describe(e, root),
            procs=[e.proc.ident],
        )
        for e in ends
    ]


def root_cause_line(run: RunView, gone: dict[int, other_processes.Ended | None]) -> str | None:
    """The post-mortem: the first failure, named as the root cause, and how many followed."""
    ends = endings(run, gone)
    if not ends or stopped(run, ends) is not None:  # a stop from outside has no root cause inside
        return None
    text = f"ROOT CAUSE {describe(ends[0], None)}"
    if len(ends) > 1:
        text += f"; then {', '.join(e.proc.label for e in ends[1:])} ended as a consequence"
    return text
