"""``phasetrace compare``: phase durations across the ranks of a run, or between two runs."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from ..reader.view import ProcessRec
from ..render.compare_table import ranks_table, runs_table
from ..render.lanes import layout, unreadable_text
from ..render.phase_stats import between_runs, within_run
from ..render.term import text
from .command import CommandError, complete, keep, make_console, open_run, run_side
from .usage import at_least

if TYPE_CHECKING:
    from rich.console import Console


class Compare:
    name = "compare"
    bulk = True
    help = "phase durations side by side: across ranks (one run) or between two runs"
    description = """\
With one run: every phase's time on each rank (min, median, max), the skew (max - min: how long
the fastest rank waits for the slowest) and the slowest rank, largest skew first.
With two runs: the slowest rank's time per phase in A and in B and the change, largest change
first; phases found in one run only show '—' on the other side.
A phase a rank runs several ways is split by its variant (e.g. 'model.load_weights [draft]',
'dist.group_coordinator [tp]'); repeats of the same variant are summed (xN).
Phases that never ended count up to the end of the run and are marked (open).

  phasetrace compare RUN_DIR
  phasetrace compare runs/eagle-steps2 runs/eagle-steps3 --json > delta.json
  phasetrace compare n0/A,n1/A n0/B,n1/B     # multi-node runs: each side's directories, comma-joined
  phasetrace compare RUN_DIR --baseline      # against earlier starts of the same launch (phasetrace history)"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "runs",
            nargs="+",
            metavar="RUN_DIR",
            help="one run (ranks) or two runs (A then B); a multi-node run is its directories joined "
            "with commas, one per node: DIR0,DIR1",
        )
        parser.add_argument("--json", action="store_true", help="machine-readable output on stdout")
        parser.add_argument("--top", type=at_least(1), metavar="N", help="show only the first N phases (N ≥ 1)")
        parser.add_argument(
            "--baseline",
            action="store_true",
            help="one run against the earlier starts of its launch (same fingerprint) in its base "
            "directory's history: per phase, this run against their median and p95",
        )

    def run(self, args: argparse.Namespace) -> int:
        if args.baseline:
            from .history import baseline

            return baseline(args)
        if len(args.runs) > 2:
            raise CommandError(f"takes one run directory (ranks) or two (A B), not {len(args.runs)}", 2)
        lays = keep([layout(open_run(*run_side(arg), split=True), attrs=False) for arg in args.runs])  # shows no attrs
        console = make_console()
        missed = [(arg, p) for arg, lay in zip(args.runs, lays, strict=True) for p in lay.run.processes if p.unreadable]
        unread = [
            {"run": arg, "label": p.label, "pid": p.pid, "journal": str(p.path), "why": p.unreadable}
            for arg, p in missed
        ]
        code = max(complete(lay.run) for lay in lays)
        if len(lays) == 1:
            stats = within_run(lays[0])
            if args.json:
                phases = [s.to_json() for s in stats[: args.top]]
                print(json.dumps({"run": args.runs[0], "phases": phases, "unreadable": unread}, indent=1))
            else:
                console.print(
                    ranks_table(stats, f"{lays[0].run.run_id}: phases across ranks, largest skew first", args.top)
                )
                _not_counted(console, missed)
            return code
        a, b = lays
        deltas = between_runs(a, b)
        if args.json:
            phases = [d.to_json() for d in deltas[: args.top]]
            print(json.dumps({"a": args.runs[0], "b": args.runs[1], "phases": phases, "unreadable": unread}, indent=1))
        else:
            title = f"slowest rank per phase, largest change first\n  A = {args.runs[0]}\n  B = {args.runs[1]}"
            console.print(runs_table(deltas, title, args.top))
            _not_counted(console, missed)
        return code


def _not_counted(console: Console, missed: list[tuple[str, ProcessRec]]) -> None:
    """Under the table: each process whose journal could not be read, so its phases are not counted."""
    for arg, proc in missed:
        console.print(text(f"{proc.label}: {unreadable_text(proc)} ({arg}): not counted", style="red"))
