"""Small, defensive readers shared by the phase tables (never raise, never touch tensor data)."""

from __future__ import annotations

import json
import sys
from typing import Any

from ..tracing import keys
from ..tracing.redact import redact


def read(obj: Any, *names: str) -> Any:
    """First attribute of ``obj`` that exists and reads without error, else None."""
    for name in names:
        try:
            value = getattr(obj, name)
        except Exception:
            continue
        if value is not None:
            return value
    return None


def class_name(obj: Any) -> str | None:
    return None if obj is None else type(obj).__name__


def draft_attrs(runner: Any) -> dict[str, Any]:
    """Target or draft runner, and which draft (multi-layer EAGLE builds several)."""
    return {
        keys.IS_DRAFT: bool(read(runner, "is_draft_worker")),
        "sglang.draft_model_idx": read(runner, "draft_model_idx"),
    }


def tensor_attrs(prefix: str, tensor: Any) -> dict[str, Any]:
    """Shape, dtype, bytes and device: metadata only, so no host sync (safe inside a capture)."""
    if tensor is None or not hasattr(tensor, "shape"):
        return {}
    return {
        f"{prefix}.shape": [int(s) for s in tensor.shape],
        f"{prefix}.dtype": str(tensor.dtype),
        f"{prefix}.bytes": int(tensor.numel()) * int(tensor.element_size()),
        f"{prefix}.device": str(tensor.device),
    }


def server_args_json(server_args: Any, limit: int = 32768) -> str | None:
    """Server args as redacted JSON (msgspec struct, dataclass or plain object), capped in size."""
    if server_args is None:
        return None
    data: Any = None
    msgspec = sys.modules.get("msgspec")
    if msgspec is not None and isinstance(server_args, msgspec.Struct):
        data = msgspec.to_builtins(server_args, enc_hook=str)
    elif hasattr(server_args, "__dataclass_fields__"):
        data = {name: getattr(server_args, name, None) for name in server_args.__dataclass_fields__}
    else:
        data = dict(vars(server_args))
    text = json.dumps(redact(data), default=str, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + "…"


def server_args_attrs(server_args: Any) -> dict[str, Any]:
    if server_args is None:
        return {}
    nnodes = read(server_args, "nnodes")
    multi_node = (
        {
            keys.NNODES: nnodes,
            keys.NODE_RANK: read(server_args, "node_rank") or 0,
            keys.DIST_INIT_ADDR: read(server_args, "dist_init_addr"),
        }
        if isinstance(nnodes, int) and nnodes > 1
        else {}
    )
    return {
        **multi_node,
        "sglang.model_path": read(server_args, "model_path"),
        "sglang.tp_size": read(server_args, "tp_size"),
        "sglang.pp_size": read(server_args, "pp_size"),
        "sglang.dp_size": read(server_args, "dp_size"),
        "sglang.ep_size": read(server_args, "ep_size"),
        "sglang.speculative_algorithm": read(server_args, "speculative_algorithm"),
        keys.TOKENIZER_WORKERS: read(server_args, "tokenizer_worker_num"),
        "sglang.server_args": server_args_json(server_args),
    }
