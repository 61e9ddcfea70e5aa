"""The history of starts: one SQLite file per base directory, written once per start as it ends.

``$SGLANG_PHASETRACE_DIR/history.sqlite`` (default base ``./phasetrace-runs``), or where
``SGLANG_PHASETRACE_HISTORY`` says (a path; ``0`` turns the history off). Stdlib ``sqlite3`` in WAL
mode: readers never wait for a writer, and several launches on one host may record at once (one
writer at a time: each waits at most ``BUSY_S`` for the lock; three such waits while another writer is
creating the file: < 1 s in all).

``record(run)`` never raises and never waits longer than that: a locked, corrupt, read-only or full
database, or an unsafe path, costs one warning per process and problem, and the start is simply not
recorded. Recording the same run again replaces it (idempotent per run id).

Schema (``PRAGMA user_version`` = ``SCHEMA``)::

    fingerprints(id, summary, fields)                  one row per launch fingerprint (fields: JSON)
    starts(run_id, fingerprint, started, ended,        one row per start; times in Unix seconds;
           outcome, total_s, processes, host,          outcome: ready | failed | stalled | interrupted;
           recorded, labels)                           labels: zlib(JSON list of process labels)
    phases(run_id, phase, role, depth, start_s,        one row per phase key per start: the slowest
           processes, count, open, max_s, median_s,    process's time (max_s: what the queries use),
           min_s, slowest, per_rank)                   the median and fastest, who was slowest, and
                                                       per_rank: zlib(float32 LE, one per label, NaN
                                                       where that process did not run it)

Retention: the newest ``KEEP_PER_FINGERPRINT`` starts of each fingerprint and ``KEEP_ALL`` overall;
the per-process detail (``labels``, ``per_rank``) of the newest ``KEEP_DETAIL`` only (at 1024 ranks
it is most of a start's size). Files are private: the directory is made 0700 if missing, the
database 0600 (SQLite gives its -wal and -shm files the database's mode), a link is refused.
"""

from __future__ import annotations

import array
import errno
import json
import logging
import math
import os
import sqlite3
import stat
import statistics
import sys
import threading
import time
import zlib
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .. import files, process_state
from ..reader.view import RunView
from ..redact import redact_text
from . import fingerprint as fingerprints
from .fingerprint import Fingerprint
from .measure import OUTCOMES, Measured, measure
from .where import ENV_HISTORY, FILE_NAME, location, of_run_dir

__all__ = ["ENV_HISTORY", "FILE_NAME", "History", "HistoryError", "Recorded", "location", "of_run_dir", "record"]

SCHEMA = 1
KEEP_PER_FINGERPRINT, KEEP_ALL, KEEP_DETAIL = 50, 2000, 200
BUSY_S = 0.3  # the longest one wait for another writer's lock: one per record (three while the file is made)
GREW_RATIO, GREW_MIN_S = 1.25, 1.0  # a phase grew: its latest time past both the median x ratio and median + s
EXPLAINS = 0.8  # a phase that grew by this share of the most any grew accounts for it (``grew``)

log = logging.getLogger("sglang_phasetrace")

_DDL = (
    "CREATE TABLE fingerprints (id TEXT PRIMARY KEY, summary TEXT NOT NULL, fields TEXT NOT NULL)",
    "CREATE TABLE starts (run_id TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, started REAL NOT NULL, "
    "ended REAL NOT NULL, outcome TEXT NOT NULL, total_s REAL NOT NULL, processes INTEGER NOT NULL, "
    "host TEXT NOT NULL, recorded REAL NOT NULL, labels BLOB)",
    "CREATE INDEX starts_by_fingerprint ON starts (fingerprint, started)",
    "CREATE INDEX starts_by_time ON starts (started)",
    "CREATE TABLE phases (run_id TEXT NOT NULL, phase TEXT NOT NULL, role TEXT NOT NULL, depth INTEGER NOT NULL, "
    "start_s REAL NOT NULL, processes INTEGER NOT NULL, count INTEGER NOT NULL, open INTEGER NOT NULL, "
    "max_s REAL NOT NULL, median_s REAL NOT NULL, min_s REAL NOT NULL, slowest TEXT NOT NULL, per_rank BLOB, "
    "PRIMARY KEY (run_id, phase)) WITHOUT ROWID",
)


