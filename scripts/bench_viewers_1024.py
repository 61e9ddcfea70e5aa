"""Time every viewer verb as a user runs it, at 1024 ranks cloned from a real traced start (not a test):
each verb with the run's index (``reader.index``) and without it, against the parse floor.

    python scripts/make_tiny_model.py /tmp/tiny
    SGLANG_PHASETRACE_DIR=/tmp/runs PYTHONPATH=sitecustomize_hooks python scripts/start_engine.py /tmp/tiny --tp 2
    python scripts/bench_viewers_1024.py /tmp/runs/<run id> [--ranks 1024] [--copies 10] [--repeat 3] [--before REF]
    python scripts/bench_viewers_1024.py /tmp/runs/<run id> --shared-bench ../shared/bench   # the figure of record

The real run's rank journals (and status files) are cloned to ``--ranks`` ranks, alternating its
ranks as templates, with each span below the rank root repeated ``--copies`` times (fresh span ids,
parents remapped within the copy), as per-batch-size graph capture does on a GPU: ~270 spans per
rank. Its launcher journal is kept. Each verb runs as a new ``phasetrace`` process (start-up
included, output to /dev/null), indexed and un-indexed (``SGLANG_PHASETRACE_INDEX=0``: the journals
are parsed, no index is read or written) in turn, round by round; the best of ``--repeat`` rounds is
shown with its ratio to the floor measured in the same run: reading and parsing every journal line
by line with orjson in one process (the issue's yardstick: ≈ 1.1 s for its 360 MB, so its 2 s goal
is ≈ 1.8 floors). The index is written once first, by the detached writer's own entry point, and its
cost is shown. Bytecode is cached as deployed (one warm-up run per verb writes it).
Machines differ several-fold, and this VM by 2x within an hour (it parsed 178 MB in 0.5-1.4 s);
the floor ratio travels better.

``--before REF``: the same verbs of the code at git ``REF`` too (its tree exported and put first on
``PYTHONPATH``; a copy of the run, indexed by that code), before and after alternating within each
round, so both meet the same moments of a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PID0 = 200000
PID_MARK, RANK_MARK, ID_MARK = 987654321, 987654322, "§§§§"  # placeholders in a rank's template text

GOAL_INDEXED_S, GOAL_PLAIN_S = 1.0, 2.0  # issue 27.4: an indexed run, a live or un-indexed one
VERBS = {
    "help": ["--help"],
    "status": ["status", "{run}", "--once"],
    "timeline": ["timeline", "{run}", "--width", "160"],
    "compare": ["compare", "{run}"],
    "report": ["report", "{run}", "-o", "{out}/report.html"],
    "export jaeger": ["export", "{run}", "--format", "jaeger", "-o", "{out}/jaeger.json"],
    "export otlp-json": ["export", "{run}", "--format", "otlp-json", "-o", "{out}/otlp.json"],
    "export perfetto": ["export", "{run}", "--format", "perfetto", "-o", "{out}/perfetto.json"],
    "bundle": ["bundle", "{run}", "-o", "{out}/bundle.tar.gz"],
}
INDEX = "sglang_phasetrace.tracing.reader.load"  # the index writer's entry point


def rank_template(journal: Path, copies: int) -> tuple[int, str]:
    """The journal's text with its pid, rank number and span-id prefixes as placeholders."""
    records = [json.loads(line) for line in journal.read_bytes().splitlines() if line.strip()]
    pid = next(r["pid"] for r in records if r["kind"] == "process")
    begins = [r for r in records if r["kind"] == "begin"]
    root = next(r["span"] for r in begins if (r.get("attrs") or {}).get("sglang.phase") == "rank")

    def new_id(span: str | None, copy: int) -> str | None:  # unique per rank, as the OS draws them
        return span if span is None else f"{ID_MARK}f{span[5:]}" if span == root else f"{ID_MARK}{copy:x}{span[5:]}"

    out = []
    for r in records:
        if r["kind"] in ("begin", "end", "event") and r["span"] != root:
            for copy in range(copies):
                c = dict(r, span=new_id(r["span"], copy))
                if "parent" in c:
                    c["parent"] = new_id(c["parent"], copy)
                out.append(c)
            continue
        if r["kind"] == "collective" and r.get("span"):
            r = dict(r, span=new_id(r["span"], 0))
        elif r["kind"] in ("begin", "end", "event"):  # the root
            r = dict(r, span=new_id(r["span"], 0))
        out.append(r)
    text = "\n".join(json.dumps(r, separators=(",", ":"), ensure_ascii=False) for r in out) + "\n"
    return pid, text


