"""OTLP export to Jaeger (or any collector), configured only by the standard OTEL_* variables.

Batch export in its own thread: a span ending never waits on the network. Flushed without
blocking at rank ready, and with a short bound at exit and on SIGTERM/SIGINT/SIGQUIT, cut shorter
still once the collector shows it is not answering: a dead collector never slows SGLang.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from . import process_state
from .redact import redact_text

PROTOCOLS = ("grpc", "http/protobuf")
# The OTLP exporters log every retry and failure on their own (unprefixed, every few seconds);
# while our exporter runs, that is replaced by one line of ours per process (``Watched``).
_SDK_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.sdk._shared_internal",
)
_ours = threading.local()
log = logging.getLogger("sglang_phasetrace")


class _QuietWhileOurs(logging.Filter):
    """Drop the SDK's records emitted from inside our own export; SGLang's exporter logs as before."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_ours, "exporting", False)


_QUIET = _QuietWhileOurs()
for _name in _SDK_LOGGERS:
    logging.getLogger(_name).addFilter(_QUIET)


def _env(name: str) -> str | None:
    value = os.environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or os.environ.get(f"OTEL_EXPORTER_OTLP_{name}")
    return value.strip() if value else None


def endpoint() -> str:
    return _env("ENDPOINT") or ""


def processor_from_env(warn: Callable[[str], None]) -> SpanProcessor | None:
    """A batch OTLP processor when an endpoint is set, else None (the journal alone)."""
    if not _env("ENDPOINT") or os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip() == "none":
        return None
    protocol = (_env("PROTOCOL") or "http/protobuf").lower()
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        elif protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        else:
            warn(f"OTLP protocol {protocol!r} is not supported (use one of {PROTOCOLS}); journal only")
            return None
        exporter: SpanExporter = Watched(OTLPSpanExporter(), endpoint())
        if relinking():
            exporter = Relinked(exporter)
        return BatchSpanProcessor(exporter, schedule_delay_millis=1000)
    except Exception as exc:
        warn(f"OTLP exporter not started ({exc!r}); journal only")
        return None


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


def relinking() -> bool:
    """A process of node ≥ 1 of a multi-node launch whose trace id is agreed at the rendezvous."""
    from . import crossnode

    node = crossnode.node_from_env()
    return node is not None and node.rank >= 1 and node.source == "rendezvous"


class Relinked(SpanExporter):
    """Sends this node's spans under the launch's trace id (node 0's), which its launcher learns
    at the rendezvous and writes to ``RUN_DIR/launch.json``. Batches wait for it at most
    ``HOLD_S`` after this process started exporting (a node that never reaches the rendezvous then
    sends under its own id; its journal keeps the mapping for ``phasetrace export`` later)."""

    HOLD_S = 120.0
    POLL_S = 0.5

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.deadline = time.monotonic() + self.HOLD_S
        self.mapping: tuple[int, int] | None = None  # (local trace id, the launch's)
        self.stopping = threading.Event()

    def _lookup(self) -> tuple[int, int] | None:
        if self.mapping is None:
            from . import crossnode, keys

            data = crossnode.mapping_of(os.environ.get(keys.ENV_RUN_DIR))
            if data is not None and isinstance(data.get("local_trace"), str):
                self.mapping = (int(data["local_trace"], 16), int(data["trace"], 16))
        return self.mapping

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        while self._lookup() is None and time.monotonic() < self.deadline and not self.stopping.is_set():
            self.stopping.wait(self.POLL_S)
        mapping = self.mapping
        if mapping is not None:
            spans = [_relinked(span, *mapping) for span in spans]
        return self.inner.export(spans)

    def shutdown(self) -> None:
        self.stopping.set()
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.stopping.set()  # exiting: what is held goes out now, under the id known by then
        return self.inner.force_flush(timeout_millis)


def _relinked(span: ReadableSpan, local: int, launch: int) -> ReadableSpan:
    """``span`` under the launch's trace id when it was started under this node's local one."""
    from opentelemetry.trace import SpanContext

    ctx = span.get_span_context()
    if ctx is None or ctx.trace_id != local:
        return span

    def moved(c: SpanContext | None) -> SpanContext | None:
        if c is None or c.trace_id != local:
            return c
        return SpanContext(launch, c.span_id, c.is_remote, c.trace_flags, c.trace_state)

    return ReadableSpan(
        span.name,
        context=moved(ctx),
        parent=moved(span.parent),
        resource=span.resource,
        attributes=span.attributes,
        events=span.events,
        links=span.links,
        kind=span.kind,
        status=span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


class Watched(SpanExporter):
    """The OTLP exporter, keeping ``collector()`` up to date (see ``flush``), and saying once per
    process, with the endpoint, that export failed and how to send the journal later."""

    def __init__(self, inner: SpanExporter, endpoint: str = "") -> None:
        self.inner = inner
        self.endpoint = endpoint

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = SpanExportResult.FAILURE
        known = collector()
        known.waiting_since = time.monotonic()
        _ours.exporting = True
        error: BaseException | None = None
        try:
            result = self.inner.export(spans)
        except Exception as exc:
            error = exc
        finally:
            _ours.exporting = False
            known.answering = result is SpanExportResult.SUCCESS
            known.waiting_since = None
        if result is not SpanExportResult.SUCCESS:
            known.failed_once(self.endpoint, error)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


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
