"""Model runner steps (target and every draft runner): construction, weights, KV pool, attention;
and the forward passes of the server's warm-up (between a rank's own init and serving)."""

from __future__ import annotations

import json
import os
import struct
from typing import Any

from ..tracing import keys
from . import installed
from ._attrs import class_name, draft_attrs, read
from .spec import Call, Phase, Report

MR = "sglang.srt.model_executor.model_runner"
WU = "sglang.srt.model_loader.weight_utils"
ITERATORS = (  # every weights iterator SGLang may pick (by load format and flags)
    "safetensors_weights_iterator",
    "multi_thread_safetensors_weights_iterator",
    "buffered_multi_thread_safetensors_weights_iterator",
    "fastsafetensors_weights_iterator",
    "instanttensor_weights_iterator",
    "runai_safetensors_weights_iterator",
    "pt_weights_iterator",
    "multi_thread_pt_weights_iterator",
    "np_cache_weights_iterator",
)


def _runner(call: Call) -> dict[str, Any]:
    a = call.arguments
    return {
        keys.IS_DRAFT: bool(a.get("is_draft_worker", False)),
        "sglang.draft_model_idx": a.get("draft_model_idx"),
        keys.GPU_ID: a.get("gpu_id"),
    }


def _on_runner(call: Call) -> dict[str, Any]:
    return draft_attrs(call.instance)


def _loaded(call: Call, result: Any) -> dict[str, Any]:
    """After the weights: what was loaded, and trace the model class's embed/head methods."""
    model = read(call.instance, "model")
    if model is not None:
        installed.patch_model_class(type(model))
    return {
        "sglang.model_class": class_name(model),
        "sglang.dtype": str(read(call.instance, "dtype")),
        "sglang.weight_load_s": read(call.instance, "weight_load_time"),
        "sglang.weight_load_mem_gb": read(call.instance, "weight_load_mem_usage"),
    }


def _loader(call: Call) -> dict[str, Any]:
    config = call.arg("model_config")
    return {
        "sglang.loader": class_name(call.instance),
        "sglang.model_path": read(config, "model_path"),
        "sglang.load_format": str(read(read(call.instance, "load_config"), "load_format")),
    }


def _safetensors_names(path: str) -> list[str]:
    """Tensor names from a safetensors header (8-byte length + JSON); no tensor data is read."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return [name for name in header if name != "__metadata__"]


def _weights(call: Call) -> Report:
    files = [str(f) for f in (call.arg("hf_weights_files") or [])]
    call.state["files"] = files
    progress = call.state["counts"] = {"done": 0, "total": len(files), "unit": "shards", "tensors": 0}
    return Report(
        attrs={"sglang.shards": len(files), "sglang.shard_dir": os.path.dirname(files[0]) if files else None},
        progress=progress,
    )


def _shard_of(call: Call) -> dict[str, int]:
    """Tensor name -> shard index, and tensors left per shard (safetensors only; else empty)."""
    index = call.state.get("shard_of")
    if index is None:
        index, left = {}, {}
        for i, path in enumerate(call.state["files"]):
            if path.endswith(".safetensors"):
                try:
                    names = _safetensors_names(path)
                except (OSError, ValueError, struct.error):
                    continue
                index.update(dict.fromkeys(names, i))
                left[i] = len(names)
        call.state["shard_of"], call.state["left"] = index, left
    return index


def _weight_item(call: Call, item: Any) -> Report:
    """Count tensors; when a shard's last tensor went by, report the shard (k of N)."""
    progress = call.state["counts"]
    progress["tensors"] += 1
    name = item[0] if isinstance(item, tuple) and item else None
    shard = _shard_of(call).get(name)
    if shard is None:
        return Report(progress=progress)
    left = call.state["left"]
    left[shard] -= 1
    if left[shard]:
        return Report(progress=progress)
    progress["done"] += 1
    return Report(
        progress=progress,
        event=(
            "shard_loaded",
            {
                "shard": os.path.basename(call.state["files"][shard]),
                "done": progress["done"],
                "total": progress["total"],
                "tensors": progress["tensors"],
            },
        ),
    )


def _weights_done(call: Call, result: Any) -> dict[str, Any]:
    p = call.state.get("counts", {})
    return {"sglang.tensors": p.get("tensors"), "sglang.shards_done": p.get("done")}


def _kv(call: Call, result: Any) -> dict[str, Any]:
    r = call.instance
    pool = read(r, "token_to_kv_pool")
    return {
        "sglang.max_total_num_tokens": read(r, "max_total_num_tokens"),
        "sglang.kv_cache_dtype": str(read(r, "kv_cache_dtype")),
        "sglang.kv_pool": class_name(pool),
        "sglang.req_to_token_pool_size": read(read(r, "req_to_token_pool"), "size"),
    }


def _attention(call: Call, result: Any) -> dict[str, Any]:
    return {"sglang.attention_backend": class_name(read(call.instance, "attn_backend"))}


def _forward(call: Call) -> dict[str, Any]:
    """Which pass: the batch's forward mode (the enum's name) and size, host-side fields read
    as they are (no tensor touched, so no device sync); which runner (target or draft)."""
    batch = call.arg("forward_batch")
    mode, size = read(batch, "forward_mode"), read(batch, "batch_size")
    return {
        keys.FORWARD_MODE: mode.name.lower() if isinstance(getattr(mode, "name", None), str) else None,
        keys.BATCH_SIZE: size if type(size) is int else None,
        **draft_attrs(call.instance),
    }


PHASES = (
    Phase("model_runner.init", (f"{MR}:ModelRunner.__init__",), enter=_runner, required=True),
    Phase("model.load_weights", (f"{MR}:ModelRunner.load_model",), enter=_on_runner, exit=_loaded, required=True),
    Phase("model.loader", ("sglang.srt.model_loader.loader:DefaultModelLoader.load_model",), mode="all", enter=_loader),
    Phase(
        "model.weights_iterator",
        tuple(f"{WU}:{name}" for name in ITERATORS),
        mode="all",
        kind="generator",
        enter=_weights,
        each=_weight_item,
        exit=_weights_done,
    ),
    Phase("model.finalize_weight_load", ("sglang.srt.managers.tp_worker:TpModelWorker.finalize_startup_weight_load",)),
    Phase(
        "kv_cache.alloc",
        (f"{MR}:ModelRunner.alloc_memory_pool", f"{MR}:ModelRunner.init_memory_pool"),
        enter=_on_runner,
        exit=_kv,
        required=True,
    ),
    Phase(
        "attention.init",
        (f"{MR}:ModelRunner.init_attention_backends", f"{MR}:ModelRunner.init_attention_backend"),
        enter=_on_runner,
        exit=_attention,
        required=True,
    ),
    # The warm-up request's passes (``launch_server``): the start is not over until the launch serves.
    # Traced only then (``tracing.phases``: kind ``warmup``); off with the hot-path patches at serving.
    Phase(keys.PHASE_WARMUP, (f"{MR}:ModelRunner.forward",), kind="warmup", enter=_forward, init_only=True),
)
