"""Benchmark: the cross-node channel (``tracing.channel.relay``) at 8 and 64 nodes of 8 ranks, simulated.

A torch ``TCPStore`` master in its own process stands in for world rank 0's store (the one
``init_process_group`` creates at ``--dist-init-addr``). Nodes 1..N-1 are simulated by a few
publisher processes (a machine with 2 cores cannot run 64 launchers), each node with its own
``Relay`` client connection, publishing a synthetic snapshot of its ranks every heartbeat at its own
offset within the beat (real nodes are not in step). This process is node 0: every heartbeat it
publishes its own snapshot, reads everybody else's and decodes them, as its watchdog would.

Snapshot shape: what ``tracing.channel.crossnode.snapshot`` sends, built with ``tracing.journal.records``: per
process (8 ranks + the launcher) a ``process`` and an ``identity`` record, the root and ~6 open
phases as ``begin`` records (``sglang.phase``, a group name, the tp rank), ``--beats`` heartbeats
(each ~4 phases and a collective in flight) and one open collective.

Prints per size: store operations per heartbeat (measured, all nodes), one node's payload
(compressed / raw), what node 0 reads per pass (keys, bytes), its read latency p50/p95 and decode
time, and the store master's CPU (the load the channel puts on rank 0's process). Then, on the
payloads of the last pass, decode + validate per pass before issue 29 (``json.loads`` of the whole
value, then ``schema.validate`` per record) and now (msgspec into ``tracing.channel.node_snapshot.Snapshot``:
types, sizes, ranges, depth; then the records as dicts), and their ratio.

    python scripts/bench_crossnode.py [--sizes 8,64] [--ranks 8] [--seconds 20] [--beats 4]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
MASTER = """
import sys, time
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", int(sys.argv[1]), None, True, wait_for_workers=False)
print("up", flush=True)
time.sleep(3600)
"""
PHASES = (
    ("rank", None),
    ("rank.bootstrap", None),
    ("model_runner.init", None),
    ("dist.init_distributed_environment", "world"),
    ("dist.initialize_model_parallel", "tp"),
    ("model.load_weights", None),
    ("dist.barrier", "tp"),
)


class Counting:
    """Counts the store operations a relay makes (one request/response each on the wire)."""

    def __init__(self, store: Any) -> None:
        self.store, self.ops = store, {}

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.store, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.ops[name] = self.ops.get(name, 0) + 1
            return fn(*args, **kwargs)

        return call


def connect(node: int, nnodes: int, port: int) -> tuple[Any, Counting]:
    from sglang_phasetrace.tracing.channel.relay import Relay

    relay = Relay(f"127.0.0.1:{port}", node, nnodes, timeout_s=5.0, warn=print)
    if not any(relay.connect() for _ in range(5)):  # torch's client now and then needs a second try
        raise SystemExit(f"node {node}: cannot connect to the store at 127.0.0.1:{port}")
    counting = Counting(relay._store)
    relay._store = counting  # the benchmark's own instrumentation
    return relay, counting


class Node:
    """A node's synthetic snapshot: fixed records built once, the live fields moved every beat."""

    def __init__(self, node: int, nnodes: int, ranks: int, beats: int) -> None:
        from sglang_phasetrace.tracing import keys
        from sglang_phasetrace.tracing.journal import records

        self.node, self.seq, self.beats = node, 0, beats
        rnd = random.Random(node)
        hexid = lambda n: "".join(rnd.choice("0123456789abcdef") for _ in range(n))  # noqa: E731
        trace, now = hexid(32), time.time_ns()
        self.procs: list[dict[str, Any]] = []
        self.hb: list[list[dict[str, Any]]] = []
        world = nnodes * ranks
        for local in range(ranks + 1):  # the ranks, then the launcher
            launcher = local == ranks
            rank = node * ranks + local
            label = "launcher" if launcher else f"tp{rank}"
            pid = 1000 + node * 100 + local
            recs: list[dict[str, Any]] = [
                records.process(now - 90_000_000_000, pid, None, f"node-{node}", hexid(16), now - 90_000_000_000, {}),
                records.identity(
                    now - 89_000_000_000,
                    label,
                    "launcher" if launcher else "rank",
                    {}
                    if launcher
                    else {
                        keys.TP_RANK: rank,
                        keys.PP_RANK: 0,
                        keys.DP_RANK: 0,
                        keys.WORLD_RANK: rank,
                        keys.WORLD_SIZE: world,
                        keys.GPU_ID: local,
                        keys.ROLE: "rank",
                        keys.RANK_LABEL: label,
                        keys.NODE_RANK: node,
                        keys.NNODES: nnodes,
                    },
                ),
            ]
            spans = []
            parent = None
            for i, (phase, group) in enumerate(PHASES[: 2 if launcher else None]):
                span = hexid(16)
                attrs: dict[str, Any] = {keys.PHASE: phase, keys.TP_RANK: rank}
                if group:
                    attrs[keys.GROUP_NAME] = f"{group}:0[0..{world - 1}]"
                name = f"{phase} {label}" if phase == "rank" else phase
                recs.append(records.begin(now - (80 - i) * 10**9, span, parent, trace, name, attrs, "MainThread"))
                spans.append((span, name, phase))
                parent = span
            hbs = [self.beat(records, pid, label, spans, now, seq) for seq in range(beats)]
            recs += hbs
            recs.append(records.collective(now - 40 * 10**9, "enter", "barrier", f"tp:0[0..{world - 1}]", 5))
            self.procs.append({"progress_t": now - 40 * 10**9, "records": recs})
            self.hb.append(hbs)

    @staticmethod
    def beat(records: Any, pid: int, label: str, spans: list[tuple[str, str, str]], now: int, seq: int) -> dict:
        phases = [
            {"span": s, "name": n, "phase": p, "since_s": 40.0 + i, "progress": {"loaded": 12 * i}}
            for i, (s, n, p) in enumerate(spans[-4:])
        ]
        return records.heartbeat(
            now,
            seq,
            pid,
            label,
            False,
            2.0,
            phases,
            12.5,
            3 << 30,
            64,
            collective={"op": "barrier", "group": "tp:0[0..63]", "seq": 5, "since_s": 40.1},
            collectives={"barrier": 5, "all_reduce": 2, "broadcast": 1},
            gpu={"util": 0.0, "mem_used": 7.5e10},
            dt_s=2.0,
            main={"state": "S", "cpu_s": 0.01},
            majflt=0,
            io_b=4096,
            child_cpu_s=0.0,
        )

    def tick(self) -> bytes:
        """The next beat's payload: new ``seq``/``now``, each process's heartbeats moved on."""
        from sglang_phasetrace.tracing.channel.relay import encode

        self.seq += 1
        now = time.time_ns()
        for beats in self.hb:
            for i, hb in enumerate(beats):
                hb["t"] = now - (len(beats) - 1 - i) * 2 * 10**9
                hb["seq"] = self.seq * len(beats) + i
                hb["cpu_s"] = round(hb["cpu_s"] + 0.013, 3)
                for ph in hb["phases"]:
                    ph["since_s"] = round(ph["since_s"] + 2.0, 3)
        return encode({"v": 1, "node": self.node, "seq": self.seq, "now": now, "procs": self.procs})


