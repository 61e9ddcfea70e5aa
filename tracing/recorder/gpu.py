"""GPU figures for heartbeats through NVML (nvidia-ml-py), or nothing: absent, never faked.

Utilization alone misleads (a spinning kernel shows 100 % at idle power; a deadlocked init
shows 0 %), so power draw and SM clock come with it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("sglang_phasetrace")
_state: dict[str, Any] = {}


def _nvml() -> Any:
    """The initialised pynvml module, or None where there is no NVIDIA driver (tried once)."""
    if "nvml" not in _state:
        _state["nvml"] = None
        try:
            import pynvml

            pynvml.nvmlInit()
            _state["nvml"] = pynvml
        except Exception as exc:  # no driver, no library: no GPU fields
            log.debug("sglang-phasetrace: NVML unavailable: %r", exc)
    return _state["nvml"]


def physical_index(gpu_id: int) -> int:
    """NVML counts all devices; SGLang's ``gpu_id`` counts those in CUDA_VISIBLE_DEVICES."""
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if gpu_id < len(visible) and visible[gpu_id].isdigit():
        return int(visible[gpu_id])
    return gpu_id


DRIVER_GPUS = "/proc/driver/nvidia/gpus"  # one directory per GPU the driver (or the container) shows


def device_model(gpu_id: int | None = None) -> str | None:
    """The GPU model the driver names (``NVIDIA H200``), read from ``/proc/driver/nvidia``: no NVML,
    no CUDA, a few small file reads, once per process. The one of ``gpu_id`` (NVML's order: by PCI
    bus) where the GPUs differ; None without an NVIDIA driver."""
    if "models" not in _state:
        models: list[str] = []
        try:
            for bus in sorted(os.listdir(DRIVER_GPUS)):
                with open(os.path.join(DRIVER_GPUS, bus, "information"), encoding="utf-8", errors="replace") as f:
                    line = next((x for x in f.read(8192).splitlines() if x.startswith("Model:")), None)
                if line is not None:
                    models.append(" ".join(line.split(":", 1)[1].split())[:128])
        except OSError:
            pass
        _state["models"] = models
    models = _state["models"]
    if not models:
        return None
    index = physical_index(gpu_id or 0)
    return models[0] if len(set(models)) == 1 or index >= len(models) else models[index]


def sample(gpu_id: int | None) -> dict[str, Any] | None:
    """Utilization %, memory used/total bytes, power W, SM clock MHz of this rank's GPU."""
    nvml = _nvml() if gpu_id is not None else None
    if nvml is None:
        return None
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(physical_index(gpu_id))
        util = nvml.nvmlDeviceGetUtilizationRates(handle)
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        out: dict[str, Any] = {
            "index": physical_index(gpu_id),
            "util": util.gpu,
            "mem_util": util.memory,
            "mem_used": mem.used,
            "mem_total": mem.total,
        }
    except Exception as exc:
        log.debug("sglang-phasetrace: NVML sample failed: %r", exc)
        return None
    for key, read in (
        ("power_w", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),
        ("sm_clock_mhz", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
    ):
        try:
            out[key] = read()
        except Exception:  # field not supported on this board
            pass
    return out
