"""``phasetrace compare``: phase durations across the ranks of a run, or between two runs."""

from __future__ import annotations

import argparse
import json

from ..render.compare_table import ranks_table, runs_table
from ..render.lanes import layout
from ..render.phase_stats import between_runs, within_run
from .command import CommandError, make_console, open_run, run_side


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
        parser.add_argument("--top", type=int, metavar="N", help="show only the first N phases")
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
        lays = [layout(open_run(*run_side(arg), split=True), attrs=False) for arg in args.runs]  # shows no attrs
        console = make_console()
        if len(lays) == 1:
            stats = within_run(lays[0])
            if args.json:
                print(json.dumps({"run": args.runs[0], "phases": [s.to_json() for s in stats[: args.top]]}, indent=1))
            else:
                console.print(
                    ranks_table(stats, f"{lays[0].run.run_id}: phases across ranks, largest skew first", args.top)
                )
            return 0
        a, b = lays
        deltas = between_runs(a, b)
        if args.json:
            print(
                json.dumps(
                    {"a": args.runs[0], "b": args.runs[1], "phases": [d.to_json() for d in deltas[: args.top]]},
                    indent=1,
                )
            )
        else:
            title = f"slowest rank per phase, largest change first\n  A = {args.runs[0]}\n  B = {args.runs[1]}"
            console.print(runs_table(deltas, title, args.top))
        return 0
