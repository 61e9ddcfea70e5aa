"""The local journal: one append-only JSON-lines file per process, written as things happen.

Each record is one ``os.write`` of one line on an ``O_APPEND`` descriptor: no user-space buffer,
so whatever was written survives ``kill -9``. The write is made by the writer's thread while the
caller waits for it, bounded (``JournalWriter``): a disk that stops answering never holds SGLang.
A phase that never ends leaves its ``begin`` record and no ``end`` record; readers treat that as
"still running, or died there".

The record schema (kinds, fields, types) is ``tracing.journal.records``: its constructors build records,
and the reader here (``JournalTail``) skips and names, as ``file:line: why``, any line it refuses.
"""

from __future__ import annotations

import _thread
import errno
import json
import logging
import os
import threading
import time
import weakref
from collections import deque

try:  # several times faster on large runs; SGLang installs it anyway
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    _loads = json.loads
from pathlib import Path
from typing import Any

from .. import files, keys, process_state
from .records import warning

log = logging.getLogger("sglang_phasetrace")


def _default(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)


def dumps(record: dict) -> str:
    return json.dumps(record, separators=(",", ":"), default=_default, ensure_ascii=False)


def _line(record: dict) -> bytes:
    return (dumps(record) + "\n").encode("utf-8", "replace")


WRITE_WAIT_S = 1.0  # how long a journal write may hold its caller (keys.ENV_WRITE_WAIT)
# Bytes of one record's line, its newline included: what readers take (``reader.LINE_MAX``). The
# largest a 1024-rank launch writes is its root-cause diagnosis (≤ ~100 KB with its ``waiting`` kept
# to ``watchdog.WAITING_BYTES``: 4.2 MB before, 1023 peers waiting in a world barrier whose group
# name lists 1024 ranks); a begin with server arguments ~20 KB, an exception ~22 KB (16 KiB
# characters of message and of stack at most). A record past it is not written, said once.
RECORD_MAX = 1 << 20
HELD_BYTES = 32 << 20  # records held back (a disk that does not answer) keep at most this much memory


def write_wait_s() -> float:
    """``SGLANG_PHASETRACE_WRITE_WAIT_S``: seconds a caller waits for its journal record to be
    written; anything but a positive number gives the default ``WRITE_WAIT_S``."""
    try:
        value = float(os.environ.get(keys.ENV_WRITE_WAIT) or WRITE_WAIT_S)
    except ValueError:
        return WRITE_WAIT_S
    return value if 0 < value < float("inf") else WRITE_WAIT_S


class _Entry:
    """One record on its way: its line, and the lock its writer waits on (None: nobody waits)."""

    __slots__ = ("data", "done", "ok")

    def __init__(self, data: bytes, wait: bool) -> None:
        self.data = data
        self.done: _thread.LockType | None = None
        self.ok: bool | None = None  # set once tried: written or not
        if wait:
            self.done = _thread.allocate_lock()
            self.done.acquire()


