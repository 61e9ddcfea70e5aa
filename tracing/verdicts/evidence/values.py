"""The evidence package's constants and words; its values (bounded msgspec structs: they go into
``diagnosis`` records and node snapshots) are the journal's (``journal.waits_on``)."""

from __future__ import annotations

from ...journal.waits_on import (
    MAX_CHILDREN,
    MAX_SOCKETS,
    MAX_TEXT,
    Cause,
    Child,
    Evidence,
    FileLock,
    MainWait,
    Shared,
    Socket,
    from_builtins,
)

__all__ = [
    "MAX_CHILDREN",
    "MAX_SOCKETS",
    "MAX_TEXT",
    "Cause",
    "Child",
    "Evidence",
    "FileLock",
    "MainWait",
    "Shared",
    "Socket",
    "from_builtins",
]

NS = 1_000_000_000
BUSY_PCT = 25.0  # a child at this share of a core works (as diagnose.CPU_BUSY_PCT for the rank itself)
MAX_CMD = 1000  # characters of a command line kept (the phrase shows 60)

KINDS: dict[str, str] = {  # what the main thread waits on, read after "waits on"
    "flock": "a file lock (`flock`)",
    "lock": "a file lock (`fcntl`)",
    "lock_poll": "a file lock it polls for",
    "futex": "a lock or condition (`futex`: the GIL, a thread join, a queue, a library's own lock)",
    "gil": "the GIL (`futex`: another thread holds it)",
    "join": "a thread join (`futex`)",
    "pylock": "a Python lock or queue (`futex`)",
    "poll": "several descriptors (`poll`/`select`)",
    "epoll": "several descriptors (`epoll_wait`)",
    "connect": "a connection being opened (`connect`)",
    "accept": "a peer to connect to it (`accept`)",
    "recv": "a socket (`recv`)",
    "socket": "a socket (connect or receive)",
    "read": "a read (`read`)",
    "pipe": "a pipe: another process's output (`read`)",
    "send": "a send (`send`/`write`)",
    "sleep": "a sleep (`nanosleep`: a retry or polling loop)",
    "wait_child": "a child process to end (`wait4`/`waitid`)",
    "ioctl": "a device driver (`ioctl`: the GPU's, for a CUDA call)",
    "yield": "a spin loop (`sched_yield`)",
    "file": "a file system call",
    "signal": "a signal",
    "cuda": "a CUDA call",
    "nccl": "an NCCL call",
    "gloo": "a gloo call",
    "running": "nothing: it runs on a CPU",
    "disk_wait": "a disk or network file system (state D: uninterruptible)",
    "stopped": "nothing: it is stopped (SIGSTOP or a debugger)",
    "other": "a system call",
    "unknown": "something /proc does not show",
}
SOCKETISH = frozenset({"connect", "accept", "recv", "socket", "read", "poll", "epoll", "send"})
COLLECTIVE_KINDS = frozenset({"nccl", "gloo"})
