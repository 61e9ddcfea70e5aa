"""Where the history of starts is: one SQLite file per base directory, in a directory only this user
can write (``files.home_of``: in ``/tmp``, its private subdirectory), so nobody else can plant the
database or SQLite's ``-wal``/``-shm`` beside it; or a PostgreSQL database a fleet shares
(``$SGLANG_PHASETRACE_HISTORY`` = ``postgresql://…``, or a libpq ``service=NAME``), since every pod
starts on a fresh filesystem and SQLite's WAL does not work across hosts. Stdlib, ``keys``,
``files`` and ``redact`` only, so a launcher asks it before anything heavier is imported; it never
connects (the keeper's thread and the readers do)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from .. import files, keys
from ..redact import redact_text

ENV_HISTORY = keys.ENV_HISTORY  # a path, a PostgreSQL DSN, or "0": no history
FILE_NAME = "history.sqlite"

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # ``postgresql:`` ``http:`` ``C:`` alike: not a path
_CONNINFO = re.compile(r"^\s*\w+\s*=")  # libpq's ``key=value ...`` (``service=fleet``, ``host=db dbname=x``)


class HistoryError(Exception):
    """The history cannot be read or written; the message names the path (or the database's host,
    never its password) and why. ``kind``: ``busy``, ``corrupt``, ``full``, ``newer``, ``unsafe``,
    ``missing``, ``refused`` (a setting that is neither a path nor a DSN), ``down`` (a database
    server that did not answer, or refused us) or ``write``."""

    def __init__(self, message: str, kind: str = "write") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Dsn:
    """A PostgreSQL history. ``str()`` is what may be shown (no password: ``redact``); the
    connection string itself is only in ``conninfo``."""

    conninfo: str = field(repr=False)

    def __str__(self) -> str:
        return shown(self.conninfo)

    __repr__ = __str__

    @property
    def host(self) -> str:
        """The database's host (and port), as a warning names it."""
        if "://" in self.conninfo:
            try:
                parts = urlsplit(self.conninfo)
                return parts.netloc.rpartition("@")[2] or "localhost"
            except ValueError:
                return "?"
        pairs = dict(re.findall(r"(\w+)\s*=\s*'?([^\s']*)'?", self.conninfo))
        host = pairs.get("host") or pairs.get("hostaddr")
        host = host or (f"service {pairs['service']}" if "service" in pairs else "")
        return host + (f":{pairs['port']}" if "port" in pairs else "") or "localhost"


def shown(text: str) -> str:
    """A DSN as it may be shown: its password gone, in either form (``password=``, ``user:pw@``)."""
    return redact_text(text)


Where = Path | Dsn


def off() -> bool:
    """``SGLANG_PHASETRACE_HISTORY=0``: no history (asked without touching a filesystem)."""
    return os.environ.get(ENV_HISTORY, "").strip().lower() in ("0", "off", "false", "no")


def parse(value: str) -> Where:
    """``value`` as a history's place: a PostgreSQL DSN (``postgresql://`` or ``postgres://``, or
    libpq's ``key=value`` form), else a file path. Anything else that looks like a URL or a DSN
    (``postgresql:/u:p@h``, ``mysql://``, ``sqlite:///x``) is refused, so it never becomes a
    directory named after a password."""
    text = value.strip()
    low = text.lower()
    if low.startswith(("postgresql://", "postgres://")):
        return Dsn(text)
    if _CONNINFO.match(text) and not text.startswith(("/", ".")):
        return Dsn(text)
    if _SCHEME.match(text) or "://" in text:
        raise HistoryError(
            f"{ENV_HISTORY}={shown(text)} is neither a path nor a PostgreSQL DSN this sglang-phasetrace understands "
            "(a postgresql:// URL, or service=NAME); the history is not used",
            "refused",
        )
    return Path(text)


def location(base: str | Path | None = None) -> Where | None:
    """Where the history is: ``$SGLANG_PHASETRACE_HISTORY`` (None when it is ``0``; a DSN: a
    ``Dsn``; a value that is neither: ``HistoryError``, kind ``refused``), else ``history.sqlite``
    in ``base``, else in ``$SGLANG_PHASETRACE_DIR`` (default ``./phasetrace-runs``); in a base others
    may write in, in this user's private subdirectory of it (``files.home_of``)."""
    if off():
        return None
    chosen = os.environ.get(ENV_HISTORY, "").strip()
    if chosen:
        return parse(chosen)
    if base is None:
        base = os.environ.get(keys.ENV_BASE_DIR) or keys.DEFAULT_BASE_DIR
    return files.home_of(base) / FILE_NAME


def of_run_dir(run_dir: str | Path) -> Where | None:
    """The history a run belongs to: its base directory's (the run directory's parent), unless
    ``$SGLANG_PHASETRACE_HISTORY`` says otherwise."""
    return location(Path(run_dir).parent)
