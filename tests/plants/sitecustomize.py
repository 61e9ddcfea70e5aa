"""Test plant, chained after sglang-phasetrace's sitecustomize (later on PYTHONPATH).

Makes ``LlamaForCausalLM.get_embed_and_head`` end with a TP barrier, as PP/TP-aware embed/head
resolvers do, and blocks the rank named by ``PLANT_STALL_TP_RANK`` before it: that rank stalls
inside ``eagle.get_embed_and_head`` while its peer waits in the barrier — the shape of the
real 8-hour draft-init deadlock. Nothing happens unless ``PLANT_STALL_TP_RANK`` is set.
"""

import os

if os.environ.get("PLANT_STALL_TP_RANK"):
    import functools
    import time

    import wrapt

    @wrapt.when_imported("sglang.srt.models.llama")
    def _plant(module):
        original = module.LlamaForCausalLM.get_embed_and_head

        @functools.wraps(original)
        def get_embed_and_head(self):
            from sglang.srt.distributed.parallel_state import get_tp_group

            result = original(self)
            group = get_tp_group()
            if group.rank_in_group == int(os.environ["PLANT_STALL_TP_RANK"]):
                time.sleep(600)  # bounded; the test kills the process group long before
            group.barrier()
            return result

        module.LlamaForCausalLM.get_embed_and_head = get_embed_and_head


if os.environ.get("PLANT_KILL_TP_RANK"):
    import functools
    import signal
    import time

    import wrapt

    @wrapt.when_imported("sglang.srt.model_loader.loader")
    def _plant_kill(module):
        """The rank named by ``PLANT_KILL_TP_RANK`` is SIGKILLed inside weight loading, as the
        OOM killer ends a rank that reads a big checkpoint."""
        original = module.DefaultModelLoader.load_model

        @functools.wraps(original)
        def load_model(self, *args, **kwargs):
            from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_rank

            if get_tensor_model_parallel_rank() == int(os.environ["PLANT_KILL_TP_RANK"]):
                time.sleep(float(os.environ.get("PLANT_KILL_AFTER_S", "1")))
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, *args, **kwargs)

        module.DefaultModelLoader.load_model = load_model


if os.environ.get("PLANT_HANG_EARLY_TP_RANK"):
    import functools
    import time

    import wrapt

    @wrapt.when_imported("sglang.srt.managers.scheduler")
    def _plant_hang_early(module):
        """The rank named by ``PLANT_HANG_EARLY_TP_RANK`` hangs at the top of its process, before its
        first phase (where plugin loading or NUMA binding hang in real launches)."""
        original = module.run_scheduler_process

        @functools.wraps(original)
        def run_scheduler_process(*args, **kwargs):
            import inspect

            bound = inspect.signature(original).bind_partial(*args, **kwargs).arguments
            if bound.get("tp_rank") == int(os.environ["PLANT_HANG_EARLY_TP_RANK"]):
                time.sleep(600)  # bounded; the test kills the process group long before
            return original(*args, **kwargs)

        module.run_scheduler_process = run_scheduler_process


if os.environ.get("PLANT_STALL_PHASE_TP_RANK"):
    import functools
    import time

    import wrapt

    @wrapt.when_imported("sglang.srt.model_executor.model_runner")
    def _plant_stall_attention(module):
        """The rank named by ``PLANT_STALL_PHASE_TP_RANK`` sleeps inside ``init_attention_backends``
        (``attention.init``) while its peers wait in a TP barrier right after it: a stall in a
        phase every launch has, without EAGLE."""
        original = module.ModelRunner.init_attention_backends

        @functools.wraps(original)
        def init_attention_backends(self, *args, **kwargs):
            from sglang.srt.distributed.parallel_state import get_tp_group

            result = original(self, *args, **kwargs)
            group = get_tp_group()
            if group.rank_in_group == int(os.environ["PLANT_STALL_PHASE_TP_RANK"]):
                time.sleep(600)  # bounded; the pre-flight stops the process group long before
            group.barrier()
            return result

        module.ModelRunner.init_attention_backends = init_attention_backends


if os.environ.get("PLANT_MODULES_OUT"):
    import functools
    import sys

    import wrapt

    @wrapt.when_imported("sglang.srt.managers.scheduler")
    def _plant_modules(module):
        """Each rank writes the modules it has imported, one per line, to
        ``$PLANT_MODULES_OUT/<pid>.txt`` once its ``Scheduler.__init__`` returned (rank ready)."""
        original = module.Scheduler.__init__

        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            path = os.path.join(os.environ["PLANT_MODULES_OUT"], f"{os.getpid()}.txt")
            with open(path, "w") as f:
                f.write("\n".join(sorted(sys.modules)))

        module.Scheduler.__init__ = __init__


if os.environ.get("PLANT_BUSY_LOAD_S"):
    import functools
    import time

    import wrapt

    @wrapt.when_imported("sglang.srt.model_loader.loader")
    def _plant_busy_load(module):
        """Every rank computes for ``PLANT_BUSY_LOAD_S`` seconds inside weight loading before the real
        load: a start that is slow and busy (a big checkpoint on a slow disk, a slow dequantisation),
        never stuck."""
        original = module.DefaultModelLoader.load_model

        @functools.wraps(original)
        def load_model(self, *args, **kwargs):
            until = time.monotonic() + float(os.environ["PLANT_BUSY_LOAD_S"])
            while time.monotonic() < until:
                sum(i * i for i in range(10_000))
            return original(self, *args, **kwargs)

        module.DefaultModelLoader.load_model = load_model
