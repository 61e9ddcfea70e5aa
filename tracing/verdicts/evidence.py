"""What a waiting rank waits on, read from what the operating system already knows.

A verdict that says "blocked in 'attention.init'" sends the engineer to py-spy, ``/proc/locks``,
``ps`` and ``ss`` by hand. This module reads the same sources for one pid under suspicion and
names the cause in words: a file lock and its holder, a busy child compiler, a socket that never
answers, or the native call the main thread sits in. Nothing is signalled, paused or attached:
every reading is a small ``/proc`` file, and the py-spy dump, when there is one, is the text the
watchdog already took (``stacks.py``).

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
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import socket
import struct
import sys
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Literal, TypeVar

import msgspec

from ..redact import printable

_T = TypeVar("_T")
NS = 1_000_000_000
BUSY_PCT = 25.0  # a child at this share of a core works (as diagnose.CPU_BUSY_PCT for the rank itself)
MAX_FDS = 1024  # descriptors looked at per process (a rank has a few hundred)
MAX_TASKS = 1024  # threads whose children are listed, over all descendants
MAX_CHILDREN = 32  # descendants walked
MAX_SOCKETS = 8  # sockets kept in one Evidence
MAX_POLL_SCAN = 256  # files of a sleeping rank checked against the locks others hold (~20 µs each)
_NOT_LOCKS = ("/dev/", "/proc/", "/sys/", "/memfd:")
MAX_CMD = 1000  # characters of a command line kept (the phrase shows 60)
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# -- the values -------------------------------------------------------------------------------------------

Str = Annotated[str, msgspec.Meta(max_length=1024)]
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
    waiters: list[Pid] = msgspec.field(default_factory=list)  # every pid the kernel shows waiting for it


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


# -- words --------------------------------------------------------------------------------------------------

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
_SOCKETISH = frozenset({"connect", "accept", "recv", "socket", "read", "poll", "epoll", "send"})
_SLEEPISH = frozenset({"sleep", "poll", "epoll", "futex", "socket", "unknown", "other"})

_SYSCALLS_X86_64 = {
    0: "read", 1: "write", 7: "poll", 16: "ioctl", 17: "pread64", 19: "readv", 20: "writev", 23: "select",
    24: "sched_yield", 34: "pause", 35: "nanosleep", 42: "connect", 43: "accept", 44: "sendto", 45: "recvfrom",
    46: "sendmsg", 47: "recvmsg", 61: "wait4", 72: "fcntl", 73: "flock", 74: "fsync", 75: "fdatasync",
    128: "rt_sigtimedwait", 130: "rt_sigsuspend", 202: "futex", 230: "clock_nanosleep", 232: "epoll_wait",
    247: "waitid", 257: "openat", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 288: "accept4",
    299: "recvmmsg", 441: "epoll_pwait2", 449: "futex_waitv",
}  # fmt: skip
_SYSCALLS_GENERIC = {  # aarch64, riscv64 (asm-generic/unistd.h)
    22: "epoll_pwait", 25: "fcntl", 29: "ioctl", 32: "flock", 56: "openat", 63: "read", 64: "write", 65: "readv",
    66: "writev", 67: "pread64", 72: "pselect6", 73: "ppoll", 82: "fsync", 83: "fdatasync", 95: "waitid",
    98: "futex", 101: "nanosleep", 115: "clock_nanosleep", 124: "sched_yield", 133: "rt_sigsuspend",
    137: "rt_sigtimedwait", 202: "accept", 203: "connect", 206: "sendto", 207: "recvfrom", 211: "sendmsg",
    212: "recvmsg", 242: "accept4", 243: "recvmmsg", 260: "wait4", 441: "epoll_pwait2", 449: "futex_waitv",
}  # fmt: skip
SYSCALLS = _SYSCALLS_X86_64 if os.uname().machine == "x86_64" else _SYSCALLS_GENERIC
_SYSCALL_KIND = {
    "flock": "flock", "futex": "futex", "futex_waitv": "futex", "poll": "poll", "ppoll": "poll",
    "select": "poll", "pselect6": "poll", "epoll_wait": "epoll", "epoll_pwait": "epoll", "epoll_pwait2": "epoll",
    "connect": "connect", "accept": "accept", "accept4": "accept", "recvfrom": "recv", "recvmsg": "recv",
    "recvmmsg": "recv", "read": "read", "readv": "read", "pread64": "read", "write": "send", "writev": "send",
    "sendto": "send", "sendmsg": "send", "nanosleep": "sleep", "clock_nanosleep": "sleep", "wait4": "wait_child",
    "waitid": "wait_child", "ioctl": "ioctl", "sched_yield": "yield", "fsync": "file", "fdatasync": "file",
    "openat": "file", "pause": "signal", "rt_sigsuspend": "signal", "rt_sigtimedwait": "signal", "fcntl": "other",
}  # fmt: skip
_FD_ARG = frozenset(
    {"read", "readv", "pread64", "write", "writev", "recvfrom", "recvmsg", "recvmmsg", "sendto", "sendmsg",
     "connect", "accept", "accept4", "flock", "fcntl", "ioctl", "epoll_wait", "epoll_pwait", "epoll_pwait2",
     "fsync", "fdatasync"}
)  # fmt: skip
_F_SETLKW, _F_OFD_SETLKW = 7, 38
_WCHAN = (  # (substring of the kernel function, kind), first match wins
    ("lock_inode_wait", "flock"), ("flock", "flock"), ("fcntl_setlk", "lock"), ("posix_lock", "lock"),
    ("futex", "futex"), ("ep_poll", "epoll"), ("epoll", "epoll"), ("do_sys_poll", "poll"), ("do_poll", "poll"),
    ("select", "poll"), ("inet_wait_for_connect", "connect"), ("stream_connect", "connect"),
    ("inet_csk_accept", "accept"), ("sk_wait_data", "recv"), ("tcp_recvmsg", "recv"), ("unix_stream", "recv"),
    ("skb_wait_for_more", "recv"), ("wait_woken", "socket"), ("pipe_read", "pipe"), ("pipe_wait", "pipe"),
    ("nanosleep", "sleep"), ("nsleep", "sleep"), ("do_wait", "wait_child"), ("kernel_wait", "wait_child"),
)  # fmt: skip
_TCP_STATES = {
    1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2", 6: "TIME_WAIT", 7: "CLOSE",
    8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING",
}  # fmt: skip
_UNIX_STATES = {1: "unconnected", 2: "connecting", 3: "connected", 4: "disconnecting"}

# A compile or JIT build, by process name (``comm``, 15 characters) or an argv word's base name.
_BUILD_NAMES = {
    **dict.fromkeys(("nvcc", "cicc", "ptxas", "nvlink", "fatbinary", "cudafe++", "nvdisasm"), "CUDA compiler"),
    **dict.fromkeys(("hipcc", "clang-offload-bundler"), "ROCm compiler"),
    **dict.fromkeys(("gcc", "g++", "cc", "c++", "cc1", "cc1plus", "clang", "clang++", "as"), "C/C++ compiler"),
    **dict.fromkeys(("ld", "ld.gold", "ld.lld", "lld", "collect2"), "linker"),
    **dict.fromkeys(("ninja", "make", "cmake", "gmake"), "build tool"),
}
_BUILD_CMDS = (  # (regular expression on the command line, what it is)
    (re.compile(r"sglang\.compile_deep_gemm"), "DeepGEMM pre-compile"),
    (re.compile(r"torch\._inductor\.compile_worker"), "torch inductor compile worker"),
    (re.compile(r"triton.*(compile|ptxas)|(compile|ptxas).*triton"), "Triton compile"),
    (re.compile(r"flashinfer.*(jit|build|ninja)"), "FlashInfer JIT build"),
    (re.compile(r"deep_gemm"), "DeepGEMM JIT build"),
)


def looks_like_build(name: str, cmdline: Iterable[str]) -> str | None:
    """``"nvcc (CUDA compiler)"`` when a process looks like a compile or JIT build, else None."""
    argv = list(cmdline)
    for word in (name, *(os.path.basename(a) for a in argv[:2])):
        what = _BUILD_NAMES.get(word)
        if what is not None:
            return f"{word} ({what})"
    text = " ".join(argv)[:4096]
    for pattern, what in _BUILD_CMDS:
        if pattern.search(text):
            return what
    return None


# -- py-spy --native ----------------------------------------------------------------------------------------

_THREAD = re.compile(r"^Thread (0x[0-9A-Fa-f]+|\d+) \(([^)]*)\)(?:: \"(.*)\")?")
_FRAME = re.compile(r"^\s{2,}(.+?)(?: \((.*)\))?\s*$")
_PY_WHERE = re.compile(r"(\.py|>):\d+$")
_NATIVE_KIND = {
    "flock": "flock", "fcntl": "lock", "lockf": "lock", "poll": "poll", "ppoll": "poll", "select": "poll",
    "pselect": "poll", "pselect6": "poll", "epoll_wait": "epoll", "epoll_pwait": "epoll", "epoll_pwait2": "epoll",
    "connect": "connect", "accept": "accept", "accept4": "accept", "recv": "recv", "recvfrom": "recv",
    "recvmsg": "recv", "recvmmsg": "recv", "libc_recv": "recv", "read": "read", "libc_read": "read", "pread": "read",
    "readv": "read", "nanosleep": "sleep", "clock_nanosleep": "sleep", "usleep": "sleep", "sleep": "sleep",
    "thrd_sleep": "sleep", "wait4": "wait_child", "waitpid": "wait_child", "waitid": "wait_child",
    "libc_wait": "wait_child", "ioctl": "ioctl", "sched_yield": "yield", "syscall": "futex",
}  # fmt: skip
_FUTEX = re.compile(
    r"^(futex|lll_|pthread_cond_|pthread_mutex_lock|sem_|new_sem_wait|do_futex|pthread_(clock|timed)?join)"
)
_MEANING = (  # a frame below the top that says what the futex is
    (re.compile(r"^take_gil$|^PyEval_RestoreThread$|^PyEval_AcquireThread$"), "gil"),
    (re.compile(r"pthread_(clock|timed)?join"), "join"),
    (re.compile(r"PyThread_acquire_lock|^acquire_timed$|^lock_PyThread"), "pylock"),
)
_LIBS = (  # (name, frame test), in the order a match is preferred
    ("NCCL", lambda f, w: "libnccl" in w or f.startswith("nccl")),
    ("gloo", lambda f, w: "gloo" in w or "gloo::" in f),
    ("CUDA", lambda f, w: "libcuda" in w or "libcudart" in w or re.match(r"^cu(da)?[A-Z]", f) is not None),
    ("torch.distributed", lambda f, w: "c10d::" in f),
)
_LIB_KIND = {"NCCL": "nccl", "gloo": "gloo", "CUDA": "cuda"}
_CALL = {"futex": "futex", "yield": "sched_yield", "ioctl": "ioctl", "poll": "poll", "sleep": "nanosleep"}
_POLLED_LOCK = re.compile(r"filelock|file_baton|FileLock|FileBaton|_lock\.py|lockfile", re.IGNORECASE)


@dataclass(frozen=True)
class Native:
    """The main thread of a py-spy ``--native`` dump, classified."""

    kind: str
    words: str
    frame: str | None  # the top frame as py-spy wrote it
    library: str | None = None
    python: str | None = None


def _normal(func: str) -> str:
    func = re.sub(r"^__GI_", "", func).lstrip("_")
    return re.sub(r"(_nocancel|_time64|64)$", "", func.split("@", 1)[0])


def main_thread_frames(dump: str, pid: int | None = None) -> list[tuple[str, str]]:
    """``(function, where)`` of the main thread, innermost first, from py-spy ``dump`` text (its
    ``--native`` section when the text holds both, as ``stacks.py_spy`` writes them)."""
    marker = dump.find("with native frames ===")
    if marker >= 0:
        dump = dump[marker:]
    frames: list[tuple[str, str]] | None = None
    for line in dump.splitlines():
        head = _THREAD.match(line)
        if head is not None:
            if frames is not None:
                break
            tid, name = head.group(1), head.group(3)
            if name == "MainThread" or (pid is not None and tid == str(pid)):
                frames = []
            continue
        if frames is not None:
            m = _FRAME.match(line)
            if m is not None:
                frames.append((m.group(1), m.group(2) or ""))
            elif line.strip() and not line.startswith(" "):
                break
    return frames or []


def native_frame(dump: str, pid: int | None = None) -> Native | None:
    """The main thread's native call, classified in words (``flock``, ``futex`` under NCCL, a CUDA
    call, ``poll``…); None when the dump has no main thread. Dumps without native frames still give
    the innermost Python frame (kind ``unknown``)."""
    frames = main_thread_frames(dump, pid)
    if not frames:
        return None
    py_at = next((i for i, (_, w) in enumerate(frames) if _PY_WHERE.search(w)), len(frames))
    native = frames[:py_at]
    python = f"{frames[py_at][0]} ({frames[py_at][1]})" if py_at < len(frames) else None
    kind = "unknown"
    for func, _ in native[:4]:
        name = _normal(func)
        if name in _NATIVE_KIND:
            kind = _NATIVE_KIND[name]
            break
        if _FUTEX.match(name):
            kind = "futex"
            break
    if kind == "futex":
        for func, _ in native:
            hit = next((k for pattern, k in _MEANING if pattern.search(func)), None)
            if hit is not None:
                kind = hit
                break
    library, words = None, ""
    for lib, test in _LIBS:
        hits = [f for f, w in native if test(f, w)]
        if hits:
            entry = hits[-1].split("(")[0]  # its outermost frame: the call the program made
            library = f"{lib} ({entry})"
            if kind in ("unknown", "futex", "yield", "ioctl", "poll", "sleep") and lib in _LIB_KIND:
                at = f", in `{_CALL[kind]}`" if kind in _CALL else ""
                kind, words = _LIB_KIND[lib], f"{KINDS[_LIB_KIND[lib]]} (`{entry}`{at})"
            break
    if kind in ("sleep", "poll", "futex", "unknown") and any(_POLLED_LOCK.search(w) for _, w in frames[py_at:][:4]):
        kind = "lock_poll"
    words = words or KINDS.get(kind, KINDS["other"]) + (f" in {library}" if library else "")
    top = f"{frames[0][0]} ({frames[0][1]})" if frames[0][1] else frames[0][0]
    return Native(kind, printable(words), printable(top), printable(library) if library else None, _short(python))


def _short(text: str | None) -> str | None:
    """A frame ``f (/long/path/to/x.py:12)`` as ``f (to/x.py:12)``, redacted."""
    if text is None:
        return None
    m = re.match(r"^(.*) \((.*)\)$", text)
    if m and "/" in m.group(2):
        text = f"{m.group(1)} ({'/'.join(m.group(2).split('/')[-2:])})"
    return printable(text)


# -- /proc/locks ------------------------------------------------------------------------------------------

_LOCK_LINE = re.compile(
    r"^(\d+):\s+(->\s+)?(\S+)\s+(\S+)\s+(\S+)\s+(-?\d+)\s+([0-9a-fA-F]+):([0-9a-fA-F]+):(\d+)\s+(\S+)\s+(\S+)"
)
_LOCK_KINDS = {"FLOCK": "flock", "POSIX": "posix", "OFDLCK": "ofd", "LEASE": "lease", "DELEG": "lease"}


@dataclass(frozen=True)
class LockLine:
    """One line of ``/proc/locks``: a lock (``waiting`` False) or a process blocked on lock ``id``."""

    id: int
    waiting: bool
    kind: str
    exclusive: bool
    pid: int  # -1: an OFD lock (no pid); 0: a process outside this pid namespace
    major: int
    minor: int
    inode: int

    @property
    def device(self) -> str:
        return f"{self.major}:{self.minor}"


def parse_locks(text: str) -> list[LockLine]:
    """``/proc/locks`` text as ``LockLine``s; a line it cannot read is skipped."""
    out = []
    for line in text.splitlines():
        m = _LOCK_LINE.match(line)
        if m is None:
            continue
        kind = _LOCK_KINDS.get(m.group(3), m.group(3).lower())
        out.append(
            LockLine(
                int(m.group(1)),
                bool(m.group(2)),
                kind,
                m.group(5) == "WRITE",
                int(m.group(6)),
                int(m.group(7), 16),
                int(m.group(8), 16),
                int(m.group(9)),
            )
        )
    return out


def read_locks() -> list[LockLine] | None:
    """Every file lock on the host and its waiters (one read for all the ranks of a pass); None
    when ``/proc/locks`` cannot be read."""
    try:
        with open("/proc/locks", encoding="utf-8", errors="replace") as f:
            return parse_locks(f.read())
    except OSError:
        return None


# -- reading one process ------------------------------------------------------------------------------------


@dataclass
class _Proc:
    """``/proc/PID`` of one process, read at most once per file; every failure noted, never raised."""

    pid: int
    unread: list[str] = field(default_factory=list)
    _fds: list[tuple[int, str]] | None = None
    _mounts: dict[int, str] | None = None

    def text(self, name: str, what: str | None = None, limit: int = 1 << 20) -> str | None:
        try:
            with open(f"/proc/{self.pid}/{name}", "rb") as f:
                return f.read(limit).decode("utf-8", "replace")
        except (FileNotFoundError, ProcessLookupError):
            if what:
                self.unread.append(f"{what}: the process is gone")
        except PermissionError:
            if what:
                self.unread.append(f"{what}: permission denied (/proc/{self.pid}/{name})")
        except OSError as exc:
            if what:
                self.unread.append(f"{what}: {exc.strerror or exc}")
        return None

    def fds(self) -> list[tuple[int, str]]:
        """``(fd, link target)`` of its open descriptors (bounded; links read, never followed)."""
        if self._fds is None:
            self._fds = []
            try:
                names = os.listdir(f"/proc/{self.pid}/fd")
            except PermissionError:
                self.unread.append(f"descriptors: permission denied (/proc/{self.pid}/fd)")
                names = []
            except OSError:
                names = []
            for name in names[:MAX_FDS]:
                with contextlib.suppress(OSError, ValueError):
                    self._fds.append((int(name), os.readlink(f"/proc/{self.pid}/fd/{name}")))
        return self._fds

    def link(self, fd: int) -> str | None:
        try:
            return os.readlink(f"/proc/{self.pid}/fd/{fd}")
        except OSError:
            return None

    def fd_inode(self, fd: int) -> tuple[str | None, int] | None:
        """``(device, inode)`` of what ``fd`` refers to, from ``fdinfo`` (no file system call: a
        hung NFS mount cannot block it); device None when ``mountinfo`` does not say."""
        info = self.text(f"fdinfo/{fd}", limit=4096)
        if info is None:
            return None
        fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
        try:
            ino, mnt = int(fields["ino"]), int(fields.get("mnt_id", "-1"))
        except (KeyError, ValueError):
            return None
        return self.mounts().get(mnt), ino

    def mounts(self) -> dict[int, str]:
        if self._mounts is None:
            self._mounts = {}
            for line in (self.text("mountinfo") or "").splitlines():
                parts = line.split(maxsplit=3)
                if len(parts) >= 3 and parts[0].isdigit():
                    self._mounts[int(parts[0])] = parts[2]
        return self._mounts


def _stat_fields(pid: int | str) -> list[str] | None:
    """``/proc/PID/stat`` after the command name: [0] state, [1] ppid, [19] start time (ticks)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].decode().split()
    except OSError:
        return None


