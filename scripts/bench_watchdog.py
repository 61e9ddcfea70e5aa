"""Benchmark: seconds from a planted stall to the watchdog's diagnosis, and heartbeat CPU cost.

Plants a real stall (rank 1 of 2 blocks before ``initialize_model_parallel`` in SGLang's own gloo
init, tests/programs/dist_ranks.py), watches the run as ``phasetrace watch`` does, and prints:
latency from stall start (the rank's last progress record) to the diagnosis, per threshold set;
and the heartbeat's CPU cost, measured per beat in-process (per rank: that over the interval).
Beside it, the stalled rank's whole-process CPU from its own heartbeats (``cpu_s`` per interval
while its main thread sleeps): all its threads, gloo's and torch's included — an untraced rank
blocked the same way uses as much, so it bounds tracing's share from above. The latency at the
default thresholds is set beside what would otherwise notice the stall first.

    python scripts/bench_watchdog.py MODEL_DIR
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What notices a stalled init without us (defaults of PyTorch 2.x and SGLang 0.5): seconds, or None.
ANCHORS = (
    ("PyTorch NCCL heartbeat monitor (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC)", 480.0),
    ("c10d collective timeout (NCCL default)", 600.0),
    ("SGLang hard watchdog (--watchdog-timeout 300 s; armed only after init)", None),
)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def latency(model: str, heartbeat_s: float, stall_s: float) -> tuple[float, float, float]:
    from sglang_phasetrace.tracing.diagnose import Thresholds
    from sglang_phasetrace.tracing.rundir import load_run
    from sglang_phasetrace.tracing.watchdog import Watchdog

    run_dir = Path(tempfile.mkdtemp(prefix="bench-watchdog-")) / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "sitecustomize_hooks"), "SGLANG_PHASETRACE_RUN_DIR": str(run_dir),
           "SGLANG_PHASETRACE_HEARTBEAT_S": str(heartbeat_s), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests/programs/dist_ranks.py"), model, "--world", "2",
                             "--plant", "sleep", "--rank", "1", "--port", str(_port())],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        dog = Watchdog(run_dir, Thresholds(heartbeat_s, 3 * heartbeat_s, stall_s, 10 * stall_s),
                       out=open(os.devnull, "w"), py_spy=False)
        while True:
            if (run_dir / "journal").is_dir() and dog.step():
                found = time.time()
                break
            time.sleep(min(heartbeat_s, 5.0))
        rank = next(p for p in load_run(run_dir).ranks if p.identity.get("sglang.world_rank") == 1)
        stalled = rank.last_progress_t / 1e9
        time.sleep(3 * heartbeat_s)  # let the sleeping rank beat a few more times
        beats = [hb["cpu_s"] / hb["interval_s"] for hb in load_run(run_dir).ranks[1].heartbeats[2:]]
        return found - stalled, found - stalled - stall_s, statistics.mean(beats) * 100 if beats else float("nan")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)


def beat_cost(beats: int = 300) -> float:
    """CPU µs per heartbeat (phases, progress, collectives, psutil figures, status file)."""
    os.environ["SGLANG_PHASETRACE_RUN_DIR"] = tempfile.mkdtemp(prefix="bench-beat-")
    os.environ["SGLANG_PHASETRACE_HEARTBEAT_S"] = "3600"
    from sglang_phasetrace.tracing import heartbeat, spans

    handles = [spans.start_phase(f"bench.phase{i}") for i in range(4)]
    handles[-1].progress(done=3, total=10, unit="shards")
    beat = heartbeat._current
    start = time.thread_time()
    for _ in range(beats):
        beat.beat()
    return (time.thread_time() - start) / beats * 1e6


def main() -> int:
    model = sys.argv[1] if len(sys.argv) > 1 else "/tmp/tiny"
    per_beat = beat_cost()
    print("heartbeat cost, in-process:")
    print(f"  {per_beat:8.0f} µs CPU per beat  -> {per_beat / 5.0 / 1e4:.4f} % of one core per rank at the 5 s default")
    print("\nstall -> diagnosis (real SGLang gloo init, 2 ranks, rank 1 blocked):")
    print(f"  {'heartbeat s':>11} {'stall s':>8} {'latency s':>10} {'beyond threshold s':>19}"
          f" {'stalled rank process CPU %':>27}")
    for hb, stall in ((1.0, 5.0), (5.0, 30.0)):
        total, beyond, cpu = latency(model, hb, stall)
        print(f"  {hb:11.1f} {stall:8.1f} {total:10.1f} {beyond:19.1f} {cpu:27.3f}")
    print(f"\nat the defaults the diagnosis comes {total:.1f} s after the stall; without it, the first word is from:")
    for name, seconds in ANCHORS:
        after = f"{seconds:5.0f} s  ({seconds / total:4.1f}x later)" if seconds else "never during init"
        print(f"  {name:<72} {after}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
