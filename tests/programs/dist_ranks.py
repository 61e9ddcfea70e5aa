"""Real SGLang distributed init on gloo across N spawned ranks, with an optional planted stall.

Each rank does what an SGLang scheduler does in 0.5.21+: publish its placement, then
``distributed.bootstrap.init_parallel_runtime`` (process group, model-parallel groups, DP
attention). The plant sits in rank ``--rank`` just before ``initialize_model_parallel`` runs
(wrapped by this program after SGLang is imported, so outside our phase of that name):

  none      no plant: all ranks finish
  sleep     the rank blocks (time.sleep) — a straggler its peers wait for
  gil       the rank holds the GIL in C (ctypes.PyDLL libc sleep) — its Python threads stop
  slow      the rank first reads the model's weights through SGLang's real safetensors iterator,
            slowly but steadily (progress), then goes on

With ``$DIST_RANKS_PLANTED`` set, the planted rank creates that file as it blocks.

    python dist_ranks.py MODEL_DIR --world 4 --plant sleep --rank 2 --port 29500
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import functools
import glob
import multiprocessing as mp
import os
import time

STALL_S = 600  # bounded: the test kills the process group long before
PLANTED_ENV = "DIST_RANKS_PLANTED"  # a file made as the planted rank blocks


def _plant(kind: str, model: str) -> None:
    import wrapt

    def block() -> None:
        if os.environ.get(PLANTED_ENV):  # a test waits for this: the plant is in place
            open(os.environ[PLANTED_ENV], "w").close()
        if kind == "sleep":
            time.sleep(STALL_S)
        elif kind == "gil":
            libc = ctypes.PyDLL(ctypes.util.find_library("c"))  # PyDLL: the GIL stays held
            deadline = time.monotonic() + STALL_S
            while time.monotonic() < deadline:
                libc.sleep(STALL_S)
        elif kind == "slow":
            from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator

            for _name, _tensor in safetensors_weights_iterator(sorted(glob.glob(f"{model}/*.safetensors"))):
                time.sleep(0.4)

    @wrapt.when_imported("sglang.srt.distributed.parallel_state")
    def _wrap(module) -> None:
        original = module.initialize_model_parallel

        @functools.wraps(original)
        def planted(*args, **kwargs):
            block()
            return original(*args, **kwargs)

        module.initialize_model_parallel = planted


def rank_main(rank: int, args: argparse.Namespace) -> None:
    import sglang  # noqa: F401  (first: the hook activates here, as in a real rank)

    if args.plant != "none" and rank == args.rank:
        _plant(args.plant, args.model)
    from sglang.srt.distributed import bootstrap
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(model_path=args.model, device="cpu", tp_size=args.world)
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=rank, gpu_id=rank))
    bootstrap.init_parallel_runtime(server_args=server_args, device="cpu", dist_port=args.port)
    print(f"rank {rank} initialised", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--plant", choices=("none", "sleep", "gil", "slow"), default="none")
    parser.add_argument("--rank", type=int, default=2)
    parser.add_argument("--port", type=int, default=29500)
    args = parser.parse_args()
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    os.environ["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(str(i % (os.cpu_count() or 1)) for i in range(args.world))
    mp.set_start_method("spawn")
    procs = [mp.Process(target=rank_main, args=(r, args), name=f"rank{r}") for r in range(args.world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    codes = [p.exitcode for p in procs]
    print(f"exit codes {codes}", flush=True)
    return 0 if codes == [0] * len(codes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
