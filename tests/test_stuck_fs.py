"""A run directory whose filesystem stops answering (a hard-mounted NFS server gone) never holds
SGLang: its phases begin and end, and its process exits, within the journal's write bound.

How the stuck disk is made, without a root-only mount: in a traced process, the journal's own
descriptor (found through ``/proc/self/fd``, the writer untouched) is replaced with ``os.dup2`` by
the write end of a pipe that nobody reads, filled to the brim. The writer's next ``write`` then
blocks in the kernel and never returns, as one to a dead NFS server does; the run directory itself
stays readable, so the status file can be checked. The status file's write is made to block the
same way (``files.write_atomic`` replaced, in that process, by a write into such a pipe). At
start-up, a FIFO planted at the journal's path: opening it for writing blocks until a reader
comes, which none does. (A real stuck mount would need a FUSE server, and root: not here.)

Each program runs in its own process group, killed after; on code that writes on SGLang's thread
it hangs, and the test fails at its timeout.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import kill_group, read_journal
from sglang_phasetrace.tracing import files
from sglang_phasetrace.tracing.journal import records
from sglang_phasetrace.tracing.journal.writer import JournalWriter

BOUND_S = 0.5  # SGLANG_PHASETRACE_WRITE_WAIT_S for the programs here
SLACK_S = 2.0  # a loaded 2-core machine: scheduling, interpreter exit

PRELUDE = """
import json, os, sys, time
from sglang_phasetrace.tracing.recorder import runtime, spans
from sglang_phasetrace.tracing.journal.writer import JournalWriter

JournalWriter.HELD = 8  # a short queue: what comes beyond it is dropped, and counted


KEEP = []  # read ends kept open: a write blocks (no EPIPE)


def full_pipe():
    # the write end of a pipe filled to the brim that nobody reads: a write to it never returns
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b"x" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(w, True)
    KEEP.append(r)
    return w


def stick(path):
    # the descriptor the writer holds on `path` now leads into a full pipe
    (fd,) = [int(n) for n in os.listdir("/proc/self/fd") if os.path.realpath(f"/proc/self/fd/{n}") == str(path)]
    os.dup2(full_pipe(), fd)


def timed_phase(name):
    t0 = time.monotonic()
    phase = spans.start_phase(name, {"sglang.phase": name})
    assert phase is not None
    phase.end()
    return time.monotonic() - t0


def say(**what):
    print(json.dumps(what), flush=True)
"""

MID_RUN = """
root = spans.start_phase("rank", {"sglang.phase": "rank"}, root=True)
timed_phase("healthy")
rt = runtime.current()
stick(rt.journal.path)
times = [timed_phase(f"phase.{i}") for i in range(30)]
time.sleep(1.0)  # heartbeats: the status file says what is not written
say(times=times, journal=str(rt.journal.path), status=str(rt.run_dir / "status" / (rt.journal.path.stem + ".json")))
left_open = spans.start_phase("left.open", {"sglang.phase": "left.open"})
say(exiting=True)
"""

AT_EXIT = """
root = spans.start_phase("rank", {"sglang.phase": "rank"}, root=True)
inner = [spans.start_phase(f"phase.{i}", {"sglang.phase": f"phase.{i}"}) for i in range(7)]
rt = runtime.current()
stick(rt.journal.path)  # stuck just before exit: the first write that finds it is atexit's
say(journal=str(rt.journal.path))
say(exiting=True)
"""

AT_READY = """
from sglang_phasetrace.tracing import files