def _start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def _cmdline(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(8192)
    except OSError:
        return None
    if not raw:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/comm", "rb") as f:
            return f"[{f.read().decode(errors='replace').strip()}]"
        return None
    return printable(raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace"))[:MAX_CMD]


def _uptime_s() -> float | None:
    try:
        with open("/proc/uptime") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _age_s(pid: int) -> float | None:
    ticks, up = _start_ticks(pid), _uptime_s()
    return None if ticks is None or up is None else max(0.0, up - ticks / _TICK)


def _launch_ancestor(pid: int, launch: Collection[int]) -> int | None:
    """The first of ``pid`` and its ancestors that belongs to the launch (a rank's compiler child does)."""
    seen = 0
    while pid > 1 and seen < 64:
        if pid in launch:
            return pid
        fields = _stat_fields(pid)
        try:
            pid = int(fields[1]) if fields else 0
        except (IndexError, ValueError):
            return None
        seen += 1
    return None


# -- the main thread --------------------------------------------------------------------------------------


def _main(proc: _Proc, native: Native | None) -> MainWait:
    pid = proc.pid
    stat = proc.text(f"task/{pid}/stat", "main thread state")
    state = stat.rpartition(")")[2].split()[0] if stat and stat.rpartition(")")[2].split() else None
    syscall = fd = target = None
    kind, source = "unknown", "none"
    raw = proc.text("syscall", "system call")
    if raw is not None:
        parts = raw.split()
        if parts and parts[0] == "running":
            kind, source = "running", "syscall"
        elif parts and parts[0].lstrip("-").isdigit() and int(parts[0]) >= 0:
            syscall = SYSCALLS.get(int(parts[0]), f"syscall {parts[0]}")
            kind, source = _SYSCALL_KIND.get(syscall, "other"), "syscall"
            args = [int(a, 16) for a in parts[1:7]] if len(parts) >= 7 else []
            if syscall == "fcntl" and len(args) > 1 and args[1] in (_F_SETLKW, _F_OFD_SETLKW):
                kind = "lock"
            if (syscall in ("select", "pselect6") and args[:1] == [0]) or (
                syscall in ("poll", "ppoll") and args[1:2] == [0]
            ):
                kind = "sleep"  # no descriptors: a sleep (time.sleep before Python 3.11 is select(0, …))
            if syscall in _FD_ARG and args and args[0] < 1 << 31:
                fd = args[0]
                target = proc.link(fd)
                if kind == "read" and target:
                    kind = "recv" if target.startswith("socket:") else "pipe" if target.startswith("pipe:") else kind
    wchan = (proc.text("wchan") or "").strip()
    wchan = None if wchan in ("", "0") else wchan
    if source == "none" and wchan:
        kind, source = next((k for part, k in _WCHAN if part in wchan), "other"), "wchan"
    if kind in ("unknown", "running") and state:
        if state == "R":
            kind, source = "running", source if source != "none" else "state"
        elif state == "D":
            kind, source = "disk_wait", "state"
        elif state in ("T", "t"):
            kind, source = "stopped", "state"
    words = KINDS.get(kind, KINDS["other"]) if kind != "other" else f"`{syscall or wchan or '?'}`"
    frame = library = python = None
    if native is not None:  # what py-spy saw: the finer name of the same wait, when it agrees or says more
        frame, library, python = native.frame, native.library, native.python
        if native.kind != "unknown" and (kind in _SLEEPISH or kind == native.kind or native.kind in _LIB_KIND.values()):
            kind, words, source = native.kind, native.words, "py-spy"
        elif native.kind == "lock_poll":
            kind, words, source = "lock_poll", native.words, "py-spy"
    if target is not None:
        target = printable(target)
    return MainWait(
        kind=kind,
        words=words,
        source=source,
        state=state,
        syscall=syscall,
        fd=fd,
        target=target,
        wchan=wchan,
        frame=frame,
        library=library,
        python=python,
    )


# -- locks --------------------------------------------------------------------------------------------------


def _locks(proc: _Proc, main: MainWait, table: list[LockLine] | None, launch: Collection[int] | None) -> list[FileLock]:
    if not table:
        return []
    pid = proc.pid
    holders: dict[int, LockLine] = {ln.id: ln for ln in table if not ln.waiting}
    wanted: dict[tuple[int, int, int], tuple[LockLine, str, str | None]] = {}  # (maj, min, ino) -> (holder, how, path)
    waited = proc.fd_inode(main.fd) if main.kind in ("flock", "lock") and main.fd is not None else None
    for h in holders.values():  # the descriptor it waits on names the file (OFD waiters have no pid)
        if waited and h.inode == waited[1] and (waited[0] is None or waited[0] == h.device) and h.pid != pid:
            wanted[(h.major, h.minor, h.inode)] = (h, "blocked", main.target)
            break
    for ln in table:  # the kernel lists it as a waiter
        if ln.waiting and ln.pid == pid and ln.id in holders:
            h = holders[ln.id]
            wanted.setdefault((h.major, h.minor, h.inode), (h, "blocked", None))
    if not wanted and main.kind in ("sleep", "lock_poll"):  # polls: holds the locked file open, no lock on it
        mine = {(ln.major, ln.minor, ln.inode) for ln in table if ln.pid == pid}
        held = {ln.inode: ln for ln in holders.values() if ln.exclusive and ln.pid != pid}
        if held:  # one fdinfo read per file: the names that say "lock" first, MAX_POLL_SCAN in all
            files = [(fd, link) for fd, link in proc.fds() if link.startswith("/") and not link.startswith(_NOT_LOCKS)]
            files.sort(key=lambda item: "lock" not in item[1].rsplit("/", 1)[-1].lower())
            for fd, link in files[:MAX_POLL_SCAN]:
                got = proc.fd_inode(fd)
                h = held.get(got[1]) if got else None
                if h is not None and (got[0] is None or got[0] == h.device) and (h.major, h.minor, h.inode) not in mine:
                    wanted.setdefault((h.major, h.minor, h.inode), (h, "polls", link))
    out = []
    for h, how, path in list(wanted.values())[:16]:
        waiters = sorted({ln.pid for ln in table if ln.waiting and ln.id == h.id and ln.pid > 0})
        if path is None:
            path = _path_of(proc, h)
        holder = h.pid if h.pid > 0 else None
        out.append(_describe_lock(h, how, path, holder, waiters, launch))
    return out


def _path_of(proc: _Proc, lock: LockLine) -> str | None:
    """The locked file's path, from a descriptor of the waiter (it has the file open), else of the holder."""
    for who in (proc, _Proc(lock.pid) if lock.pid > 0 else None):
        if who is None:
            continue
        for fd, link in who.fds():
            if link.startswith("/"):
                got = who.fd_inode(fd)
                if got and got[1] == lock.inode and (got[0] is None or got[0] == lock.device):
                    return link
    return None


def _describe_lock(
    h: LockLine, how: str, path: str | None, holder: int | None, waiters: list[int], launch: Collection[int] | None
) -> FileLock:
    alive = has_open = in_launch = via = cmd = age = None
    if holder is not None:
        fields = _stat_fields(holder)
        alive = fields is not None and fields[0] not in ("Z", "X")
        if alive:
            cmd, age = _cmdline(holder), _age_s(holder)
            has_open = _holds_inode(holder, h)
        if launch:
            via = _launch_ancestor(holder, launch)
            in_launch = via is not None
    return FileLock(
        path=printable(path) if path else None,
        device=h.device,
        inode=h.inode,
        kind=h.kind,
        exclusive=h.exclusive,
        how=how,  # type: ignore[arg-type]
        holder_pid=holder,
        holder_cmd=cmd,
        holder_age_s=round(age, 1) if age is not None else None,
        holder_alive=alive,
        holder_has_it_open=has_open,
        holder_in_launch=in_launch,
        holder_via=via,
        waiters=waiters,
    )


def _holds_inode(pid: int, lock: LockLine) -> bool | None:
    """Whether ``pid`` has the locked file open; None when its descriptors cannot be read."""
    who = _Proc(pid)
    fds = who.fds()
    if not fds and who.unread:
        return None
    for fd, link in fds:
        if link.startswith("/"):
            got = who.fd_inode(fd)
            if got and got[1] == lock.inode and (got[0] is None or got[0] == lock.device):
                return True
    return False


# -- children -----------------------------------------------------------------------------------------------


def _child_pids(pid: int, budget: list[int]) -> list[int]:
    """Children of every thread of ``pid`` (a compiler may be started from any thread)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        if budget[0] <= 0:
            break
        budget[0] -= 1
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out += [int(c) for c in f.read().split()]
        except FileNotFoundError:  # no CONFIG_PROC_CHILDREN: psutil walks /proc for the parent ids
            try:
                import psutil

                return [c.pid for c in psutil.Process(pid).children()]
            except Exception:
                return out
        except (OSError, ValueError):
            continue
    return out


def _children(pid: int, now: float, window_s: float, previous: Evidence | None) -> list[Child]:
    import psutil

    todo, found, budget = _child_pids(pid, [MAX_TASKS]), [], [MAX_TASKS]
    while todo and len(found) < MAX_CHILDREN:
        cpid = todo.pop(0)
        try:
            p = psutil.Process(cpid)
            with p.oneshot():
                times = p.cpu_times()
                info = (p.name(), p.ppid(), p.cmdline(), times.user + times.system, p.create_time(), p.status())
        except (psutil.Error, OSError):
            continue  # ended, or not ours to read: one fewer child
        found.append((p, *info))
        todo += _child_pids(cpid, budget)
    if window_s > 0 and found:
        time.sleep(window_s)
    before = {(c.pid, round(c.started, 2)): c for c in previous.children} if previous else {}
    out = []
    for p, name, ppid, argv, cpu_s, created, state in found:
        over, age, sampled = "lifetime", max(now - created, 1e-3), now
        pct = 100 * cpu_s / age
        if window_s > 0:
            try:
                t = p.cpu_times()
                sampled = time.time()
                pct, over = 100 * max(0.0, t.user + t.system - cpu_s) / window_s, "window"
                cpu_s = t.user + t.system
            except (psutil.Error, OSError):
                continue
        elif (prev := before.get((p.pid, round(created, 2)))) is not None and now - prev.sampled > 0.05:
            pct, over = 100 * max(0.0, cpu_s - prev.cpu_s) / (now - prev.sampled), "since_previous"
        out.append(
            Child(
                pid=p.pid,
                ppid=ppid,
                name=printable(name)[:64],
                cmd=printable(" ".join(argv))[:MAX_CMD],
                cpu_pct=round(pct, 1),
                cpu_over=over,  # type: ignore[arg-type]
                cpu_s=round(cpu_s, 3),
                sampled=round(sampled, 3),
                started=round(created, 3),
                age_s=round(age, 1),
                state=str(state),
                build=looks_like_build(name, argv),
            )
        )
    out.sort(key=lambda c: (c.cpu_pct >= BUSY_PCT, c.build is not None, c.cpu_pct), reverse=True)
    return out


# -- sockets ------------------------------------------------------------------------------------------------

_SOCKET_LINK = re.compile(r"^socket:\[(\d+)\]$")


def _socket_inodes(proc: _Proc, main: MainWait) -> tuple[dict[int, int | None], str | None]:
    """Socket inodes the main thread waits on -> their fd, and where they were found."""
    if main.kind not in _SOCKETISH and main.kind not in ("unknown",):
        return {}, None
    if main.fd is not None and main.target and (m := _SOCKET_LINK.match(main.target)):
        return {int(m.group(1)): main.fd}, "the descriptor it waits on"
    if main.kind == "epoll" and main.fd is not None:
        info = proc.text(f"fdinfo/{main.fd}", "epoll set", limit=1 << 16) or ""
        found = {}
        for line in info.splitlines():
            m = re.match(r"^tfd:\s*(\d+).*\bino:([0-9a-f]+)", line)
            if m:
                found[int(m.group(2), 16)] = int(m.group(1))
        if found:
            return found, "its epoll set"
    if main.kind in ("poll", "epoll", "socket", "recv", "connect", "accept", "unknown"):
        found = {int(m.group(1)): fd for fd, link in proc.fds() if (m := _SOCKET_LINK.match(link))}
        return found, "its open sockets (the system call does not say which)" if found else None
    return {}, None


def _addr(hexaddr: str) -> str:
    """``0100007F:1F90`` -> ``127.0.0.1:8080``; IPv6 as ``[::1]:8080`` (IPv4-mapped as IPv4)."""
    host, _, port = hexaddr.partition(":")
    raw = bytes.fromhex(host)
    if sys.byteorder == "little":  # the kernel prints each 32-bit word in host order
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    text = f"[{ip}]" if ip.version == 6 else str(ip)
    return f"{text}:{int(port, 16)}"


@dataclass(frozen=True)
class TcpRow:
    """One TCP socket of a network namespace."""

    proto: str  # "tcp" | "tcp6"
    state: str
    local: str
    remote: str
    rx: int  # bytes received, not yet read
    tx: int  # bytes sent, not yet acknowledged
    retransmits: int
    last_recv_s: float | None = None  # since data (or the connection) last came in; sock_diag only
    last_sent_s: float | None = None


_NETLINK_SOCK_DIAG, _TCPDIAG_GETSOCK, _SOCK_DIAG_BY_FAMILY, _INET_DIAG_INFO = 4, 18, 20, 2
_NLM_REQUEST_DUMP, _NLMSG_ERROR, _NLMSG_DONE = 0x1 | 0x300, 2, 3
_ANY_STATE = 0xFFFFFFFF


def read_tcp(timeout_s: float = 1.0) -> dict[int, TcpRow] | None:
    """Every TCP socket of this process's network namespace, by inode, from a ``sock_diag`` netlink
    dump (what ``ss`` reads; no privilege), with ``tcp_info``'s time since data last came in; None
    when netlink is refused (``read`` then reads ``/proc/PID/net/tcp``). Either walks the kernel's
    whole connection hash table (milliseconds on a host with a large one), so one dump serves every
    rank of a pass: the IPv4-and-IPv6 request first (one walk), else one per family."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
    except (OSError, AttributeError):
        return None
    rows: dict[int, TcpRow] = {}
    with sock:
        sock.settimeout(timeout_s)  # a netlink dump never blocks for long; this bounds the rare case
        try:
            both = struct.pack("=BBBB", socket.AF_UNSPEC, 0, 0, 1 << (_INET_DIAG_INFO - 1)) + bytes(48)
            if _dump(sock, _TCPDIAG_GETSOCK, both + struct.pack("=II", _ANY_STATE, 0), rows):
                return rows
            for family in (socket.AF_INET, socket.AF_INET6):
                one = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 1 << (_INET_DIAG_INFO - 1), 0, _ANY_STATE)
                if not _dump(sock, _SOCK_DIAG_BY_FAMILY, one + bytes(48), rows):
                    return None
        except (OSError, struct.error, ValueError):
            return None
    return rows


def _dump(sock: socket.socket, kind: int, request: bytes, rows: dict[int, TcpRow]) -> bool:
    """Send one dump request and read its answers (``inet_diag_msg`` + ``tcp_info``) into ``rows``;
    False when the kernel refuses it."""
    sock.send(struct.pack("=IHHII", 16 + len(request), kind, _NLM_REQUEST_DUMP, 1, 0) + request)
    while True:
        data, off = sock.recv(1 << 16), 0
        while off + 16 <= len(data):
            length, what = struct.unpack_from("=IH", data, off)
            if length < 16 or what == _NLMSG_DONE:
                return True
            if what == _NLMSG_ERROR:
                return False
            if length >= 16 + 72:
                _row(data, off + 16, off + length, rows)
            off += (length + 3) & ~3


def _row(data: bytes, m: int, end: int, rows: dict[int, TcpRow]) -> None:
    family, state, _, retrans = struct.unpack_from("=BBBB", data, m)
    if family not in (socket.AF_INET, socket.AF_INET6):
        return
    width = 4 if family == socket.AF_INET else 16
    sport, dport = struct.unpack_from("!HH", data, m + 4)
    rq, wq, _, inode = struct.unpack_from("=IIII", data, m + 56)
    last_recv = last_sent = None
    a = m + 72
    while a + 4 <= end:  # attributes: tcp_info (last_data_sent at 44, last_data_recv at 52, in ms)
        alen, atype = struct.unpack_from("=HH", data, a)
        if alen < 4:
            break
        if atype == _INET_DIAG_INFO and alen >= 4 + 56:
            sent_ms, _, recv_ms = struct.unpack_from("=III", data, a + 4 + 44)
            last_sent, last_recv = sent_ms / 1000, recv_ms / 1000
        a += (alen + 3) & ~3
    if inode:
        rows[inode] = TcpRow(
            "tcp" if family == socket.AF_INET else "tcp6",
            _TCP_STATES.get(state, str(state)),
            _host_port(data[m + 8 : m + 8 + width], sport),
            _host_port(data[m + 24 : m + 24 + width], dport),
            rq,
            wq,
            retrans,
            last_recv,
            last_sent,
        )


def _host_port(raw: bytes, port: int) -> str:
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def _proc_tcp(proc: _Proc, inodes: Collection[int]) -> dict[int, TcpRow]:
    """The sockets ``inodes`` from ``/proc/PID/net/tcp{,6}`` (the pid's own network namespace)."""
    rows: dict[int, TcpRow] = {}
    for proto in ("tcp", "tcp6"):
        for line in (proc.text(f"net/{proto}", f"{proto} table") or "").splitlines()[1:]:
            f = line.split()
            if len(f) < 10 or not f[9].isdigit() or int(f[9]) not in inodes:
                continue
            with contextlib.suppress(ValueError, IndexError):
                tx, rx = (int(x, 16) for x in f[4].split(":"))
                state = _TCP_STATES.get(int(f[3], 16), f[3])
                rows[int(f[9])] = TcpRow(proto, state, _addr(f[1]), _addr(f[2]), rx, tx, int(f[6], 16))
    return rows


def _same_netns(pid: int) -> bool | None:
    try:
        return os.stat("/proc/self/ns/net").st_ino == os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _sockets(
    proc: _Proc, main: MainWait, rendezvous: str | None, tcp: Mapping[int, TcpRow] | None
) -> tuple[list[Socket], str | None]:
    inodes, where = _socket_inodes(proc, main)
    if not inodes:
        return [], None
    table = None
    if _same_netns(proc.pid):
        table = tcp if tcp is not None else read_tcp()
    if table is None:
        table = _proc_tcp(proc, inodes)
    out: list[Socket] = []
    for inode, fd in inodes.items():
        row = table.get(inode)
        if row is None:
            continue
        out.append(
            Socket(
                inode=inode,
                proto=row.proto,  # type: ignore[arg-type]
                fd=fd,
                local=row.local,
                remote=row.remote,
                state=row.state,
                rx_queue=row.rx,
                tx_queue=row.tx if row.state != "SYN_SENT" else 0,  # a SYN counts as one byte in flight
                retransmits=row.retransmits,
                last_recv_s=round(row.last_recv_s, 1) if row.last_recv_s is not None else None,
                role="rendezvous" if rendezvous and _same_addr(row.remote, rendezvous) else None,
                meaning=_tcp_meaning(row),
            )
        )
    if len(out) < len(inodes):
        for line in (proc.text("net/unix") or "").splitlines()[1:]:
            f = line.split(maxsplit=7)
            if len(f) < 7 or not f[6].isdigit() or int(f[6]) not in inodes:
                continue
            st = _UNIX_STATES.get(int(f[5], 16), f[5]) if re.fullmatch(r"[0-9A-Fa-f]+", f[5]) else f[5]
            path = printable(f[7]) if len(f) > 7 else None
            out.append(
                Socket(
                    inode=int(f[6]),
                    proto="unix",
                    fd=inodes[int(f[6])],
                    remote=path,
                    state=st,
                    meaning=f"unix socket {path or '(unnamed)'}, {st}",
                )
            )
    rank = {"SYN_SENT": 0, "ESTABLISHED": 1, "CLOSE_WAIT": 2}
    out.sort(
        key=lambda s: (s.role != "rendezvous", rank.get(s.state, 3 if s.proto != "unix" else 4), -(s.tx_queue or 0))
    )
    return out[:MAX_SOCKETS], where


def _tcp_meaning(row: TcpRow) -> str:
    """The TCP state in words. The queues are what is there now: "nothing received" means nothing
    unread at this moment; how long since anything came in, only where ``tcp_info`` says."""
    state, rx, tx = row.state, row.rx, row.tx
    if state == "SYN_SENT":
        return f"connecting (SYN_SENT), no answer yet, SYN sent {row.retransmits + 1} times"
    if state == "ESTABLISHED":
        if rx:
            text = f"connected, {rx} B received and not yet read"
        elif row.last_recv_s is not None:  # tcp_info: since data last came in, or since it connected
            text = f"connected, nothing received for {row.last_recv_s:.0f} s"
        else:
            text = "connected, nothing received to read"
        if tx:
            text += f", {tx} B sent and not acknowledged ({row.retransmits} retransmits)"
        return text
    return {
        "CLOSE_WAIT": "CLOSE_WAIT: the peer closed the connection",
        "LISTEN": "listening",
        "SYN_RECV": "SYN_RECV: a peer is connecting",
    }.get(state, state)


def _same_addr(remote: str, wanted: str) -> bool:
    wanted = re.sub(r"^\w+://", "", wanted.strip())
    host, _, port = wanted.rpartition(":")
    r_host, _, r_port = remote.rpartition(":")
    if port != r_port:
        return False
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host) == ipaddress.ip_address(r_host.strip("[]"))
    except ValueError:
        return True  # a host name: the port is what can be checked


