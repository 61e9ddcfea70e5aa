"""The local journal: one append-only JSON-lines file per process, written as things happen.

Each record is one ``os.write`` of one line on an ``O_APPEND`` descriptor: no user-space buffer,
so whatever was written survives ``kill -9``. A phase that never ends leaves its ``begin`` record
and no ``end`` record; readers treat that as "still running, or died there".

Record schema (version 1; every record has ``kind`` and ``t``, Unix time in integer ns):

``process``   first line: ``v``, ``pid``, ``ppid``, ``host``, ``run_id``, ``boot_t``, ``resource``
``identity``  who this process is, once known: ``label`` (``tp1``, ``launcher``), ``role``, ``attrs``
``begin``     a phase started: ``span``, ``parent`` (16 hex or null), ``trace`` (32 hex), ``name``,
              ``attrs``, ``thread``
``event``     inside a phase: ``span``, ``name``, ``attrs``
``end``       a phase ended: ``span``, ``status`` (``ok``/``error``/``incomplete``), ``attrs`` (set
              after begin), ``error`` (``type``, ``message``, ``stack``) when it failed
``heartbeat`` liveness and progress of the process (see ``tracing.heartbeat``)
``collective`` an init collective entered or left: ``edge`` (enter/exit), ``op``, ``group``, ``seq``
              (per-group sequence number), ``span`` (the phase it ran in), ``dur_s`` on exit
``diagnosis`` a stall the watchdog found (see ``tracing.watchdog``)
``warning``   something we could not do (an unresolved patch target, a failed exporter): ``message``
"""

from __future__ import annotations

import json
import os
import threading

try:  # several times faster on large runs; SGLang installs it anyway
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    _loads = json.loads
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
KINDS = frozenset({"process", "identity", "begin", "event", "end", "heartbeat", "collective", "diagnosis", "warning"})


def _default(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)


def dumps(record: dict) -> str:
    return json.dumps(record, separators=(",", ":"), default=_default, ensure_ascii=False)


class JournalWriter:
    """Appends records to one file; thread-safe; never raises into the caller's code path."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self._lock = threading.RLock()  # a signal handler may write while the main thread does

    def write(self, record: dict) -> None:
        data = (dumps(record) + "\n").encode("utf-8", "replace")
        with self._lock:
            if self._fd < 0:
                return
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


class JournalTail:
    """Reads one journal incrementally (the watchdog polls it) or whole (the CLI).

    A last line without its newline is a write in progress, or one cut by ``kill -9``: a live read
    leaves it for next time; a ``final`` read parses it, and reports it if it is broken.
    Every unusable line is reported once, as ``file:line: why``, and the rest is used.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.lines = 0
        self.problems: list[str] = []
        self.unknown_kinds: set[str] = set()

    def read(self, final: bool = False) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = len(data) if final else data.rfind(b"\n") + 1
        lines = data[:end].splitlines()
        self.offset += end
        first = self.lines + 1
        self.lines += len(lines)
        records = _parse_all(lines)  # fast path: one parse for the whole chunk
        if records is not None:
            return records
        parsed = (parse_line(raw, self.path, n, self.problems, self.unknown_kinds)
                  for n, raw in enumerate(lines, first))
        return [r for r in parsed if r is not None]  # slow path: line by line, naming each bad one


def _parse_all(lines: list[bytes]) -> list[dict] | None:
    """Every line a well-formed record of a known kind: all records; else None (go line by line)."""
    try:
        records = _loads(b"[" + b",".join(line for line in lines if line.strip()) + b"]")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    for r in records:
        if type(r) is not dict or r.get("kind") not in KINDS or type(r.get("t")) is not int:
            return None
    return records


def read_journal(path: Path) -> tuple[list[dict], list[str]]:
    """All records of a finished (or abandoned) journal, and its problems as ``file:line: why``."""
    tail = JournalTail(path)
    return tail.read(final=True), tail.problems


def parse_line(raw: bytes, path: Path, lineno: int, problems: list[str],
               unknown: set[str] | None = None) -> dict | None:
    if not raw.strip():
        return None
    try:
        record = _loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:  # orjson's error subclasses it
        problems.append(f"{path}:{lineno}: not a JSON record ({exc.__class__.__name__}: {exc})")
        return None
    if not isinstance(record, dict) or not isinstance(record.get("kind"), str) or not isinstance(record.get("t"), int):
        problems.append(f"{path}:{lineno}: not a journal record (needs a string 'kind' and an integer 't')")
        return None
    if record["kind"] not in KINDS:  # a newer writer's kind: skipped, said once per file and kind
        if unknown is not None and record["kind"] not in unknown:
            unknown.add(record["kind"])
            problems.append(f"{path}:{lineno}: unknown record kind {record['kind']!r} skipped "
                            "(later ones in this file not reported)")
        return None
    return record
