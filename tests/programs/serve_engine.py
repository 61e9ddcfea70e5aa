"""A real ``sglang.Engine`` on CPU that serves commands read from stdin, one per line.

Tracing comes only from the environment (``PYTHONPATH=sitecustomize_hooks``), as for any launch;
this program does not import sglang-phasetrace. It answers each line with one JSON line on
stdout, with ``t`` (Unix ns) taken after the work, so a reader can wait for a heartbeat newer
than that:

    (start)       {"ready": true, "t": ...}
    generate N    N prompts as one batch         -> {"tokens": [completion tokens per prompt], "t": ...}
    reload        update_weights_from_disk(MODEL) -> {"ok": bool, "message": str, "t": ...}
    (end of input) shutdown

    python serve_engine.py MODEL_DIR [--tp 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def answer(**fields: object) -> None:
    print(json.dumps({**fields, "t": time.time_ns()}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tp", type=int, default=2)
    args = parser.parse_args()
    import sglang

    engine = sglang.Engine(
        model_path=args.model, device="cpu", tp_size=args.tp, max_total_tokens=4096, log_level="warning"
    )
    answer(ready=True)
    try:
        for line in sys.stdin:
            command, *rest = line.split()
            if command == "generate":
                prompts = [f"Request {i}: say something" for i in range(int(rest[0]))]
                outs = engine.generate(prompts, {"max_new_tokens": 8, "temperature": 0})
                answer(tokens=[out["meta_info"]["completion_tokens"] for out in outs])
            elif command == "reload":
                ok, message, *_ = engine.update_weights_from_disk(args.model)
                answer(ok=bool(ok), message=str(message))
            else:
                answer(error=f"unknown command {command!r}")
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
