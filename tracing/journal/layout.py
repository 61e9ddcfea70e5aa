"""The run directory's layout: where each kind of file lives. Names only, so every side may import it."""

from __future__ import annotations

JOURNAL_DIR, STATUS_DIR, STACKS_DIR = "journal", "status", "stacks"
