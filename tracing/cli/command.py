"""What every verb shares: the Command protocol, CommandError, and reading a run directory."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import stat
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from .. import files, other_processes
from ..journal import records
from ..journal.layout import JOURNAL_DIR
from ..journal.writer import JournalWriter
from ..reader.load import load_run
from ..reader.view import RunView
from ..redact import printable
from ..verdicts.diagnose import PREFIX
from .usage import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_STALLED

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from ..render.lane_jobs import Held

# exit codes: the one table (``usage``); every line the CLI says carries the verdicts' prefix
__all__ = ["EXIT_FAILED", "EXIT_INCOMPLETE", "EXIT_STALLED", "PREFIX"]


_T = TypeVar("_T")

RUN_DIRS_HELP = (
    "a run directory (holds journal/); several (one per node of a multi-node launch, copied from "
    "each host) are shown as one launch"
)


class CommandError(Exception):
    """A failure to report in one line, mapped by ``main`` to ``exit_code``."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Command(Protocol):
    """A verb. One that sets ``bulk = True`` reads a whole run once and exits; ``main`` switches
    the cyclic garbage collector off for it (long-running verbs leave it on)."""

    name: str
    help: str  # one line for the verb list
    description: str  # the verb's own --help text (what it is for, with an example)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def where(exc: BaseException) -> str:
    """`` at FILE:LINE in FUNCTION``: the innermost frame of ``exc``'s traceback (for a bug report)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""


def check_run_dir(path: str | Path, journal: bool = True, doing: str = "read") -> Path:
    """``path`` as a run directory, or a ``CommandError`` saying why not: missing, a file,
    unreadable, (``journal``) without a readable ``journal/`` inside, or not this user's alone
    (``untrusted``: ``refusing to DOING PATH: why``)."""
    path = Path(path)
    for where, what in ((path, "run directory"), (path / JOURNAL_DIR, "journal directory")):
        try:
            mode = os.stat(where).st_mode
            if stat.S_ISDIR(mode):
                os.listdir(where)
        except FileNotFoundError:
            if where == path:
                why = "it does not exist"
            elif (newest := newest_run(path)) is not None:
                why = f"no {JOURNAL_DIR}/ inside; a directory of runs, the newest: {newest}"
            else:
                why = f"no {JOURNAL_DIR}/ inside"
            raise CommandError(f"{path}: not a phasetrace run directory ({why})") from None
        except OSError as exc:
            raise CommandError(f"{where}: cannot read the {what} ({exc.strerror or exc})") from None
        if not stat.S_ISDIR(mode):
            raise CommandError(f"{where}: not a phasetrace run directory (not a directory)")
        if not journal:
            break
    if (why := untrusted(path)) is not None:
        raise CommandError(f"refusing to {doing} {path}: {why}")
    return path


def untrusted(run_dir: str | Path) -> str | None:
    """Why what ``run_dir`` holds is no ground for anything we say or do (``files.not_private`` of
    the directory a link leads to and of its ``journal/``): another user's (other than root), or
    writable by group or others, so anyone could have planted its files. None: this user's alone.
    Every verb that reads a run directory asks this (``check_run_dir``, ``phasetrace probe``)."""
    real = Path(os.path.realpath(run_dir))
    for path in (real, real / JOURNAL_DIR):
        if path == real or os.path.lexists(path):
            if (why := files.not_private(path)) is not None:
                return why
    return None


def newest_run(base: str | Path, most: int = 10_000) -> Path | None:
    """The newest run directory in ``base`` (the ``--dir`` of ``phasetrace run``,
    ``SGLANG_PHASETRACE_DIR``: it also holds ``history.sqlite``; in a shared base such as ``/tmp``,
    this user's private subdirectory of it: ``files.home_of``), or None; looks at ``most`` entries."""
    try:
        with os.scandir(files.home_of(base)) as entries:
            runs = [e.path for e in itertools.islice(entries, most) if os.path.isdir(os.path.join(e.path, JOURNAL_DIR))]
    except OSError:
        return None
    return Path(max(runs, key=_mtime)) if runs else None


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def open_run(path: str | Path, *more: str | Path, split: bool = False) -> RunView:
    """Load a run directory, or several as one launch (one per node of a multi-node launch);
    journal lines that cannot be used are reported once, on stderr. ``split``: the caller goes
    through ``lanes_map`` for whatever needs every bar of a lane (``RunView.refresh``)."""
    paths = [check_run_dir(p) for p in (path, *more)]
    try:
        run = load_run(*paths, parallel=True, split=split)
    except FileNotFoundError as exc:
        raise CommandError(str(exc)) from None
    for proc in run.processes:  # a bad status file is said here, with the journals' problems
        run.status_file(proc)
    report_problems(run)
    if not run.processes:
        where = ", ".join(str(p / JOURNAL_DIR) for p in run.paths)
        raise CommandError(f"{', '.join(map(str, run.paths))}: no process journal in {where}")
    return run


_KEPT: list[object] = []


def keep(obj: _T) -> _T:
    """``obj``, held until the process exits: a viewer's run and layout (at 1024 ranks, 267 k spans
    and as many bars) are not freed on the way out of its verb (70-80 ms), ``console`` ends the
    process without freeing anything. ``main`` frees them unless the process exits next."""
    _KEPT.append(obj)
    return obj


def complete(run: RunView, code: int = 0) -> int:
    """A viewer's exit code: ``code``, or ``EXIT_INCOMPLETE`` where nothing worse was found and a
    journal of the run could not be read (its process is shown, its phases are not known)."""
    return EXIT_INCOMPLETE if code == 0 and any(p.unreadable is not None for p in run.processes) else code


def run_side(arg: str) -> list[str]:
    """``DIR0,DIR1`` (one launch, a directory per node) as its directories; a directory whose own
    name holds a comma stays whole."""
    if "," not in arg or os.path.isdir(arg):
        return [arg]
    return [p for p in arg.split(",") if p] or [arg]


def report_problems(run: RunView, said: set[str] | None = None, prefix: str = PREFIX) -> None:
    """Each journal line and status file the view could not use, once, on stderr (``prefix``:
    ``phasetrace run``'s own for its lines)."""
    for problem in run.problems:
        if said is None or problem not in said:
            print(printable(f"{prefix} skipped {problem}"), file=sys.stderr)  # names and keys from the files
            if said is not None:
                said.add(problem)


def write_output(data: str | bytes, output: str | None) -> None:
    """To ``output``: a file (``write_file``), or stdout for ``-`` or none."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if output in (None, "-"):
        sys.stdout.flush()
        sys.stdout.buffer.write(raw) if hasattr(sys.stdout, "buffer") else sys.stdout.write(raw.decode())
        sys.stdout.flush()
        return
    from ..files import write_all  # not loaded for --help

    write_file(Path(output), lambda fd: write_all(fd, raw))


def write_chunks(chunks: Iterable[bytes | Held], output: str | None) -> None:
    """``write_output`` of a document made a piece at a time (a large export; ``Held`` pieces are
    a split run's helper's, written there: ``render.lane_jobs.write_pieces``)."""
    from ..render.lane_jobs import resolve, write_pieces  # a bulk verb's: not loaded for --help

    if output in (None, "-"):
        sys.stdout.flush()
        out = sys.stdout.buffer if hasattr(sys.stdout, "buffer") else None
        for chunk in resolve(chunks):
            out.write(chunk) if out is not None else sys.stdout.write(chunk.decode())
        sys.stdout.flush()
        return
    write_file(Path(output), lambda fd: write_pieces(fd, chunks))


def write_file(path: Path, write: Callable[[int], None]) -> None:
    """An output file, made as the run's own are (``tracing.files``): what ``write(fd)`` writes, to a
    fresh 0600 file beside ``path`` renamed onto it (a link there is replaced, not written through);
    missing directories made 0700, an existing one used as the user chose it. ``CommandError``
    naming the path if that fails."""
    try:
        if not os.path.isdir(path.parent):
            files.private_dir(path.parent)
        files.write_new(path, write, swap=False)  # nothing reads an output live
    except OSError as exc:
        raise CommandError(f"cannot write {path}: {exc.strerror or exc}") from None


def make_console(width: int | None = None) -> Console:
    """Rich console. Its width: ``width``, else ``$COLUMNS``, else the terminal's; off a terminal
    (pipe, log) without ``$COLUMNS``, wide enough that table rows never wrap. ``$NO_COLOR`` (any
    value, no-color.org): no escape codes at all on a terminal, neither colour nor bold, dim or
    italic (they are styles of the same codes; a reader who asked for none gets none)."""
    from rich.console import Console  # the verbs that print tables: not loaded for an export or a report

    plain = {"color_system": None} if os.environ.get("NO_COLOR") else {}
    if width is None and os.environ.get("COLUMNS", "").isdigit() and int(os.environ["COLUMNS"]) > 0:
        width = int(os.environ["COLUMNS"])
    console = Console(highlight=False, width=width, soft_wrap=True, **plain)
    if width is None and not console.is_terminal:
        console = Console(highlight=False, width=max(console.width, 200), soft_wrap=True, **plain)
    return console


def print_lines(console: Console, lines: Iterable[Text]) -> None:
    """``console.print`` of each line; where it would write no colours (a pipe, a file, NO_COLOR),
    their text at once: the same bytes, without rich rendering a thousand lanes one by one."""
    if console.color_system is not None or console.is_terminal or console.record:
        for line in lines:
            console.print(line)
        return
    console.file.write("".join(f"{line.plain}\n" for line in lines))
    console.file.flush()


def own_journal(run_dir: Path, prefix: str, label: str, run_id: str) -> JournalWriter:
    """A journal of this CLI process in the run, for the verdicts it says (``diagnosis`` records):
    ``journal/<prefix>-HOST-PID.jsonl`` created new in the checked journal directory (``-2``… when
    taken), never a file this process did not make, and removed again when it cannot be written.
    ``OSError`` (naming the file) when the run directory cannot be written: read-only, another user's."""
    host, pid = other_processes.this_host(), os.getpid()
    path = run_dir / JOURNAL_DIR / f"{prefix}-{host}-{pid}.jsonl"
    try:
        dir_fd = files.open_dir(path.parent)
        try:
            fd, name = files.create_new(dir_fd, path.name)
            os.close(fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        exc.filename = exc.filename or str(path)
        raise
    path, writer = path.with_name(name), None
    try:
        writer = JournalWriter(path)
        writer.write_or_raise(
            records.process(time.time_ns(), pid, os.getppid(), host, run_id, None, {}, **other_processes.fingerprint())
        )
    except OSError as exc:
        if writer is not None:
            writer.close()
        with contextlib.suppress(OSError):
            os.unlink(path)  # empty: no half-made process for readers
        exc.filename = exc.filename or str(path)
        raise
    writer.write(records.identity(time.time_ns(), label, "watchdog", {}))
    return writer
