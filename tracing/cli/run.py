"""``phasetrace run -- <command…>``: trace any SGLang launch, watch it start, summarise it."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .. import keys
from ..render.lanes import Layout, layout
from ..render.run_text import status_line, summary
from ..render.verdict import rank_lanes
from ..rundir import RunView
from .command import CommandError, report_problems
from .export import export_file
from .findings import by_process, findings
from .report import write_report

EXPORTS = ("jaeger", "perfetto")


def hooks_dir() -> Path:
    from ... import sitecustomize_hooks

    return Path(sitecustomize_hooks.__file__).resolve().parent


def new_run_dir(base: str | None) -> Path:
    """A fresh run directory, named as the tracing runtime names them, under ``base`` if given."""
    from ..runtime import new_run_dir as fresh

    path = fresh()
    return (Path(base) / path.name).resolve() if base else path


def milestone(lay: Layout, stalled: bool) -> str | None:
    """``stalled``, ``failed``, ``ready`` (every rank and the launcher), or None while starting."""
    if stalled:
        return "stalled"
    ranks = [lane for lane in lay.lanes if lane.proc.role == "rank"]
    if any(lane.state in ("failed", "incomplete") for lane in ranks):
        return "failed"
    launchers = [lane for lane in lay.lanes if lane.proc.role == "launcher"]
    launched = all(lane.state == "ready" or any(b.span.phase == "server.wait_ready" and b.span.status == "ok"
                                                for b in lane.bars) for lane in launchers)
    return "ready" if ranks and launched and all(lane.state == "ready" for lane in ranks) else None


class LiveLine:
    """One status line on stderr: redrawn in place on a terminal, printed on change in a log."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.last = ""

    def show(self, line: str, signature: Any) -> None:
        if not self.enabled:
            return
        if self.tty:
            width = shutil.get_terminal_size().columns - 1
            sys.stderr.write(f"\r\x1b[K{('phasetrace: ' + line)[:width]}")
            sys.stderr.flush()
        elif signature != self.last:
            print(f"phasetrace: {line}", file=sys.stderr, flush=True)
        self.last = signature

    def clear(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


class Run:
    name = "run"
    help = "run an SGLang launch command traced, with a live status line and a report at the end"
    description = """\
Run any command that starts SGLang with tracing switched on for it and every process it spawns
(the sitecustomize hook on PYTHONPATH) and a fresh run directory. While ranks initialise, one
status line on stderr says where they are. When the ranks are ready, or something fails or
stalls, it prints a summary and writes RUN_DIR/report.html plus Jaeger and Perfetto exports.
Returns the command's exit code.

  phasetrace run -- python -m sglang.launch_server --model-path Qwen/Qwen2.5-7B --tp 4
  phasetrace run --dir /tmp/runs -- python my_engine_script.py"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--dir", metavar="BASE", help=f"where run directories go "
                            f"(default ${keys.ENV_BASE_DIR}, else ./{keys.DEFAULT_BASE_DIR})")
        parser.add_argument("--quiet", action="store_true", help="no live status line")
        parser.add_argument("--interval", type=float, default=0.5, metavar="S", help="status refresh (default 0.5)")
        parser.add_argument("command_line", nargs=argparse.REMAINDER, metavar="-- COMMAND …",
                            help="the launch command, after --")

    def run(self, args: argparse.Namespace) -> int:
        command = args.command_line[1:] if args.command_line[:1] == ["--"] else args.command_line
        if not command:
            raise CommandError("nothing to run; usage: phasetrace run -- <command …>", 2)
        run_dir = new_run_dir(args.dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env[keys.ENV_RUN_DIR] = str(run_dir)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(hooks_dir()), env.get("PYTHONPATH", "")) if p)
        print(f"phasetrace: tracing into {run_dir}", file=sys.stderr, flush=True)
        try:
            child = subprocess.Popen(command, env=env)
        except OSError as exc:
            run_dir.rmdir()  # empty: nothing ran
            raise CommandError(f"cannot start {command[0]}: {exc.strerror or exc}", 127) from None
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
        try:
            rc = self.watch(child, RunView(run_dir), LiveLine(not args.quiet), args.interval)
        finally:
            signal.signal(signal.SIGTERM, previous)
        return rc if rc >= 0 else 128 - rc

    def watch(self, child: subprocess.Popen, view: RunView, line: LiveLine, interval: float) -> int:
        self.said: set[str] = set()  # journal problems already reported
        reported: str | None = None
        while True:
            try:
                rc = child.wait(timeout=interval)
                break
            except subprocess.TimeoutExpired:
                pass
            except KeyboardInterrupt:  # the child got the same Ctrl-C: let it finish its own way
                continue
            lay, found = self.look(view)
            if not lay.lanes:
                continue
            verdicts = by_process(view, found)
            line.show(status_line(lay, verdicts), [(lane.label, lane.state, lane.where and lane.where.key)
                                                   for lane in rank_lanes(lay)])
            reached = milestone(lay, bool(found))
            if reached is not None and reached != reported:
                line.clear()
                self.finish(lay, found)
                reported = reached
        line.clear()
        view.refresh(final=True)
        lay, found = self.look(view, final=True)
        if not lay.lanes:
            print(f"phasetrace: the command exited {rc} and no traced process wrote to {view.path} "
                  "(did it start SGLang?)", file=sys.stderr)
        elif reported is None:
            print(f"phasetrace: the command exited with {rc}", file=sys.stderr)
            self.finish(lay, found)
        else:  # the summary was printed at the milestone; bring the files up to the final state
            self.finish(lay, found, quiet=True)
            print(f"phasetrace: the command exited with {rc}; report and exports updated in {view.path}",
                  file=sys.stderr)
        return rc

    @staticmethod
    def look(view: RunView, final: bool = False) -> tuple[Layout, list[Any]]:
        if not final:
            view.refresh()
        now = None if final else time.time_ns()
        lay = layout(view, now)
        return lay, findings(view, lay.end)

    def finish(self, lay: Layout, found: list[Any], quiet: bool = False) -> None:
        """Print the summary; write the report and exports; print their paths."""
        if not quiet:
            for text in summary(lay, found, by_process(lay.run, found)):
                print(f"phasetrace: {text}", file=sys.stderr)
            report_problems(lay.run, self.said)
        outputs = [("report", lay.run.path / "report.html", lambda p: write_report(lay, str(p)))]
        outputs += [(fmt, lay.run.path / f"export-{fmt}.json", lambda p, f=fmt: export_file(lay, f, str(p)))
                    for fmt in EXPORTS]
        for name, path, write in outputs:
            try:
                write(path)
                if not quiet:
                    print(f"phasetrace: {name}: {path}", file=sys.stderr)
            except (CommandError, OSError) as exc:
                print(f"phasetrace: {name} not written: {exc}", file=sys.stderr)
        sys.stderr.flush()
