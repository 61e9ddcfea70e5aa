"""A start's state (``verdicts.startup``) in the Prometheus text format, through ``prometheus_client``:
what a scrape of the launcher's ``/metrics`` returns while the launch starts, and once it serves.

Every series is ``phasetrace_…``. Per launch: its state (a state set), seconds since it began, the
predicted seconds to ready and their p95 (absent without history), each standing verdict as a
labelled gauge, processes by role and state. Per process (``label``, ``role``): its state and current
phase (as labels of a gauge of 1), seconds in that phase, heartbeat age, progress, CPU, RSS,
threads, GPU figures where the heartbeat carries them. Verdict text is never a label (it may be
long, and it is free text): the verdict's kind, process and phase are. Every label value is bounded
(``bound``): a longer one is cut with a visible ``…`` and a digest of the whole, so two long ones stay
two series, and cardinality grows with the launch's processes only.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric, StateSetMetricFamily

from ..verdicts.startup import STATES, Startup

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LABEL_MAX = 128  # characters of a label value: a process label or phase is far shorter; more is not a name
PROC = ["label", "role"]
# per-process gauges: (row key, metric name, help)
FIGURES = (
    ("in_phase_s", "phasetrace_process_phase_seconds", "Seconds the process has been in its current phase."),
    ("heartbeat_age_s", "phasetrace_process_heartbeat_age_seconds", "Seconds since the process's last heartbeat."),
    ("progress_done", "phasetrace_process_progress_done", "Progress of its phase: units done (e.g. shards)."),
    ("progress_total", "phasetrace_process_progress_total", "Progress of its phase: units in all."),
    ("cpu_pct", "phasetrace_process_cpu_percent", "CPU use over its last heartbeat interval, percent of a core."),
    ("rss", "phasetrace_process_resident_memory_bytes", "Resident memory at its last heartbeat."),
    ("threads", "phasetrace_process_threads", "Threads at its last heartbeat."),
    ("gpu_util_pct", "phasetrace_process_gpu_utilization_percent", "GPU utilization at its last heartbeat."),
    ("gpu_mem_used", "phasetrace_process_gpu_memory_used_bytes", "GPU memory used at its last heartbeat."),
    ("gpu_power_w", "phasetrace_process_gpu_power_watts", "GPU power draw at its last heartbeat."),
)


class StartupCollector:
    """A ``prometheus_client`` collector over the latest state ``get`` returns (None: no pass yet)."""

    def __init__(self, get: Callable[[], Startup | None]) -> None:
        self.get = get

    def collect(self) -> Iterator[Metric]:
        s = self.get()
        if s is None:
            return
        state = StateSetMetricFamily("phasetrace_start_state", "The launch's start: one state is 1.")
        state.add_metric([], {name: name == s.state for name in STATES})
        yield state
        info = InfoMetricFamily("phasetrace_start", "The run this start is.")
        info.add_metric([], {"run": bound(s.run_id)})
        yield info
        yield _gauge("phasetrace_start_probe_code", "What `phasetrace probe` exits with now.", s.code)
        if s.since_s is not None:
            yield _gauge("phasetrace_start_seconds", "Seconds since the launch began.", s.since_s)
        predicted = s.predicted or {}
        if predicted.get("eta_s") is not None:
            yield _gauge(
                "phasetrace_start_predicted_ready_seconds",
                "Seconds until ready, by the earlier starts of this launch.",
                predicted["eta_s"],
            )
        if predicted.get("p95_s") is not None:
            yield _gauge(
                "phasetrace_start_predicted_ready_p95_seconds",
                "Seconds within which the earlier starts were ready from here (each step's p95).",
                predicted["p95_s"],
            )
        verdicts = GaugeMetricFamily(
            "phasetrace_start_verdict", "A standing verdict: 1 per verdict.", labels=["kind", "label", "phase"]
        )
        for v in s.verdicts:
            verdicts.add_metric(_labels(v["kind"], v["label"], v["phase"]), 1)
        yield verdicts
        yield from _processes(s.processes)


def bound(value: str) -> str:
    """``value`` whole when it has at most ``LABEL_MAX`` characters; else its start, ``…`` and 8 hex
    digits of its digest (``LABEL_MAX`` in all): visibly cut, and two cut values stay distinct."""
    if len(value) <= LABEL_MAX:
        return value
    digest = hashlib.blake2s(value.encode("utf-8", "surrogatepass"), digest_size=4).hexdigest()
    return f"{value[: LABEL_MAX - 9]}…{digest}"


def _labels(*values: str | None) -> list[str]:
    return [bound(v or "") for v in values]


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _processes(rows: list[dict[str, Any]]) -> Iterator[Metric]:
    counts = GaugeMetricFamily("phasetrace_start_processes", "Processes of the launch by role and state.",
                               labels=["role", "state"])  # fmt: skip
    for (role, st), n in sorted(Counter((r["role"], r["state"]) for r in rows).items()):
        counts.add_metric(_labels(role, st), n)
    yield counts
    state = GaugeMetricFamily("phasetrace_process_state", "A process's state: 1.", labels=[*PROC, "state"])
    phase = GaugeMetricFamily("phasetrace_process_phase", "A process's current phase: 1.", labels=[*PROC, "phase"])
    for r in rows:
        state.add_metric(_labels(r["label"], r["role"], r["state"]), 1)
        if r["phase"]:
            phase.add_metric(_labels(r["label"], r["role"], r["phase"]), 1)
    yield state
    yield phase
    for key, name, doc in FIGURES:
        family = GaugeMetricFamily(name, doc, labels=PROC)
        for r in rows:
            if r.get(key) is not None:
                family.add_metric(_labels(r["label"], r["role"]), r[key])
        yield family


def registry(get: Callable[[], Startup | None]) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StartupCollector(get))  # type: ignore[arg-type]
    return reg


def text(reg: CollectorRegistry) -> bytes:
    """One scrape's body (Prometheus text format 0.0.4)."""
    return generate_latest(reg)
