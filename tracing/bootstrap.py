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
from typing import TYPE_CHECKING, Any

from . import keys, phases
from .recorder import runtime, start

log = logging.getLogger("sglang_phasetrace")

if TYPE_CHECKING:
    from ..patches import PatchEngine

_active = False  # per interpreter, not per process: a forked child runs the patched modules it inherited


def active() -> bool:
    """Tracing was activated in this interpreter (by the PYTHONPATH hook or the SGLang plugin)."""
    return _active


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
        os.environ[keys.ENV_RUN_DIR] = rt.planned_run_dir = str(runtime.new_run_dir())  # spawned ones share it
    skip = {name.strip() for name in os.environ.get(keys.ENV_DISABLE_PATCHES, "").split(",") if name.strip()}
    if skip:
        patches.PHASES = tuple(p for p in patches.PHASES if p.name not in skip)
    engine = patches.install(warn=rt.warn)
    phases.LAUNCHER_SIDE = _launcher_side
    launcher = os.environ.get(keys.ENV_LAUNCHER)
    if launcher and launcher != str(os.getpid()):  # a process a traced launcher started
        threading.Thread(target=_start_early, args=(rt,), name="phasetrace-start", daemon=True).start()
    # At ready, the init-only (hot-path) patches come off, copies included; the pass over every
    # module for copies runs on a thread, off the ready path.
    rt.on_ready.append(lambda: engine.unapply(lambda phase: phase.init_only, wait=False))
    rt.on_ready.append(lambda: _report_missing(rt, engine))


def _launcher_side() -> Any:
    """``tracing.launcher.lifecycle``, imported by the process that becomes the launcher only."""
    from .launcher import lifecycle

    return lifecycle


def _start_early(rt: runtime.Runtime, wait_s: float = 300.0) -> None:
    """A rank a traced launcher started is visible (journal, heartbeats, stacks on request) from the
    moment it knows it is a rank, not from its first phase. Its first ``import sglang`` runs while
    ``multiprocessing`` unpickles the process's target; once it runs the target, the target's
    arguments say which rank this is (``tp1``), and tracing starts with that identity in its
    resource, long before ``Scheduler.__init__``. Another process of the launch (detokenizer,
    tokenizer worker, DP controller: ``handover.ROLES``) starts its root ``process`` there, with its
    role; any other process starts tracing at its first phase."""
    from .recorder import handover

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not rt.started:
        proc = multiprocessing.current_process()
        target = getattr(proc, "_target", None)
        if target is None:
            time.sleep(0.05)
            continue
        ranks = handover.ranks_of(target, getattr(proc, "_args", ()), getattr(proc, "_kwargs", {}))
        role = handover.role_of(target) if ranks is None else "rank"
        if role is None:
            return
        try:
            if ranks is None:  # its first phase may have begun meanwhile: the same, once
                phases.adopt(rt)
                return
            rt.set_identity(role=role, **ranks)
            start.start()
        except Exception as exc:  # TracingOff is said once by the runtime; never fails SGLang
            if not isinstance(exc, runtime.TracingOff):
                log.warning("sglang-phasetrace: tracing not started before the first phase: %r", exc)
        return


def _report_missing(rt: runtime.Runtime, engine: PatchEngine) -> None:
    """At rank ready, name required phases that never resolved here (a renamed SGLang target)."""
    if rt.identity.role != "rank":
        return
    wrapped = engine.resolved()
    for phase in engine.phases:
        if phase.required and phase.name not in wrapped and phase.kind not in ("launch", "ready"):
            engine.report_unresolved(phase)
