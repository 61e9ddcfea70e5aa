"""Heartbeats as OpenTelemetry metrics, over the OTLP endpoint the spans use, for live dashboards.

SGLang's own startup metrics exist once init has finished; these exist while it runs, so an init
that never finishes still shows, per rank, its phase, time in it, progress and resources, and an
alert can fire on the watchdog's stalled flag. ``observe`` keeps the latest heartbeat (one store, on
the heartbeat thread); observable instruments read it when the SDK's periodic reader collects, in
the reader's own thread, which also sends. A collector that does not answer costs that thread only,
and the exit flush is bounded, with the spans' (``otlp.flush``).

Off, with nothing imported and no thread, when no OTLP metrics endpoint is set, when
``OTEL_METRICS_EXPORTER=none``, or when ``SGLANG_PHASETRACE_METRICS=0``.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import keys, process_state
from . import otlp

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader

    from .runtime import Runtime

log = logging.getLogger("sglang_phasetrace")

# Names (OTel semantic conventions where one fits, else ``sglang.phasetrace.*``) and attribute keys.
PHASE_ELAPSED = "sglang.phasetrace.phase.elapsed"  # s, gauge: time in the current (innermost) phase
PROGRESS_DONE = "sglang.phasetrace.progress.done"  # {item}, gauge, per open phase with progress
PROGRESS_TOTAL = "sglang.phasetrace.progress.total"
HEARTBEAT_AGE = "sglang.phasetrace.heartbeat.age"  # s, gauge: since the latest beat, when collected
HEARTBEAT_TIMESTAMP = "sglang.phasetrace.heartbeat.timestamp"  # s (Unix), gauge: a frozen process's stays put
READY = "sglang.phasetrace.ready"  # 1, up-down counter: 0/1 per process, sums to the ranks ready
STALLED = "sglang.phasetrace.stalled"  # 1, up-down counter: 0/1 per watched rank, from the watchdog
CPU = "process.cpu.utilization"  # 1, gauge: CPU time / wall time / CPUs available (semconv)
MEMORY = "process.memory.usage"  # By, up-down counter: RSS (semconv)
THREADS = "process.thread.count"  # {thread}, up-down counter (semconv)
GPU_UTIL = "hw.gpu.utilization"  # 1, gauge (semconv hw.*, hw.id + hw.type on each point)
GPU_MEM_USED = "hw.gpu.memory.usage"  # By, up-down counter
GPU_MEM_LIMIT = "hw.gpu.memory.limit"  # By, up-down counter
GPU_MEM_UTIL = "hw.gpu.memory.utilization"  # 1, gauge: used / total
GPU_POWER = "hw.power"  # W, gauge
STALL_KIND = "sglang.phasetrace.stall.kind"  # blocked, straggler, silent, divergence, no_progress, died, ...
PROGRESS_UNIT = "sglang.phasetrace.progress.unit"  # shards, shapes


def _env(name: str) -> str:
    return otlp.setting("METRICS", name)


def wanted() -> bool:
    """An OTLP metrics endpoint is set and nobody turned metrics off (reads the environment only)."""
    return (
        bool(_env("ENDPOINT"))
        and os.environ.get("OTEL_METRICS_EXPORTER", "otlp").strip() != "none"
        and os.environ.get(keys.ENV_METRICS, "1").strip() != "0"
    )


def interval_s(default: float) -> float:
    """Export every ``OTEL_METRIC_EXPORT_INTERVAL`` ms where set, else at the heartbeat interval."""
    try:
        return max(0.1, float(os.environ["OTEL_METRIC_EXPORT_INTERVAL"]) / 1000.0)
    except (KeyError, ValueError):
        return max(0.1, default)


def observe(rt: Runtime, record: dict[str, Any]) -> None:
    """A heartbeat was taken (heartbeat thread; at ready, the caller's): keep it for the next collection.
    An idle helper process (detokenizer, ...: no rank, no phase) is left out, as from the journal."""
    if process_state.STATE.metrics is None and rt.identity.role == "process" and not record["phases"]:
        return
    metrics = _current(
        lambda: Metrics(
            rt.run_dir.name if rt.run_dir else "", rt.identity.attributes, interval_s(record.get("interval_s") or 2.0)
        )
    )
    if metrics is not None:
        metrics.observe(record)


def stalled(run_dir: Path, findings: Iterable[Any], ranks: Iterable[str], interval: float) -> None:
    """The watchdog's verdicts of this pass (``diagnose.Finding``), for the stalled flag of every rank
    it watches: 1 with the kind and phase while an alarm names the rank, else 0. Exported by the
    process that watches: the launcher (with its own heartbeat's metrics) or ``phasetrace watch``."""
    metrics = _current(lambda: _watch_metrics(run_dir, interval))
    if metrics is not None:
        metrics.stalled(findings, ranks)


def _watch_metrics(run_dir: Path, interval: float) -> Metrics:
    rt = process_state.STATE.runtime
    if rt is not None and rt.started:  # the launcher: one set of metrics with its heartbeat's
        metrics = Metrics(run_dir.name, rt.identity.attributes, interval_s(interval))
    else:  # phasetrace watch: as in its journal (tracing/cli/watch.py)
        ident = {"host.name": _host(), "process.pid": os.getpid(), keys.ROLE: "watchdog", keys.RANK_LABEL: "watch"}
        metrics = Metrics(run_dir.name, lambda: ident, interval_s(interval))
    metrics.want(str(metrics.identity()[keys.RANK_LABEL]))
    return metrics


def _host() -> str:
    import socket

    return socket.gethostname()


def _current(make: Callable[[], Metrics]) -> Metrics | None:
    """This process's metrics (``process_state``: a forked child makes its own), made on first use;
    None when not wanted here, or when they could not be made (said once)."""
    state = process_state.STATE
    if state.metrics is None:
        with state.lock:
            if state.metrics is None:
                state.metrics = False
                if wanted():
                    try:
                        state.metrics = make()
                    except Exception as exc:
                        log.warning(
                            "sglang-phasetrace: OTLP metrics not started (%r); heartbeats stay in the run directory",
                            exc,
                        )
    return state.metrics or None


class Metrics:
    """One process's instruments. Built in a thread of its own (imports, exporter) the first time a
    label is known, and again when it changes (a rank learns its ranks after its first beats): the
    resource then says which rank this is; ``service.instance.id`` stays the same."""

    def __init__(
        self,
        run_id: str,
        identity: Callable[[], dict[str, Any]],
        interval: float,
        reader: Callable[[], MetricReader] | None = None,
    ) -> None:
        self.run_id, self.identity, self.interval = run_id, identity, interval
        self.reader = reader  # tests: an in-memory reader instead of OTLP
        self.pid = os.getpid()
        self.latest: dict[str, Any] | None = None  # the latest heartbeat
        self.flags: dict[str, dict[str, Any]] = {}  # watched rank -> its stalled flag's attributes (+ value)
        self.wanted: str | None = None  # the label the resource should say
        self.built: str | None = None
        self.provider: MeterProvider | None = None
        self.builder: threading.Thread | None = None
        self.build_lock = threading.Lock()
        self.exit_hook = False

    # -- fed by the heartbeat and the watchdog: a store or two, nothing else ---------------------
    def observe(self, record: dict[str, Any]) -> None:
        self.latest = record
        self.want(record["label"])

    def stalled(self, findings: Iterable[Any], ranks: Iterable[str]) -> None:
        flags = {label: {keys.RANK_LABEL: label, "value": 0} for label in ranks}
        for f in findings:
            if f.alarm:
                kind = "blocked" if f.kind == "straggler" and f.doing.startswith("blocked") else f.kind
                flags[f.label] = {keys.RANK_LABEL: f.label, STALL_KIND: kind, keys.PHASE: f.phase or "", "value": 1}
        self.flags = flags

    def want(self, label: str) -> None:
        if label == self.built or (label == self.wanted and self.builder is not None and self.builder.is_alive()):
            return
        self.wanted = label
        if self.builder is None or not self.builder.is_alive():
            self.builder = threading.Thread(target=self._build, name="phasetrace-metrics", daemon=True)
            self.builder.start()

    # -- the builder thread -----------------------------------------------------------------------
    def _build(self) -> None:
        try:
            with self.build_lock:
                while self.wanted != self.built:
                    label = self.wanted
                    old, self.provider, self.built = self.provider, self._provider(label), label
                    if old is not None:  # its last collection says nothing: its label is not the current one
                        threading.Thread(target=old.shutdown, args=(1000,), daemon=True).start()
            if not self.exit_hook:  # a traced process flushes them at exit with its spans (``lifecycle``)
                self.exit_hook = True
                atexit.register(self.flush)
        except Exception as exc:
            if process_state.say_once(("metrics", "build")):
                log.warning(
                    "sglang-phasetrace: OTLP metrics not started (%r); heartbeats stay in the run directory", exc
                )

    def _provider(self, label: str) -> MeterProvider:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        if self.reader is not None:
            reader = self.reader()
        else:
            reader = PeriodicExportingMetricReader(_exporter(self.pid), export_interval_millis=self.interval * 1000)
        provider = MeterProvider(metric_readers=[reader], resource=self._resource(), shutdown_on_exit=False)
        meter = provider.get_meter("sglang-phasetrace", "0.1.0")
        mine = label  # a replaced provider reports nothing (see _build)

        def instrument(
            kind: str,
            name: str,
            unit: str,
            description: str,
            points: Callable[[], Iterable[tuple[float, dict[str, Any]]]],
        ) -> None:
            def callback(_options: CallbackOptions) -> list[Observation]:
                from opentelemetry.metrics import Observation

                if self.built != mine or os.getpid() != self.pid:
                    return []
                return [Observation(value, attrs) for value, attrs in points()]

            getattr(meter, f"create_observable_{kind}")(name, [callback], unit, description)

        g, u = "gauge", "up_down_counter"
        instrument(g, PHASE_ELAPSED, "s", "Time in the current (innermost) phase.", self._phase)
        instrument(g, PROGRESS_DONE, "{item}", "Progress of an open phase: items done.", self._progress("done"))
        instrument(g, PROGRESS_TOTAL, "{item}", "Progress of an open phase: items in all.", self._progress("total"))
        instrument(g, HEARTBEAT_AGE, "s", "Time since this process's latest heartbeat.", self._age)
        instrument(g, HEARTBEAT_TIMESTAMP, "s", "Unix time of this process's latest heartbeat.", self._beat_time)
        instrument(u, READY, "1", "1 once this process is ready (a rank: Scheduler initialised).", self._ready)
        instrument(u, STALLED, "1", "1 while the watchdog names this rank stalled, dead or failed.", self._stalled)
        instrument(g, CPU, "1", "CPU time over wall time and CPUs available, between heartbeats.", self._cpu)
        instrument(u, MEMORY, "By", "Resident set size.", self._figure("rss"))
        instrument(u, THREADS, "{thread}", "Process threads.", self._figure("threads"))
        instrument(g, GPU_UTIL, "1", "GPU busy fraction (NVML).", self._gpu(lambda g: g["util"] / 100.0))
        instrument(u, GPU_MEM_USED, "By", "GPU memory used.", self._gpu(lambda g: g["mem_used"]))
        instrument(u, GPU_MEM_LIMIT, "By", "GPU memory size.", self._gpu(lambda g: g["mem_total"]))
        instrument(
            g,
            GPU_MEM_UTIL,
            "1",
            "Fraction of GPU memory used.",
            self._gpu(lambda g: g["mem_used"] / g["mem_total"] if g["mem_total"] else None),
        )
        instrument(g, GPU_POWER, "W", "GPU power draw.", self._gpu(lambda g: g.get("power_w")))
        return provider

    def _resource(self) -> Any:
        from opentelemetry.sdk.resources import Resource

        ident = self.identity()
        attrs = {
            "service.name": os.environ.get("OTEL_SERVICE_NAME") or "sglang",
            "service.instance.id": f"{self.run_id}/{ident.get('host.name')}:{ident.get('process.pid')}",
            keys.RUN_ID: self.run_id,
            **ident,
        }
        from .runtime import sglang_version

        version = sglang_version()
        if version:
            attrs[keys.SGLANG_VERSION] = version
        return Resource.create(attrs)

    # -- what each instrument reads from the latest heartbeat (the reader's thread) -----------------
    def _rank(self, beat: dict[str, Any], **attrs: Any) -> dict[str, Any]:
        return {keys.RANK_LABEL: beat["label"], **attrs}

    def _phase(self) -> list[tuple[float, dict[str, Any]]]:
        beat = self.latest
        if not beat or not beat["phases"]:
            return []
        inner = beat["phases"][-1]
        age = max(0.0, (time.time_ns() - beat["t"]) / 1e9)
        return [(round(inner["since_s"] + age, 3), self._rank(beat, **{keys.PHASE: inner["phase"]}))]

    def _progress(self, field: str) -> Callable[[], list[tuple[float, dict[str, Any]]]]:
        def points() -> list[tuple[float, dict[str, Any]]]:
            beat = self.latest or {"phases": ()}
            return [
                (
                    p["progress"][field],
                    self._rank(beat, **{keys.PHASE: p["phase"], PROGRESS_UNIT: str(p["progress"].get("unit", ""))}),
                )
                for p in beat["phases"]
                if isinstance((p.get("progress") or {}).get(field), (int, float))
            ]

        return points

    def _age(self) -> list[tuple[float, dict[str, Any]]]:
        beat = self.latest
        return [(max(0.0, round((time.time_ns() - beat["t"]) / 1e9, 3)), self._rank(beat))] if beat else []

    def _beat_time(self) -> list[tuple[float, dict[str, Any]]]:
        beat = self.latest
        return [(beat["t"] / 1e9, self._rank(beat))] if beat else []

    def _ready(self) -> list[tuple[float, dict[str, Any]]]:
        beat = self.latest
        return [(int(bool(beat["ready"])), self._rank(beat))] if beat else []

    def _stalled(self) -> list[tuple[float, dict[str, Any]]]:
        return [(flag["value"], {k: v for k, v in flag.items() if k != "value"}) for flag in self.flags.values()]

    def _cpu(self) -> list[tuple[float, dict[str, Any]]]:
        beat = self.latest
        if not beat or not beat.get("dt_s"):
            return []
        return [(round(beat["cpu_s"] / beat["dt_s"] / _cpus(), 4), self._rank(beat))]

    def _figure(self, field: str) -> Callable[[], list[tuple[float, dict[str, Any]]]]:
        def points() -> list[tuple[float, dict[str, Any]]]:
            beat = self.latest
            return [(beat[field], self._rank(beat))] if beat and field in beat else []

        return points

    def _gpu(self, read: Callable[[dict[str, Any]], float | None]) -> Callable[[], list[tuple[float, dict[str, Any]]]]:
        def points() -> list[tuple[float, dict[str, Any]]]:
            beat = self.latest
            figures = beat.get("gpu") if beat else None
            if not figures:
                return []
            try:
                value = read(figures)
            except (KeyError, TypeError):
                return []
            attrs = self._rank(beat, **{"hw.id": f"gpu{figures.get('index', '')}", "hw.type": "gpu"})
            return [] if value is None else [(value, attrs)]

        return points

    # -- exit ---------------------------------------------------------------------------------------
    def flush(self, timeout_s: float = otlp.EXIT_S) -> None:
        """One last collection and send, bounded (``otlp.flush``), in a process whose exit does not
        flush already (``phasetrace watch``): a traced process's exit flush (``lifecycle``) sends
        these with its spans, under one bound."""
        if not process_state.STATE.exit_hook and process_state.STATE.metrics is self:
            otlp.flush(provider(), timeout_s=timeout_s)


def provider() -> MeterProvider | None:
    """This process's meter provider, for the exit flush; None when there is none (never a forked
    child's copy of its parent's, nor one replaced: ``process_state.reset``)."""
    metrics = process_state.STATE.metrics
    if metrics and metrics.provider is not None and os.getpid() == metrics.pid:
        return metrics.provider
    return None


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _exporter(pid: int) -> Any:
    """The OTLP metric exporter for the protocol the spans use (``OTEL_EXPORTER_OTLP_[METRICS_]PROTOCOL``,
    default ``http/protobuf``), watched like theirs: one warning per process for spans and metrics (a
    collector that takes spans and refuses metrics at once, as Jaeger does, is a line of its own),
    the collector's state shared with the span exporter's, SDK retry logs quiet while it is ours,
    nothing sent from a fork."""
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

    if otlp.protocol("METRICS") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from ..redact import redact_text

    endpoint = _env("ENDPOINT")
    known = otlp.collector()
    known.endpoint = known.endpoint or endpoint

    class Watched(MetricExporter):
        def __init__(self, inner: Any) -> None:
            super().__init__(inner._preferred_temporality, inner._preferred_aggregation)
            self.inner = inner

        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
            if os.getpid() != pid:  # the SDK restarts its reader thread in a forked child: not ours to send
                return MetricExportResult.SUCCESS
            result, error = MetricExportResult.FAILURE, None
            with otlp.exporting() as export:
                try:
                    result = self.inner.export(metrics_data, timeout_millis=timeout_millis)
                except Exception as exc:
                    error = exc
            known = otlp.collector()
            if result is MetricExportResult.SUCCESS:
                known.answered(True, endpoint)
            elif export.refused and not export.complained:
                refused()  # it is there and takes no metrics (Jaeger): spans are not its concern
            else:  # it does not answer (or not in time): one line of this process, spans' and metrics' alike
                known.answered(False, endpoint)
                known.failed(endpoint, f" ({type(error).__name__})" if error is not None else "", "metrics")
            return result

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return self.inner.force_flush(timeout_millis)

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            self.inner.shutdown(timeout_millis=timeout_millis)

    def refused() -> None:
        if process_state.say_once(("metrics", "refused")):
            otlp.say(
                f"OTLP metrics export to {redact_text(endpoint)} refused; live metrics are missing (a traces-only "
                f"collector such as Jaeger? {keys.ENV_METRICS}=0 turns metrics off)"
            )

    return Watched(OTLPMetricExporter())
