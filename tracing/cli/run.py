"""``phasetrace run -- <command…>``: trace any SGLang launch, watch it start, summarise it.

One voice: a verdict (STALL, DIED, FAILED, NOT STARTED, ROOT CAUSE) is printed once, in the
watchdog's words and prefix, by whoever watches. While a traced launcher with its watchdog runs,
the launcher says them (each is a ``diagnosis`` record in its journal) and ``phasetrace run`` prints
only its summary after them; what no process of the run recorded, ``phasetrace run`` says itself —
at once when no launcher watches, or at the end when the launcher died before its last words
(SIGKILL, the OOM killer). Its own informational lines (the live line, the summary table, the files
written) keep the ``phasetrace:`` prefix, so that a reader of the launch's stderr tells them from
what the traced processes and the verdicts say (``sglang-phasetrace:``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .. import files, keys
from ..history.store import record
from ..journal.writer import JournalWriter
from ..reader.view import RunView
from ..redact import printable
from ..render.lanes import Layout, layout
from ..render.run_text import status_line, summary
from ..render.verdict import rank_lanes
from ..verdicts import postmortem, usual, voice
from ..verdicts.diagnose import PREFIX, Finding
from ..verdicts.findings import ENDED, alarms, by_process, findings, gone_ranks, recorded, running
from .command import CommandError, own_journal, report_problems, where
from .env import hooks_dir
from .export import export_file
from .report import write_report
from .usage import seconds

EXPORTS = ("jaeger", "perfetto")


def new_run_dir(base: str | None) -> Path:
    """A fresh run directory, named as the tracing runtime names them, under ``base`` if given."""
    from ..recorder.runtime import new_run_dir as fresh

    path = fresh()
    return (files.home_of(base) / path.name).resolve() if base else path


def make_run_dir(base: str | None) -> Path:
    """A fresh private run directory (0700), or a ``CommandError`` before anything is started."""
    run_dir = new_run_dir(base)
    try:
        files.check_home(run_dir.parent)
        files.private_dir(run_dir)
        files.check_home(run_dir.parent)
    except OSError as exc:
        raise CommandError(
            f"cannot create a run directory under {run_dir.parent}: {exc.strerror if exc.strerror else exc}"
        ) from None
    return run_dir


FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Forwarding:
    """While the command runs, a SIGTERM, SIGHUP or SIGINT sent to ``phasetrace run`` goes to the
    command, and ``phasetrace run`` keeps waiting for it (so ``kill``, ``docker stop``, a batch
    scheduler reach the server, and get its exit code back). A signal this process ignores (``nohup``,
    a background job) stays ignored. A Ctrl-C at the terminal already reached the command, which shares
    our foreground process group: that SIGINT is not sent twice."""

    def __init__(self, child: subprocess.Popen) -> None:
        self.child = child
        self.previous: dict[int, Any] = {}
        self.requested = False  # someone asked the command to stop: ranks ending now are not news

    def __enter__(self) -> Forwarding:
        for sig in FORWARDED:
            try:
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self.previous[sig] = signal.signal(sig, self.forward)
            except (ValueError, OSError):  # not the main thread: nothing forwarded
                pass
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self.previous.items():
            signal.signal(sig, previous)

    def forward(self, signum: int, frame: Any) -> None:
        self.requested = True
        if signum == signal.SIGINT and _terminal_sent_both():
            return
        with contextlib.suppress(OSError):  # already gone
            self.child.send_signal(signum)


def _terminal_sent_both() -> bool:
    """We are the terminal's foreground process group (the command with us): a Ctrl-C reached both."""
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            return os.tcgetpgrp(fd) == os.getpgrp()
    return False


def wait(child: subprocess.Popen) -> int:
    """The command's exit status, however long it takes (signals to us are forwarded meanwhile)."""
    while True:
        try:
            return child.wait()
        except KeyboardInterrupt:  # a SIGINT before our handler was set, or one we did not forward
            continue


def ended(rc: int) -> str:
    """``exited with 3``, ``was killed by SIGKILL (exit status 137)``."""
    if rc >= 0:
        return f"exited with {rc}"
    try:
        name = signal.Signals(-rc).name
    except ValueError:
        name = f"signal {-rc}"
    return f"was killed by {name} (exit status {128 - rc})"


