"""``/proc/PID`` of one process, read without touching it: each file at most once per read, every
failure noted in words (``Proc.unread``), never raised. Descriptors are links read, never followed;
``fdinfo`` gives an inode without a file system call, so a hung NFS mount cannot block the reader."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection
from dataclasses import dataclass, field

from ...redact import printable
from .values import MAX_CMD

MAX_FDS = 1024  # descriptors looked at per process (a rank has a few hundred)
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class Proc:
    pid: int
    unread: list[str] = field(default_factory=list)
    _fds: list[tuple[int, str]] | None = None
    _mounts: dict[int, str] | None = None

    def text(self, name: str, what: str | None = None, limit: int = 1 << 20) -> str | None:
        """``/proc/PID/name`` (at most ``limit`` bytes); None, and ``what`` noted, when unreadable."""
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
        """``(device, inode)`` of what ``fd`` refers to, from ``fdinfo``; device None when
        ``mountinfo`` does not say."""
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

    def has_inode(self, device: str, inode: int) -> str | None:
        """The path of one of its descriptors open on ``device:inode``, else None."""
        for fd, link in self.fds():
            if link.startswith("/"):
                got = self.fd_inode(fd)
                if got and got[1] == inode and (got[0] is None or got[0] == device):
                    return link
        return None


def stat_fields(pid: int | str) -> list[str] | None:
    """``/proc/PID/stat`` after the command name: [0] state, [1] ppid, [19] start time (ticks)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].decode().split()
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    fields = stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def zombie(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and bool(fields) and fields[0] in ("Z", "X")


def cmdline(pid: int) -> str | None:
    """Its command line, redacted and cut to ``MAX_CMD``; a kernel thread's ``[name]``."""
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


def age_s(pid: int) -> float | None:
    ticks, up = start_ticks(pid), _uptime_s()
    return None if ticks is None or up is None else max(0.0, up - ticks / TICK)


def launch_ancestor(pid: int, launch: Collection[int]) -> int | None:
    """The first of ``pid`` and its ancestors that belongs to the launch (a rank's compiler child does)."""
    seen = 0
    while pid > 1 and seen < 64:
        if pid in launch:
            return pid
        fields = stat_fields(pid)
        try:
            pid = int(fields[1]) if fields else 0
        except (IndexError, ValueError):
            return None
        seen += 1
    return None
