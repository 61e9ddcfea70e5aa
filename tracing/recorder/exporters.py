"""OTLP export to Jaeger (or any collector), configured only by the standard OTEL_* variables.

Batch export in its own thread: a span ending never waits on the network. Flushed without
blocking at ready, and at exit with the metrics under one short bound (``otlp.EXIT_S``), cut
shorter still once the collector shows it is not answering: a dead collector never slows SGLang.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from . import otlp

log = logging.getLogger("sglang_phasetrace")


def endpoint() -> str:
    return otlp.setting("TRACES", "ENDPOINT")


def processor_from_env(warn: Callable[[str], None]) -> SpanProcessor | None:
    """A batch OTLP processor when an endpoint is set, else None (the journal alone)."""
    if not endpoint() or os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip() == "none":
        return None
    try:
        if otlp.protocol("TRACES") == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ValueError as exc:
        warn(f"{exc}; journal only")
        return None
    try:
        exporter: SpanExporter = Watched(OTLPSpanExporter(), endpoint())
        if relinking():
            exporter = Relinked(exporter)
        return BatchSpanProcessor(exporter, schedule_delay_millis=1000)
    except Exception as exc:
        warn(f"OTLP exporter not started ({exc!r}); journal only")
        return None


def relinking() -> bool:
    """A process of node ≥ 1 of a multi-node launch whose trace id is agreed at the rendezvous."""
    from . import launch

    node = launch.node_from_env()
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
            from .. import keys
            from . import launch

            data = launch.mapping_of(os.environ.get(keys.ENV_RUN_DIR))
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
        known = otlp.collector()
        known.spans, known.endpoint = True, endpoint or known.endpoint

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result, error = SpanExportResult.FAILURE, None
        with otlp.exporting():
            try:
                result = self.inner.export(spans)
            except Exception as exc:
                error = exc
        known = otlp.collector()
        known.answered(result is SpanExportResult.SUCCESS, self.endpoint)
        if result is not SpanExportResult.SUCCESS:
            known.failed(self.endpoint, f" ({type(error).__name__})" if error is not None else "")
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)
