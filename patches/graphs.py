"""Graph init and capture: per runner, and per captured batch size / shape.

Hooks here read only Python ints and class names: nothing that syncs the device, since they run
inside a CUDA graph capture.
"""

from __future__ import annotations

from typing import Any

from ..tracing import keys
from ._attrs import class_name, draft_attrs, read
from .spec import Call, Phase, Report

MR = "sglang.srt.model_executor.model_runner"
ME = "sglang.srt.model_executor"


def _graphs(call: Call) -> dict[str, Any]:
    return draft_attrs(call.instance)


def _graphs_done(call: Call, result: Any) -> dict[str, Any]:
    times = read(call.instance, "graph_time_usage")
    mem = read(call.instance, "graph_memory_usage")
    runner = read(call.instance, "decode_cuda_graph_runner", "cuda_graph_runner")
    attrs = {"sglang.decode_graph_runner": class_name(runner)}
    for prefix, values in (("sglang.graph_time_s", times), ("sglang.graph_mem_gb", mem)):
        if isinstance(values, dict):
            attrs.update({f"{prefix}.{k}": v for k, v in values.items() if isinstance(v, (int, float))})
    return attrs


def _capture(call: Call) -> dict[str, Any]:
    runner = call.instance
    shapes = read(runner, "capture_bs") or []
    return {
        "sglang.runner_class": class_name(runner),
        keys.CAPTURE_SHAPES: len(shapes),
        "sglang.capture_bs": [int(s) for s in shapes][:256],
        keys.IS_DRAFT: bool(read(read(runner, "model_runner"), "is_draft_worker")),
    }


def _shape(call: Call) -> Report:
    size = call.arg("size", call.arg("bs", call.arg("num_tokens")))
    shapes = list(read(call.instance, "capture_bs") or [])
    known = size in shapes
    return Report(  # progress: heartbeats show "shapes captured k/N"
        attrs={
            "sglang.runner_class": class_name(call.instance),
            "sglang.batch_size": size,
            keys.SHAPE_INDEX: shapes.index(size) + 1 if known else None,
            keys.CAPTURE_SHAPES: len(shapes) or None,
            "sglang.variant": call.arg("variant_label"),
        },
        progress={"done": shapes.index(size), "total": len(shapes), "unit": "shapes"} if known else None,
    )


def _runner_ctor(call: Call) -> dict[str, Any]:
    return {"sglang.runner_class": class_name(call.instance)}


PHASES = (
    Phase(
        "graph.init",
        (f"{MR}:ModelRunner.init_device_graphs", f"{MR}:ModelRunner.init_cuda_graphs"),
        enter=_graphs,
        exit=_graphs_done,
        required=True,
    ),
    Phase(
        "graph.capture",
        (
            f"{ME}.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner.capture",
            f"{ME}.runner.prefill_cuda_graph_runner:PrefillCudaGraphRunner.capture",
            f"{ME}.cuda_graph_runner:CudaGraphRunner.capture",
            f"{ME}.cpu_graph_runner:CPUGraphRunner.capture",
        ),
        mode="all",
        enter=_capture,
    ),
    Phase(
        "graph.capture_shape",
        (
            f"{ME}.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner.capture_one_shape",
            f"{ME}.cuda_graph_runner:CudaGraphRunner.capture_one_batch_size",
            f"{ME}.cpu_graph_runner:CPUGraphRunner.capture_one_batch_size",
        ),
        mode="all",
        enter=_shape,
    ),
    Phase(
        "graph.runner_init",
        (  # buffers, and for piecewise/breakable runners the capture itself
            f"{ME}.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner.__init__",
            f"{ME}.runner.prefill_cuda_graph_runner:PrefillCudaGraphRunner.__init__",
            f"{ME}.cuda_graph_runner:CudaGraphRunner.__init__",
            f"{ME}.piecewise_cuda_graph_runner:PiecewiseCudaGraphRunner.__init__",
            f"{ME}.breakable_cuda_graph_runner:BreakableCudaGraphRunner.__init__",
            f"{ME}.cpu_graph_runner:CPUGraphRunner.__init__",
        ),
        mode="all",
        enter=_runner_ctor,
    ),
    Phase(
        "graph.warmup", (f"{ME}.runner.base_runner:BaseRunner.warmup", f"{MR}:ModelRunner.kernel_warmup"), mode="all"
    ),
)
