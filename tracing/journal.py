"""The local journal: one append-only JSON-lines file per process, written as things happen.

Each record is one ``os.write`` of one line on an ``O_APPEND`` descriptor: no user-space buffer,
so whatever was written survives ``kill -9``. A phase that never ends leaves its ``begin`` record
and no ``end`` record; readers treat that as "still running, or died there".

The record schema (kinds, fields, types) is ``tracing.records``: its constructors build records,
and the reader here (``JournalTail``) skips and names, as ``file:line: why``, any line it refuses.
"""

from __future__ import annotations

import errno
import json
import logging
import operator
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Sequence
from itertools import compress

import msgspec

try:  # several times faster on large runs; SGLang installs it anyway
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    _loads = json.loads
from pathlib import Path
from typing import Any

from . import files
from .records import BULK, BULK_PREFIX, KINDS, all_valid, bulk_valid, validate, warning

log = logging.getLogger("sglang_phasetrace")


def _default(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)


def dumps(record: dict) -> str:
    return json.dumps(record, separators=(",", ":"), default=_default, ensure_ascii=False)


def _line(record: dict) -> bytes:
    return (dumps(record) + "\n").encode("utf-8", "replace")


class JournalWriter:
    """Appends records to one file (created 0600, never through a link); thread-safe.

    ``write`` never raises. A record is written whole or not at all: a write cut short (a full
    disk) is cut back off the file, so the next record starts on a fresh line. Records that cannot
    be written are held back (up to ``HELD``) and written in order before the next one that can,
    followed by a ``warning`` record saying when writing failed and what was dropped: a disk full
    for a while does not lose a rank root's ``end`` (readers would call a healthy rank gone). The
    first failure is said once per process, naming the file and the reason.
    """

    HELD = 4096

    def __init__(self, path: Path) -> None:
        files.private_dir(path.parent)
        self.path = path
        self._fd = files.open_append(path)
        self._end = os.fstat(self._fd).st_size  # end of the last whole record
        self._torn = False  # a cut record could not be removed: the next write starts a new line
        self._lock = threading.RLock()  # a signal handler may write while the main thread does
        self._held: deque[bytes] = deque()
        self._dropped = 0
        self._failed_since: int | None = None  # time of the first failure not yet recovered from
        self.error: OSError | None = None  # the latest failure, for the status file
        self._warned = False

    def write_or_raise(self, record: dict) -> None:
        """Write one record now or raise ``OSError`` (the first record: no journal without it)."""
        with self._lock:
            self._append(_line(record))

    def write(self, record: dict) -> bool:
        """Append ``record``; False when it was held back or dropped (said once per process)."""
        try:
            data = _line(record)
        except (TypeError, ValueError, RecursionError) as exc:
            self._say(f"journal record of kind {record.get('kind')!r} not written: {exc!r}")
            return False
        with self._lock:
            if self._fd < 0:
                return False
            if self._failed_since is None or self.flush():
                try:
                    self._append(data)
                    return True
                except OSError as exc:
                    self._failed(exc)
            self._held.append(data)
            if len(self._held) > self.HELD:
                self._held.popleft()
                self._dropped += 1
            return False

    def flush(self) -> bool:
        """Write what was held back, then the note of the gap; True once nothing is left to write."""
        with self._lock:
            if self._failed_since is None:
                return True
            if self._fd < 0:
                return False
            try:
                while self._held:
                    self._append(self._held[0])
                    self._held.popleft()
                self._append(_line(self._gap_note()))
            except OSError as exc:
                self._failed(exc)
                return False
            self._failed_since, self._dropped, self.error = None, 0, None
            return True

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
        except OSError:
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

    def _failed(self, exc: OSError) -> None:
        self.error = exc
        if self._failed_since is None:
            self._failed_since = time.time_ns()
        files.say_once(self.path, exc, f"records are held back (up to {self.HELD}) and written once it can be")

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
                "held": len(self._held),
                "dropped": self._dropped,
            }

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def _reason(exc: BaseException | None) -> str:
    """``[Errno 28] No space left on device``: the reason, without the path said beside it."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"[Errno {exc.errno}] {exc.strerror}"
    return str(exc)


class JournalTail:
    """Reads one journal incrementally (the watchdog polls it) or whole (the CLI).

    A last line without its newline is a write in progress, or one cut by ``kill -9``: a live read
    leaves it for next time; a ``final`` read parses it, and reports it if it is broken.
    Every unusable line (not JSON, or a record ``records.validate`` refuses) is reported once, as
    ``file:line: why``, and skipped; the rest of its chunk is used.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.lines = 0
        self.problems: list[str] = []
        self.unknown_kinds: set[str] = set()
        self._unreadable: str | None = None  # the reason said for a file that cannot be read
        self._chunk: tuple[list[bytes], Sequence[int], list[int] | None] = ([], (), None)  # for line_of()

    def read(self, final: bool = False) -> list[dict]:
        """The records appended since the last read, as dicts."""
        lines, numbers = self._next_lines(final)
        return self._records(lines, numbers) if lines else []

    def read_bulk(self, final: bool = False) -> tuple[dict[str, list[Any]], list[dict]]:
        """``read`` for a reader that keeps every span (``rundir``): the lines of the bulk kinds
        (``records.BULK``: nearly all of a journal) decoded straight into objects, per kind in file
        order, and the other records as ``read`` gives them. A chunk with a line the fast path
        refuses goes ``read``'s way whole, so each bad line is named as usual."""
        lines, numbers = self._next_lines(final)
        if not lines:
            return {}, []
        heads = list(map(_HEAD, lines))
        bulk: dict[str, list[Any]] = {}
        try:
            for prefix, (kind, decoder) in BULK.items():
                mine = list(compress(lines, map(prefix.__eq__, heads)))
                if mine:
                    items = decoder.decode(b"[" + b",".join(mine) + b"]")
                    if not bulk_valid(kind, items):
                        raise ValueError(kind)
                    bulk[kind] = items
        except (msgspec.DecodeError, ValueError):  # ValidationError is a DecodeError
            return {}, self._records(lines, numbers)
        if not bulk:
            return {}, self._records(lines, numbers)
        rest = list(map(operator.not_, map(BULK.__contains__, heads)))
        return bulk, self._records(list(compress(lines, rest)), list(compress(numbers, rest)))

    def _next_lines(self, final: bool) -> tuple[list[bytes], range]:
        """The whole lines appended since the last read (and a last one without its newline when
        ``final``), with their line numbers in the file."""
        data = self._read_more()
        if not data:
            return [], range(0)
        end = len(data) if final else data.rfind(b"\n") + 1
        lines = data[:end].split(b"\n")
        if lines[-1] == b"":
            lines.pop()
        self.offset += end
        self.lines += len(lines)
        return lines, range(self.lines - len(lines) + 1, self.lines + 1)

    def _records(self, lines: list[bytes], numbers: Sequence[int]) -> list[dict]:
        """``lines`` (line ``numbers[i]`` of the file each) as valid records; the rest reported."""
        if not lines:
            self._chunk = ([], (), None)
            return []
        records = _parse_chunk(lines)  # fast path: one parse for the whole chunk
        if records is None:  # some line is not JSON: line by line, naming each bad one
            numbered = [
                (n, r)
                for n, raw in zip(numbers, lines, strict=True)
                if (r := parse_line(raw, self.path, n, self.problems, self.unknown_kinds)) is not None
            ]
            self._chunk = (lines, numbers, [n for n, _ in numbered])
            return [r for _, r in numbered]
        self._chunk = (lines, numbers, None)
        if all_valid(records):  # the fast path's check: one column at a time
            return records
        bad = [(i, why) for i, r in enumerate(records) if (why := validate(r)) is not None]
        kept = _numbers(lines, numbers)
        for i, why in bad:
            self._report(kept[i], records[i], why)
        drop = {i for i, _ in bad}
        self._chunk = (lines, numbers, [n for i, n in enumerate(kept) if i not in drop])
        return [r for i, r in enumerate(records) if i not in drop]

    def line_of(self, index: int) -> int:
        """The line number of record ``index`` of the last ``read``'s records (dicts)."""
        lines, numbers, kept = self._chunk
        return (kept if kept is not None else _numbers(lines, numbers))[index]

    def _read_more(self) -> bytes:
        try:
            return read_regular(self.path, self.offset)
        except FileNotFoundError:
            return b""
        except OSError as exc:
            why = f"cannot read ({exc.strerror or exc})"
            if why != self._unreadable:
                self._unreadable = why
                self.problems.append(f"{self.path}: {why}")
            return b""

    def _report(self, lineno: int, record: Any, why: str) -> None:
        _report(self.path, lineno, record, why, self.problems, self.unknown_kinds)