# -- one pid ------------------------------------------------------------------------------------------------


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
    tcp: Mapping[int, TcpRow] | None = None,
    rendezvous: str | None = None,
    now_ns: int | None = None,
) -> Evidence:
    """What ``pid`` waits on, from ``/proc`` (and a py-spy ``--native`` dump text when given).

    ``launch_pids``: every pid of the launch (ranks, launcher), to say whether a lock's holder belongs
    to it; ``since_ns``: when the rank last progressed or its phase began (the wait began after it);
    ``start_ticks``: the journal's record of the process, so a recycled pid is not read as it;
    ``window_s``: measure children's CPU over this window (it sleeps); else since ``previous`` (the
    last Evidence of this pid), else over each child's lifetime; ``locks``, ``tcp``: ``read_locks()``
    and ``read_tcp()`` once for all the ranks of a pass (read here when not given); ``rendezvous``: the
    launch's ``HOST:PORT``, to name that socket. Never raises for a process that ends or a file that cannot be read."""
    t_ns = now_ns if now_ns is not None else time.time_ns()
    waited = max(0.0, (t_ns - since_ns) / NS) if since_ns is not None else None
    ticks = _start_ticks(pid)
    if ticks is None or (start_ticks is not None and ticks != start_ticks) or _zombie(pid):
        return _finish(Evidence(pid=pid, t=t_ns, cause="gone", gone=True, text="", waited_s=waited))
    proc = _Proc(pid)
    launch = set(launch_pids) or None
    parsed = _guard(proc, "py-spy dump", lambda: native_frame(native, pid) if native else None, None)
    main = _guard(proc, "main thread", lambda: _main(proc, parsed), None) or MainWait(
        kind="unknown", words=KINDS["unknown"], source="none"
    )
    table = locks if locks is not None else read_locks()
    if table is None:
        proc.unread.append("file locks: /proc/locks is not readable")
    found_locks = _guard(proc, "file locks", lambda: _locks(proc, main, table, launch), [])
    children = _guard(proc, "children", lambda: _children(pid, t_ns / NS, window_s, previous), [])
    sockets, sockets_from = _guard(proc, "sockets", lambda: _sockets(proc, main, rendezvous, tcp), ([], None))
    gone = _start_ticks(pid) != ticks or _zombie(pid)
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
    return _finish(ev)


