"""Where a start stands, in one word an orchestrator can act on: the state of the launch, the exit
code ``phasetrace probe`` returns for it, the one line that says why, and each process's figures.

``starting`` and ``serving`` pass (a slow start that progresses, or one "unusual" against history,
keeps passing: that is the point); a standing verdict fails with its own code. Made from what a
watchdog pass already holds (the run it read, the findings it made): no file is read here, so the
launcher's endpoint and the state file cost no more than the pass they follow.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from .. import other_processes
from ..reader import ended
from ..reader.view import ProcessRec, RunView
from . import usual, voice
from .diagnose import PREFIX, Finding
from .findings import alarms, by_process, running

NS = 1_000_000_000

# The probe's exit codes (``phasetrace probe``; docs/orchestrators.md). 1 and 2 stay the CLI's own
# (an error of ours, bad usage); 3 and 4 are those of ``status``.
CODES = {
    "starting": 0,
    "serving": 0,
    "stalled": 3,
    "failed": 4,
    "not_started": 5,
    "stopped": 6,
    "no_run": 7,
    "ended": 8,
}
STATES = tuple(CODES)


@dataclass
class Startup:
    """A launch's start as an orchestrator reads it (``to_json``: ``/startup`` and the state file)."""

    state: str  # one of ``STATES``
    line: str  # why, in one line: the first verdict as the watchdog says it, else where the start is
    run: str = ""
    run_id: str = ""
    t: int = 0  # when it was assessed (ns since the epoch)
    since_s: float | None = None  # seconds since the launch began
    predicted: dict[str, Any] | None = None  # ``usual.outlook``: eta_s, p95_s, ready_at; absent without history
    processes: list[dict[str, Any]] = field(default_factory=list)
    verdicts: list[dict[str, Any]] = field(default_factory=list)  # each standing alarm: kind, label, phase, line

    @property
    def code(self) -> int:
        return CODES[self.state]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "code": self.code}


def of_pass(run: RunView, found: list[Finding], now_ns: int) -> Startup:
    """``assess`` with what a pass adds to its findings: the history's outlook (``usual``) and whether
    this host's launchers still run (``/proc``). The launcher's watchdog and the probe's fallback on
    the journals both judge this way."""
    here = other_processes.this_host()
    alive = {p.pid: running(p) for p in run.processes if p.role == "launcher" and p.host == here}
    over = ended.of_run(run, now_ns) if _served(run) else None
    return assess(run, found, now_ns, usual.outlook(run, now_ns, usual.known(run)), alive, over)


def _state_of(f: Finding) -> str:
    return {"died": "failed", "failed": "failed", "stopped": "stopped", "not_started": "not_started"}.get(
        f.kind, "stalled"
    )


def _served(run: RunView) -> bool:
    launchers = [p for p in run.processes if p.role == "launcher" and p.node in (None, 0)]
    return bool(launchers) and all(p.ready for p in launchers)


def assess(
    run: RunView,
    found: list[Finding],
    now_ns: int | None = None,
    outlook: dict[str, Any] | None = None,
    alive: dict[int, bool] | None = None,
    over: ended.Ended | None = None,
) -> Startup:
    """The start's state from one pass: ``found`` (``findings.live``), ``outlook`` (``usual.outlook``),
    ``alive``: pid -> running, for this host's launchers (a launcher gone before it served, with
    nothing said of it, is ``failed``; after, ``ended``); ``over``: every process of a launch that
    served is gone (``reader.ended.of_run``): ``ended``, said with when and how."""
    now = time.time_ns() if now_ns is None else now_ns
    procs = run.processes
    began = _began(procs)
    out = Startup(state="starting", line="", run=str(run.path), run_id=run.run_id, t=now)
    out.since_s = round((now - began) / NS, 3) if began else None
    standing = alarms(found)
    verdict_of = by_process(run, found)
    out.processes = [_row(p, verdict_of.get(p.pid), now) for p in procs if p.role != "watchdog"]
    out.verdicts = [{"kind": f.kind, "label": f.label, "phase": f.phase, "line": voice.said(f)} for f in standing]
    launchers = [p for p in procs if p.role == "launcher"]
    gone = [p for p in launchers if alive is not None and not alive.get(p.pid, True)]
    if standing:
        out.state, out.line = _state_of(standing[0]), voice.said(standing[0])
    elif _served(run) and over is not None:
        out.state, out.line = "ended", f"{PREFIX} {over.line(now)}"
    elif _served(run):
        out.state = "ended" if gone else "serving"
        out.line = f"{PREFIX} the launch {'served, then ended' if gone else 'serves'}"
    elif gone:
        p = gone[0]
        out.state, out.line = "failed", f"{PREFIX} FAILED the launcher ({p.who}) ended before the launch served"
    elif not procs:
        out.state, out.line = "no_run", f"{PREFIX} no traced process has written to {run.path} yet"
    else:
        out.line = f"{PREFIX} starting: {_where(procs, now, out.since_s)}"
    if outlook is not None and out.state == "starting":
        out.predicted = {k: outlook.get(k) for k in ("eta_s", "p95_s", "ready_at", "starts", "line")}
        if outlook.get("eta_s") is not None:
            out.line += f"; {outlook['said']}"
    return out


