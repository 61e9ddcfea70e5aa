"""The launching (main) process: launch, spawn and wait for ranks, warm up, server ready.

The launch root span starts at process start and ends when the server is ready: when
``Engine.__init__`` returns (offline engine), or when ``_wait_and_warmup`` logged SGLang's
"fired up and ready to roll" line (HTTP server), which is how SGLang itself says it is ready.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..tracing import keys
from ._attrs import server_args_attrs
from .spec import Call, Phase, Report

ENGINE = "sglang.srt.entrypoints.engine"
HTTP = "sglang.srt.entrypoints.http_server"
READY_MESSAGE = "The server is fired up and ready to roll!"


class _ReadyFilter(logging.Filter):
    """Sees SGLang's own "ready to roll" line go by on its logger (and lets every record through)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == READY_MESSAGE:
            self.seen = True
        return True


def _watch_ready(call: Call) -> dict[str, Any]:
    call.state["filter"] = _ReadyFilter()
    logging.getLogger(HTTP).addFilter(call.state["filter"])
    return server_args_attrs(call.arg("server_args"))


def _ready_seen(call: Call, result: Any) -> Report:
    seen = call.state["filter"]
    logging.getLogger(HTTP).removeFilter(seen)
    return Report(attrs={"sglang.server_ready": seen.seen}, ready=seen.seen)


def _launch_args(call: Call) -> dict[str, Any]:
    return server_args_attrs(call.arg("server_args"))


def _engine_args(call: Call, result: Any) -> dict[str, Any]:
    return server_args_attrs(getattr(call.instance, "server_args", None))


def _teardown(call: Call) -> Report:
    """SGLang's launch-phase SIGQUIT handler (a child failed) is about to SIGKILL the whole tree,
    this process included: the launcher names the rank that ended first, before that."""
    return Report(
        attrs={"sglang.include_parent": bool(call.arg("include_parent", True))},
        teardown=call.arg("parent_pid") == os.getpid(),
    )


PHASES = (
    Phase(
        keys.PHASE_LAUNCH_ENGINE,
        (f"{ENGINE}:Engine.__init__", "sglang.srt.server:Engine.__init__"),
        kind="launch",
        exit=_engine_args,
        ends_root=True,
    ),
    Phase(
        keys.PHASE_LAUNCH_SERVER,
        (f"{HTTP}:launch_server", "sglang.srt.server:launch_server"),
        kind="launch",
        enter=_launch_args,
    ),
    Phase(
        "launch.subprocesses",
        (f"{ENGINE}:Engine._launch_subprocesses", f"{ENGINE}:_launch_subprocesses", "sglang.srt.server:launch_engine"),
    ),
    Phase("launch.wait_ranks", (f"{ENGINE}:_wait_for_scheduler_ready",)),
    Phase("launch.dp_controller", ("sglang.srt.managers.data_parallel_controller:DataParallelController.__init__",)),
    Phase(
        keys.PHASE_WAIT_READY,
        (f"{HTTP}:_wait_and_warmup", "sglang.srt.server:_wait_and_warmup"),
        kind="ready",
        enter=_watch_ready,
        exit=_ready_seen,
    ),
    # The handler calls the name from the launcher module's globals at call time: patch that alias.
    Phase(
        "launch.teardown",
        (f"{ENGINE}:kill_process_tree", "sglang.srt.server:kill_process_tree"),
        enter=_teardown,
        after_ready="skip",
    ),
)
