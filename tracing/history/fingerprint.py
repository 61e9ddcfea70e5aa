"""The launch fingerprint: what makes two starts comparable, read from a run directory.

Two starts are compared only when they launched the same thing the same way: a median of earlier
starts says "usually 41 s" only if those starts loaded the same weights onto the same devices with
the same graph and speculative settings. Each field is here because changing it changes how long a
phase takes (the ``FIELDS`` table says which and why); everything else (ports, log level, API
keys, host names) is left out, so restarting the same launch tomorrow, on another node of the same
kind, is the same fingerprint; so is the model's path once its ``config.json`` hash is known
(``identity``): another pod mounts the same weights elsewhere.

Read from the run alone, so whoever reads it (the launcher's watchdog from its first pass, the
launcher again as the start ends, ``phasetrace run``, ``status``, ``history --record`` on another
host) gets the same id: the server arguments and the model's config hash the launcher records as
it starts its ranks (``launch.subprocesses``: before any rank runs), else those of the launcher's
root or a rank's root (runs recorded before); the SGLang and torch versions and the GPU model from
the processes' resource attributes (the runtime stamps them), else from this host when the run ran
here. A fingerprint is ``settled`` once it is read from what will not change in the run (a reader
of a start in progress may keep it). Every free-form value (paths, strings of the server
arguments) goes through ``tracing.redact``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from .. import keys
from ..other_processes import this_host
from ..reader.view import ProcessRec, RunView
from ..redact import redact

SERVER_ARGS_ATTR = keys.SERVER_ARGS  # the redacted JSON ``patches/_attrs.server_args_json`` writes
TORCH_VERSION_ATTR = keys.TORCH_VERSION  # resource attributes the runtime stamps
DEVICE_MODEL_ATTR = keys.DEVICE_MODEL
CONFIG_MAX = 4 << 20  # bytes of a model's config.json hashed (a real one is a few KiB)

# Server arguments that change how long a start takes, by what they change. Names of every era
# (0.5.9's ``cuda_graph_max_bs``, 0.5.23's ``cuda_graph_max_bs_decode``…): a name the run's release
# does not have is simply absent, and a new release is a new fingerprint anyway (its version).
START_ARGS: dict[str, tuple[str, ...]] = {
    # which kernels are set up, warmed up and captured
    "attention": (
        "attention_backend",
        "prefill_attention_backend",
        "decode_attention_backend",
        "mm_attention_backend",
        "sampling_backend",
    ),
    # graph capture: one capture per batch size, the longest phase on many GPUs
    "graphs": (
        "disable_cuda_graph",
        "disable_cuda_graph_padding",
        "disable_decode_cuda_graph",
        "disable_prefill_cuda_graph",
        "cuda_graph_max_bs",
        "cuda_graph_bs",
        "cuda_graph_max_bs_decode",
        "cuda_graph_bs_decode",
        "cuda_graph_max_bs_prefill",
        "cuda_graph_bs_prefill",
        "cuda_graph_backend_decode",
        "cuda_graph_backend_prefill",
        "cuda_graph_config",
        "enable_piecewise_cuda_graph",
        "piecewise_cuda_graph_max_tokens",
        "piecewise_cuda_graph_tokens",
        "enable_torch_compile",
        "torch_compile_max_bs",
    ),
    # a draft model: its own weights, memory pools and graphs (EAGLE captures per step)
    "speculative": (
        "speculative_algorithm",
        "speculative_num_steps",
        "speculative_eagle_topk",
        "speculative_num_draft_tokens",
        "speculative_draft_load_format",
        "speculative_draft_attention_backend",
        "speculative_draft_model_quantization",
        "speculative_draft_model_revision",
    ),
    # how many bytes are read and converted, and how
    "weights": (
        "load_format",
        "quantization",
        "modelopt_quant",
        "dtype",
        "revision",
        "cpu_offload_gb",
        "weight_loader_disable_mmap",
        "enable_weights_cpu_backup",
    ),
    # memory pools: their size is allocated (and on some backends touched) at start
    "memory": (
        "mem_fraction_static",
        "max_total_tokens",
        "max_running_requests",
        "context_length",
        "chunked_prefill_size",
        "kv_cache_dtype",
    ),
    # parallel features that add groups, collectives and buffers
    "parallel": (
        "enable_dp_attention",
        "moe_a2a_backend",
        "moe_runner_backend",
        "deepep_mode",
        "enable_lora",
        "skip_server_warmup",
    ),
}


@dataclass(frozen=True)
class Fingerprint:
    """``fields``: canonical (sorted, JSON-able) data; ``id``: 12 hex digits of its SHA-256;
    ``settled``: read from what the run will not change (``of_run``)."""

    fields: dict[str, Any]
    id: str
    settled: bool = field(default=True, compare=False)

    @property
    def summary(self) -> str:
        """``tiny-llama (cfg 3f2a9c1b) · tp2 · cpu x2 · sglang 0.5.23 · torch 2.9.0 · EAGLE``: what a person
        recognises a launch by (the id tells apart what this leaves out)."""
        f = self.fields
        model, layout, dev, ver = f["model"], f["layout"], f["device"], f["versions"]
        name = Path(model["path"]).name if model.get("path") else "?"
        parts = [name + (f" (cfg {model['config'][:8]})" if model.get("config") else "")]
        sizes = [
            f"{k}{layout[k]}" for k in ("tp", "pp", "dp", "ep") if isinstance(layout.get(k), int) and layout[k] > 1
        ]
        if (layout.get("nnodes") or 1) > 1:
            sizes.append(f"{layout['nnodes']} nodes")
        parts.append(" ".join(sizes) or "tp1")
        parts.append(f"{dev.get('model') or dev.get('kind') or '?'} x{dev.get('count') or '?'}")
        parts.append(f"sglang {ver.get('sglang') or '?'}")
        parts.append(f"torch {ver.get('torch') or '?'}")
        args = f["args"]
        if args.get("speculative_algorithm"):
            parts.append(str(args["speculative_algorithm"]))
        if args.get("quantization"):
            parts.append(str(args["quantization"]))
        if args.get("disable_cuda_graph"):
            parts.append("no graphs")
        return " · ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "summary": self.summary, "fields": self.fields}


def canonical(fields: dict[str, Any]) -> str:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)


def make(fields: dict[str, Any], settled: bool = True) -> Fingerprint:
    return Fingerprint(fields, hashlib.sha256(canonical(identity(fields)).encode()).hexdigest()[:12], settled)


def identity(fields: dict[str, Any]) -> dict[str, Any]:
    """What the id is made of: ``fields`` less the model's (and draft's) path where its config hash
    is known. The same weights are mounted at ``/models/x`` on one pod and in a cache path on
    another: one launch, so a fresh pod finds the fleet's earlier starts. The path stays in the
    fields (the summary names the model by it); a model without a readable ``config.json`` is still
    told apart by its path alone."""
    out = dict(fields)
    for name in ("model", "draft"):
        model = out.get(name)
        if isinstance(model, dict) and model.get("config"):
            out[name] = {k: v for k, v in model.items() if k != "path"}
    return out


def of_run(run: RunView) -> Fingerprint | None:
    """The run's fingerprint; None when nothing in it says what was launched (no launcher span or
    rank root carried the server arguments: a start that failed before SGLang parsed them)."""
    procs = run.processes
    found = _launch_attrs(procs)
    if found is None:
        return None
    attrs, settled = found
    args = server_args(attrs.get(SERVER_ARGS_ATTR))
    model_path = args.get("model_path", attrs.get("sglang.model_path"))
    layout = {
        "tp": _int(args.get("tp_size", attrs.get("sglang.tp_size"))),
        "pp": _int(args.get("pp_size", attrs.get("sglang.pp_size"))),
        "dp": _int(args.get("dp_size", attrs.get("sglang.dp_size"))),
        "ep": _int(args.get("ep_size", attrs.get("sglang.ep_size"))),
        "nnodes": _int(args.get("nnodes", attrs.get(keys.NNODES))) or 1,
    }
    chosen: dict[str, Any] = {}
    for names in START_ARGS.values():
        for name in names:
            if name in args:
                chosen[name] = redact(args[name], name)
    draft = args.get("speculative_draft_model_path")
    resource = _resource(procs)
    here = any(p.host == this_host() for p in procs)
    sglang = resource.get(keys.SGLANG_VERSION)
    kind = args.get("device") if isinstance(args.get("device"), str) else None
    hashed = keys.MODEL_CONFIG in attrs or keys.DRAFT_MODEL_CONFIG in attrs or attrs.get(keys.PHASE) == LAUNCHED
    on_cpu = kind == "cpu"
    fields = {
        "model": _model(model_path, attrs.get(keys.MODEL_CONFIG) if hashed else _config_hash),
        "draft": _model(draft, attrs.get(keys.DRAFT_MODEL_CONFIG) if hashed else _config_hash) if draft else None,
        "layout": layout,
        "versions": {
            "sglang": sglang,
            "torch": resource.get(TORCH_VERSION_ATTR) or (_torch_here(sglang) if here else None),
        },
        "device": {
            "kind": kind or "auto",
            "model": None if on_cpu else resource.get(DEVICE_MODEL_ATTR) or (_gpu_model_here(args) if here else None),
            "count": _devices(layout, args),
        },
        "args": chosen,
    }
    return make(fields, settled)


LAUNCHED = "launch.subprocesses"  # the launcher's phase whose start carries the server arguments


def _launch_attrs(procs: list[ProcessRec]) -> tuple[dict[str, Any], bool] | None:
    """The attributes that say what was launched, and whether they are settled: the server
    arguments the launcher recorded as it started its ranks (settled); else, for a run without
    them, its root's (an Engine's has them once it ended: settled then; a server's from its start),
    else a rank root's (settled where the run has no launcher)."""
    launchers = [p for p in procs if p.role == "launcher"]
    for proc in launchers:
        for span in proc.spans.values():
            if span.attrs.get(keys.PHASE) == LAUNCHED and SERVER_ARGS_ATTR in span.attrs:
                return span.attrs, True
    best = None
    for proc in sorted(procs, key=lambda p: p.role != "launcher"):
        for span in proc.spans.values():
            if span.attrs.get(keys.PHASE) in keys.ROOT_PHASES:
                a = span.attrs
                if SERVER_ARGS_ATTR in a:
                    return a, not launchers or (proc.role == "launcher" and span.end is not None)
                if best is None and ("sglang.tp_size" in a or "sglang.model_path" in a):
                    best = a
                break
    return None if best is None else (best, False)


