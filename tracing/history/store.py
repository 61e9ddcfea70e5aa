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
    launch_usuals(fingerprint, body, times)            what the watchdog reads of a launch, kept by its
                                                       writers (``_keep_usuals``): body: zlib(JSON: its
                                                       newest starts, their hosts, its phases, their
                                                       usual times); times: float64 LE, a row per phase,
                                                       a column per start (NaN: open, or not run)

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
import random
import sqlite3
import stat
import statistics
import sys
import threading
import time
import zlib
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .. import files, process_state
from ..reader.view import RunView
from ..redact import redact_text
from . import fingerprint as fingerprints
from .fingerprint import Fingerprint
from .measure import OUTCOMES, Measured, measure
from .where import ENV_HISTORY, FILE_NAME, Dsn, HistoryError, location, of_run_dir, parse

__all__ = [
    "ENV_HISTORY",
    "FILE_NAME",
    "Dsn",
    "History",
    "HistoryError",
    "Recorded",
    "location",
    "of_run_dir",
    "parse",
    "record",
]

SCHEMA = 4
KEEP_PER_FINGERPRINT, KEEP_ALL, KEEP_DETAIL = 50, 2000, 200  # one host's SQLite
FLEET_KEEP = (1000, 100_000, 2000)  # a fleet's PostgreSQL: many hosts' starts of one launch, per host
USUAL_STARTS = 50  # the newest starts of a fingerprint its usual times are taken from (SQLite keeps 50)
HOST_STARTS = 10  # and one host's newest, read beside them (``History.fleet``: ``starts_by_host``)
ALL = 2**62  # LIMIT without a limit, in both dialects
OVERALL_EVERY = 16  # recordings per check of the overall limit (``_retain``)
BUSY_S = 0.3  # the longest one wait for another writer's lock: one per record (three while the file is made)
GREW_RATIO, GREW_MIN_S = 1.25, 1.0  # a phase grew: its latest time past both the median x ratio and median + s
EXPLAINS = 0.8  # a phase that grew by this share of the most any grew accounts for it (``grew``)

log = logging.getLogger("sglang_phasetrace")

# Versioned migrations, the same in both backends (``{real}``: SQLite's REAL is PostgreSQL's float4,
# too coarse for Unix seconds): version N is reached by running MIGRATIONS[N - 1]'s statements.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        "CREATE TABLE fingerprints (id TEXT PRIMARY KEY, summary TEXT NOT NULL, fields TEXT NOT NULL)",
        "CREATE TABLE starts (run_id TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, started {real} NOT NULL, "
        "ended {real} NOT NULL, outcome TEXT NOT NULL, total_s {real} NOT NULL, processes INTEGER NOT NULL, "
        "host TEXT NOT NULL, recorded {real} NOT NULL, labels {blob})",
        "CREATE INDEX starts_by_fingerprint ON starts (fingerprint, started)",
        "CREATE INDEX starts_by_time ON starts (started)",
        "CREATE TABLE phases (run_id TEXT NOT NULL, phase TEXT NOT NULL, role TEXT NOT NULL, depth INTEGER NOT NULL, "
        "start_s {real} NOT NULL, processes INTEGER NOT NULL, count INTEGER NOT NULL, open INTEGER NOT NULL, "
        "max_s {real} NOT NULL, median_s {real} NOT NULL, min_s {real} NOT NULL, slowest TEXT NOT NULL, "
        "per_rank {blob}, PRIMARY KEY (run_id, phase)){without_rowid}",
    ),
    ("CREATE INDEX starts_by_host ON starts (fingerprint, host, started)",),  # 2: ``history --by host``
    # 3: retention finds the starts that still keep their per-process detail without reading them all
    ("CREATE INDEX starts_detailed ON starts (started) WHERE labels IS NOT NULL",),
    # 4: the watchdog's one read of a launch as its writers last worked it out (``_keep_usuals``): one row
    (
        "CREATE TABLE launch_usuals (fingerprint TEXT PRIMARY KEY, body {blob} NOT NULL, times {blob} NOT NULL)"
        "{without_rowid}",
    ),
)
assert len(MIGRATIONS) == SCHEMA
_TYPES = {
    "sqlite": {"real": "REAL", "blob": "BLOB", "without_rowid": " WITHOUT ROWID"},
    "postgresql": {"real": "DOUBLE PRECISION", "blob": "BYTEA", "without_rowid": ""},
}
_START_COLUMNS = "run_id, fingerprint, started, ended, outcome, total_s, processes, host, recorded, labels"
_PHASE_COLUMNS = (
    "run_id, phase, role, depth, start_s, processes, count, open, max_s, median_s, min_s, slowest, per_rank"
)


