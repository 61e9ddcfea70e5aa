"""Heartbeats as OpenTelemetry metrics: what the instruments read from a real heartbeat, the
watchdog's stalled flag, the names and units against OTel's rules, no cost when off, a collector
that does not answer, and what an independent collector (Rotel) decodes from a real traced start
with a planted stall."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port, hook_env, requires_sglang
from sglang_phasetrace.tracing import process_state
from sglang_phasetrace.tracing.recorder import heartbeat, metrics, otlp, spans
from sglang_phasetrace.tracing.verdicts.diagnose import Finding, Thresholds
from sglang_phasetrace.tracing.verdicts.watchdog import Watchdog
from test_cli_exports import Rotel, rotel_agent
from test_heartbeat import stand_in_nvml  # noqa: F401  (a fixture)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def collect(reader: Any) -> tuple[dict[str, Any], dict[str, tuple[str, str, list[tuple[float, dict]]]]]:
    """Resource attributes, and metric name -> (unit, data type, [(value, attributes)])."""
    data = reader.get_metrics_data()
    resource: dict[str, Any] = {}
    found: dict[str, tuple[str, str, list]] = {}
    for rm in data.resource_metrics:
        resource = dict(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                points = [(p.value, dict(p.attributes)) for p in m.data.data_points]
                found[m.name] = (m.unit, type(m.data).__name__, points)
    return resource, found


def in_memory(rt: Any, interval: float = 60.0) -> tuple[metrics.Metrics, Any]:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    m = metrics.Metrics(rt.run_dir.name, rt.identity.attributes, interval, reader=lambda: reader)
    return m, reader


def built(m: metrics.Metrics) -> metrics.Metrics:
    deadline = time.monotonic() + 30
    while (m.builder is None or m.builder.is_alive() or m.built != m.wanted) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert m.built == m.wanted and m.provider is not None
    return m


@pytest.fixture
def no_process_metrics():
    """The process's own metrics (``process_state.STATE.metrics``) start unmade and are shut down after."""
    process_state.STATE.metrics = None
    yield
    made = process_state.STATE.metrics
    if made and made.provider is not None:
        made.provider.shutdown(timeout_millis=2000)
    process_state.STATE.metrics = None


@pytest.mark.usefixtures("stand_in_nvml")
def test_a_heartbeat_becomes_gauges_with_rank_phase_progress_and_gpu(trace_run_dir: Path) -> None:
    rt = spans.start_phase("model.load_weights", {"sglang.phase": "model.load_weights"}).rt
    inner = spans.start_phase("model.weights_iterator", {"sglang.phase": "model.weights_iterator"})
    inner.progress(done=3, total=8, unit="shards")
    rt.set_identity(role="rank", tp=1, world=1, gpu=0)
    time.sleep(0.05)  # an interval since the thread's first beat: CPU utilization needs one (dt_s > 0)
    record = heartbeat.current().record()
    m, reader = in_memory(rt)
    m.observe(record)
    built(m)
    resource, found = collect(reader)

    assert resource["service.name"] == "sglang" and resource["host.name"] and resource["process.pid"] == os.getpid()
    assert resource["service.instance.id"] == f"{rt.run_dir.name}/{resource['host.name']}:{os.getpid()}"
    assert resource["phasetrace.run_id"] == rt.run_dir.name
    assert (resource["sglang.rank"], resource["sglang.tp_rank"], resource["sglang.role"]) == ("tp1", 1, "rank")
    rank = {"sglang.rank": "tp1"}
    [(elapsed, attrs)] = found[metrics.PHASE_ELAPSED][2]
    assert attrs == {**rank, "sglang.phase": "model.weights_iterator"} and 0 <= elapsed < 30
    assert found[metrics.PHASE_ELAPSED][:2] == ("s", "Gauge")
    shards = {**rank, "sglang.phase": "model.weights_iterator", metrics.PROGRESS_UNIT: "shards"}
    assert found[metrics.PROGRESS_DONE][2] == [(3, shards)] and found[metrics.PROGRESS_TOTAL][2] == [(8, shards)]
    [(age, attrs)] = found[metrics.HEARTBEAT_AGE][2]
    assert attrs == rank and 0 <= age < 30
    assert found[metrics.HEARTBEAT_TIMESTAMP][2] == [(record["t"] / 1e9, rank)]
    assert found[metrics.READY][2] == [(0, rank)] and found[metrics.READY][:2] == ("1", "Sum")
    assert found[metrics.MEMORY][2] == [(record["rss"], rank)] and found[metrics.MEMORY][:2] == ("By", "Sum")
    assert found[metrics.THREADS][2] == [(record["threads"], rank)]
    [(cpu, attrs)] = found[metrics.CPU][2]
    assert attrs == rank and 0 <= cpu <= 1
    gpu = {**rank, "hw.id": "gpu0", "hw.type": "gpu"}
    assert found[metrics.GPU_UTIL][2] == [(0.0, gpu)] and found[metrics.GPU_POWER][2] == [(118.0, gpu)]
    assert found[metrics.GPU_MEM_USED][2] == [(70 * 2**30, gpu)]
    assert found[metrics.GPU_MEM_LIMIT][2] == [(141 * 2**30, gpu)]
    assert found[metrics.GPU_MEM_UTIL][2] == [(pytest.approx(70 / 141), gpu)]
    assert metrics.STALLED not in found  # only a process that watches has stalled flags

    rt.mark_ready()  # ready: the flag turns 1 at the next beat
    m.observe(heartbeat.current().record())
    assert collect(reader)[1][metrics.READY][2] == [(1, rank)]
    m.provider.shutdown()


