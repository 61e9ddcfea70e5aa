"""Other processes, read from outside: is this pid still the process a journal names, is a signal
caught there, and how did a child of ours end. Linux ``/proc`` and ``waitid``; nothing is changed.

A pid alone names nobody: pids are recycled, a run directory may be old or reused, and a journal
may come from another host. A process is *proven* ours when it runs on this host (and boot) and
its kernel start time equals the one its journal recorded. Only such a process is ever signalled.
"""

from __future__ import annotations

import os
import signal
import socket
from dataclasses import dataclass
from functools import cache


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rpartition(b")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


@cache
def boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


@cache
def this_host() -> str:
    return socket.gethostname()


def fingerprint(pid: int | None = None) -> dict[str, object]:
    """What the journal records of a process so it can be recognised later: ``start_ticks``, ``boot_id``."""
    pid = os.getpid() if pid is None else pid
    return {"start_ticks": start_ticks(pid), "boot_id": boot_id()}


def same_process(pid: int, host: str, ticks: object, boot: object) -> bool:
    """True only when ``pid`` on this host is the very process that recorded ``ticks``/``boot``."""
    if not pid or host != this_host() or not isinstance(ticks, int):
        return False
    if boot is not None and boot != boot_id():
        return False
    return start_ticks(pid) == ticks


def catches(pid: int, sig: int) -> bool:
    """Whether ``pid`` has a handler for ``sig`` now (``SigCgt``): sending it cannot kill the process."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


@dataclass(frozen=True)
class Ended:
    """How a process ended: ``code`` (exit status) or ``signal`` (the one that killed it)."""

    pid: int
    code: int | None = None
    signal: int | None = None
    core: bool = False

    @property
    def signal_name(self) -> str | None:
        if self.signal is None:
            return None
        try:
            return signal.Signals(self.signal).name
        except ValueError:
            return f"signal {self.signal}"

    def describe(self) -> str:
        if self.signal is not None:
            text = f"killed by {self.signal_name}"
            if self.signal == signal.SIGKILL:
                text += " (likely the OOM killer)"
            return text + (" (core dumped)" if self.core else "")
        return f"exited with code {self.code}"


def child_ended(pid: int) -> Ended | None:
    """How child ``pid`` ended, without reaping it (``WNOWAIT``: its owner still collects it as
    before); None while it runs or when it is not our child."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (ChildProcessError, OSError, AttributeError):
        return None
    if info is None or info.si_pid == 0:
        return None
    if info.si_code == os.CLD_EXITED:
        return Ended(pid, code=info.si_status)
    return Ended(pid, signal=info.si_status, core=info.si_code == os.CLD_DUMPED)


def alive(pid: int) -> bool:
    """The pid exists and is not a zombie (a dead child its parent has not collected yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def memory_note(rss: object) -> str:
    """``last RSS 3.1 GiB; host has 0.4 GiB available``, from what is readable."""
    parts = []
    if isinstance(rss, int) and rss > 0:
        parts.append(f"last RSS {rss / 2**30:.1f} GiB")
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    parts.append(f"host has {int(line.split()[1]) / 2**20:.1f} GiB available")
                    break
    except (OSError, ValueError):
        pass
    return "; ".join(parts)