_HEAD = operator.itemgetter(slice(BULK_PREFIX))


def read_regular(path: Path, offset: int = 0, limit: int = -1) -> bytes:
    """The bytes of a regular file from ``offset`` (``limit`` at most): never through a symbolic
    link, never blocking on a FIFO or reading a device (``OSError`` naming why instead)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        with os.fdopen(fd, "rb", closefd=False) as f:
            f.seek(offset)
            return f.read(limit)
    finally:
        os.close(fd)


def _numbers(lines: list[bytes], numbers: Sequence[int]) -> list[int]:
    """Line numbers of the non-blank lines (the records of a chunk parsed at once)."""
    return [n for n, line in zip(numbers, lines, strict=True) if line.strip()]


def _parse_chunk(lines: list[bytes]) -> list | None:
    """Every line JSON: their values, one ``orjson`` parse for all; else None (go line by line)."""
    try:  # a blank line makes ",," (not JSON): that chunk goes line by line, which skips it
        return _loads(b"[" + b",".join(lines) + b"]")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None


def read_journal(path: Path) -> tuple[list[dict], list[str]]:
    """All records of a finished (or abandoned) journal, and its problems as ``file:line: why``."""
    tail = JournalTail(path)
    return tail.read(final=True), tail.problems


def parse_line(
    raw: bytes, path: Path, lineno: int, problems: list[str], unknown: set[str] | None = None
) -> dict | None:
    """One line as a valid record, or None (blank; else reported in ``problems`` as ``file:line: why``)."""
    if not raw.strip():
        return None
    try:
        record = _loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:  # orjson's error subclasses it
        problems.append(f"{path}:{lineno}: not a JSON record ({exc.__class__.__name__}: {exc})")
        return None
    why = validate(record)
    if why is not None:
        _report(path, lineno, record, why, problems, unknown)
        return None
    return record


def _report(path: Path, lineno: int, record: Any, why: str, problems: list[str], unknown: set[str] | None) -> None:
    kind = record.get("kind") if isinstance(record, dict) else None
    if isinstance(kind, str) and kind not in KINDS:  # a newer writer's kind: said once per file and kind
        if unknown is None or kind not in unknown:
            if unknown is not None:
                unknown.add(kind)
            problems.append(
                f"{path}:{lineno}: unknown record kind {kind!r} skipped (later ones in this file not reported)"
            )
        return
    what = f"{kind} record" if isinstance(kind, str) else "not a journal record"
    problems.append(f"{path}:{lineno}: {what}: {why}")
