"""What this process did since its last heartbeat, read from ``/proc`` (Linux; nothing elsewhere).

A rank that makes no progress is either waiting (main thread asleep, no CPU, no I/O: blocked)
or working (computing, reading weights, compiling in a child process: busy). The heartbeat
carries the figures that tell them apart, as deltas over the beat's interval:

* ``main``: the main thread's state letter (R running, S sleeping, D disk wait — what ``ps``
  shows for the process) and its own CPU seconds. The letter is read while the heartbeat holds
  the GIL, so a main thread running Python can show ``S`` (waiting for the GIL): CPU deltas, not
  the letter, say whether it works.
* ``majflt``: major page faults of the process (a weight file read through ``mmap`` shows here,
  not in ``io_b``); ``io_b``: bytes through read/write syscalls (files, sockets, pipes).
* ``child_cpu_s``: CPU of the processes the main thread started (a compiler, a JIT build),
  reaped ones included.

Each read is a few small ``/proc`` files (tens of µs in all); any that fails is left out.
"""

from __future__ import annotations

import os
import threading
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
MAX_CHILDREN = 32  # a bound on the descendant walk


def _stat(path: str) -> list[bytes] | None:
    """Fields of a ``/proc/.../stat`` file after the command name: [0] is field 3 (state)."""
    try:
        with open(path, "rb") as f:
            return f.read().rpartition(b")")[2].split()
    except OSError:
        return None


def _children(pid: int, tid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
            return [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        return []


def _child_cpu(me: list[bytes], main_tid: int) -> float:
    """CPU seconds of the main thread's descendants, live (their main threads' children) and reaped."""
    total = (int(me[13]) + int(me[14])) / _TICK  # cutime + cstime: children we reaped
    todo, seen = _children(os.getpid(), main_tid), 0
    while todo and seen < MAX_CHILDREN:
        pid = todo.pop()
        seen += 1
        fields = _stat(f"/proc/{pid}/stat")
        if fields is None:
            continue
        total += sum(int(x) for x in fields[11:15]) / _TICK  # utime stime cutime cstime
        todo += _children(pid, pid)
    return total


class Activity:
    """Deltas since the previous ``sample()`` (the first: since this object was made)."""

    def __init__(self) -> None:
        self.main_tid = threading.main_thread().native_id or os.getpid()
        self.last: dict[str, float] = {}
        self.sample()

    def _totals(self) -> tuple[dict[str, float], str | None]:
        totals: dict[str, float] = {}
        state = None
        main = _stat(f"/proc/self/task/{self.main_tid}/stat")
        if main is not None:
            state = main[0].decode()
            totals["main_cpu_s"] = (int(main[11]) + int(main[12])) / _TICK
        me = _stat("/proc/self/stat")
        if me is not None:
            totals["majflt"] = float(me[9])
            totals["child_cpu_s"] = _child_cpu(me, self.main_tid)
        try:
            with open("/proc/self/io", "rb") as f:
                io = dict(line.split(b":") for line in f.read().splitlines() if b":" in line)
            totals["io_b"] = float(int(io[b"rchar"]) + int(io[b"wchar"]))
        except (OSError, KeyError, ValueError):
            pass
        return totals, state

    def sample(self) -> dict[str, Any]:
        """``{"main": {"state", "cpu_s"}, "majflt", "io_b", "child_cpu_s"}``, whatever was readable."""
        try:
            totals, state = self._totals()
        except (ValueError, IndexError):  # an unexpected /proc layout: no figures, never an error
            return {}
        delta = {k: max(0.0, v - self.last.get(k, 0.0)) for k, v in totals.items()}  # a gone child: not < 0
        self.last = totals
        out: dict[str, Any] = {}
        if state is not None:
            out["main"] = {"state": state, "cpu_s": round(delta["main_cpu_s"], 3)}
        for key in ("majflt", "io_b"):
            if key in delta:
                out[key] = int(delta[key])
        if "child_cpu_s" in delta:
            out["child_cpu_s"] = round(delta["child_cpu_s"], 3)
        return out
