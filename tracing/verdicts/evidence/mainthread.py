"""Where a process's main thread waits, from ``/proc``: its state letter, its system call and the
descriptor it names (``/proc/PID/syscall``: ptrace *attach* access — the same user under Yama
``ptrace_scope`` 0, or an ancestor such as the launcher under scope 1), else the kernel function it
sleeps in (``wchan``: ptrace *read* access), refined by py-spy's native frame where one was taken."""

from __future__ import annotations

import os

from ...redact import printable
from .native import LIB_KIND, Native
from .proc import Proc
from .values import KINDS, MainWait

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


def main_wait(proc: Proc, native: Native | None) -> MainWait:
    """Its main thread: state, system call and descriptor (ptrace attach access), kernel wait channel,
    and what py-spy saw when ``native`` is given (the finer name of the same wait)."""
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
        if native.kind != "unknown" and (kind in _SLEEPISH or kind == native.kind or native.kind in LIB_KIND.values()):
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
