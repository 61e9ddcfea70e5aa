"""A traced launcher's watch, from its launch root to its exit: started by ``start`` (the one entry
point ``tracing.phases`` calls, through ``bootstrap``), ended by ``ready``, by ``last_words`` when
SGLang tears the launch down, and by ``keep_at_exit``."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import keys, process_state
from ..recorder import launch, runtime
from ..verdicts.findings import running
from ..verdicts.watchdog import EXIT_WAIT_S, Watchdog, keep
from . import endpoint

log = logging.getLogger("sglang_phasetrace")


def start(
    rt: runtime.Runtime,
    node: launch.Node | None,
    attrs: dict[str, Any],
    node_ready: Callable[[], None],
    workers_serve: Callable[[int], None] | None = None,
) -> Watchdog | None:
    """Watch this launch from the launching process until it serves (or exits): its ranks are
    watched through their warm-up, initialised but not serving (``recorder.serving``); a node of a
    multi-node launch joins the others (``node_ready``: a node ≥ 1 is ready when its ranks are); a
    ``launch_server`` whose tokenizer workers warm the server up serves when they say so
    (``workers_serve``, with when); the start-up endpoint opens where asked."""
    if os.environ.get(keys.ENV_WATCHDOG, "1") == "0" or rt.run_dir is None:
        return None
    os.environ[keys.ENV_LAUNCHER] = str(os.getpid())  # ranks spawned from here start tracing at import
    dog = process_state.STATE.launcher_watchdog = Watchdog(rt.run_dir, record=rt.write)
    dog.keeps = dog.publishes = True
    dog.when_workers_serve = workers_serve
    rt.on_ready.append(lambda: ready(dog))
    atexit.register(keep_at_exit)  # registered first, runs last: after the post-mortem's records
    atexit.register(last_words)  # a launch that ends before ready: its post-mortem
    if node is not None:
        try:
            _join_nodes(rt, dog, node, attrs, node_ready)
        except Exception as exc:  # this node is still traced and watched, on its own
            log.warning("sglang-phasetrace: cross-node view not started: %r", exc)
    endpoint.open_from_env(dog)
    threading.Thread(target=dog.loop, name="phasetrace-watchdog", daemon=True).start()
    return dog


def _join_nodes(
    rt: runtime.Runtime, dog: Watchdog, node: launch.Node, attrs: dict[str, Any], node_ready: Callable[[], None]
) -> None:
    """A node of a multi-node launch: the cross-node channel, and for node ≥ 1 (whose launcher
    never returns: it waits for node 0's shutdown) ready when this node's ranks are."""
    root = rt.root
    trace = runtime.hexid(root.get_span_context().trace_id, 32) if root is not None else None
    if trace is None or rt.run_dir is None:
        return
    from ..channel import crossnode

    th = dog.thresholds
    cross = crossnode.CrossNode(node, rt.run_dir, trace, min(th.heartbeat_s, 5.0), th.silent_s + th.heartbeat_s)
    cross.start(rt.write)
    dog.crossnode = cross
    if node.rank >= 1:
        sizes = [attrs.get(f"sglang.{k}_size") for k in ("tp", "pp")]
        per_node = 1
        for size in sizes:
            per_node *= size if isinstance(size, int) and size > 0 else 1
        dog.expect_ranks, dog.node = max(1, per_node // node.nnodes), node.rank
        dog.when_ranks_ready = node_ready  # node 0's launcher says when the launch serves


def ready(dog: Watchdog) -> None:
    """The launcher is ready: the watchdog stops; a node of a multi-node launch sends its last word;
    the start is recorded, the run indexed, and its state published once more (serving)."""
    dog.stop.set()
    if dog.crossnode is not None:
        dog.crossnode.finish()
    keep(dog)
    index_later(dog, serving=True)
    threading.Thread(target=dog.publish_serving, name="phasetrace-serving-state", daemon=True).start()


def index_later(dog: Watchdog, serving: bool) -> None:
    """Have the run's index written by a detached, niced process (``reader.index``), so every viewer
    after it reads the run once: now, when the launch serves; else after this launcher exits and
    its ranks are gone, unless it is written by then. Never raises."""
    try:
        from ..reader import index

        if (dog.indexed and serving) or (not serving and (Path(dog.run.path) / index.INDEX_NAME).exists()):
            return
        dog.indexed = True
        index.spawn_writer(list(dog.run.paths), "now" if serving else "exit", allow_serving=serving)
    except Exception as exc:
        log.debug("sglang-phasetrace: index not written: %r", exc)


def keep_at_exit() -> None:
    """The launcher exits: its start recorded as it ended (already at ready: what is left of that
    is waited for), waiting at most ``history.keeper.EXIT_WAIT_S``."""
    dog = process_state.STATE.launcher_watchdog
    if dog is None:
        return
    if dog.keeper is not None and dog.keeper.final:
        dog.keeper.wait()
    else:
        keep(dog, wait_s=EXIT_WAIT_S)
    index_later(dog, serving=False)


def last_words() -> list[int]:
    """Called as SGLang starts tearing the launch down (``tracing.phases``): name who ended first.
    Returns the pids of this host's ranks and helpers still running then (they end in the teardown)."""
    dog = process_state.STATE.launcher_watchdog
    if dog is None or dog.stop.is_set():
        return []
    dog.stop.set()
    # SGLang's teardown is already under way (its SIGQUIT handler called us): a second failing child's
    # SIGQUIT would re-enter that handler and kill the tree mid-sentence. Ignored for these few
    # milliseconds, then SGLang's handler is back and goes on to kill the tree as it would have.
    previous = None
    with contextlib.suppress(ValueError, OSError):  # not the main thread: nothing to hold off
        if callable(signal.getsignal(signal.SIGQUIT)):  # a Python handler (SGLang's): restorable
            previous = signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    try:
        dog.last_words()
        return [
            p.pid
            for p in dog.run.processes
            if (p.role == "rank" or p.helper) and not p.ready and p.pid not in dog.gone and running(p)
        ]
    except Exception as exc:
        log.debug("sglang-phasetrace: last words failed: %r", exc)
        return []
    finally:
        keep(dog, wait_s=EXIT_WAIT_S)  # the teardown kills this process next: no atexit after it
        if previous is not None:
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signal.SIGQUIT, previous)
