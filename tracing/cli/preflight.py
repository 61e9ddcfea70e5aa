"""``phasetrace preflight -- <launch command>``: the same launch with dummy weights, traced, under a
deadline — proof in minutes that it comes up (rendezvous, groups, all-reduce, KV pool, attention,
graphs, the draft) before the real start spends an hour reading the checkpoint.

It is ``phasetrace run`` with three differences: the command's arguments are rewritten
(``tracing.cli.preflight_plan``), the launch runs in its own session so it can be stopped as a group, and
it is stopped — SIGTERM to the group, then SIGKILL after a grace — at ready, at the first verdict,
or at the deadline, whichever comes first. The group's leader (the command) is reaped only once
nothing of its group runs any more: until then its id is taken (a zombie leader holds it), so a
signal to the group never reaches a group that reused the id.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .. import other_processes
from ..reader.view import RunView
from ..redact import printable
from ..render.compare_table import ranks_table
from ..render.lanes import Layout, layout
from ..render.phase_stats import within_run
from ..render.run_text import status_line
from ..verdicts.diagnose import PREFIX, Finding
from ..verdicts.findings import ENDED, alarms, by_process
from .command import EXIT_FAILED, EXIT_STALLED, CommandError, make_console
from .preflight_plan import (
    WEIGHT_PHASES,
    Earlier,
    NotLaunchServer,
    earlier,
    estimate,
    gigabytes,
    real_launch,
    rewrite,
    span,
)
from .run import LiveLine, Run
from .usage import at_least, seconds

GRACE_S = 30.0  # SIGTERM to SIGKILL
SAMPLE = 256 * 1024 * 1024  # bytes of the first shard read to measure the storage
WEIGHTS = (".safetensors", ".bin")


def checkpoint(path: str | None) -> tuple[int, list[Path]] | None:
    """Total bytes of the weight files in a local model directory (not its subdirectories), and
    the files, largest first; None for a hub id or a path that is not a directory."""
    if not path or not os.path.isdir(path):
        return None
    found = []
    with os.scandir(path) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.name.endswith(WEIGHTS) and entry.is_file():
                    found.append((entry.stat().st_size, Path(entry.path)))
    found.sort(key=lambda x: x[0], reverse=True)
    return sum(size for size, _ in found), [p for _, p in found]


def read_rate(path: Path, limit: int = SAMPLE) -> tuple[float, int]:
    """(bytes per second, bytes read) with plain reads of up to ``limit`` bytes. A file in the page
    cache gives the cache's rate, not the storage's. Raises OSError."""
    buf = bytearray(8 * 1024 * 1024)
    done = 0
    with open(path, "rb", buffering=0) as f:
        t0 = time.perf_counter()
        while done < limit:
            n = f.readinto(buf)
            if not n:
                break
            done += n
        elapsed = time.perf_counter() - t0
    return done / max(elapsed, 1e-6), done


def earlier_starts(view: RunView) -> Earlier | None:
    """The real launch's earlier starts that became ready, from the history of the pre-flight's
    base directory (``tracing.history``); None without history or without such a start. A history
    that cannot be read: its one warning, and the estimate from the pre-flight alone."""
    from ..history import fingerprint
    from ..history.store import History, HistoryError, _warn, of_run_dir

    fp = fingerprint.of_run(view)
    try:
        where = of_run_dir(view.path)
        if fp is None or where is None:
            return None
        with History.open(where) as history:
            fid = real_launch(fp.fields, ((la.id, la.fields) for la in history.launches()))
            if fid is None:
                return None
            totals = [s.total_s for s in history.starts(fid) if s.outcome == "ready"]
            weights = history.usuals(fid).get(WEIGHT_PHASES[0])
    except HistoryError as exc:
        if exc.kind != "missing":
            _warn(exc, "the estimate is made without it")
        return None
    return earlier(fid, totals, weights.median if weights is not None else None)


class Leader(subprocess.Popen):
    """The launch's first process, in a session of its own: ``poll`` and ``wait`` see it end
    without reaping it (``waitid(WNOWAIT)``), so its process group's id stays ours while we signal
    the group; ``release`` reaps it, once nothing of the group runs any more."""

    def poll(self) -> int | None:
        if self.returncode is None:
            ended = other_processes.child_ended(self.pid)
            if ended is not None:
                self.returncode = ended.code if ended.signal is None else -ended.signal
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05 if deadline is None else max(0.0, min(0.05, deadline - time.monotonic())))
        return self.returncode

    def release(self) -> None:
        """Reap it (it has ended: ``wait``)."""
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def say(text: str) -> None:
    print(printable(f"{PREFIX} preflight: {text}"), file=sys.stderr, flush=True)


class Preflight(Run):
    name = "preflight"
    help = "the same launch with dummy weights, under a deadline: does it come up? (and an estimate)"
    description = """\
