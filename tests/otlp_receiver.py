"""Real OTLP trace receivers for the tests: gRPC and HTTP (``/v1/traces``, protobuf body). Like a
collector, they also take metrics (``/v1/metrics``, the gRPC metrics service) and count them.

Both decode the wire format with the official ``opentelemetry-proto`` messages, the way a
collector or Jaeger does, and keep what arrived as plain :class:`ReceivedSpan` records:

    with OtlpReceiver("grpc") as receiver:          # or "http/protobuf"
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
               "OTEL_EXPORTER_OTLP_PROTOCOL": receiver.protocol}
        ...
        receiver.wait_for_spans(span_ids, timeout=20)

Collectors that fail, as a user meets them (``faulty``): one that accepts connections and never
answers (a half-dead collector, a firewall that drops after the handshake), one that refuses them,
one that answers every request late, and one that dies after its first batch of spans.
"""

from __future__ import annotations

import contextlib
import gzip
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from conftest import silent_peer
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2

PROTOCOLS = ("grpc", "http/protobuf")
FAULTS = ("never answers", "refuses", "answers slowly", "dies mid-start")
SLOW_S = 3.0  # how late "answers slowly" answers: past every bound of ours, within OTLP's 10 s timeout


@dataclass
class ReceivedSpan:
    trace_id: str  # 32 hex
    span_id: str  # 16 hex
    parent_id: str | None
    name: str
    status: int  # Status.StatusCode: 0 unset, 1 ok, 2 error
    attrs: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)


def any_value(value: common_pb2.AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind)


def attributes(items: Any) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in items}


class OtlpReceiver:
    """One receiver on 127.0.0.1 (a free port); thread-safe record of every exported span."""

    def __init__(
        self, protocol: str = "grpc", delay_s: float = 0.0, answers: int | None = None, metrics: bool = True
    ) -> None:
        """``delay_s``: every request is answered that late; ``answers``: after answering that many
        trace requests, the receiver stops (its port closed: later connections are refused);
        ``metrics=False``: traces only, as Jaeger (HTTP 404, gRPC UNIMPLEMENTED for metrics)."""
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol {protocol!r} not in {PROTOCOLS}")
        self.protocol = protocol
        self.delay_s = delay_s
        self.answers = answers
        self.metrics = metrics
        self.port = 0
        self.requests = 0
        self.metric_requests = 0
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._server: Any = None

    # -- decoding (shared by both transports) ---------------------------------------------------
    def accept(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in request.resource_spans:
            resource = attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex() or None,
                            name=span.name,
                            status=span.status.code,
                            attrs=attributes(span.attributes),
                            resource=resource,
                        )
                    )
        if self.delay_s:
            time.sleep(self.delay_s)
        with self._changed:
            self.requests += 1
            self._spans.extend(received)
            self._changed.notify_all()
            last = self.answers is not None and self.requests >= self.answers
        if last:  # dies once this answer is on its way
            threading.Thread(target=self.stop, kwargs={"after_s": 0.2}, daemon=True).start()

    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def by_id(self) -> dict[str, ReceivedSpan]:
        return {s.span_id: s for s in self.spans}

    def wait_for_spans(self, span_ids: set[str], timeout: float) -> set[str]:
        """Wait until every id in ``span_ids`` arrived (or the timeout); return the missing ones."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                missing = set(span_ids) - {s.span_id for s in self._spans}
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    return missing
                self._changed.wait(left)

    # -- transports ------------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OtlpReceiver:
        if self.protocol == "grpc":
            self._start_grpc()
        else:
            self._start_http()
        return self

    def _start_grpc(self) -> None:
        receiver = self

        class Servicer(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                receiver.accept(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        class MetricsServicer(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request, context):
                if receiver.delay_s:
                    time.sleep(receiver.delay_s)
                receiver.metric_requests += 1
                return metrics_service_pb2.ExportMetricsServiceResponse()

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(), server)
        if self.metrics:
            metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(MetricsServicer(), server)
        self.port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server = server

    def _start_http(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                path = self.path.split("?")[0]
                if path not in ("/v1/traces", "/v1/metrics") or (path == "/v1/metrics" and not receiver.metrics):
                    self.send_error(404)
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if "protobuf" not in (self.headers.get("Content-Type") or ""):
                    self.send_error(415, "only application/x-protobuf is served here")
                    return
                if path == "/v1/metrics":
                    if receiver.delay_s:
                        time.sleep(receiver.delay_s)
                    receiver.metric_requests += 1
                    reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                else:
                    request = trace_service_pb2.ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    receiver.accept(request)
                    reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                with contextlib.suppress(ConnectionError):  # a late answer its exporter gave up on
                    self.send_response(200)
                    self.send_header("Content-Type", "application/x-protobuf")
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        threading.Thread(target=server.serve_forever, name="otlp-http", daemon=True).start()
        self._server = server

    def stop(self, after_s: float = 0.0) -> None:
        time.sleep(after_s)
        server, self._server = self._server, None
        if server is None:
            return
        if self.protocol == "grpc":
            server.stop(grace=None)
        else:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def never_answers() -> Iterator[str]:
    """An endpoint that accepts every connection and never answers on it (nor closes it)."""
    with silent_peer() as port:
        yield f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def refuses() -> Iterator[str]:
    """An endpoint whose connections are refused: its port bound (no one else takes it), not listening."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@contextlib.contextmanager
def faulty(fault: str, protocol: str) -> Iterator[str]:
    """The endpoint of a collector failing as ``fault`` (one of ``FAULTS``) says, for ``protocol``."""
    if fault == "never answers":
        with never_answers() as endpoint:
            yield endpoint
    elif fault == "refuses":
        with refuses() as endpoint:
            yield endpoint
    elif fault in ("answers slowly", "dies mid-start"):
        slow = fault == "answers slowly"
        with OtlpReceiver(protocol, delay_s=SLOW_S if slow else 0.0, answers=None if slow else 1) as receiver:
            yield receiver.endpoint
    else:
        raise ValueError(f"fault {fault!r} not in {FAULTS}")
