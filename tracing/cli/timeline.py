"""``phasetrace timeline RUN_DIR``: the per-rank Gantt chart in the terminal."""

from __future__ import annotations

import argparse

from ..render.jsonout import dumps
from ..render.lanes import layout
from ..render.timeline_text import MIN_WIDTH, render_timeline, timeline_json
from .command import RUN_DIRS_HELP, complete, keep, make_console, open_run, print_lines, write_output
from .usage import at_least


class Timeline:
    name = "timeline"
    bulk = True
    help = "per-rank Gantt chart of the startup phases"
    description = """\
Draw each process of a run as a row, its phases as bars on one time axis.
A letter names each phase (legend below the chart); the slowest rank of a phase draws it in
capitals; a phase that never ended (still running, or the process died there) ends with '>'.

  phasetrace timeline phasetrace-runs/20250101-120000-ab12cd
  phasetrace timeline RUN_DIR --depth 2 --width 160   # sub-phases on extra rows
  phasetrace timeline node0/RUN_DIR node1/RUN_DIR     # a multi-node launch: ranks as tp9@node-1"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help=RUN_DIRS_HELP)
        parser.add_argument(
            "--depth",
            type=at_least(0),
            default=1,
            metavar="N",
            help="phase levels below each process root to draw, one row each (default 1; 0 draws the roots)",
        )
        parser.add_argument(
            "--width",
            type=at_least(MIN_WIDTH),
            metavar="COLS",
            help=f"chart width, at least {MIN_WIDTH} (default: $COLUMNS, else the terminal's, else 200)",
        )
        parser.add_argument("--json", action="store_true", help="each process's phases as one JSON document")

    def run(self, args: argparse.Namespace) -> int:
        depth = args.depth
        if args.json:
            lay = keep(layout(open_run(*args.run_dirs), depth=depth))
            write_output(dumps(timeline_json(lay, depth)) + b"\n", None)
            return complete(lay.run)
        lay = keep(layout(open_run(*args.run_dirs, split=True), depth=depth))  # each lane drawn where it was read
        console = make_console(args.width)
        print_lines(console, render_timeline(lay, width=console.width, depth=depth))
        return complete(lay.run)
