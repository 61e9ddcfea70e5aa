"""EAGLE-family draft init: workers, draft model, embed/head sharing, lm head, draft graphs.

``get_embed_and_head`` / ``set_embed_and_head`` are methods of whatever model classes are loaded
(``LlamaForCausalLM``, ``LlamaForCausalLMEagle3``, …), so they are ``"*:attr"`` targets, wrapped
on the class of each model right after it is loaded (``model.load_weights``).
"""

from __future__ import annotations

from typing import Any

from ..tracing import keys
from ._attrs import class_name, read, tensor_attrs
from .spec import Call, Phase

SP = "sglang.srt.speculative"


def _worker(call: Call) -> dict[str, Any]:
    a = call.arguments
    server_args = a.get("server_args")
    return {
        "sglang.worker_class": class_name(call.instance),
        "sglang.draft_model_path": read(server_args, "speculative_draft_model_path"),
        "sglang.speculative_algorithm": str(read(server_args, "speculative_algorithm")),
        "sglang.speculative_num_steps": read(server_args, "speculative_num_steps"),
    }


def _model(call: Call) -> dict[str, Any]:
    return {"sglang.model_class": class_name(call.instance)}


def _got_embed_head(call: Call, result: Any) -> dict[str, Any]:
    embed, head = result if isinstance(result, tuple) and len(result) == 2 else (None, None)
    return {**tensor_attrs("sglang.embed", embed), **tensor_attrs("sglang.head", head)}


def _set_embed_head(call: Call) -> dict[str, Any]:
    return {
        "sglang.model_class": class_name(call.instance),
        **tensor_attrs("sglang.embed", call.arg("embed")),
        **tensor_attrs("sglang.head", call.arg("head")),
    }


def _draft_graph_runner(call: Call) -> dict[str, Any]:
    return {"sglang.runner_class": class_name(call.instance), keys.IS_DRAFT: True}


PHASES = (
    Phase("scheduler.init_draft_worker", ("sglang.srt.managers.scheduler:Scheduler.maybe_init_draft_worker",)),
    Phase(
        "eagle.worker_init",
        (
            f"{SP}.eagle_worker_v2:EAGLEWorkerV2.__init__",
            f"{SP}.eagle_worker:EAGLEWorker.__init__",
            f"{SP}.multi_layer_eagle_worker_v2:MultiLayerEagleWorkerV2.__init__",
            f"{SP}.multi_layer_eagle_worker:MultiLayerEagleWorker.__init__",
        ),
        mode="all",
        enter=_worker,
    ),
    Phase(
        "eagle.draft_worker_init",
        (
            f"{SP}.eagle_worker_v2:EagleDraftWorker.__init__",
            f"{SP}.multi_layer_eagle_worker_v2:MultiLayerEagleDraftWorker.__init__",
        ),
        mode="all",
        enter=_worker,
    ),
    Phase(
        "eagle.draft_alloc_memory_pool",
        (
            f"{SP}.eagle_worker_v2:EagleDraftWorker.alloc_memory_pool",
            f"{SP}.multi_layer_eagle_worker_v2:MultiLayerEagleDraftWorker.alloc_memory_pool",
        ),
        mode="all",
    ),
    Phase(
        "eagle.init_lm_head",
        (
            f"{SP}.eagle_worker_v2:EagleDraftWorker.init_lm_head",
            f"{SP}.multi_layer_eagle_worker_v2:MultiLayerEagleDraftWorker.init_lm_head",
        ),
        mode="all",
    ),
    Phase(
        "eagle.draft_attention_init",
        (
            f"{SP}.eagle_worker_v2:EagleDraftWorker.init_attention_backend",
            f"{SP}.eagle_worker:EAGLEWorker.init_attention_backend",
        ),
        mode="all",
    ),
    Phase(
        "eagle.draft_graphs",
        (
            f"{SP}.eagle_worker_v2:EagleDraftWorker.init_cuda_graphs",
            f"{SP}.eagle_worker:EAGLEWorker.init_cuda_graphs",
        ),
        mode="all",
    ),
    Phase(
        "eagle.draft_graph_runner",
        (
            f"{SP}.eagle_draft_cuda_graph_runner:EAGLEDraftCudaGraphRunner.__init__",
            f"{SP}.eagle_draft_extend_cuda_graph_runner:EAGLEDraftExtendCudaGraphRunner.__init__",
        ),
        mode="all",
        enter=_draft_graph_runner,
    ),
)

# Wrapped on the loaded model classes (see ``patch_model_class``), not at import. Checked before a
# run (``phasetrace doctor``, scripts/coverage.py) on MODEL_CLASSES: the EAGLE target and its drafts.
MODEL_CLASSES = (
    "sglang.srt.models.llama:LlamaForCausalLM",
    "sglang.srt.models.llama_eagle:LlamaForCausalLMEagle",
    "sglang.srt.models.llama_eagle3:LlamaForCausalLMEagle3",
)
MODEL_PHASES = (
    Phase(
        "eagle.get_embed_and_head",
        ("*:get_embed_and_head", "*:get_embed_and_head_for_draft"),
        mode="all",
        enter=_model,
        exit=_got_embed_head,
    ),
    Phase("eagle.set_embed_and_head", ("*:set_embed_and_head",), mode="all", enter=_set_embed_head),
    Phase("eagle.set_embed", ("*:set_embed",), mode="all", enter=_set_embed_head),
)