class HistoryError(Exception):
    """The history cannot be read or written; the message names the path and why. ``kind``:
    ``busy``, ``corrupt``, ``full``, ``newer``, ``unsafe``, ``missing`` or ``write``."""

    def __init__(self, message: str, kind: str = "write") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class Recorded:
    run_id: str
    fingerprint: Fingerprint
    outcome: str
    total_s: float
    phases: int
    path: Path
    seconds: float  # what recording took (reading the run not included)


def record(run: RunView, path: str | Path | None = None, outcome: str | None = None) -> Recorded | None:
    """Record the start ``run`` holds (read whole, not ``shallow``) in the history at ``path``
    (default: its base directory's, ``of_run_dir``). ``outcome``: what the caller knows better
    than the journals (one of ``measure.OUTCOMES``; it never turns a start that was ready, or one a
    stall was recorded in, into an interrupted one). Never raises: None when the history is off,
    the run does not say what was launched, or the database cannot be written (one warning per
    process and problem).

    Cost, on the 2-core CPU box (the run already read): a real tp=2 start, 5 ms (1 ms to measure,
    3 ms of SQLite); 1024 ranks x 230-270 spans, 0.3-0.9 s (one pass over every span, then 10-90 ms
    of SQLite; the high end with the box loaded: ``scripts/bench_history.py``); plus at most
    ``BUSY_S`` waiting for another writer. Run it off the start's critical path (``keeper``)."""
    where = Path(path) if path is not None else of_run_dir(run.path)
    if where is None:
        return None
    try:
        return write(run, where, outcome)
    except HistoryError as exc:
        _warn(exc, "this start is not recorded")
    except Exception as exc:  # a bug of ours must not reach the start
        _warn(HistoryError(f"recording in {where} failed ({exc!r})", "bug"), "this start is not recorded")
    return None


def write(run: RunView, path: str | Path, outcome: str | None = None) -> Recorded | None:
    """``record`` that raises ``HistoryError`` (the CLI's ``--record``); None when the run does not
    say what was launched (no server arguments in any root)."""
    path = Path(path)
    fp = fingerprints.of_run(run)
    if fp is None:
        log.debug("sglang-phasetrace: history: %s does not say what was launched; not recorded", run.path)
        return None
    m = measure(run)
    if outcome in OUTCOMES and m.outcome != "ready" and not (outcome == "interrupted" and m.outcome == "stalled"):
        m.outcome = outcome
    tic = time.perf_counter()
    con = _connect(path)
    try:
        _begin(con, path)
        try:
            _insert(con, fp, m)
            _retain(con, fp.id)
            con.execute("COMMIT")
        except BaseException:
            _rollback(con)
            raise
    except sqlite3.Error as exc:
        raise _error(path, exc) from None
    finally:
        con.close()
    forget(fp.id)  # what the watchdog's cache said of this fingerprint is out of date
    return Recorded(run.run_id, fp, m.outcome, m.total_s, len(m.phases), path, time.perf_counter() - tic)


@dataclass(eq=False)
class Memory:
    """What this process remembers of the history (``process_state.STATE.history``: a forked
    child starts without it): ``live``'s answers per (database, fingerprint, runs left out), and
    ``verdicts.usual``'s fingerprint per run directory."""

    usuals: dict[tuple[str, str, frozenset[str]], dict[str, Usual]] = field(default_factory=dict)
    fingerprints: dict[str, Fingerprint] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)  # the watchdog's thread and a recorder's


def memory() -> Memory:
    return process_state.part("history", Memory)


def forget(fingerprint_id: str | None = None) -> None:
    """``live`` reads the database again next time (for one fingerprint, or all): a start of it was
    just recorded."""
    mem = memory()
    with mem.lock:
        for key in [k for k in mem.usuals if fingerprint_id is None or k[1] == fingerprint_id]:
            del mem.usuals[key]


