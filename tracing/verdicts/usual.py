"""What the launch's earlier starts say of a start in progress (``tracing.history``): how long each
phase usually takes, a phase far past all of them, and when the start will likely be ready.

* A verdict line, and a busy or slow rank's notice, carries "usually N s" for its phase
  (``annotate``); a slow or busy one also what is left of it by the earlier starts.
* **unusual** (a notice, never an alarm): ranks in a phase past every earlier start's time in it by
  a clear margin (``MARGIN_RATIO`` and ``MARGIN_S`` past the slowest), with no progress for
  ``blocked_s`` — "'eagle.get_embed_and_head' 4 min on tp1 — no earlier start of this launch spent
  over 2 s in it". A rank that progresses, or that another verdict names, is left to the journals'
  evidence: the history never makes an alarm, and never hides one.
* ``eta``: the slowest rank's time in each open step against the steps' medians ("ready in ≈ 3 min").

A start whose launch has no earlier start is judged exactly as without history. The history is
read once per process and launch (``history.live``), the fingerprint once per run once settled: a
watchdog pass then costs one look-up per rank's open phase. ``tracing.history`` is imported on the
first call (the watchdog's thread), not with the launcher's watchdog.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import process_state
from ..reader.view import ProcessRec, RunView, SpanRec, phase_key
from .diagnose import Finding, Thresholds

if TYPE_CHECKING:
    from ..history.fingerprint import Fingerprint
    from ..history.store import Usual

log = logging.getLogger("sglang_phasetrace")
NS = 1_000_000_000
MARGIN_RATIO, MARGIN_S = 2.0, 10.0  # unusual: past max(slowest earlier x ratio, slowest earlier + s)


@dataclass
class Known:
    """The launch's earlier starts, as this run sees them (itself left out)."""

    fingerprint: Fingerprint
    usuals: dict[str, Usual]  # phase key -> how long it took in earlier starts
    seconds: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # phase -> host -> its times there

    @property
    def starts(self) -> int:
        return max(u.n for u in self.usuals.values())

    def of(self, proc: ProcessRec | None, phase: str | None) -> tuple[Usual | None, SpanRec | None]:
        """``phase`` as ``proc`` runs it now (its key names a draft or a group), else by its name."""
        if phase is None:
            return None, None
        span = next((s for s in reversed(proc.open_spans) if s.phase == phase), None) if proc is not None else None
        return self.usuals.get(phase_key(span) if span is not None else phase), span


def known(run: RunView) -> Known | None:
    """The earlier starts of the run's launch, from the history of its base directory; None
    without history, without a fingerprint, or when none of its launch's starts ended a phase.
    Never raises (a bug here costs the history, said once)."""
    try:
        from ..history import where as places

        try:
            where = places.of_run_dir(run.path)
        except places.HistoryError as exc:  # a setting that is neither a path nor a DSN: said once
            from ..history import store

            store._warn(exc, "phases are judged without it")
            return None
        if where is None or (isinstance(where, Path) and not os.path.lexists(where)):
            return None  # no history (yet): nothing more is imported (SQLite, the store: 60 ms a viewer)
        from ..history import fingerprint, live, store
        from ..redact import redact

        mem = store.memory()
        fp = mem.fingerprints.get(str(run.path))
        if fp is None:
            fp = fingerprint.of_run(run)
            if fp is None:
                return None
            if fp.settled:  # read from what the run will not change: kept for every later pass
                mem.fingerprints[str(run.path)] = fp
        procs = run.processes
        launcher = next((p for p in procs if p.role == "launcher"), procs[0] if procs else None)
        host = redact(launcher.host, "host.name") if launcher is not None else None
        got = live.fleet(fp.id, where, exclude=(run.run_id,), host=host)
        return Known(fp, got.usuals, got.seconds) if got.usuals else None
    except Exception as exc:
        if process_state.say_once(("history", "usual")):
            log.warning("sglang-phasetrace: history: judging %s with it failed (%r); judged without it", run.path, exc)
        return None


def duration(seconds: float) -> str:
    """``0.3 s``, ``2.4 s``, ``41 s``, ``4 min``, ``2.5 h``: as a person says a phase's length."""
    if seconds < 10:
        return f"{seconds:.1f} s" if seconds >= 0.05 else f"{seconds * 1e3:.0f} ms"
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def said(u: Usual) -> str:
    """``usually 41 s, p95 55 s, 6 starts`` (``41 s in the one earlier start``)."""
    if u.n == 1:
        return f"{duration(u.median)} in the one earlier start"
    return f"usually {duration(u.median)}, p95 {duration(u.p95)}, {u.n} starts"


