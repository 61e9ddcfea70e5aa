"""The history in PostgreSQL (``SGLANG_PHASETRACE_HISTORY=postgresql://…`` or ``service=NAME``),
through psycopg 3 (``pip install 'sglang-phasetrace[postgresql]'``): where a fleet keeps shared
state, since every pod starts on a fresh filesystem. Imported only by whoever connects (the
keeper's thread, the watchdog's read, the CLI), never on a start's path.

Bounded: libpq rounds ``connect_timeout`` below 2 s up to 2 s, so a reader waits for its answer at
most ``READ_WAIT_S`` itself (``within``: the connection is made on a daemon thread, left to end on
its own); every statement runs under ``STATEMENT_S``; a writer waits for the others at most
``LOCK_S`` (writers take one advisory lock per transaction, so 64 nodes recording in the same
second each get their turn, and nothing is lost or written twice). Errors name the host, never the
password (``where.Dsn``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .where import Dsn, HistoryError

CONNECT_S = 2  # libpq's least connect_timeout (it rounds 1 up to 2)
READ_WAIT_S = 1.0  # the longest a reader (the watchdog's pass) waits for the database's answer
STATEMENT_S = 10.0  # the longest any statement runs
LOCK_S = 10.0  # the longest a writer waits for the others (its turn at the advisory lock)
LOCK_KEY = 0x5067_5472_6163  # "PgTrac": the writers' advisory lock
T = TypeVar("T")


def connect(dsn: Dsn) -> Any:
    """A connection in autocommit (transactions are ours), bounded by ``CONNECT_S`` (unless the DSN
    sets its own ``connect_timeout``) and ``STATEMENT_S``; ``HistoryError`` (kind ``down``) if the
    server is not there, does not answer or refuses us."""
    try:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        raise HistoryError(f"{dsn} needs psycopg 3 (pip install 'sglang-phasetrace[postgresql]')", "unsafe") from None
    try:
        given = conninfo_to_dict(dsn.conninfo)
    except psycopg.Error as exc:
        raise HistoryError(f"{dsn} is not a DSN libpq understands ({_first_line(exc)})", "refused") from None
    extra: dict[str, Any] = {"application_name": "sglang-phasetrace"}
    if "connect_timeout" not in given:
        extra["connect_timeout"] = CONNECT_S
    # the statement bound set as the connection starts (no round trip of its own), after the DSN's own options
    extra["options"] = f"{given.get('options', '')} -c statement_timeout={int(STATEMENT_S * 1000)}".strip()
    try:
        return psycopg.connect(dsn.conninfo, autocommit=True, **extra)
    except psycopg.Error as exc:
        raise HistoryError(f"the database at {dsn.host} cannot be used ({_first_line(exc)})", "down") from None


def error(dsn: Dsn, exc: Exception) -> HistoryError:
    """A psycopg error in words, with its kind, naming the host."""
    import psycopg

    text = _first_line(exc)
    if isinstance(exc, psycopg.errors.LockNotAvailable | psycopg.errors.QueryCanceled):
        return HistoryError(f"the database at {dsn.host} stayed busy ({text})", "busy")
    if isinstance(exc, psycopg.errors.DiskFull):
        return HistoryError(f"the database at {dsn.host} is full ({text})", "full")
    if isinstance(exc, psycopg.OperationalError):
        return HistoryError(f"the database at {dsn.host} cannot be used ({text})", "down")
    return HistoryError(f"the database at {dsn.host}: {text}", "write")


def _first_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def within(seconds: float, what: str, fn: Callable[[], T]) -> T:
    """``fn()`` on a daemon thread, its answer within ``seconds``, else ``HistoryError`` (kind
    ``down``) naming ``what``; the thread is left to finish (and close what it opened) on its own."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def work() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc
        done.set()

    threading.Thread(target=work, name="phasetrace-history-read", daemon=True).start()
    if not done.wait(seconds):
        raise HistoryError(f"{what} did not answer within {seconds:g} s", "down")
    if "error" in box:
        raise box["error"]
    return box["value"]