def server_args(text: Any) -> dict[str, Any]:
    """The server arguments' JSON. ``server_args_json`` cuts it at 32 KiB (a release with a very long
    argument list): then each argument we use is read from the text where it is whole."""
    if not isinstance(text, str):
        return {}
    try:
        data = json.loads(text)
        return data if isinstance(data, dict) else {}
    except ValueError:
        pass
    out: dict[str, Any] = {}
    decoder = json.JSONDecoder()
    wanted = ["model_path", "tp_size", "pp_size", "dp_size", "ep_size", "nnodes", "device", "base_gpu_id"]
    wanted += [name for names in START_ARGS.values() for name in names] + ["speculative_draft_model_path"]
    for name in wanted:
        at = text.find(f'"{name}": ')
        if at < 0:
            continue
        try:
            out[name] = decoder.raw_decode(text, at + len(name) + 4)[0]
        except ValueError:  # cut inside this value
            continue
    return out


def _model(path: Any, config: Any) -> dict[str, Any]:
    """The model's path (redacted) and a hash of its ``config.json`` (the same path holding another
    checkpoint is another launch): ``config`` as the launcher recorded it, or a function that hashes
    it here (a run that did not record it)."""
    if not isinstance(path, str) or not path:
        return {"path": None, "config": None}
    if callable(config):
        config = config(path)
    return {"path": redact(path, "model_path"), "config": config if isinstance(config, str) else None}


