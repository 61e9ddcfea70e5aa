"""Activation, called once per process on the first ``import sglang`` (see ``_phasetrace_boot``).

Registers the patch engine's post-import hooks, before any SGLang module body runs. The tracing
runtime itself (run directory, journal, provider, heartbeats) starts at the process's first phase,
or right here in a process that a traced launcher started (a rank: visible before its first phase).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from typing import TYPE_CHECKING

from . import keys, runtime

log = logging.getLogger("sglang_phasetrace")

if TYPE_CHECKING:
    from ..patches import PatchEngine

_active = False


def activate(boot_ns: int | None = None) -> None:
    global _active
    if _active:
        return
    _active = True
    from .. import patches

    rt = runtime.current()
    if boot_ns:
        rt.boot_ns = boot_ns
    if not os.environ.get(keys.ENV_RUN_DIR):  # planned now, created at the first phase: every
        os.environ[keys.ENV_RUN_DIR] = str(runtime.new_run_dir())  # process spawned from here shares it
    skip = {name.strip() for name in os.environ.get(keys.ENV_DISABLE_PATCHES, "").split(",") if name.strip()}
    if skip:
        patches.PHASES = tuple(p for p in patches.PHASES if p.name not in skip)
    engine = patches.install(warn=rt.warn)
    launcher = os.environ.get(keys.ENV_LAUNCHER)
    if launcher and launcher != str(os.getpid()):  # a process a traced launcher started
        threading.Thread(target=_start_early, args=(rt,), name="phasetrace-start", daemon=True).start()
    rt.on_ready.append(lambda: _unpatch_init_only(engine))
    rt.on_ready.append(lambda: _report_missing(rt, engine))


def _start_early(rt: runtime.Runtime, wait_s: float = 120.0) -> None:
    """A process a traced launcher started is visible (journal, status, stacks on request) from its
    first ``import sglang``, not its first phase. That import runs while ``multiprocessing`` unpickles
    the process's target; once it runs the target, the target's arguments say which rank this is,
    so it is ``tp1`` before ``Scheduler.__init__``. Other processes (detokenizer, …) keep only a
    status file until a phase of theirs starts; readers do not list them."""
    from . import spawned

    try:
        rt.start()
    except Exception as exc:  # TracingOff is said once by the runtime; never fails the import
        if not isinstance(exc, runtime.TracingOff):
            log.warning("sglang-phasetrace: tracing not started at import: %r", exc)
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and rt.identity.role == "process":
        proc = multiprocessing.current_process()
        target = getattr(proc, "_target", None)
        if target is not None:
            ranks = spawned.ranks_of(target, getattr(proc, "_args", ()), getattr(proc, "_kwargs", {}))
            if ranks is not None:
                rt.set_identity(role="rank", **ranks)
            return
        time.sleep(0.05)


def _unpatch_init_only(engine: PatchEngine) -> None:
    """At ready, take the init-only (hot-path) patches off: the targets and their known aliases now,
    the copies modules made after patching on a thread (a pass over every module, kept off the
    ready path). A call through a copy before that pass ends is counted as a runtime call."""
    from ..patches import wrappers

    engine.unapply(lambda phase: phase.init_only)
    threading.Thread(target=wrappers.restore_copies, args=(lambda phase: phase.init_only,),
                     name="phasetrace-unpatch", daemon=True).start()


def _report_missing(rt: runtime.Runtime, engine: PatchEngine) -> None:
    """At rank ready, name required phases that never resolved here (a renamed SGLang target)."""
    if rt.identity.role != "rank":
        return
    wrapped = engine.resolved()
    for phase in engine.phases:
        if phase.required and phase.name not in wrapped and phase.kind not in ("launch", "ready"):
            engine.report_unresolved(phase)