def milestone(lay: Layout, stalled: bool) -> str | None:
    """``stalled``, ``failed``, ``ready`` (every rank and the launcher), or None while starting."""
    if stalled:
        return "stalled"
    ranks = [lane for lane in lay.lanes if lane.proc.role == "rank"]
    if any(lane.state in ("failed", "incomplete") for lane in ranks):
        return "failed"
    launchers = [lane for lane in lay.lanes if lane.proc.role == "launcher"]
    launched = all(
        lane.state in ("ready", "serving")
        or any(b.span.phase in keys.READY_PHASES and b.span.status == "ok" for b in lane.bars)
        for lane in launchers
    )
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
            sys.stderr.write(f"\r\x1b[K{printable('phasetrace: ' + line)[:width]}")
            sys.stderr.flush()
        elif signature != self.last:
            print(printable(f"phasetrace: {line}"), file=sys.stderr, flush=True)
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
        parser.add_argument(
            "--dir",
            metavar="BASE",
            help=f"where run directories go (default ${keys.ENV_BASE_DIR}, else ./{keys.DEFAULT_BASE_DIR})",
        )
        parser.add_argument("--quiet", action="store_true", help="no live status line")
        parser.add_argument("--interval", type=seconds, default=0.5, metavar="S", help="status refresh (default 0.5)")
        parser.add_argument(
            "command_line", nargs=argparse.REMAINDER, metavar="-- COMMAND …", help="the launch command, after --"
        )

    def run(self, args: argparse.Namespace) -> int:
        command = args.command_line[1:] if args.command_line[:1] == ["--"] else args.command_line
        if not command:
            raise CommandError("nothing to run; usage: phasetrace run -- <command …>", 2)
        run_dir = make_run_dir(args.dir)
        env = dict(os.environ)
        env[keys.ENV_RUN_DIR] = str(run_dir)
        self.launcher_watches = env.get(keys.ENV_WATCHDOG, "1") != "0"  # the launcher's watchdog is on
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(hooks_dir()), env.get("PYTHONPATH", "")) if p)
        print(printable(f"phasetrace: tracing into {run_dir}"), file=sys.stderr, flush=True)
        try:
            child = self.start(command, env)
        except OSError as exc:
            run_dir.rmdir()  # empty: nothing ran
            raise CommandError(f"cannot start {command[0]}: {exc.strerror or exc}", 127) from None
        with Forwarding(child) as self.forwarding:
            try:
                self.watch(child, RunView(run_dir), LiveLine(not args.quiet), args.interval)
            finally:  # whatever happened in here, the command is never left behind unsupervised
                rc = wait(child)
        return rc if rc >= 0 else 128 - rc

    def start(self, command: list[str], env: dict[str, str]) -> subprocess.Popen:
        """Start the command (``preflight`` starts it in its own session, to stop it as a group)."""
        return subprocess.Popen(command, env=env)

    def watch(self, child: subprocess.Popen, view: RunView, line: LiveLine, interval: float) -> None:
        """Show the live line and the summary at each milestone until the command exits. A failure
        of ours in here is said once and the live view stops; the command is still waited for."""
        self.said: set[str] = set()  # journal problems already reported
        self.failures: set[str] = set()
        self.spoken: set[tuple[int, str]] = set()  # (pid, verdict word) this process printed
        self.hints_said: set[str] = set()  # known-fix hints this process printed (each once)
        self.launcher_watches = getattr(self, "launcher_watches", True)
        self.journal: JournalWriter | None = None  # where this process records what it says
        self.journal_failed = False
        self.child, self.line = child, line
        reported: str | None = None
        live = True
        while True:
            try:
                child.wait(timeout=interval)
                break
            except subprocess.TimeoutExpired:
                pass
            if not live:
                continue
            try:
                reported = self.step(view, line, reported)
            except Exception as exc:
                self.failed("the live status", exc)
                live = False
        try:
            line.clear()
            self.wrap_up(view, child.returncode, reported)
        except Exception as exc:
            self.failed("the summary", exc)

    def step(self, view: RunView, line: LiveLine, reported: str | None) -> str | None:
        """One refresh of the live line; the summary when a milestone is reached. Returns the
        latest milestone reported."""
        view.refresh()
        defer = self.launcher_speaks(view)
        lay, found = self.look(view, gone={} if defer or self.stopping else gone_ranks(view))
        if not lay.lanes:
            return reported
        verdicts = by_process(view, found)
        line.show(
            status_line(lay, verdicts, usual.known(view)),
            [(lane.label, lane.state, lane.where and lane.where.key) for lane in rank_lanes(lay)],
        )
        if self.speak(view, found, defer):  # the launcher is about to say it: the summary comes after
            return reported
        reached = milestone(lay, bool(alarms(found)))
        if reached is not None and reached != reported:
            line.clear()
            self.finish(lay, found)
            return reached
        return reported

    def wrap_up(self, view: RunView, rc: int, reported: str | None) -> None:
        """The final view. Verdicts nobody said are said now (the launcher may have died before its
        last words), the root cause with them; then the summary and the files."""
        view.refresh(final=True)
        last_words = self.launcher_said_last_words(view)
        gone = {} if last_words or self.stopping else gone_ranks(view)
        lay, found = self.look(view, final=True, gone=gone)
        self.speak(view, found, defer=False)
        first = alarms(found)[:1]
        if not last_words and first and first[0].kind in ENDED:  # a stall said earlier is the root cause
            text = postmortem.root_cause_line(view, gone)
            if text is not None:
                print(printable(f"{PREFIX} {text}"), file=sys.stderr, flush=True)
        if self.journal is not None:
            self.journal.close()
        if not lay.lanes:
            print(
                printable(
                    f"phasetrace: the command exited {rc} and no traced process wrote to {view.path} "
                    "(did it start SGLang?)"
                ),
                file=sys.stderr,
            )
        elif reported is None:
            print(printable(f"phasetrace: the command {ended(rc)}"), file=sys.stderr)
            self.finish(lay, found)
        else:  # the summary was printed at the milestone; bring the files up to the final state
            self.finish(lay, found, quiet=True)
            print(
                printable(f"phasetrace: the command {ended(rc)}; report and exports updated in {view.path}"),
                file=sys.stderr,
            )
        if lay.lanes:  # the launcher recorded it too, unless it was killed: the same row, replaced
            record(view, outcome=self.history_outcome())

    def history_outcome(self) -> str | None:
        """How the start ended, where this process knows better than the journals: stopped on request
        (a Ctrl-C, a signal forwarded) before it was ready is an interruption, not a failure."""
        return "interrupted" if self.stopping else None

    def failed(self, what: str, exc: Exception) -> None:
        """Say once that our own code failed (if stderr still takes it); the command runs on regardless."""
        text = f"{exc!r}{where(exc)}"
        if text in self.failures:
            return
        self.failures.add(text)
        still = f"; still waiting for the command (pid {self.child.pid})" if self.child.poll() is None else ""
        with contextlib.suppress(Exception):
            self.line.clear()
            print(
                printable(f"phasetrace: internal error in {what}: {text}{still}; please report it"),
                file=sys.stderr,
                flush=True,
            )

    @staticmethod
    def look(view: RunView, final: bool = False, gone: dict[int, Any] | None = None) -> tuple[Layout, list[Any]]:
        now = None if final else time.time_ns()
        lay = layout(view, now)
        return lay, findings(view, lay.end, gone=gone)

    @property
    def stopping(self) -> bool:
        """A stop was asked for (signal to us, Ctrl-C): ranks that end now end because of it."""
        forwarding = getattr(self, "forwarding", None)
        return bool(forwarding and forwarding.requested)

    def launcher_speaks(self, view: RunView) -> bool:
        """A traced launcher of this run is running with its watchdog, which says the verdicts."""
        return self.launcher_watches and any(
            p.role == "launcher" and not p.ready and running(p) for p in view.processes
        )

    def launcher_said_last_words(self, view: RunView) -> bool:
        """A launcher with its watchdog reached its last words (SGLang's teardown, or its exit),
        where it names the dead ranks and the root cause; one killed outright did not."""
        return self.launcher_watches and any(
            p.role == "launcher"
            and (
                (p.root is not None and p.root.status != "open")
                or any(s.phase == "launch.teardown" for s in p.spans.values())
            )
            for p in view.processes
        )

    def speak(self, view: RunView, found: list[Finding], defer: bool) -> bool:
        """Print each verdict no process of the run recorded and this one has not printed, as the
        watchdog prints it. With ``defer`` (a launcher's watchdog will say it) print nothing and
        return whether some verdict is still unsaid."""
        said = recorded(view) | self.spoken
        unsaid = [f for f in alarms(found) if f.kind != "unknown" and (f.pid, voice.word(f)) not in said]
        if defer or not unsaid:
            return bool(unsaid)
        self.line.clear()
        for f in unsaid:
            self.spoken.add((f.pid, voice.word(f)))
            voice.speak(f, sys.stderr, lambda record: self.record(view, record), view, self.hints_said)
        return False

    def record(self, view: RunView, record: dict[str, Any]) -> None:
        """A ``diagnosis`` record in this process's own journal of the run, as the watchdog writes
        one: the report and later readers keep the verdict once the ranks are gone, and nobody
        says it again. A run directory we cannot write: said once, the verdict is printed anyway."""
        if self.journal is None and not self.journal_failed:
            try:
                self.journal = own_journal(view.path, "run", "phasetrace-run", view.run_id)
            except OSError as exc:
                self.journal_failed = True
                print(
                    printable(
                        f"phasetrace: cannot record verdicts in {exc.filename} ({exc.strerror or exc}); "
                        "they are printed here only"
                    ),
                    file=sys.stderr,
                )
                return
        if self.journal is not None:
            self.journal.write(record)

    def finish(self, lay: Layout, found: list[Any], quiet: bool = False) -> None:
        """Print the summary; write the report and exports; print their paths."""
        if not quiet:
            try:
                for text in summary(lay, found, by_process(lay.run, found)):
                    print(printable(f"phasetrace: {text}"), file=sys.stderr)
            except Exception as exc:  # the files below are still written
                self.failed("the summary", exc)
            report_problems(lay.run, self.said, prefix="phasetrace:")
        outputs = [("report", lay.run.path / "report.html", lambda p: write_report(lay, str(p), found))]
        outputs += [
            (fmt, lay.run.path / f"export-{fmt}.json", lambda p, f=fmt: export_file(lay, f, str(p), found))
            for fmt in EXPORTS
        ]
        for name, path, write in outputs:
            try:
                write(path)
                if not quiet:
                    print(printable(f"phasetrace: {name}: {path}"), file=sys.stderr)
            except (CommandError, OSError) as exc:
                print(printable(f"phasetrace: {name} not written: {exc}"), file=sys.stderr)
            except Exception as exc:  # a bug in one renderer: the others are still written
                self.failed(f"the {name}", exc)
        sys.stderr.flush()