Runs the exact `python -m sglang.launch_server …` command with --load-format dummy (and
--speculative-draft-load-format dummy when there is a draft), traced: the same parallel layout,
graph batch sizes, attention backend, speculative settings — everything but reading the
checkpoint. At ready it stops the server and exits 0 with a per-phase, per-rank summary and an
estimate of the real start; at the first STALL it exits 3, at DIED/FAILED 4, with the verdict and
known-fix hints (said by the watchdog), without waiting for the deadline; not ready at the deadline: 3.

  phasetrace preflight -- python -m sglang.launch_server --model-path /models/M --tp 8
  phasetrace preflight --shrink --deadline 900 -- python -m sglang.launch_server ..."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--deadline", type=seconds, default=1800.0, metavar="S", help="give up after S seconds (default 1800)"
        )
        parser.add_argument(
            "--shrink",
            action="store_true",
            help="a small KV pool (--max-total-tokens); parallel layout, graphs and draft unchanged",
        )
        parser.add_argument(
            "--max-total-tokens", type=at_least(1), default=4096, metavar="N", help="with --shrink (default 4096)"
        )
        parser.add_argument("--no-read-rate", action="store_true", help="do not read the first shard to time it")
        super().add_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        command = args.command_line[1:] if args.command_line[:1] == ["--"] else args.command_line
        if not command:
            raise CommandError("nothing to run; usage: phasetrace preflight -- python -m sglang.launch_server …", 2)
        try:
            rewritten = rewrite(command, args.shrink, args.max_total_tokens)
        except NotLaunchServer as exc:
            raise CommandError(str(exc), 2) from None
        say("changed: " + "; ".join(rewritten.changed) if rewritten.changed else "changed no argument")
        size, rate = self.measure(rewritten.model_path, rewritten.draft_path, not args.no_read_rate)
        self.deadline_s, self.outcome, self.first = args.deadline, None, None
        self.node_rank, self.node_ready = rewritten.node_rank, False
        self.kill_at: float | None = None
        self.t0 = time.monotonic()
        args.command_line = rewritten.command
        self.leader: Leader | None = None
        try:
            rc = super().run(args)  # the leader has ended, not reaped
            self.reap()
        finally:
            if self.leader is not None:
                self.leader.release()
        return self.conclude(rc, size, rate)

    def measure(self, model: str | None, draft: str | None, timed: bool) -> tuple[int | None, float | None]:
        """The checkpoint's size (target and draft) and, unless skipped, a read rate of its first
        shard — before the launch, so neither slows the other."""
        found = [c for c in (checkpoint(model), checkpoint(draft)) if c is not None]
        if not found:
            say(f"checkpoint size unknown: {model!r} is not a local directory")
            return None, None
        size = sum(c[0] for c in found)
        say(f"checkpoint: {gigabytes(size)} in {sum(len(c[1]) for c in found)} weight files")
        shards = found[0][1]
        if not timed or not shards:
            return size, None
        try:
            rate, done = read_rate(shards[0])
        except OSError as exc:
            say(f"read rate not measured: cannot read {shards[0]} ({exc.strerror or exc})")
            return size, None
        say(f"read {done / 1e6:.3g} MB of {shards[0].name} at ≈ {rate / 1e9:.2f} GB/s")
        return size, rate

    def start(self, command: list[str], env: dict[str, str]) -> subprocess.Popen:
        child = self.leader = Leader(command, env=env, start_new_session=True)
        self.group = child.pid
        return child

    def watch(self, child: subprocess.Popen, view: RunView, line: LiveLine, interval: float) -> None:
        self.view = view
        super().watch(child, view, line, interval)

    def step(self, view: RunView, line: LiveLine, reported: str | None) -> str | None:
        self.enforce(view)
        try:
            reached = super().step(view, line, reported)
        except Exception as exc:
            self.failed("the live status", exc)
            return reported
        if reached == "ready" and self.node_rank >= 1 and self.outcome is None:
            if not self.node_ready:  # node 0's server still needs these ranks for its warm-up
                self.node_ready = True
                self.line.clear()
                say(
                    f"node {self.node_rank} is ready; its launch runs on until node 0's pre-flight stops "
                    "it (these ranks then end with node 0's), or the deadline"
                )
            return reached
        if reached != reported and reached is not None and self.outcome is None:
            self.outcome = reached  # ready, stalled or failed: we are done either way
            self.stop()
        return reached

    def finish(self, lay: Layout, found: list[Finding], quiet: bool = False) -> None:
        if self.first is None and alarms(found):
            self.first = alarms(found)[0]
        super().finish(lay, found, quiet)

    def history_outcome(self) -> str | None:
        """A pre-flight stops the launch itself at ready or at the first verdict: its start is
        interrupted only when someone stopped it, or the deadline did."""
        return "interrupted" if self.outcome in ("interrupted", "deadline") else None

    def enforce(self, view: RunView) -> None:
        """The deadline, a stop someone asked for, and SIGKILL after the grace."""
        now = time.monotonic()
        if self.outcome is None and now - self.t0 > self.deadline_s and self.node_ready:
            self.outcome = "ready"  # node ≥ 1: its ranks were ready; node 0 never stopped the launch
            self.stop()
        elif self.outcome is None and now - self.t0 > self.deadline_s:
            self.outcome = "deadline"
            lay, found = self.look(view)
            self.line.clear()
            say(f"NOT READY after {self.deadline_s:.0f} s: {status_line(lay, by_process(view, found))}")
            self.stop()
        elif self.outcome is None and self.forwarding.requested:
            self.outcome = "interrupted"
            self.stop()
        if self.kill_at is not None and now > self.kill_at:
            self.signal_group(signal.SIGKILL)
            self.kill_at = None

    def stop(self) -> None:
        """SIGTERM to the launch's process group; SIGKILL after the grace."""
        self.forwarding.requested = True  # ranks ending now end because we asked
        if self.kill_at is None:
            self.line.clear()
            say(f"stopping the launch: SIGTERM to its process group ({self.outcome}); SIGKILL after {GRACE_S:.0f} s")
            self.signal_group(signal.SIGTERM)
            self.kill_at = time.monotonic() + GRACE_S

    def signal_group(self, sig: int) -> bool:
        """``sig`` to the launch's process group; only while its leader is not reaped (``Leader``):
        the group's id is then still ours."""
        try:
            os.killpg(self.group, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def reap(self) -> None:
        """The launcher has exited (not reaped yet); its ranks may not have: SIGTERM, the grace,
        then SIGKILL to what still runs — nothing once the group is empty."""
        until = time.monotonic() + GRACE_S
        if other_processes.group_alive(self.group):
            self.signal_group(signal.SIGTERM)
        while other_processes.group_alive(self.group) and time.monotonic() < until:
            time.sleep(0.2)
        if other_processes.group_alive(self.group):
            self.signal_group(signal.SIGKILL)

    def conclude(self, rc: int, size: int | None, rate: float | None) -> int:
        elapsed = time.monotonic() - self.t0
        view = self.view
        view.refresh(final=True)
        if self.outcome == "ready" or (self.outcome is None and self.node_ready and self.first is None):
            lay = layout(view)
            make_console().print(
                ranks_table(within_run(lay), "pre-flight: phases across ranks, largest skew first", 20)
            )
            say(estimate(view, size, rate, earlier_starts(view)).text())
            how = f"node {self.node_rank}'s ranks were ready; " if self.node_ready else "ready; stopped it; "
            say(f"PASSED after {span(elapsed)}: {how}run directory {view.path}")
            return 0
        first = self.first
        if first is not None:
            where = f"{first.label} in '{first.phase}'" if first.phase else first.label
            code = EXIT_FAILED if first.kind in ENDED else EXIT_STALLED
            word = "DIED" if first.kind == "died" else "FAILED" if code == EXIT_FAILED else "STALLED"
            say(f"NOT READY: {word} {where}; stopped the launch after {span(elapsed)}; run directory {view.path}")
            return code
        if self.outcome == "deadline":
            say(f"NOT READY: deadline of {self.deadline_s:.0f} s passed; run directory {view.path}")
            return EXIT_STALLED
        if self.outcome == "interrupted":
            return 130
        say(f"NOT READY: the launch ended before ready (exit status {rc}); run directory {view.path}")
        return EXIT_FAILED