def test_a_rank_that_learns_its_ranks_gets_a_resource_that_says_so(trace_run_dir: Path) -> None:
    """Traced from import, a rank beats as ``pid…`` before its Scheduler knows the ranks: the provider is
    rebuilt once the label changes, with the same service.instance.id; the old one reports nothing more."""
    rt = spans.start_phase("rank.bootstrap", {"sglang.phase": "rank.bootstrap"}).rt
    m, first = in_memory(rt)
    m.observe(heartbeat.current().record())
    built(m)
    resource, _ = collect(first)
    assert resource["sglang.rank"] == f"pid{os.getpid()}" and resource["sglang.role"] == "process"
    old = m.provider
    rt.set_identity(role="rank", tp=0)
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    second = InMemoryMetricReader()
    m.reader = lambda: second
    m.observe(heartbeat.current().record())
    built(m)
    resource2, found = collect(second)
    assert m.provider is not old and resource2["sglang.rank"] == "tp0" and resource2["sglang.tp_rank"] == 0
    assert resource2["service.instance.id"] == resource["service.instance.id"]
    assert found[metrics.READY][2] == [(0, {"sglang.rank": "tp0"})]
    deadline = time.monotonic() + 5
    while first.get_metrics_data() is not None and time.monotonic() < deadline:  # the replaced one: shut down
        time.sleep(0.05)
    assert first.get_metrics_data() is None
    m.provider.shutdown()


def test_the_stalled_flag_follows_the_watchdogs_verdicts(trace_run_dir: Path) -> None:
    rt = spans.start_phase("launch.engine", {"sglang.phase": "launch.engine"}).rt
    m, reader = in_memory(rt)
    m.observe(heartbeat.current().record())
    built(m)

    def finding(kind: str, label: str, doing: str = "") -> Finding:
        return Finding(kind, label, 4242, "dist.init", 12.0, f"rank {label} ...", doing=doing)

    blocked = finding("straggler", "tp1", "blocked (1 % CPU, sleeping)")
    notice = finding("slow", "tp0", "slow (loading shards 41/64)")
    m.stalled([blocked, notice], ["tp0", "tp1", "tp2"])
    flags = {a["sglang.rank"]: (v, a) for v, a in collect(reader)[1][metrics.STALLED][2]}
    assert flags["tp1"] == (1, {"sglang.rank": "tp1", metrics.STALL_KIND: "blocked", "sglang.phase": "dist.init"})
    assert flags["tp0"] == (0, {"sglang.rank": "tp0"})  # a notice is not an alarm
    assert flags["tp2"] == (0, {"sglang.rank": "tp2"})
    m.stalled([finding("died", "tp2"), finding("straggler", "tp0", "unknown (no activity figures)")], ["tp0", "tp1"])
    flags = {a["sglang.rank"]: (v, a.get(metrics.STALL_KIND)) for v, a in collect(reader)[1][metrics.STALLED][2]}
    assert flags == {"tp0": (1, "straggler"), "tp1": (0, None), "tp2": (1, "died")}  # tp1 cleared
    m.provider.shutdown()