class JournalWriter:
    """Appends records to one file (created 0600, never through a link); thread-safe, fork-safe.

    Every write to the file is made by the writer's own thread, and no lock a caller takes is held
    across it. ``write`` hands its record over and waits until it is written, up to ``wait_s``: with
    a disk that answers, the record is on disk before the caller goes on (a phase's ``begin``
    survives the ``kill -9`` or the hang that follows it, as with a direct write). A write that has
    not returned by then (a hard-mounted NFS server that stopped answering) is taken as stuck: said
    once, naming the file; from then on callers do not wait at all, and records queue behind the
    stuck one until it returns. So a stuck disk costs a caller ``wait_s`` once, and exit no more
    (``hurry``). ``write`` never raises.

    A record is written whole or not at all: a write cut short (a full disk) is cut back off the
    file, so the next record starts on a fresh line. Records that cannot be written (a full disk,
    a stuck one) are held back (up to ``HELD``, the oldest dropped beyond) and written in order
    when writing works again, followed by a ``warning`` record saying when writing failed and how
    many were dropped: a disk full for a while does not lose a rank root's ``end`` (readers would
    call a healthy rank gone). A full disk is retried at the next ``write`` or ``flush``. The first
    failure of each kind is said once per process, naming the file and the reason.
    """

    HELD = 4096  # records held back at most (and ``HELD_BYTES``)

    def __init__(self, path: Path, wait_s: float | None = None) -> None:
        files.private_dir(path.parent)
        self.path = path
        self.wait_s = write_wait_s() if wait_s is None else wait_s
        self._fd = files.open_append(path)
        self._end = os.fstat(self._fd).st_size  # end of the last whole record; -1: unknown (forked)
        self._torn = False  # a cut record could not be removed: the next write starts a new line
        self._reset()
        _WRITERS.add(self)

    def _reset(self) -> None:
        """What callers share with the writer thread, made anew in a forked child: that thread is
        gone there, a lock may be held by a thread that does not exist, and what the parent had
        queued is the parent's to write."""
        self._lock = threading.RLock()  # held briefly, never across a write; RLock: signal handlers
        self._go = _thread.allocate_lock()  # released: the writer thread has something to do
        self._go.acquire()
        self._queue: deque[_Entry] = deque()  # records not written yet, in order
        self._bytes = 0  # ... and their size
        self._late = 0  # how many at the front of the queue were held back (written before the note)
        self._poked = self._busy = self._stuck = self._closing = False
        self._in_hand = 0  # records the writer thread is writing now
        self._thread: threading.Thread | None = None
        self._until: float | None = None  # hurry(): no caller waits past this (time.monotonic)
        self._dropped = 0
        self._failed_since: int | None = None  # time of the first failure not yet recovered from
        self.error: OSError | None = None  # the latest failure, for the status file
        self._warned = False

    def _forked(self) -> None:
        self._end = -1  # whatever the parent's writer was doing: the writer thread looks again
        self._reset()

    def write_or_raise(self, record: dict) -> None:
        """Write one record now, on this thread, or raise ``OSError``: the first record (no journal
        without it), written before any ``write`` hands one to the writer thread."""
        with self._lock:
            if self._busy or self._queue:
                raise OSError(errno.EBUSY, "journal writes in progress", str(self.path))
            self._append(_line(record))

    def write(self, record: dict) -> bool:
        """Append ``record``; False when it is not written (yet): held back, dropped, or waited for
        ``wait_s`` in vain (each problem said once per process)."""
        try:
            data = _line(record)
        except (TypeError, ValueError, RecursionError) as exc:
            self._say(f"journal record of kind {record.get('kind')!r} not written: {exc!r}")
            return False
        if len(data) > RECORD_MAX:
            self._too_big(record, len(data))
            return False
        # A signal handler that writes while its thread is in here waits for nothing: the writer
        # thread needs the lock that thread holds.
        nested = self._lock._is_owned()  # type: ignore[attr-defined]
        with self._lock:
            if self._fd < 0 or self._closing:
                return False
            entry = self._put(data, wait=not (self._stuck or nested))
            if self._stuck or not self._poke():
                return False
        return entry.done is not None and self._wait(entry) and bool(entry.ok)

    def flush(self) -> bool:
        """Have what was held back written, then the note of the gap, waiting up to ``wait_s``
        (not at all while writes are stuck); True once nothing is left to write."""
        with self._lock:
            if self._failed_since is None and not self._queue:
                return True
            if self._fd < 0 or self._closing or self._stuck:
                return False
            marker = _Entry(b"", wait=True)  # written (nothing) after what is queued, and the note
            self._queue.append(marker)
            if not self._poke():
                return False
        self._wait(marker)
        with self._lock:
            return self._failed_since is None and not self._queue

    def hurry(self, within_s: float | None = None) -> None:
        """From now on no caller waits past ``within_s`` (default: ``wait_s``) from now, however
        many records it writes: the bound of the exit path (``lifecycle``)."""
        with self._lock:
            self._until = time.monotonic() + (self.wait_s if within_s is None else within_s)

    def _put(self, data: bytes, wait: bool) -> _Entry:
        """Queue ``data`` (lock held). Beyond ``HELD`` the oldest is dropped."""
        entry = _Entry(data, wait)
        self._queue.append(entry)
        self._bytes += len(data)
        if self._stuck:
            self._late += 1
        self._trim()
        return entry

    def _trim(self) -> None:
        """Beyond ``HELD`` records or ``HELD_BYTES`` held, the oldest are dropped (and counted)."""
        while len(self._queue) > self.HELD or (self._bytes > HELD_BYTES and len(self._queue) > 1):
            self._bytes -= len(self._queue.popleft().data)
            self._dropped += 1
            self._late = max(0, self._late - 1)

    def _too_big(self, record: dict, size: int) -> None:
        """A record over ``RECORD_MAX``: not written (readers would refuse its line), said once."""
        if process_state.say_once(("journal", "record over RECORD_MAX")):
            log.warning(
                "sglang-phasetrace: a %s record of %d bytes not written to %s: over the %d MiB a reader takes",
                record.get("kind"),
                size,
                self.path,
                RECORD_MAX >> 20,
            )

    def _poke(self) -> bool:
        """Wake the writer thread (lock held; started on first use: never in a process that
        writes nothing); False when it cannot be started (interpreter shutdown)."""
        self._poked = True
        if self._thread is None:
            thread = threading.Thread(target=self._run, name="phasetrace-journal", daemon=True)
            try:
                thread.start()
            except RuntimeError:
                return False
            self._thread = thread
        if self._go.locked():
            self._go.release()
        return True

    def _wait(self, entry: _Entry) -> bool:
        """Wait until ``entry`` was tried, up to ``wait_s`` (and ``hurry``'s bound); False when the
        writer thread did not come back by then: writes are stuck (said once). Past ``hurry``'s
        bound already, no wait and nothing said: the record may yet be written before exit."""
        left = self.wait_s
        if self._until is not None:
            left = min(left, self._until - time.monotonic())
        if left > 0 and entry.done.acquire(True, left):
            return True
        with self._lock:
            if entry.ok is not None:  # tried just now
                return True
            if left > 0 and not self._stuck and (self._busy or self._poked):
                self._stuck = True
                self._late = len(self._queue)
                self._failed(
                    OSError(errno.ETIMEDOUT, f"no answer within {self.wait_s:g} s"),
                    f"records are queued (up to {self.HELD}) and written once it answers; nothing waits for it",
                )
        return False

    def _run(self) -> None:
        """The writer thread: takes what is queued, writes it outside the lock, says how it went."""
        while True:
            self._go.acquire()
            with self._lock:
                if self._closing:
                    self._close_fd()
                    return
                self._poked = False
                batch, late = list(self._queue), self._late
                self._queue.clear()
                self._bytes = 0
                self._late = 0
                note = _line(self._gap_note()) if self._failed_since is not None else None
                if not batch and note is None:
                    continue
                self._busy, self._in_hand = True, len(batch)
            written, noted, exc = self._write_batch([e.data for e in batch], late, note)
            with self._lock:
                self._busy = self._stuck = False
                self._in_hand = 0
                self._settle(batch, written, noted, exc)

    def _write_batch(self, batch: list[bytes], late: int, note: bytes | None) -> tuple[int, bool, OSError | None]:
        """The held-back records, the note of the gap, the rest (each part one write): how many of
        ``batch`` were written, whether the note was, and the error that stopped it."""
        written, noted = 0, False
        try:
            if self._end < 0:
                self._end = os.fstat(self._fd).st_size
            if note is not None:
                if late:
                    self._append(b"".join(batch[:late]))
                    written = late
                self._append(note)
                noted = True
            if written < len(batch):
                self._append(b"".join(batch[written:]))
                written = len(batch)
        except Exception as exc:  # never the end of the writer thread
            return written, noted, exc if isinstance(exc, OSError) else OSError(errno.EIO, repr(exc))
        return written, noted, None

    def _settle(self, batch: list[_Entry], written: int, noted: bool, exc: OSError | None) -> None:
        """After an attempt (lock held): keep back what was not written, tell the waiting callers."""
        if noted:
            self._failed_since, self._dropped, self.error = None, 0, None
        if exc is not None:
            kept = [e for e in batch[written:] if e.data]
            self._queue.extendleft(reversed(kept))
            self._bytes += sum(len(e.data) for e in kept)
            self._late = len(self._queue)  # all held back now; the next write or flush tries again
            self._trim()
            self._failed(exc, f"records are held back (up to {self.HELD}) and written once it can be")
        elif self._queue or self._failed_since is not None:
            self._poke()  # what came meanwhile (behind a stuck write), or the note still owed
        for i, entry in enumerate(batch):
            if entry.ok is None:  # its first try: whoever waits for it is told (one held back, once)
                entry.ok = i < written
                if entry.done is not None:
                    entry.done.release()

    def _gap_note(self) -> dict:
        now = time.time_ns()
        since = time.strftime("%H:%M:%S", time.localtime(self._failed_since / 1e9))
        failed_s = (now - self._failed_since) / 1e9
        return warning(
            now,
            f"journal writes failed for {failed_s:.1f} s from {since} ({_reason(self.error)}); "
            f"the records before this one were written late, {self._dropped} dropped",
        )

    def _append(self, data: bytes) -> None:
        if self._torn:
            data = b"\n" + data
        try:
            files.write_all(self._fd, data)
        except Exception:
            try:
                os.ftruncate(self._fd, self._end)  # whole or not at all
                self._torn = False
            except OSError:
                self._torn = True
            raise
        if self._torn:
            self._torn = False
            self._end = os.fstat(self._fd).st_size
        else:
            self._end += len(data)

    def _failed(self, exc: OSError, consequence: str) -> None:
        self.error = exc
        if self._failed_since is None:
            self._failed_since = time.time_ns()
        files.say_once(self.path, exc, consequence)

    def _say(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("sglang-phasetrace: %s", message)

    def trouble(self) -> dict | None:
        """What is not written yet, for the status file: None when all is well."""
        with self._lock:
            if self._failed_since is None:
                return None
            return {
                "error": _reason(self.error),
                "since": self._failed_since,
                "held": len(self._queue) + self._in_hand,
                "dropped": self._dropped,
            }

    def close(self) -> None:
        """Stop the writer thread and close the file; what is not written by then is dropped. A
        write in progress (even a stuck one) keeps the descriptor until it returns: its number is
        never reused under it."""
        with self._lock:
            if self._fd < 0 or self._closing:
                return
            self._closing = True
            if self._thread is not None:
                self._poke()
            if not self._busy:
                self._close_fd()

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


_WRITERS: weakref.WeakSet[JournalWriter] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for writer in list(_WRITERS):
        writer._forked()


# As ``logging`` does for its handlers' locks: writers are objects a child may still hold (a CLI's).
os.register_at_fork(after_in_child=_after_fork_in_child)


def _reason(exc: BaseException | None) -> str:
    """``[Errno 28] No space left on device``: the reason, without the path said beside it."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"[Errno {exc.errno}] {exc.strerror}"
    return str(exc)
