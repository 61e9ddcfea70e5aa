"""The stalls to show for a run: the watchdog's diagnosis records that still hold, else a fresh
``diagnose.analyze`` — so ``status``, ``report`` and ``run`` give one verdict per rank."""

from __future__ import annotations

from typing import Any

from ..diagnose import Finding, Thresholds, analyze
from ..rundir import ProcessRec, RunView


def from_record(record: dict[str, Any]) -> Finding:
    """A ``diagnosis`` journal record (Finding's fields; the finding's kind as ``finding``)."""
    waiting = record.get("waiting")
    stacks = record.get("stacks")
    return Finding(
        kind=str(record.get("finding") or "stall"),
        label=str(record.get("label") or ""),
        pid=int(record.get("pid") or 0),
        phase=record.get("phase"),
        since_s=float(record.get("since_s") or 0.0),
        message=str(record.get("message") or ""),
        waiting={str(k): str(v) for k, v in waiting.items()} if isinstance(waiting, dict) else {},
        stacks=[str(s) for s in stacks] if isinstance(stacks, list) else [],
    )


def process_of(run: RunView, finding: Finding) -> ProcessRec | None:
    procs = run.processes
    return next((p for p in procs if finding.pid and p.pid == finding.pid), None) or next(
        (p for p in procs if finding.label and p.label == finding.label), None
    )


def _holds(run: RunView, finding: Finding) -> bool:
    """A recorded stall holds while its rank has not moved on (not ready, still in that phase)."""
    proc = process_of(run, finding)
    if proc is None:
        return True
    if proc.ready:
        return False
    open_phases = {s.phase for s in proc.open_spans}
    return finding.phase is None or finding.phase in open_phases


def findings(run: RunView, now_ns: int, thresholds: Thresholds | None = None) -> list[Finding]:
    """Recorded diagnoses that still hold (latest per rank), then live analysis of other ranks."""
    latest: dict[tuple[int, str], Finding] = {}
    for proc in run.processes:
        for record in sorted(proc.diagnoses, key=lambda r: r["t"]):
            finding = from_record(record)
            latest[(finding.pid, finding.label)] = finding
    shown = [f for f in latest.values() if _holds(run, f)]
    named = {f.pid for f in shown} | {f.label for f in shown}
    try:
        live = analyze(run, now_ns, thresholds or Thresholds.from_env())
    except Exception as exc:  # a verdict we cannot compute is said, not fatal
        live = [Finding("unknown", "", 0, None, 0.0, f"stall analysis failed: {exc!r}")]
    return shown + [f for f in live if f.pid not in named and f.label not in named]


def by_process(run: RunView, found: list[Finding]) -> dict[int, Finding]:
    """pid -> the finding that names it (the first)."""
    out: dict[int, Finding] = {}
    for finding in found:
        proc = process_of(run, finding)
        if proc is not None:
            out.setdefault(proc.pid, finding)
    return out
