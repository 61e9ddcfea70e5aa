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
