"""A run's parsed state kept next to its journals (``RUN_DIR/index.msgpack``), so that a viewer
decodes it rather than parsing every journal again: at 1024 ranks the parse is most of a verb's time.

What it holds, per journal: the reader's position and problems (``JournalTail``), the process's
fields (``ProcessRec``, serialised field by field: a new field is carried without a change here),
its spans (``SpanRec``; attrs objects once in a shared table, as the reader shares them), the
shallow state a split read's parent takes of it (``load._shallow``), every span id, and the
journal's identity when it was read: (dev, inode, size, mtime) and a digest of its first and last
bytes up to the position read. It is the state of a *non-final* read (a last line without its
newline is left for whoever reads on), so it is right for live and final readers alike.

Read (``open_index``): a journal unchanged since is taken as is; one that grew is taken and read on
from its position (only the tail); one that is new is read whole. Anything else — an index that is
a link, not ours, unreadable, cut short, edited (a checksum per part), of another version or layout,
or a journal that shrank, was replaced or changed in place — and the index is not used: one warning
naming it, and the run is read from its journals. A copy of the run directory (``cp -r``, another
host: other inodes, other times) keeps its index: there each journal is the one indexed if it
begins with the bytes indexed (the digest), and one that does not is of another run.

Written (``write``) when a run has ended (every process of it proven gone) or serves (every rank
ready: ``serving``), by whoever ends it (``spawn_writer``: a detached process that waits for its
caller to exit, so a launcher never waits) or by the first viewer that reads it without a usable
index where it may write (small runs at once, large ones by ``spawn_writer``). The file is private
(0600, created new beside it and renamed on: never written through a link).
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import stat
import sys
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import fields
from itertools import repeat
from pathlib import Path
from typing import Any, get_type_hints

import msgspec

from .. import files, other_processes
from ..journal import bulk_decode, schema
from ..journal import tail as journal_tail
from ..journal.bulk_decode import SpanRec, without_attrs
from ..journal.layout import JOURNAL_DIR
from ..journal.tail import JournalTail, journal_max
from ..redact import printable
from . import view
from .view import ProcessRec, RunView

log = logging.getLogger("sglang_phasetrace")

INDEX_NAME = "index.msgpack"
ENV_INDEX = "SGLANG_PHASETRACE_INDEX"  # "0" / "off": never read nor write an index
VERSION = 1
# Bytes of an index read or written: twice a 1024-rank run's (1024 ranks x 261 spans, 178 MB of
# journals: a 63.7 MB index, ``scripts/bench_viewers_1024.py``). Past it, one warning, and the
# journals are read: an index is only ever a saving, never what a viewer must trust at any size.
INDEX_MAX = 128 << 20
CHECK_BYTES = 4096  # of a journal's start and of its end up to the position read: its digest
INLINE_BYTES = 8 << 20  # journals up to this size: a viewer writes the index itself (a few ms)
WAIT_S = 600.0  # longest a spawned writer waits for its caller to exit
ENDED_WAIT_S = 10.0  # longest it then waits for the run's processes to end
WRITE_LIMIT_S = 300  # a spawned writer's whole life after that (SIGALRM)
# Longest a viewer waits for a spawned writer at work on its run's index (``await_writer``): at
# 1024 ranks a writer takes 2-3 s; a viewer reading the journals beside it on two cores takes longer.
WRITER_WAIT_S = 5.0

# a journal as indexed; as indexed but for a last line without its newline (read on); grown since (its tail read)
FRESH, CUT, GROWN = "fresh", "cut", "grown"
WRITER = __name__.rpartition(".")[0] + ".load"  # the module a spawned writer runs (``load._main``)


def enabled() -> bool:
    return os.environ.get(ENV_INDEX, "").strip().lower() not in ("0", "off", "no", "false")


# -- the format ----------------------------------------------------------------------------------

_PROC_NAMES = tuple(f.name for f in fields(ProcessRec) if f.name not in ("path", "spans"))
_PROC_HINTS = get_type_hints(ProcessRec)
_DERIVED = {"exit"}  # set by the view from other journals' records (``RunView._place_told``): never kept


class TailState(msgspec.Struct, array_like=True, gc=False):
    offset: int
    lines: int
    problems: list[tuple[bool, str]]  # (began with the journal's path, the rest): paths are spelt per reader
    unknown_kinds: set[str]
    unreadable: str | None
    long: bool
    capped: bool


ProcState = msgspec.defstruct(
    "ProcState",
    [(name, _PROC_HINTS[name]) for name in _PROC_NAMES if name not in _DERIVED],
    array_like=True,
)


class Head(msgspec.Struct, array_like=True, gc=False):
    tail: TailState
    proc: ProcState  # type: ignore[valid-type]
    attrs: list[int]  # per span (``spans`` order): its attrs in the index's table
    shallow_attrs: list[int] | None  # per span of ``shallow``; None: the shallow state is the whole one
    shallow_dropped: dict[str, list[int]]  # ``ProcessRec.dropped`` of the shallow state
    firsts: list[int]  # earliest start at each depth (``load._pack``'s extras)
    hi: int | None  # latest end or start


class Entry(msgspec.Struct, array_like=True, gc=False):
    name: str  # the journal's file name
    dev: int
    ino: int
    size: int
    mtime_ns: int
    offset: int  # bytes read (``JournalTail.offset``)
    check: int  # ``_digest`` of the journal up to ``offset``
    at: int  # where its parts begin in the file: a ``Head``, its spans (``list[SpanRec]``, attrs left
    sizes: list[int]  # empty: ``Head.attrs``), its shallow spans (``list[SpanRec] | None``), every span id
    crcs: list[int]  # of each part: its spans' is checked where they are decoded (a split read's child)


class Index(msgspec.Struct, gc=False):
    """The header: ``MAGIC``, its size (8 bytes, little-endian), it, then the parts it places."""

    version: int
    layout: str  # the fields of the types here: another layout is another version
    run: str  # the run directory's name
    dev: int  # its journal directory's
    ino: int
    journal_max: int  # ``journal.tail.journal_max()`` when read: another cap reads otherwise
    finished: bool  # every process had ended (False: written while the run serves)
    t: int  # when written (ns)
    attrs_at: int  # ``list[dict[str, Any]]``: the attrs objects spans share
    attrs_size: int
    attrs_crc: int
    split_safe: bool  # span ids unique, and a span's parent in another journal is in that one's shallow state
    journals: list[Entry]


MAGIC = b"PTINDEX\n"


class _Version(msgspec.Struct):
    """What every version's header begins with (``Index``'s first fields; the others are left)."""

    version: int
    layout: str


def sources() -> list[Path]:
    """The code that makes an index's state from the journals, named by its modules (a renamed module
    cannot drop out of the digest); ``load``, which imports this module, by its place beside it."""
    modules = (view, journal_tail, schema, bulk_decode)
    return [Path(__file__).resolve().with_name("load.py"), *(Path(str(m.__file__)) for m in modules)]


def _layout() -> str:
    """The fields of the types kept, and the code that makes them from the journals: a state read
    by other code (another release, a fix to ``apply``) is not taken for this code's."""
    code = []
    for source in sources():
        try:
            code.append(zlib.crc32(source.read_bytes()))
        except OSError:  # installed without its sources: the fields alone
            code.append(None)
    parts = [
        VERSION,
        code,
        [(f.name, str(f.type)) for f in fields(ProcessRec)],
        msgspec.structs.fields(SpanRec),
        msgspec.structs.fields(TailState),
        msgspec.structs.fields(Head),
        msgspec.structs.fields(Entry),
        msgspec.structs.fields(Index),
    ]
    return format(zlib.crc32(repr(parts).encode()), "08x")


