"""Process lifecycle: at a normal exit, end open phases as *incomplete* and flush, bounded: the
journal waits one write bound at most in all (``JournalWriter.hurry``); the spans and the metrics
go out together, waited for ``otlp.EXIT_S`` at most, and not at all once the collector is seen not
to answer (``otlp.flush``).

No signal handlers, by design. A Python-level handler runs only when the main thread re-enters
the interpreter, which a rank blocked in gloo/NCCL/CUDA never does: with one installed, ``kill``,
``docker stop`` and ``scancel`` would wait for their SIGKILL escalation, and a signal the process
inherited as ignored would stop being ignored. So a traced process dies on every signal exactly
as the untraced one does. Nothing is lost by it: each ``begin`` is already durable in the journal,
and the process that watches (the launcher, ``phasetrace run``, ``phasetrace watch``) records how
a process ended when it sees it gone (``tracing.other_processes.child_ended``).
"""

from __future__ import annotations

import atexit
import logging

from .. import process_state
from . import metrics, otlp, runtime

log = logging.getLogger("sglang_phasetrace")


def end_open_phases(rt: runtime.Runtime, reason: str) -> int:
    spans = rt.open.listed()
    for span, _ in reversed(spans):  # innermost first
        runtime.end_incomplete(span, reason)
    return len(spans)


def shutdown(rt: runtime.Runtime, reason: str, timeout_s: float = otlp.EXIT_S) -> None:
    try:
        if rt.journal is not None:  # a disk that stopped answering holds the exit one write bound at most
            rt.journal.hurry()
        end_open_phases(rt, reason)
        otlp.flush(rt.provider, metrics.provider(), timeout_s=timeout_s)
    except Exception:
        log.debug("sglang-phasetrace: shutdown failed", exc_info=True)


def install() -> None:
    """Once per process: at interpreter exit, end open phases as incomplete and flush (bounded).
    A forked child may hold the parent's registration as well: the second call finds nothing open."""
    state = process_state.STATE
    if state.exit_hook:
        return
    state.exit_hook = True
    atexit.register(lambda: shutdown(runtime.current(), "incomplete: process exited before the phase ended"))