def placeholders(text: str, pid: int, rank: str) -> str:
    """Mark the template's pid and rank number (``tp0`` -> ``tp<RANK>``) for per-rank substitution."""
    text = text.replace(f'"pid":{pid}', f'"pid":{PID_MARK}')
    text = text.replace(f'"process.pid":{pid}', f'"process.pid":{PID_MARK}')
    text = text.replace(f"vm:{pid}", f"vm:{PID_MARK}").replace(f'"tp{rank}"', f'"tp{RANK_MARK}"')
    for key in ("sglang.tp_rank", "sglang.world_rank", "sglang.gpu_id"):
        text = text.replace(f'"{key}":{rank}', f'"{key}":{RANK_MARK}')
    return text.replace(" tp" + rank + " ", f" tp{RANK_MARK} ")


def clone(source: Path, dest: Path, ranks: int, copies: int) -> None:
    """``dest``: ``source``'s launcher plus ``ranks`` ranks cloned from its rank journals."""
    for sub in ("journal", "status", "stacks"):
        (dest / sub).mkdir(parents=True, mode=0o700)
    templates = []
    for journal in sorted((source / "journal").glob("*.jsonl")):
        head = json.loads(journal.read_bytes().split(b"\n", 2)[1])  # the identity line
        if head.get("role") != "rank":
            shutil.copy(journal, dest / "journal" / journal.name)
            status = source / "status" / f"{journal.stem}.json"
            if status.exists():
                shutil.copy(status, dest / "status" / status.name)
            continue
        pid, text = rank_template(journal, copies)
        rank = head["label"].removeprefix("tp")
        status = source / "status" / f"{journal.stem}.json"
        status_text = status.read_text() if status.exists() else None
        templates.append((placeholders(text, pid, rank), placeholders(status_text, pid, rank) if status_text else None))
    for r in range(ranks):
        text, status = templates[r % len(templates)]
        pid = PID0 + r
        fill = {str(PID_MARK): str(pid), str(RANK_MARK): str(r), ID_MARK: f"{r:04x}"}
        for mark, value in fill.items():
            text = text.replace(mark, value)
            status = status.replace(mark, value) if status else None
        (dest / "journal" / f"vm-{pid}.jsonl").write_text(text)
        if status:
            (dest / "status" / f"vm-{pid}.json").write_text(status)


FLOOR = """
import pathlib, sys, time, orjson
t = time.perf_counter()
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.jsonl")):
    for line in path.read_bytes().splitlines():
        orjson.loads(line)
print(time.perf_counter() - t)
"""


def floor_s(run: Path, repeat: int) -> float:
    """The best of ``repeat`` line-by-line orjson parses of every journal, in a fresh process each."""
    return min(
        float(
            subprocess.run([sys.executable, "-c", FLOOR, str(run / "journal")], capture_output=True, check=True).stdout
        )
        for _ in range(repeat)
    )