def _insert(con: sqlite3.Connection, fp: Fingerprint, m: Measured) -> None:
    con.execute("DELETE FROM phases WHERE run_id = ?", (m.run_id,))
    con.execute("DELETE FROM starts WHERE run_id = ?", (m.run_id,))
    con.execute(
        "INSERT OR REPLACE INTO fingerprints (id, summary, fields) VALUES (?, ?, ?)",
        (fp.id, fp.summary, fingerprints.canonical(fp.fields)),
    )
    labels = m.labels
    con.execute(
        "INSERT INTO starts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            m.run_id,
            fp.id,
            m.started_ns / 1e9,
            m.ended_ns / 1e9,
            m.outcome,
            m.total_s,
            len(labels),
            m.host,
            time.time(),
            zlib.compress(json.dumps(labels).encode(), 6),
        ),
    )
    index = {label: i for i, label in enumerate(labels)}
    rows = []
    for row in m.phases:
        per = array.array("f", [math.nan]) * len(labels)
        for label, seconds in row.per_rank.items():
            per[index[label]] = seconds
        if sys.byteorder != "little":
            per.byteswap()
        rows.append(
            (
                m.run_id,
                row.key,
                row.role,
                row.depth,
                row.start_s,
                len(row.per_rank),
                row.count,
                int(row.open),
                row.max,
                row.median,
                row.min,
                row.slowest,
                zlib.compress(per.tobytes(), 1),
            )
        )
    con.executemany("INSERT OR REPLACE INTO phases VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)


def _retain(con: sqlite3.Connection, fid: str) -> None:
    """Drop the oldest starts past the limits, and the per-process detail past ``KEEP_DETAIL``."""
    old = []
    for query, args in ((_OLDEST_OF, (fid, KEEP_PER_FINGERPRINT)), (_OLDEST, (KEEP_ALL,))):
        for (run_id,) in con.execute(query, args).fetchall():
            con.execute("DELETE FROM phases WHERE run_id = ?", (run_id,))
            con.execute("DELETE FROM starts WHERE run_id = ?", (run_id,))
            old.append(run_id)
    if old:
        con.execute("DELETE FROM fingerprints WHERE id NOT IN (SELECT fingerprint FROM starts)")
    for (run_id,) in con.execute(_DETAILED, (KEEP_DETAIL,)).fetchall():
        con.execute("UPDATE phases SET per_rank = NULL WHERE run_id = ?", (run_id,))
        con.execute("UPDATE starts SET labels = NULL WHERE run_id = ?", (run_id,))


_OLDEST_OF = "SELECT run_id FROM starts WHERE fingerprint = ? ORDER BY started DESC LIMIT -1 OFFSET ?"
_OLDEST = "SELECT run_id FROM starts ORDER BY started DESC LIMIT -1 OFFSET ?"
_DETAILED = "SELECT run_id FROM starts WHERE labels IS NOT NULL ORDER BY started DESC LIMIT -1 OFFSET ?"


# -- opening ---------------------------------------------------------------------------------------


def _connect(path: Path) -> sqlite3.Connection:
    """A connection to write (autocommit: transactions are ours), the file made private first, in a
    directory only this user can write (``files.check_home``): nobody else's ``-wal`` or ``-shm`` is
    read as ours."""
    try:
        files.check_home(path.parent)
        files.private_dir(path.parent)
        files.check_home(path.parent)
        why = files.not_private(path.parent)
        if why is not None:
            raise files.UnsafeDirectory(f"{why}: the history goes in a directory only this user can write")
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        except FileExistsError:
            pass
    except OSError as exc:
        raise HistoryError(
            f"cannot write {path} ({exc.strerror or exc})", "unsafe" if _unsafe(exc) else "write"
        ) from None
    _check_file(path)
    try:
        con = sqlite3.connect(path, timeout=BUSY_S, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise _error(path, exc) from None
    try:
        if con.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=NORMAL")  # WAL: a power cut may lose the last start, never corrupt
        version = con.execute("PRAGMA user_version").fetchone()[0]
        if version != SCHEMA:
            _migrate(con, path, version)
    except sqlite3.Error as exc:
        con.close()
        raise _error(path, exc) from None
    except BaseException:
        con.close()
        raise
    return con


def _migrate(con: sqlite3.Connection, path: Path, version: int) -> None:
    """Create the tables in a new database (another writer may be doing it too: re-read under the lock)."""
    if version > SCHEMA:
        raise _newer(path, version)
    _begin(con, path)
    try:
        version = con.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA:
            raise _newer(path, version)
        if version == 0:
            for statement in _DDL:
                con.execute(statement)
            con.execute(f"PRAGMA user_version = {SCHEMA}")
        con.execute("COMMIT")
    except BaseException:
        _rollback(con)
        raise


def _rollback(con: sqlite3.Connection) -> None:
    """Undo the open transaction, if SQLite has not already (it does on some errors: a full disk)."""
    try:
        if con.in_transaction:
            con.execute("ROLLBACK")
    except sqlite3.Error:
        pass


def _begin(con: sqlite3.Connection, path: Path) -> None:
    try:
        con.execute("BEGIN IMMEDIATE")  # the write lock now, waiting at most BUSY_S
    except sqlite3.OperationalError as exc:
        raise _error(path, exc) from None


def _check_file(path: Path) -> None:
    """The database is this user's regular file, in a directory nobody else may write in: SQLite
    reads the ``-wal`` and ``-shm`` it finds beside it."""
    why = files.not_private(path) or files.writable_by_others(path.parent)
    if why is None:
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                why = f"{path} is not a regular file"
        except OSError as exc:
            why = f"{path}: {exc.strerror or exc}"
    if why is not None:
        raise HistoryError(f"will not use {why}", "unsafe")


def _unsafe(exc: OSError) -> bool:
    return isinstance(exc, files.UnsafeDirectory) or exc.errno == 40  # ELOOP: a link where the file goes


def _newer(path: Path, version: int) -> HistoryError:
    return HistoryError(f"{path} has schema {version}, newer than this sglang-phasetrace's ({SCHEMA})", "newer")


def _error(path: Path, exc: sqlite3.Error) -> HistoryError:
    """What went wrong, in words, with its kind (one warning per kind)."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc)
    low = text.lower()
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in low or "busy" in low:
        return HistoryError(f"{path} stayed locked by another writer for {BUSY_S} s", "busy")
    if name.startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT")) or "not a database" in low or "malformed" in low:
        return HistoryError(f"{path} is not a usable history database ({text}; move it aside to start anew)", "corrupt")
    if name.startswith("SQLITE_FULL") or "full" in low:
        return HistoryError(f"cannot write {path} ({text})", "full")
    return HistoryError(f"cannot write {path} ({text})", "write")


def _warn(exc: HistoryError, consequence: str) -> None:
    """One warning per process and kind of problem, whether reading or writing met it first: a
    corrupt database is said once, not once by the watchdog and again as the start is recorded.
    Where it cannot be used at all (corrupt, newer, unsafe), the warning says both consequences."""
    # a full disk is one problem with the run directory's (likely the same disk): one line (``files.say_once``)
    if process_state.say_once(("files", errno.ENOSPC) if exc.kind == "full" else ("history", exc.kind)):
        if exc.kind in ("corrupt", "newer", "unsafe"):
            consequence = "not used by this process (no usual times, no start recorded)"
        log.warning("sglang-phasetrace: %s", redact_text(f"history: {exc}; {consequence}"))


# -- reading ---------------------------------------------------------------------------------------


@dataclass
class Start:
    run_id: str
    fingerprint: str
    started: float  # Unix seconds
    ended: float
    outcome: str
    total_s: float
    processes: int
    host: str

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "fingerprint": self.fingerprint,
            "started": round(self.started, 3),
            "ended": round(self.ended, 3),
            "outcome": self.outcome,
            "total_s": round(self.total_s, 3),
            "processes": self.processes,
            "host": self.host,
        }


@dataclass
class Usual:
    """A phase in the earlier starts of one fingerprint: its slowest process's time in each start
    where it ended (an open phase's time is only a lower bound: left out)."""

    phase: str
    n: int  # starts it ended in
    median: float
    p95: float
    max: float
    min: float
    last: float  # in the newest of them
    role: str
    depth: int
    start_s: float  # when it usually begins, seconds after the start began (its place in the order)

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("phase", "n", "role", "depth")}
        for k in ("median", "p95", "max", "min", "last", "start_s"):
            out[k if k == "start_s" else f"{k}_s"] = round(getattr(self, k), 6)
        return out


@dataclass
class Change:
    """A phase in the newest start against the median of the earlier ones."""

    phase: str
    latest: float
    median: float  # of the earlier starts
    n: int  # earlier starts it ended in
    depth: int = 0

    @property
    def delta(self) -> float:
        return self.latest - self.median

    @property
    def grew(self) -> bool:
        return self.latest >= self.median * GREW_RATIO and self.delta >= GREW_MIN_S

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "latest_s": round(self.latest, 6),
            "median_s": round(self.median, 6),
            "n": self.n,
            "delta_s": round(self.delta, 6),
            "grew": self.grew,
        }


@dataclass
class Launch:
    """A fingerprint with the count and time of its starts."""

    id: str
    summary: str
    fields: dict[str, Any]
    starts: int
    last: float

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "summary": self.summary, "fields": self.fields, "starts": self.starts}


