"""Benchmark the CLI readers on synthetic run directories (not a test: it prints a table).

    python scripts/bench_cli.py                 # 8, 128 and 1024 ranks x 300 spans
    python scripts/bench_cli.py --ranks 8 64 --spans 300 --repeat 3

Each command runs in this process through ``main(argv)`` with its output sent to /dev/null, so
the figures are the command's own work, journal loading included (the ``load`` column shows that
part alone: ``load_run`` with the cyclic GC off, as under ``main``). The goal: under 2 s per
command at 1024 ranks, growing linearly with spans.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from cli_fixtures import build_run
from sglang_phasetrace.tracing.cli import main
from sglang_phasetrace.tracing.reader.load import load_run

COMMANDS = {
    "timeline": ["timeline", "{run}", "--width", "160"],
    "compare": ["compare", "{run}", "--json"],
    "export jaeger": ["export", "{run}", "--format", "jaeger", "-o", "{out}/jaeger.json"],
    "export otlp": ["export", "{run}", "--format", "otlp-json", "-o", "{out}/otlp.json"],
    "export perfetto": ["export", "{run}", "--format", "perfetto", "-o", "{out}/perfetto.json"],
    "report": ["report", "{run}", "-o", "{out}/report.html"],
}


def timed(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        tic = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - tic)
    return best


def run_quietly(argv: list[str]) -> None:
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        code = main(argv)
    if code != 0:
        raise SystemExit(f"{' '.join(argv)} exited {code}")


def main_bench() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 128, 1024])
    parser.add_argument("--spans", type=int, default=300, help="spans per rank")
    parser.add_argument("--repeat", type=int, default=1, help="runs per figure; the best is shown")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="phasetrace-bench-") as tmp:
        rows = []
        for ranks in args.ranks:
            run = build_run(Path(tmp) / f"r{ranks}", ranks=ranks, spans=args.spans).path
            out = Path(tmp) / f"out{ranks}"
            out.mkdir()
            spans = sum(len(p.spans) for p in load_run(run).processes)
            size = sum(f.stat().st_size for f in (run / "journal").iterdir())
            gc.disable()  # as `main` runs every verb
            figures = {"load": timed(lambda run=run: load_run(run), args.repeat)}
            gc.enable()
            for name, argv in COMMANDS.items():
                filled = [a.format(run=run, out=out) for a in argv]
                figures[name] = timed(lambda filled=filled: run_quietly(filled), args.repeat)
            figures["report MB"] = (out / "report.html").stat().st_size / 1e6
            rows.append((ranks, spans, size / 1e6, figures))
            print(f"  {ranks} ranks done", file=sys.stderr)
    names = list(rows[0][3])
    header = f"{'ranks':>6} {'spans':>8} {'journal MB':>10} " + " ".join(f"{n:>15}" for n in names)
    print(header)
    print("-" * len(header))
    for ranks, spans, size, figures in rows:
        cells = " ".join(
            f"{figures[n]:>13.2f} {'MB' if 'MB' in n else 's ':>1}" if "MB" in n else f"{figures[n]:>14.3f}s"
            for n in names
        )
        print(f"{ranks:>6} {spans:>8} {size:>10.1f} {cells}")
    print()
    print("µs per span (flat = linear growth):")
    for ranks, spans, _, figures in rows:
        per = " ".join(f"{n}={1e6 * figures[n] / spans:.1f}" for n in names if "MB" not in n)
        print(f"  {ranks:>5} ranks: {per}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main_bench())
