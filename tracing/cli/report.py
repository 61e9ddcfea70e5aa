"""``phasetrace report RUN_DIR -o report.html``: one self-contained HTML file for a run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..reader.ended import Ended, of_run
from ..redact import printable
from ..render.html_report import render_report
from ..render.lanes import Layout, layout
from ..verdicts.diagnose import Finding
from ..verdicts.findings import by_process, findings
from .command import PREFIX, RUN_DIRS_HELP, complete, keep, open_run, write_output


def write_report(
    lay: Layout, output: str, found: list[Finding] | None = None, ended: Ended | None = None, history: str = ""
) -> None:
    """Judged at the run's last record (unless ``found`` is given), so an old finished run is not
    called silent today; ``ended``: the launch served and has ended since (``reader.ended.of_run``)."""
    found = findings(lay.run, lay.end) if found is None else found
    write_output(render_report(lay, found, by_process(lay.run, found), ended, history), output)


def against_history(run_dirs: list[str]) -> str:
    """The report's "Against its history" section: the run (read whole again: every phase's time)
    against the earlier starts of its launch, from its base directory's history or the fleet's
    (``$SGLANG_PHASETRACE_HISTORY``); "" without one. A history that cannot be read costs the report
    only this section (one line on stderr)."""
    from ..history import where as places

    try:
        where = places.of_run_dir(Path(run_dirs[0]))
        if where is None or (isinstance(where, Path) and not where.exists()):
            return ""  # no history: nothing more imported (the store, SQLite: 60 ms)
    except places.HistoryError as exc:
        print(printable(f"{PREFIX} report: history: {exc}; the report is made without it"), file=sys.stderr)
        return ""
    from ..history import fingerprint, store
    from ..history.baseline import against
    from ..history.measure import measure
    from ..render.history_html import Against, section

    try:
        run = open_run(*run_dirs)
        fp = fingerprint.of_run(run)
        if fp is None:
            return ""
        with store.History.open(where) as history:
            usuals = history.usuals(fp.id, exclude={run.run_id})
            starts = history.starts(fp.id, limit=TREND)
        m = measure(run)
        return section(Against(fp.summary, against(m, usuals), starts, run.run_id, m.total_s))
    except store.HistoryError as exc:
        print(printable(f"{PREFIX} report: history: {exc}; the report is made without it"), file=sys.stderr)
        return ""


TREND = 30  # starts in the report's trend of total time


class Report:
    name = "report"
    bulk = True
    help = "one self-contained HTML page: verdict, stall diagnosis and stacks, timeline, compare"
    description = """\
Write a single HTML file (no network needed to view it) showing at a glance which rank stopped
and where: its first line is the verdict (as the watchdog says it: STALL, DIED, FAILED, NOT
STARTED, with rank, phase, for how long, what it is doing, who waits on what), then the diagnosis
with the culprit's stack dump, errors with their tracebacks, one timeline lane per process
(nested phases, hover for attributes) and the per-phase comparison across ranks.

  phasetrace report RUN_DIR -o startup.html && xdg-open startup.html
  phasetrace report node0/RUN_DIR node1/RUN_DIR -o launch.html   # multi-node: one page"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help=RUN_DIRS_HELP)
        parser.add_argument(
            "-o", "--output", metavar="FILE", help="HTML file (default: report.html in the first RUN_DIR)"
        )

    def run(self, args: argparse.Namespace) -> int:
        lay = keep(layout(open_run(*args.run_dirs, split=True)))  # each lane's bars made where they were read
        output = args.output or str(Path(args.run_dirs[0]) / "report.html")
        write_report(lay, output, ended=of_run(lay.run), history=against_history(args.run_dirs))
        if output != "-":
            print(f"wrote {output}")
        return complete(lay.run)