@lru_cache(maxsize=64)
def _config_hash(path: str) -> str | None:
    try:
        with open(os.path.join(path, "config.json"), "rb") as f:  # an HF snapshot's is a link: followed
            data = f.read(CONFIG_MAX + 1)
    except (OSError, ValueError):
        return None
    return None if len(data) > CONFIG_MAX else hashlib.sha256(data).hexdigest()[:16]


def _resource(procs: list[ProcessRec]) -> dict[str, Any]:
    """Resource attributes of the launch's processes, the launcher's first."""
    out: dict[str, Any] = {}
    for proc in sorted(procs, key=lambda p: p.role != "launcher"):
        for k, v in proc.resource.items():
            out.setdefault(k, v)
    return out


def _devices(layout: dict[str, Any], args: dict[str, Any]) -> int | None:
    """Devices the launch uses: tp x pp, times dp unless DP attention runs inside the TP group."""
    tp, pp, dp = layout["tp"] or 1, layout["pp"] or 1, layout["dp"] or 1
    return tp * pp * (1 if args.get("enable_dp_attention") else dp)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@lru_cache(maxsize=8)
def _torch_here(sglang: str | None) -> str | None:
    """The installed torch's version, when the installed SGLang is the run's (the same environment,
    as far as a reader can tell); read from the package metadata, torch is not imported."""
    from importlib import metadata

    try:
        return metadata.version("torch") if sglang and metadata.version("sglang") == sglang else None
    except metadata.PackageNotFoundError:
        return None


def _gpu_model_here(args: dict[str, Any]) -> str | None:
    """The name of the launch's first GPU (``base_gpu_id``), as the runtime reads it, else through
    NVML; None without a driver."""
    from ..recorder import gpu

    base = args.get("base_gpu_id")
    named = gpu.device_model(base if isinstance(base, int) else 0)
    if named:
        return named
    nvml = gpu._nvml()
    if nvml is None:
        return None
    try:
        base = args.get("base_gpu_id")
        handle = nvml.nvmlDeviceGetHandleByIndex(gpu.physical_index(base if isinstance(base, int) else 0))
        name = nvml.nvmlDeviceGetName(handle)
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return None
