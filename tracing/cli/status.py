"""``phasetrace status RUN_DIR``: the live per-rank table; non-zero exit while a rank is stalled."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import socket
import time

import psutil
from rich.console import Group
from rich.live import Live

from ..reader.ended import of_run
from ..reader.load import refresh_parallel
from ..reader.view import RunView
from ..render.lanes import DONE, layout
from ..render.missing import missing
from ..render.status_table import StatusRow, status_rows, status_table, verdict_lines
from ..render.term import text
from ..verdicts import usual
from ..verdicts.diagnose import PREFIX, Finding, Thresholds, suspects
from ..verdicts.evidence.ranks import RankReader
from ..verdicts.findings import ENDED, alarms, by_process, findings, gone_ranks
from .command import (
    EXIT_FAILED,
    EXIT_INCOMPLETE,
    EXIT_STALLED,
    RUN_DIRS_HELP,
    check_run_dir,
    keep,
    make_console,
    report_problems,
)
from .usage import SILENT_HELP, seconds


def exit_code(rows: list[StatusRow], found: list[Finding]) -> int:
    """The first verdict decides (root cause first): a rank that died or failed, else a stall
    (a rank, or a stall no single rank explains: divergence, no progress). Notices do not count.
    Else a journal that cannot be read: the view is incomplete."""
    verdicts = alarms(found)
    if verdicts:
        return EXIT_FAILED if verdicts[0].kind in ENDED else EXIT_STALLED
    if any(r.state in ("failed", "incomplete", "gone") for r in rows):
        return EXIT_FAILED
    return EXIT_INCOMPLETE if any(r.state == "unreadable" for r in rows) else 0


def finished(rows: list[StatusRow]) -> bool:
    """Nothing will change any more: every process ready, failed, gone or ended."""
    return bool(rows) and all(
        r.state in ("ready", "serving", "ended", "failed", "incomplete", "gone", "exited", "died", "unreadable")
        for r in rows
    )


class Status:
    name = "status"
    help = "live per-rank table: phase, time in it, heartbeat, progress, verdict"
    description = f"""\
Show where every process of a run is: its current phase and for how long, the age of its last
heartbeat, progress, CPU/memory/GPU figures when the heartbeat carries them, and a stall
verdict (the watchdog's diagnosis, else a fresh analysis); below, what the run's files lack (the
records a full disk kept out of each journal: still held, or lost). On a terminal it refreshes
until every rank is ready or has stopped; --once, or an output that is not a terminal, prints one
frame. Exits {EXIT_STALLED} when a rank is stalled and {EXIT_FAILED} when one failed, so scripts can poll it
({EXIT_INCOMPLETE}: nothing worse is seen, but a journal cannot be read; its row says so):

  phasetrace status RUN_DIR --once || echo "startup is in trouble"
  phasetrace status RUN_DIR --once --json | jq '.ranks[] | select(.state != "ready")'
  phasetrace status node0/RUN_DIR node1/RUN_DIR   # a multi-node launch: one directory per node"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help=RUN_DIRS_HELP)
        parser.add_argument("--once", action="store_true", help="print one frame and exit")
        parser.add_argument("--json", action="store_true", help="one JSON document (implies --once)")
        parser.add_argument("--interval", type=seconds, default=1.0, metavar="S", help="refresh period (default 1.0)")
        parser.add_argument("--silent-after", type=seconds, metavar="S", help=SILENT_HELP)

    def frame(
        self,
        view: RunView,
        args: argparse.Namespace,
        said: set[str],
    ) -> tuple[list[StatusRow], list[Finding], Group]:
        refresh_parallel(view, shallow=0)  # a first read of a large run on two cores; later: what was appended
        now = time.time_ns()
        lay = keep(layout(view, now, depth=0))  # the table shows where each process is, not every phase
        thresholds = Thresholds.from_env()
        if args.silent_after is not None:
            thresholds = dataclasses.replace(thresholds, silent_s=args.silent_after)
        # what a named or idle rank waits on, from /proc (this host's); children's CPU since the last frame
        waits = self.__dict__.setdefault("waits", RankReader()).start(view)
        found = findings(view, now, thresholds, gone=gone_ranks(view), read=waits)
        here = socket.gethostname()
        alive = {(p.host, p.pid): psutil.pid_exists(p.pid) for p in view.processes if p.host == here}
        rows = status_rows(lay, now, by_process(view, found), alive)
        self.ended = of_run(view, now)  # the launch served, and every process of it is gone since
        for r in rows if self.ended is not None else ():
            if r.state in DONE:
                r.state = "ended"
        idle = {p.pid: ev for p in suspects(view, now, thresholds) if (ev := waits(p)) is not None}
        for r in rows:
            r.waits_on = idle[r.pid].text if r.pid in idle and not idle[r.pid].gone else ""
        known = usual.known(view)  # the launch's earlier starts: each phase's usual time, the ETA
        for r in rows if known is not None else ():
            r.usual = usual.short(known.usuals.get(r.phase)) if r.phase and r.in_phase_s is not None else ""
        self.outlook = usual.outlook(view, now, known)
        report_problems(view, said)  # the journals' and the status files' (read by the rows)
        unnamed = [f for f in found if f.pid not in {r.pid for r in rows if r.verdict}]
        extra = [text(f"{f.kind}: {f.message}", style="red") for f in unnamed]
        self.missing = missing(view, alive)  # records a full disk kept out of the journals
        lacking = [text(f"missing: {line}", style="yellow") for line in self.missing]
        table = status_table(rows, f"{view.run_id}  ({len(rows)} processes{', ended' if self.ended else ''})")
        history = [text(self.outlook["line"])] if self.outlook and not self.ended else []
        over = [text(f"{PREFIX} {self.ended.line(now)}")] if self.ended is not None else []
        return rows, found, Group(table, *over, *verdict_lines(rows), *extra, *lacking, *history)

    def run(self, args: argparse.Namespace) -> int:
        view = keep(RunView(*(check_run_dir(path) for path in args.run_dirs)))
        said: set[str] = set()
        # The first frame reads the whole run: one large acyclic graph of records, which the cyclic
        # GC would rescan over and over (as for the ``bulk`` verbs). It stays off while it is built,
        # and what it built is frozen out of later collections (refcounting still frees it) until
        # the view goes live.
        enabled = gc.isenabled()
        gc.disable()
        try:
            rows, found, shown = self.frame(view, args, said)
        finally:
            gc.freeze()
            if enabled:
                gc.enable()
        try:
            if args.json:
                print(
                    json.dumps(
                        {
                            "run": str(view.path),
                            "runs": [str(p) for p in view.paths],
                            "exit_code": exit_code(rows, found),
                            "ranks": [r.to_json() for r in rows],
                            "findings": [dataclasses.asdict(f) for f in found],
                            "missing": self.missing,
                            "history": self.outlook or None,
                            "ended": self.ended.to_json(time.time_ns()) if self.ended is not None else None,
                        },
                        indent=1,
                    )
                )
                return exit_code(rows, found)
            console = make_console()
            if args.once or finished(rows) or not console.is_terminal:  # a script reads one frame, never waits
                console.print(shown)
                return exit_code(rows, found)
        finally:
            gc.unfreeze()  # in-process callers (tests) keep a normal collector
        with Live(shown, console=console, refresh_per_second=4) as live:
            while not finished(rows):
                time.sleep(max(0.1, args.interval))
                rows, found, shown = self.frame(view, args, said)
                live.update(shown)
        return exit_code(rows, found)
