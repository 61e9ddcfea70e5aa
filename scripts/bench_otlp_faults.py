"""Benchmark: a real start with an OTLP collector that fails, against the same start without an endpoint.

Each run is a fresh ``scripts/start_engine.py MODEL --tp 2`` (``sglang.Engine`` on CPU: start, one
request, shutdown) under the hook, timed from the parent: spawn -> the "engine ready" line, spawn ->
process exit, and "engine stopped" -> exit (the interpreter's exit, where exporters flush: the part
of the exit that is ours, free of SGLang's own noise). The collector, for each protocol
(``tests/otlp_receiver.faulty``): one that accepts connections and never answers, one that refuses
them, one that answers every request 3 s late, one that dies after its first batch of spans.

Set-ups are interleaved round by round (order rotated), so that a noisy neighbour on a shared
machine hits all alike; medians, and ratios against no endpoint. For every run it also checks what
the issue asks: each process said at most one line about the collector, every journal is whole
(as many phases ended as without an endpoint, none left open), and the exit code is SGLang's.

    python scripts/bench_otlp_faults.py MODEL_DIR [--rounds 2] [--protocol grpc --protocol http/protobuf]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import CPU_ENV, ROOT

NONE = "no endpoint"
OURS = re.compile(r"sglang-phasetrace: .*OTLP")


@dataclass
class Sample:
    ready_s: float
    exit_s: float
    tail_s: float  # "engine stopped" -> process exit
    cpu_s: float  # user + system CPU of the launch's processes (a busy neighbour stretches wall time, not this)
    said: int  # lines of ours about the collector, at most one per process expected
    processes: int
    ended: int  # phases ended in all journals
    open: int  # phases left open or incomplete
    code: int


def base_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_PHASETRACE", "OTEL_", "TRACEPARENT"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # measure as deployed: compiled once, cached
    return {**env, **CPU_ENV, "PYTHONPATH": str(ROOT / "sitecustomize_hooks"), "SGLANG_PHASETRACE_DIR": str(tmp)}


def one_start(model: str, env: dict[str, str], timeout: float = 400) -> Sample:
    """One start, timed; its journals read back (the run directory of ``SGLANG_PHASETRACE_RUN_DIR``)."""
    from sglang_phasetrace.tracing.reader.load import load_run

    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts/start_engine.py"), model, "--tp", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    ready = stopped = None
    try:
        for line in proc.stdout:
            if line.startswith("engine ready"):
                ready = time.perf_counter()
            elif line.startswith("engine stopped"):
                stopped = time.perf_counter()
        err = proc.stderr.read()  # until the launch's processes close it
        _, status, usage = os.wait4(proc.pid, 0)  # its CPU and its reaped children's (the ranks)
        end = time.perf_counter()
        proc.returncode = code = os.waitstatus_to_exitcode(status)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    if ready is None or stopped is None:
        raise RuntimeError(f"start failed (exit {code}):\n{err[-3000:]}")
    view = load_run(Path(env["SGLANG_PHASETRACE_RUN_DIR"]))
    shown = [p for p in view.processes if p.shown]
    spans = [s for p in shown for s in p.spans.values()]
    return Sample(
        ready_s=ready - start,
        exit_s=end - start,
        tail_s=end - stopped,
        cpu_s=usage.ru_utime + usage.ru_stime,
        said=sum(1 for line in err.splitlines() if OURS.search(line)),
        processes=len(shown),
        ended=sum(1 for s in spans if s.status == "ok"),
        open=sum(1 for s in spans if s.status in ("open", "incomplete")),
        code=code,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--protocol", action="append", choices=("grpc", "http/protobuf"))
    args = parser.parse_args()
    protocols = args.protocol or ["grpc", "http/protobuf"]
    from otlp_receiver import FAULTS, faulty

    tmp = Path(tempfile.mkdtemp(prefix="bench-otlp-"))
    setups = [(NONE, "")] + [(fault, protocol) for protocol in protocols for fault in FAULTS]
    samples: dict[tuple[str, str], list[Sample]] = collections.defaultdict(list)
    n = 0
    for i in range(args.rounds + 1):  # round 0, one start, warms the page cache and .pyc files: not counted
        for fault, protocol in setups[i % len(setups) :] + setups[: i % len(setups)] if i else setups[:1]:
            n += 1
            env = {**base_env(tmp), "SGLANG_PHASETRACE_RUN_DIR": str(tmp / f"run-{n}")}
            with contextlib.ExitStack() as stack:
                if fault != NONE:
                    endpoint = stack.enter_context(faulty(fault, protocol))
                    env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol}
                sample = one_start(args.model, env)
            if i:
                samples[fault, protocol].append(sample)
                print(
                    f"  round {i} {protocol or '-':<13} {fault:<15} ready {sample.ready_s:6.2f} s  exit "
                    f"{sample.exit_s:6.2f} s  (tail {sample.tail_s:4.2f} s)  cpu {sample.cpu_s:5.1f} s  "
                    f"said {sample.said}/{sample.processes}  "
                    f"phases {sample.ended} ok / {sample.open} open  exit code {sample.code}",
                    flush=True,
                )
    base = samples[NONE, ""]
    ready0 = statistics.median(s.ready_s for s in base)
    exit0 = statistics.median(s.exit_s for s in base)
    tail0 = statistics.median(s.tail_s for s in base)
    cpu0 = statistics.median(s.cpu_s for s in base)
    ended0 = max(s.ended for s in base)
    print(f"\nsglang.Engine tp=2 on CPU, start + one request + shutdown, {args.rounds} rounds, medians")
    print("  (tail: 'engine stopped' -> exit; cpu: user + system of the launch's processes, as a ratio;")
    print("   said: lines of ours about the collector / processes, the worst run)")
    print(
        f"  {'protocol':<13} {'collector':<15} {'ready s':>8} {'ratio':>6} {'exit s':>8} {'ratio':>6} "
        f"{'tail s':>7} {'+tail s':>7} {'cpu':>6}  {'said':>9}  journal"
    )
    for fault, protocol in setups:
        runs = samples[fault, protocol]
        ready = statistics.median(s.ready_s for s in runs)
        leave = statistics.median(s.exit_s for s in runs)
        tail = statistics.median(s.tail_s for s in runs)
        cpu = statistics.median(s.cpu_s for s in runs)
        said = max(runs, key=lambda s: s.said / s.processes)
        whole = all(s.ended >= ended0 and s.open == 0 and s.code == 0 for s in runs)
        print(
            f"  {protocol or '-':<13} {fault:<15} {ready:8.2f} {ready / ready0:6.3f} {leave:8.2f} "
            f"{leave / exit0:6.3f} {tail:7.2f} {tail - tail0:+7.2f} {cpu / cpu0:6.3f}  "
            f"{f'{said.said}/{said.processes}':>9}  "
            f"{'whole' if whole else 'INCOMPLETE'}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
