"""Time ``phasetrace probe`` as an exec probe runs it (a fresh process each time), at 1024 ranks cloned
from a real traced start (not a test): from the state file the launcher's watchdog keeps, and from
the journals (the file removed: a launcher killed outright), beside the CLI's own start
(``phasetrace --help``) measured in the same run.

    python scripts/make_tiny_model.py /tmp/tiny
    SGLANG_PHASETRACE_DIR=/tmp/runs PYTHONPATH=sitecustomize_hooks python scripts/start_engine.py /tmp/tiny --tp 2
    python scripts/bench_probe.py /tmp/runs/<run id> [--ranks 1024] [--repeat 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_viewers_1024 import clone

CLI = [sys.executable, "-m", "sglang_phasetrace.tracing.cli"]


def best(argv: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        tic = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - tic)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a real traced run directory (tp=2)")
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    from sglang_phasetrace.tracing.journal.layout import STARTUP_FILE
    from sglang_phasetrace.tracing.reader.load import load_run
    from sglang_phasetrace.tracing.verdicts import startup
    from sglang_phasetrace.tracing.verdicts.findings import findings

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / args.source.name
        clone(args.source, run, args.ranks, args.copies)
        view = load_run(run)
        now = time.time_ns()
        # the state file as the launcher's watchdog writes it (this process stands for the launcher)
        (run / STARTUP_FILE).write_bytes(startup.state_file(startup.assess(view, findings(view, now), now)))
        size = (run / STARTUP_FILE).stat().st_size
        floor = best([*CLI, "--help"], args.repeat)
        fast = best([*CLI, "probe", str(run)], args.repeat)
        (run / STARTUP_FILE).unlink()
        slow = best([*CLI, "probe", str(run)], max(1, args.repeat // 2))
    print(f"phasetrace probe at {args.ranks} ranks (best of {args.repeat}, a fresh process each):")
    rows = [
        ("CLI start (phasetrace --help)", floor),
        (f"from the state file ({size} bytes)", fast),
        ("from the journals (no state file)", slow),
    ]
    for name, took in rows:
        print(f"  {name:<38} {took:6.3f} s   {took / floor:5.2f}x the CLI start")
    return 0


if __name__ == "__main__":
    sys.exit(main())
