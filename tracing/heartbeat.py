"""Per-process heartbeats (filled in by the heartbeat/watchdog work)."""

from __future__ import annotations

from typing import Any


def start(rt: Any) -> None:
    return None
