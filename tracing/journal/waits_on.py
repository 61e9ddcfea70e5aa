"""What a waiting rank waits on, as records carry it: a ``diagnosis`` record's ``evidence`` (label ->
``Evidence``) and a node's snapshot. Read by ``verdicts.evidence`` from ``/proc``; written with
``msgspec.to_builtins``; every string, list and number bounded, so what another process or node
wrote is checked as it is decoded (``from_builtins``)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

MAX_CHILDREN = 32  # descendants kept
MAX_SOCKETS = 8  # sockets kept in one Evidence
MAX_TEXT = 1024  # characters of any string
MAX_EVIDENCE = 16  # ranks one diagnosis record says it of

Str = Annotated[str, msgspec.Meta(max_length=MAX_TEXT)]
Pid = Annotated[int, msgspec.Meta(ge=0, le=(1 << 31) - 1)]
Int = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
Num = Annotated[float, msgspec.Meta(ge=-1e12, le=1e12)]


class _Struct(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    pass


class FileLock(_Struct, kw_only=True):
    """A lock this pid waits for (``/proc/locks``). ``how``: ``blocked`` — the kernel lists it as a
    waiter; ``polls`` — it holds the locked file open and no lock on it while its main thread
    sleeps (a lock taken with ``LOCK_NB`` in a retry loop, as FlashInfer's ``filelock`` does)."""

    path: Str | None = None  # from a descriptor of the waiter or the holder; None when neither is readable
    device: Str  # "254:0", major:minor of the file system
    inode: Int
    kind: Str  # "flock" | "posix" | "ofd" | "lease" | as the kernel names it
    exclusive: bool
    how: Literal["blocked", "polls"] = "blocked"
    holder_pid: Pid | None = None  # None: an OFD lock (no pid recorded) or a holder outside this pid namespace
    holder_cmd: Str | None = None  # redacted
    holder_age_s: Num | None = None  # how long the holder process has run (the lock's own age is not recorded)
    holder_alive: bool | None = None
    holder_has_it_open: bool | None = None  # False: whoever inherited the descriptor holds it now
    holder_in_launch: bool | None = None  # None: the caller gave no launch pids
    holder_via: Pid | None = None  # the launch process the holder descends from (itself, or an ancestor)
    waiters: Annotated[list[Pid], msgspec.Meta(max_length=1024)] = msgspec.field(default_factory=list)


class Child(_Struct, kw_only=True):
    """A descendant process (a compiler, a build tool, a worker)."""

    pid: Pid
    ppid: Pid
    name: Str
    cmd: Str  # redacted, cut to MAX_CMD
    cpu_pct: Num  # of one core
    cpu_over: Literal["window", "since_previous", "lifetime"]
    cpu_s: Num  # its own CPU seconds so far (user + system)
    sampled: Num  # Unix seconds when ``cpu_s`` was read
    started: Num  # Unix seconds (with ``pid``, names the process across reads)
    age_s: Num
    state: Str
    build: Str | None = None  # "nvcc (CUDA compiler)" when it looks like a compile or JIT build


class Socket(_Struct, kw_only=True):
    """A socket of the pid, from ``/proc/PID/net`` (its network namespace)."""

    inode: Int
    proto: Literal["tcp", "tcp6", "unix"]
    fd: Int | None = None
    local: Str | None = None
    remote: Str | None = None  # "10.0.0.5:443"; a unix socket's path
    state: Str  # "SYN_SENT", "ESTABLISHED", … ; unix: "connected", "unconnected", …
    rx_queue: Int | None = None  # bytes received, not yet read by the process
    tx_queue: Int | None = None  # bytes sent, not yet acknowledged by the peer
    retransmits: Int | None = None
    last_recv_s: Num | None = None  # since data (or the connection itself) last came in: tcp_info, netlink only
    role: Str | None = None  # "rendezvous" when it is the address the caller named
    meaning: Str  # what the state says, in words


class MainWait(_Struct, kw_only=True):
    """Where the main thread is: its state, system call, kernel wait channel, native frame."""

    kind: Str  # a key of KINDS
    words: Str  # the kind in words, refined by what was read
    source: Literal["py-spy", "syscall", "wchan", "state", "none"]
    state: Str | None = None  # R, S, D, T, Z…
    syscall: Str | None = None
    fd: Int | None = None
    target: Str | None = None  # what the descriptor is: a path, "socket:[123]", "pipe:[9]"
    wchan: Str | None = None
    frame: Str | None = None  # the top native frame: "flock (libc.so.6)"
    library: Str | None = None  # "NCCL (ncclCommInitRank)", "CUDA (cudaStreamSynchronize)", "gloo", …
    python: Str | None = None  # the innermost Python frame above it


Cause = Literal["lock", "child", "socket", "native", "none", "gone"]


class Evidence(_Struct, kw_only=True):
    pid: Pid
    t: Int  # Unix ns of the read
    cause: Cause
    busy: bool = False  # it waits on its own busy child: "busy, not stuck", never a stall
    text: Str  # one phrase for a verdict line: "waits for an exclusive lock on … held by pid 4242 (…) for 9 s"
    gone: bool = False  # it ended (or its pid names another process) before or during the read
    main: MainWait | None = None
    locks: Annotated[list[FileLock], msgspec.Meta(max_length=16)] = msgspec.field(default_factory=list)
    children: Annotated[list[Child], msgspec.Meta(max_length=MAX_CHILDREN)] = msgspec.field(default_factory=list)
    sockets: Annotated[list[Socket], msgspec.Meta(max_length=MAX_SOCKETS)] = msgspec.field(default_factory=list)
    sockets_from: Str | None = None  # "the descriptor it waits on" | "its epoll set" | "its open sockets"
    waited_s: Num | None = None  # since the caller's ``since_ns`` (an upper bound of how long it waits)
    unread: Annotated[list[Str], msgspec.Meta(max_length=32)] = msgspec.field(default_factory=list)


class Shared(_Struct, kw_only=True):
    """The cause every idle rank shares (``shared_cause``)."""

    kind: Literal["lock", "socket", "child"]
    alarm: bool  # False: busy, not stuck
    labels: list[Str]
    pids: list[Pid]  # the idle ranks, then the holder when there is one
    text: Str  # "tp0, tp1 wait for an exclusive lock on …/sampling.lock held by pid 4242 (`flock`, …) for 9 s"
    waited_s: Num | None = None
    holder_pid: Pid | None = None


def from_builtins(value: object) -> Evidence | None:
    """An ``Evidence`` from decoded JSON another process wrote (bounds checked); None when it is not one."""
    try:
        return msgspec.convert(value, Evidence)
    except msgspec.ValidationError:
        return None
