"""Other processes, read from outside: is this pid still the process a journal names, is it proven
ours (then pinned, to be signalled), is a signal caught there, and how did a child of ours end.
Linux ``/proc``, ``waitid`` and pidfds.

A pid alone names nobody: pids are recycled, a run directory may be old or reused, a journal may
come from another host, and what a journal says (pid, kernel start time, boot id) anyone on the
host can read in ``/proc`` and copy. So a journal's process is *proven* ours (``pin``) only when
it runs on this host and boot, started when the journal says, and holds that very journal file
open: a file of this user that nobody else can write. The proof is made after the process is
pinned by a pidfd, and the signal goes through that pidfd: a pid recycled after the proof cannot
receive it (a stack-dump signal, aimed at the main thread, on a kernel before 6.9: ``tgkill`` just
after the pidfd shows the process runs). Only a proven process is ever signalled or read with py-spy.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import socket
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from . import files


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
    """Whether ``pid`` on this host is the process that recorded ``ticks``/``boot``: is it still
    running, or gone? (A record without a boot id is taken at its start time.) Never a proof that
    it is ours: these values are world-readable (``pin``)."""
    if not pid or host != this_host() or not isinstance(ticks, int) or isinstance(ticks, bool):
        return False
    if boot is not None and boot != boot_id():
        return False
    return start_ticks(pid) == ticks


def holds_open(pid: int, path: Path | str) -> bool:
    """Whether ``pid`` has the file at ``path`` (not followed) open: same device and inode among
    ``/proc/PID/fd`` (readable for our own processes only)."""
    try:
        st = os.lstat(path)
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    want = (st.st_dev, st.st_ino)
    for fd in fds:
        with contextlib.suppress(OSError):
            got = os.stat(f"/proc/{pid}/fd/{fd}")
            if (got.st_dev, got.st_ino) == want:
                return True
    return False


class Pinned:
    """A proven process, held by a pidfd (Linux 5.3+) so that a signal reaches it or nobody: once
    it ends, its pid may name another process, but not the pidfd. ``fd`` None: no pidfd here, and
    signals go by pid (the proof then holds only up to the signal). Closed on ``close``, at the
    end of a ``with`` block, or when dropped."""

    def __init__(self, pid: int, fd: int | None, ticks: int | None = None) -> None:
        self.pid, self.fd, self.ticks = pid, fd, ticks

    def send(self, sig: int) -> bool:
        """Send ``sig``; False when the process is gone."""
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, sig)
            else:
                os.kill(self.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def send_to_main_thread(self, sig: int) -> bool:
        """Send ``sig`` to the main thread alone; False when the process is gone or the signal
        cannot be aimed. A stack dump is written by the thread it describes: faulthandler reading
        other threads' frames while they run Python can crash the process (``recorder.stackdump``).
        Through the pidfd where the kernel aims it (6.9+), else ``tgkill`` once the pidfd says the
        process still runs (the proof then holds up to the call, not through it)."""
        try:
            if self.fd is not None:
                try:
                    signal.pidfd_send_signal(self.fd, sig, None, PIDFD_SIGNAL_THREAD)
                    return True
                except OSError as exc:
                    if exc.errno != errno.EINVAL:  # EINVAL: a kernel without the flag
                        raise
            return self.running() and _tgkill(self.pid, sig)
        except ProcessLookupError:
            return False

    def running(self) -> bool:
        """Not ended since it was pinned (a pidfd is readable once its process has exited)."""
        if self.fd is None:
            return alive(self.pid) and start_ticks(self.pid) == self.ticks
        ready, _, _ = select.select([self.fd], [], [], 0)
        return not ready

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> Pinned:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


PIDFD_SIGNAL_THREAD = 1  # linux/pidfd.h (6.9+): to the pidfd's own thread; a process's pidfd names its main thread


def _tgkill(pid: int, sig: int) -> bool:
    """``tgkill(pid, pid, sig)``: the main thread of ``pid`` (glibc 2.30+); False where libc lacks it."""
    import ctypes

    call = getattr(ctypes.CDLL(None, use_errno=True), "tgkill", None)
    if call is None:
        return False
    if call(pid, pid, sig) == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.ESRCH:
        return False
    raise OSError(err, os.strerror(err))


def _pidfd(pid: int) -> int | None:
    """A pidfd on ``pid``; None where the kernel or Python has none; ``ProcessLookupError`` when gone."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None or not hasattr(signal, "pidfd_send_signal"):
        return None
    try:
        return opener(pid)
    except ProcessLookupError:
        raise
    except OSError:  # ENOSYS (kernel < 5.3), EPERM under a seccomp filter: by pid then
        return None


def why_not_ours(pid: int, host: str, ticks: object, boot: object, journal: Path | str) -> str | None:
    """Why ``pid`` is not proven to be the process that writes ``journal`` (None: it is)."""
    journal = Path(journal)
    if not pid or pid < 0 or host != this_host():
        return "not a process of this host"
    if not isinstance(boot, str) or boot != boot_id():
        return "no boot id of this boot recorded"
    if not same_process(pid, host, ticks, boot) or not alive(pid):
        return "not running now (or another process has its pid)"
    if journal.name != f"{host}-{pid}.jsonl":
        return f"{journal} is not its journal"
    why = files.not_private(journal)
    if why is not None:
        return why
    if not holds_open(pid, journal):
        return f"it does not write {journal}"
    return None


def pin(pid: int, host: str, ticks: object, boot: object, journal: Path | str) -> Pinned | None:
    """``pid`` pinned (``Pinned``) when it is proven the process that writes ``journal``, else
    None. The pidfd is opened first and the proof made after: it then holds for every signal."""
    if not pid or pid < 0 or host != this_host():
        return None
    try:
        fd = _pidfd(pid)
    except ProcessLookupError:
        return None
    target = Pinned(pid, fd, ticks if isinstance(ticks, int) else None)
    if why_not_ours(pid, host, ticks, boot, journal) is not None:
        target.close()
        return None
    return target


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


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies do not count: a zombie leader keeps
    the group's id taken, but nothing of it runs). Read from ``/proc``; nothing is signalled."""
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return False
    want = str(pgid).encode()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[2] == want and fields[0] not in (b"Z", b"X"):
            return True
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