LAYOUT = _layout()
_ENC = msgspec.msgpack.Encoder()
_INDEX = msgspec.msgpack.Decoder(Index)
_VERSION = msgspec.msgpack.Decoder(_Version)
_HEAD = msgspec.msgpack.Decoder(Head)
_SPANS = msgspec.msgpack.Decoder(list[SpanRec])
_SHALLOW = msgspec.msgpack.Decoder(list[SpanRec] | None)
_IDS = msgspec.msgpack.Decoder(list[str])
_ATTRS = msgspec.msgpack.Decoder(list[dict[str, Any]])
_NO_ATTRS: dict[str, Any] = {}


def _crc(data: bytes | memoryview) -> int:
    return zlib.crc32(data)


def _digest(fd: int, offset: int) -> int:
    """A checksum of a journal's first and last ``CHECK_BYTES`` up to ``offset``: the bytes an index stands for."""
    head = os.pread(fd, min(CHECK_BYTES, offset), 0)
    end = os.pread(fd, min(CHECK_BYTES, offset), max(0, offset - CHECK_BYTES))
    return zlib.crc32(b"%d\0%b\0%b" % (offset, head, end))


# -- reading -------------------------------------------------------------------------------------


class Loaded:
    """A run directory's index, checked: journal path -> (its entry, ``FRESH``, ``CUT`` or ``GROWN``)."""

    def __init__(
        self,
        path: Path,
        index: Index,
        data: memoryview,
        attrs: list[dict[str, Any]],
        journals: dict[Path, tuple[Entry, str]],
    ) -> None:
        self.path, self.index, self.data, self.attrs, self.journals = path, index, data, attrs, journals

    def _parts(self, path: Path) -> tuple[Head, list[memoryview]]:
        parts = _slices(self.data, self.journals[path][0])
        return _HEAD.decode(parts[0]), parts

    def restore(self, path: Path, shallow: bool = False) -> tuple[JournalTail, ProcessRec]:
        """The journal's reader and process as a read up to the indexed position left them (its
        tail, if it grew, is read by the caller); ``shallow``: the spans a split read's parent
        keeps of a journal its child holds (``load._shallow`` at depth 0)."""
        head, parts = self._parts(path)
        tail, proc = JournalTail(path), ProcessRec(path)
        t = head.tail
        tail.offset, tail.lines, tail.unknown_kinds = t.offset, t.lines, t.unknown_kinds
        tail._unreadable, tail._long, tail._capped = t.unreadable, t.long, t.capped
        prefix = str(path)
        tail.problems = [prefix + rest if pathed else rest for pathed, rest in t.problems]
        vars(proc).update(msgspec.structs.asdict(head.proc))  # every field but its path and spans
        table = self.attrs
        if shallow and head.shallow_attrs is not None:
            spans, ids = _SHALLOW.decode(parts[2]) or [], head.shallow_attrs
            proc.dropped = head.shallow_dropped
        else:
            if _crc(parts[1]) != self.journals[path][0].crcs[1]:  # checked here: only where decoded
                raise Stale(DAMAGED, self.path)
            spans, ids = _SPANS.decode(parts[1]), head.attrs
        if len(ids) != len(spans):
            raise ValueError(f"{self.path}: {path.name}: {len(spans)} spans, {len(ids)} attrs")
        deque(map(setattr, spans, repeat("attrs"), map(table.__getitem__, ids)), 0)  # in C: 267 k spans
        proc.spans = {span.span_id: span for span in spans}
        return tail, proc

    def extras(self, path: Path, ids: bool = True) -> tuple[list[str], list[int], int | None]:
        """``load._pack``'s extras of an indexed journal: every span id (``ids``), the earliest
        start at each depth, the latest time."""
        head, parts = self._parts(path)
        return _IDS.decode(parts[3]) if ids else [], head.firsts, head.hi


