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
from ..history.hosts import outliers
from ..history.measure import measure
from ..history.store import ENV_HISTORY, Dsn, History, HistoryError, grew, location, parse, write
from ..render.history_table import baseline_table, hosts_table, phases_table, starts_table, trend_lines
from ..render.term import text
from ..render.units import duration
from .command import CommandError, make_console, open_run, run_side
from .usage import at_least

TOP_ALL = 10  # phases shown per launch when every launch is listed


def _where(base: str | Path | None) -> Path | Dsn:
    """The history: SQLite in ``base``, or where ``$SGLANG_PHASETRACE_HISTORY`` says (a PostgreSQL
    DSN too); a setting that is neither a path nor a DSN is this command's error, in one line."""
    try:
        path = location(base)
    except HistoryError as exc:
        raise CommandError(str(exc)) from None
    if path is None:
        raise CommandError(f"the history is off ({ENV_HISTORY}=0)")
    return path


def _open(path: Path | Dsn) -> History:
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
  phasetrace history --record runs/20261203-183853-a85ae2    # a start made before, or elsewhere

A fleet keeps one history in PostgreSQL: ${ENV_HISTORY}=postgresql://user:password@host/db (or a
libpq service=NAME; pip install 'sglang-phasetrace[postgresql]'); every start on every pod and node
is recorded there, and a fresh pod's first start is judged against them. --by host shows, per
phase, each host's median and p95 against the fleet's. export/import move a history between
SQLite, PostgreSQL and a JSON-lines file (TARGET: a .jsonl file, a SQLite file or a DSN):

  phasetrace history --by host
  phasetrace history export history.jsonl      # from this history (--dir, or ${ENV_HISTORY})
  phasetrace history import phasetrace-runs/history.sqlite   # into it"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "move", nargs="?", choices=("export", "import"), help="move a history to TARGET, or from it into this one"
        )
        parser.add_argument("target", nargs="?", metavar="TARGET", help="a .jsonl file, a SQLite file or a DSN")
        parser.add_argument("--by", choices=("host",), help="per phase, each host against the fleet")
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
        if args.move:
            return self.transfer(args)
        if args.target:
            raise CommandError(f"{args.target!r}: TARGET goes with export or import", 2)
        if args.record:
            return self.record(args)
        path = _where(args.dir)
        if isinstance(path, Path) and not os.path.lexists(path):  # nothing recorded yet: empty, no error (`| jq`)
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
            if o["hosts"] is not None:
                title = "  per host: median and p95 of each phase (x: the fleet's median)"
                console.print(hosts_table(o["hosts"], title, top))
                for found in outliers(o["hosts"]):
                    console.print(
                        text(
                            f"unusual on host {found.host}: '{found.phase}' {duration(found.median_s)} "
                            f"({found.n} starts), {found.ratio:.1f}x the fleet's median "
                            f"({duration(found.fleet_s)} on {found.hosts} other host{'s' if found.hosts > 1 else ''})",
                            "bold",
                        )
                    )
            console.print()
        return 0

    def transfer(self, args: argparse.Namespace) -> int:
        """``export TARGET`` / ``import TARGET``: this history (``--dir``, else the setting) to or
        from a JSON-lines file, a SQLite file or a PostgreSQL DSN."""
        from ..history import transfer

        if not args.target:
            raise CommandError(f"{args.move} needs a TARGET (a .jsonl file, a SQLite file or a DSN)", 2)
        here = _where(args.dir)
        lines = args.target.endswith((".jsonl", ".json")) or args.target == "-"
        try:
            other = None if lines else parse(args.target)
            if args.move == "export":
                with _open(here) as history:
                    docs = transfer.documents(history)
                    n = transfer.write_lines(docs, Path(args.target)) if other is None else transfer.load(docs, other)
                src, dst = here, other or args.target
            else:
                if other is None:
                    n = transfer.load(transfer.read_lines(Path(args.target)), here)
                else:
                    with _open(other) as history:
                        n = transfer.load(transfer.documents(history), here)
                src, dst = other or args.target, here
        except HistoryError as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"{args.target}: {exc.strerror or exc}") from None
        make_console().print(text(f"{args.move}ed {n} start{'s' if n != 1 else ''}: {src} -> {dst}"))
        return 0

    def _launch(self, history: History, la: Any, args: argparse.Namespace) -> dict[str, Any]:
        starts = history.starts(la.id, limit=args.limit)
        usuals = list(history.usuals(la.id).values())
        newest, changes = history.trend(la.id)
        grown = grew(changes)
        hosts = history.by_host(la.id) if args.by == "host" else None
        return {
            "hosts": hosts,
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
                **(
                    {"hosts": {h or "fleet": [u.to_json() for u in us.values()] for h, us in hosts.items()}}
                    if hosts is not None
                    else {}
                ),
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
