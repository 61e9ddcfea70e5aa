"""The watchdog: reads every rank's journal and heartbeats, names a stalled or dead rank within seconds.

Runs as a thread in the launching process (from its launch until the launch serves: "ready to
roll", after the warm-up, for ``launch_server``; ``Engine.__init__`` returned) and as
``phasetrace watch RUN_DIR``. On each new finding it reads the stacks of the ranks involved
(``tracing.verdicts.stack_requests``: only processes proven to be the traced ones), prints one line to stderr,
writes a ``diagnosis`` record, adds an OTel event, and exports the in-flight phases as
*incomplete* spans so Jaeger shows where each rank is. A rank process that ends before it is
ready is named at once, with how it ended when this process is its parent (the launcher), and
an ``exit`` record is written for it. It kills nothing, unless ``SGLANG_PHASETRACE_ABORT_AFTER_S``
asks it to end a local launcher after a stall that long.
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

from .. import files, keys, other_processes, process_state
from ..journal import records
from ..journal.layout import STARTUP_FILE
from ..reader.view import ProcessRec, ProcId, RunView
from ..recorder import metrics, otlp, runtime
from ..redact import printable, redact_text
from . import evidence, postmortem, startup, voice
from . import stack_requests as stacks
from .diagnose import PREFIX, Finding, Thresholds, said, suspects
from .evidence.ranks import RankReader
from .findings import live, running

log = logging.getLogger("sglang_phasetrace")
MAX_STACKS = 8
STOP_LOOK_S = 0.5  # after a death is seen, when the pass looks again for the rest of a stop
SOON_S = 0.5  # the pause between passes while a process nears the blocked bound (``Watchdog.pause``)
EXIT_WAIT_S = 1.0  # the longest an exiting launcher waits for its start to be recorded (``history.keeper``)


def pinned(proc: ProcessRec) -> other_processes.Pinned | None:
    """``proc`` held by a pidfd when it is proven ours, else None: read from this host's own
    journal (never another node's report), in a run directory and journal directory of this user
    that nobody else can write, and ``other_processes.pin`` (it runs now and writes that journal). Only
    such a process is signalled, read with py-spy, or aborted. A directory that fails is said once."""
    if proc.remote is not None:
        return None
    journal = Path(os.path.realpath(proc.path))
    why = files.not_private(journal.parent.parent) or files.not_private(journal.parent)
    if why is not None:
        if process_state.say_once(("unproven", why)):
            log.warning("sglang-phasetrace: nothing in this run is signalled: %s", why)
        return None
    return other_processes.pin(proc.pid, proc.host, proc.start_ticks, proc.boot_id, journal)


def served_by_workers(run: RunView) -> int | None:
    """With ``--tokenizer-worker-num`` > 1 SGLang warms the server up in each tokenizer worker, never
    in the launcher: the launch serves once as many workers as it starts (its root says how many)
    ended ``server.wait_ready`` with the server up (SGLang's ``server_status``), and none still warms
    up or came up failed. A worker that ended before (uvicorn replaces one that misses its health
    check) does not count. When the last one came up (ns), or None."""
    launcher = next((p for p in run.processes if p.role == "launcher" and p.remote is None), None)
    root = launcher.root if launcher is not None else None
    want = root.attrs.get(keys.TOKENIZER_WORKERS) if root is not None else None
    last, up = None, 0
    for proc in run.processes:
        if not proc.helper or proc.remote is not None:
            continue
        warm = [s for s in proc.spans.values() if s.phase == keys.PHASE_WAIT_READY]
        if not warm:
            continue
        span = warm[-1]
        if span.end is None:
            if proc.exit is None and running(proc):
                return None  # it still warms up
            continue
        if span.attrs.get(keys.SERVER_READY) is not True:
            return None
        up, last = up + 1, max(last or 0, span.end)
    if last is None or (type(want) is int and up < want):
        return None
    return last


class Watchdog:
    def __init__(
        self,
        run_dir: Path | str,
        thresholds: Thresholds | None = None,
        *,
        out: TextIO | None = None,
        record: Callable[[dict], None] | None = None,
        py_spy: bool = True,
    ) -> None:
        self.run = RunView(run_dir)
        self.named: set[ProcId] = set()  # processes a verdict has named
        self.quick = False  # last words: verdict lines only
        self.when_ranks_ready: Callable[[], None] | None = None  # called once, when every rank is ready
        self.expect_ranks = 1  # ... and there are at least this many (a node ≥ 1 of a multi-node launch)
        # a ``launch_server``'s: called once, with when, once its tokenizer workers serve (``served_by_workers``)
        self.when_workers_serve: Callable[[int], None] | None = None
        self.node: int | None = None  # that node's rank: its own ranks are the ones it waits for
        self.crossnode: Any = None  # ``crossnode.CrossNode`` on a node of a multi-node launch
        stacks.stack_signal()  # a bad setting is said now, once
        self.thresholds = thresholds or Thresholds.from_env()
        self.out = out if out is not None else sys.stderr
        self.record = record
        self.py_spy = py_spy
        self.first_seen: dict[tuple, float] = {}  # finding key -> when it was reported
        self.gone: dict[int, other_processes.Ended | None] = {}  # rank pid -> how it ended (None: unknown)
        self.stop = threading.Event()
        self.lock = threading.Lock()  # one pass at a time (the loop, and last words from a handler)
        self.failed = False
        self.said_root_cause = False
        self.hints_said: set[str] = set()  # each known-fix hint once per watch, not once per rank
        self.abort_after = _float_env(keys.ENV_ABORT_AFTER)
        self._exporter: Any = None
        # what a suspect rank waits on: read from /proc here, another node's from its snapshot
        self.waits = RankReader(remote=lambda p: self.crossnode.evidence_of(p) if self.crossnode else None)
        self.keeps = False  # a launcher's: it records its start in the history (``keep``)
        self.keeper: Any = None  # ``history.keeper.Keeper``, made at the first recording
        self.indexed = False  # the run's index writer was started (``index_later``)
        self.publishes = False  # a launcher's: the start's state after each pass, in ``STARTUP_FILE``
        self.startup: startup.Startup | None = None  # the latest pass's (the start-up endpoint serves it)

    def step(self, now_ns: int | None = None) -> list[Finding]:
        """One pass: read what is new, analyze, act on findings not reported yet. Returns them."""
        with self.lock:
            self.run.refresh()
            now_ns = now_ns or time.time_ns()
            read = self.waits.now  # what the last pass read: this node's snapshot carries it
            self.waits.start(self.run)
            notices = self.crossnode.exchange(self.run, now_ns, read) if self.crossnode is not None else []
            for notice in notices:
                print(printable(f"{PREFIX} NOTICE {notice}"), file=self.out, flush=True)
            local = [p for p in self.run.ranks if p.remote is None and p.node in (None, self.node)]
            if self.when_ranks_ready is not None and len(local) >= self.expect_ranks and all(p.ready for p in local):
                done, self.when_ranks_ready = self.when_ranks_ready, None
                done()
            if self.when_workers_serve is not None and (since := served_by_workers(self.run)) is not None:
                serves, self.when_workers_serve = self.when_workers_serve, None
                serves(since)
            th = self.thresholds
            if self._look_for_exits() and not self.quick:
                # a death just seen: a stop from outside signals the launch's processes together, and the
                # others are gone a moment later; look again then, so a stop is said once (STOPPED)
                time.sleep(STOP_LOOK_S)
                self.run.refresh()
                self._look_for_exits()
            findings = [f for f, _ in live(self.run, now_ns, th, self.gone, notices=True, read=self.waits)]
            if self.crossnode is not None and self.node:  # node 0 judges this node's suspects from its snapshot
                for proc in suspects(self.run, now_ns, th):
                    self.waits(proc)
            metrics.stalled(self.run.path, findings, [p.label for p in self.run.ranks], th.heartbeat_s)  # OTLP
            new = [
                f
                for f in findings
                if f.key not in self.first_seen
                and not (f.kind == "not_started" and f.proc in self.named)  # named already as stalled
            ]
            for finding in new:
                self.first_seen[finding.key] = time.monotonic()
                if finding.proc is not None:
                    self.named.add(finding.proc)
                self.act(finding)
            if self.keeps and any(f.alarm for f in new) and not (self.keeper is not None and self.keeper.final):
                keep(self, final=False)  # a launcher killed after its stall still leaves its start
            self._maybe_abort(findings)
            self.publish(findings, now_ns)
            return new

    def publish(self, found: list[Finding], now_ns: int) -> None:
        """A launcher's: the start's state from this pass (``verdicts.startup``), kept for its endpoint
        and written to the run's state file for ``phasetrace probe``. Never raises."""
        if not self.publishes:  # ``phasetrace watch``, a test: nobody reads it
            return
        try:
            self.startup = startup.of_pass(self.run, found, now_ns)
            files.write_atomic(Path(self.run.path) / STARTUP_FILE, startup.state_file(self.startup))
        except OSError as exc:
            files.say_once(Path(self.run.path) / STARTUP_FILE, exc, "phasetrace probe reads the journals instead")
        except Exception as exc:
            if process_state.say_once(("startup state", repr(exc))):
                log.warning("sglang-phasetrace: the start's state not published: %r", exc)

    def publish_serving(self, beats: int = 4) -> None:
        """The state once the launch serves (the watchdog has stopped): read again each half beat
        until every rank of this node has ended its start too (it learns that the launch serves at
        its next heartbeat), ``beats`` heartbeats at most. Never raises."""
        deadline = time.monotonic() + beats * self.thresholds.heartbeat_s
        while True:
            with self.lock:
                try:
                    self.run.refresh()
                except Exception as exc:
                    log.debug("sglang-phasetrace: serving state not read: %r", exc)
                    return
                self.publish([], time.time_ns())
                local = [p for p in self.run.ranks if p.remote is None]
            if all(p.ready for p in local) or time.monotonic() >= deadline:
                return
            time.sleep(self.thresholds.heartbeat_s / 2)

    def _look_for_exits(self) -> bool:
        """Rank and helper processes of this host that ended before they were ready; how, where we can
        tell. Returns whether one was found."""
        found = False
        for proc in self.run.processes:
            if proc.role != "rank" and not proc.helper:
                continue
            if proc.pid in self.gone or proc.ready or proc.remote is not None or proc.exit is not None:
                continue
            if proc.host != other_processes.this_host():
                continue
            if running(proc):
                continue
            ended = other_processes.child_ended(proc.pid)  # the launcher is the ranks' parent
            self.gone[proc.pid], found = ended, True
            if ended is not None and self.record is not None:
                self.record(
                    records.exit(time.time_ns(), proc.pid, proc.host, proc.label, ended.code, ended.signal_name)
                )
        return found

    def act(self, finding: Finding) -> None:
        finding.message = redact_text(finding.message)
        involved = self.involved(finding)
        if finding.alarm and finding.kind not in ("died", "failed", "stopped"):
            finding.stacks = [] if self.quick else self.take_stacks(involved, finding)
            self._native_frame(finding, involved)
        voice.speak(finding, self.out, self.record, self.run, self.hints_said)
        if not self.quick:
            self._export(finding, involved)

    def involved(self, finding: Finding) -> list[ProcessRec]:
        """The processes a finding names, as read (``ProcId``: host, pid and source, never a pid alone,
        which another node's report may share with a rank of this host): what ``take_stacks`` may act
        on, and only on those read from this host's own journals (``pinned``)."""
        by_id = {p.ident: p for p in self.run.processes}
        return [by_id[i] for i in dict.fromkeys(finding.procs) if i in by_id][:MAX_STACKS]

    def take_stacks(self, involved: list[ProcessRec], finding: Finding) -> list[str]:
        """Stacks of the involved processes proven to be ours: py-spy (out of process) for the rank
        the finding names, where allowed; faulthandler on its signal for the others and as fallback."""
        paths = []
        for i, proc in enumerate(involved):
            target = pinned(proc)
            if target is None:  # another node's, a recycled pid, an old or planted journal: never signalled
                continue
            with target:
                run_dir = self.run.dir_of(proc)
                if i == 0 and self.py_spy:
                    spy = stacks.py_spy(target, run_dir, proc.path.stem)
                    if spy is not None:
                        paths.append(str(spy))
                        continue
                reason = f"{finding.kind}: {finding.message}"
                paths += map(str, stacks.request(target, run_dir, proc.path.stem, reason))
        return paths

    def _native_frame(self, finding: Finding, involved: list[ProcessRec]) -> None:
        """The named rank read again with the py-spy dump just taken (its native frame classified):
        its evidence, and the words the line says for it, become the finer ones."""
        spy = next((Path(p) for p in finding.stacks if "-py-spy-" in Path(p).name), None)
        proc = involved[0] if involved else None
        if spy is None or proc is None or proc.label not in finding.evidence:
            return
        try:
            text = spy.read_text(errors="replace")
        except OSError:
            return
        old, new = evidence.from_builtins(finding.evidence[proc.label]), self.waits(proc, native=text)
        if old is None or new is None or new.gone or old.busy or new.busy:
            return
        finding.keep({proc.label: new}, replace=True)
        for before, after in ((old.text, new.text), (said(old), said(new))):
            if before and after and before in finding.message:
                finding.message = finding.message.replace(before, after, 1)
                break

    def last_words(self) -> None:
        """Before SGLang tears the launch down (its SIGQUIT handler kills the process tree): one
        last pass, so a rank that died is named, then the root cause. Bounded; never raises."""
        self.quick = True  # the tree dies in a moment: no stacks, no export, just the lines
        try:
            if self.lock.acquire(timeout=3.0):
                self.lock.release()
                self.step()
            self.say_root_cause()
        except Exception as exc:
            log.debug("sglang-phasetrace: last words failed: %r", exc)

    def say_root_cause(self) -> None:
        if self.said_root_cause:
            return
        line = postmortem.root_cause_line(self.run, self.gone)
        if line is not None:
            self.said_root_cause = True
            print(printable(f"{PREFIX} {line}"), file=self.out, flush=True)

    def _export(self, finding: Finding, involved: list[ProcessRec]) -> None:
        """The finding as an OTel event, and the involved ranks' open phases as incomplete spans."""
        rt = runtime.current()
        root = rt.root
        if root is not None and root.is_recording():
            attrs = {keys.FINDING: finding.kind, keys.RANK_LABEL: finding.label, keys.MESSAGE: finding.message}
            ev = evidence.from_builtins(finding.evidence.get(finding.label))
            root.add_event(keys.STALL_EVENT, {**attrs, **(evidence.attributes(ev) if ev is not None else {})})
        from ..recorder import exporters

        if self._exporter is None:
            self._exporter = exporters.processor_from_env(rt.warn) or False
        if self._exporter:
            from .incomplete import incomplete_spans

            for proc in involved:
                if proc.remote is not None:  # another node's: that node exports its own spans
                    continue
                for span in incomplete_spans(proc, time.time_ns(), finding.message):
                    self._exporter.on_end(span)
            otlp.flush(self._exporter, timeout_s=5.0)  # bounded: a collector that does not answer holds no pass

    def _maybe_abort(self, findings: list[Finding]) -> None:
        if self.abort_after is None:
            return
        for f in findings:
            if time.monotonic() - self.first_seen.get(f.key, time.monotonic()) < self.abort_after:
                continue
            self.abort_after = None
            # only a launcher its own journal proves (it holds it open), pinned until signalled
            launcher = next(filter(None, (pinned(p) for p in self.run.processes if p.role == "launcher")), None)
            if launcher is None:
                print(
                    printable(
                        f"{PREFIX} stall persisted; {keys.ENV_ABORT_AFTER} is set but no launcher of this run is "
                        "running on this host: nothing signalled"
                    ),
                    file=self.out,
                    flush=True,
                )
                return
            print(
                printable(
                    f"{PREFIX} stall persisted {f.since_s:.0f} s; sending SIGTERM to the launcher (pid "
                    f"{launcher.pid}) as {keys.ENV_ABORT_AFTER} asks"
                ),
                file=self.out,
                flush=True,
            )
            launcher.send(signal.SIGTERM)
            launcher.close()
            return

    def loop(self) -> None:
        """Poll at the heartbeat interval until stopped (sooner near a bound); never dies of an error."""
        while not self.stop.is_set():
            began = time.monotonic()
            try:
                self.step()
            except Exception as exc:
                if not self.failed:
                    self.failed = True
                    log.warning("sglang-phasetrace: watchdog pass failed: %r", exc)
            self.stop.wait(self.pause(time.monotonic() - began))

    def pause(self, took: float) -> float:
        """Seconds to the next pass: the heartbeat interval, but a moment (twice what a pass costs,
        ``SOON_S`` at least) while a process of the launch is within a beat of the blocked bound, so a
        stall is named as it reaches the bound, not up to a beat later."""
        th = self.thresholds
        beat = min(th.heartbeat_s, 5.0)
        now = time.time_ns()
        for proc in self.run.processes:
            if proc.ready or proc.remote is not None:
                continue
            if th.blocked_bound - beat <= (now - proc.last_progress_t) / 1e9 < th.blocked_bound + beat:
                return min(beat, max(SOON_S, 2 * took))
        return beat


def _float_env(name: str) -> float | None:
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return None


def keep(dog: Watchdog, final: bool = True, wait_s: float = 0.0) -> None:
    """Record the launch's start in the history (``tracing.history``) from a thread: at ready, at
    exit (then waiting at most ``wait_s``); at each new stall verdict before that (not ``final``).
    Never raises."""
    try:
        if dog.keeper is None:
            from ..history import keeper

            if keeper.off(dog.run.path):
                return
            dog.keeper = keeper.Keeper(dog.run, dog.lock)
        dog.keeper.record(final=final)
        if wait_s > 0:
            dog.keeper.wait(wait_s)
    except Exception as exc:
        log.debug("sglang-phasetrace: history: not recorded: %r", exc)