root = spans.start_phase("rank", {"sglang.phase": "rank"}, root=True)
rt = runtime.current()
w = full_pipe()
files.write_atomic = lambda path, data: os.write(w, data)  # the status file's write blocks, in the kernel
time.sleep(0.6)  # a beat (every 0.2 s) is in it now, holding the heartbeat's lock
t0 = time.monotonic()
rt.mark_ready()  # the ready hooks, on SGLang's thread: a beat, so that the status file says ready
say(ready_s=time.monotonic() - t0)
say(exiting=True)
"""

AT_START = """
rt = runtime.current()
journal = os.path.join(os.environ["SGLANG_PHASETRACE_RUN_DIR"], "journal")
os.makedirs(journal, mode=0o700)
os.mkfifo(os.path.join(journal, f"{rt.identity.host}-{rt.identity.pid}.jsonl"), 0o600)
t0 = time.monotonic()
first = spans.start_phase("rank", {"sglang.phase": "rank"}, root=True)
took = time.monotonic() - t0
t0 = time.monotonic()
later = [spans.start_phase(f"phase.{i}", {"sglang.phase": f"phase.{i}"}) for i in range(10)]
say(first=first is None, took=took, later=all(p is None for p in later), later_s=time.monotonic() - t0)
say(exiting=True)
"""


class Program:
    """A traced program (``PRELUDE`` + ``body``) in its own process group; its stdout lines (JSON)
    are read as they come, each stamped with when it came."""

    def __init__(self, tmp_path: Path, body: str) -> None:
        script = tmp_path / "program.py"
        script.write_text(PRELUDE + textwrap.dedent(body))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_PHASETRACE", "OTEL_"))}
        env.update(
            SGLANG_PHASETRACE_RUN_DIR=str(tmp_path / "run"),
            SGLANG_PHASETRACE_WRITE_WAIT_S=str(BOUND_S),
            SGLANG_PHASETRACE_HEARTBEAT_S="0.2",
        )
        self.proc = subprocess.Popen(
            [sys.executable, str(script)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: list[tuple[float, dict]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), json.loads(line)))

    def finish(self, timeout: float = 30) -> tuple[dict, float, list[str]]:
        """What the program said (merged), how long it took from saying ``exiting`` to its exit,
        and its warning lines; a program still running after ``timeout`` fails the test."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the traced program hung (still running after {timeout} s): {self.lines}") from None
        finally:
            kill_group(self.proc.pid)
        ended = time.monotonic()
        self.reader.join(10)
        err = self.proc.stderr.read()
        assert self.proc.returncode == 0, err
        said = {k: v for _, line in self.lines for k, v in line.items()}
        (exiting,) = [t for t, line in self.lines if "exiting" in line]
        return said, ended - exiting, [line for line in err.splitlines() if line.startswith("sglang-phasetrace:")]


def test_a_journal_that_stops_answering_mid_run_holds_no_phase_and_no_exit(tmp_path: Path) -> None:
    said, exit_s, warnings = Program(tmp_path, MID_RUN).finish()
    times = said["times"]
    assert times[0] < BOUND_S + SLACK_S  # the first write that finds it stuck waits the bound once ...
    assert sum(times[1:]) < SLACK_S, times  # ... and after that nobody waits for it
    assert exit_s < BOUND_S + SLACK_S  # atexit ends "left.open" through the stuck journal without waiting
    path = said["journal"]
    (warning,) = warnings  # one, naming the file and why
    assert warning.startswith(f"sglang-phasetrace: cannot write {path}: [Errno 110] no answer within {BOUND_S:g} s;")
    unwritten = json.loads(Path(said["status"]).read_text())["journal_unwritten"]
    assert unwritten["error"] == f"[Errno 110] no answer within {BOUND_S:g} s"
    # the child's queue holds 8 (HELD) behind the stuck write; of its 60 phase records the rest are dropped
    assert 1 <= unwritten["held"] <= 8 + 1 and unwritten["dropped"] >= 60 - 9
    records, problems = read_journal(Path(path))
    assert problems == []  # what reached the file before is whole
    assert [r["name"] for r in records if r["kind"] == "begin"] == ["rank", "healthy"]


def test_a_journal_stuck_at_exit_holds_the_exit_one_bound_at_most(tmp_path: Path) -> None:
    said, exit_s, warnings = Program(tmp_path, AT_EXIT).finish()
    assert exit_s < BOUND_S + SLACK_S  # 8 ends written at exit: one bound in all
    (warning,) = warnings
    assert warning.startswith(f"sglang-phasetrace: cannot write {said['journal']}: [Errno 110] no answer within")


