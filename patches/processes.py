"""The launch's processes that are neither ranks nor the launcher (detokenizer, tokenizer workers,
DP controller), and the launcher's own managers: their init steps, and the moment each helper
enters its loop (its start is done: a ``loop`` phase). A helper's root ``process`` starts when it
is spawned (``tracing.bootstrap``), so a helper stopped before its first phase is still watched.

The tokenizer manager is the launcher's in a single-tokenizer launch (an ``Engine``, or
``launch_server``), and a tokenizer worker's base class with ``--tokenizer-worker-num`` > 1: its
init is where a tokenizer is fetched (a dead proxy stops a start there).
"""

from __future__ import annotations

from .spec import Phase

MANAGERS = "sglang.srt.managers"
DETOKENIZER = f"{MANAGERS}.detokenizer_manager:DetokenizerManager"
DP = f"{MANAGERS}.data_parallel_controller:DataParallelController"

PHASES = (
    Phase("tokenizer_manager.init", (f"{MANAGERS}.tokenizer_manager:TokenizerManager.__init__",)),
    Phase(
        "template_manager.init",
        (
            "sglang.srt.parser.template_manager:TemplateManager.initialize_templates",
            f"{MANAGERS}.template_manager:TemplateManager.initialize_templates",
        ),
    ),
    # a worker registers with the launcher's router at the end of its init
    Phase("tokenizer_worker.init", (f"{MANAGERS}.multi_tokenizer_mixin:TokenizerWorker.__init__",)),
    Phase("tokenizer_worker.loop", (f"{MANAGERS}.tokenizer_manager:TokenizerManager.set_startup_time",), kind="loop"),
    Phase("detokenizer.init", (f"{DETOKENIZER}.__init__",)),
    Phase(
        "detokenizer.loop",
        (
            f"{DETOKENIZER}.event_loop",
            f"{MANAGERS}.multi_tokenizer_mixin:MultiHttpWorkerDetokenizerMixin.multi_http_worker_event_loop",
        ),
        mode="all",
        kind="loop",
    ),
    Phase("dp_controller.init", (f"{DP}.__init__",)),
    Phase("dp_controller.loop", (f"{DP}.event_loop",), kind="loop"),
)
