"""Process group, model-parallel groups, every GroupCoordinator and communicator (per rank)."""

from __future__ import annotations

import sys
from typing import Any

from ..tracing import keys
from ._attrs import class_name, read
from .collectives import name_groups
from .spec import Call, Phase

PS = "sglang.srt.distributed.parallel_state"
DC = "sglang.srt.distributed.device_communicators"


def _process_group(call: Call) -> dict[str, Any]:
    a = call.arguments
    return {
        "sglang.backend": str(a.get("backend")),
        keys.WORLD_SIZE: a.get("world_size"),
        keys.WORLD_RANK: a.get("rank"),
        "sglang.local_rank": a.get("local_rank"),
        keys.INIT_METHOD: a.get("distributed_init_method"),
        "sglang.timeout_s": a.get("timeout"),
    }


def _torch_ranks(call: Call, result: Any) -> dict[str, Any]:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_initialized():
        return {}
    return {keys.WORLD_RANK: dist.get_rank(), keys.WORLD_SIZE: dist.get_world_size()}


def _model_parallel_ranks(call: Call, result: Any) -> dict[str, Any]:
    ps = sys.modules.get(PS)
    attrs = {}
    for key, getter in (
        (keys.TP_RANK, "get_tensor_model_parallel_rank"),
        ("sglang.tp_size", "get_tensor_model_parallel_world_size"),
        (keys.PP_RANK, "get_pipeline_model_parallel_rank"),
        ("sglang.pp_size", "get_pipeline_model_parallel_world_size"),
    ):
        try:
            attrs[key] = getattr(ps, getter)()
        except Exception:
            continue
    return attrs


def _group(call: Call) -> dict[str, Any]:
    a = call.arguments
    ranks = a.get("group_ranks") or []
    return {
        keys.GROUP_NAME: a.get("group_name") or "anonymous",
        "sglang.group_count": len(ranks),
        "sglang.group_size": len(ranks[0]) if ranks else None,
        "sglang.group_ranks": str(ranks)[:512],
        "sglang.backend": str(a.get("torch_distributed_backend")),
        "sglang.use_pynccl": a.get("use_pynccl"),
        "sglang.use_custom_allreduce": a.get("use_custom_allreduce"),
    }


def _group_done(call: Call, result: Any) -> dict[str, Any]:
    g = call.instance
    name_groups(g)
    return {
        "sglang.group_unique_name": read(g, "unique_name"),
        "sglang.rank_in_group": read(g, "rank_in_group"),
        "sglang.group_world_size": read(g, "world_size"),
    }


def _communicator(call: Call) -> dict[str, Any]:
    group = call.arg("group")
    size = None
    try:
        size = group.size() if hasattr(group, "size") else read(group, "world_size")
    except Exception:
        pass
    return {
        "sglang.device": str(call.arg("device")),
        "sglang.group_size": size,
        "sglang.group_class": class_name(group),
        "sglang.max_size": call.arg("max_size"),
        "sglang.communicator": class_name(call.instance),
    }


def _communicator_done(call: Call, result: Any) -> dict[str, Any]:
    return {"sglang.available": read(call.instance, "available"), "sglang.disabled": read(call.instance, "disabled")}


PHASES = (
    Phase(
        "dist.init",
        (
            "sglang.srt.distributed.bootstrap:init_parallel_runtime",
            "sglang.srt.model_executor.model_runner:ModelRunner.init_torch_distributed",
        ),
        required=True,
    ),
    Phase(
        "dist.init_process_group",
        (f"{PS}:init_distributed_environment",),
        enter=_process_group,
        exit=_torch_ranks,
        required=True,
    ),
    Phase(
        "dist.model_parallel_groups", (f"{PS}:initialize_model_parallel",), exit=_model_parallel_ranks, required=True
    ),
    Phase("dist.group_coordinator", (f"{PS}:GroupCoordinator.__init__",), enter=_group, exit=_group_done),
    Phase(
        "dist.pynccl_comm", (f"{DC}.pynccl:PyNcclCommunicator.__init__",), enter=_communicator, exit=_communicator_done
    ),
    Phase(
        "dist.custom_all_reduce",
        (f"{DC}.custom_all_reduce_v2:CustomAllReduceV2.__init__", f"{DC}.custom_all_reduce:CustomAllreduce.__init__"),
        mode="all",
        enter=_communicator,
        exit=_communicator_done,
    ),
    Phase("dist.dp_attention", ("sglang.srt.layers.dp_attention:initialize_dp_attention",)),
)
