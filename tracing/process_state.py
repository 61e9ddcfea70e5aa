"""Everything one traced process holds for itself, in one object, and its reset after ``fork``.

A forked child shares its parent's memory but is a new process: it must not write into the
parent's journal, beat the parent's heartbeat, think it is inside the parent's collective or that
a warning was already said. So no module keeps such state in globals of its own: it lives in
``STATE``, and ``reset()`` replaces it whole, once, in the one ``os.register_at_fork`` callback.
Tests start from a fresh process state the same way (``tests/conftest.py``: ``trace_run_dir``).

What is not here survives a fork on purpose: the patches applied to modules (the child runs the
same code), and memo caches of pure functions. Stdlib only, so any tracing module may import it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .collectives import Collectives
    from .exporters import Collector
    from .heartbeat import Heartbeat
    from .metrics import Metrics
    from .runtime import Runtime
    from .watchdog import Watchdog


@dataclass(eq=False)
class ProcessState:
    """This process's tracing state; each part is made on first use by the module that owns it."""

    boot_ns: int | None = None  # when the process started (a forked child: when it was forked); None: at boot
    runtime: Runtime | None = None  # tracing.runtime.current(): run directory, journal, provider, open phases
    heartbeat: Heartbeat | None = None  # tracing.heartbeat.start(): the beating thread's state
    collectives: Collectives | None = None  # tracing.collectives: the collective each thread is in, counts
    collector: Collector | None = None  # tracing.exporters: is the OTLP collector answering
    metrics: Metrics | bool | None = None  # tracing.metrics: heartbeats as OTLP metrics (False: not here)
    launcher_watchdog: Watchdog | None = None  # tracing.watchdog.start_in_launcher()
    exit_hook: bool = False  # tracing.lifecycle: the atexit flush is registered in this process
    stack_fds: dict[int, int] = field(default_factory=dict)  # tracing.stacks: pid -> faulthandler dump fd
    said: set[Hashable] = field(default_factory=set)  # what a one-warning-per-process problem already said
    local: threading.local = field(default_factory=threading.local)  # per thread: phases in flight, nesting
    lock: threading.Lock = field(default_factory=threading.Lock)  # first-use creation of a part


STATE = ProcessState()


def say_once(key: Hashable) -> bool:
    """True the first time ``key`` is said in this process (then never again)."""
    if key in STATE.said:
        return False
    STATE.said.add(key)
    return True


def reset(boot_ns: int | None = None) -> None:
    """A fresh state, in place: every module's reference to ``STATE`` stays valid, and the lock
    (perhaps held, in a forked child, by a thread that does not exist there) is a new one."""
    STATE.__dict__.update(ProcessState(boot_ns=boot_ns).__dict__)


def _after_fork_in_child() -> None:
    reset(boot_ns=time.time_ns())


os.register_at_fork(after_in_child=_after_fork_in_child)
