"""Benchmark: what the PYTHONPATH hook costs a Python process that never imports SGLang.

Three figures, each from one run on this machine:

1. wall clock of ``python -c pass`` with ``sitecustomize_hooks/`` on PYTHONPATH and without, best of N
   runs interleaved (A B A B …, so a noisy neighbour hits both alike): the difference and the ratio;
2. what ``python -X importtime`` charges to our ``sitecustomize`` (cumulative: the hook, the modules it
   imports and the chaining to a shadowed ``sitecustomize``), median of N: the hook's own cost, free of
   the wall-clock noise of a shared machine;
3. the modules present after start-up with the hook that are absent without it (should be none but
   ``sitecustomize`` itself).

Bytecode is cached as deployed (``PYTHONDONTWRITEBYTECODE`` is dropped; one warm-up run writes it).

    python scripts/bench_hook_startup.py [--runs N] [--python PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HOOKS = Path(__file__).resolve().parents[1] / "sitecustomize_hooks"
MODULES = "import sys, json; print(json.dumps(sorted(sys.modules)))"


def envs() -> tuple[dict[str, str], dict[str, str]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_PHASETRACE")}
    base.pop("PYTHONPATH", None)
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    return base, {**base, "PYTHONPATH": str(HOOKS)}


def best_wall_s(python: str, env_pair: tuple[dict[str, str], ...], runs: int) -> list[float]:
    """Best wall time of ``python -c pass`` per environment, interleaved, after one warm-up each."""
    best = [float("inf")] * len(env_pair)
    for i in range(runs + 1):
        for k, env in enumerate(env_pair):
            start = time.perf_counter()
            subprocess.run([python, "-c", "pass"], env=env, check=True, capture_output=True)
            if i:
                best[k] = min(best[k], time.perf_counter() - start)
    return best


def hook_importtime_ms(python: str, env: dict[str, str], runs: int) -> float:
    """Median cumulative ``-X importtime`` of the top-level ``sitecustomize`` import, in ms."""
    samples = []
    for _ in range(runs):
        err = subprocess.run(
            [python, "-X", "importtime", "-c", "pass"], env=env, check=True, capture_output=True, text=True
        ).stderr
        rows = [line.split("|") for line in err.splitlines() if line.startswith("import time:")]
        ours = [row for row in rows if row[-1].strip() == "sitecustomize"]
        outer = min(ours, key=lambda row: len(row[-1]) - len(row[-1].lstrip()))  # the first-level one
        samples.append(int(outer[1]) / 1000)
    return statistics.median(samples)


def extra_modules(python: str, plain: dict[str, str], hooked: dict[str, str]) -> list[str]:
    def loaded(env: dict[str, str]) -> set[str]:
        out = subprocess.run([python, "-c", MODULES], env=env, check=True, capture_output=True, text=True).stdout
        return set(json.loads(out))

    return sorted(loaded(hooked) - loaded(plain))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="interleaved runs per set-up (default 40)")
    parser.add_argument("--python", default=sys.executable, help="interpreter to measure (default: this one)")
    args = parser.parse_args()
    plain, hooked = envs()
    extra = extra_modules(args.python, plain, hooked)
    own = hook_importtime_ms(args.python, hooked, args.runs)
    without, with_hook = best_wall_s(args.python, (plain, hooked), args.runs)
    print(f"interpreter: {args.python}")
    print(
        f"python -c pass, best of {args.runs}: no hook {without * 1e3:6.2f} ms   hook {with_hook * 1e3:6.2f} ms"
        f"   +{(with_hook - without) * 1e3:.2f} ms   ratio {with_hook / without:.3f}"
    )
    print(f"the hook's own import (-X importtime, median of {args.runs}): {own:.3f} ms")
    print(f"modules the hook adds: {', '.join(extra) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
