"""Init collectives and barriers: torch.distributed, SGLang's GroupCoordinator, PyNccl.

Kind ``collective``: no span; each call is recorded (op, group, per-group sequence number) in the
journal and the heartbeat state, so the watchdog can say who waits in what; never after ready.
``init_only``: removed at ready, so the serving hot path runs the originals. The enter hooks name
the group (``{"group": …}``) and only read names (no tensors).
"""

from __future__ import annotations

from typing import Any

from .spec import Call, Phase

C10D = "torch.distributed.distributed_c10d"
PS = "sglang.srt.distributed.parallel_state"
PYNCCL = "sglang.srt.distributed.device_communicators.pynccl"
TORCH_OPS = (
    "init_process_group",
    "new_group",
    "barrier",
    "monitored_barrier",
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "send",
    "recv",
)
GROUP_OPS = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gatherv",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatterv",
    "broadcast",
    "broadcast_object",
    "broadcast_object_list",
    "all_gather_object",
    "gather",
    "barrier",
    "send",
    "recv",
    "send_object",
    "recv_object",
    "broadcast_tensor_dict",
    "send_tensor_dict",
    "recv_tensor_dict",
)
PYNCCL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv")

_names: dict[int, str] = {}  # id(torch ProcessGroup) -> readable name ("tp:0", "tp:0/cpu")


def coordinator_name(coordinator: Any) -> str:
    """``tp:0[0,1]``: SGLang's name for the group plus its world ranks, which tell members apart
    (every TP group is ``tp:0`` in its own processes)."""
    name = getattr(coordinator, "unique_name", None) or "GroupCoordinator"
    ranks = getattr(coordinator, "ranks", None)
    return f"{name}[{','.join(map(str, ranks))}]" if ranks else name


def name_groups(coordinator: Any) -> None:
    """Called when a GroupCoordinator is built: name its torch groups after it."""
    name = coordinator_name(coordinator)
    if name:
        for attr, suffix in (("device_group", ""), ("cpu_group", "/cpu")):
            group = getattr(coordinator, attr, None)
            if group is not None:
                _names[id(group)] = name + suffix


def group_name(group: Any) -> str:
    if group is None:
        return "WORLD"
    known = _names.get(id(group))
    if known:
        return known
    try:
        return f"pg:{group.group_name}"
    except Exception:
        return f"pg:{id(group):x}"


def _torch_group(call: Call) -> dict[str, Any]:
    return {"group": group_name(call.arg("group"))}


def _coordinator(call: Call) -> dict[str, Any]:
    return {"group": coordinator_name(call.instance)}


def _pynccl(call: Call) -> dict[str, Any]:
    return {"group": "pynccl:" + group_name(getattr(call.instance, "group", None))}


PHASES = (
    Phase(
        "collective.torch",
        tuple(f"{C10D}:{op}" for op in TORCH_OPS),
        mode="all",
        kind="collective",
        enter=_torch_group,
        init_only=True,
    ),
    Phase(
        "collective.group",
        tuple(f"{PS}:GroupCoordinator.{op}" for op in GROUP_OPS),
        mode="all",
        kind="collective",
        enter=_coordinator,
        init_only=True,
    ),
    Phase(
        "collective.pynccl",
        tuple(f"{PYNCCL}:PyNcclCommunicator.{op}" for op in PYNCCL_OPS),
        mode="all",
        kind="collective",
        enter=_pynccl,
        init_only=True,
    ),
)
