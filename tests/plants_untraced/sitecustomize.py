"""Test plant for an UNTRACED launch (tests/test_inspect*.py): alone on PYTHONPATH, it loads nothing
of sglang-phasetrace. Nothing happens unless ``INSPECT_PLANT_RANK`` is set.

Inside the real ``ModelRunner.load_model`` (phase ``model.load_weights``), at its call of
``load_model_with_memory_saver``, every TP rank meets the others in the TP group's barrier; the rank
named by ``INSPECT_PLANT_RANK`` first holds the GIL in C (a backtracking regular expression: ``re``
never releases the GIL) until the file ``INSPECT_PLANT_GO`` exists, then waits for an exclusive
``flock`` on ``INSPECT_PLANT_LOCK`` (which the test holds from another process), then joins the
barrier. Released, the launch goes on and serves.
"""

import os

if os.environ.get("INSPECT_PLANT_RANK"):
    import functools

    import wrapt

    @wrapt.when_imported("sglang.srt.model_executor.model_runner")
    def _plant(module):
        original = module.load_model_with_memory_saver

        @functools.wraps(original)
        def load_model_with_memory_saver(*args, **kwargs):
            from sglang.srt.distributed.parallel_state import get_tp_group

            group = get_tp_group()
            if group.rank_in_group == int(os.environ["INSPECT_PLANT_RANK"]):
                import fcntl
                import re
                import time

                deadline = time.monotonic() + 600  # bounded; the test kills the process group long before
                while not os.path.exists(os.environ["INSPECT_PLANT_GO"]) and time.monotonic() < deadline:
                    re.fullmatch(r"(a+)+$", "a" * 24 + "b")  # seconds in C, the GIL held throughout
                with open(os.environ["INSPECT_PLANT_LOCK"], "a") as f:
                    fcntl.flock(f, fcntl.LOCK_EX)
                    fcntl.flock(f, fcntl.LOCK_UN)
            group.barrier()
            return original(*args, **kwargs)

        module.load_model_with_memory_saver = load_model_with_memory_saver
