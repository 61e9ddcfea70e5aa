"""Process lifecycle: end open phases as *incomplete* and flush, at exit and on signals.

SGLang installs its own SIGTERM/SIGINT/SIGQUIT handlers, sometimes after ours, and kills ranks
as a process tree. So our handler chains to whatever it replaced, and is re-armed (from the main
thread) whenever a phase starts; the journal never depends on it, since it is written as it goes.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from typing import Any

from . import exporters, runtime

log = logging.getLogger("sglang_phasetrace")
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
_installed_pid: int | None = None


def end_open_phases(rt: runtime.Runtime, reason: str) -> int:
    from .spans import PhaseSpan

    spans = rt.open.snapshot()
    for span, _ in reversed(spans):  # innermost first
        PhaseSpan(rt, span, None).end(incomplete=reason)
    return len(spans)


def shutdown(rt: runtime.Runtime, reason: str, timeout_s: float = 2.0) -> None:
    try:
        end_open_phases(rt, reason)
        exporters.flush(rt.provider, timeout_s)
    except Exception:
        log.debug("sglang-phasetrace: shutdown failed", exc_info=True)


def _make_handler(previous: Any) -> Any:
    def handler(signum: int, frame: Any) -> Any:
        # On a helper thread, bounded: the interrupted main thread may hold a lock we would need.
        reason = f"incomplete: process received {signal.Signals(signum).name}"
        worker = threading.Thread(target=shutdown, args=(runtime.current(), reason), name="phasetrace-signal",
                                  daemon=True)
        worker.start()
        worker.join(3.0)
        if callable(previous):
            return previous(signum, frame)
        if previous == signal.SIG_IGN:
            return None
        signal.signal(signum, signal.SIG_DFL)  # default action: re-deliver
        os.kill(os.getpid(), signum)
        return None

    handler._phasetrace = True  # type: ignore[attr-defined]
    return handler


def arm_signals() -> None:
    """(Re)install our chaining handler wherever someone replaced it. Main thread only."""
    for sig in SIGNALS:
        try:
            current = signal.getsignal(sig)
            if not getattr(current, "_phasetrace", False):
                signal.signal(sig, _make_handler(current))
        except (ValueError, OSError):  # not the main thread, or not allowed here
            return


def install() -> None:
    """Once per process: end open phases at exit; chain our handler for SIGTERM/SIGINT/SIGQUIT."""
    global _installed_pid
    if _installed_pid == os.getpid():
        return
    _installed_pid = os.getpid()
    atexit.register(lambda: shutdown(runtime.current(), "incomplete: process exited before the phase ended"))
    if threading.current_thread() is threading.main_thread():
        arm_signals()


os.register_at_fork(after_in_child=runtime.reset_after_fork)
