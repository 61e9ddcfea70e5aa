"""Where the history of starts is: one SQLite file per base directory (stdlib and ``keys`` only, so
a launcher asks it before anything heavier is imported)."""

from __future__ import annotations

import os
from pathlib import Path

from .. import keys

ENV_HISTORY = keys.ENV_HISTORY  # a path, or "0": no history
FILE_NAME = "history.sqlite"


def location(base: str | Path | None = None) -> Path | None:
    """Where the history is: ``$SGLANG_PHASETRACE_HISTORY`` (None when it is ``0``), else
    ``history.sqlite`` in ``base``, else in ``$SGLANG_PHASETRACE_DIR`` (default ``./phasetrace-runs``)."""
    chosen = os.environ.get(ENV_HISTORY, "").strip()
    if chosen.lower() in ("0", "off", "false", "no"):
        return None
    if chosen:
        return Path(chosen)
    if base is None:
        base = os.environ.get(keys.ENV_BASE_DIR) or keys.DEFAULT_BASE_DIR
    return Path(base) / FILE_NAME


def of_run_dir(run_dir: str | Path) -> Path | None:
    """The history a run belongs to: its base directory's (the run directory's parent), unless
    ``$SGLANG_PHASETRACE_HISTORY`` says otherwise."""
    return location(Path(run_dir).parent)
