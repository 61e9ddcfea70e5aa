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
