"""A collector that does not answer never slows SGLang: flushes are bounded, exit does not wait.

The collectors here are real listeners on 127.0.0.1 (``otlp_receiver``): a port that listens and
never accepts, or accepts and never answers (connections hang instead of failing fast, the worst
case: a blackholed address), one that refuses, one that answers late, one that dies mid-start.
OTel's own ``force_flush`` ignores its timeout and waits out each export (10 s by default).
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SCRIPTS, hook_env, read_journal, requires_sglang, run_program
from sglang_phasetrace.tracing import process_state
from sglang_phasetrace.tracing.reader.load import load_run
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
    assert otlp.flush(dead_provider, timeout_s=0.5) is False  # the batch went out; no answer within the bound
    assert 0.4 < time.monotonic() - start < 1.5
    time.sleep(otlp.Collector.SLOW_S)  # that export has now been waiting too long
    assert otlp.collector().unresponsive()
    tracer.start_span("phase").end()
    start = time.monotonic()
    assert otlp.flush(dead_provider, timeout_s=5.0) is False
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


# -- a collector that fails, as a traced process meets it ---------------------------------------------
FAULT_PROGRAM = textwrap.dedent("""
    import sys, time
    from sglang_phasetrace.tracing.recorder import spans
    spans.start_phase("left.open")  # open throughout (heartbeats, hence metrics); ended as incomplete at exit
    for i in range(20):
        spans.start_phase(f"phase{i}", {"sglang.phase": f"phase{i}"}).end()
    time.sleep(1.5)  # a batch of spans and of metrics goes out (and one that dies, dies after it)
    for i in range(20, 40):
        spans.start_phase(f"phase{i}", {"sglang.phase": f"phase{i}"}).end()
    print("exiting", time.monotonic(), flush=True)
    sys.exit(3)
