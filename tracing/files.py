"""Private files in a place that may be shared (``/tmp``): directories 0700, files 0600, links never
followed, nothing created where another user could swap it out from under us.

The journal holds server arguments, exception text and stacks, and the run directory's base may be
a shared directory: every file we create goes through here. Stdlib only (and ``keys`` and
``process_state``, themselves stdlib only), so every part of the package, the CLI included, can use it.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from . import keys, process_state

_DIR_MODE, _FILE_MODE = 0o700, 0o600
_O_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeDirectory(OSError):
    """A directory we refuse to write under; the message names the path and why."""


def _trusted_owner(uid: int) -> bool:
    return uid in (os.geteuid(), 0)  # root can replace anything anyway


def check_base(path: Path) -> None:
    """Refuse an existing base directory another user could tamper with: a symbolic link, not a
    directory, owned by someone else (other than root), or group/world-writable without the sticky
    bit. A missing one is fine: ``private_dir`` creates it 0700."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDirectory(f"{path} is a symbolic link (point at the real directory)")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"{path} is not a directory")
    if not _trusted_owner(st.st_uid):
        raise UnsafeDirectory(f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise UnsafeDirectory(f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}, no sticky bit)")


def home_name() -> str:
    """The private subdirectory this user's runs and history get in a shared base (``home_of``)."""
    return f"phasetrace-{os.geteuid()}"


def home_of(base: Path | str) -> Path:
    """Where runs and the history go under ``base``: ``base`` itself when it is this user's and nobody
    else may write in it (or is not there yet: ``private_dir`` makes it 0700); in a base others may
    write in (``/tmp``: root's, sticky) the private subdirectory ``phasetrace-<uid>``, so nobody else
    can plant a run directory or SQLite's ``-wal``/``-shm`` beside ours (``check_home`` where it is
    made). A link, a file or another user's directory is ``base``: refused where it is made. One ``lstat``."""
    base = Path(base)
    try:
        st = os.lstat(base)
    except OSError:
        return base
    if not stat.S_ISDIR(st.st_mode) or not _trusted_owner(st.st_uid):
        return base
    if st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return base
    return base / home_name()


def check_home(path: Path | str) -> None:
    """Refuse ``path`` as the directory runs or the history go in (``check_base``). Where it is the
    private subdirectory of a shared base (``home_of``), that base is checked as a shared one and
    the subdirectory, once it exists, must be this user's alone: not a link, nobody else may write."""
    path = Path(path)
    if path.name == home_name() and home_of(path.parent) == path:
        check_base(path.parent)
        if os.path.lexists(path) and (why := not_private(path)) is not None:
            raise UnsafeDirectory(why)
    else:
        check_base(path)


def private_dir(path: Path) -> Path:
    """``mkdir -p`` with every missing component created 0700 (whatever the umask); the final
    component must be a real directory (not a link) owned by this user. Returns ``path``."""
    path = Path(path)
    missing = []
    probe = path
    while not os.path.lexists(probe) and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for part in reversed(missing):
        try:
            os.mkdir(part, _DIR_MODE)
        except FileExistsError:  # created meanwhile (another rank): checked below like any other
            continue
        fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, _DIR_MODE)  # exactly 0700, whatever the umask
        finally:
            os.close(fd)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDirectory(f"{path} is a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(20, "Not a directory", str(path))
    if not _trusted_owner(st.st_uid):
        raise UnsafeDirectory(f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})")
    return path


def not_private(path: Path | str) -> str | None:
    """Why ``path`` (its last component not followed) is no proof of anything: a symbolic link,
    owned by another user (other than root), or writable by group or others. None: it is this
    user's alone. A reader decides to signal a process only on what such files say."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path}: cannot be read ({exc.strerror or exc})"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if not _trusted_owner(st.st_uid):
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def writable_by_others(path: Path | str) -> str | None:
    """Why ``path`` (a directory, followed) lets another user plant files in it: writable by group or
    others, sticky or not. None: only its owner can."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"{path}: cannot be read ({exc.strerror or exc})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def open_dir(path: Path) -> int:
    """A descriptor on the private directory ``path`` (``private_dir``: made 0700 if missing, a
    link or another user's refused), opened without following a link swapped in meanwhile: files
    are then made in it with ``create_new``, never through a path that could be redirected."""
    private_dir(path)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not _trusted_owner(st.st_uid):
        os.close(fd)
        raise UnsafeDirectory(f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})")
    return fd


def create_new(dir_fd: int, name: str) -> tuple[int, str]:
    """A new 0600 file in the directory ``dir_fd``: ``name``, or ``stem-2.ext``, ``stem-3.ext``…
    when taken (``O_EXCL|O_NOFOLLOW``: never an existing file, never a planted link). Returns the
    write descriptor and the name used."""
    stem, dot, ext = name.rpartition(".") if "." in name else (name, "", "")
    for n in range(1, 100):
        candidate = name if n == 1 else f"{stem}-{n}{dot}{ext}"
        try:
            return os.open(candidate, _O_NEW, _FILE_MODE, dir_fd=dir_fd), candidate
        except FileExistsError:
            continue
    raise FileExistsError(17, "File exists", name)


