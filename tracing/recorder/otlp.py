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
# while our exporter runs, that is replaced by one line of ours per process (``Watched``).
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


_ours = threading.local()


class _QuietWhileOurs(logging.Filter):
    """Drop the SDK's records emitted from inside our own export; SGLang's exporter logs as before."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_ours, "exporting", False)


_QUIET = _QuietWhileOurs()
for _name in _SDK_LOGGERS:
    logging.getLogger(_name).addFilter(_QUIET)


@contextlib.contextmanager
def exporting() -> Iterator[Collector]:
    """Around one export of ours: the SDK's log lines from inside it are dropped (ours say it once),
    and the collector counts as waited on until it returns (``flush`` stops waiting for it)."""
    known = collector()
    known.waiting_since = time.monotonic()
    _ours.exporting = True
    try:
        yield known
    finally:
        _ours.exporting = False
        known.waiting_since = None


class Collector:
    """What this process's exporters know of their collector. A live one takes a batch in
    milliseconds; one that failed a batch, or has held one for over ``SLOW_S``, is not waited for."""

    SLOW_S = 1.0

    def __init__(self) -> None:
        self.answering: bool | None = None  # took the last batch (None: none sent yet)
        self.waiting_since: float | None = None  # monotonic start of the export in flight
        self.warned = False  # the one warning of this process about its collector

    def failed_once(self, endpoint: str, error: BaseException | None) -> None:
        if self.warned:
            return
        self.warned = True
        why = f" ({type(error).__name__})" if error is not None else ""
        endpoint = redact_text(endpoint)
        log.warning(
            "sglang-phasetrace: OTLP export to %s failed%s; spans stay in the journal: send them later "
            "with `phasetrace export RUN_DIR --endpoint %s`",
            endpoint or "?",
            why,
            endpoint or "URL",
        )

    def unresponsive(self) -> bool:
        since = self.waiting_since
        return self.answering is False or (since is not None and time.monotonic() - since > self.SLOW_S)


def collector() -> Collector:
    """What this process knows of its collector (``process_state``: a forked child starts unknowing)."""
    state = process_state.STATE
    if state.collector is None:
        with state.lock:
            if state.collector is None:
                state.collector = Collector()
    return state.collector


def flush_async(target: Any) -> None:
    """Ask exporters (a provider or a processor) to send what they hold, in a daemon thread: the
    caller never waits."""
    if target is not None:
        threading.Thread(target=target.force_flush, args=(5000,), name="phasetrace-flush", daemon=True).start()


def flush(target: Any, timeout_s: float = 2.0) -> bool:
    """Send what ``target`` holds, waiting at most ``timeout_s``, and no longer than it takes to see
    that the collector is unresponsive (``Collector.SLOW_S`` into an export). The SDK's
    ``force_flush`` ignores its timeout: it waits out every export, 10 s a batch (OTLP's default
    timeout) against a collector that does not answer."""
    if target is None:
        return True
    deadline = time.monotonic() + timeout_s
    worker = threading.Thread(target=target.force_flush, name="phasetrace-flush", daemon=True)
    worker.start()
    while worker.is_alive() and time.monotonic() < deadline and not collector().unresponsive():
        worker.join(0.02)
    return not worker.is_alive()  # else the spans stay in the journal (`phasetrace export --endpoint`)
