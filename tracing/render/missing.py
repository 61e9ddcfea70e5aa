"""What a run's files lack, in words: the journal records its processes could not write (a full
disk), as each says in its status file (``journal_unwritten``, rewritten in place when no new file
fits), the journals that hold no record yet, and a filesystem with no room left.

A process keeps such records in memory and writes them once it can (``journal.writer``); one that
ended first took them with it. Readers judge from the journals, so a verdict on a process that
lacks records may be wrong: these lines say so, beside it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

from ..journal.layout import JOURNAL_DIR
from ..reader.view import RunView
from .units import size


def missing(view: RunView, alive: Mapping[tuple[str, int], bool] | None = None) -> list[str]:
    """One line per process whose journal lacks records, per empty journal, per full filesystem.
    ``alive``: (host, pid) -> running, for this host's processes (a process not in it: unknown)."""
    lines = []
    for proc in view.processes:
        if proc.remote is not None:  # another node's: its own status says
            continue
        beat = view.status_file(proc)
        trouble = (beat or {}).get("journal_unwritten")
        if not isinstance(trouble, dict):
            continue
        since = trouble.get("since")
        when = time.strftime("%H:%M:%S", time.localtime(since / 1e9)) if isinstance(since, int) else "?"
        held, dropped = trouble.get("held") or 0, trouble.get("dropped") or 0
        running = (alive or {}).get((proc.host, proc.pid))
        fate = {
            True: "held in its memory, written once there is room",
            False: "lost: it ended before they could be written",
            None: "held in its memory while it runs",
        }[running]
        lost = f", {dropped} more dropped" if dropped else ""
        lines.append(
            f"{proc.label or proc.pid}: its journal lacks {held} records since {when} "
            f"({trouble.get('error') or 'not written'}){lost}: {fate}"
        )
    unreadable = {p.path for p in view.processes if p.unreadable is not None}  # said as such
    for run_path in view.paths:
        empty = [p.name for p in _journals(run_path) if p not in unreadable and _size(p) == 0]
        if empty:
            lines.append(f"{', '.join(empty)}: no record written yet (a process whose first record did not fit)")
        full = _full(run_path)
        if full:
            lines.append(full)
    return lines


def _journals(run_path: Path) -> list[Path]:
    try:
        return sorted((run_path / JOURNAL_DIR).glob("*.jsonl"))
    except OSError:
        return []


def _size(path: Path) -> int | None:
    try:
        return os.lstat(path).st_size
    except OSError:
        return None


def _full(run_path: Path) -> str | None:
    """``RUN_DIR: its filesystem is full (...)`` when no block is left for an unprivileged writer."""
    try:
        st = os.statvfs(run_path)
    except OSError:
        return None
    if st.f_bavail > 0 or st.f_blocks == 0:
        return None
    return (
        f"{run_path}: its filesystem is full (0 bytes free of {size(st.f_blocks * st.f_frsize)}): journals and "
        "status files lack what did not fit, until there is room"
    )
