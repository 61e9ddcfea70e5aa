"""Per-process heartbeats: a daemon thread that says, every few seconds, where this process is.

Each beat: open phases (outermost first) with time in each and their latest progress, the
collective the process is in, process CPU-time delta, RSS, threads, and GPU figures where NVML
works. Written to the journal while the process initialises, and always to a small per-process
status file (atomically replaced) that live readers poll; after ready, that file also counts the
patched wrappers that still ran (``runtime_calls``: calls and tracing's cost, per phase). A process
whose Python threads cannot run (GIL held in C) stops beating: that silence is itself the signal
the watchdog reads. "Ready" is serving (``recorder.serving``): an initialised rank still beats into
its journal until its launch serves, and looks once a beat whether it does.
"""

from __future__ import annotations

import errno
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from .. import files, keys, process_state
from ..journal import records
from ..journal.layout import STATUS_DIR
from . import activity, collective_log, gpu, metrics, runtime, serving

log = logging.getLogger("sglang_phasetrace")


class Heartbeat:
    def __init__(self, rt: runtime.Runtime, interval: float) -> None:
        import psutil

        self.rt, self.interval = rt, interval
        self.process = psutil.Process()
        self.seq = 0
        self.cpu_last = self._cpu()
        self.t_last, self.activity = time.time_ns(), activity.Activity()  # record(): deltas per beat
        # its directory is checked (made) on the first beat, on the heartbeat thread: nothing here
        # touches the filesystem from SGLang's thread, which may not wait on a disk that stopped answering
        self.status_path = Path(rt.run_dir) / STATUS_DIR / f"{rt.journal.path.stem}.json"
        self.status_dir_ok = False
        self.stop = threading.Event()
        self.lock = threading.Lock()  # beat() runs on the thread and at ready (on_ready)
        self.failed = False

    def _cpu(self) -> float:
        times = self.process.cpu_times()
        return times.user + times.system

    def record(self) -> records.Record:
        now = time.time_ns()
        self.seq += 1
        phases = []
        for span, progress in self.rt.open.listed():
            item: dict[str, Any] = {
                "span": runtime.hexid(span.get_span_context().span_id),
                "name": span.name,
                "phase": (span.attributes or {}).get(keys.PHASE, span.name),
                "since_s": round((now - (span.start_time or now)) / 1e9, 3),
            }
            if progress:
                item["progress"] = progress
            phases.append(item)
        cpu = self._cpu()
        current, counts = collective_log.state().in_flight(now)
        ident = self.rt.identity
        record = records.heartbeat(
            now,
            self.seq,
            ident.pid,
            ident.label,
            self.rt.ready,
            self.interval,
            phases,
            round(cpu - self.cpu_last, 3),
            self.process.memory_info().rss,
            self.process.num_threads(),
            collective=current,
            collectives=counts,
            runtime_calls=self.rt.runtime_calls_summary() if self.rt.runtime_calls else None,
            gpu=gpu.sample(ident.ranks.get("gpu")),
            dt_s=round((now - self.t_last) / 1e9, 3),
            **self.activity.sample(),
        )
        self.cpu_last, self.t_last = cpu, now
        return record

    def beat(self) -> None:
        if self.rt.awaiting is not None:  # an initialised rank: does its launch serve now? (one lstat)
            serving.check(self.rt)
        with self.lock:
            record = self.record()
            # The journal keeps init (of ranks, the launcher, any process inside a phase); the status
            # file stays live after, and is all an idle helper process (detokenizer, ...) writes.
            if not self.rt.ready and (self.rt.identity.role != "process" or record["phases"]):
                self.rt.write(record)
            journal = self.rt.journal
            if journal is not None and not journal.flush():  # records held back: say so here
                record = records.unwritten(record, journal.trouble())
            if not self.status_dir_ok:
                files.private_dir(self.status_path.parent)  # a link or another user's: raised, said once
                self.status_dir_ok = True
            self.write_status(json.dumps(record, separators=(",", ":"), default=str).encode())
            metrics.observe(self.rt, record)  # kept for the OTLP metrics' next collection (when exported)

    def write_status(self, data: bytes) -> None:
        """Replace the status file; on a full disk, rewrite it in place (no new block needed), so that
        it still says what this process could not write to its journal (``journal_unwritten``). A
        failure is said once per process (by the launcher for its launch: ``files.say_once``)."""
        try:
            files.write_atomic(self.status_path, data)
        except OSError as exc:  # a full or read-only disk; beats go on
            consequence = "the status file stays stale until it can be"
            if exc.errno == errno.ENOSPC:
                try:
                    files.rewrite(self.status_path, data)
                    consequence = "records that do not fit are held in memory until they do"
                except OSError:
                    pass
            files.say_once(self.status_path, exc, consequence)

    def run(self) -> None:
        while True:
            self.beat_safely()
            if self.stop.wait(self.interval):
                return

    def beat_safely(self) -> None:
        try:
            self.beat()
        except Exception as exc:  # never let the thread die; say so once
            if not self.failed:
                self.failed = True
                log.warning("sglang-phasetrace: heartbeat failed: %r", exc)

    def beat_soon(self) -> None:
        """A beat now, on a thread of its own (run at ready): the status file says "ready" at once,
        and SGLang's thread waits neither for the disk nor for a beat in progress."""
        threading.Thread(target=self.beat_safely, name="phasetrace-heartbeat-ready", daemon=True).start()


def current() -> Heartbeat | None:
    """This process's heartbeat, once started."""
    return process_state.STATE.heartbeat


def start(rt: runtime.Runtime) -> Heartbeat | None:
    """Start this process's heartbeat thread (once per process; a forked child starts its own)."""
    state = process_state.STATE
    if state.heartbeat is not None and state.heartbeat.rt is rt:
        return state.heartbeat
    try:
        beat = state.heartbeat = Heartbeat(rt, max(0.1, keys.env_seconds("HEARTBEAT", keys.HEARTBEAT_S)))
    except Exception as exc:
        log.warning("sglang-phasetrace: heartbeat not started: %r", exc)
        return None
    threading.Thread(target=beat.run, name="phasetrace-heartbeat", daemon=True).start()
    rt.on_ready.append(beat.beat_soon)  # the status file says "ready" at once, not a beat later
    return beat
