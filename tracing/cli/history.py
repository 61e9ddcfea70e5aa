"""``phasetrace history``: earlier starts of each launch, their phases' usual times, the trend; and
``phasetrace compare RUN --baseline`` (``baseline``): one run against its launch's history."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from ..history import fingerprint
from ..history.baseline import against, culprit
from ..history.measure import measure
from ..history.store import ENV_HISTORY, History, HistoryError, grew, location, write
from ..render.history_table import baseline_table, phases_table, starts_table, trend_lines
from ..render.term import text
from ..render.units import duration
from .command import CommandError, make_console, open_run, run_side
from .usage import at_least

TOP_ALL = 10  # phases shown per launch when every launch is listed


def _where(base: str | Path | None) -> Path:
    path = location(base)
    if path is None:
        raise CommandError(f"the history is off ({ENV_HISTORY}=0)")
    return path


def _open(path: Path) -> History:
    try:
        return History.open(path)
    except HistoryError as exc:
        raise CommandError(str(exc)) from None


class HistoryCommand:
    name = "history"
    bulk = True
    help = "earlier starts of the same launch: per-phase medians and spread, the trend, which phase grew"
    description = f"""\
Every traced start is recorded when it ends in BASE/history.sqlite (BASE: --dir, else
$SGLANG_PHASETRACE_DIR, else ./phasetrace-runs; ${ENV_HISTORY} moves it, or =0 turns it off),
keyed by its launch fingerprint: model (path, config hash), parallel layout, SGLang and torch
versions, devices, and the server arguments that change start time. Starts are compared only
with starts of the same fingerprint.
Shows each launch (or the one --fingerprint names; a prefix will do): its starts, newest first;
per phase the slowest rank's time across them (min, median, p95, max, the newest); and the
trend: which phase of the newest start grew past its earlier median.

  phasetrace history
  phasetrace history --fingerprint 3f2a --json | jq '.launches[0].trend'
  phasetrace history --record runs/20261203-183853-a85ae2    # a start made before, or elsewhere"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--dir", metavar="BASE", help="the base directory whose history to read")
        parser.add_argument("--fingerprint", metavar="ID", help="one launch (its fingerprint id, or a prefix)")
        parser.add_argument("--json", action="store_true", help="machine-readable output on stdout")
        parser.add_argument(
            "--limit", type=at_least(1), default=10, metavar="N", help="starts shown per launch (default 10)"
        )
        parser.add_argument(
            "--top",
            type=at_least(1),
            metavar="N",
            help=f"the N longest phases (default: all; {TOP_ALL} per launch when all are listed)",
        )
        parser.add_argument(
            "--record",
            nargs="+",
            metavar="RUN_DIR",
            help="record finished runs into their base directory's history (--dir: into that one's)",
        )

    def run(self, args: argparse.Namespace) -> int:
        if args.record:
            return self.record(args)
        path = _where(args.dir)
        if not os.path.lexists(path):  # nothing recorded yet: an empty history, not an error (`| jq`)
            return self.show(path, [], args)
        with _open(path) as history:
            try:
                launches = history.launches()
                if args.fingerprint:
                    fid = history.resolve(args.fingerprint)
                    launches = [la for la in launches if la.id == fid]
                out = [self._launch(history, la, args) for la in launches]
            except HistoryError as exc:
                raise CommandError(str(exc)) from None
        return self.show(path, out, args)

    def show(self, path: Path, out: list[dict[str, Any]], args: argparse.Namespace) -> int:
        if args.json:
            print(json.dumps({"history": str(path), "launches": [o["json"] for o in out]}, indent=1))
            return 0
        console = make_console()
        if not out:
            console.print(text(f"{path}: no start recorded yet"))
        for o in out:
            la = o["launch"]
            console.print(
                text(f"launch {la.id}  {la.summary}  ({la.starts} start{'s' if la.starts > 1 else ''})", "bold")
            )
            console.print(starts_table(o["starts"], "  starts, newest first"))
            top = args.top if args.top is not None else (None if args.fingerprint else TOP_ALL)
            console.print(
                phases_table(o["usuals"], "  phases: the slowest rank's time in each start, longest first", top)
            )
            for line in trend_lines(o["newest"], o["changes"], o["grew"]):
                console.print(line)
            console.print()
        return 0

    def _launch(self, history: History, la: Any, args: argparse.Namespace) -> dict[str, Any]:
        starts = history.starts(la.id, limit=args.limit)
        usuals = list(history.usuals(la.id).values())
        newest, changes = history.trend(la.id)
        grown = grew(changes)
        return {
            "launch": la,
            "starts": starts,
            "usuals": usuals,
            "newest": newest,
            "changes": changes,
            "grew": grown,
            "json": {
                **la.to_json(),
                "recent": [s.to_json() for s in starts],
                "phases": [u.to_json() for u in usuals],
                "trend": {
                    "newest": newest.run_id if newest else None,
                    "changes": [c.to_json() for c in changes],
                    "grew": grown.phase if grown else None,
                },
            },
        }

    def record(self, args: argparse.Namespace) -> int:
        console = make_console()
        for arg in args.record:
            run = open_run(*run_side(arg))
            path = _where(args.dir if args.dir else Path(run.path).parent)
            try:
                done = write(run, path)
            except HistoryError as exc:
                raise CommandError(f"{arg}: not recorded: {exc}") from None
            if done is None:
                raise CommandError(
                    f"{arg}: not recorded: its journals do not say what was launched (no server arguments)"
                )
            console.print(
                text(
                    f"recorded {done.run_id}: {done.outcome} in {done.total_s:.1f} s, launch {done.fingerprint.id} "
                    f"({done.fingerprint.summary}) in {path}"
                )
            )
        return 0


