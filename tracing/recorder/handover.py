"""Which rank a spawned process is, read from the target ``multiprocessing`` hands it."""

from __future__ import annotations

import inspect
from typing import Any

# argument of the rank process's target -> identity rank name
RANK_ARGS = {"tp_rank": "tp", "pp_rank": "pp", "dp_rank": "dp", "moe_ep_rank": "ep", "gpu_id": "gpu"}


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