def takes(phase: str, u: Usual) -> str:
    """``'x' usually takes 41 s (p95 55 s, 6 starts)``, as a verdict line ends."""
    if u.n == 1:
        return f"'{phase}' took {duration(u.median)} in the one earlier start"
    return f"'{phase}' usually takes {duration(u.median)} (p95 {duration(u.p95)}, {u.n} starts)"


def short(u: Usual | None) -> str:
    """A table cell: ``41 s (p95 55 s)``."""
    if u is None:
        return ""
    return duration(u.median) if u.n == 1 else f"{duration(u.median)} (p95 {duration(u.p95)})"


def annotate(run: RunView, found: list[Finding], now_ns: int, known_: Known | None) -> None:
    """Each finding about a phase the launch's earlier starts ran says how long it usually takes;
    a busy or slow rank's also how much of it is left by them."""
    if known_ is None or not found:
        return
    procs = {p.ident: p for p in run.processes}
    for f in found:
        if f.kind == "unusual" or f.phase is None or f.proc is None:
            continue
        u, span = known_.of(procs.get(f.proc), f.phase)
        if u is None:
            continue
        text = takes(f.phase, u)
        if not f.alarm and span is not None:
            left = u.median - (now_ns - span.start) / NS
            if left >= 1:
                text += f": ≈ {duration(left)} left by them"
        here = on_this_host(known_, procs.get(f.proc), f.phase)
        f.message += f"; {text}" + (f"; {here}" if here else "")


def on_this_host(known_: Known, proc: ProcessRec | None, phase: str) -> str | None:
    """``unusual on this host: 'x' usually takes 41 s here, 3.1x the fleet's median (13 s on 3 other
    hosts)``: this host's earlier starts are the fleet's outlier in the phase (``history.hosts``)."""
    per_host = known_.seconds.get(phase, {})
    if proc is None or len(per_host) < 2:
        return None
    from ..history.hosts import of_seconds, outlier
    from ..redact import redact

    got = outlier(of_seconds(per_host), redact(proc.host, "host.name"), phase)
    if got is None:
        return None
    others = f"{got.hosts} other host{'s' if got.hosts > 1 else ''}"
    return (
        f"unusual on this host: '{phase}' usually takes {duration(got.median_s)} here, "
        f"{got.ratio:.1f}x the fleet's median ({duration(got.fleet_s)} on {others})"
    )


def unusual(run: RunView, now_ns: int, th: Thresholds, known_: Known | None, named: set[Any]) -> list[Finding]:
    """One notice per phase key: the ranks in it past every earlier start by the margin, none of
    them progressing for ``blocked_s``, named after the first of them in rank order (the same
    notice pass after pass); none when another verdict names every one of them."""
    if known_ is None:
        return []
    past: dict[str, list[tuple[float, float, ProcessRec]]] = {}
    phase: dict[str, str] = {}  # key -> the phase's name
    usuals = known_.usuals
    for proc in run.ranks:
        root = proc.root
        if root is None or root.status != "open":
            continue
        quiet = (now_ns - proc.last_progress_t) / NS
        if quiet < th.blocked_bound:  # it progresses: the journals say so, and the ETA speaks
            continue
        for span in reversed(proc.spans.values()):  # the innermost open phase the launch ran before
            if span.end is not None:
                continue
            key = phase_key(span)
            u = usuals.get(key)
            if u is None:
                continue
            elapsed = (now_ns - span.start) / NS
            if elapsed >= max(u.max * MARGIN_RATIO, u.max + MARGIN_S):
                past.setdefault(key, []).append((elapsed, quiet, proc))
                phase.setdefault(key, span.phase)
            break
    out = []
    for key, got in past.items():
        if all(p.ident in named or p.pid in named or p.label in named for _, _, p in got):  # pid: a recorded verdict's
            continue
        first = got[0][2]
        elapsed, quiet = max(e for e, _, _ in got), min(q for _, q, _ in got)
        u = usuals[key]
        earlier = "the one earlier start" if u.n == 1 else said(u)
        out.append(
            Finding(
                "unusual",
                first.label,
                first.pid,
                phase[key],
                elapsed,
                f"'{key}' {duration(elapsed)} on {_labels([p.label for _, _, p in got])} — no earlier start of this "
                f"launch spent over {duration(u.max)} in it ({earlier}); no progress for {duration(quiet)}",
                procs=[p.ident for _, _, p in got],
                doing="past every earlier start",
            )
        )
    return out


def _labels(labels: list[str]) -> str:
    from .diagnose import _labels as runs

    return runs(labels[:16]) + (f" and {len(labels) - 16} more" if len(labels) > 16 else "")