def _began(procs: list[ProcessRec]) -> int | None:
    """When the launch began: its launcher's root (from its process start), else its first process."""
    roots = [p.root.start for p in procs if p.role == "launcher" and p.root is not None]
    starts = roots or [t for p in procs if (t := p.boot_t or (p.root.start if p.root is not None else None))]
    return min(starts, default=None)


def _where(procs: list[ProcessRec], now: int, since_s: float | None) -> str:
    """``2 ranks, 1 initialised; tp1 in 'model.load_weights' for 12 s (3/8 shards); 41 s in``: the
    rank furthest behind (the one the start waits for), not a list of healthy ranks."""
    ranks = [p for p in procs if p.role == "rank"]
    starting = [p for p in ranks if not p.ready and not p.initialised]
    text = f"{len(ranks)} rank{'' if len(ranks) == 1 else 's'}"
    done = sum(1 for p in ranks if p.ready or p.initialised)
    if done:
        text += f", {done} initialised"
    behind = min(starting, key=lambda p: p.last_progress_t, default=None)
    if behind is None:  # every rank's own init is done: the launcher's steps, or a helper's, are left
        behind = next((p for p in procs if p.role == "launcher" and not p.ready), None)
    span = behind.current if behind is not None else None
    if behind is not None and span is not None:
        text += f"; {behind.label} in '{span.phase}' for {max(0.0, (now - span.start) / NS):.0f} s"
        progress = _progress(behind)
        if progress:
            unit = f" {progress['unit']}" if progress.get("unit") else ""
            text += f" ({progress['done']}/{progress.get('total') or '?'}{unit})"
    if since_s is not None:
        text += f"; {since_s:.0f} s since the launch began"
    return text


def _progress(p: ProcessRec) -> dict[str, Any] | None:
    beat = p.last_heartbeat or {}
    span = p.current
    items = [x for x in beat.get("phases") or () if isinstance(x, dict) and isinstance(x.get("progress"), dict)]
    match = next((x for x in items if span is not None and x.get("span") == span.span_id), None)
    got = (match or (items[-1] if items else {})).get("progress")
    return got if isinstance(got, dict) and "done" in got else None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _row(p: ProcessRec, finding: Finding | None, now: int) -> dict[str, Any]:
    """One process's figures, from its journal and its last heartbeat (blank where it carries none)."""
    beat = p.last_heartbeat or {}
    span = p.current if not p.ready else None
    if finding is not None and finding.alarm:
        state = _state_of(finding)
    elif p.ready:
        state = "serving" if p.serving or p.role != "launcher" else "ready"
    elif p.initialised:
        state = "initialised"
    else:
        state = "starting"
    cpu, interval = _num(beat.get("cpu_s")), _num(beat.get("interval_s"))
    gpu = beat.get("gpu") if isinstance(beat.get("gpu"), dict) else {}
    progress = _progress(p) if span is not None else None
    return {
        "label": p.label,
        "role": p.role,
        "pid": p.pid,
        "host": p.host,
        "node": p.node,
        "state": state,
        "phase": span.phase if span is not None else None,
        "in_phase_s": round(max(0.0, (now - span.start) / NS), 3) if span is not None else None,
        "heartbeat_age_s": round(max(0.0, (now - beat["t"]) / NS), 3) if isinstance(beat.get("t"), int) else None,
        "progress_done": _num(progress.get("done")) if progress else None,
        "progress_total": _num(progress.get("total")) if progress else None,
        "progress_unit": str(progress.get("unit") or "") if progress else "",
        "cpu_pct": round(100 * cpu / interval, 1) if cpu is not None and interval else None,
        "rss": _num(beat.get("rss")),
        "threads": _num(beat.get("threads")),
        "gpu_util_pct": _num(gpu.get("util")),
        "gpu_mem_used": _num(gpu.get("mem_used")),
        "gpu_power_w": _num(gpu.get("power_w")),
        "verdict": finding.kind if finding is not None else None,
    }


def state_file(s: Startup) -> bytes:
    """The state file's bytes (``journal.layout.STARTUP_FILE``): the start without its processes
    (``phasetrace probe`` reads one small file at any size of launch), and who wrote it, so a reader
    can tell a writer that stopped writing from one that is gone."""
    doc = s.to_json()
    doc.pop("processes")
    doc["writer"] = {"pid": os.getpid(), "host": other_processes.this_host(), **other_processes.fingerprint()}
    return orjson.dumps(doc)