def _upsert(table: str, columns: str, key: str) -> str:
    """``INSERT … ON CONFLICT (key) DO UPDATE``: the same text in SQLite (3.24+) and PostgreSQL."""
    names = [c.strip() for c in columns.split(",")]
    keys_ = {k.strip() for k in key.split(",")}
    sets = ", ".join(f"{c} = excluded.{c}" for c in names if c not in keys_)
    marks = ", ".join("?" for _ in names)
    return f"INSERT INTO {table} ({columns}) VALUES ({marks}) ON CONFLICT ({key}) DO UPDATE SET {sets}"


_PUT_FINGERPRINT = _upsert("fingerprints", "id, summary, fields", "id")
_PUT_START = _upsert("starts", _START_COLUMNS, "run_id")
_PUT_PHASE = _upsert("phases", _PHASE_COLUMNS, "run_id, phase")
_PUT_USUALS = _upsert("launch_usuals", "fingerprint, body, times", "fingerprint")


class Db:
    """One connection to either backend, spoken to in one dialect: the queries are SQLite's text
    (``?`` placeholders), the same for PostgreSQL (psycopg's ``%s``)."""

    def __init__(self, con: Any, where: Path | Dsn) -> None:
        self.con, self.where = con, where
        self.pg = isinstance(where, Dsn)
        self.kind = "postgresql" if self.pg else "sqlite"

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.pg else sql

    def q(self, sql: str, args: Iterable[Any] = ()) -> list[tuple]:
        return self.con.execute(self._sql(sql), tuple(args)).fetchall()

    def run(self, sql: str, args: Iterable[Any] = ()) -> None:
        self.con.execute(self._sql(sql), tuple(args))

    def many(self, sql: str, rows: list[tuple]) -> None:
        if self.pg:
            with self.con.cursor() as cur:
                cur.executemany(self._sql(sql), rows)
        else:
            self.con.executemany(sql, rows)

    def keep(self) -> tuple[int, int, int]:
        return FLEET_KEEP if self.pg else (KEEP_PER_FINGERPRINT, KEEP_ALL, KEEP_DETAIL)

    def begin(self) -> None:
        """The write lock now: SQLite's (waiting at most ``BUSY_S``), or PostgreSQL's advisory lock
        (at most ``postgres.LOCK_S``)."""
        if self.pg:
            from . import postgres

            self.run("BEGIN")
            self.run(f"SET LOCAL lock_timeout = {int(postgres.LOCK_S * 1000)}")
            self.q(f"SELECT pg_advisory_xact_lock({postgres.LOCK_KEY})")
        else:
            self.run("BEGIN IMMEDIATE")

    def rollback(self) -> None:
        """Undo the open transaction, if the database has not already (SQLite does on some errors)."""
        try:
            if self.pg:
                self.run("ROLLBACK")
            elif self.con.in_transaction:
                self.run("ROLLBACK")
        except Exception:
            pass

    def version(self) -> int:
        if not self.pg:
            return self.q("PRAGMA user_version")[0][0]
        import psycopg

        try:  # one round trip: autocommit, so a missing table spoils no transaction
            rows = self.q("SELECT version FROM phasetrace_schema")
        except psycopg.errors.UndefinedTable:
            return 0
        return rows[0][0] if rows else 0

    def migrate(self) -> None:
        """Run the migrations this database has not had, under the write lock (another writer may
        be doing it too: read again once it is held)."""
        version = self.version()
        if version == SCHEMA:
            return
        if version > SCHEMA:
            raise _newer(self.where, version)
        self.begin()
        try:
            if self.pg:
                self.run("CREATE TABLE IF NOT EXISTS phasetrace_schema (version INTEGER NOT NULL)")
            version = self.version()
            if version > SCHEMA:
                raise _newer(self.where, version)
            for step in MIGRATIONS[version:]:
                for statement in step:
                    self.run(statement.format(**_TYPES[self.kind]))
            if self.pg:
                self.run("DELETE FROM phasetrace_schema")
                self.run("INSERT INTO phasetrace_schema VALUES (?)", (SCHEMA,))
            else:
                self.run(f"PRAGMA user_version = {SCHEMA}")
            self.run("COMMIT")
        except BaseException:
            self.rollback()
            raise

    def close(self) -> None:
        self.con.close()


