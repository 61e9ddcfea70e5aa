"""Readers' speed with the journal schema of HEAD (the hand-written validator) and of the working tree
(msgspec Structs), measured in one run on the same journals (not a test).

    python scripts/bench_schema.py [--ranks 128] [--spans 270] [--beats 60] [--repeat 5]

Each rank's journal is made with the writers' own constructors (``journal.records``) and written as
the writer writes lines (``journal.writer.dumps``): a process and identity record, ``--spans``
phases (begin, end; an event in one of four; attrs repeating across ranks as a real start's do),
init collectives (enter/exit), ``--beats`` heartbeats (phases with progress, GPU, activity) and a
warning; the launcher's holds the launch, diagnoses (waiting, stacks) and exits. Measured in CPU time,
old and new alternating journal by journal (other processes sharing the machine move any one
timing by tens of percent: alternating shares their load out evenly), the best of ``--repeat``
rounds after one that warms up; the attrs caches are emptied before each round, as in a new
``phasetrace`` process:

- ``bulk read``: every journal read as ``RunView`` reads it (``JournalTail.bulk_pieces``: the bulk
  kinds decoded by msgspec, the rest checked by ``all_valid`` and ``trim``);
- ``read``: every journal read as a plain ``JournalTail.read`` (every kind through ``all_valid``);
- ``non-bulk``: the records of the other kinds alone (heartbeats, process, identity, diagnosis, …)
  through ``all_valid`` and ``trim``: the part the rewrite changed most;
- ``validate``: ``validate`` record by record (a chunk holding a bad line; status files);
- ``snapshot``: one node's snapshot of 64 ranks decoded as node 0 decodes it
  (``channel.node_snapshot.Snapshot``, whose record types are now derived from the schema's).

The script's own copies of the records are frozen out of the garbage collector's way (``gc.freeze``).

HEAD's ``schema.py`` and ``node_snapshot.py`` are read with ``git show`` and loaded as modules of
their packages (their imports are relative); the reader's functions are pointed at one schema or the other.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from sglang_phasetrace.tracing.channel.node_snapshot import Snapshot
from sglang_phasetrace.tracing.journal import reader, records
from sglang_phasetrace.tracing.journal import schema as new_schema
from sglang_phasetrace.tracing.journal.writer import dumps

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "sglang_phasetrace.tracing.journal"
READER_NAMES = ("BULK", "BULK_PREFIX", "KINDS", "all_valid", "bulk_valid", "trim", "validate")
PHASES = [
    "dist.init",
    "model.load_weights",
    "kv_cache.alloc",
    "attention.init",
    "graphs.capture",
    "graphs.capture_bs",
    "scheduler.init",
    "tokenizer.init",
]
GPU = {"util": 90, "mem_used": 10**9, "power_w": 300.5, "sm_clock_mhz": 1980}


def head_module(path: str, package: str) -> types.ModuleType:
    """HEAD's ``path`` as a module of ``package`` (its imports are relative)."""
    source = subprocess.run(
        ["git", "show", f"HEAD:{path}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    name = f"{package}._head_{Path(path).stem}"
    module = types.ModuleType(name)
    module.__package__ = package
    module.__file__ = f"HEAD:{path}"
    sys.modules[name] = module  # msgspec resolves the Structs' annotations through it
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def rank_journal(rank: int, spans: int, beats: int, t0: int) -> list[dict[str, Any]]:
    """One rank's journal, as ``journal.records`` makes it."""
    pid, label, trace = 100_000 + rank, f"tp{rank}", f"{rank + 1:032x}"
    out = [
        records.process(t0, pid, 1, "node0", "run", t0 - 10**9, {"service.name": "sglang", "sglang.tp_rank": rank}),
        records.identity(t0, label, "rank", {"sglang.tp_rank": rank, "sglang.tp_size": 1024}),
    ]
    t = t0
    root = f"{rank:08x}{0:08x}"
    out.append(records.begin(t, root, None, trace, f"rank {label}", {"sglang.phase": "rank"}, "MainThread"))
    for i in range(1, spans):
        t += 1_000_000
        span = f"{rank:08x}{i:08x}"
        phase = PHASES[i % len(PHASES)]
        attrs = {"sglang.phase": phase, "sglang.tp_rank": rank % 8, "sglang.batch_size": i % 36}
        out.append(records.begin(t, span, root, trace, phase, attrs, "MainThread"))
        if i % 4 == 0:
            out.append(records.event(t + 10, span, "shard_loaded", {"done": i % 8, "total": 8}))
        if i % 7 == 0:
            group = f"tp:{rank // 8}[{rank // 8 * 8}..{rank // 8 * 8 + 7}]"
            out.append(records.collective(t + 20, "enter", "barrier", group, i, span=span))
            out.append(records.collective(t + 30, "exit", "barrier", group, i, dur_s=0.001))
        out.append(records.end(t + 500_000, span, "ok", {"sglang.backend": "torch_native"} if i % 9 == 0 else {}))
    for seq in range(beats):
        phases = [
            {"span": root, "name": f"rank {label}", "phase": "rank", "since_s": 2.0 * seq},
            {
                "span": f"{rank:08x}{seq:08x}",
                "name": "model.load_weights",
                "phase": "model.load_weights",
                "since_s": 1.5,
                "progress": {"done": seq % 8, "total": 8, "unit": "shards"},
            },
        ]
        out.append(
            records.heartbeat(
                t0 + seq * 2 * 10**9,
                seq,
                pid,
                label,
                False,
                2.0,
                phases,
                0.1 * seq,
                2_500_000_000,
                40,
                collective={"op": "barrier", "group": "tp", "seq": seq, "since_s": 0.5},
                collectives={"tp": seq, "pp": 1},
                gpu=GPU,
                dt_s=2.0,
                main={"state": "S", "cpu_s": 0.2},
                majflt=0,
                io_b=4096 * seq,
                child_cpu_s=0.0,
            )
        )
    out.append(records.warning(t, "a warning line"))
    out.append(records.end(t + 10**6, root, "ok", {}))
    return out


def launcher_journal(ranks: int, t0: int) -> list[dict[str, Any]]:
    out = [
        records.process(t0, 1, 0, "node0", "run", t0, {"service.name": "sglang"}),
        records.identity(t0, "launcher", "launcher", {}),
        records.launch(
            t0, "f" * 32, local_trace=None, launch_id="L", source="rendezvous", node_rank=0, nnodes=1, rendezvous="h:1"
        ),
    ]
    for i in range(min(ranks, 64)):
        waiting = {f"tp{j}": "barrier tp:0" for j in range(8)}
        out.append(
            records.diagnosis(
                t0 + i, "straggler", f"tp{i}", 100_000 + i, "dist.init", 85.0, "m", waiting, [f"tp{i}.txt"]
            )
        )
        out.append(records.exit(t0 + i, 100_000 + i, "node0", f"tp{i}", None, "SIGKILL"))
    return out


def write_run(directory: Path, ranks: int, spans: int, beats: int) -> tuple[list[Path], list[list[dict[str, Any]]]]:
    t0 = 1_700_000_000 * 10**9
    journals = [launcher_journal(ranks, t0), *(rank_journal(r, spans, beats, t0) for r in range(ranks))]
    paths = []
    for i, recs in enumerate(journals):
        path = directory / f"node0-{i}.jsonl"
        path.write_bytes(b"".join(dumps(r).encode() + b"\n" for r in recs))
        paths.append(path)
    return paths, journals


def use(schema: types.ModuleType) -> None:
    """Point the reader at ``schema``."""
    for name in READER_NAMES:
        setattr(reader, name, getattr(schema, name))


def bulk_read(path: Path) -> int:
    tail = reader.JournalTail(path)
    n = sum(sum(map(len, bulk.values())) + len(rest) for bulk, rest in tail.bulk_pieces(final=True))
    assert not tail.problems, tail.problems
    return n


def plain_read(path: Path) -> int:
    tail = reader.JournalTail(path)
    n = len(tail.read(final=True))
    assert not tail.problems, tail.problems
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=128)
    ap.add_argument("--spans", type=int, default=270)
    ap.add_argument("--beats", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    old = head_module("tracing/journal/schema.py", PACKAGE)
    old_snapshot = head_module("tracing/channel/node_snapshot.py", "sglang_phasetrace.tracing.verdicts")
    schemas = {"old": old, "new": new_schema}
    with tempfile.TemporaryDirectory() as tmp:
        paths, journals = write_run(Path(tmp), args.ranks, args.spans, args.beats)
        flat = [r for recs in journals for r in recs]
        bulk_kinds = {"begin", "end", "event", "collective"}
        others = [[r for r in recs if r["kind"] not in bulk_kinds] for recs in journals]
        n_others = sum(map(len, others))
        size = sum(p.stat().st_size for p in paths)

        def non_bulk(schema: types.ModuleType, i: int) -> int:
            assert schema.all_valid(others[i])
            schema.trim(others[i])
            return len(others[i])

        procs = [  # one node's snapshot of 64 ranks, as ``crossnode.snapshot`` sends: open phases,
            {  # the last heartbeats, collectives
                "records": [r for r in recs if r["kind"] in ("process", "identity")]
                + [r for r in recs if r["kind"] == "begin"][:8]
                + [r for r in recs if r["kind"] == "heartbeat"][-4:]
                + [r for r in recs if r["kind"] == "collective"][-2:],
                "progress_t": recs[0]["t"],
                "ended": {"x": [1, 5]},
            }
            for recs in journals[1:65]
        ]
        snapshot = msgspec.json.encode({"v": 1, "node": 1, "seq": 3, "now": journals[0][0]["t"], "procs": procs})
        n_sent = sum(len(p["records"]) for p in procs)
        snapshots = {old: msgspec.json.Decoder(old_snapshot.Snapshot), new_schema: msgspec.json.Decoder(Snapshot)}
        assert msgspec.to_builtins(snapshots[old].decode(snapshot)) == msgspec.to_builtins(
            snapshots[new_schema].decode(snapshot)
        )

        def node_snapshot(schema: types.ModuleType, i: int) -> int:
            snapshots[schema].decode(snapshot)
            return n_sent

        def validate(schema: types.ModuleType, i: int) -> int:
            assert not any(map(schema.validate, journals[i]))
            return len(journals[i])

        units = len(paths)  # each case is run journal by journal, old and new in turn
        cases: dict[str, tuple[int, Callable[[types.ModuleType, int], int]]] = {
            "bulk read": (units, lambda s, i: bulk_read(paths[i])),
            "read": (units, lambda s, i: plain_read(paths[i])),
            "non-bulk": (units, non_bulk),
            "validate": (units, validate),
            "snapshot": (16, node_snapshot),
        }
        print(
            f"{len(paths)} journals ({args.ranks} ranks x {args.spans} spans, {args.beats} heartbeats), "
            f"{len(flat):,} records ({n_others:,} not of a bulk kind), {size / 2**20:.1f} MiB; "
            f"load {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs"
        )
        gc.collect()
        gc.freeze()  # this script's own records are no reader's heap: collections do not walk them
        best: dict[tuple[str, str], float] = {}
        counts: dict[str, int] = {}
        for round_ in range(args.repeat + 1):  # round 0 warms up (msgspec's type info, bytecode)
            for schema in schemas.values():  # as in a new ``phasetrace`` process
                schema._SPAN_ATTRS_CACHE.clear()
                schema._ATTRS_CACHE.clear()
            for case, (n, fn) in cases.items():
                took, counts[case] = dict.fromkeys(schemas, 0.0), 0
                for i in range(n):  # old and new alternate, unit by unit, first in turn: the load
                    for which in sorted(schemas, reverse=bool(i % 2)):  # others put on the machine is shared
                        use(schemas[which])
                        start = time.process_time()  # CPU time, this process's own
                        done = fn(schemas[which], i)
                        took[which] += time.process_time() - start
                    counts[case] += done
                if round_:
                    for which, t in took.items():
                        best[case, which] = min(best.get((case, which), t), t)
        use(new_schema)
        print(f"{'':10} {'old rec/s':>12} {'new rec/s':>12} {'new/old':>8}  (per CPU second)")
        for case in cases:
            old_rate, new_rate = (counts[case] / best[case, w] for w in ("old", "new"))
            print(f"{case:10} {old_rate:12,.0f} {new_rate:12,.0f} {new_rate / old_rate:8.2f}")
        print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
