"""``phasetrace watch RUN_DIR``: the stall watchdog as a standalone command over a run directory."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from ..journal.writer import JournalWriter
from ..redact import printable
from ..verdicts.diagnose import Thresholds
from ..verdicts.watchdog import Watchdog
from .command import EXIT_STALLED, PREFIX, check_run_dir, own_journal, report_problems
from .usage import SILENT_HELP, seconds


class Watch:
    name = "watch"
    help = "watch a run live and name the rank that stalls (stacks, diagnosis), killing nothing"
    description = """\
Poll every rank's heartbeats and journal in RUN_DIR and report, within seconds, a rank that
stopped: silent (no heartbeat), straggler (peers wait in a collective it never entered, or it is
still in a phase all peers left), divergent collectives, or no progress anywhere. Each finding is
one line on stderr and a `diagnosis` record in RUN_DIR/journal/, with stack dumps of the ranks
involved in RUN_DIR/stacks/. Stops when every rank is ready.

example:  phasetrace watch phasetrace-runs/20261129-101500-ab12cd --stall-s 60 --silent-after 20
"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        defaults = Thresholds.from_env()
        parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory written by a traced launch")
        parser.add_argument(
            "--stall-s",
            type=seconds,
            default=defaults.stall_s,
            metavar="S",
            help="no progress for this long while peers wait = straggler (default %(default)s)",
        )
        parser.add_argument("--silent-after", type=seconds, metavar="S", help=SILENT_HELP)
        parser.add_argument("--silent-s", type=seconds, dest="silent_after", help=argparse.SUPPRESS)  # its old name
        parser.add_argument(
            "--no-progress-s",
            type=seconds,
            default=defaults.no_progress_s,
            metavar="S",
            help="nothing moved on any rank for this long (default %(default)s)",
        )
        parser.add_argument(
            "--interval",
            type=seconds,
            metavar="S",
            help="seconds between passes (default: the heartbeat interval, $SGLANG_PHASETRACE_HEARTBEAT_S, else 2)",
        )
        parser.add_argument(
            "--exit-on-stall",
            action="store_true",
            help=f"exit with code {EXIT_STALLED} at the first finding (for scripts)",
        )
        parser.add_argument("--timeout", type=seconds, metavar="S", help="give up after this many seconds")
        parser.add_argument("--no-py-spy", action="store_true", help="faulthandler stacks only")

    def run(self, args: argparse.Namespace) -> int:
        run_dir = check_run_dir(args.run_dir, doing="watch")  # it writes its journal there: only into a run
        env = Thresholds.from_env()
        th = dataclasses.replace(  # the environment's thresholds (blocked, busy …), the flags over them
            env,
            heartbeat_s=args.interval or env.heartbeat_s,
            silent_s=args.silent_after or env.silent_s,
            stall_s=args.stall_s,
            no_progress_s=args.no_progress_s,
        )
        writer = open_journal(run_dir)
        dog = Watchdog(run_dir, th, out=sys.stderr, record=writer.write if writer else None, py_spy=not args.no_py_spy)
        deadline = time.monotonic() + args.timeout if args.timeout else None
        stalled = False
        said: set[str] = set()
        try:
            while deadline is None or time.monotonic() < deadline:
                stalled |= bool(dog.step())
                report_problems(dog.run, said)
                ranks = dog.run.ranks
                if stalled and args.exit_on_stall:
                    break
                if ranks and all(p.ready for p in ranks):
                    print(printable(f"{PREFIX} all {len(ranks)} ranks ready"), file=sys.stderr)
                    break
                time.sleep(th.heartbeat_s)
        except KeyboardInterrupt:
            pass
        finally:
            if writer is not None:
                writer.close()
        return EXIT_STALLED if stalled else 0


def open_journal(run_dir: Path) -> JournalWriter | None:
    """This watch's own journal in the run (its diagnoses), or None with one warning when the run
    directory cannot be written (read-only, another user's): the watch then only prints."""
    try:
        return own_journal(run_dir, "watch", "watch", run_dir.name)
    except OSError as exc:
        print(
            printable(
                f"{PREFIX} watch: cannot write {exc.filename} ({exc.strerror or exc}); watching without recording: "
                "findings are printed here only"
            ),
            file=sys.stderr,
        )
        return None