@dataclass
class Recorded:
    run_id: str
    fingerprint: Fingerprint
    outcome: str
    total_s: float
    phases: int
    path: Path | Dsn
    seconds: float  # what recording took (reading the run not included)


@dataclass
class Prepared:
    """A start as the history keeps it, taken from its run (under the watchdog's lock) before it is
    written (outside it: a database that is slow holds up no one)."""

    run_path: Path
    fingerprint: Fingerprint
    measured: Measured


def prepare(run: RunView, outcome: str | None = None) -> Prepared | None:
    """The run's fingerprint and measure (``outcome``: see ``record``); None when the run does not
    say what was launched."""
    fp = fingerprints.of_run(run)
    if fp is None:
        log.debug("sglang-phasetrace: history: %s does not say what was launched; not recorded", run.path)
        return None
    m = measure(run)
    if outcome in OUTCOMES and m.outcome != "ready" and not (outcome == "interrupted" and m.outcome == "stalled"):
        m.outcome = outcome
    return Prepared(Path(run.path), fp, m)


def record(run: RunView, path: str | Path | Dsn | None = None, outcome: str | None = None) -> Recorded | None:
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
    try:
        prepared = prepare(run, outcome)
    except Exception as exc:  # a bug of ours must not reach the start
        _warn(HistoryError(f"measuring {run.path} failed ({exc!r})", "bug"), "this start is not recorded")
        return None
    return save(prepared, path) if prepared is not None else None


def save(prepared: Prepared, path: str | Path | Dsn | None = None) -> Recorded | None:
    """``record``'s writing half: never raises (one warning per process and problem)."""
    where: Path | Dsn | None = None
    try:
        where = _place(path, prepared.run_path)
        if where is None:
            return None
        return put(prepared, where)
    except HistoryError as exc:
        _warn(exc, "this start is not recorded")
    except Exception as exc:  # a bug of ours must not reach the start
        _warn(HistoryError(f"recording in {where} failed ({exc!r})", "bug"), "this start is not recorded")
    return None


def _place(path: str | Path | Dsn | None, run_path: Path) -> Path | Dsn | None:
    if isinstance(path, Dsn):
        return path
    if path is not None:
        return parse(str(path))
    return of_run_dir(run_path)


def write(run: RunView, path: str | Path | Dsn, outcome: str | None = None) -> Recorded | None:
    """``record`` that raises ``HistoryError`` (the CLI's ``--record``); None when the run does not
    say what was launched (no server arguments in any root)."""
    prepared = prepare(run, outcome)
    if prepared is None:
        return None
    return put(prepared, _place(path, Path(run.path)))


def put(prepared: Prepared, where: Path | Dsn) -> Recorded:
    """Write a prepared start, raising ``HistoryError``."""
    fp, m = prepared.fingerprint, prepared.measured
    tic = time.perf_counter()
    db = connect(where)
    try:
        try:
            db.begin()
            _insert(db, fp, m)
            _keep_usuals(db, {fp.id, *_retain(db, fp.id)})
            db.run("COMMIT")
        except BaseException:
            db.rollback()
            raise
    except HistoryError:
        raise
    except Exception as exc:
        raise _db_error(where, exc) from None
    finally:
        db.close()
    forget(fp.id)  # what the watchdog's cache said of this fingerprint is out of date
    return Recorded(m.run_id, fp, m.outcome, m.total_s, len(m.phases), where, time.perf_counter() - tic)


@dataclass(eq=False)
class Memory:
    """What this process remembers of the history (``process_state.STATE.history``: a forked
    child starts without it): ``live``'s answers per (database, fingerprint, runs left out), and
    ``verdicts.usual``'s fingerprint per run directory."""

    usuals: dict[tuple[str, str, frozenset[str], str | None], Fleet] = field(default_factory=dict)
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