class Stale(Exception):
    """Why an index is not used (one warning); ``path``: the index, when it is known only here."""

    def __init__(self, why: str, path: Path | None = None) -> None:
        super().__init__(why)
        self.path = path


DAMAGED = "cut short, edited or damaged (a checksum does not match)"


def _slices(data: memoryview, entry: Entry) -> list[memoryview]:
    parts, at = [], entry.at
    for size in entry.sizes:
        parts.append(data[at : at + size])
        at += size
    return parts


def open_index(run_path: Path, journals: list[Path] | None = None) -> Loaded | None:
    """``run_path``'s index, checked against its journals (``journals``: those there, as the view
    names them); None when there is none or it is not used (said once: ``warn``)."""
    if not enabled():
        return None
    path = run_path / INDEX_NAME
    if journals is None:
        journals = sorted((run_path / JOURNAL_DIR).glob("*.jsonl"))
    try:
        return _open(run_path, path, {journal.name: journal for journal in journals})
    except FileNotFoundError:
        return None
    except _Quiet:
        return None
    except Stale as exc:
        warn(path, str(exc))
    except OSError as exc:
        warn(path, f"cannot be read ({exc.strerror or exc})")
    except (msgspec.DecodeError, ValueError, TypeError, KeyError, RecursionError) as exc:
        warn(path, f"not a whole index (cut short or edited: {exc.__class__.__name__})")
    return None


