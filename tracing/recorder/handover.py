"""Which rank, or which other process of the launch, a spawned process is, read from the target
``multiprocessing`` hands it."""

from __future__ import annotations

import inspect
from typing import Any

# argument of the rank process's target -> identity rank name
RANK_ARGS = {"tp_rank": "tp", "pp_rank": "pp", "dp_rank": "dp", "moe_ep_rank": "ep", "gpu_id": "gpu"}
# the target's function name -> the role of a process of the launch that is not a rank
ROLES = {
    "run_detokenizer_process": "detokenizer",
    "run_multi_detokenizer_router_process": "detokenizer-router",
    "run_data_parallel_controller_process": "dp-controller",
    "run_weight_cache_daemon": "weight-cache",
    "subprocess_started": "tokenizer",  # uvicorn's worker process (``--tokenizer-worker-num`` > 1)
}


def ranks_of(target: Any, args: tuple, kwargs: dict) -> dict[str, int] | None:
    """The rank numbers a process target is called with; None when it is not a rank process."""
    try:
        bound = inspect.signature(target).bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):
        return None
    if "tp_rank" not in bound:
        return None
    return {
        name: value
        for arg, name in RANK_ARGS.items()
        if isinstance(value := bound.get(arg), int) and not isinstance(value, bool)
    }


def role_of(target: Any) -> str | None:
    """The role of a process of the launch that is not a rank (``detokenizer``…), by its target."""
    return ROLES.get(getattr(target, "__name__", None) or "")
