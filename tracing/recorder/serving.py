"""When a start ends: the launch serves. A rank's own init being done is not enough.

``python -m sglang.launch_server`` is serving at SGLang's own "ready to roll", which comes after the
warm-up request: every rank runs its first forward passes, with their collectives, after its
``Scheduler.__init__`` returned. Until then the rank is *initialised*, not serving: it still beats
into its journal, records its init collectives and is watched. Ranks are other processes and learn
this without signals: the launcher, when its launch root starts, names a file of the run directory
in the environment its ranks inherit (``keys.ENV_SERVING``) and creates it (0600, atomically) when
the launch serves (``announce``). A rank that is initialised waits for it (``await_launch``): its
heartbeat thread looks once a beat, each warm-up forward pass once (``check``: one ``lstat``).

Without that variable a rank serves once its own init is done: an ``Engine`` (no forward pass runs
before ``Engine.__init__`` returns), a node ≥ 1 of a multi-node launch (its launcher never sees
"ready to roll"), a rank started by no traced launcher.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import files, keys
from . import otlp, runtime

log = logging.getLogger("sglang_phasetrace")

PREFIX = "serving-"
# Forward passes a rank traces as warm-up before it takes the launch to serve though nothing said
# so (a launch path whose "ready to roll" the launcher cannot see): SGLang's warm-up request is one
# prompt of 8 tokens, a few tens of passes with a speculative draft; serving is never traced for long.
MAX_WARMUP_PASSES = 512


@dataclass
class Awaiting:
    """A rank initialised, not serving yet: the file that says its launch serves, and what to do then."""

    marker: Path
    serve: Callable[[int | None], None]  # ends the rank's root (its start) when the launch served; ready hooks
    passes: int = 0  # warm-up forward passes traced so far


def tell_ranks(rt: runtime.Runtime, serves_later: bool) -> None:
    """A launcher whose root just started: the ranks it spawns from now on learn which rule is
    theirs. ``serves_later``: a ``launch_server`` (not node ≥ 1): they wait for the file this
    launcher creates at "ready to roll"; else they serve once initialised (an outer launch's
    variable, inherited, is removed)."""
    if serves_later and rt.run_dir is not None and rt.journal is not None:
        name = f"{PREFIX}{rt.journal.path.stem}"
        rt.announces = Path(rt.run_dir) / name
        os.environ[keys.ENV_SERVING] = name
    else:
        os.environ.pop(keys.ENV_SERVING, None)


def marker_of(rt: runtime.Runtime) -> Path | None:
    """A rank: the file whose appearance says its launch serves, or None (it serves once initialised)."""
    name = os.environ.get(keys.ENV_SERVING, "")
    if not name.startswith(PREFIX) or os.path.basename(name) != name or rt.run_dir is None:
        return None
    return Path(rt.run_dir) / name


def announce(rt: runtime.Runtime, t: int) -> None:
    """The launch serves since ``t`` (ns, its root's end): create the file its ranks wait for,
    saying when, on a thread of its own (SGLang's never waits on a disk), once; a failure is said
    once, naming the path (the ranks then serve after ``MAX_WARMUP_PASSES`` passes, or stay
    *initialised*)."""
    path, rt.announces = rt.announces, None
    if path is None:
        return

    def write() -> None:
        try:
            files.write_atomic(path, json.dumps({"t": t, "pid": os.getpid()}).encode())
        except OSError as exc:
            files.say_once(path, exc, "its ranks cannot tell that the launch serves")

    threading.Thread(target=write, name="phasetrace-serving", daemon=True).start()


def await_launch(
    rt: runtime.Runtime, marker: Path, serve: Callable[[int | None], None], initialised: bool = True
) -> None:
    """A rank is initialised and serves when its launch does (``check``); its init spans go out now
    (``initialised=False``: another process of the launch, from its start). A process that exits
    before its next look (a launch stopped right after it served) looks once more at exit, before
    ``lifecycle`` ends what is still open as incomplete (atexit runs it after this)."""
    with rt.lock:
        rt.awaiting = Awaiting(marker, serve)
        rt.initialised = rt.initialised or initialised
    atexit.register(_look_at_exit)
    if initialised:
        otlp.flush_async(rt.provider)
    check(rt)


def _look_at_exit() -> None:
    try:
        check(runtime.current())
    except Exception as exc:
        log.debug("sglang-phasetrace: serving not checked at exit: %r", exc)


def check(rt: runtime.Runtime) -> bool:
    """Does this process serve? An initialised rank looks for its launch's file (one ``lstat``; a
    link or another user's file is not it) and, once there, serves. Never raises."""
    awaiting = rt.awaiting
    if awaiting is None:
        return rt.ready
    try:
        st = os.lstat(awaiting.marker)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        return False
    serve_now(rt, _served_at(awaiting.marker))
    return True


def _served_at(marker: Path) -> int | None:
    """When the launch began to serve, as its launcher wrote it (same host, same clock): the rank's
    start ends then, not when it noticed (its root ends within its launch's). None: unreadable."""
    try:
        fd = os.open(marker, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            t = json.loads(os.read(fd, 4096)).get("t")
        finally:
            os.close(fd)
    except (OSError, ValueError, AttributeError):
        return None
    return t if type(t) is int and 0 < t <= time.time_ns() else None


def warmup_pass(rt: runtime.Runtime) -> bool:
    """A forward pass begins in an initialised rank that does not serve yet: True to trace it as
    warm-up; False once the launch serves (found now) or after ``MAX_WARMUP_PASSES`` (said once)."""
    awaiting = rt.awaiting
    if awaiting is None or check(rt):
        return False
    awaiting.passes += 1
    if awaiting.passes <= MAX_WARMUP_PASSES:
        return True
    rt.warn(
        f"{MAX_WARMUP_PASSES} forward passes and the launch has not said that it serves "
        f"({awaiting.marker} is missing): serving from now on"
    )
    serve_now(rt)
    return False


def serve_now(rt: runtime.Runtime, since: int | None = None) -> None:
    """The initialised rank serves (once, whichever thread sees it first), since ``since`` (ns), or now."""
    with rt.lock:
        awaiting, rt.awaiting = rt.awaiting, None
    if awaiting is not None:
        try:
            awaiting.serve(since)
        except Exception as exc:
            log.warning("sglang-phasetrace: serving not recorded: %r", exc)
