"""File locks a process waits for, from ``/proc/locks`` (world-readable: every lock on the host and the
processes the kernel lists as blocked on it), read once per pass (``read_locks``) for every rank.
A lock taken with ``LOCK_NB`` in a retry loop leaves no waiter line: a sleeping rank that holds a
locked file open and no lock on it is said to poll for it. The holder: its command line, how long
it has run, whether it still has the file open, and whether it (or an ancestor) is of the launch."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

from ...redact import printable
from .proc import Proc, age_s, cmdline, launch_ancestor, stat_fields
from .values import FileLock, MainWait

MAX_POLL_SCAN = 256  # files of a sleeping rank checked against the locks others hold (~20 µs each)
_NOT_LOCKS = ("/dev/", "/proc/", "/sys/", "/memfd:")

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


def waited_for(
    proc: Proc, main: MainWait, table: list[LockLine] | None, launch: Collection[int] | None
) -> list[FileLock]:
    """The locks ``proc`` waits for: the one its blocked call names, those the kernel lists it
    waiting for, else (asleep) those it polls for."""
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


def _path_of(proc: Proc, lock: LockLine) -> str | None:
    """The locked file's path, from a descriptor of the waiter (it has the file open), else of the holder."""
    for who in (proc, Proc(lock.pid) if lock.pid > 0 else None):
        path = who.has_inode(lock.device, lock.inode) if who is not None else None
        if path is not None:
            return path
    return None


def _describe_lock(
    h: LockLine, how: str, path: str | None, holder: int | None, waiters: list[int], launch: Collection[int] | None
) -> FileLock:
    alive = has_open = in_launch = via = cmd = age = None
    if holder is not None:
        fields = stat_fields(holder)
        alive = fields is not None and fields[0] not in ("Z", "X")
        if alive:
            cmd, age = cmdline(holder), age_s(holder)
            has_open = _holds_inode(holder, h)
        if launch:
            via = launch_ancestor(holder, launch)
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
    who = Proc(pid)
    if not who.fds() and who.unread:
        return None
    return who.has_inode(lock.device, lock.inode) is not None
