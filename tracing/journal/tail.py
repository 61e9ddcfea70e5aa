"""Reading journals back: ``JournalTail`` follows one journal as it grows, record by record, in
bounded pieces; a line it refuses is named once as ``file:line: why``."""

from __future__ import annotations

import errno
import json
import logging
import operator
import os
import stat
import time
from collections.abc import Iterator, Sequence
from itertools import compress

import msgspec

try:  # several times faster on large runs; SGLang installs it anyway
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    _loads = json.loads
from pathlib import Path
from typing import Any

from .bulk_decode import BULK, BULK_PREFIX, bulk_valid, decode_lines
from .schema import KINDS, all_valid, trim, validate
from .writer import RECORD_MAX

log = logging.getLogger("sglang_phasetrace")


LINE_MAX = RECORD_MAX  # bytes of one journal line readers take: what a writer writes (a record: ~300 bytes)
JOURNAL_MAX = 256 << 20  # bytes of one journal readers read (a rank's init: ~170 KiB; a hung one's: ~40 MiB a day)
ENV_JOURNAL_MAX = "SGLANG_PHASETRACE_JOURNAL_MAX_MB"  # sets JOURNAL_MAX, in MiB
READ_BYTES = 16 << 20  # read at a time
# A last line without its newline that the file has kept this long was cut (``kill -9``, a crash):
# a writer writes each record in one ``os.write``, and cuts a short one back off at once.
CUT_AFTER_S = 5.0


def journal_max() -> int:
    """Bytes of one journal that readers read: ``SGLANG_PHASETRACE_JOURNAL_MAX_MB`` MiB, or ``JOURNAL_MAX``."""
    try:
        mib = float(os.environ.get(ENV_JOURNAL_MAX) or 0)
    except ValueError:
        return JOURNAL_MAX
    return int(mib * 2**20) if 0 < mib < 2**40 else JOURNAL_MAX


class JournalTail:
    """Reads one journal incrementally (the watchdog polls it) or whole (the CLI), ``READ_BYTES`` at a
    time: a journal is never held whole, and what a reader keeps is what it parsed.

    A last line without its newline is a write in progress, or one cut by ``kill -9``: a live read
    leaves it for next time, unless the file has not changed for ``CUT_AFTER_S`` (nothing is writing
    it: it was cut); a ``final`` read parses it. Either reports it if it is broken.
    Every unusable line (not JSON, or a record ``schema.validate`` refuses) is reported once, as
    ``file:line: why``, and skipped; the rest of its chunk is used. So is a line over ``LINE_MAX``
    (never held whole: a file of zeros, sparse or left by a crash, is one long line). Reading stops
    at ``journal_max()`` bytes, said once with how to read more.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.lines = 0
        self.problems: list[str] = []
        self.unknown_kinds: set[str] = set()
        self._unreadable: str | None = None  # the reason said for a file that cannot be read
        self._long = False  # inside a line over ``LINE_MAX`` (said): skipped up to its newline
        self._capped = False  # ``journal_max()`` bytes read (said): nothing more is
        self._chunk: tuple[list[bytes], Sequence[int], list[int] | None] = ([], (), None)  # for line_of()

    def read(self, final: bool = False) -> list[dict]:
        """The records appended since the last read, as dicts."""
        out: list[dict] = []
        for lines, numbers in self.pieces(final):
            out += self._records(lines, numbers)
        return out

    def bulk_pieces(self, final: bool = False) -> Iterator[tuple[dict[str, list[Any]], list[dict]]]:
        """``read`` for a reader that keeps every span (``rundir``), one piece (``pieces``) at a time:
        the lines of the bulk kinds (``bulk_decode.BULK``: nearly all of a journal) decoded straight into
        objects, per kind in file order, and the other records as ``read`` gives them (``line_of``
        names their lines until the next piece). A piece with a line the fast path refuses goes
        ``read``'s way whole, so each bad line is named as usual."""
        for lines, numbers in self.pieces(final):
            yield self._bulk(lines, numbers)

    def _bulk(self, lines: list[bytes], numbers: Sequence[int]) -> tuple[dict[str, list[Any]], list[dict]]:
        heads = list(map(_HEAD, lines))
        bulk: dict[str, list[Any]] = {}
        try:
            for prefix, (kind, decoder) in BULK.items():
                mine = list(compress(lines, map(prefix.__eq__, heads)))
                if mine:
                    items = decode_lines(decoder, mine)
                    if not bulk_valid(kind, items):
                        raise ValueError(kind)
                    bulk[kind] = items
        except (msgspec.DecodeError, ValueError, RecursionError):  # ValidationError is a DecodeError;
            return {}, self._records(lines, numbers)  # msgspec recurses into a line nested ~1000 deep
        if not bulk:
            return {}, self._records(lines, numbers)
        rest = list(map(operator.not_, map(BULK.__contains__, heads)))
        return bulk, self._records(list(compress(lines, rest)), list(compress(numbers, rest)))

    def pieces(self, final: bool = False) -> Iterator[tuple[list[bytes], Sequence[int]]]:
        """The whole lines appended since the last read (and a last one without its newline when
        ``final``), at most ``READ_BYTES`` of them at a time, with their line numbers in the file.
        A line over ``LINE_MAX`` is said (``file:line``) and skipped, the next one read; reading
        stops at ``journal_max()`` bytes of the file (said)."""
        cap = journal_max()
        while not self._capped:
            want = min(max(READ_BYTES, LINE_MAX + 1), cap - self.offset)  # a line that fits fits in one read
            data, size = self._read_more(max(want, 1))  # past the cap: one byte, to tell whether there is more
            if not data:
                return
            if want <= 0:
                self._cap(cap)
                return
            at_end = self.offset + len(data) >= size
            start = 0
            if self._long:  # the rest of a line over LINE_MAX
                start = data.find(b"\n") + 1
                if not start:
                    self.offset += len(data)
                    if at_end:
                        return
                    continue
                self._long = False
            end = data.rfind(b"\n", start) + 1 or start
            self.offset += start
            if end > start:
                lines = data[start:end].split(b"\n")
                lines.pop()
                first = self.lines + 1
                self.lines += len(lines)
                self.offset += end - start
                yield self._short(lines, range(first, self.lines + 1), end - start)
            rest = len(data) - end  # a line without its newline (yet)
            if rest > LINE_MAX:
                self.lines += 1
                self.problems.append(f"{self.path}:{self.lines}: {_LONG}")
                self.offset += rest
                self._long = True
                if at_end:
                    return
            elif at_end:
                if rest and (final or self._cut()):
                    self.lines += 1
                    self.offset += rest
                    yield [data[end:]], range(self.lines, self.lines + 1)
                return
            elif not end and len(data) == want <= LINE_MAX:  # the cap cuts the line it reached
                self._cap(cap)
                return

    def _short(self, lines: list[bytes], numbers: range, size: int) -> tuple[list[bytes], Sequence[int]]:
        """``lines`` without those over ``LINE_MAX`` (said): ``size`` bytes of them in all."""
        if size <= LINE_MAX or max(map(len, lines)) <= LINE_MAX:
            return lines, numbers
        keep = [len(line) <= LINE_MAX for line in lines]
        self.problems += [f"{self.path}:{n}: {_LONG}" for n, ok in zip(numbers, keep, strict=True) if not ok]
        return list(compress(lines, keep)), list(compress(numbers, keep))

    def _cap(self, cap: int) -> None:
        self._capped = True
        self.problems.append(
            f"{self.path}:{self.lines + (not self._long)}: the rest of this journal, past {cap / 2**20:g} MiB (the "
            f"cap on what is read of one journal; set {ENV_JOURNAL_MAX} to a number of MiB to read more)"
        )

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
            return trim(records)
        bad = [(i, why) for i, r in enumerate(records) if (why := validate(r)) is not None]
        kept = _numbers(lines, numbers)
        for i, why in bad:
            self._report(kept[i], records[i], why)
        drop = {i for i, _ in bad}
        self._chunk = (lines, numbers, [n for i, n in enumerate(kept) if i not in drop])
        return trim([r for i, r in enumerate(records) if i not in drop])

    def line_of(self, index: int) -> int:
        """The line number of record ``index`` of the last piece's records (dicts)."""
        lines, numbers, kept = self._chunk
        return (kept if kept is not None else _numbers(lines, numbers))[index]

    def _cut(self) -> bool:
        """The file has not changed for ``CUT_AFTER_S``: a last line without its newline was cut."""
        try:
            return time.time_ns() - os.stat(self.path).st_mtime_ns > CUT_AFTER_S * 1e9
        except OSError:
            return False

    @property
    def unreadable(self) -> str | None:
        """Why the file cannot be read (as said in ``problems``), or None."""
        return self._unreadable

    def _read_more(self, limit: int) -> tuple[bytes, int]:
        try:
            return _read_at(self.path, self.offset, limit)
        except FileNotFoundError:
            return b"", 0
        except OSError as exc:
            why = f"cannot read ({exc.strerror or exc})"
            if why != self._unreadable:
                self._unreadable = why
                self.problems.append(f"{self.path}: {why}")
            return b"", 0

    def _report(self, lineno: int, record: Any, why: str) -> None:
        _report(self.path, lineno, record, why, self.problems, self.unknown_kinds)


