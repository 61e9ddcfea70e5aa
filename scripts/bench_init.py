"""Benchmark: real SGLang start-up on CPU (``sglang.Engine``, tp=2, tiny model), traced vs not.

Each run is a fresh ``scripts/start_engine.py MODEL --no-generate`` process. Timed from the parent:
process spawn -> the "engine ready" line (interpreter start, imports, ``Engine()``; the figure an
operator waits for), and ready -> process exit (``Engine.shutdown`` and interpreter exit, where
exporters flush). Set-ups, interleaved round by round (order rotated) so that a noisy neighbour
on a shared machine hits all alike; medians, and ratios against the untraced start:

  untraced        no hook on PYTHONPATH
  journal         hook: journal, status files, heartbeats (the default)
  journal+otlp    hook + OTLP to a live local receiver (tests/otlp_receiver.py)
  otlp dead       hook + OTLP to a collector that never answers (a port that accepts nothing)

    python scripts/bench_init.py MODEL_DIR [--runs 5] [--protocol grpc|http/protobuf]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import CPU_ENV, ROOT


@contextmanager
def dead_collector() -> Iterator[str]:
    """A port that never answers: it listens (so connects do not fail fast) but never accepts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_PHASETRACE", "OTEL_", "TRACEPARENT"))}
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # measure as deployed: compiled once, cached
    return {**env, **CPU_ENV, "SGLANG_PHASETRACE_DIR": tempfile.mkdtemp(prefix="bench-init-")}


def setups(live: str, dead: str, protocol: str) -> dict[str, dict[str, str]]:
    plain = base_env()
    hooked = {**plain, "PYTHONPATH": str(ROOT / "sitecustomize_hooks")}
    return {
        "untraced": plain,
        "journal": hooked,
        "journal+otlp": {**hooked, "OTEL_EXPORTER_OTLP_ENDPOINT": live, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol},
        "otlp dead": {**hooked, "OTEL_EXPORTER_OTLP_ENDPOINT": dead, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol},
    }


def one_start(model: str, env: dict[str, str], timeout: float = 300) -> tuple[float, float]:
    """Seconds spawn -> "engine ready" line, and ready -> exit; the process group is killed after."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts/start_engine.py"), model, "--tp", "2", "--no-generate"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        ready = None
        for line in proc.stdout:
            if line.startswith("engine ready"):
                ready = time.perf_counter()
        proc.wait(timeout=timeout)
        if ready is None or proc.returncode != 0:
            raise RuntimeError(f"start failed (exit {proc.returncode}); rerun it by hand to see SGLang's log")
        return ready - start, time.perf_counter() - ready
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--protocol", default="grpc", choices=("grpc", "http/protobuf"))
    args = parser.parse_args()
    from otlp_receiver import OtlpReceiver

    with OtlpReceiver(args.protocol) as receiver, dead_collector() as dead:
        envs = setups(receiver.endpoint, dead, args.protocol)
        names = list(envs)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
        for i in range(args.runs + 1):  # round 0 warms the page cache and .pyc files: not counted
            for name in names[i % len(names) :] + names[: i % len(names)]:
                sample = one_start(args.model, envs[name])
                if i:
                    times[name].append(sample)
                    print(f"  round {i} {name:<13} ready {sample[0]:6.2f} s   exit {sample[1]:5.2f} s", flush=True)
        spans = len(receiver.spans)
    base = statistics.median(t[0] for t in times["untraced"])
    print(
        f"\nsglang.Engine tp=2 on CPU, {args.runs} runs each, medians (OTLP: {args.protocol}; "
        f"{spans} spans reached the live receiver)"
    )
    print(f"  {'set-up':<13} {'spawn->ready s':>14} {'ratio':>6} {'ready->exit s':>14}")
    for name in names:
        ready = statistics.median(t[0] for t in times[name])
        leave = statistics.median(t[1] for t in times[name])
        print(f"  {name:<13} {ready:14.2f} {ready / base:6.3f} {leave:14.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
