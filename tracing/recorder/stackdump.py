"""Stack dumps on request, the traced process's side: faulthandler registered on a signal, writing
the Python stack of the thread the signal reaches into this process's own file in the run directory
(the requests themselves, aimed at the main thread: ``verdicts.stack_requests``).

One thread only: faulthandler's C handler reads frames without the GIL, and reading another
thread's while that thread runs Python reads freed frames. With every thread dumped, a traced
process signalled while its threads were busy died of SIGSEGV (21 of 30 processes signalled 20
times in their first second; a forked child in CI). A thread's own frames cannot change under it."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
from pathlib import Path
from typing import Any

from .. import keys, process_state
from ..journal.layout import STACKS_DIR

ALLOWED = ("SIGUSR1", "SIGUSR2")  # signals whose default action nobody relies on during init


log = logging.getLogger("sglang_phasetrace")


def warn_once(message: str) -> None:
    if process_state.say_once(("stacks", message)):
        log.warning("sglang-phasetrace: %s", message)


def stack_signal() -> signal.Signals:
    """The dump signal: ``SGLANG_PHASETRACE_STACK_SIGNAL`` if it names one of ``ALLOWED``, else
    SIGUSR2 (a bad value is said once)."""
    raw = os.environ.get(keys.ENV_STACK_SIGNAL, "").strip().upper()
    if not raw:
        return signal.SIGUSR2
    name = raw if raw.startswith("SIG") else f"SIG{raw}"
    if name in ALLOWED:
        return signal.Signals[name]
    warn_once(f"{keys.ENV_STACK_SIGNAL}={raw!r} is not one of {', '.join(ALLOWED)}; using SIGUSR2")
    return signal.SIGUSR2


def dump_path(run_dir: Path | str, stem: str) -> Path:
    return Path(run_dir) / STACKS_DIR / f"{stem}.txt"


def arm(rt: Any) -> None:
    """Register the dump signal in this process with faulthandler (SGLang does not use it), on
    this process's own file (kept open: faulthandler writes to it), for the receiving thread alone."""
    state = process_state.STATE
    if state.stack_dump is not None:
        return
    try:
        from ..files import open_append, private_dir

        path = dump_path(rt.run_dir, rt.journal.path.stem)
        private_dir(path.parent)
        fd = open_append(path)
        sig = stack_signal()
        handler = signal.getsignal(sig)
        # chain only to a real handler: chaining to SIG_DFL would re-raise it and end the process
        chain = handler not in (signal.SIG_DFL, signal.SIG_IGN, None)
        faulthandler.register(sig, file=fd, all_threads=False, chain=chain)
        state.stack_dump = process_state.StackDump(sig, fd, handler)
    except Exception as exc:
        warn_once(f"stack dumps on request not armed: {exc!r}")