def _insert(db: Db, fp: Fingerprint, m: Measured) -> None:
    """The start, upserted by its run id (recording it again replaces it): its phases first gone."""
    db.run("DELETE FROM phases WHERE run_id = ?", (m.run_id,))
    db.run(_PUT_FINGERPRINT, (fp.id, fp.summary, fingerprints.canonical(fp.fields)))
    labels = m.labels
    db.run(
        _PUT_START,
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
                zlib.compress(_little(per), 1),
            )
        )
    if rows:
        db.many(_PUT_PHASE, rows)


def _retain(db: Db, fid: str) -> set[str]:
    """Drop the oldest starts past the limits, and the per-process detail past the newest few; the
    other fingerprints whose starts were dropped (their usual times are worked out again)."""
    per_fingerprint, overall, detail = db.keep()
    old = [run_id for (run_id,) in db.q(_OLDEST_OF, (fid, ALL, per_fingerprint))]
    for run_id in old:
        _drop(db, run_id)
    # the whole history counted at one recording in ``OVERALL_EVERY`` (a count reads every start's
    # index entry: 5 ms at 100 000), so it may pass its limit by a few dozen starts in between
    excess = db.q("SELECT count(*) FROM starts")[0][0] - overall if _overall_turn() else 0
    others = set()
    for run_id, of in db.q(_OLDEST, (excess,)) if excess > 0 else ():
        _drop(db, run_id)
        old.append(run_id)
        others.add(of)
    if old:
        db.run("DELETE FROM fingerprints WHERE id NOT IN (SELECT fingerprint FROM starts)")
    for (run_id,) in db.q(_DETAILED, (ALL, detail)):
        db.run("UPDATE phases SET per_rank = NULL WHERE run_id = ?", (run_id,))
        db.run("UPDATE starts SET labels = NULL WHERE run_id = ?", (run_id,))
    return others


def _keep_usuals(db: Db, fids: Iterable[str]) -> None:
    """Work out again, in the writer's transaction, what the watchdog reads of each launch (its
    newest ``USUAL_STARTS`` starts' usual times and per-host times: ``History.fleet``) and keep it as
    one row, so that the read is that row, not their thousands of phase rows; a launch whose starts
    are all gone loses its row."""
    history = History(db.where, db)
    for fid in fids:
        values = history._values(fid, ())
        if not values:
            db.run("DELETE FROM launch_usuals WHERE fingerprint = ?", (fid,))
            continue
        runs = sorted({(v[1], v[0], v[7]) for got in values.values() for v in got})  # (started, run id, host)
        column = {run_id: i for i, (_, run_id, _) in enumerate(runs)}
        # each phase's ended times, one per start in ``runs``' order (NaN: open or not run), as float64 LE
        times = array.array("d", [math.nan]) * (len(values) * len(runs))
        for k, got in enumerate(values.values()):
            for v in got:
                if not v[3]:
                    times[k * len(runs) + column[v[0]]] = v[2]
        body = {
            "runs": [run_id for _, run_id, _ in runs],
            "hosts": [host for _, _, host in runs],
            "phases": list(values),
            "usuals": [[getattr(u, f.name) for f in fields(Usual)] for u in _usuals(values).values()],
        }
        db.run(_PUT_USUALS, (fid, zlib.compress(json.dumps(body).encode(), 1), _little(times)))


def _little(values: array.array) -> bytes:
    """``values`` as stored: little-endian, whichever host wrote them (a fleet's hosts may differ)."""
    if sys.byteorder == "little":
        return values.tobytes()
    swapped = array.array(values.typecode, values)
    swapped.byteswap()
    return swapped.tobytes()


def _from_little(typecode: str, data: bytes) -> array.array:
    """What ``_little`` stored, in this host's order."""
    values = array.array(typecode)
    values.frombytes(data)
    if sys.byteorder != "little":
        values.byteswap()
    return values


def _overall_turn() -> bool:
    """This recording checks the overall limit: one in ``OVERALL_EVERY``, at random."""
    return OVERALL_EVERY <= 1 or random.randrange(OVERALL_EVERY) == 0