def _refuse_foreign(fd: int, path: Path) -> None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or not _trusted_owner(st.st_uid):
        os.close(fd)
        raise UnsafeDirectory(f"{path} is not a regular file of this user")


def open_append(path: Path) -> int:
    """An append-only descriptor on ``path`` (created 0600); a link there is refused (ELOOP), and
    so is an existing file of another user."""
    fd = os.open(path, _O_APPEND, _FILE_MODE)
    _refuse_foreign(fd, path)
    return fd


def write_all(fd: int, data: bytes) -> None:
    """Write ``data`` whole (``os.write`` may write part of it); raises on the first failure."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Gathered:
    """Bytes kept as the pieces they were made of, so that a long text many of them share (a rank
    root's server arguments, 20 KB, in every copy of that span) is written from its one copy rather
    than copied into each: ``pwrite_all`` writes the pieces with ``pwritev``."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: list[bytes]) -> None:
        self.parts, self.size = parts, sum(map(len, parts))

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)


_IOV_MAX = 1024  # pieces one pwritev takes (Linux's IOV_MAX)


def pwrite_all(fd: int, data: bytes | Gathered, offset: int) -> None:
    """``write_all`` at ``offset`` (the file position is not used, nor moved)."""
    if isinstance(data, Gathered):
        parts = data.parts
        for at in range(0, len(parts), _IOV_MAX):
            batch = parts[at : at + _IOV_MAX]
            want = sum(map(len, batch))
            done = os.pwritev(fd, batch, offset)
            if done < want:  # written in part (a signal, a quota): the rest as one piece
                pwrite_all(fd, b"".join(batch)[done:], offset + done)
            offset += want
        return
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


def say_once(path: Path, exc: OSError, consequence: str) -> None:
    """``cannot write PATH: [Errno N] reason; consequence``, once per process and reason: a full
    disk fails the journal, the status file and the history alike, and that is one problem.

    One problem of a launch's run directory is one line for the launch, said by its launcher: a
    process a traced launcher started leaves it unsaid there (``launcher_speaks``), since the
    launcher meets it too (its status file, replaced every beat, needs a fresh block of the same
    filesystem) and says it for all of them. What each process could not write is in its status
    file (``journal_unwritten``), which ``phasetrace status`` shows."""
    run_dir = os.environ.get(keys.ENV_RUN_DIR) or ""
    ours = bool(run_dir) and os.path.abspath(path).startswith(os.path.join(os.path.abspath(run_dir), ""))
    if (ours and launcher_speaks()) or not process_state.say_once(("files", exc.errno)):
        return
    if ours and os.environ.get(keys.ENV_LAUNCHER) == str(os.getpid()):
        consequence = (  # not this file's alone: the launch's
            "every process of this launch meets it (said here once for all): each holds the journal records "
            f"that do not fit in memory and writes them once it can; `phasetrace status {run_dir}` says what is missing"
        )
    logging.getLogger("sglang_phasetrace").warning(
        "sglang-phasetrace: cannot write %s: [Errno %s] %s; %s", path, exc.errno, exc.strerror, consequence
    )


def launcher_speaks() -> bool:
    """This process was started by a traced launcher that is still alive (``keys.ENV_LAUNCHER``):
    that launcher says the problems of their run directory once for the launch. One ``kill(pid, 0)``."""
    launcher = os.environ.get(keys.ENV_LAUNCHER, "")
    if not launcher.isdigit() or int(launcher) == os.getpid():
        return False
    try:
        os.kill(int(launcher), 0)
    except PermissionError:
        return True
    except (OSError, OverflowError):
        return False
    return True


def rewrite(path: Path, data: bytes) -> None:
    """Rewrite the existing file ``path`` in place (never through a link): its blocks reused, none
    new needed, where ``write_atomic`` cannot make a file beside it (a full disk). A reader may
    catch it half-written, once: for the status file, better than one frozen since the disk filled."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (``write_new``)."""
    write_new(path, lambda fd: write_all(fd, data))


def write_new(path: Path, write: Callable[[int], None], swap: bool = True) -> None:
    """Replace ``path`` with what ``write(fd)`` writes: into a fresh 0600 temp file of random name
    beside it (``O_EXCL|O_NOFOLLOW``: never a planted link), then ``os.replace``. The temp is
    removed on failure; a link at ``path`` itself is replaced, never followed. ``swap=False``: the
    old file is removed just before the rename (a reader may find none for that instant), since
    ext4 writes a file renamed over another out at once: +0.2-0.3 s for a 250 MB export."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, _O_NEW, _FILE_MODE)
    try:
        try:
            write(fd)
        finally:
            os.close(fd)
        if not swap:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
