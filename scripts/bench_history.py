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

    python scripts/bench_history.py --fleet 100000 [--dsn postgresql://… | --postgres]

A fleet's history: ``--fleet`` starts (200 of each launch, 60 phases each, spread over 64 hosts)
in SQLite and in PostgreSQL (``--dsn``, or ``--postgres``: a server of its own on loopback, as the
tests start one: ``tests/pg_server.py``). Printed, best and median of ``--repeat`` with the load
average beside them: what the launcher pays, all of it off the start's path — the watchdog's one
read of its launch's usual times, per phase and per host (``history.live.fleet``, with the cache
dropped: once per process; the launch's kept row, made as the history is filled), and the keeper
recording a start as it ends (``store.put``: upsert, retention, the launch's kept row).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_viewers_1024 import clone


def best(fn, repeat: int) -> tuple[float, object]:
    times, got = timed(fn, repeat)
    return min(times), got


def timed(fn, repeat: int) -> tuple[list[float], object]:
    """Each of ``repeat`` calls' seconds, and the last answer."""
    times, got = [], None
    for _ in range(repeat):
        tic = time.perf_counter()
        got = fn()
        times.append(time.perf_counter() - tic)
    return times, got


def spread(times: list[float]) -> str:
    """``best 4.1 ms, median 4.6 ms`` (of ``n``), with the load average the figures were taken at."""
    load = os.getloadavg()[0]
    return (
        f"best {min(times) * 1e3:.1f} ms, median {statistics.median(times) * 1e3:.1f} ms of {len(times)} "
        f"(load {load:.2f})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, nargs="?")
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fleet", type=int, metavar="STARTS", help="a fleet's history of STARTS recorded starts")
    parser.add_argument("--dsn", help="the fleet's PostgreSQL (a database of its own: its tables are filled)")
    parser.add_argument("--postgres", action="store_true", help="start a PostgreSQL server of its own for --fleet")
    args = parser.parse_args()
    if args.fleet:
        return fleet(args)
    if args.run is None:
        parser.error("a run directory, or --fleet STARTS")
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


PER_LAUNCH, PHASES, HOSTS = 200, 60, 64


def _docs(n: int, t0: float) -> Iterator[dict]:
    """``n`` starts as ``history export`` writes them: ``PER_LAUNCH`` per launch, on ``HOSTS`` hosts."""
    import base64
    import random
    import zlib

    rng = random.Random(49)
    labels = base64.b64encode(zlib.compress(b'["launcher", "tp0", "tp1"]')).decode()
    for i in range(n):
        launch, host = i // PER_LAUNCH, f"node{i % HOSTS:02d}"
        run_id = f"run{i:06d}"
        phases = [
            {
                "run_id": run_id,
                "phase": f"phase.{k:02d}",
                "role": "rank",
                "depth": 1 + k % 3,
                "start_s": k * 0.5,
                "processes": 2,
                "count": 1,
                "open": 0,
                "max_s": (s := rng.uniform(0.01, 5.0)),
                "median_s": s * 0.9,
                "min_s": s * 0.8,
                "slowest": "tp1",
                "per_rank": None,
            }
            for k in range(PHASES)
        ]
        start = {
            "run_id": run_id,
            "fingerprint": f"{launch:012x}",
            "started": t0 + i,
            "ended": t0 + i + 30,
            "outcome": "ready",
            "total_s": 30.0,
            "processes": 3,
            "host": host,
            "recorded": t0 + i + 30,
            "labels": labels if i >= n - 50 else None,
        }
        fp = {"id": f"{launch:012x}", "summary": f"model-{launch} · tp2", "fields": {"launch": launch}}
        yield {"fingerprint": fp, "start": start, "phases": phases}


_made = [0]


def _put(store, measured, where, out: Path, fp, rows, t: float) -> object:
    """One new start recorded (upsert and retention), as the keeper does as a start ends."""
    _made[0] += 1
    started = int((t + _made[0]) * 1e9)
    m = measured(f"new{_made[0]}", started, started + 30 * 10**9, "ready", ["tp0", "tp1"], rows, "node00")
    return store.put(store.Prepared(out, fp, m), where)


def fleet(args: argparse.Namespace) -> int:
    from sglang_phasetrace.tracing.history import live, store, transfer
    from sglang_phasetrace.tracing.history.fingerprint import Fingerprint
    from sglang_phasetrace.tracing.history.measure import Measured, PhaseRow
    from sglang_phasetrace.tracing.history.where import Dsn

    store.KEEP_PER_FINGERPRINT, store.KEEP_ALL = PER_LAUNCH, args.fleet  # SQLite keeps them all too
    store.FLEET_KEEP = (PER_LAUNCH, args.fleet, store.FLEET_KEEP[2])
    out = Path(tempfile.mkdtemp(prefix="bench-history-fleet-"))
    out.chmod(0o700)
    server = None
    places: list[tuple[str, Path | Dsn]] = [("SQLite", out / "history.sqlite")]
    t0 = time.time() - args.fleet - 3600
    fid = f"{(args.fleet - 1) // PER_LAUNCH:012x}"  # the newest launch: PER_LAUNCH starts on HOSTS hosts
    fields = {
        "model": {"path": "/models/x", "config": "0123456789abcdef"},
        "layout": {"tp": 2, "pp": 1, "dp": 1, "ep": 1, "nnodes": 1},
        "device": {"kind": "cuda", "model": "NVIDIA H100", "count": 2},
        "versions": {"sglang": "0.5.23", "torch": "2.9.0"},
        "args": {},
    }
    fp = Fingerprint(fields, fid)
    rows = [
        PhaseRow(f"phase.{k:02d}", "rank", 1 + k % 3, k * 0.5, {"tp0": 1.0 + k / 10, "tp1": 1.1 + k / 10}, 1)
        for k in range(PHASES)
    ]
    from sglang_phasetrace.tracing.history import keeper

    try:
        if args.postgres and not args.dsn:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
            import pg_server

            server = pg_server.start()
            if server is None:
                print("no PostgreSQL server installed (scripts/install-test-tools.sh)")
            else:
                args.dsn = server.create("fleet")
        if args.dsn:
            places.append(("PostgreSQL", Dsn(args.dsn)))
        os.environ["SGLANG_PHASETRACE_HISTORY"] = places[-1][1].conninfo if args.dsn else str(places[0][1])
        on_path_s, _ = best(lambda: keeper.off(out), 1000)
        print(f"on the start's path: keeper.off {on_path_s * 1e6:.1f} µs (nothing connects, nothing is read)")
        for name, where in places:
            tic = time.perf_counter()
            transfer.load(_docs(args.fleet, t0), where)
            fill_s = time.perf_counter() - tic

            def read(where: Path | Dsn = where) -> object:
                store.forget()
                return live.fleet(fid, where, host="node00")

            reads, got = timed(read, args.repeat)
            puts, _ = timed(
                lambda where=where: _put(store, Measured, where, out, fp, rows, t0 + args.fleet), args.repeat
            )
            phases = len(got.usuals)
            hosts = len({h for per in got.seconds.values() for h in per})
            print(
                f"{name}: {args.fleet} starts ({fill_s:.0f} s to fill); the watchdog's read of its launch "
                f"({phases} phases, {hosts} hosts): {spread(reads)}; recording a start: {spread(puts)}"
            )
    finally:
        if server is not None:
            pg_server.stop(server)
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
