"""Wall time of ``phasetrace inspect`` on a stalled 8-process launch started without the hook (not a test).

The launch: ``python -m sglang.launch_server --tp-size 2 --dp-size 2`` on CPU — launcher, resource
tracker, DP controller, four scheduler ranks, detokenizer — planted by ``tests/plants_untraced`` so
that rank 1 of each DP replica waits for a file lock this script holds while rank 0 waits in the TP
barrier. ``phasetrace inspect PID`` runs as a user runs it (a fresh process), with the default 3 s
window, several times; beside it ``phasetrace --help`` (the CLI's own start) in the same run.

    python scripts/make_tiny_model.py /tmp/tiny
    python scripts/bench_inspect.py /tmp/tiny [--repeat 3]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "sglang_phasetrace.tracing.cli"]
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def timed(argv: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    tic = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return time.perf_counter() - tic, done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="scripts/make_tiny_model.py's output")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--port", type=int, default=24000)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-inspect-"))
    lock, go = tmp / "lock", tmp / "go"
    go.touch()  # no GIL phase: straight to the lock
    held = open(lock, "a")
    fcntl.flock(held, fcntl.LOCK_EX)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_PHASETRACE")}
    env.update(CPU_ENV, SGLANG_CPU_OMP_THREADS_BIND="0|1|0|1", PYTHONPATH=str(ROOT / "tests" / "plants_untraced"))
    env.update(INSPECT_PLANT_RANK="1", INSPECT_PLANT_GO=str(go), INSPECT_PLANT_LOCK=str(lock))
    command = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(args.model), "--device", "cpu"]
    command += ["--tp-size", "2", "--dp-size", "2", "--max-total-tokens", "4096", "--port", str(args.port)]
    with open(tmp / "server.log", "w") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(5)
            _, done = timed([*CLI, "inspect", str(proc.pid), "--json", "--window", "1"])
            doc = json.loads(done.stdout) if done.stdout.startswith("{") else None
            launch = doc["launches"][0] if doc else None
            if launch and launch["verdict"] == "STALL" and len(launch["processes"]) >= 8:
                break
        else:
            print((tmp / "server.log").read_text()[-3000:])
            return 1
        cli_start = min(timed([*CLI, "--help"])[0] for _ in range(args.repeat))
        walls, line = [], ""
        for _ in range(args.repeat):
            wall, done = timed([*CLI, "inspect", str(proc.pid)])
            walls.append(wall)
            line = done.stdout.splitlines()[0]
        print(f"launch: {len(launch['processes'])} processes ({', '.join(p['label'] for p in launch['processes'])})")
        print(f"verdict: {line}")
        print(
            f"phasetrace inspect, default 3 s window: best {min(walls):.2f} s, median {statistics.median(walls):.2f} s"
        )
        print(f"phasetrace --help (the CLI's own start): {cli_start:.2f} s")
        print(f"inspect beyond its window: {min(walls) - 3:.2f} s ({(min(walls) - 3) / cli_start:.1f}x the CLI start)")
        return 0
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


if __name__ == "__main__":
    sys.exit(main())
