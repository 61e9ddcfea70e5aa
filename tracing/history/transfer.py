"""``phasetrace history export`` / ``import``: a history moved between its two backends (SQLite to a
fleet's PostgreSQL, and back) and a JSON-lines file for sites that cannot reach one another. One
line per start: its fingerprint, its row and its phases' rows, the per-process detail in base64.
Importing upserts by run id, so importing the same file twice, or a history into itself, adds
nothing."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .store import (
    _PHASE_COLUMNS,
    _PUT_FINGERPRINT,
    _PUT_PHASE,
    _PUT_START,
    _START_COLUMNS,
    Db,
    History,
    _db_error,
    _keep_usuals,
    connect,
)
from .where import Dsn, HistoryError

START = [c.strip() for c in _START_COLUMNS.split(",")]
PHASE = [c.strip() for c in _PHASE_COLUMNS.split(",")]
BLOBS = {"labels", "per_rank"}
BATCH = 500  # starts read or written per statement batch


def _json(row: tuple, names: list[str]) -> dict[str, Any]:
    return {
        n: base64.b64encode(bytes(v)).decode() if n in BLOBS and v is not None else v
        for n, v in zip(names, row, strict=True)
    }


def _row(doc: dict[str, Any], names: list[str]) -> tuple:
    return tuple(base64.b64decode(doc[n]) if n in BLOBS and doc.get(n) is not None else doc.get(n) for n in names)


def documents(history: History) -> Iterator[dict[str, Any]]:
    """Every start in ``history``, oldest first, as one JSON-able document each."""
    prints = {
        fid: (summary, fields)
        for fid, summary, fields in history._query("SELECT id, summary, fields FROM fingerprints")
    }
    starts = history._query(f"SELECT {_START_COLUMNS} FROM starts ORDER BY started")
    for at in range(0, len(starts), BATCH):
        batch = starts[at : at + BATCH]
        ids = [s[0] for s in batch]
        marks = ", ".join("?" for _ in ids)
        phases: dict[str, list[dict[str, Any]]] = {}
        for row in history._query(f"SELECT {_PHASE_COLUMNS} FROM phases WHERE run_id IN ({marks})", ids):
            phases.setdefault(row[0], []).append(_json(row, PHASE))
        for s in batch:
            summary, fields = prints.get(s[1], ("?", "{}"))
            yield {
                "fingerprint": {"id": s[1], "summary": summary, "fields": json.loads(fields)},
                "start": _json(s, START),
                "phases": phases.get(s[0], []),
            }


def read_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The documents of a JSON-lines file; a line that is not one: ``HistoryError`` naming its number."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                if not isinstance(doc, dict) or not {"fingerprint", "start", "phases"} <= doc.keys():
                    raise ValueError("not a start (fingerprint, start, phases)")
            except ValueError as exc:
                raise HistoryError(f"{path}:{n}: {exc}; nothing after it imported", "corrupt") from None
            yield doc


def write_lines(docs: Iterable[dict[str, Any]], path: Path) -> int:
    """``docs`` to a new private JSON-lines file; how many."""
    import os

    n = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n")
            n += 1
    return n


def load(docs: Iterable[dict[str, Any]], where: Path | Dsn) -> int:
    """Upsert ``docs`` into the history at ``where`` (made, and migrated, if need be); how many."""
    db = connect(where)
    n = 0
    try:
        batch: list[dict[str, Any]] = []
        for doc in docs:
            batch.append(doc)
            if len(batch) >= BATCH:
                n += _put(db, batch)
                batch = []
        if batch:
            n += _put(db, batch)
        if db.pg:  # fresh statistics for the planner after a bulk load (autovacuum would, later)
            db.run("ANALYZE starts")
            db.run("ANALYZE phases")
    finally:
        db.close()
    return n


def _put(db: Db, batch: list[dict[str, Any]]) -> int:
    from .fingerprint import canonical

    try:
        db.begin()
        for doc in batch:
            fp, start = doc["fingerprint"], doc["start"]
            db.run("DELETE FROM phases WHERE run_id = ?", (start["run_id"],))
            db.run(_PUT_FINGERPRINT, (fp["id"], fp.get("summary", "?"), canonical(fp.get("fields") or {})))
            db.run(_PUT_START, _row(start, START))
            rows = [_row(p, PHASE) for p in doc["phases"]]
            if rows:
                db.many(_PUT_PHASE, rows)
        # what the watchdog reads of their launches, kept as a recording keeps it, in the same transaction
        _keep_usuals(db, {doc["fingerprint"]["id"] for doc in batch})
        db.run("COMMIT")
    except HistoryError:
        db.rollback()
        raise
    except Exception as exc:
        db.rollback()
        raise _db_error(db.where, exc) from None
    return len(batch)
