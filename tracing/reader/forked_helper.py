"""A forked helper: a child process that works on a second core for this one, on this process's
memory as it was at the fork (what it needs is not sent; what it reads stays there).

The whole interface, used by ``reader.load`` (a share of a large run's journals read there) and
``render.lane_jobs`` (the lanes of that share laid out and rendered there):

* ``@job``: a function the helper may run. Every one is marked so, and called by reference
  (``Helper.call(fn, arg)``); a registry maps it to its name, the one thing sent.
* ``Helper.start(setup, serve)``: fork; the child runs ``setup(answer)`` (``answer(x)``: its first
  reply) and, with ``serve``, then runs each job asked of it on what ``setup`` returned, in order,
  until this process closes it. ``call`` asks, ``reply`` takes the next answer, ``close`` ends it.
* ``HelperLost``: no answer (the job failed, or the child died): the caller does it itself. So is a
  job whose module was first imported after the fork: the child has no such job.

Messages are pickled and framed by one ``multiprocessing`` duplex connection; a descriptor is passed
over it by ``multiprocessing.reduction``. The fork happens only where it is safe: on Linux, with no
other thread in this process (a fork copies the calling thread only: a lock another held would stay
held in the child).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import socket
import sys
import threading
from collections.abc import Callable
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

JOBS: dict[str, Callable[..., Any]] = {}  # name -> job: filled at import, so a fork has every one
BUFFER_BYTES = 1 << 20  # the connection's socket buffers: a large answer is not sent 200 KiB per wake-up


def job(fn: F) -> F:
    """Mark ``fn`` as one the helper may run (``Helper.call``, or inside a job: ``named``)."""
    JOBS[_name(fn)] = fn
    return fn


def ref(fn: Callable[..., Any]) -> str:
    """What stands for the job ``fn`` in a message (``named`` turns it back)."""
    name = _name(fn)
    if name not in JOBS:
        raise ValueError(f"{name} is not a job (``forked_helper.job``)")
    return name


def named(name: str) -> Callable[..., Any]:
    """The job ``ref`` named (in the child: the one registered there)."""
    return JOBS[name]


def _name(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}:{fn.__qualname__}"


def can_fork() -> bool:
    """Linux, no other thread here, and not a daemonic ``multiprocessing`` process (it may have none)."""
    return (
        sys.platform.startswith("linux")
        and threading.active_count() == 1
        and not multiprocessing.current_process().daemon
    )


class HelperLost(Exception):
    """The helper gave no answer: the job failed there, or it died."""


class Helper:
    def __init__(self, process: Any, conn: Connection, serving: bool) -> None:
        self.process, self.conn, self.serving = process, conn, serving

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def start(cls, setup: Callable[[Callable[[Any], None]], Any], serve: bool = False) -> Helper | None:
        """A child running ``setup(answer)``, then (``serve``) the jobs asked of it on what ``setup``
        returned; None where it cannot be forked."""
        if not can_fork():
            return None
        context = multiprocessing.get_context("fork")
        here, there = context.Pipe(duplex=True)
        _widen(here)
        _widen(there)
        process = context.Process(
            target=_child, args=(there, setup, serve, here), name="phasetrace-helper", daemon=True
        )
        try:
            process.start()
        except OSError:
            here.close()
            return None
        finally:
            there.close()
        return cls(process, here, serve)

    def call(self, fn: Callable[..., Any], arg: Any, fd: int | None = None) -> None:
        """Ask for ``fn(state, arg)``, or ``fn(state, arg, a copy of fd)`` (``reply`` takes the
        answer); ``arg`` is pickled. ``HelperLost``: it cannot be asked (it is gone)."""
        message = (ref(fn), arg, fd is not None)
        try:
            self.conn.send(message)
            if fd is not None:
                reduction.send_handle(self.conn, fd, self.pid)
        except (OSError, ValueError, TypeError, pickle.PicklingError) as exc:
            raise HelperLost(f"cannot be asked ({exc!r})") from None

    def reply(self) -> Any:
        """The answer to the oldest call not yet answered (the first: ``setup``'s)."""
        try:
            status, value = self.conn.recv()
        except (OSError, EOFError, ValueError, TypeError) as exc:
            raise HelperLost(f"no answer ({exc!r})") from None
        if status != "ok":
            raise HelperLost(value)
        return value

    def ended_well(self) -> bool:
        """A helper that does not serve: whether it exited as it should once it had answered."""
        self.process.join()
        return self.process.exitcode == 0

    def close(self) -> None:
        """End it: whatever it was doing is not needed any more."""
        self.conn.close()
        if self.process.exitcode is None:
            self.process.kill()
        self.process.join()


def _child(
    conn: Connection, setup: Callable[[Callable[[Any], None]], Any], serve: bool, parents: Connection | None = None
) -> None:
    """The helper's life: ``setup``, then jobs until the parent closes the connection. ``parents``:
    the parent's end, closed here first, so that the parent's exit (a viewer ends with ``os._exit``,
    its finalizers not run) is this end's EOF and the helper's end too."""
    if parents is not None:
        parents.close()
    try:
        state = setup(lambda value: conn.send(("ok", value)))
        while serve:
            try:
                name, arg, with_fd = conn.recv()
            except EOFError:
                break
            fd = reduction.recv_handle(conn) if with_fd else None
            try:
                fn = named(name)
                answer = ("ok", fn(state, arg) if fd is None else fn(state, arg, fd))
            except Exception as exc:  # the parent does it itself
                answer = ("error", repr(exc))
            finally:
                if fd is not None:
                    os.close(fd)
            conn.send(answer)
    except BaseException:  # the parent is gone, setup failed (its reply says so), or Ctrl-C: quietly
        os._exit(1)
    os._exit(0)  # its state not freed: half a large run, which a parent waiting for the exit would wait on


def _widen(conn: Connection) -> None:
    try:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER_BYTES)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER_BYTES)
    except OSError:
        pass
