"""Runs written by hand, record by record: processes of a launch at a moment ``NOW``, for the rules
that judge them (verdicts, the start's state) without starting anything."""

from __future__ import annotations

import json
from pathlib import Path

from sglang_phasetrace.tracing import keys
from sglang_phasetrace.tracing.journal import records

S = 1_000_000_000
NOW = 1_900_000_000 * S


class Proc:
    """One process's journal, written by hand: its root from ``start`` s ago, phases, idle heartbeats."""

    def __init__(
        self, run: Path, pid: int, role: str, label: str, root: str, start: float = 300, *, host: str = "other",
        now: int = NOW,
    ) -> None:  # fmt: skip
        """``host``: another by default (nothing of it is looked up here); ``now``: the moment it is at."""
        self.run, self.pid, self.label, self.host, self.now = run, pid, label, host, now
        self.root = f"{pid:016x}"
        self.n = 0
        t = now - int(start * S)
        self.records = [
            records.process(t, pid, None, host, run.name, t, {}),
            records.identity(t, label, role, {"sglang.tp_rank": int(label[2:])} if role == "rank" else {}),
            records.begin(t, self.root, None, "a" * 32, f"{label} @ {host}:{pid}", {"sglang.phase": root}, "M"),
        ]

    def phase(self, name: str, begin_ago: float, end_ago: float | None = None) -> Proc:
        self.n += 1
        span = f"{self.pid:012x}{self.n:04x}"
        attrs = {"sglang.phase": name}
        self.records.append(records.begin(self.now - int(begin_ago * S), span, self.root, "a" * 32, name, attrs, "M"))
        if end_ago is not None:
            self.records.append(records.end(self.now - int(end_ago * S), span, "ok", {}))
        return self

    def initialised(self, ago: float) -> Proc:
        self.records.append(records.event(self.now - int(ago * S), self.root, keys.INITIALISED, {}))
        return self

    def serving(self, ago: float) -> Proc:
        """Its root ends: the launch serves (``keys.SERVING``)."""
        self.records.append(records.end(self.now - int(ago * S), self.root, "ok", {keys.SERVING: True}))
        return self

    def loading(self, done: int, total: int, seconds: float = 12) -> Proc:
        """Heartbeats every 2 s for ``seconds`` up to now, busy, its open phase's progress rising to ``done``."""
        span = f"{self.pid:012x}{self.n:04x}"
        for i in range(int(seconds // 2) + 1):
            t = self.now - int((seconds - 2 * i) * S)
            got = {"done": max(0, done - int(seconds // 2) + i), "total": total, "unit": "shards"}
            phases = [{"span": span, "name": "x", "phase": "x", "since_s": 1.0, "progress": got}]
            main = {"state": "R", "cpu_s": 1.9}
            beat = records.heartbeat(
                t, i, self.pid, self.label, False, 2.0, phases, 1.9, 1 << 30, 9, dt_s=2.0, main=main
            )
            self.records.append(beat)
        return self

    def idle(self, seconds: float = 12) -> Proc:
        """Heartbeats every 2 s for ``seconds`` up to now: asleep, no CPU."""
        for i in range(int(seconds // 2) + 1):
            t = self.now - int((seconds - 2 * i) * S)
            main = {"state": "S", "cpu_s": 0.0}
            beat = records.heartbeat(t, i, self.pid, self.label, False, 2.0, [], 0.0, 1, 1, dt_s=2.0, main=main)
            self.records.append(beat)
        return self

    def write(self) -> None:
        path = self.run / "journal" / f"{self.host}-{self.pid}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in sorted(self.records, key=lambda r: r["t"])))