@dataclass
class Forecast:
    """When the ranks will likely be ready, by the earlier starts (``history.live.eta``: the slowest
    rank's), and the step (if any) already past every earlier start's time in it: then it is a lower
    bound."""

    remaining_s: float
    starts: int
    p95_s: float = 0.0  # by each step's p95 (``history.live.Eta``)
    late: str | None = None  # a step past every earlier start by the margin (``unusual``'s)
    late_s: float = 0.0  # how long it has run
    late_max: float = 0.0  # the longest an earlier start spent in it


def eta(run: RunView, now_ns: int, known_: Known | None) -> Forecast | None:
    """When the ranks will likely be ready, by the earlier starts: the latest of each rank's (its
    open steps against their medians, the steps after them); None without earlier starts, once
    every rank is ready, or when no rank can be placed among their steps. Each rank is read back
    from its newest span to the newest step it ended (the steps before are behind it)."""
    if known_ is None:
        return None
    from ..history.live import eta_of

    usuals = known_.usuals
    names = {u.phase.split(" [", 1)[0] for u in usuals.values() if u.depth == 1}
    out: Forecast | None = None
    for proc in run.ranks:
        if proc.ready:
            continue
        opened: dict[str, float] = {}
        ended: set[str] = set()
        for span in reversed(proc.spans.values()):
            if span.phase not in names:
                continue
            key = phase_key(span)
            if span.end is not None:
                ended.add(key)
                break
            opened[key] = max(opened.get(key, 0.0), (now_ns - span.start) / NS)
        if not opened and not ended:  # a shallow read kept no step of it: those it left out ended
            ended = {phase for phase in proc.dropped if phase in names}
        e = eta_of(usuals, opened, ended)
        if e is None or (out is not None and e.remaining_s <= out.remaining_s):
            continue
        out = Forecast(e.remaining_s, e.starts, e.p95_s)
        for key, elapsed in opened.items():
            u = usuals.get(key)
            if u is not None and elapsed >= max(u.max * MARGIN_RATIO, u.max + MARGIN_S) and elapsed > out.late_s:
                out.late, out.late_s, out.late_max = key, elapsed, u.max
    return out


def clock(t_s: float) -> str:
    """``14:32``: a wall-clock time of this host, to the minute (to the second when it is near)."""
    return time.strftime("%H:%M:%S" if t_s - time.time() < 120 else "%H:%M", time.localtime(t_s))


def eta_text(e: Forecast | None, now_ns: int | None = None) -> str:
    """``ready in ≈ 3 min (by 6 earlier starts)``; given ``now_ns``, also when and the p95: ``ready in
    ≈ 41 s, at ≈ 14:32 (p95 55 s; by 6 earlier starts)``; with a step past every earlier start,
    ``ready ≈ 12 s after 'x' ends (4 min in it; earlier starts: at most 2 s)``; empty without an
    estimate."""
    if e is None:
        return ""
    earlier = "the one earlier start" if e.starts == 1 else f"{e.starts} earlier starts"
    if e.late is not None:
        return (
            f"ready ≈ {duration(e.remaining_s)} after '{e.late}' ends ({duration(e.late_s)} in it; "
            f"{earlier}: at most {duration(e.late_max)})"
        )
    if e.remaining_s < 1:
        return f"past its usual time ({earlier} were ready by now)"
    if now_ns is None:
        return f"ready in ≈ {duration(e.remaining_s)} (by {earlier})"
    at = clock(now_ns / NS + e.remaining_s)
    return f"ready in ≈ {duration(e.remaining_s)}, at ≈ {at} (p95 {duration(e.p95_s)}; by {earlier})"


def outlook(run: RunView, now_ns: int, known_: Known | None) -> dict[str, Any] | None:
    """The launch and what its earlier starts say of this one, for ``status``: its fingerprint,
    how many starts, the ETA (``eta_s``; None once ready or when it cannot be placed) and a line
    ``launch 3f2a9c1b1234 (tiny-llama · tp2 · …): 6 earlier starts; ready in ≈ 3 min``."""
    if known_ is None:
        return None
    e = eta(run, now_ns, known_)
    fp = known_.fingerprint
    n = known_.starts
    line = f"launch {fp.id} ({fp.summary}): {n} earlier start{'' if n == 1 else 's'}"
    said = eta_text(e, now_ns)
    if said:
        line += f"; {said}"
    placed = e is not None and e.late is None  # a step past every earlier start: only a lower bound
    return {
        "fingerprint": fp.id,
        "summary": fp.summary,
        "starts": n,
        "eta_s": None if e is None else round(e.remaining_s, 3),
        "p95_s": round(e.p95_s, 3) if placed else None,  # type: ignore[union-attr]
        "ready_at": round(now_ns / NS + e.remaining_s, 3) if e is not None else None,  # seconds since the epoch
        "said": said,
        "line": line,
    }