class _Quiet(Exception):
    """Not used, nothing wrong with it: it was read under another cap on journals."""


def _open(run_path: Path, path: Path, names: dict[str, Path]) -> Loaded:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise Stale("it is a symbolic link")
    if not stat.S_ISREG(st.st_mode):
        raise Stale("it is not a regular file")
    owner = os.stat(run_path / JOURNAL_DIR).st_uid  # trusted as far as the journals beside it are
    if st.st_uid not in (owner, os.geteuid(), 0):
        raise Stale(f"it is owned by uid {st.st_uid}, not by the run's owner (uid {owner})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Stale(f"it is writable by other users (mode {stat.S_IMODE(st.st_mode):o})")
    data = _map(path, st)
    if data[: len(MAGIC)] != MAGIC:
        raise Stale("not an index (it does not begin as one)")
    view = memoryview(data)
    start = len(MAGIC) + 8
    header = view[start : start + int.from_bytes(data[len(MAGIC) : start], "little")]
    version = _VERSION.decode(header)  # first: another version's header may not decode as this one's
    if version.version != VERSION or version.layout != LAYOUT:
        raise Stale(f"written by another version of phasetrace (format {version.version})")
    index = _INDEX.decode(header)
    st = os.stat(run_path / JOURNAL_DIR)
    here = (index.dev, index.ino) == (st.st_dev, st.st_ino)  # else a copy (``cp -r``, another host): by content
    if index.journal_max != journal_max():
        raise _Quiet
    attrs = view[index.attrs_at : index.attrs_at + index.attrs_size]
    if len(attrs) != index.attrs_size or _crc(attrs) != index.attrs_crc:
        raise Stale(DAMAGED)
    journals: dict[Path, tuple[Entry, str]] = {}
    for entry in index.journals:
        size = sum(entry.sizes)
        if len(entry.sizes) != 4 or len(entry.crcs) != 4 or len(view[entry.at : entry.at + size]) != size:
            raise Stale(DAMAGED)
        head, _, shallow, ids = _slices(view, entry)
        if (_crc(head), _crc(shallow), _crc(ids)) != (entry.crcs[0], entry.crcs[2], entry.crcs[3]):
            raise Stale(DAMAGED)
        journal = names.get(entry.name)
        if journal is None:
            raise Stale(f"names a journal that is not there ({printable(entry.name)})")
        journals[journal] = (entry, _state(journal, entry, here))
    return Loaded(path, index, view, _ATTRS.decode(attrs), journals)


def _map(path: Path, seen: os.stat_result) -> mmap.mmap | bytes:
    """The index's bytes, mapped (read in place: no copy, and shared with a split read's child);
    never through a link, only the file ``seen`` (``lstat``) was. Our writers never change an
    index in place: they rename a new one over it."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (seen.st_dev, seen.st_ino):
            raise Stale("it is not a regular file")
        if st.st_size > INDEX_MAX:
            raise Stale(f"it is over {INDEX_MAX >> 20} MiB")
        return mmap.mmap(fd, 0, prot=mmap.PROT_READ) if st.st_size else b""
    finally:
        os.close(fd)


def _state(journal: Path, entry: Entry, here: bool = True) -> str:
    """``FRESH``, ``CUT`` or ``GROWN``; ``Stale`` when the journal is not the one indexed, or changed
    other than by growing. ``here``: the index is in the run directory it was written in, else in a
    copy of it (other inodes, other times: each journal is the one indexed if it holds its bytes)."""
    offset = entry.offset
    try:
        st = os.lstat(journal)
    except FileNotFoundError:
        raise Stale(f"names a journal that is not there ({journal.name})") from None
    if not stat.S_ISREG(st.st_mode) or (here and (st.st_dev, st.st_ino) != (entry.dev, entry.ino)):
        raise Stale(f"of another copy of {journal.name}")
    if not here and (st.st_dev, st.st_ino) != (entry.dev, entry.ino):
        if st.st_size < entry.size or not _holds(journal, entry):
            raise Stale(f"{journal.name} is not the journal it indexed: of another run")
        return (FRESH if st.st_size == offset else CUT) if st.st_size == entry.size else GROWN
    if st.st_size == entry.size and st.st_mtime_ns == entry.mtime_ns:
        return FRESH if st.st_size == offset else CUT
    if st.st_size <= entry.size or not _holds(journal, entry):
        raise Stale(f"{journal.name} changed since it was indexed")
    return GROWN


def _holds(journal: Path, entry: Entry) -> bool:
    """The journal begins with the bytes indexed (their ``_digest``)."""
    fd = os.open(journal, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return _digest(fd, entry.offset) == entry.check
    finally:
        os.close(fd)


_SAID: set[Path] = set()


def warn(path: Path, why: str) -> None:
    """One line per index and process: it is not used, and why."""
    if path in _SAID:
        return
    _SAID.add(path)
    log.warning(printable(f"sglang-phasetrace: index {path} not used ({why}); the run is read from its journals"))


# -- writing -------------------------------------------------------------------------------------


def ended(proc: ProcessRec) -> bool:
    """The journal's process is proven gone: it ran on this host and is no longer that process, or
    another process recorded its exit. A process of another host is never guessed gone."""
    if proc.exit is not None:
        return True
    if proc.host != other_processes.this_host() or not proc.pid:
        return False
    if not other_processes.alive(proc.pid):
        return True
    if proc.boot_id is not None and proc.boot_id != other_processes.boot_id():
        return True
    return isinstance(proc.start_ticks, int) and other_processes.start_ticks(proc.pid) != proc.start_ticks


def finished(view: RunView) -> bool:
    """Every process of the run has ended (``ended``)."""
    every = [proc for _, proc in view._tails.values() if proc.pid]
    return bool(every) and all(map(ended, every))


def serving(view: RunView) -> bool:
    """Every rank of the run is ready: its init is over, its journal grows no more but by a line or two."""
    ranks = [proc for _, proc in view._tails.values() if proc.role == "rank"]
    return bool(ranks) and all(proc.ready for proc in ranks)


Shallow = Callable[[ProcessRec, int, dict[str, int]], list[SpanRec]]  # ``load._shallow``
Levels = Callable[[dict[str, SpanRec]], dict[str, int]]  # ``load._levels``


def encode(view: RunView, run_path: Path, done: bool, levels_of: Levels, shallow_of: Shallow) -> bytes | None:
    """The index of ``run_path``'s journals as ``view`` holds them (each read whole, not ``final``:
    a last line without its newline not taken); None when one cannot be indexed (unreadable).
    ``levels_of``, ``shallow_of``: the split read's depths and its choice of a shallow state."""
    journal_dir = run_path / JOURNAL_DIR
    st = os.stat(journal_dir)
    table: dict[bytes, int] = {}  # attrs as encoded -> their place in ``objects``
    by_id: dict[int, int] = {}  # id(attrs) -> the same (every attrs object stays held by its span)
    objects: list[dict[str, Any]] = []
    entries: list[Entry] = []
    blobs: list[bytes] = []
    at = 0  # where the next part goes, after the header
    shallows: list[set[str]] = []  # per journal: the ids of its shallow state
    for path, (tail, proc) in view._tails.items():
        if path.parent != journal_dir:
            continue
        if tail._unreadable is not None:
            return None
        spans = list(proc.spans.values())
        levels = levels_of(proc.spans)
        kept_dropped = proc.dropped
        shallow = shallow_of(proc, 0, levels)
        shallow_dropped, proc.dropped = proc.dropped, kept_dropped
        shallows.append({span.span_id for span in shallow})
        firsts: list[int] = []
        hi = None
        for sid, span in proc.spans.items():
            level = levels[sid]
            if level == len(firsts):
                firsts.append(span.start)
            elif span.start < firsts[level]:
                firsts[level] = span.start
            t = span.end or span.start
            hi = t if hi is None or t > hi else hi

        def ids_of(spans: list[SpanRec]) -> list[int]:
            out = []
            for span in spans:
                attrs = span.attrs
                i = by_id.get(id(attrs))
                if i is None:  # equal attrs are one object once read back (a split read's were copied)
                    i = by_id[id(attrs)] = table.setdefault(_ENC.encode(attrs), len(objects))
                    if i == len(objects):
                        objects.append(attrs)
                out.append(i)
            return out

        prefix = str(path)
        head = Head(
            TailState(
                tail.offset,
                tail.lines,
                [(p.startswith(prefix), p.removeprefix(prefix)) for p in tail.problems],
                set(tail.unknown_kinds),
                tail._unreadable,
                tail._long,
                tail._capped,
            ),
            ProcState(**{name: getattr(proc, name) for name in _PROC_NAMES if name not in _DERIVED}),
            ids_of(spans),
            ids_of(shallow) if proc.role == "rank" else None,
            shallow_dropped if proc.role == "rank" else {},
            firsts,
            hi,
        )
        parts = [
            _ENC.encode(head),
            _ENC.encode(without_attrs(spans)),
            _ENC.encode(without_attrs(shallow) if proc.role == "rank" else None),
            _ENC.encode(list(proc.spans)),
        ]
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            jst = os.fstat(fd)
            if not stat.S_ISREG(jst.st_mode) or jst.st_size < tail.offset:
                return None
            check = _digest(fd, tail.offset)
        finally:
            os.close(fd)
        blob = b"".join(parts)
        crcs = list(map(_crc, parts))
        entries.append(
            Entry(
                path.name,
                jst.st_dev,
                jst.st_ino,
                jst.st_size,
                jst.st_mtime_ns,
                tail.offset,
                check,
                at,
                list(map(len, parts)),
                crcs,
            )
        )
        blobs.append(blob)
        at += len(blob)
    attrs = _ENC.encode(objects)
    index = Index(
        VERSION,
        LAYOUT,
        run_path.resolve().name,
        st.st_dev,
        st.st_ino,
        journal_max(),
        done,
        time.time_ns(),
        at,
        len(attrs),
        _crc(attrs),
        _split_safe([proc for path, (_, proc) in view._tails.items() if path.parent == journal_dir], shallows),
        entries,
    )
    base = 0  # the parts' places are counted from the header's end; the header holds them: placed until it fits
    while True:
        header = _ENC.encode(index)
        shift = len(MAGIC) + 8 + len(header) - base
        if not shift:
            break
        base += shift
        index.attrs_at += shift
        for entry in entries:
            entry.at += shift
    return b"".join([MAGIC, len(header).to_bytes(8, "little"), header, *blobs, attrs])