def _guard(proc: _Proc, what: str, read_it: Callable[[], _T], default: _T) -> _T:
    """One part of the read; a /proc layout it cannot parse (or psutil missing) costs that part only."""
    try:
        return read_it()
    except (OSError, ValueError, IndexError, KeyError, ImportError) as exc:
        proc.unread.append(f"{what}: {type(exc).__name__}: {exc}")
        return default


def _zombie(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and bool(fields) and fields[0] in ("Z", "X")


def _finish(ev: Evidence) -> Evidence:
    """``cause``, ``busy`` and ``text`` from what was read."""
    busy_child = next((c for c in ev.children if c.cpu_pct >= BUSY_PCT), None)
    own = {c.pid for c in ev.children}  # a lock its own busy child holds: the child is what it waits for
    if ev.gone:
        cause, busy = "gone", False
    elif ev.locks and (busy_child is None or any(lk.holder_pid not in own for lk in ev.locks)):
        cause, busy = "lock", False
    elif busy_child is not None:
        cause, busy = "child", True
    elif ev.sockets and ev.main is not None and ev.main.kind in _SOCKETISH | {"nccl", "gloo"}:
        cause, busy = "socket", False
    elif ev.main is not None and ev.main.kind == "wait_child" and ev.children:
        cause, busy = "child", False
    elif ev.main is not None and ev.main.kind not in ("unknown",):
        cause, busy = "native", False
    else:
        cause, busy = "none", False
    ev = msgspec.structs.replace(ev, cause=cause, busy=busy)
    return msgspec.structs.replace(ev, text=phrase(ev))


def _for(ev: Evidence) -> str:
    return f" for {ev.waited_s:.0f} s" if ev.waited_s is not None else ""


def _path(path: str, width: int = 120) -> str:
    return path if len(path) <= width else "…/" + "/".join(path.split("/")[-3:])


def _cmd(cmd: str | None, width: int = 60) -> str:
    if not cmd:
        return ""
    words = cmd.split()
    for i in range(min(2, len(words))):  # the program and its script, by name; the record keeps the whole line
        if i == 0 or words[i].startswith("/"):
            words[i] = os.path.basename(words[i]) or words[i]
    text = " ".join(words)
    return text if len(text) <= width else text[: width - 1] + "…"


def lock_text(lock: FileLock, syscall: str | None = None) -> str:
    """``an exclusive lock on PATH held by pid 4242 (`flock`, not part of this launch: python3 x.py)``."""
    mode = "an exclusive" if lock.exclusive else "a shared"
    on = _path(lock.path) if lock.path else f"inode {lock.inode} of device {lock.device} (no access to its path)"
    what = f"{mode} lock on {on}"
    if lock.holder_pid is None:
        return f"{what} ({lock.kind}; its holder is " + (
            "not recorded: an open-file-description lock)" if lock.kind == "ofd" else "outside this pid namespace)"
        )
    notes = [f"`{syscall or lock.kind}`"]
    if lock.holder_in_launch is False:
        notes.append("not part of this launch")
    elif lock.holder_in_launch:
        notes.append(
            "part of this launch" if lock.holder_via == lock.holder_pid else f"a child of pid {lock.holder_via}"
        )
    if lock.holder_alive is False:
        notes.append("it has ended: whoever inherited its descriptor holds the lock")
    elif lock.holder_has_it_open is False:
        notes.append("no longer has the file open: a process that inherited the descriptor holds the lock")
    if lock.holder_age_s is not None and lock.holder_age_s >= 600:
        notes.append(f"running for {lock.holder_age_s / 60:.0f} min")
    cmd = f": {_cmd(lock.holder_cmd)}" if lock.holder_cmd else ""
    return f"{what} held by pid {lock.holder_pid} ({', '.join(notes)}{cmd})"


def child_text(child: Child) -> str:
    """``nvcc (pid 5151, CUDA compiler) at 100 % CPU, running 70 s``."""
    what = f", {child.build.split(' (', 1)[-1].rstrip(')')}" if child.build else ""
    return f"{child.name} (pid {child.pid}{what}) at {child.cpu_pct:.0f} % CPU, running {child.age_s:.0f} s"


def socket_text(sock: Socket) -> str:
    """``the rendezvous 10.0.0.1:29500 (connecting (SYN_SENT), no answer yet, …)``."""
    if sock.proto == "unix":
        return sock.meaning
    role = "the rendezvous " if sock.role == "rendezvous" else ""
    return f"{role}{sock.remote} ({sock.meaning})"


def phrase(ev: Evidence) -> str:
    """What it waits on, in one phrase a verdict line can carry after the rank's name."""
    main = ev.main
    call = f"`{main.syscall}`" if main and main.syscall else None
    if ev.cause == "gone":
        return "ended before or while it was read"
    if ev.cause == "lock":
        lock = next(lk for lk in ev.locks)
        verb = "polls for" if lock.how == "polls" else "waits for"
        more = f" (and {len(ev.locks) - 1} more lock{'s' if len(ev.locks) > 2 else ''})" if len(ev.locks) > 1 else ""
        call = main.syscall if main and main.kind in ("flock", "lock") else None
        return f"{verb} {lock_text(lock, call)}{more}{_for(ev)}"
    if ev.cause == "child":
        child = ev.children[0]
        if ev.busy:
            builds = [c for c in ev.children if c.build and c.cpu_pct >= BUSY_PCT]
            lead = "compiles" if builds else "works"
            others = len([c for c in ev.children if c.cpu_pct >= BUSY_PCT]) - 1
            tail = f" (+{others} more at work)" if others > 0 else ""
            return f"is busy, not stuck: its child {lead}: {child_text(builds[0] if builds else child)}{tail}"
        return f"waits for its child {child.name} (pid {child.pid}, {child.cpu_pct:.0f} % CPU, {child.state}){_for(ev)}"
    if ev.cause == "socket":
        sock = ev.sockets[0]
        inside = f" in {main.library}" if main and main.library else ""
        via = call or f"`{main.kind}`" if main else "a socket call"
        which = socket_text(sock)
        if ev.sockets_from and ev.sockets_from.startswith("its open sockets") and len(ev.sockets) > 1:
            which = f"one of its sockets (the call does not say which), e.g. {which}"
        return f"waits in {via}{inside} on {which}{_for(ev)}"
    if ev.cause == "native" and main is not None:
        if main.kind == "running":
            return "is running on a CPU (its main thread is not waiting)"
        if main.kind == "stopped":
            return "is stopped (SIGSTOP or a debugger)"
        where = f" at {main.python}" if main.python and main.source == "py-spy" else ""
        return f"waits on {main.words}{where}{_for(ev)}"
    return "waits on something /proc does not show" + (f" ({ev.unread[0]})" if ev.unread else "")


# -- a launch -----------------------------------------------------------------------------------------------


def _labels(labels: list[str]) -> str:
    return ", ".join(labels)


def shared_cause(evidence: Mapping[str, Evidence], idle: Collection[str] | None = None) -> Shared | None:
    """The cause every idle rank shares, or None when they differ (the caller then names each).

    ``evidence``: label -> Evidence for every rank of the launch (a lock holder among them is looked
    up there); ``idle``: the labels judged idle (default: every rank neither busy nor gone; when
    every rank is busy, they share that). All waiting for one holder's lock: an alarm naming the
    file, the holder, whether it belongs to the launch — unless the holder is a rank (or a rank's
    child) that is busy: then busy, not stuck. All on one remote address: an alarm naming it. All
    waiting on their own busy children: busy, never an alarm."""
    alive = {lb: ev for lb, ev in evidence.items() if not ev.gone}
    if idle is not None:
        evs = {lb: ev for lb, ev in alive.items() if lb in idle}
    else:
        evs = {lb: ev for lb, ev in alive.items() if not ev.busy} or alive
    if not evs:
        return None
    keys = {lb: _key(ev) for lb, ev in evs.items()}
    first = next(iter(keys.values()))
    if first is None or any(k != first for k in keys.values()):
        return None
    names, pids = list(evs), [ev.pid for ev in evs.values()]
    who = _labels(names)
    verb = "waits" if len(names) == 1 else "wait"
    waited = min((ev.waited_s for ev in evs.values() if ev.waited_s is not None), default=None)
    for_s = f" for {waited:.0f} s" if waited is not None else ""
    if first[0] == "busy":
        if len(evs) == 1:
            text = f"{who} {next(iter(evs.values())).text}"
        else:
            leads = "; ".join(f"{lb}: {child_text(_busy_child(ev))}" for lb, ev in evs.items())
            text = f"{who} are busy, not stuck: their children work: {leads}"
        return Shared(kind="child", alarm=False, labels=names, pids=pids, text=text, waited_s=waited)
    ev0 = next(iter(evs.values()))
    if first[0] == "lock":
        lock = ev0.locks[0]
        call = ev0.main.syscall if ev0.main and ev0.main.kind in ("flock", "lock") else None
        rank_pid = lock.holder_via or lock.holder_pid  # the rank it is, or descends from
        holder = next((lb for lb, e in evidence.items() if rank_pid and e.pid == rank_pid), None)
        if holder is not None and evidence[holder].busy:
            text = (
                f"{who} {verb} for {lock_text(lock, call).split(' held by ')[0]} held by {holder} "
                f"(pid {lock.holder_pid}), which {evidence[holder].text}"
            )
            return Shared(kind="lock", alarm=False, labels=names, pids=[*pids, lock.holder_pid], text=text,
                          waited_s=waited, holder_pid=lock.holder_pid)  # fmt: skip
        text = f"{who} {verb} for {lock_text(lock, call)}{for_s}"
        if holder is not None:
            text = text.replace(f"held by pid {lock.holder_pid} (", f"held by {holder} (pid {lock.holder_pid}, ", 1)
        extra = [lock.holder_pid] if lock.holder_pid else []
        return Shared(kind="lock", alarm=True, labels=names, pids=[*pids, *extra], text=text, waited_s=waited,
                      holder_pid=lock.holder_pid)  # fmt: skip
    sock = ev0.sockets[0]
    call = f" in `{ev0.main.syscall}`" if ev0.main and ev0.main.syscall else ""
    text = f"{who} {verb}{call} on {socket_text(sock)}{for_s}"
    return Shared(kind="socket", alarm=True, labels=names, pids=pids, text=text, waited_s=waited)


def _busy_child(ev: Evidence) -> Child:
    busy = [c for c in ev.children if c.cpu_pct >= BUSY_PCT]
    return next((c for c in busy if c.build), busy[0])


def _key(ev: Evidence) -> tuple | None:
    if ev.busy:
        return ("busy",)
    if ev.cause == "lock":
        lock = ev.locks[0]
        return ("lock", lock.holder_pid or f"{lock.device}:{lock.inode}")
    if ev.cause == "socket" and ev.sockets[0].remote:
        return ("socket", ev.sockets[0].remote)
    return None