def publisher(args: argparse.Namespace) -> None:
    """Nodes ``args.nodes`` (one process): each its own connection, each publishing every heartbeat
    at its own offset within the beat, until a line (or EOF) on stdin."""
    nodes = [int(n) for n in args.nodes.split(",")]
    sims = {k: Node(k, args.nnodes, args.ranks, args.beats) for k in nodes}
    relays = {k: connect(k, args.nnodes, args.port) for k in nodes}
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    start = time.monotonic()
    due = {k: start + args.heartbeat * k / args.nnodes for k in nodes}
    encode_s, sizes, published = [], [], 0
    while not stop.is_set():
        k = min(due, key=due.__getitem__)
        if stop.wait(max(0.0, due[k] - time.monotonic())):
            break
        t0 = time.perf_counter()
        payload = sims[k].tick()
        encode_s.append(time.perf_counter() - t0)
        sizes.append(len(payload))
        relays[k][0].publish(payload)
        published += 1
        due[k] += args.heartbeat
    beats = (time.monotonic() - start) / args.heartbeat
    ops: dict[str, int] = {}
    for relay, counting in relays.values():
        for name, n in counting.ops.items():
            ops[name] = ops.get(name, 0) + n
        if not relay.connected:
            print(json.dumps({"error": "a simulated node lost its connection"}), flush=True)
    print(json.dumps({"sets_per_beat": published / beats, "ops": ops, "encode_s": encode_s, "sizes": sizes}))


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def decode_validate_before(data: bytes) -> int:
    """What node 0 did per payload before issue 29 (kept here as the baseline): the whole value
    decoded by ``json.loads`` (recursive, unbounded in depth), then each record ``schema.validate``d
    (in ``remote_processes``). Returns the records it would use."""
    from sglang_phasetrace.tracing.journal import schema

    snap = json.loads(zlib.decompressobj().decompress(data, 16 << 20))
    return sum(schema.validate(r) is None for entry in snap.get("procs") or () for r in entry.get("records") or ())