def _drop(db: Db, run_id: str) -> None:
    db.run("DELETE FROM phases WHERE run_id = ?", (run_id,))
    db.run("DELETE FROM starts WHERE run_id = ?", (run_id,))


_OLDEST_OF = "SELECT run_id FROM starts WHERE fingerprint = ? ORDER BY started DESC LIMIT ? OFFSET ?"
_OLDEST = "SELECT run_id, fingerprint FROM starts ORDER BY started LIMIT ?"
_DETAILED = "SELECT run_id FROM starts WHERE labels IS NOT NULL ORDER BY started DESC LIMIT ? OFFSET ?"
# a host's newest starts of a launch, their phases' times (oldest first, as ``History._values`` orders them)
_HOST_TIMES = (
    "SELECT s.run_id, p.phase, p.max_s, p.open FROM (SELECT run_id, started FROM starts "
    "WHERE fingerprint = ? AND host = ? ORDER BY started DESC LIMIT ?) s "
    "JOIN phases p ON p.run_id = s.run_id ORDER BY s.started, s.run_id"
)


# -- opening ---------------------------------------------------------------------------------------


def connect(where: Path | Dsn) -> Db:
    """A connection to write, its schema brought up to date: PostgreSQL's (``postgres.connect``), or
    SQLite's (``_connect``)."""
    if isinstance(where, Dsn):
        from . import postgres

        db = Db(postgres.connect(where), where)
        try:
            db.migrate()
        except HistoryError:
            db.close()
            raise
        except Exception as exc:
            db.close()
            raise postgres.error(where, exc) from None
        return db
    return Db(_connect(where), where)


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
        Db(con, path).migrate()
    except sqlite3.Error as exc:
        con.close()
        raise _error(path, exc) from None
    except BaseException:
        con.close()
        raise
    return con


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


def _newer(where: Path | Dsn, version: int) -> HistoryError:
    return HistoryError(f"{where} has schema {version}, newer than this sglang-phasetrace's ({SCHEMA})", "newer")


def _db_error(where: Path | Dsn, exc: Exception) -> HistoryError:
    if isinstance(where, Dsn):
        from . import postgres

        return postgres.error(where, exc)
    if isinstance(exc, sqlite3.Error):
        return _error(where, exc)
    raise exc


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
    Where it cannot be used at all (corrupt, newer, unsafe, refused), the warning says both
    consequences."""
    # a full disk is one problem with the run directory's (likely the same disk): one line (``files.say_once``)
    if process_state.say_once(("files", errno.ENOSPC) if exc.kind == "full" else ("history", exc.kind)):
        if exc.kind in ("corrupt", "newer", "unsafe", "refused"):
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


@dataclass
class Fleet:
    """A launch's earlier starts as the watchdog keeps them: ``usuals`` (every host's), and per
    phase, host -> the phase's times there (ended only)."""

    usuals: dict[str, Usual] = field(default_factory=dict)
    seconds: dict[str, dict[str, list[float]]] = field(default_factory=dict)