def _split_safe(procs_: list[ProcessRec], shallows: list[set[str]]) -> bool:
    """What ``load._split_ok`` checks of a split read, for any split of these journals: no span id
    empty or used twice, and a span whose parent is in another journal finds it in that journal's
    shallow state (what a split read's parent holds of the child's journals)."""
    owner: dict[str, int] = {}
    for n, proc in enumerate(procs_):
        for sid in proc.spans:
            if not sid or owner.setdefault(sid, n) != n:
                return False
    for proc in procs_:
        for span in proc.spans.values():
            up = span.parent_id
            if up and up not in proc.spans and up in owner and up not in shallows[owner[up]]:
                return False
    return True


def write(view: RunView, done: bool, levels_of: Levels, shallow_of: Shallow) -> list[Path]:
    """Write the index of each of ``view``'s run directories that is ours to write (owned by this
    user, not a link); the paths written. ``view`` read not ``final``, its processes whole. Never
    raises: an index is only ever a saving."""
    written: list[Path] = []
    if not enabled():
        return written
    for run_path in view.paths:
        path = run_path / INDEX_NAME
        try:
            if not _ours(run_path):
                continue
            data = encode(view, run_path, done, levels_of, shallow_of)
            if data is None:
                continue
            if len(data) > INDEX_MAX:  # no reader would take it
                if path not in _SAID:
                    _SAID.add(path)
                    log.warning(
                        printable(
                            f"sglang-phasetrace: index {path} not written ({len(data) >> 20} MiB, over the "
                            f"{INDEX_MAX >> 20} MiB a reader takes); the run is read from its journals"
                        )
                    )
                continue
            files.write_new(path, lambda fd, data=data: files.write_all(fd, data))
            written.append(path)
        except Exception as exc:  # a full disk, a read-only directory: the next viewer reads the journals
            log.debug("sglang-phasetrace: %s: index not written (%r)", path, exc)
    return written