def subreaper() -> None:
    """Orphans of the verbs (a split read's helper, which a viewer leaves to end on its own) become
    this process's children, so that their CPU seconds are counted with the verb's (Linux)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds, and CPU seconds of the verb's processes, its helper included (``subreaper``):
    on a shared machine the CPU time says what the verb costs when the wall time says mostly who
    else ran."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    tic = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False, env=env)
    seconds = time.perf_counter() - tic
    while True:  # the verb's helper, ending on its own once the verb is gone
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 3, 4):
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    return seconds, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def export_tree(ref: str, dest: Path) -> Path:
    """The code at git ``ref`` as an importable ``sglang_phasetrace`` package under ``dest``."""
    package = dest / "sglang_phasetrace"
    package.mkdir(parents=True)
    tree = subprocess.run(
        ["git", "archive", ref, "tracing", "patches", "sitecustomize_hooks"],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(package)], input=tree, check=True)
    (package / "__init__.py").touch()
    return dest


def write_index(run: Path, env: dict[str, str]) -> float:
    """The run's index written by the detached writer's own entry point (start-up included): seconds."""
    (run / "index.msgpack").unlink(missing_ok=True)
    seconds = timed([sys.executable, "-m", INDEX, str(run)], env)[0]
    if not (run / "index.msgpack").is_file():
        raise SystemExit(f"{run}: no index written (is every process of the run gone?)")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a real traced run directory (tp >= 1)")
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--copies", type=int, default=10, help="times each span below the rank root appears (< 15)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the best of each verb is shown")
    parser.add_argument("--keep", type=Path, help="build the clone here and keep it (for profiling)")
    parser.add_argument(
        "--shared-bench",
        type=Path,
        metavar="DIR",
        help="clone with DIR/make_big_run.py (../shared/bench: the figure of record, heartbeats kept) instead",
    )
    parser.add_argument("--before", metavar="REF", help="also time the code at this git ref, alternating with this")
    parser.add_argument(
        "--verbs",
        nargs="+",
        choices=list(VERBS),
        default=[v for v in VERBS if v != "bundle"],  # minutes: it redacts every journal line (``--verbs bundle``)
    )
    args = parser.parse_args()
    subreaper()
    phasetrace = str(Path(sys.executable).with_name("phasetrace"))
    # as a pip install has it: bytecode written once (``PYTHONDONTWRITEBYTECODE`` dropped), no index setting
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "SGLANG_PHASETRACE_INDEX")}
    plain_env = {**env, "SGLANG_PHASETRACE_INDEX": "0"}
    with tempfile.TemporaryDirectory(prefix="phasetrace-1024-") as tmp:
        run = args.keep or Path(tmp) / "run"
        if not (run / "journal").is_dir() and args.shared_bench:
            make = args.shared_bench / "make_big_run.py"
            subprocess.run(
                [sys.executable, str(make), str(args.source), str(run), str(args.ranks), str(args.copies)], check=True
            )
        elif not (run / "journal").is_dir():
            clone(args.source, run, args.ranks, args.copies)
        out = Path(tmp) / "out"
        out.mkdir()
        journals = [f for f in (run / "journal").iterdir() if f.suffix == ".jsonl"]
        size = sum(f.stat().st_size for f in journals)
        spans = sum(f.read_bytes().count(b'"kind":"begin"') for f in journals)
        print(f"{args.ranks} ranks, {spans} spans ({spans / args.ranks:.0f} per rank), journals {size / 1e6:.0f} MB")
        writer = write_index(run, env)
        index_mb = (run / "index.msgpack").stat().st_size / 1e6
        print(f"index: {index_mb:.0f} MB, written in {writer:.2f} s by its own process (off every viewer's path)")
        sides = {"after": (run, env, plain_env)}  # the code here; with --before, the code at REF first
        if args.before:
            code = export_tree(args.before, Path(tmp) / "before")
            old = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(code), env.get("PYTHONPATH")]))}
            copy = Path(tmp) / "run-before" / run.name
            shutil.copytree(run, copy, ignore=shutil.ignore_patterns("index.msgpack"))
            took = write_index(copy, old)
            print(f"before ({args.before}): its index written in {took:.2f} s")
            sides = {"before": (copy, old, {**old, "SGLANG_PHASETRACE_INDEX": "0"}), **sides}
        argvs = {
            (name, side): [phasetrace] + [a.format(run=where, out=out) for a in VERBS[name]]
            for name in args.verbs
            for side, (where, _, _) in sides.items()
        }
        for (_, side), argv in argvs.items():  # bytecode written
            timed(argv, sides[side][1])
        modes = [(side, mode) for side in sides for mode in ("indexed", "plain")]
        best = {(name, side, mode): (float("inf"), 0.0) for name in args.verbs for side, mode in modes}
        floors = []
        for round_ in range(args.repeat):  # interleaved: a slow minute of this VM slows both
            floors.append(floor_s(run, 1))
            for name in args.verbs:
                for side, mode in modes if round_ % 2 == 0 else modes[::-1]:
                    _, indexed, plain = sides[side]
                    took = timed(argvs[name, side], indexed if mode == "indexed" else plain)
                    best[name, side, mode] = min(best[name, side, mode], took)
        floor = min(floors)
        rounds = ", ".join(f"{f:.2f}" for f in floors)
        print(f"floor (orjson, line by line, one process): {floor:.2f} s (each round: {rounds})")
        print(f"wall seconds, best of the rounds (cpu: the verb's processes in that run); load {os.getloadavg()}")
        for side in sides:
            print(f"-- {side}" + (f" ({args.before})" if side == "before" else " (this checkout)"))
            head = f"{'verb':<17} {'indexed':>8} {'cpu':>5} {'/ floor':>8} {'/ 1 s':>6}"
            print(f"{head} {'plain':>8} {'cpu':>5} {'/ floor':>8} {'/ 2 s':>6}")
            for name in args.verbs:
                (a, a_cpu), (b, b_cpu) = best[name, side, "indexed"], best[name, side, "plain"]
                print(
                    f"{name:<17} {a:>8.2f} {a_cpu:>5.2f} {a / floor:>8.2f} {a / GOAL_INDEXED_S:>6.2f} "
                    f"{b:>8.2f} {b_cpu:>5.2f} {b / floor:>8.2f} {b / GOAL_PLAIN_S:>6.2f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    os.umask(0o077)
    raise SystemExit(main())