def test_names_and_units_follow_the_otel_rules(trace_run_dir: Path) -> None:
    """Every instrument, from a beat with every figure: lowercase dotted names; UCUM units; a name outside
    ``sglang.phasetrace.*`` is a semantic convention's, with its instrument and unit."""
    from opentelemetry.semconv._incubating.metrics import hw_metrics, process_metrics
    from sglang_phasetrace.tracing.journal import records

    phases = [{"phase": "graph.capture", "since_s": 1.0, "progress": {"done": 1, "total": 4, "unit": "shapes"}}]
    gpu = {"index": 0, "util": 50, "mem_used": 1, "mem_total": 2, "power_w": 300.0}
    beat = records.heartbeat(time.time_ns(), 1, 1, "tp0", False, 2.0, phases, 0.5, 1, 2, gpu=gpu, dt_s=1.0)
    rt = spans.start_phase("graph.capture", {"sglang.phase": "graph.capture"}).rt
    m, reader = in_memory(rt)
    m.observe(beat)
    m.stalled([], ["tp0"])
    built(m)
    _, found = collect(reader)
    semconv = {}
    for module in (hw_metrics, process_metrics):
        text = Path(module.__file__).read_text()
        for doc in re.finditer(
            r'^\w+: Final = "([a-z.]+)"\n"""\n.*?\nInstrument: (\w+)\nUnit: (\S+)', text, re.M | re.S
        ):
            semconv[doc.group(1)] = (doc.group(2), doc.group(3))
    assert len(found) == 15
    for name, (unit, kind, _) in found.items():
        assert re.fullmatch(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+", name) and len(name) <= 255, name
        assert unit in ("s", "By", "1", "W") or re.fullmatch(r"\{[a-z]+\}", unit), (name, unit)
        if not name.startswith("sglang.phasetrace."):
            instrument = {"Gauge": "gauge", "Sum": "updowncounter"}[kind]
            assert semconv.get(name) == (instrument, unit), (name, semconv.get(name), instrument, unit)
    m.provider.shutdown()


OFF_PROGRAM = textwrap.dedent("""
    import sys, threading
    from sglang_phasetrace.tracing.recorder import heartbeat, spans
    spans.start_phase("rank.bootstrap", {"sglang.phase": "rank.bootstrap"})
    heartbeat.current().beat()
    names = {t.name for t in threading.enumerate()}
    print("sdk" if "opentelemetry.sdk.metrics" in sys.modules else "no-sdk",
          "thread" if {"phasetrace-metrics", "OtelPeriodicExportingMetricReader"} & names else "no-thread")
""")


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "SGLANG_PHASETRACE_METRICS": "0"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_METRICS_EXPORTER": "none"},
    ],
    ids=["no-endpoint", "opted-out", "exporter-none"],
)
def test_off_costs_nothing(tmp_path: Path, env: dict[str, str]) -> None:
    full = hook_env(tmp_path, {"SGLANG_PHASETRACE_RUN_DIR": str(tmp_path / "run"), **env}, hooks=False)
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        if name not in env:
            full.pop(name, None)
    out = subprocess.run([sys.executable, "-c", OFF_PROGRAM], env=full, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["no-sdk", "no-thread"], out.stderr[-2000:]


def test_a_collector_that_does_not_answer_costs_one_line_and_a_bounded_exit(tmp_path: Path) -> None:
    program = OFF_PROGRAM + "import time; time.sleep(2.5); print('exiting', time.monotonic(), flush=True)\n"
    env = hook_env(
        tmp_path,
        {
            "SGLANG_PHASETRACE_RUN_DIR": str(tmp_path / "run"),
            "OTEL_METRIC_EXPORT_INTERVAL": "200",
            "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "1",  # s: the exporter gives up on a batch after 1 s
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",
        },
        hooks=False,
    )
    out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    ended = time.monotonic()
    lines = out.stdout.split("\n")
    assert lines[0].split()[1] == "thread", out.stderr[-2000:]  # the SDK is imported in that thread
    assert ended - float(lines[1].split()[1]) < 4.0  # exit: one bounded flush (and the spans' own)
    said = [line for line in out.stderr.splitlines() if "OTLP metrics export" in line]
    assert len(said) == 1 and said[0].startswith("sglang-phasetrace: ") and "127.0.0.1:" in said[0], out.stderr
    assert "Traceback" not in out.stderr and "Failed to export" not in out.stderr


# -- an independent collector -------------------------------------------------------------------------------


def rotel_metrics(text: str) -> list[dict[str, Any]]:
    """Rotel's detailed debug log of metrics as points: name, unit, datatype, value, attrs, resource."""
    points: list[dict[str, Any]] = []
    resource: dict[str, Any] = {}
    metric: dict[str, Any] = {}
    target: dict[str, Any] = {}
    for line in text.splitlines():
        line = line.rstrip()
        if line.startswith("ResourceMetrics #"):
            resource = target = {}
        elif line.startswith("Metric #"):
            metric = target = {}
        elif line.startswith("NumberDataPoints #"):
            points.append({**metric, "attrs": {}, "resource": resource})
            target = points[-1]["attrs"]
        elif line.startswith("Value: ") and points:
            points[-1]["value"] = float(line[len("Value: ") :])
        elif (m := re.fullmatch(r"\s+-> (Name|Unit|DataType): (.*)", line)) and target is metric:
            metric[m.group(1).lower()] = m.group(2)
        elif (m := re.fullmatch(r"\s+-> ([\w.]+): (Str|Int|Double|Bool)\((.*)\)", line)) is not None:
            kind, raw = m.group(2), m.group(3)
            target[m.group(1)] = int(raw) if kind == "Int" else float(raw) if kind == "Double" else raw
    return points


@pytest.fixture
def rotel(tmp_path: Path):
    agent = rotel_agent()
    if agent is None:
        pytest.skip("the Rotel collector is not installed (scripts/install-test-tools.sh installs it)")
    collector = Rotel(agent, tmp_path, signal="metrics")
    yield collector
    collector.stop()


def wait_points(rotel: Rotel, want: Any, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        points = rotel_metrics(rotel.log.read_text(errors="replace"))
        if want(points) or time.monotonic() > deadline:
            return points
        time.sleep(0.3)


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_rotel_decodes_names_units_attributes_and_resource(
    trace_run_dir: Path, rotel: Rotel, protocol: str, monkeypatch: pytest.MonkeyPatch, no_process_metrics
) -> None:
    endpoint = f"http://127.0.0.1:{rotel.http if protocol != 'grpc' else rotel.grpc}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", endpoint + ("/v1/metrics" if protocol != "grpc" else ""))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", protocol)
    rt = spans.start_phase("model.loader", {"sglang.phase": "model.loader"}).rt
    rt.set_identity(role="rank", tp=1)
    heartbeat.current().beat()  # a beat feeds the process's metrics
    built(process_state.STATE.metrics)
    # this process has an exit hook (its phase started one), so ``Metrics.flush`` leaves the send to the exit
    # flush; send now as that flush does
    assert otlp.flush(metrics.provider(), timeout_s=5.0)
    points = wait_points(rotel, lambda ps: any(p["name"] == metrics.PHASE_ELAPSED for p in ps), 20)
    by_name = {p["name"]: p for p in points}
    phase = by_name[metrics.PHASE_ELAPSED]
    assert (phase["unit"], phase["datatype"]) == ("s", "Gauge")
    assert phase["attrs"] == {"sglang.rank": "tp1", "sglang.phase": "model.loader"} and phase["value"] >= 0
    res = phase["resource"]
    assert res["service.name"] == "sglang" and res["process.pid"] == os.getpid() and res["sglang.tp_rank"] == 1
    assert res["phasetrace.run_id"] == rt.run_dir.name and res["service.instance.id"].endswith(f":{os.getpid()}")
    assert (by_name[metrics.MEMORY]["unit"], by_name[metrics.MEMORY]["datatype"]) == ("By", "Sum")
    assert by_name[metrics.READY]["value"] == 0 and by_name[metrics.READY]["unit"] == "1"


@requires_sglang
@pytest.mark.sglang
def test_a_planted_stall_arrives_as_rank_gauges_and_the_watchdogs_stalled_flag(
    tmp_path: Path, tiny_model, rotel: Rotel, monkeypatch: pytest.MonkeyPatch, no_process_metrics
) -> None:
    """Real SGLang distributed init on gloo, rank 1 blocked before its model-parallel groups: every rank
    exports its phase from its own process; the watchdog (here in-process, as ``phasetrace watch`` runs
    it) exports rank1's stalled flag with its kind."""
    from conftest import dist_ranks
    from test_watchdog import HB, Launched

    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rotel.http}"}
    for name, value in endpoint.items():
        monkeypatch.setenv(name, value)  # the watching process (this one) exports too
    run_dir = tmp_path / "run"
    th = Thresholds(heartbeat_s=HB, silent_s=30, stall_s=6, no_progress_s=300)
    with Launched(dist_ranks(tiny_model[0], 2, "sleep", 1), run_dir, env=endpoint):
        dog = Watchdog(run_dir, th, out=sys.stderr, py_spy=False)
        deadline, found = time.monotonic() + 180, []
        while not found and time.monotonic() < deadline:
            found = [f for f in (dog.step() if (run_dir / "journal").is_dir() else []) if f.alarm]
            time.sleep(HB / 2)
        assert found and found[0].label == "rank1", found

        def arrived(points: list[dict[str, Any]]) -> bool:
            phases = {p["attrs"].get("sglang.rank") for p in points if p["name"] == metrics.PHASE_ELAPSED}
            flags = [p for p in points if p["name"] == metrics.STALLED and p["value"] == 1]
            return {"rank0", "rank1"} <= phases and bool(flags)

        points = wait_points(rotel, arrived, 30)
    assert arrived(points), sorted({(p["name"], str(p["attrs"])) for p in points})
    phases = {p["attrs"]["sglang.rank"]: p for p in points if p["name"] == metrics.PHASE_ELAPSED}
    assert phases["rank1"]["resource"]["process.pid"] == found[0].pid  # from the rank's own process
    assert (
        phases["rank1"]["resource"]["sglang.role"] == "rank" and phases["rank1"]["resource"]["sglang.world_rank"] == 1
    )
    assert phases["rank1"]["attrs"]["sglang.phase"] == "dist.init"
    [flag] = [p for p in points if p["name"] == metrics.STALLED and p["value"] == 1][-1:]
    assert flag["attrs"] == {"sglang.rank": "rank1", metrics.STALL_KIND: "blocked", "sglang.phase": "dist.init"}
    assert flag["resource"]["process.pid"] == os.getpid() and flag["resource"]["sglang.role"] == "watchdog"
    assert flag["resource"]["phasetrace.run_id"] == "run"
    zeros = {p["attrs"]["sglang.rank"] for p in points if p["name"] == metrics.STALLED and p["value"] == 0}
    assert "rank0" in zeros
