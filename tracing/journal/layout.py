"""The run directory's layout: where each kind of file lives. Names only, so every side may import it."""

from __future__ import annotations

JOURNAL_DIR, STATUS_DIR, STACKS_DIR = "journal", "status", "stacks"
# the launch's start as an orchestrator reads it (``verdicts.startup``), replaced by the launcher's
# watchdog after each pass: ``phasetrace probe`` reads this one small file, not every journal
STARTUP_FILE = "startup.json"
