"""Benchmark: a rank's heartbeat cost before and after what it waits on is read, in one run.

What a waiting rank waits on (``tracing.verdicts.evidence``) is read by the watcher, from ``/proc``,
only for ranks under suspicion; a rank does nothing new. This measures it on a real traced process
(its own tracing runtime, four open phases, progress, a status file, as ``bench_watchdog.beat_cost``):

* **before**: CPU µs per heartbeat of its heartbeat thread while nobody reads it;
* **after**: the same, while the watcher reads its evidence continuously — each read as a watchdog
  pass makes it for a suspect rank (``RankReader``: ``/proc/locks``, the main thread, descriptors,
  children), back to back: the worst case, a pass is every 2 s;
* the ratio after / before (1.00: unchanged), and whether the rank's interpreter ever imported the
  evidence modules (it must not: the reader side only).

    python scripts/bench_heartbeat_evidence.py [BEATS]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

RANK = """
import os, sys, time
os.environ["SGLANG_PHASETRACE_RUN_DIR"] = {run_dir!r}
os.environ["SGLANG_PHASETRACE_HEARTBEAT_S"] = "3600"  # beats are made here, one after another
from sglang_phasetrace.tracing.recorder import heartbeat, spans

handles = [spans.start_phase(f"bench.phase{{i}}") for i in range(4)]
handles[-1].progress(done=3, total=10, unit="shards")
beat = heartbeat.current()
for _ in range(20):
    beat.beat()
print("ready", flush=True)
for line in sys.stdin:  # one line per sample: N beats, their CPU µs each
    n = int(line)
    start = time.thread_time()
    for _ in range(n):
        beat.beat()
    print((time.thread_time() - start) / n * 1e6, flush=True)
print("imported:", any("verdicts" in m for m in sys.modules), flush=True)
"""


def main() -> int:
    beats = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    from sglang_phasetrace.tracing.verdicts import evidence

    with tempfile.TemporaryDirectory(prefix="bench-hb-evidence-") as tmp:
        rank = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(RANK.format(run_dir=os.path.join(tmp, "run")))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert rank.stdin is not None and rank.stdout is not None
        assert rank.stdout.readline().strip() == "ready"

        def sample() -> float:
            rank.stdin.write(f"{beats}\n")  # type: ignore[union-attr]
            rank.stdin.flush()  # type: ignore[union-attr]
            return float(rank.stdout.readline())  # type: ignore[union-attr]

        reads = [0]
        stop = threading.Event()

        def watcher() -> None:
            locks = evidence.read_locks()
            while not stop.is_set():
                evidence.read(rank.pid, launch_pids={rank.pid}, locks=locks)
                reads[0] += 1

        before, after = [], []
        t_read = 0.0
        for _ in range(5):  # interleaved, so a drift of the host's load falls on both
            before.append(sample())
            stop.clear()
            thread = threading.Thread(target=watcher, daemon=True)
            start, n0 = time.perf_counter(), reads[0]
            thread.start()
            after.append(sample())
            stop.set()
            thread.join()
            t_read = (time.perf_counter() - start) / max(1, reads[0] - n0)
        rank.stdin.close()
        imported = rank.stdout.readline().strip()
        rank.wait(timeout=30)
    b, a = statistics.median(before), statistics.median(after)
    print(f"heartbeat CPU per beat, {beats} beats x 5 samples each (median):")
    print(f"  before (nobody reads the rank)              {b:8.0f} µs")
    print(f"  after  (its evidence read back to back)     {a:8.0f} µs   ({reads[0]} reads, {t_read * 1e3:.2f} ms each)")
    print(f"  ratio after / before                        {a / b:8.2f}")
    print(f"  the rank imported a verdicts module: {imported.split(':', 1)[1].strip()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
