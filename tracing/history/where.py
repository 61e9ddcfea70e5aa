"""Where the history of starts is: one SQLite file per base directory, in a directory only this user
can write (``files.home_of``: in ``/tmp``, its private subdirectory), so nobody else can plant the
database or SQLite's ``-wal``/``-shm`` beside it. Stdlib, ``keys`` and ``files`` only, so a launcher
asks it before anything heavier is imported."""

from __future__ import annotations

import os
from pathlib import Path

from .. import files, keys

ENV_HISTORY = keys.ENV_HISTORY  # a path, or "0": no history
FILE_NAME = "history.sqlite"


def off() -> bool:
    """``SGLANG_PHASETRACE_HISTORY=0``: no history (asked without touching a filesystem)."""
    return os.environ.get(ENV_HISTORY, "").strip().lower() in ("0", "off", "false", "no")


def location(base: str | Path | None = None) -> Path | None:
    """Where the history is: ``$SGLANG_PHASETRACE_HISTORY`` (None when it is ``0``), else
    ``history.sqlite`` in ``base``, else in ``$SGLANG_PHASETRACE_DIR`` (default ``./phasetrace-runs``);
    in a base others may write in, in this user's private subdirectory of it (``files.home_of``)."""
    if off():
        return None
    chosen = os.environ.get(ENV_HISTORY, "").strip()
    if chosen:
        return Path(chosen)
    if base is None:
        base = os.environ.get(keys.ENV_BASE_DIR) or keys.DEFAULT_BASE_DIR
    return files.home_of(base) / FILE_NAME


def of_run_dir(run_dir: str | Path) -> Path | None:
    """The history a run belongs to: its base directory's (the run directory's parent), unless
    ``$SGLANG_PHASETRACE_HISTORY`` says otherwise."""
    return location(Path(run_dir).parent)
