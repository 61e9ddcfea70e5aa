"""Everything one traced process holds for itself, in one object, and its reset after ``fork``.

A forked child shares its parent's memory but is a new process: it must not write into the
parent's journal, beat the parent's heartbeat, think it is inside the parent's collective or that
a warning was already said. So no module keeps such state in globals of its own: it lives in
``STATE``, and ``reset()`` replaces it whole, once, in the one ``os.register_at_fork`` callback.
Tests start from a fresh process state the same way (``tests/conftest.py``: ``trace_run_dir``).

What is not here survives a fork on purpose: the patches applied to modules (the child runs the
same code), and memo caches of pure functions. One thing outside Python survives a fork and is
undone in the child: faulthandler's registration of the stack-dump signal (``recorder.stackdump``),
which would dump the child's stacks into its parent's file; a child that traces arms its own.
Stdlib only, and it imports nothing of ours: any module may import it. Each part's type is
the owning module's (named in its comment), not imported here.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

T = TypeVar("T")


class StackDump(NamedTuple):
    """The stack-dump signal faulthandler is registered for in this process (``recorder.stackdump.arm``),
    the file descriptor it writes to, and the Python-level handler of the signal when it was armed."""

    signal: int
    fd: int
    handler: Any


@dataclass(eq=False)
class ProcessState:
    """This process's tracing state; each part is made on first use by the module that owns it."""

    boot_ns: int | None = None  # when the process started (a forked child: when it was forked); None: at boot
    runtime: Any = None  # recorder.runtime.current(): run directory, journal, provider, open phases
    heartbeat: Any = None  # recorder.heartbeat.start(): the beating thread's state
    collectives: Any = None  # recorder.collective_log: the collective each thread is in, counts
    collector: Any = None  # recorder.exporters: is the OTLP collector answering
    metrics: Any = None  # recorder.metrics: heartbeats as OTLP metrics (False: not here)
    launcher_watchdog: Any = None  # launcher.lifecycle.start() (a launcher only)
    history: Any = None  # history.store.memory(): what this process read of the history (readers only)
    exit_hook: bool = False  # recorder.lifecycle: the atexit flush is registered in this process
    stack_dump: StackDump | None = None  # recorder.stackdump.arm: faulthandler's registration here
    said: set[Hashable] = field(default_factory=set)  # what a one-warning-per-process problem already said
    local: threading.local = field(default_factory=threading.local)  # per thread: phases in flight, nesting
    lock: threading.Lock = field(default_factory=threading.Lock)  # first-use creation of a part


STATE = ProcessState()


def part(name: str, make: Callable[[], T]) -> T:
    """This process's part ``name`` (a field of ``ProcessState``), made by ``make`` on its first use:
    once, under the lock, though two threads first use it together."""
    got = getattr(STATE, name)
    if got is None:
        with STATE.lock:
            got = getattr(STATE, name)
            if got is None:
                got = make()
                setattr(STATE, name, got)
    return got


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
    armed = STATE.stack_dump
    reset(boot_ns=time.time_ns())
    if armed is not None:
        _disarm(armed)


def _disarm(armed: StackDump) -> None:
    """Undo the parent's faulthandler registration in a forked child: the signal's disposition is
    again what it was before (what the untraced child would have), and the parent's file is closed
    here. Only while the Python-level handler is still the one seen when it was armed: one set
    since has replaced faulthandler's, and restoring the old one would undo it."""
    with contextlib.suppress(ValueError, OSError, RuntimeError):
        if signal.getsignal(armed.signal) is armed.handler:
            faulthandler.unregister(armed.signal)
            os.close(armed.fd)


os.register_at_fork(after_in_child=_after_fork_in_child)