def test_a_status_file_that_stops_answering_holds_no_ready(tmp_path: Path) -> None:
    """The status file is written by the heartbeat thread; at ready a beat is asked for at once,
    on a thread of its own: SGLang's thread waits neither for the disk nor for the beat stuck on it."""
    said, exit_s, warnings = Program(tmp_path, AT_READY).finish()
    assert said["ready_s"] < SLACK_S and exit_s < SLACK_S
    assert warnings == []


def test_a_run_directory_that_does_not_answer_at_start_turns_tracing_off_within_the_bound(tmp_path: Path) -> None:
    said, exit_s, warnings = Program(tmp_path, AT_START).finish()
    assert said["first"] and said["later"]  # not traced, and said so once: tracing is off here
    assert said["took"] < BOUND_S + SLACK_S and said["later_s"] < SLACK_S
    assert exit_s < SLACK_S
    (warning,) = warnings
    run_dir = tmp_path / "run"
    assert warning == (
        f"sglang-phasetrace: cannot write {run_dir}: [Errno 110] no answer within {BOUND_S:g} s; "
        "tracing off in this process"
    )


def test_a_forked_child_writes_on_its_own_not_behind_its_parents_writer_thread(tmp_path: Path) -> None:
    """The writer thread does not survive fork: the child's first write starts its own."""
    writer = JournalWriter(tmp_path / "p.jsonl", wait_s=BOUND_S)
    assert writer.write(records.warning(1, "parent"))  # the writer thread runs
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ok = writer.write(records.warning(2, "child"))
        b.send(b"1" if ok else b"0")
        os._exit(0)
    try:
        a.settimeout(10)
        assert a.recv(1) == b"1"
    finally:
        os.waitpid(pid, 0)
        a.close()
        b.close()
    assert writer.write(records.warning(3, "parent again"))
    written, problems = read_journal(writer.path)
    assert problems == [] and [r["t"] for r in written] == [1, 2, 3]
    writer.close()


@pytest.mark.parametrize("bad", ["", "0", "-1", "nan", "inf", "soon"])
def test_a_bad_write_bound_is_the_default(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang_phasetrace.tracing.journal import writer as journal

    monkeypatch.setenv("SGLANG_PHASETRACE_WRITE_WAIT_S", bad)
    assert journal.write_wait_s() == journal.WRITE_WAIT_S


def test_a_disk_that_answers_again_gets_what_queued_in_order_then_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The stuck write returns at last (the NFS server is back): what queued behind it is written
    in order (beyond ``HELD`` the oldest dropped, and counted), then the note of the gap; callers
    wait for their records again. Here the write is held in Python, in this process."""
    path = tmp_path / "p.jsonl"
    writer = JournalWriter(path, wait_s=0.2)
    writer.HELD = 3
    assert writer.write(records.warning(0, "before"))
    answer, real = threading.Event(), files.write_all

    def stuck(fd: int, data: bytes) -> None:
        answer.wait(30)
        real(fd, data)

    monkeypatch.setattr(files, "write_all", stuck)
    t0 = time.monotonic()
    assert not writer.write(records.warning(1, "stuck"))  # waited 0.2 s: stuck
    waited = time.monotonic() - t0
    assert all(not writer.write(records.warning(t, "queued")) for t in range(2, 8))
    assert 0.2 <= waited and time.monotonic() - t0 < waited + 0.5  # the later ones did not wait
    assert writer.trouble() == {
        "error": "[Errno 110] no answer within 0.2 s",
        "since": writer.trouble()["since"],
        "held": 4,  # the stuck one, and the newest 3
        "dropped": 3,
    }
    answer.set()
    deadline = time.monotonic() + 10
    while not writer.flush() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert writer.trouble() is None
    assert writer.write(records.warning(8, "after"))  # waited for, and written
    written, problems = read_journal(path)
    assert problems == []
    assert [r["t"] for r in written[:5]] + [written[6]["t"]] == [0, 1, 5, 6, 7, 8]
    assert "written late, 3 dropped" in written[5]["message"] and "[Errno 110]" in written[5]["message"]
    said = [r.getMessage() for r in caplog.records if r.name == "sglang_phasetrace"]
    assert len(said) == 1 and said[0].startswith(f"sglang-phasetrace: cannot write {path}: [Errno 110]")
    writer.close()
