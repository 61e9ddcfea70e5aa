"""OTLP plumbing shared by the span and the metric exporters: the standard ``OTEL_*`` settings,
what this process knows of its collector, the SDK's own log lines kept quiet while an export of
ours runs, and bounded flushes. Stdlib only: nothing of the SDK is imported until an exporter is
made, and none is without an endpoint."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from .. import process_state
from ..redact import redact_text

log = logging.getLogger("sglang_phasetrace")

PROTOCOLS = ("grpc", "http/protobuf")
DEFAULT_PROTOCOL = "http/protobuf"


def setting(signal: str, name: str) -> str:
    """``OTEL_EXPORTER_OTLP_<SIGNAL>_<NAME>``, else ``OTEL_EXPORTER_OTLP_<NAME>`` (OTel's rule), stripped;
    ``signal``: ``TRACES`` or ``METRICS``."""
    value = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_{name}") or os.environ.get(f"OTEL_EXPORTER_OTLP_{name}")
    return value.strip() if value else ""


def protocol(signal: str) -> str:
    """The protocol for ``signal``, lower case; ``ValueError`` naming the supported ones otherwise."""
    chosen = (setting(signal, "PROTOCOL") or DEFAULT_PROTOCOL).lower()
    if chosen not in PROTOCOLS:
        raise ValueError(f"OTLP protocol {chosen!r} is not supported (use one of {PROTOCOLS})")
    return chosen


# The OTLP exporters log every retry and failure on their own (unprefixed, every few seconds);
# while our exporter runs, that is replaced by one line of ours per process (``Collector.failed``).
_SDK_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.sdk._shared_internal",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
    "opentelemetry.sdk.metrics._internal.export",
)

# The most a process's exit waits for its collector, spans and metrics flushed together: a live
# collector takes a batch in milliseconds; one that does not answer is given up on sooner still
# (``Collector.SLOW_S``), so a dead one costs an exit ``SLOW_S`` at most, never the SDK's 10 s.
EXIT_S = 1.0


class Export:
    """One export of ours in flight: when it began, whether the SDK retried it (a warning: the
    collector refused the connection, went away, or did not answer in time), and whether the
    collector answered it with a refusal (the SDK's error names an HTTP 4xx status or a gRPC code
    such as UNIMPLEMENTED: it is there, and does not take this signal, as Jaeger for metrics)."""

    __slots__ = ("complained", "refused", "since")

    def __init__(self) -> None:
        self.since = time.monotonic()
        self.complained = False
        self.refused = False


# gRPC codes a collector that is up answers with when it does not take a batch
_REFUSALS = frozenset({"UNIMPLEMENTED", "NOT_FOUND", "PERMISSION_DENIED", "UNAUTHENTICATED", "INVALID_ARGUMENT"})


def _a_refusal(value: Any) -> bool:
    """An HTTP status 4xx (an int among the SDK's log arguments) or a gRPC status code of ``_REFUSALS``."""
    if type(value) is int:
        return 400 <= value < 500
    return getattr(value, "name", None) in _REFUSALS


_ours = threading.local()


class _QuietWhileOurs(logging.Filter):
    """Drop the SDK's records emitted from inside our own export (ours say it once), noting a retry
    or a refusal; SGLang's exporter logs as before."""

    def filter(self, record: logging.LogRecord) -> bool:
        export = getattr(_ours, "export", None)
        if export is None:
            return True
        if record.levelno == logging.WARNING:  # a retry: not waited for from now on (until a batch gets through)
            export.complained = True
            collector().answering = False
        elif record.levelno >= logging.ERROR and isinstance(record.args, tuple):
            export.refused = export.refused or any(_a_refusal(arg) for arg in record.args)
        return False


_QUIET = _QuietWhileOurs()
for _name in _SDK_LOGGERS:
    logging.getLogger(_name).addFilter(_QUIET)


@contextlib.contextmanager
def exporting() -> Iterator[Export]:
    """Around one export of ours: the SDK's log lines from inside it are dropped (ours say it once),
    and the export counts as in flight until it returns (``flush`` stops waiting for one that is
    slow). Spans and metrics may export at once: each is its own entry."""
    known, export = collector(), Export()
    with known.lock:
        known.in_flight.add(export)
    _ours.export = export
    try:
        yield export
    finally:
        _ours.export = None
        with known.lock:
            known.in_flight.discard(export)


class Collector:
    """What this process's exporters (spans and metrics) know of their collector, and the one warning
    of this process about it. A live one takes a batch in milliseconds; one that failed or refused a
    batch, or has held one for over ``SLOW_S``, is not waited for."""

    SLOW_S = 0.5

    def __init__(self) -> None:
        self.answering: bool | None = None  # took the last batch (None: none sent yet)
        self.in_flight: set[Export] = set()  # exports in progress
        self.endpoint = ""  # where the latest export went
        self.spans = False  # spans are exported from this process (they stay in its journal)
        self.warned = False  # the one warning of this process about its collector
        self.lock = threading.Lock()

    def answered(self, ok: bool, endpoint: str) -> None:
        """An export returned: the collector took the batch (``ok``) or not."""
        self.answering, self.endpoint = ok, endpoint or self.endpoint

    def failed(self, endpoint: str, why: str, signal: str = "") -> None:
        """Say once per process, naming the endpoint, that export failed and what that costs;
        ``signal``: ``metrics`` when a metrics export met it first."""
        with self.lock:
            if self.warned:
                return
            self.warned = True
        endpoint = redact_text(endpoint or self.endpoint)
        if self.spans:
            costs = f"spans stay in the journal: send them later with `phasetrace export RUN_DIR --endpoint {endpoint}`"
        else:
            costs = "live metrics are missing until it answers"
        what = f"OTLP {signal} export" if signal else "OTLP export"
        say(f"{what} to {endpoint or '?'} failed{why}; nothing waits for it: {costs}")

    def why_unresponsive(self) -> str:
        """Why ``flush`` stopped waiting, for the warning: `` (no answer in 0.5 s)``."""
        now = time.monotonic()
        with self.lock:
            oldest = max((now - export.since for export in self.in_flight), default=0.0)
        if oldest > self.SLOW_S:
            return f" (no answer in {oldest:.1f} s)"
        return " (it did not take the last batch)" if self.answering is False else ""

    def unresponsive(self) -> bool:
        if self.answering is False:
            return True
        now = time.monotonic()
        with self.lock:
            return any(now - export.since > self.SLOW_S for export in self.in_flight)


def say(message: str) -> None:
    """One line on stderr (through logging) and, where this process traces, a ``warning`` record in
    its journal: the runtime's own ``warn``, found without importing it (a leaf below it)."""
    rt = process_state.STATE.runtime
    if rt is not None and getattr(rt, "started", False):
        rt.warn(message)
    else:
        log.warning("sglang-phasetrace: %s", message)


def collector() -> Collector:
    """What this process knows of its collector (``process_state``: a forked child starts unknowing)."""
    return process_state.part("collector", Collector)


def flush_async(target: Any) -> None:
    """Ask exporters (a provider or a processor) to send what they hold, in a daemon thread: the
    caller never waits."""
    if target is not None:
        threading.Thread(target=target.force_flush, args=(5000,), name="phasetrace-flush", daemon=True).start()


def flush(*targets: Any, timeout_s: float = EXIT_S) -> bool:
    """Send what ``targets`` (span and meter providers, processors) hold, all at once, waiting at
    most ``timeout_s`` in all, and no longer than it takes to see that the collector is unresponsive
    (it refused a batch, or one has been in flight ``Collector.SLOW_S``). The SDK's ``force_flush``
    waits out every export, 10 s a batch (OTLP's default timeout) against a collector that does not
    answer. False when something was left unsent (it stays in the journal); said once per process."""
    workers = [
        threading.Thread(target=target.force_flush, name="phasetrace-flush", daemon=True)
        for target in targets
        if target is not None
    ]
    if not workers:
        return True
    deadline = time.monotonic() + timeout_s
    for worker in workers:
        worker.start()
    known = collector()
    while any(w.is_alive() for w in workers) and time.monotonic() < deadline and not known.unresponsive():
        next(w for w in workers if w.is_alive()).join(0.02)
    if not any(w.is_alive() for w in workers):
        return True
    known.failed(known.endpoint, known.why_unresponsive() or f" (not done in {timeout_s:g} s)")
    return False
