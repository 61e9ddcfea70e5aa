"""Heartbeat contents, GPU figures and the init-collective bookkeeping."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import types
import uuid
from pathlib import Path

import pytest
from sglang_phasetrace.tracing.reader.load import load_run
from sglang_phasetrace.tracing.recorder import collective_log, gpu, heartbeat, spans


def test_heartbeat_says_where_the_process_is(trace_run_dir: Path) -> None:
    outer = spans.start_phase("model.load_weights", {"sglang.phase": "model.load_weights"})
    inner = spans.start_phase("model.weights_iterator", {"sglang.phase": "model.weights_iterator"})
    inner.progress(done=3, total=8, unit="shards")
    entry = collective_log.enter("barrier", "tp:0[0,1]")
    beat = heartbeat.current()
    beat.beat()
    record = json.loads(beat.status_path.read_text())  # the status file holds the latest beat
    assert [p["phase"] for p in record["phases"]] == ["model.load_weights", "model.weights_iterator"]
    assert record["phases"][1]["progress"] == {"done": 3, "total": 8, "unit": "shards"}
    assert record["phases"][0]["since_s"] >= 0
    assert record["collective"]["op"] == "barrier" and record["collective"]["group"] == "tp:0[0,1]"
    assert record["collectives"]["tp:0[0,1]"] >= 1
    assert record["rss"] > 0 and record["threads"] >= 2 and record["cpu_s"] >= 0
    assert "gpu" not in record  # a process with no GPU id (not a rank on a GPU) has no GPU figures
    assert record["main"]["state"] in "RSD" and record["dt_s"] >= 0 and record["io_b"] >= 0
    assert record["majflt"] >= 0 and record["child_cpu_s"] >= 0
    collective_log.exit(entry)
    inner.end()
    outer.end()
    journaled = [hb for p in load_run(trace_run_dir).processes for hb in p.heartbeats]
    assert journaled and journaled[-1]["seq"] == record["seq"]


def test_heartbeat_says_what_the_main_thread_and_its_children_did(trace_run_dir: Path) -> None:
    """The figures the watchdog tells "blocked" from "busy" with: this (main) thread's CPU, a child's CPU."""
    spans.start_phase("graph.capture", {"sglang.phase": "graph.capture"})
    beat = heartbeat.current()
    beat.record()
    deadline = time.thread_time() + 0.3
    while time.thread_time() < deadline:  # the main thread computes
        pass
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    record = beat.record()
    assert record["main"]["cpu_s"] >= 0.25 and record["cpu_s"] >= record["main"]["cpu_s"] - 0.02
    assert record["child_cpu_s"] >= 0.25  # CPU spent in a process the main thread started (a compiler, say)
    time.sleep(0.3)
    idle = beat.record()
    assert idle["main"]["cpu_s"] < 0.15 and idle["child_cpu_s"] == 0 and 0.25 < idle["dt_s"] < 5  # asleep


def test_heartbeat_carries_gpu_figures_where_nvml_answers(trace_run_dir: Path, stand_in_nvml, monkeypatch) -> None:
    spans.start_phase("kv_cache.alloc", {"sglang.phase": "kv_cache.alloc"})
    beat = heartbeat.current()
    monkeypatch.setitem(beat.rt.identity.ranks, "gpu", 0)
    record = beat.record()
    assert record["gpu"]["util"] == 0 and record["gpu"]["power_w"] == 118.0  # what diagnose reads as "GPU idle"


def test_a_rank_without_an_nvidia_driver_beats_without_gpu_figures(trace_run_dir: Path, monkeypatch) -> None:
    """NVML that cannot start (no driver, no library): the rank's heartbeat has no ``gpu``, never zeros."""
    nvml = types.ModuleType("pynvml")

    def no_driver() -> None:
        raise RuntimeError("NVML_ERROR_LIBRARY_NOT_FOUND")  # what pynvml raises without libnvidia-ml

    nvml.nvmlInit = no_driver
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(gpu, "_state", {})
    spans.start_phase("kv_cache.alloc", {"sglang.phase": "kv_cache.alloc"})
    beat = heartbeat.current()
    monkeypatch.setitem(beat.rt.identity.ranks, "gpu", 0)
    assert "gpu" not in beat.record()


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="an NVIDIA driver is present on this host")
def test_no_gpu_figures_on_a_host_without_an_nvidia_driver(monkeypatch) -> None:
    """The real NVML binding (or its absence) on a host with no driver: nothing, not made-up figures."""
    monkeypatch.setattr(gpu, "_state", {})
    assert gpu.sample(0) is None


@pytest.fixture
def stand_in_nvml(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """NVML has no CPU path: a stand-in ``pynvml`` with the calls gpu.py makes (and nothing else)."""
    nvml = types.ModuleType("pynvml")
    nvml.NVML_CLOCK_SM = 1
    nvml.nvmlInit = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda index: ("handle", index)
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=0, memory=0)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=70 * 2**30, total=141 * 2**30)
    nvml.nvmlDeviceGetPowerUsage = lambda h: 118_000  # mW
    nvml.nvmlDeviceGetClockInfo = lambda h, clock: 1980
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(gpu, "_state", {})
    return nvml


def test_gpu_figures_come_with_power_and_clock(stand_in_nvml: types.ModuleType, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    figures = gpu.sample(1)
    assert figures == {
        "index": 5,
        "util": 0,
        "mem_util": 0,
        "mem_used": 70 * 2**30,
        "mem_total": 141 * 2**30,
        "power_w": 118.0,
        "sm_clock_mhz": 1980,
    }


def test_gpu_field_a_board_lacks_is_left_out(stand_in_nvml: types.ModuleType) -> None:
    def unsupported(*args: object) -> None:
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    stand_in_nvml.nvmlDeviceGetPowerUsage = unsupported
    figures = gpu.sample(0)
    assert "power_w" not in figures and figures["sm_clock_mhz"] == 1980


def test_collectives_nest_once_and_count_per_group(trace_run_dir: Path) -> None:
    group = f"tp{uuid.uuid4().hex[:8]}:0[0,1]"  # counts are per process: a group no other test used
    spans.start_phase("dist.init")
    outer = collective_log.enter("all_reduce", group)
    assert collective_log.enter("all_reduce", "pg:3") is None  # torch call inside SGLang's: not twice
    collective_log.exit(outer)
    again = collective_log.enter("all_reduce", group)
    collective_log.exit(again)
    [proc] = load_run(trace_run_dir).processes
    assert proc.coll_counts == {group: 2} and proc.coll_open == {}


@pytest.mark.sglang
def test_real_start_beats_during_init_and_stops_recording_collectives_at_ready(engine_run) -> None:
    """The shared tp=2 run generated after ready (TP all-reduces in the forward pass): none of
    that is recorded — the collective patches are removed when each rank is ready."""
    run = load_run(engine_run.run_dir)
    for rank in run.ranks:
        ready_at = rank.root.end
        assert rank.ready and ready_at
        records = [json.loads(line) for line in rank.path.read_text().splitlines()]
        collective = [r for r in records if r["kind"] == "collective"]
        assert collective and all(r["t"] <= ready_at for r in collective)
        assert {"init_process_group", "new_group"} <= {r["op"] for r in collective}
        assert any(r["kind"] == "heartbeat" for r in records)
        assert run.status_file(rank)["ready"] is True
