"""SGLang's plugin entry point (``sglang.srt.plugins``, SGLang 0.5.11+): tracing without PYTHONPATH.

Opt-in: ``SGLANG_PHASETRACE=1`` in the environment. An image that merely has the package installed
writes nothing. SGLang calls ``load_plugins()`` in the launcher (first thing in ``Engine.__init__``,
and in ``_launch_subprocesses`` for ``launch_server``), at the top of every rank's
``run_scheduler_process``, in the data-parallel controller and the detokenizer — after some SGLang
modules were imported, so the patch engine also patches what is already imported. Because the
launcher's entry point is already running by then, the launcher's root starts here (named for the
entry point on the stack), and the launcher watchdog ends it once every rank is ready (the engine
path) or at "ready to roll" (``launch_server``). With the PYTHONPATH hook active, this does nothing.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import time
from typing import Any

log = logging.getLogger("sglang_phasetrace")
ON = ("1", "true", "on", "yes")


def load() -> None:
    """The entry point SGLang calls; never raises into SGLang."""
    if os.environ.get("SGLANG_PHASETRACE", "").strip().lower() not in ON:
        return
    try:
        from . import bootstrap

        if bootstrap.active():
            return
        bootstrap.activate(boot_ns=_process_start_ns())
        if multiprocessing.parent_process() is None:  # the launching process, not a spawned rank
            _start_launch_root()
    except Exception as exc:
        log.warning("sglang-phasetrace: the SGLang plugin could not start tracing: %r", exc)


def _process_start_ns() -> int:
    try:
        import psutil

        return int(psutil.Process().create_time() * 1e9)
    except Exception:
        return time.time_ns()


def _entry_phase() -> tuple[str | None, Any]:
    """Which SGLang entry point called us, ``launch.server`` or ``launch.engine`` (None: neither),
    and the server args on the stack (None when not found)."""
    frame = sys._getframe(1)
    names = set()
    server_args = None
    while frame is not None:
        names.add((frame.f_code.co_name, frame.f_globals.get("__name__", "")))
        if server_args is None:
            server_args = frame.f_locals.get("server_args")
        frame = frame.f_back
    if any(name == "launch_server" and module.endswith("http_server") for name, module in names):
        return "launch.server", server_args
    if any(name == "__init__" and module.endswith("entrypoints.engine") for name, module in names):
        return "launch.engine", server_args
    return None, server_args


def _node_attrs(server_args: Any) -> dict[str, Any]:
    """A multi-node launch's node attributes from the server args (empty on a single node)."""
    from . import keys

    nnodes = getattr(server_args, "nnodes", None)
    if not isinstance(nnodes, int) or nnodes < 2:
        return {}
    return {
        keys.NNODES: nnodes,
        keys.NODE_RANK: getattr(server_args, "node_rank", 0) or 0,
        keys.DIST_INIT_ADDR: getattr(server_args, "dist_init_addr", None),
        **{f"sglang.{k}_size": getattr(server_args, f"{k}_size", None) for k in ("tp", "pp")},
    }


def _start_launch_root() -> None:
    from . import phases

    phase, server_args = _entry_phase()
    if phase is not None:
        attrs = {k: v for k, v in _node_attrs(server_args).items() if v is not None}
        phases.start_launch_root(phase, ends_when_ranks_ready=phase == "launch.engine", attrs=attrs)
