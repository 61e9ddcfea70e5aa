"""The watchdog: reads every rank's journal and heartbeats, names a stalled rank within seconds.

Runs as a thread in the launching process (from its launch until the server is ready) and as
``phasetrace watch RUN_DIR``. On each new finding it asks the ranks involved for their stacks,
prints one line to stderr, writes a ``diagnosis`` record, adds an OTel event, and exports the
in-flight phases as *incomplete* spans so Jaeger shows where each rank is. It kills nothing,
unless ``SGLANG_PHASETRACE_ABORT_AFTER_S`` asks it to end the launch after a stall that long.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from . import keys, runtime, stacks
from .diagnose import Finding, Thresholds, analyze, this_host
from .rundir import STACKS_DIR, ProcessRec, RunView

log = logging.getLogger("sglang_phasetrace")
MAX_STACKS = 8


class Watchdog:
    def __init__(self, run_dir: Path | str, thresholds: Thresholds | None = None, *,
                 out: TextIO | None = None, record: Callable[[dict], None] | None = None,
                 py_spy: bool = True) -> None:
        self.run = RunView(run_dir)
        self.thresholds = thresholds or Thresholds.from_env()
        self.out = out if out is not None else sys.stderr
        self.record = record
        self.py_spy = py_spy
        self.first_seen: dict[tuple, float] = {}  # finding key -> when it was reported
        self.stop = threading.Event()
        self.failed = False
        self.abort_after = _float_env(keys.ENV_ABORT_AFTER)
        self._exporter: Any = None

    def step(self, now_ns: int | None = None) -> list[Finding]:
        """One pass: read what is new, analyze, act on findings not reported yet. Returns them."""
        self.run.refresh()
        now_ns = now_ns or time.time_ns()
        findings = analyze(self.run, now_ns, self.thresholds)
        new = [f for f in findings if f.key not in self.first_seen]
        for finding in new:
            self.first_seen[finding.key] = time.monotonic()
            self.act(finding)
        self._maybe_abort(findings)
        return new

    def act(self, finding: Finding) -> None:
        procs = {p.pid: p for p in self.run.processes}
        involved = [procs[pid] for pid in dict.fromkeys(finding.pids) if pid in procs][:MAX_STACKS]
        finding.stacks = self.take_stacks(involved, finding)
        line = f"sglang-phasetrace: STALL {finding.message}"
        if finding.stacks:
            line += f"; stacks: {', '.join(finding.stacks)}"
        print(line, file=self.out, flush=True)
        record = {"kind": "diagnosis", "t": time.time_ns(), "finding": finding.kind, "label": finding.label,
                  "pid": finding.pid, "phase": finding.phase, "since_s": round(finding.since_s, 3),
                  "message": finding.message, "waiting": finding.waiting, "stacks": finding.stacks}
        if self.record is not None:
            self.record(record)
        self._export(finding, involved)

    def take_stacks(self, procs: list[ProcessRec], finding: Finding) -> list[str]:
        paths = []
        for i, proc in enumerate(procs):
            if proc.host != this_host():  # signals reach this host's processes only
                continue
            path = stacks.dump_path(self.run.path, proc.path.stem)
            if stacks.request(proc.pid, path, f"{finding.kind}: {finding.message}"):
                paths.append(str(path))
            if i == 0 and self.py_spy:  # native frames of the rank it names
                out = self.run.path / STACKS_DIR / f"{proc.path.stem}-py-spy-{int(time.time())}.txt"
                spy = stacks.py_spy(proc.pid, out)
                if spy is not None:
                    paths.append(str(spy))
        return paths

    def _export(self, finding: Finding, procs: list[ProcessRec]) -> None:
        """The stall as an OTel event, and the involved ranks' open phases as incomplete spans."""
        rt = runtime.current()
        root = rt.root
        if root is not None and root.is_recording():
            root.add_event("phasetrace.stall", {"phasetrace.finding": finding.kind, "sglang.rank": finding.label,
                                                 "phasetrace.message": finding.message})
        from . import exporters

        if self._exporter is None:
            self._exporter = exporters.processor_from_env(rt.warn) or False
        if self._exporter:
            from .snapshot import incomplete_spans

            for proc in procs:
                for span in incomplete_spans(proc, time.time_ns(), finding.message):
                    self._exporter.on_end(span)
            exporters.flush(self._exporter, 5.0)  # bounded: a collector that does not answer holds no pass

    def _maybe_abort(self, findings: list[Finding]) -> None:
        if self.abort_after is None:
            return
        for f in findings:
            if time.monotonic() - self.first_seen.get(f.key, time.monotonic()) >= self.abort_after:
                launcher = next((p for p in self.run.processes if p.role == "launcher"), None)
                if launcher is not None:
                    print(f"sglang-phasetrace: stall persisted {self.abort_after:.0f} s; sending SIGTERM to the "
                          f"launcher (pid {launcher.pid}) as {keys.ENV_ABORT_AFTER} asks", file=self.out, flush=True)
                    os.kill(launcher.pid, signal.SIGTERM)
                self.abort_after = None
                return

    def loop(self) -> None:
        """Poll at the heartbeat interval until stopped; never dies of an error."""
        while not self.stop.is_set():
            try:
                self.step()
            except Exception as exc:
                if not self.failed:
                    self.failed = True
                    log.warning("sglang-phasetrace: watchdog pass failed: %r", exc)
            self.stop.wait(min(self.thresholds.heartbeat_s, 5.0))


def _float_env(name: str) -> float | None:
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return None


def start_in_launcher(rt: runtime.Runtime) -> Watchdog | None:
    """Watch this launch from the launching process until it is ready (or exits)."""
    if os.environ.get(keys.ENV_WATCHDOG, "1") == "0" or rt.run_dir is None:
        return None
    dog = Watchdog(rt.run_dir, record=rt.write)
    rt.on_ready.append(dog.stop.set)
    threading.Thread(target=dog.loop, name="phasetrace-watchdog", daemon=True).start()
    return dog
