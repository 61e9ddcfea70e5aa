"""Benchmark: what tracing costs. Prints ratios measured in this one run.

1. interpreter start of a process that never imports SGLang, with the hook on PYTHONPATH vs without
   (best of interleaved runs), and what ``-X importtime`` charges to the hook itself;
2. ``import sglang``, and importing SGLang's scheduler, engine and EAGLE worker (the patching
   happens here), with the hook vs without;
3. one call through a traced phase wrapper vs the bare function (in-process, journal only);
4. one journal record: ``JournalWriter.write`` (handed to the writer's thread and waited for, so
   that a disk that stops answering never holds the caller) vs a bare ``os.write`` of the line.

Real start-up (``sglang.Engine``) is ``bench_init.py``; heartbeats and stall latency ``bench_watchdog.py``.

    python scripts/bench_overhead.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPORTS = "import sglang.srt.managers.scheduler, sglang.srt.entrypoints.engine, sglang.srt.speculative.eagle_worker_v2"


def timed(code: str, envs: list[dict[str, str]], runs: int) -> list[float]:
    """Best wall time of ``python -c code`` per environment, runs interleaved (A B A B …) so that
    a noisy neighbour hits both alike; one warm-up each first (it also writes .pyc files)."""
    best = [float("inf")] * len(envs)
    for i in range(runs + 1):
        for k, env in enumerate(envs):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
            if i:
                best[k] = min(best[k], time.perf_counter() - start)
    return best


def hook_import_ms(env: dict[str, str], runs: int) -> float:
    """Median of what ``-X importtime`` charges to our ``sitecustomize`` (boot module and chaining
    included): the hook's own start-up cost, free of the wall-clock noise of a shared machine."""
    samples = []
    for _ in range(runs):
        err = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", "pass"], env=env, check=True, capture_output=True, text=True
        ).stderr
        line = next(line for line in err.splitlines() if line.split("|")[-1].strip() == "sitecustomize")
        samples.append(int(line.split("|")[1]) / 1000)
    return statistics.median(samples)


def per_call_us(calls: int = 20000) -> tuple[float, float]:
    os.environ["SGLANG_PHASETRACE_RUN_DIR"] = tempfile.mkdtemp(prefix="bench-overhead-")
    os.environ["SGLANG_PHASETRACE_HEARTBEAT_S"] = "3600"
    from sglang_phasetrace.patches.spec import Phase
    from sglang_phasetrace.patches.wrappers import make_wrapper

    def step(x: int) -> int:
        return x + 1

    traced = make_wrapper(Phase("bench.step", ("m:step",)), step, "m:step", is_method=False)
    traced(0)  # start the runtime outside the timing
    results = []
    for fn in (step, traced):
        start = time.perf_counter()
        for i in range(calls):
            fn(i)
        results.append((time.perf_counter() - start) / calls * 1e6)
    return results[0], results[1]


def per_record_us(records: int = 20000) -> tuple[float, float]:
    from sglang_phasetrace.tracing.journal import records as rec
    from sglang_phasetrace.tracing.journal.writer import JournalWriter, _line

    record = rec.begin(time.time_ns(), "0123456789abcdef", "fedcba9876543210", "0" * 32, "bench.step", {"i": 1}, "main")
    path = Path(tempfile.mkdtemp(prefix="bench-journal-")) / "j.jsonl"
    writer = JournalWriter(path)
    fd = os.open(path.with_suffix(".raw"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    writer.write(record)  # its thread started outside the timing
    results = []
    for write in (lambda: os.write(fd, _line(record)), lambda: writer.write(record)):
        start = time.perf_counter()
        for _ in range(records):
            write()
        results.append((time.perf_counter() - start) / records * 1e6)
    writer.close()
    os.close(fd)
    return results[0], results[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_PHASETRACE")}
    base.pop("PYTHONPATH", None)
    base.pop("PYTHONDONTWRITEBYTECODE", None)  # measure as deployed: compiled once, cached
    hooked = {
        **base,
        "PYTHONPATH": str(ROOT / "sitecustomize_hooks"),
        "SGLANG_PHASETRACE_RUN_DIR": tempfile.mkdtemp(prefix="bench-overhead-"),
    }

    plain, with_hook = timed("pass", [base, hooked], 5 * args.runs)
    print(
        f"python -c pass         no hook {plain * 1e3:7.1f} ms   hook {with_hook * 1e3:7.1f} ms"
        f"   ratio {with_hook / plain:.3f}   (the hook's own import: {hook_import_ms(hooked, 15):.2f} ms)"
    )
    plain, with_hook = timed("import sglang", [base, hooked], 3 * args.runs)
    print(
        f"python -c 'import sglang'  no hook {plain * 1e3:5.0f} ms   hook {with_hook * 1e3:5.0f} ms"
        f"   ratio {with_hook / plain:.3f}"
    )
    plain, with_hook = timed(IMPORTS, [base, hooked], max(3, args.runs // 2))
    print(
        f"import scheduler, engine, EAGLE (patched)  no hook {plain:5.2f} s   hook {with_hook:5.2f} s"
        f"   ratio {with_hook / plain:.3f}"
    )
    bare, wrapped = per_call_us()
    print(
        f"one traced phase call  bare {bare:8.2f} µs   traced {wrapped:8.2f} µs (span + 2 journal writes)"
        f"   +{wrapped - bare:.1f} µs"
    )
    raw, handed = per_record_us()
    print(
        f"one journal record     os.write {raw:6.2f} µs   JournalWriter.write {handed:6.2f} µs"
        f" (to its thread, waited for)   +{handed - raw:.1f} µs"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
