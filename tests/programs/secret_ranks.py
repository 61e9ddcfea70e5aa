"""A real SGLang start whose ranks fail with secrets in the exception and in the server args.

The texts (a JSON list, file named by ``$SECRET_RANKS_CORPUS``) go into the exception every rank
raises inside a traced phase (``dist.init``: planted in front of SGLang's own
``initialize_model_parallel``), chained to a second exception holding the rest of them, and into
the reason of a stack dump the rank asks for itself. Server args carry secrets too.

  dist    ranks spawned here run SGLang's ``init_parallel_runtime`` on gloo (fast; no server args
          reach the journal: no rank root)
  engine  ``sglang.Engine(tp_size=2, device="cpu", api_key=…, …)``: the launch root and each rank
          root record the (redacted) server args; its scheduler ranks fail the same way

    SECRET_RANKS_CORPUS=texts.json python secret_ranks.py MODEL_DIR --mode engine --secret S --port P
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import os


def _texts() -> list[str]:
    with open(os.environ["SECRET_RANKS_CORPUS"]) as f:
        return json.load(f)


def _dump_own_stacks(reason: str) -> None:
    """The rank asks for its own stack dump (the header carries ``reason``); best effort."""
    try:
        from sglang_phasetrace.tracing import other_processes as procs
        from sglang_phasetrace.tracing.recorder import runtime
        from sglang_phasetrace.tracing.verdicts import stack_requests

        rt = runtime.current()
        if rt.journal is not None:
            pid = os.getpid()
            me = procs.pin(pid, procs.this_host(), procs.start_ticks(pid), procs.boot_id(), rt.journal.path)
            if me is None:
                raise RuntimeError("this rank is not proven ours by its own journal")
            with me:
                stack_requests.request(me, rt.run_dir, rt.journal.path.stem, reason, wait_s=1.0)
    except Exception as exc:  # the dump is a bonus; the failure below is the test
        print(f"no stack dump: {exc!r}", flush=True)


def _plant() -> None:
    """Make SGLang's ``initialize_model_parallel`` raise the corpus (in every process that runs it)."""
    import wrapt

    @wrapt.when_imported("sglang.srt.distributed.parallel_state")
    def _wrap(module) -> None:
        original = module.initialize_model_parallel

        @functools.wraps(original)
        def planted(*args, **kwargs):
            texts = _texts()
            half = len(texts) // 2
            _dump_own_stacks(texts[0])
            try:
                raise ValueError("inner: " + "\n".join(texts[half:]))
            except ValueError as inner:
                raise RuntimeError("could not initialise: " + "\n".join(texts[:half])) from inner

        module.initialize_model_parallel = planted


if os.environ.get("SECRET_RANKS_CORPUS"):  # module level: spawned children (``__mp_main__``) run it too
    _plant()


def server_args_kwargs(secret: str) -> dict:
    return {
        # (not ssl_keyfile_password: SGLang refuses it without a certificate)
        "api_key": f"sk-apikey{secret}",
        "admin_api_key": f"admin{secret}",
        "watermark_key": f"wm{secret}",
        "watermark_key_b": f"wmb{secret}",
        "model_loader_extra_config": json.dumps(
            {
                "hf_token": f"hf_loader{secret}",
                "num_threads": 2,
                "endpoint": f"https://bob:pw{secret}@mirror.example.com/m",
            }
        ),
        "json_model_override_args": json.dumps({"rope_theta": 10000, "extra": {"auth_token": f"override{secret}"}}),
    }


def rank_main(rank: int, args: argparse.Namespace) -> None:
    import sglang  # noqa: F401  (first: the hook activates here, as in a real rank)
    from sglang.srt.distributed import bootstrap
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(model_path=args.model, device="cpu", tp_size=args.world)
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=rank, gpu_id=rank))
    bootstrap.init_parallel_runtime(server_args=server_args, device="cpu", dist_port=args.port)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--mode", choices=("dist", "engine"), default="dist")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--port", type=int, default=29500)
    parser.add_argument("--secret", default="-s3cr3t-argument-value")
    args = parser.parse_args()
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    os.environ["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(str(i % (os.cpu_count() or 1)) for i in range(args.world))
    if args.mode == "engine":
        import sglang

        try:
            sglang.Engine(
                model_path=args.model,
                device="cpu",
                tp_size=args.world,
                max_total_tokens=4096,
                port=args.port,
                log_level="error",
                **server_args_kwargs(args.secret),
            )
        except BaseException as exc:  # SGLang's own failure report, as a user would see it
            print(f"engine failed: {type(exc).__name__}", flush=True)
            return 1
        return 0
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