_HEAD = operator.itemgetter(slice(BULK_PREFIX))
_LONG = f"a line over {LINE_MAX >> 20} MiB (the cap on one journal line)"


def read_regular(path: Path, offset: int = 0, limit: int = -1) -> bytes:
    """The bytes of a regular file from ``offset`` (``limit`` at most): never through a symbolic
    link, never blocking on a FIFO or reading a device (``OSError`` naming why instead)."""
    fd, info = _open_regular(path)
    size = info.st_size
    try:
        # what fstat says is there in one read (a buffered read of ``limit`` allocates all of it first:
        # 1 MiB for a 300-byte status file), then on to the end (``/proc`` files say 0; a file may grow)
        want = max(0, size - offset) if limit < 0 else min(max(0, size - offset), limit)
        data = os.pread(fd, want, offset) if want else b""
        while limit < 0 or len(data) < limit:
            more = os.pread(fd, 1 << 16 if limit < 0 else min(1 << 16, limit - len(data)), offset + len(data))
            if not more:
                break
            data += more
        return data
    finally:
        os.close(fd)


def _read_at(path: Path, offset: int, limit: int) -> tuple[bytes, int]:
    """``read_regular`` up to the file's size when opened, and that size (a buffer of exactly what is read)."""
    fd, info = _open_regular(path)
    try:
        n = min(limit, info.st_size - offset)
        return (os.pread(fd, n, offset) if n > 0 else b""), info.st_size
    finally:
        os.close(fd)


def _open_regular(path: Path) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file at ``path`` (never through a link, never blocking), and its ``fstat``."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def _numbers(lines: list[bytes], numbers: Sequence[int]) -> list[int]:
    """Line numbers of the non-blank lines (the records of a chunk parsed at once)."""
    return [n for n, line in zip(numbers, lines, strict=True) if line.strip()]


def _parse_chunk(lines: list[bytes]) -> list | None:
    """Every line JSON: their values, one ``orjson`` parse for all; else None (go line by line)."""
    try:  # a blank line makes ",," (not JSON): that chunk goes line by line, which skips it
        return _loads(b"[" + b",".join(lines) + b"]")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None


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
    return trim([record])[0]


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
