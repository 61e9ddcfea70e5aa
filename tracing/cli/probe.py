"""``phasetrace probe [RUN_DIR]``: an exec probe for orchestrators (a Kubernetes probe, a Slurm or
shell gate). Exit 0 while the start progresses or the launch serves; a distinct code once a verdict
stands. One line on stdout says why.

Fast at any size of launch: it reads the state file the launcher's watchdog replaces after each
pass (``verdicts.startup``), and the journals only when that file is missing, stale or its writer
gone. It reads files and ``/proc`` only: no process is signalled, traced or paused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from .. import files, keys, other_processes
from ..journal.layout import JOURNAL_DIR, STARTUP_FILE
from ..journal.tail import read_regular
from ..redact import printable
from ..verdicts.startup import CODES, Startup
from .command import CommandError, newest_run, report_problems, untrusted
from .usage import STILL_STARTING, seconds

STATE_MAX = 1 << 20  # a state file is a few kB; more is not ours


def find_run(arg: str | None) -> Path | None:
    """The launch's run directory as the CLI finds one: ``arg`` (a run directory, or a directory of
    runs: its newest), else ``$SGLANG_PHASETRACE_RUN_DIR``, else the newest run of
    ``$SGLANG_PHASETRACE_DIR`` (default ``./phasetrace-runs``). None: there is none yet."""
    given = arg or os.environ.get(keys.ENV_RUN_DIR)
    if given:
        path = Path(given)
        if os.path.exists(path) and not path.is_dir():
            raise CommandError(f"{path}: not a run directory (not a directory)")
        return path if (path / JOURNAL_DIR).is_dir() or not path.is_dir() else newest_run(path) or path
    return newest_run(os.environ.get(keys.ENV_BASE_DIR) or keys.DEFAULT_BASE_DIR)


def read_state(run_dir: Path, now_ns: int, stale_s: float) -> dict[str, Any] | None:
    """The watchdog's last state, while it speaks for the launch: written within ``stale_s`` (or
    final: serving, or a verdict) by a writer still running on this host. None otherwise."""
    try:
        raw = read_regular(run_dir / STARTUP_FILE, limit=STATE_MAX)
        doc = json.loads(raw)
    except (OSError, ValueError):
        return None
    writer = doc.get("writer") if isinstance(doc, dict) else None
    if not isinstance(writer, dict) or doc.get("state") not in CODES or not isinstance(doc.get("t"), int):
        return None
    alive = other_processes.same_process(writer.get("pid") or 0, writer.get("host") or "", writer.get("start_ticks"),
                               writer.get("boot_id"))  # fmt: skip
    if not alive:  # the launcher is gone: how it ended is in the journals
        return None
    if doc["state"] == "starting" and (now_ns - doc["t"]) / 1e9 > stale_s:
        return None  # its watchdog stopped speaking: judge from the journals
    return doc


def assess_journals(run_dir: Path, now_ns: int) -> dict[str, Any]:
    """What ``status`` would say, from the journals (the state file could not be used)."""
    from ..reader.load import load_run
    from ..verdicts import startup
    from ..verdicts.findings import findings, gone_ranks

    view = load_run(run_dir)
    report_problems(view)  # on stderr: stdout is the one line
    return startup.of_pass(view, findings(view, now_ns, gone=gone_ranks(view)), now_ns).to_json()


class Probe:
    name = "probe"
    help = "exit 0 while the start progresses or serves, a verdict's code once one stands (for orchestrators)"
    description = f"""\
An exec probe for Kubernetes, Slurm or a shell gate. Exits 0 while the start progresses (slowly
or not) or the launch serves; once a verdict stands, its code (below). A RUN_DIR that is a file,
not a directory, is an error (1), not a run still to come ({CODES["no_run"]}).
One line on stdout says why (the verdict's first line). It finds the run as the CLI does: RUN_DIR
(or a directory of runs: its newest), else ${keys.ENV_RUN_DIR}, else the newest run of
${keys.ENV_BASE_DIR}. It signals, traces and pauses nothing.

  phasetrace probe || echo "the start is in trouble"
  phasetrace probe --wait 3600 "$RUN_DIR" && python bench.py   # a gate: wait until it serves"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="a run directory, or a directory of runs")
        parser.add_argument(
            "--json",
            action="store_true",
            help="the start's state as one JSON document: exit_code, and processes (a list; null where the "
            "answer came from the watchdog's state file, which holds none)",
        )
        parser.add_argument(
            "--wait", type=seconds, metavar="S", help="wait up to S seconds for the launch to serve or a verdict"
        )

    def run(self, args: argparse.Namespace) -> int:
        deadline = time.monotonic() + args.wait if args.wait is not None else None
        while True:
            doc = self.look(args.run_dir)
            waiting = deadline is not None and doc["state"] in ("starting", "no_run")
            if not waiting or time.monotonic() >= deadline:  # type: ignore[operator]
                break
            time.sleep(1.0)
        state_code = doc.pop("code")  # one exit code in the JSON: the probe's own
        code = STILL_STARTING if waiting else state_code
        if args.json:
            print(json.dumps({**doc, "exit_code": code}, indent=1))
        else:
            print(printable(doc["line"]))
        sys.stdout.flush()
        return code

    def look(self, arg: str | None) -> dict[str, Any]:
        run_dir = find_run(arg)
        now = time.time_ns()
        if run_dir is None or not (run_dir / JOURNAL_DIR).is_dir():
            where = run_dir or Path(os.environ.get(keys.ENV_BASE_DIR) or keys.DEFAULT_BASE_DIR)
            line = f"sglang-phasetrace: no run in {where} yet"
            return Startup("no_run", line, run=str(where), t=now).to_json()  # processes: []
        state = run_dir / STARTUP_FILE
        why = untrusted(run_dir) or (files.not_private(state) if os.path.lexists(state) else None)
        if why is not None:
            raise CommandError(f"refusing to read {run_dir}: {why}")  # what another user could write says nothing
        from ..verdicts.diagnose import Thresholds

        th = Thresholds.from_env()
        doc = read_state(run_dir, now, max(3 * th.heartbeat_s, 10.0))
        if doc is None:
            try:
                doc = assess_journals(run_dir, now)
            except OSError as exc:
                raise CommandError(f"{run_dir}: cannot read the run ({exc.strerror or exc})") from None
            return doc  # with its processes, as the journals say them
        doc.pop("writer", None)
        return doc | {"processes": None}  # the state file holds none