def decode_validate_after(data: bytes) -> int:
    """What node 0 does now: msgspec decodes into the schema (types, sizes, ranges, depth: nothing
    the journal's ``schema.validate`` refuses gets through), then the records as the dicts readers
    use (``crossnode.remote_processes``)."""
    import msgspec
    from sglang_phasetrace.tracing.channel.node_snapshot import Snapshot
    from sglang_phasetrace.tracing.channel.relay import decode

    return sum(len(msgspec.to_builtins(entry.records)) for entry in decode(data, Snapshot).procs)


def decode_validate(payloads: list[bytes], repeat: int = 7) -> tuple[float, float]:
    """Median ms per pass (every payload once) of the path before and now, interleaved, same payloads."""
    before, after = [], []
    assert sum(map(decode_validate_before, payloads)) == sum(map(decode_validate_after, payloads))
    for _ in range(repeat):
        for fn, times in ((decode_validate_before, before), (decode_validate_after, after)):
            t0 = time.perf_counter()
            for data in payloads:
                fn(data)
            times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(before), 1000 * statistics.median(after)


def run(nnodes: int, args: argparse.Namespace) -> dict[str, Any]:
    from sglang_phasetrace.tracing.channel.node_snapshot import Snapshot
    from sglang_phasetrace.tracing.channel.relay import decode

    p = port()
    master = subprocess.Popen([sys.executable, "-c", MASTER, str(p)], stdout=subprocess.PIPE, text=True)
    children: list[subprocess.Popen[str]] = [master]
    try:
        assert master.stdout is not None and master.stdout.readline().strip() == "up"
        mproc = psutil.Process(master.pid)
        c0, w0 = cpu_s(mproc), time.monotonic()
        time.sleep(2.0)
        idle_pct = 100 * (cpu_s(mproc) - c0) / (time.monotonic() - w0)
        others = list(range(1, nnodes))
        groups = [others[i :: args.procs] for i in range(min(args.procs, len(others)))]
        for nodes in groups:
            children.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--publisher",
                        "--port",
                        str(p),
                        "--nodes",
                        ",".join(map(str, nodes)),
                        "--nnodes",
                        str(nnodes),
                        "--ranks",
                        str(args.ranks),
                        "--beats",
                        str(args.beats),
                        "--heartbeat",
                        str(args.heartbeat),
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    cwd=ROOT,
                )
            )
        sim = Node(0, nnodes, args.ranks, args.beats)
        relay, counting = connect(0, nnodes, p)
        deadline = time.monotonic() + 120
        while len(relay.read()) < len(others):  # every simulated node connected and published once
            if time.monotonic() > deadline or any(c.poll() is not None for c in children):
                raise SystemExit(f"{nnodes} nodes: the publishers did not all publish")
            time.sleep(0.2)
        counting.ops.clear()
        c0, w0 = cpu_s(mproc), time.monotonic()
        lat, dec, got_keys, got_bytes, raw_bytes = [], [], [], [], []
        next_t = w0
        passes = 0
        while next_t < w0 + args.seconds:
            time.sleep(max(0.0, next_t - time.monotonic()))
            relay.publish(sim.tick())
            t0 = time.perf_counter()
            got = relay.read()
            lat.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            snaps = [decode(v, Snapshot) for v in got.values()]
            dec.append(time.perf_counter() - t0)
            raw = sum(len(zlib.decompress(v)) for v in got.values())
            assert all(s.node == k for k, s in zip(got, snaps, strict=True))
            got_keys.append(len(got))
            got_bytes.append(sum(map(len, got.values())))
            raw_bytes.append(raw)
            passes += 1
            next_t += args.heartbeat
        wall = time.monotonic() - w0
        master_pct = 100 * (cpu_s(mproc) - c0) / wall
        dv_before, dv_after = decode_validate(list(got.values()))
        pub_ops: dict[str, int] = {}
        sets_per_beat, encode_s, sizes = 0.0, [], []
        for child in children[1:]:
            out, _ = child.communicate("stop\n", timeout=60)
            for line in out.splitlines():
                res = json.loads(line)
                if "error" in res:
                    raise SystemExit(res["error"])
                sets_per_beat += res["sets_per_beat"]
                encode_s += res["encode_s"]
                sizes += res["sizes"]
                for name, n in res["ops"].items():
                    pub_ops[name] = pub_ops.get(name, 0) + n
        reader_ops = sum(counting.ops.values())
        return {
            "nnodes": nnodes,
            "ranks": args.ranks,
            "passes": passes,
            "msgs_per_beat": sets_per_beat + reader_ops / passes,
            "reader_ops": {k: round(v / passes, 2) for k, v in counting.ops.items()},
            "payload": statistics.mean(sizes),
            "payload_raw": raw_bytes[-1] / max(1, got_keys[-1]),
            "keys": statistics.mean(got_keys),
            "bytes": statistics.mean(got_bytes),
            "raw": statistics.mean(raw_bytes),
            "p50": 1000 * statistics.median(lat),
            "p95": 1000 * sorted(lat)[max(0, round(0.95 * len(lat)) - 1)],
            "decode": 1000 * statistics.median(dec),
            "encode": 1000 * statistics.median(encode_s),
            "master": master_pct,
            "idle": idle_pct,
            "dv_before": dv_before,
            "dv_after": dv_after,
            "lost": not relay.connected,
        }
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
            child.wait(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,64", help="node counts, comma-separated")
    ap.add_argument("--ranks", type=int, default=8, help="ranks per node")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured window per size")
    ap.add_argument("--heartbeat", type=float, default=2.0)
    ap.add_argument("--beats", type=int, default=4, help="heartbeats per process in a snapshot")
    ap.add_argument("--procs", type=int, default=4, help="publisher processes")
    ap.add_argument("--publisher", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--nodes", help=argparse.SUPPRESS)
    ap.add_argument("--nnodes", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.publisher:
        publisher(args)
        return
    print(
        f"cross-node channel: {args.ranks} ranks a node, heartbeat {args.heartbeat:g} s, "
        f"{args.beats} heartbeat(s) per process in a snapshot, {args.seconds:g} s measured per size, "
        f"{os.cpu_count()} CPUs"
    )
    rows = [run(int(n), args) for n in args.sizes.split(",")]
    head = (
        "nodes x ranks",
        "msgs/beat",
        "node0 ops/pass",
        "payload KiB (raw)",
        "node0 reads/pass",
        "read p50/p95 ms",
        "decode ms/pass",
        "encode ms/node",
        "master CPU % (idle)",
    )
    table = [
        (
            f"{r['nnodes']} x {r['ranks']}",
            f"{r['msgs_per_beat']:.1f}",
            " ".join(f"{k} {v:g}" for k, v in sorted(r["reader_ops"].items())),
            f"{r['payload'] / 1024:.1f} ({r['payload_raw'] / 1024:.1f})",
            f"{r['keys']:.0f} keys, {r['bytes'] / 1024:.0f} KiB ({r['raw'] / 1024:.0f})",
            f"{r['p50']:.2f} / {r['p95']:.2f}",
            f"{r['decode']:.1f}",
            f"{r['encode']:.2f}",
            f"{r['master']:.2f} ({r['idle']:.2f})",
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(head)]
    print(" | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for row in table:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    print()
    print("decode + validate per pass (node 0, the last pass's payloads), before issue 29 -> now:")
    for r in rows:
        print(
            f"  {r['nnodes']} x {r['ranks']}: {r['dv_before']:.1f} ms -> {r['dv_after']:.1f} ms "
            f"(now / before = {r['dv_after'] / r['dv_before']:.2f})"
        )
    for r in rows:
        if r["lost"]:
            print(f"!! {r['nnodes']} nodes: node 0 lost its connection during the run")


if __name__ == "__main__":
    main()
