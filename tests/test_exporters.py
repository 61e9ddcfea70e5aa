"""A collector that does not answer never slows SGLang: flushes are bounded, exit does not wait.

The collector here is a port on 127.0.0.1 that listens and never accepts: connections hang
instead of failing fast, the worst case (a blackholed address). OTel's own ``force_flush``
ignores its timeout and waits out each export (10 s by default).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import hook_env
from sglang_phasetrace.tracing import process_state
from sglang_phasetrace.tracing.recorder import exporters, otlp
from sglang_phasetrace.tracing.recorder.runtime import PrivateIdGenerator

pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")


@pytest.fixture
def dead_endpoint() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def dead_provider(dead_endpoint: str, monkeypatch: pytest.MonkeyPatch):
    from opentelemetry.sdk.trace import TracerProvider

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", dead_endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")  # so that teardown's shutdown is quick
    monkeypatch.setattr(process_state.STATE, "collector", otlp.Collector())
    provider = TracerProvider(id_generator=PrivateIdGenerator(), shutdown_on_exit=False)
    processor = exporters.processor_from_env(pytest.fail)
    provider.add_span_processor(processor)
    yield provider
    otlp.collector().answering = False  # the export thread may still be waiting
    processor.shutdown()  # joins the worker; returns once its export gives up


def test_flush_waits_at_most_its_bound_and_not_at_all_for_an_unresponsive_collector(dead_provider) -> None:
    tracer = dead_provider.get_tracer("test")
    tracer.start_span("phase").end()
    start = time.monotonic()
    assert otlp.flush(dead_provider, 0.5) is False  # the batch went out; no answer within the bound
    assert 0.4 < time.monotonic() - start < 1.5
    time.sleep(otlp.Collector.SLOW_S)  # that export has now been waiting too long
    assert otlp.collector().unresponsive()
    tracer.start_span("phase").end()
    start = time.monotonic()
    assert otlp.flush(dead_provider, 5.0) is False
    assert time.monotonic() - start < 2.5  # not waited for: well under its 5 s bound


def test_a_collector_that_failed_its_last_batch_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process_state.STATE, "collector", otlp.Collector())
    assert not otlp.collector().unresponsive()
    otlp.collector().answering = False
    assert otlp.collector().unresponsive()
    otlp.collector().answering = True
    assert not otlp.collector().unresponsive()


def test_a_traced_process_exits_promptly_with_a_dead_collector(dead_endpoint: str, tmp_path: Path) -> None:
    """Phases ended, spans queued for a collector that never answers: the process exits within the
    exit flush's bound (2 s), not after the SDK's 30 s shutdown join."""
    program = textwrap.dedent("""
        from sglang_phasetrace.tracing.recorder import spans
        for i in range(20):
            spans.start_phase(f"phase{i}").end()
        spans.start_phase("left.open")  # ended as incomplete at exit
    """)
    env = hook_env(
        tmp_path,
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": dead_endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "SGLANG_PHASETRACE_RUN_DIR": str(tmp_path / "run"),
        },
    )
    start = time.monotonic()
    ran = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert time.monotonic() - start < 8, "exit waited on the collector"
    journal = next((tmp_path / "run" / "journal").iterdir()).read_text()
    assert '"status":"incomplete"' in journal


def test_a_refused_collector_is_one_warning_naming_the_endpoint(monkeypatch, caplog) -> None:
    """Nothing listens: the SDK's own retry/failure lines (unprefixed, every few seconds) are not
    shown for our exporter; one line of ours names the endpoint (credentials redacted) and says how
    to send the journal later."""
    import logging

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections are refused
    endpoint = f"http://user:hunter2pass@127.0.0.1:{port}"
    monkeypatch.setattr(process_state.STATE, "collector", otlp.Collector())
    watched = exporters.Watched(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=1), endpoint)
    tracer = TracerProvider(id_generator=PrivateIdGenerator()).get_tracer("t")
    spans = []
    for _ in range(3):
        span = tracer.start_span("phase")
        span.end()
        spans.append(span)
    with caplog.at_level(logging.DEBUG):
        for span in spans:
            watched.export([span])
    ours = [r.getMessage() for r in caplog.records if r.getMessage().startswith("sglang-phasetrace:")]
    sdk = [r for r in caplog.records if r.name.startswith("opentelemetry") and r.levelno >= logging.WARNING]
    assert len(ours) == 1 and f"127.0.0.1:{port}" in ours[0] and "phasetrace export RUN_DIR --endpoint" in ours[0]
    assert "hunter2pass" not in ours[0]
    assert sdk == []
