"""Benchmark: seconds from a planted stall to the watchdog's diagnosis, and heartbeat CPU cost.

Plants a real stall (rank 1 of 2 blocks before ``initialize_model_parallel`` in SGLang's own gloo
init, tests/programs/dist_ranks.py), watches the run as ``phasetrace watch`` does, and prints:
latency from stall start (the rank's last progress record) to the diagnosis — blocked and GIL-held
(silent) at the defaults (nothing set), and blocked at short settings;
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
from typing import Any

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


def latency(model: str, plant: str, th: Any | None = None) -> tuple[str, float, float]:
    """(finding kind, seconds from the stall's start to it, the stalled rank's process CPU %). ``th`` None:
    the defaults everywhere — the ranks' heartbeat and the watchdog's thresholds, nothing set."""
    from sglang_phasetrace.tracing.reader.load import load_run
    from sglang_phasetrace.tracing.verdicts.diagnose import Thresholds
    from sglang_phasetrace.tracing.verdicts.watchdog import Watchdog

    run_dir = Path(tempfile.mkdtemp(prefix="bench-watchdog-")) / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_PHASETRACE")}
    env.update(
        {
            "PYTHONPATH": str(ROOT / "sitecustomize_hooks"),
            "SGLANG_PHASETRACE_RUN_DIR": str(run_dir),
            "HF_HUB_OFFLINE": "1",
        }
    )
    if th is not None:
        env["SGLANG_PHASETRACE_HEARTBEAT_S"] = str(th.heartbeat_s)
    th = th or Thresholds()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests/programs/dist_ranks.py"),
            model,
            "--world",
            "2",
            "--plant",
            plant,
            "--rank",
            "1",
            "--port",
            str(_port()),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        dog = Watchdog(run_dir, th, out=open(os.devnull, "w"), py_spy=False)
        while True:  # as the watchdog's own loop: one pass per heartbeat interval
            found = dog.step() if (run_dir / "journal").is_dir() else []
            if found:
                found_at = time.time()
                break
            time.sleep(min(th.heartbeat_s, 5.0))
        rank = next(p for p in load_run(run_dir).ranks if p.identity.get("sglang.world_rank") == 1)
        stalled = rank.last_progress_t / 1e9
        time.sleep(3 * th.heartbeat_s)  # let the sleeping rank beat a few more times
        beats = [hb["cpu_s"] / hb["interval_s"] for hb in load_run(run_dir).ranks[1].heartbeats[2:]]
        cpu = statistics.mean(beats) * 100 if beats and plant == "sleep" else float("nan")
        return found[0].kind, found_at - stalled, cpu
    finally:
        os.killpg(proc.pid, signal.SIGKILL)


def beat_cost(beats: int = 300) -> float:
    """CPU µs per heartbeat (phases, progress, collectives, psutil figures, status file)."""
    os.environ["SGLANG_PHASETRACE_RUN_DIR"] = tempfile.mkdtemp(prefix="bench-beat-")
    os.environ["SGLANG_PHASETRACE_HEARTBEAT_S"] = "3600"
    from sglang_phasetrace.tracing.recorder import heartbeat, spans

    handles = [spans.start_phase(f"bench.phase{i}") for i in range(4)]
    handles[-1].progress(done=3, total=10, unit="shards")
    beat = heartbeat.current()
    start = time.thread_time()
    for _ in range(beats):
        beat.beat()
    return (time.thread_time() - start) / beats * 1e6


def main() -> int:
    from sglang_phasetrace.tracing.verdicts.diagnose import Thresholds

    model = sys.argv[1] if len(sys.argv) > 1 else "/tmp/tiny"
    default = Thresholds()
    per_beat = beat_cost()
    print("heartbeat cost, in-process:")
    print(
        f"  {per_beat:8.0f} µs CPU per beat  -> {per_beat / default.heartbeat_s / 1e4:.4f} % of one core per rank"
        f" at the {default.heartbeat_s:g} s default"
    )
    print("\nstall -> diagnosis (real SGLang gloo init, 2 ranks, rank 1 stalls before initialize_model_parallel):")
    print(f"  {'stall':<30} {'settings':<40} {'finding':<10} {'latency s':>9} {'stalled rank CPU %':>19}")
    rows = (
        ("blocked (time.sleep)", "sleep", None, "defaults (nothing set)"),
        ("GIL held in C (ctypes sleep)", "gil", None, "defaults (nothing set)"),
        ("blocked (time.sleep)", "sleep", Thresholds(1.0, 4.0, 5.0, 50.0, 4.0), "heartbeat 1 s, blocked 4 s"),
    )
    at_defaults = None
    for name, plant, th, settings in rows:
        kind, total, cpu = latency(model, plant, th)
        print(f"  {name:<30} {settings:<40} {kind:<10} {total:9.1f} {cpu:19.2f}")
        at_defaults = at_defaults or total
    print(
        f"\nat the defaults the diagnosis comes {at_defaults:.1f} s after the stall; without it, the first word"
        " is from:"
    )
    for name, seconds in ANCHORS:
        after = f"{seconds:5.0f} s  ({seconds / at_defaults:4.1f}x later)" if seconds else "never during init"
        print(f"  {name:<72} {after}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
