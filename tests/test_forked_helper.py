"""The forked helper (``reader.forked_helper``) on its own: jobs called by reference, answers in
order, a descriptor passed, a failing job or a dead helper said as ``HelperLost``, and no fork where
another thread runs. Every large-run read and split render stands on it (``forks``: see conftest)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from sglang_phasetrace.tracing.reader import forked_helper
from sglang_phasetrace.tracing.reader.forked_helper import Helper, HelperLost, job

pytestmark = pytest.mark.forks


@job
def _add(state: dict[str, int], arg: int) -> int:
    return state["base"] + arg


@job
def _write(state: dict[str, int], arg: bytes, fd: int) -> int:
    return os.pwrite(fd, arg, state["base"])


@job
def _fails(state: Any, arg: Any) -> None:
    raise RuntimeError("it fails there")


@job
def _dies(state: Any, arg: Any) -> None:
    os._exit(3)


def _not_a_job(state: Any, arg: Any) -> None:
    raise AssertionError("never sent")


def _setup(answer: Any) -> dict[str, int]:
    answer("ready")
    return {"base": 40}


def test_jobs_are_called_by_reference_and_answered_in_order(tmp_path: Path) -> None:
    helper = Helper.start(_setup, serve=True)
    assert helper is not None
    try:
        assert helper.reply() == "ready"  # setup's answer comes first
        helper.call(_add, 1)
        helper.call(_add, 2)  # asked before the first is answered
        assert [helper.reply(), helper.reply()] == [41, 42]
        out = tmp_path / "out"
        out.write_bytes(b"." * 44)
        with open(out, "r+b") as f:
            helper.call(_write, b"abcd", f.fileno())  # a copy of the descriptor, written there
            assert helper.reply() == 4
        assert out.read_bytes() == b"." * 40 + b"abcd"
        with pytest.raises(ValueError, match="not a job"):
            helper.call(_not_a_job, None)
        helper.call(_fails, None)
        with pytest.raises(HelperLost, match="it fails there"):
            helper.reply()
        helper.call(_add, 3)  # a failed job leaves the helper serving
        assert helper.reply() == 43
        helper.call(_dies, None)
        with pytest.raises(HelperLost):
            helper.reply()
        with pytest.raises(HelperLost):
            helper.call(_add, 4)
            helper.reply()
    finally:
        helper.close()
    assert helper.process.exitcode is not None


def test_a_helper_that_does_not_serve_answers_once_and_ends() -> None:
    helper = Helper.start(_setup)
    assert helper is not None
    assert helper.reply() == "ready" and helper.ended_well()


def test_setup_that_fails_is_no_answer() -> None:
    def setup(answer: Any) -> None:
        raise RuntimeError("cannot read")

    helper = Helper.start(setup, serve=True)
    assert helper is not None
    with pytest.raises(HelperLost):
        helper.reply()
    helper.close()


def test_no_fork_while_another_thread_runs() -> None:
    assert forked_helper.can_fork()
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        assert not forked_helper.can_fork() and Helper.start(_setup) is None
    finally:
        stop.set()
        other.join()
    assert forked_helper.can_fork()


_VIEWER = """
import sys
from sglang_phasetrace.tracing.cli import console
from sglang_phasetrace.tracing.reader import forked_helper, load
load.Child.MIN_BYTES = 0
start = forked_helper.Helper.start.__func__
def spy(cls, *args, **kwargs):
    helper = start(cls, *args, **kwargs)
    print(f"helper {helper.pid}", file=sys.stderr, flush=True)
    return helper
forked_helper.Helper.start = classmethod(spy)
sys.argv = ["phasetrace", *sys.argv[1:]]
console()
"""


@pytest.mark.parametrize("verb", [["export", "-o", "OUT"], ["timeline"], ["status", "--once"]])
def test_a_viewer_leaves_no_helper_behind(tmp_path: Path, verb: list[str]) -> None:
    """A viewer ends with ``os._exit``, its run kept to the end (``command.keep``), so nothing of it
    ends its helper: the helper holds no copy of the parent's end of their connection, and the
    parent's exit is its EOF. (Each used to live on, waiting for a message, once the run was kept.)"""
    import subprocess
    import sys
    import time

    from cli_fixtures import build_run

    run = build_run(tmp_path / "run", ranks=4, spans=30)
    argv = [a.replace("OUT", str(tmp_path / "out.json")) for a in verb]
    done = subprocess.run(
        [sys.executable, "-c", _VIEWER, argv[0], str(run.path), *argv[1:]],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SGLANG_PHASETRACE_INDEX": "0"},
    )
    pids = [int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("helper ")]
    assert pids, done.stderr
    deadline = time.monotonic() + 10
    while any(_lives(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_lives(pid) for pid in pids), done.stderr


def _lives(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False