def baseline(args: argparse.Namespace) -> int:
    """``compare RUN --baseline``: the run against the earlier starts of its launch, from the history
    of its base directory (its parent; ``$SGLANG_PHASETRACE_HISTORY`` where set)."""
    if len(args.runs) != 1:
        raise CommandError(f"--baseline takes one run directory, not {len(args.runs)}", 2)
    run = open_run(*run_side(args.runs[0]))  # whole: every phase's time
    fp = fingerprint.of_run(run)
    if fp is None:
        raise CommandError(f"{args.runs[0]}: its journals do not say what was launched (no server arguments)")
    path = _where(Path(run.path).parent)
    with _open(path) as history:
        try:
            usuals = history.usuals(fp.id, exclude={run.run_id})
            earlier = [s for s in history.starts(fp.id) if s.run_id != run.run_id]
        except HistoryError as exc:
            raise CommandError(str(exc)) from None
    rows = against(measure(run), usuals)
    named = culprit(rows)
    if args.json:
        doc = {
            "run": args.runs[0],
            "fingerprint": fp.to_json(),
            "history": str(path),
            "starts": len(earlier),
            "culprit": named.phase if named else None,
            "phases": [r.to_json() for r in rows[: args.top]],
        }
        print(json.dumps(doc, indent=1))
        return 0
    console = make_console()
    if not earlier:
        console.print(text(f"{run.run_id}: no earlier start of launch {fp.id} ({fp.summary}) in {path}"))
        return 0
    flagged = [r for r in rows if r.flagged]
    title = (
        f"{run.run_id} against {len(earlier)} earlier start{'s' if len(earlier) > 1 else ''} of launch {fp.id}\n"
        f"  {fp.summary}"
    )
    console.print(baseline_table(rows, title, args.top))
    if named is not None and named.usual is not None:
        u = named.usual
        more = f"; {len(flagged) - 1} more phases around or beside it" if len(flagged) > 1 else ""
        console.print(
            text(
                f"'{named.phase}' took {duration(named.this)}: past the p95 of earlier starts ({duration(u.p95)}; "
                f"median {duration(u.median)}, {u.n} starts){more}",
                "bold red",
            )
        )
    return 0
