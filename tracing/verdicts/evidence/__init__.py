"""What a waiting rank waits on, read from what the operating system already knows.

A verdict that says "blocked in 'attention.init'" sends the engineer to py-spy, ``/proc/locks``,
``ps`` and ``ss`` by hand. This module reads the same sources for one pid under suspicion and
names the cause in words: a file lock and its holder, a busy child compiler, a socket that never
answers, or the native call the main thread sits in. Nothing is signalled, paused or attached:
every reading is a small ``/proc`` file, and the py-spy dump, when there is one, is the text the
watchdog already took (``stack_requests.py_spy``).

What each reading needs (Linux; elsewhere there is nothing to read, and ``Evidence.unread`` says so):

* ``/proc/locks``, ``/proc/PID/{stat,cmdline}``, ``/proc/PID/task/*/children``, ``/proc/PID/net/*``:
  world-readable (unless ``/proc`` is mounted ``hidepid``). Children's CPU: psutil, the same files.
* TCP sockets: one ``sock_diag`` netlink dump of this network namespace (no privilege, what ``ss``
  reads; ``tcp_info`` says how long nothing came in), for ranks in the reader's namespace; else
  ``/proc/PID/net/tcp{,6}`` (no such time). Both walk the kernel's whole connection table: read it
  once per pass (``read_tcp``) and hand it to every ``read``.
* ``/proc/PID/{fd,fdinfo,wchan,ns/net}``: ptrace *read* access (the same user, a process not made
  undumpable); without it a lock's file has no path (the device and inode remain) and the sockets
  a rank waits on are not found. ``fdinfo`` gives a descriptor's inode without touching its file
  system, so a hung NFS mount cannot block the reader.
* ``/proc/PID/syscall``: ptrace *attach* access (the same user under Yama ``ptrace_scope`` 0, or an
  ancestor of the rank under scope 1: the launcher's watchdog is one; ``phasetrace watch`` from
  another shell is not): the main thread's system call and its descriptor. Without it, ``wchan``
  (the kernel function it sleeps in) names the kind of wait, and the state letter whether it runs.

A process that ends, a pid that is reused, or a file that cannot be read mid-read costs the
details it would have given, never an exception: ``Evidence.unread`` says what was missing and why.

``read`` is one pid; ``shared_cause`` decides, over every rank of a launch, the cause all idle ranks
share (one lock holder, one remote address, their own busy children); ``Evidence.busy`` marks a rank
that waits on its own busy child, which is never a stall. The values are msgspec structs with bounded
fields (they travel in node snapshots): ``msgspec.to_builtins`` writes them, ``from_builtins`` checks
what another node sent.

One module per source: ``values`` (the bounded structs), ``proc`` (``/proc/PID`` read safely),
``mainthread`` (system call, wait channel), ``native`` (py-spy text), ``locks``, ``children``,
``sockets``; ``words`` says what they found; ``ranks`` (``RankReader``) reads the ranks a watchdog
pass or a ``status`` frame suspects, each once, and another node's from its snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import TypeVar

from ...redact import printable
from . import children as children_mod
from . import locks as locks_mod
from . import sockets as sockets_mod
from .children import looks_like_build
from .locks import LockLine, parse_locks, read_locks
from .mainthread import main_wait
from .native import Native, main_thread_frames, native_frame
from .proc import Proc, zombie
from .proc import start_ticks as start_ticks_of
from .sockets import Tcp, TcpRow, read_tcp
from .values import (
    BUSY_PCT,
    KINDS,
    NS,
    Child,
    Evidence,
    FileLock,
    MainWait,
    Shared,
    Socket,
    from_builtins,
)
from .words import (
    ATTR,
    attributes,
    cause_key,
    child_text,
    finish,
    labels_text,
    lock_text,
    phrase,
    shared_cause,
    socket_text,
)

__all__ = [
    "ATTR",
    "BUSY_PCT",
    "KINDS",
    "Child",
    "Evidence",
    "FileLock",
    "LockLine",
    "MainWait",
    "Native",
    "Shared",
    "Socket",
    "TcpRow",
    "attributes",
    "cause_key",
    "child_text",
    "from_builtins",
    "labels_text",
    "lock_text",
    "looks_like_build",
    "main_thread_frames",
    "native_frame",
    "parse_locks",
    "phrase",
    "read",
    "read_locks",
    "read_tcp",
    "shared_cause",
    "socket_text",
]

_T = TypeVar("_T")


def read(
    pid: int,
    *,
    launch_pids: Collection[int] = (),
    since_ns: int | None = None,
    native: str | None = None,
    start_ticks: int | None = None,
    window_s: float = 0.0,
    previous: Evidence | None = None,
    locks: list[LockLine] | None = None,
    tcp: Tcp = None,
    rendezvous: str | None = None,
    now_ns: int | None = None,
) -> Evidence:
    """What ``pid`` waits on, from ``/proc`` (and a py-spy ``--native`` dump text when given).

    ``launch_pids``: every pid of the launch (ranks, launcher), to say whether a lock's holder belongs
    to it; ``since_ns``: when the rank last progressed or its phase began (the wait began after it);
    ``start_ticks``: the journal's record of the process, so a recycled pid is not read as it;
    ``window_s``: measure children's CPU over this window (it sleeps); else since ``previous`` (the
    last Evidence of this pid), else over each child's lifetime; ``locks``, ``tcp``: ``read_locks()``
    and ``read_tcp()`` once for all the ranks of a pass (read here when not given; ``tcp`` may be a
    function that reads it, called only when a socket is looked up); ``rendezvous``: the
    launch's ``HOST:PORT``, to name that socket. Never raises for a process that ends or a file that cannot be read."""
    t_ns = now_ns if now_ns is not None else time.time_ns()
    waited = max(0.0, (t_ns - since_ns) / NS) if since_ns is not None else None
    ticks = start_ticks_of(pid)
    if ticks is None or (start_ticks is not None and ticks != start_ticks) or zombie(pid):
        return finish(Evidence(pid=pid, t=t_ns, cause="gone", gone=True, text="", waited_s=waited))
    proc = Proc(pid)
    launch = set(launch_pids) or None
    parsed = _guard(proc, "py-spy dump", lambda: native_frame(native, pid) if native else None, None)
    main = _guard(proc, "main thread", lambda: main_wait(proc, parsed), None) or MainWait(
        kind="unknown", words=KINDS["unknown"], source="none"
    )
    table = locks if locks is not None else read_locks()
    if table is None:
        proc.unread.append("file locks: /proc/locks is not readable")
    found_locks = _guard(proc, "file locks", lambda: locks_mod.waited_for(proc, main, table, launch), [])
    children = _guard(proc, "children", lambda: children_mod.children(pid, t_ns / NS, window_s, previous), [])
    if launch:  # the launcher's ranks and helpers are its children: what they do is judged on its own
        children = [c for c in children if c.pid not in launch]
    sockets, sockets_from = _guard(
        proc, "sockets", lambda: sockets_mod.waited_on(proc, main, rendezvous, tcp), ([], None)
    )
    gone = start_ticks_of(pid) != ticks or zombie(pid)
    ev = Evidence(
        pid=pid,
        t=t_ns,
        cause="none",
        text="",
        gone=gone,
        main=main,
        locks=found_locks,
        children=children,
        sockets=sockets,
        sockets_from=sockets_from,
        waited_s=round(waited, 1) if waited is not None else None,
        unread=[printable(u)[:200] for u in dict.fromkeys(proc.unread)][:32],
    )
    return finish(ev)


def _guard(proc: Proc, what: str, read_it: Callable[[], _T], default: _T) -> _T:
    """One part of the read; a /proc layout it cannot parse (or psutil missing) costs that part only."""
    try:
        return read_it()
    except (OSError, ValueError, IndexError, KeyError, ImportError) as exc:
        proc.unread.append(f"{what}: {type(exc).__name__}: {exc}")
        return default