""")


# What the OTel SDK and Python say on their own (gRPC's C core may log a GOAWAY from a collector
# that goes away, at INFO, once per connection: its own logging, process-wide, not ours to turn off)
SDK_SAYS = re.compile(r"Failed to export|Transient error|Exception while exporting|Traceback|exporter|retrying")


def run_faulty(tmp_path: Path, name: str, endpoint: str | None, protocol: str) -> tuple[float, str, Path]:
    """The program above, traced (spans and metrics) to ``endpoint``: seconds from its last line to
    its exit, its stderr, its run directory; its exit code is its own (3)."""
    run_dir = tmp_path / name
    extra = {"SGLANG_PHASETRACE_RUN_DIR": str(run_dir), "SGLANG_PHASETRACE_HEARTBEAT_S": "0.2"}
    if endpoint is not None:
        extra |= {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_METRIC_EXPORT_INTERVAL": "300",
        }
    ran = subprocess.run(
        [sys.executable, "-c", FAULT_PROGRAM], env=hook_env(tmp_path, extra), capture_output=True, text=True, timeout=60
    )
    ended = time.monotonic()
    assert ran.returncode == 3, ran.stderr[-3000:]
    return ended - float(ran.stdout.split()[1]), ran.stderr, run_dir


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_failing_collector_costs_an_exit_under_a_second_one_line_and_no_record(protocol: str, tmp_path: Path) -> None:
    """Never answers, refuses, answers 3 s late, dies after its first batch: each exits within 1 s
    of the same process without an endpoint, says so once, and its journal is whole; a live
    collector still gets every span, the last ones included (the exit flush)."""
    from otlp_receiver import FAULTS, OtlpReceiver, faulty

    base_s = min(run_faulty(tmp_path, f"none{i}", None, protocol)[0] for i in range(2))
    with OtlpReceiver(protocol) as live:
        live_s, err, _ = run_faulty(tmp_path, "live", live.endpoint, protocol)
        names = {s.name for s in live.spans}
        assert live.metric_requests > 0
    assert {f"phase{i}" for i in range(40)} | {"left.open"} <= names, sorted(names)
    assert "sglang-phasetrace" not in err, err
    for fault in FAULTS:
        with faulty(fault, protocol) as endpoint:
            exit_s, err, run_dir = run_faulty(tmp_path, fault.replace(" ", "-"), endpoint, protocol)
        said = [line for line in err.splitlines() if "sglang-phasetrace" in line]
        assert not [line for line in err.splitlines() if SDK_SAYS.search(line)], (fault, err)
        assert len(said) == 1 and said[0].startswith("sglang-phasetrace: OTLP "), (fault, err)
        assert endpoint in said[0] and "phasetrace export RUN_DIR --endpoint" in said[0], said
        assert exit_s - base_s < 1.0, (fault, exit_s, base_s)
        (journal,) = (run_dir / "journal").iterdir()
        records, problems = read_journal(journal)
        ended = [r for r in records if r["kind"] == "end"]
        assert problems == [] and len(ended) == 41, (fault, problems, len(ended))
        assert sum(r["status"] == "incomplete" for r in ended) == 1
        assert [r for r in records if r["kind"] == "warning"] != []  # the line is in the journal too
    assert live_s - base_s < 1.0


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_collector_that_takes_spans_and_refuses_metrics_is_its_own_line_and_still_gets_every_span(
    protocol: str, tmp_path: Path
) -> None:
    """Jaeger answers a metrics batch at once with a refusal: that is not a dead collector; one line
    says metrics are refused (and how to turn them off), and the exit still sends the last spans."""
    from otlp_receiver import OtlpReceiver

    base_s = run_faulty(tmp_path, "none", None, protocol)[0]
    with OtlpReceiver(protocol, metrics=False) as jaeger:
        exit_s, err, _ = run_faulty(tmp_path, "jaeger", jaeger.endpoint, protocol)
        names = {s.name for s in jaeger.spans}
        assert jaeger.metric_requests == 0
    assert {f"phase{i}" for i in range(40)} | {"left.open"} <= names, sorted(names)
    said = [line for line in err.splitlines() if "sglang-phasetrace" in line]
    assert not [line for line in err.splitlines() if SDK_SAYS.search(line)], err
    assert len(said) == 1 and said[0].startswith(f"sglang-phasetrace: OTLP metrics export to {jaeger.endpoint} refused")
    assert "SGLANG_PHASETRACE_METRICS=0" in said[0]
    assert exit_s - base_s < 1.0


@requires_sglang
@pytest.mark.sglang
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_real_start_with_a_collector_that_never_answers_is_whole_and_says_so_once_a_process(
    protocol: str, tiny_model: tuple[Path, Path], tmp_path: Path
) -> None:
    """``sglang.Engine`` tp=2 on CPU, start + one request + shutdown, its collector accepting
    connections and never answering: SGLang's exit code, every process ready in its journal with no
    phase left open, at most one line of ours about the collector in each (the same in its journal)."""
    from otlp_receiver import never_answers

    with never_answers() as endpoint:
        ran = run_program(
            [str(SCRIPTS / "start_engine.py"), str(tiny_model[0]), "--tp", "2"],
            tmp_path,
            env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol},
        )
    assert ran.returncode == 0 and "generated 4 tokens" in ran.stdout, ran.stderr[-4000:]
    view = load_run(ran.run_dir)
    shown = [p for p in view.processes if p.shown]
    assert {p.label for p in shown} >= {"launcher", "tp0", "tp1"} and all(p.ready for p in shown)
    assert not [s.name for p in shown for s in p.spans.values() if s.status in ("open", "incomplete")]
    said = [line for line in ran.stderr.splitlines() if "sglang-phasetrace" in line]
    assert len(said) <= len(shown) and all(f"OTLP export to {endpoint} failed" in line for line in said), said
    assert all(sum("OTLP" in w for w in p.warnings) <= 1 for p in shown)
    assert "Failed to export" not in ran.stderr and "Transient error" not in ran.stderr