def _ours(path: Path) -> bool:
    """A directory of this user's that it may write in: never another user's run (its index would
    be ours, and unreadable to its owner)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and os.access(path, os.W_OK)


def needed(view: RunView, used: dict[Path, Loaded | None]) -> bool:
    """Whether a viewer that read ``view`` (``used``: each directory's index, as ``open_index``
    gave it) should have an index written: one of its directories that is ours has none, or one
    that was read on, and the run has ended."""
    if not enabled():
        return False
    indexed = {path: state for loaded in used.values() if loaded for path, (_, state) in loaded.journals.items()}
    stale = {path.parent.parent for path in view._tails if indexed.get(path) not in (FRESH, CUT)}
    stale |= {path for path, loaded in used.items() if loaded is None}
    return any(map(_ours, stale)) and finished(view)


def hold(paths: list[Path]) -> list[int] | None:
    """Lock each run directory (``flock``, exclusive) for a spawned writer's read and write, so that
    a viewer starting meanwhile waits for its index (``await_writer``) rather than reading the
    journals beside it; the descriptors (closed by the writer's exit), or None when another writer
    holds one (that one writes it). A directory that cannot be locked (a filesystem without
    ``flock``) is written unlocked: the lock only saves work."""
    held: list[int] = []
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            for other in held:
                os.close(other)
            return None
        except OSError:
            os.close(fd)
            continue
        held.append(fd)
    return held


def await_writer(path: Path, bound: float = WRITER_WAIT_S) -> None:
    """Wait, at most ``bound`` seconds, while a spawned writer holds ``path`` (``hold``). Never
    raises: a directory that cannot be opened or locked is not waited for."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        deadline = time.monotonic() + bound
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return
                time.sleep(0.02)
            except OSError:
                return
    finally:
        os.close(fd)  # the shared lock goes with it


def spawn_writer(paths: list[Path | str], when: str = "exit", allow_serving: bool = False) -> int | None:
    """Write the run's index from a detached process (``python -m ...reader.load``, niced, its
    life bounded), so that the caller never waits for it. It starts ``when``:

    * ``"exit"``: once this process has exited (however it ends): a launcher at its end, ``phasetrace
      run`` when its launch is over. It then waits up to ``ENDED_WAIT_S`` for the run's processes
      to end, and writes nothing while one runs (the first viewer will);
    * ``"now"``: at once (``allow_serving``: a launch whose ranks are all ready and serve, indexed
      as not finished);
    * ``"closed"``: once the returned descriptor is closed, or this process exits (a viewer: when it
      is done with its read).

    Returns the descriptor (``"closed"``), else None."""
    if not enabled():
        return None
    import subprocess

    r, w = os.pipe()
    try:
        cmd = [sys.executable, "-m", WRITER, "--wait-fd", str(r), *(["--serving"] if allow_serving else [])]
        subprocess.Popen(
            [*cmd, *map(str, paths)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(r,),
            start_new_session=True,
            env=_env(),
        )
    except OSError:
        os.close(w)
        return None
    finally:
        os.close(r)
    if when == "closed":
        return w
    if when == "exit":
        _HELD.append(w)  # closed by this process's exit, whatever ends it
    else:
        os.close(w)
    return None


_HELD: list[int] = []


def _env() -> dict[str, str]:
    """This environment, without the tracing hook on PYTHONPATH (the writer imports no SGLang, and is not traced)."""
    hooks = Path(__file__).resolve().parents[2] / "sitecustomize_hooks"
    env = dict(os.environ)
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != hooks]
    env["PYTHONPATH"] = os.pathsep.join(kept)
    return env
