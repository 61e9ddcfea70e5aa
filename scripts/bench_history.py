"""What the history of starts costs, at 1024 ranks cloned from a real traced start (not a test).

    python scripts/make_tiny_model.py /tmp/tiny
    SGLANG_PHASETRACE_DIR=/tmp/runs PYTHONPATH=sitecustomize_hooks python scripts/start_engine.py /tmp/tiny --tp 2
    (twice: the second start is judged against the first)
    python scripts/bench_history.py /tmp/runs/<run id> [--ranks 1024] [--copies 10] [--repeat 3]

The run (a finished one, or one stopped while starting) is cloned to ``--ranks`` ranks as
``bench_viewers_1024.py`` clones it (≈ 270 spans per rank). Printed, best of ``--repeat``, each
beside the one-time read of the whole run it follows (``load_run``): recording the start as it ends
(``store.record``: one pass over every span, then SQLite), and the watchdog's pass with and without
its launch's history (``findings.live``: the history's share is the difference) — the launch's
earlier starts are those in the source run's base directory (``history.sqlite`` beside it).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_viewers_1024 import clone


def best(fn, repeat: int) -> tuple[float, object]:
    times, got = [], None
    for _ in range(repeat):
        tic = time.perf_counter()
        got = fn()
        times.append(time.perf_counter() - tic)
    return min(times), got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    source = args.run.resolve()
    os.environ["SGLANG_PHASETRACE_HISTORY"] = str(source.parent / "history.sqlite")

    from sglang_phasetrace.tracing.history import fingerprint, store
    from sglang_phasetrace.tracing.history.measure import measure
    from sglang_phasetrace.tracing.reader.load import load_run
    from sglang_phasetrace.tracing.verdicts import findings, usual
    from sglang_phasetrace.tracing.verdicts.diagnose import Thresholds

    out = Path(tempfile.mkdtemp(prefix="bench-history-"))
    clone(source, out / "run", args.ranks, args.copies)
    read_s, view = best(lambda: load_run(out / "run"), 1)
    spans = sum(len(p.spans) for p in view.processes)
    print(f"{args.ranks} ranks, {spans} spans; read whole once: {read_s:.2f} s")
    fp_s, fp = best(lambda: fingerprint.of_run(view), args.repeat)
    print(f"fingerprint: {fp_s * 1e3:.1f} ms ({fp.summary if fp else 'none'}; settled: {fp.settled if fp else '-'})")
    measure_s, _ = best(lambda: measure(view), args.repeat)
    db = out / "history.sqlite"
    record_s, done = best(lambda: store.record(view, db), args.repeat)
    sqlite_s = done.seconds if done else float("nan")
    size = sum(p.stat().st_size for p in out.glob("history.sqlite*")) / 1e6  # MB, with its WAL
    print(
        f"record as it ends: {record_s:.3f} s ({record_s / read_s:.2f}x the read): measure {measure_s:.3f} s, "
        f"SQLite {sqlite_s * 1e3:.1f} ms; database {size * 1e3:.0f} kB"
    )
    now = max(p.last_t for p in view.processes) + 1_000_000_000
    th = Thresholds()
    known = usual.known(view)
    where = os.environ["SGLANG_PHASETRACE_HISTORY"]
    print(f"earlier starts of its launch: {known.starts if known else 0} (in {where})")
    with_s, _ = best(lambda: findings.live(view, now, th, notices=True), args.repeat)
    os.environ["SGLANG_PHASETRACE_HISTORY"] = "0"
    store.forget()
    without_s, _ = best(lambda: findings.live(view, now, th, notices=True), args.repeat)
    print(
        f"watchdog pass (findings.live): {with_s * 1e3:.0f} ms with history, {without_s * 1e3:.0f} ms without "
        f"(history's share {(with_s - without_s) * 1e3:+.0f} ms)"
    )
    if known is not None:
        eta_s, e = best(lambda: usual.eta(view, now, known), args.repeat)
        said = usual.eta_text(e) or "none: every rank ready"
        print(f"ETA for status and the live line: {eta_s * 1e3:.0f} ms ({said})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
