"""Per-rank root and the scheduler's init steps (``Scheduler.__init__`` encloses all rank init)."""

from __future__ import annotations

import sys
from typing import Any

from ..tracing import keys
from ._attrs import read, server_args_attrs
from .spec import Call, Phase

M = "sglang.srt.managers.scheduler"
# attribute key -> Scheduler.__init__ argument (≤0.5.20; read by name: positions moved 4 times)
_RANK_ARGS = (
    (keys.TP_RANK, "tp_rank"),
    (keys.PP_RANK, "pp_rank"),
    (keys.DP_RANK, "dp_rank"),
    (keys.EP_RANK, "moe_ep_rank"),
    (keys.GPU_ID, "gpu_id"),
    ("sglang.attn_cp_rank", "attn_cp_rank"),
    ("sglang.moe_dp_rank", "moe_dp_rank"),
)
# attribute key -> name on runtime_context.get_parallel() (0.5.21+)
_PARALLEL = (
    *(r for r in _RANK_ARGS if r[1] != "gpu_id"),
    (keys.WORLD_RANK, "world_rank"),
    ("sglang.tp_size", "tp_size"),
    ("sglang.pp_size", "pp_size"),
    ("sglang.ep_size", "moe_ep_size"),
    ("sglang.dp_size", "dp_size"),
)


def rank_attrs(call: Call) -> dict[str, Any]:
    """Ranks by argument name (≤0.5.20), else from the runtime context SGLang publishes (0.5.21+)."""
    attrs: dict[str, Any] = {key: call.arg(name) for key, name in _RANK_ARGS}
    context = sys.modules.get("sglang.srt.runtime_context")
    parallel = read(context, "get_parallel")
    if parallel is not None:
        p = parallel()
        for key, name in _PARALLEL:
            if attrs.get(key) is None:
                attrs[key] = read(p, name)
        get_device = read(context, "get_device")
        if attrs[keys.GPU_ID] is None and get_device is not None:
            try:
                attrs[keys.GPU_ID] = read(get_device(), "gpu_id")
            except Exception:  # not published in this process
                pass
    attrs.update(server_args_attrs(call.arg("server_args")))
    return attrs


def startup_time(call: Call, result: Any) -> dict[str, Any]:
    """SGLang's own startup timings (0.5.17+), free to attach at rank ready."""
    timings = read(call.instance, "startup_time")
    if not isinstance(timings, dict):
        return {}
    return {f"sglang.startup_time.{k}": v for k, v in timings.items() if isinstance(v, (int, float))}


PHASES = (
    Phase(
        keys.PHASE_RANK, (f"{M}:Scheduler.__init__",), kind="rank", enter=rank_attrs, exit=startup_time, required=True
    ),
    Phase("scheduler.init_tp_worker", (f"{M}:Scheduler.init_tp_model_worker",)),
    Phase("scheduler.init_memory_pools", (f"{M}:Scheduler.init_memory_pools",)),
    Phase("scheduler.init_attention_backends", (f"{M}:Scheduler.init_all_attention_backends",)),
    Phase("scheduler.init_cuda_graphs", (f"{M}:Scheduler.init_all_cuda_graphs",)),
)
