"""The launching (main) process: launch, spawn and wait for ranks, warm up, server ready.

The launch root span starts at process start and ends when the server is ready: when
``Engine.__init__`` returns (offline engine), or when ``_wait_and_warmup`` returns having brought the
server up (HTTP server). SGLang's own state says so, not its log: its tokenizer manager's
``server_status`` is ``Up`` after a warm-up request succeeded, or at once with
``--skip-server-warmup`` (0.4.10.post2+). Its "fired up and ready to roll" line is INFO, never made
at ``--log-level warning``, so it only stands in where that state does not exist (0.4.0 to 0.4.10).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from typing import Any

from ..tracing import keys
from ._attrs import server_args_attrs, server_args_json
from .spec import Call, Phase, Report

ENGINE = "sglang.srt.entrypoints.engine"
HTTP = "sglang.srt.entrypoints.http_server"
READY_MESSAGE = "The server is fired up and ready to roll!"
CONFIG_MAX = 4 << 20  # bytes of a model's config.json hashed (a real one is a few KiB)


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
    logging.getLogger(_logger_of(call)).addFilter(call.state["filter"])
    return server_args_attrs(call.arg("server_args"))


def _ready_seen(call: Call, result: Any) -> Report:
    """``_wait_and_warmup`` returned: did the server come up? Its failure paths tear the launch down
    before they return, so a return says little; SGLang's ``server_status`` says it (``Up``, not
    ``Starting`` or ``UnHealthy``; ``Starting`` with the warm-up skipped). Releases without it
    (0.4.0 to 0.4.10): the ready line seen, or, where its logger could not make that line (INFO
    disabled), the return itself."""
    logger = logging.getLogger(_logger_of(call))
    seen = call.state["filter"]
    logger.removeFilter(seen)
    status = _server_status(call)
    if status is not None:  # 0.4.10.post2 leaves it Starting on --skip-server-warmup's path
        skipped = getattr(call.arg("server_args"), "skip_server_warmup", False) is True
        ready = status == "Up" or (status == "Starting" and skipped)
    else:
        ready = seen.seen or not logger.isEnabledFor(logging.INFO)
    attrs: dict[str, Any] = {keys.SERVER_READY: ready}
    if status is not None:
        attrs["sglang.server_status"] = status
    return Report(attrs=attrs, ready=ready)


def _logger_of(call: Call) -> str:
    """The logger of the module whose ``_wait_and_warmup`` runs (it moved in 0.4.2)."""
    return call.target.partition(":")[0] or HTTP


def _server_status(call: Call) -> str | None:
    """The name of SGLang's ``ServerStatus`` in this process's HTTP server, or None where the
    release has none (its module's ``_global_state.tokenizer_manager.server_status``)."""
    module = sys.modules.get(call.target.partition(":")[0])
    manager = getattr(getattr(module, "_global_state", None), "tokenizer_manager", None)
    status = getattr(manager, "server_status", None)
    name = getattr(status, "name", None)
    return name if isinstance(name, str) else None


def _launch_args(call: Call) -> dict[str, Any]:
    return server_args_attrs(call.arg("server_args"))


def _subprocess_args(call: Call) -> dict[str, Any]:
    """The server arguments as the launch starts its ranks, so a reader knows what was launched from
    the start (``Engine.__init__`` has them on its root only when it returns), and a hash of the
    model's config.json read here, where a relative model path resolves: the history's launch
    fingerprint (``tracing.history``), the same whoever reads the run and from where."""
    server_args = call.arg("server_args")
    if server_args is None:
        return {}
    return {
        keys.SERVER_ARGS: server_args_json(server_args),
        keys.MODEL_CONFIG: _config_hash(getattr(server_args, "model_path", None)),
        keys.DRAFT_MODEL_CONFIG: _config_hash(getattr(server_args, "speculative_draft_model_path", None)),
    }


def _config_hash(path: Any) -> str | None:
    """16 hex digits of the SHA-256 of ``config.json`` in a local model directory (a few KiB, read
    once per launch); None for a hub id, an unreadable or an oversized file."""
    if not isinstance(path, str) or not path:
        return None
    try:
        with open(os.path.join(path, "config.json"), "rb") as f:
            data = f.read(CONFIG_MAX + 1)
    except (OSError, ValueError):
        return None
    return None if len(data) > CONFIG_MAX else hashlib.sha256(data).hexdigest()[:16]


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
        enter=_subprocess_args,
    ),
    Phase("launch.wait_ranks", (f"{ENGINE}:_wait_for_scheduler_ready",)),
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
