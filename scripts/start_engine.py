"""Start a real ``sglang.Engine`` on CPU (optionally with an EAGLE draft), generate once, stop.

Tracing comes only from the environment (``PYTHONPATH=sitecustomize_hooks``), exactly as for an
unmodified SGLang launch; this script does not import sglang-phasetrace.

    python scripts/start_engine.py MODEL_DIR [--tp 2] [--dp 1] [--draft DRAFT_DIR] [--no-generate]
"""

from __future__ import annotations

import argparse
import os
import time

CPU_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--draft", help="EAGLE draft model directory")
    parser.add_argument("--no-generate", action="store_true")
    args = parser.parse_args()
    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)
    cores = os.cpu_count() or 1
    os.environ.setdefault("SGLANG_CPU_OMP_THREADS_BIND", "|".join(str(i % cores) for i in range(args.tp * args.dp)))

    import sglang

    kwargs = dict(
        model_path=args.model,
        device="cpu",
        tp_size=args.tp,
        dp_size=args.dp,
        max_total_tokens=4096,
        log_level=os.environ.get("SGLANG_LOG_LEVEL", "warning"),
    )
    if args.draft:
        kwargs.update(
            speculative_algorithm="EAGLE",
            speculative_draft_model_path=args.draft,
            speculative_num_steps=2,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=3,
        )
    tic = time.perf_counter()
    engine = sglang.Engine(**kwargs)
    print(f"engine ready in {time.perf_counter() - tic:.1f} s", flush=True)
    try:
        if not args.no_generate:
            out = engine.generate("Hello", {"max_new_tokens": 4, "temperature": 0})
            print(f"generated {out['meta_info']['completion_tokens']} tokens", flush=True)
    finally:
        tic = time.perf_counter()
        engine.shutdown()
        print(f"engine stopped in {time.perf_counter() - tic:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
