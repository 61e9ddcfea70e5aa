"""Ranks before their first phase: which rank a spawned process is, and ranks that never start.

SGLang's launcher starts each rank as a ``multiprocessing.Process`` whose target takes the rank
numbers as arguments (``run_scheduler_process(server_args, port_args, gpu_id, tp_rank, pp_rank,
dp_rank, …)``). A process the traced launcher started begins tracing at its first ``import sglang``
(``tracing.bootstrap``) and reads those arguments as soon as ``multiprocessing`` hands it its
target, so it journals as ``tp1`` long before ``Scheduler.__init__``; one that hangs before its
first phase is then named. (The launcher cannot tell: ``Process.start`` drops the target.)
"""

from __future__ import annotations

from typing import Any


def not_started(run: Any, now_ns: int, stall_s: float, no_progress_s: float) -> list[Any]:
    """Ranks started ``stall_s`` ago that have not begun their first phase while some peer has, or
    ``no_progress_s`` ago in any case: "rank tp1 (pid …) was started 40 s ago and has not reached
    its first phase"."""
    from .diagnose import Finding

    ranks = run.ranks
    started = [p for p in ranks if p.spans]
    out = []
    for proc in ranks:
        if proc.spans or proc.boot_t is None:
            continue
        age = (now_ns - proc.boot_t) / 1e9
        if age < (stall_s if started else no_progress_s):
            continue
        state = "alive, heartbeating" if proc.last_heartbeat else "no heartbeat"
        peers = f"; {len(started)} of {len(ranks)} ranks have" if started else ""
        out.append(
            Finding(
                "not_started",
                proc.label,
                proc.pid,
                None,
                age,
                f"rank {proc.label} ({proc.who}) was started {age:.0f} s ago and has not reached "
                f"its first phase ({state}){peers}",
                procs=[proc.ident],
            )
        )
    return out
