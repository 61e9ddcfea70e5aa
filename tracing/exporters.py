"""OTLP export to Jaeger (or any collector), configured only by the standard OTEL_* variables.

Batch export in its own thread: a span ending never waits on the network. Flushed without
blocking at rank ready, and with a short bound at exit and on SIGTERM/SIGINT/SIGQUIT.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

PROTOCOLS = ("grpc", "http/protobuf")


def _env(name: str) -> str | None:
    value = os.environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or os.environ.get(f"OTEL_EXPORTER_OTLP_{name}")
    return value.strip() if value else None


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
        return BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=1000)
    except Exception as exc:
        warn(f"OTLP exporter not started ({exc!r}); journal only")
        return None


def flush_async(provider: TracerProvider | None) -> None:
    """Ask exporters to send what they hold, in a daemon thread: the caller never waits."""
    if provider is not None:
        threading.Thread(target=provider.force_flush, args=(5000,), name="phasetrace-flush", daemon=True).start()


def flush(provider: TracerProvider | None, timeout_s: float = 2.0) -> None:
    if provider is not None:
        provider.force_flush(int(timeout_s * 1000))
