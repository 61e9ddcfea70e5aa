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