class History:
    """The history read back (read-only: a reader never writes, nor creates the file or tables)."""

    def __init__(self, path: Path | Dsn, db: Db | None, version: int = SCHEMA) -> None:
        self.path, self.db = path, db  # None: an empty history (a new file, no tables yet)
        self.version = version  # its schema's: an older one is read as it is

    @classmethod
    def open(cls, where: str | Path | Dsn) -> History:
        if isinstance(where, Dsn):
            return cls._open_pg(where)
        if not isinstance(where, Path):
            where = parse(str(where))
            if isinstance(where, Dsn):
                return cls._open_pg(where)
        path = where
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
                con = sqlite3.connect(uri, uri=True, timeout=BUSY_S, check_same_thread=False)
                version = con.execute("PRAGMA user_version").fetchone()[0]
            except sqlite3.OperationalError as exc:
                if "unable to open" not in str(exc):
                    raise
                # a copy in a directory we cannot write: WAL's -shm cannot be made there; nobody writes it
                still = uri.replace("&immutable=1", "") + "&immutable=1"
                con = sqlite3.connect(still, uri=True, timeout=BUSY_S, check_same_thread=False)
                version = con.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.Error as exc:
            raise _read_error(path, exc) from None
        return cls._checked(Db(con, path), version)

    @classmethod
    def _open_pg(cls, dsn: Dsn) -> History:
        from . import postgres

        db = Db(postgres.connect(dsn), dsn)
        try:
            version = db.version()
        except Exception as exc:
            db.close()
            raise postgres.error(dsn, exc) from None
        return cls._checked(db, version)

    @classmethod
    def _checked(cls, db: Db, version: int) -> History:
        """An older schema is read as it is (every query reads what version 1 has); a newer one is
        refused; none yet is an empty history."""
        if version > SCHEMA:
            db.close()
            raise _newer(db.where, version)
        if version == 0:
            db.close()
            return cls(db.where, None)
        return cls(db.where, db, version)

    @property
    def con(self) -> Any:
        """The connection itself (tests, ``export``): SQLite's or psycopg's; None when empty."""
        return self.db.con if self.db is not None else None

    def close(self) -> None:
        if self.db is not None:
            self.db.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _query(self, sql: str, args: Iterable[Any] = ()) -> list[tuple]:
        if self.db is None:
            return []
        try:
            return self.db.q(sql, args)
        except sqlite3.Error as exc:
            raise _read_error(self.path, exc) from None
        except Exception as exc:
            if isinstance(self.path, Dsn):
                from . import postgres

                raise postgres.error(self.path, exc) from None
            raise

    def launches(self) -> list[Launch]:
        """Every fingerprint, the most recently started first."""
        rows = self._query(
            "SELECT f.id, f.summary, f.fields, count(*), max(s.started) FROM fingerprints f "
            "JOIN starts s ON s.fingerprint = f.id GROUP BY f.id, f.summary, f.fields ORDER BY max(s.started) DESC"
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
            [*args, ALL if limit is None else limit],
        )
        return [Start(*row) for row in rows]

    def _values(
        self, fid: str, exclude: Collection[str], limit: int = USUAL_STARTS, host: str | None = None
    ) -> dict[str, list[tuple]]:
        """phase -> (run id, started, max_s, open, role, depth, start_s, host) per start, oldest
        first, of the fingerprint's newest ``limit`` starts (``host``: that host's only). The cost is
        that of those starts' phases, whatever the history's size (``starts_by_fingerprint``,
        ``starts_by_host``)."""
        on_host, args = ("AND host = ? ", [fid, host, limit]) if host is not None else ("", [fid, limit])
        starts = self._query(
            f"SELECT run_id, started, host FROM starts WHERE fingerprint = ? {on_host}ORDER BY started DESC LIMIT ?",
            args,
        )
        when = {run_id: (started, on) for run_id, started, on in starts if run_id not in exclude}
        rows = []
        ids = list(when)
        for at in range(0, len(ids), 500):  # by their keys: an index scan in either database, stale statistics or not
            chunk = ids[at : at + 500]
            rows += self._query(
                "SELECT phase, run_id, max_s, open, role, depth, start_s FROM phases "
                f"WHERE run_id IN ({', '.join('?' for _ in chunk)})",
                chunk,
            )
        rows.sort(key=lambda r: (when[r[1]][0], r[1]))
        out: dict[str, list[tuple]] = {}
        for phase, run_id, max_s, is_open, role, depth, start_s in rows:
            started, on = when[run_id]
            out.setdefault(phase, []).append((run_id, started, max_s, is_open, role, depth, start_s, on))
        return out

    def usuals(self, fid: str, exclude: Collection[str] = (), host: str | None = None) -> dict[str, Usual]:
        """Per phase of the fingerprint's starts (``exclude``: run ids left out; ``host``: that
        host's starts only), in the order phases usually begin."""
        values = self._values(fid, exclude)
        if host is not None:
            values = {phase: [v for v in got if v[7] == host] for phase, got in values.items()}
        return _usuals(values)

    def fleet(self, fid: str, exclude: Collection[str] = (), host: str | None = None) -> Fleet:
        """The fingerprint's ``usuals`` (its newest ``USUAL_STARTS`` starts), and each phase's times
        per host in them and in ``host``'s newest ``HOST_STARTS`` (what ``history.hosts`` judges
        that host by, on demand): what the watchdog reads once per process. Read from the row its
        writers keep (``_keep_usuals``) and ``host``'s newest starts not in it (their times only);
        worked out from the phases themselves where there is no such row (an older schema, a launch
        not recorded since the upgrade) or it holds a start left out (the one in progress)."""
        kept = self._kept(fid)
        if kept is None or not kept[0].isdisjoint(exclude):
            return self._worked_out(fid, exclude, host)
        runs, usuals, seconds = kept
        if host is not None:
            for run_id, phase, max_s, is_open in self._query(_HOST_TIMES, (fid, host, HOST_STARTS)):
                if run_id in exclude:
                    continue
                per = seconds.setdefault(phase, {})
                if not is_open and run_id not in runs:
                    per.setdefault(host, []).append(max_s)
        return Fleet(usuals, seconds)

    def _kept(self, fid: str) -> tuple[set[str], dict[str, Usual], dict[str, dict[str, list[float]]]] | None:
        """The launch's row kept by its writers: its run ids, usual times and per-host times."""
        if self.version < 4:
            return None
        rows = self._query("SELECT body, times FROM launch_usuals WHERE fingerprint = ?", (fid,))
        if not rows:
            return None
        body = json.loads(zlib.decompress(rows[0][0]))
        times = _from_little("d", rows[0][1])
        usuals = {row[0]: Usual(*row) for row in body["usuals"]}
        hosts, width, flat = body["hosts"], len(body["runs"]), times.tolist()
        seconds: dict[str, dict[str, list[float]]] = {}
        for k, phase in enumerate(body["phases"]):
            per = seconds[phase] = {}
            for host, t in zip(hosts, flat[k * width : (k + 1) * width], strict=True):
                if t == t:  # not NaN: ended in that start
                    per.setdefault(host, []).append(t)
        return set(body["runs"]), usuals, seconds

    def _worked_out(self, fid: str, exclude: Collection[str], host: str | None) -> Fleet:
        """``fleet`` from the phases of the launch's newest starts (≈ 3600 rows at 60 phases)."""
        values = self._values(fid, exclude)
        seen = {v[0] for got in values.values() for v in got}
        mine = self._values(fid, exclude, HOST_STARTS, host) if host is not None else {}
        seconds: dict[str, dict[str, list[float]]] = {}
        for phase in values.keys() | mine.keys():
            per = seconds[phase] = {}
            for v in [*values.get(phase, ()), *(v for v in mine.get(phase, ()) if v[0] not in seen)]:
                if not v[3]:
                    per.setdefault(v[7], []).append(v[2])
        return Fleet(_usuals(values), seconds)

    def by_host(self, fid: str, exclude: Collection[str] = ()) -> dict[str, dict[str, Usual]]:
        """host -> its ``usuals`` (the fingerprint's starts on that host), the fleet's under ``""``."""
        values = self._values(fid, exclude, ALL)
        per_host: dict[str, dict[str, list[tuple]]] = {}
        for phase, got in values.items():
            for v in got:
                per_host.setdefault(v[7], {}).setdefault(phase, []).append(v)
        return {"": _usuals(values), **{h: _usuals(per_host[h]) for h in sorted(per_host)}}

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


def _usuals(values: dict[str, list[tuple]]) -> dict[str, Usual]:
    out = {}
    for phase, got in values.items():
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


def check(where: Path | Dsn | None = None) -> tuple[bool, str]:
    """Whether the history can be read, in one line (``phasetrace doctor``): where it is (a DSN
    without its password), its backend and its starts; what is wrong otherwise. Bounded as the
    watchdog's read is."""
    try:
        where = location() if where is None else where
    except HistoryError as exc:
        return False, redact_text(str(exc))
    if where is None:
        return True, f"off ({ENV_HISTORY}=0)"
    kind = "PostgreSQL" if isinstance(where, Dsn) else "SQLite"

    def count() -> int:
        with History.open(where) as history:
            return len(history._query("SELECT run_id FROM starts"))

    try:
        if isinstance(where, Dsn):
            from . import postgres

            n = postgres.within(postgres.READ_WAIT_S * 2, f"the database at {where.host}", count)
        else:
            n = count()
    except HistoryError as exc:
        if exc.kind == "missing":
            return True, f"{where} ({kind}): no start recorded yet"
        return False, redact_text(f"{where} ({kind}): {exc}")
    return True, f"{where} ({kind}): {n} start{'s' if n != 1 else ''}"


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