def p95(values: list[float]) -> float:
    """The nearest-rank 95th percentile: a value that occurred (with 6 starts: the largest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


class History:
    """The history read back (read-only: a reader never writes, nor creates the file)."""

    def __init__(self, path: Path, con: sqlite3.Connection | None) -> None:
        self.path, self.con = path, con  # None: an empty history (a new file, no tables yet)

    @classmethod
    def open(cls, path: str | Path) -> History:
        path = Path(path)
        if not os.path.lexists(path):
            raise HistoryError(f"{path}: no history here yet (a start is recorded when it ends)", "missing")
        _check_file(path)
        uri = f"file:{quote(os.path.abspath(path))}?mode=ro"
        # A reader writes nothing: with no -wal beside it (no writer has it open), the file is all there
        # is to read, read as one that does not change, and SQLite makes no -wal nor -shm for the read.
        if not os.path.lexists(f"{path}-wal"):
            uri += "&immutable=1"
        try:
            try:
                con = sqlite3.connect(uri, uri=True, timeout=BUSY_S)
                version = con.execute("PRAGMA user_version").fetchone()[0]
            except sqlite3.OperationalError as exc:
                if "unable to open" not in str(exc):
                    raise
                # a copy in a directory we cannot write: WAL's -shm cannot be made there; nobody writes it
                con = sqlite3.connect(uri.replace("&immutable=1", "") + "&immutable=1", uri=True, timeout=BUSY_S)
                version = con.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.Error as exc:
            raise _read_error(path, exc) from None
        if version > SCHEMA:
            con.close()
            raise _newer(path, version)
        if version == 0:
            con.close()
            return cls(path, None)
        return cls(path, con)

    def close(self) -> None:
        if self.con is not None:
            self.con.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _query(self, sql: str, args: Iterable[Any] = ()) -> list[tuple]:
        if self.con is None:
            return []
        try:
            return self.con.execute(sql, tuple(args)).fetchall()
        except sqlite3.Error as exc:
            raise _read_error(self.path, exc) from None

    def launches(self) -> list[Launch]:
        """Every fingerprint, the most recently started first."""
        rows = self._query(
            "SELECT f.id, f.summary, f.fields, count(*), max(s.started) FROM fingerprints f "
            "JOIN starts s ON s.fingerprint = f.id GROUP BY f.id ORDER BY max(s.started) DESC"
        )
        return [Launch(fid, summary, _fields(fields), n, last) for fid, summary, fields, n, last in rows]

    def resolve(self, prefix: str) -> str:
        """The fingerprint id that starts with ``prefix`` (as git takes a short commit id)."""
        prefix = prefix.strip().lower()
        if not prefix or any(c not in "0123456789abcdef" for c in prefix):
            raise HistoryError(f"{prefix!r} is not a fingerprint id (hex digits)", "missing")
        found = [
            r[0] for r in self._query("SELECT id FROM fingerprints WHERE substr(id, 1, ?) = ?", (len(prefix), prefix))
        ]
        if len(found) != 1:
            what = "no fingerprint" if not found else f"{len(found)} fingerprints"
            raise HistoryError(f"{what} in {self.path} start with {prefix!r}", "missing")
        return found[0]

    def starts(self, fid: str | None = None, limit: int | None = None) -> list[Start]:
        """Starts of one fingerprint (or all), the newest first."""
        where, args = ("WHERE fingerprint = ?", [fid]) if fid else ("", [])
        rows = self._query(
            "SELECT run_id, fingerprint, started, ended, outcome, total_s, processes, host FROM starts "
            f"{where} ORDER BY started DESC LIMIT ?",
            [*args, -1 if limit is None else limit],
        )
        return [Start(*row) for row in rows]

    def _values(self, fid: str, exclude: Collection[str]) -> dict[str, list[tuple]]:
        """phase -> (run id, started, max_s, open, role, depth, start_s) per start, oldest first."""
        rows = self._query(
            "SELECT p.phase, s.run_id, s.started, p.max_s, p.open, p.role, p.depth, p.start_s FROM phases p "
            "JOIN starts s ON s.run_id = p.run_id WHERE s.fingerprint = ? ORDER BY s.started",
            (fid,),
        )
        out: dict[str, list[tuple]] = {}
        for phase, *rest in rows:
            if rest[0] not in exclude:
                out.setdefault(phase, []).append(tuple(rest))
        return out

    def usuals(self, fid: str, exclude: Collection[str] = ()) -> dict[str, Usual]:
        """Per phase of the fingerprint's starts (``exclude``: run ids left out), in the order phases
        usually begin."""
        out = {}
        for phase, got in self._values(fid, exclude).items():
            ended = [v for v in got if not v[3]]
            if not ended:
                continue
            seconds = [v[2] for v in ended]
            out[phase] = Usual(
                phase,
                len(seconds),
                statistics.median(seconds),
                p95(seconds),
                max(seconds),
                min(seconds),
                seconds[-1],
                ended[-1][4],
                min(v[5] for v in ended),
                statistics.median(v[6] for v in ended),
            )
        return dict(sorted(out.items(), key=lambda kv: kv[1].start_s))

    def trend(self, fid: str) -> tuple[Start | None, list[Change]]:
        """The newest start, and each phase it ended against the median of the earlier starts, the
        largest growth first."""
        newest = self.starts(fid, limit=1)
        if not newest:
            return None, []
        latest = newest[0].run_id
        changes = []
        for phase, got in self._values(fid, ()).items():
            mine = [v for v in got if v[0] == latest and not v[3]]
            earlier = [v[2] for v in got if v[0] != latest and not v[3]]
            if mine and earlier:
                changes.append(Change(phase, mine[0][2], statistics.median(earlier), len(earlier), mine[0][5]))
        return newest[0], sorted(changes, key=lambda c: (-c.delta, c.phase))


def grew(changes: list[Change]) -> Change | None:
    """The phase that grew (``Change.grew``), if one did: the deepest of those that grew by nearly
    the most (``EXPLAINS``), since a phase's growth is its parents' too — the step that took longer,
    not the launch root around it."""
    grown = [c for c in changes if c.grew]
    if not grown:
        return None
    most = max(c.delta for c in grown)
    return max((c for c in grown if c.delta >= EXPLAINS * most), key=lambda c: (c.depth, c.delta))


def _fields(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _read_error(path: Path, exc: sqlite3.Error) -> HistoryError:
    err = _error(path, exc)
    if err.kind in ("write", "full"):  # a reader writes nothing: say what it could not do
        return HistoryError(f"cannot read {path} ({exc})", "write")
    return err
