"""Synthetic run directories shaped like a traced SGLang start, for CLI tests and the benchmark.

``build_run`` writes what the tracing runtime writes (journals, status files, stack files) without
starting SGLang: a launcher and N ranks, each with the real phase tree (bootstrap, distributed
init with its comm groups, target and draft weights, memory pools, attention, graph capture),
padded with graph-capture passes to the requested span count. Options make one rank slow, leave
one rank stuck mid-phase (stalled run: open phases, a diagnosis record, a stack dump), or damage
journals (a corrupt line, a last line cut by ``kill -9``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_phasetrace.tracing import keys
from sglang_phasetrace.tracing.journal import records

HOST = "node0"
LAUNCHER_PID = 1000
S = 1_000_000_000  # ns per second
STALL_PHASE = "dist.init_process_group"
PEER_WAIT_PHASE = "dist.group_coordinator"  # where healthy peers wait for the stuck rank
FAIL_MESSAGE = "CUDA out of memory while loading weights"

# (phase, attrs, seconds, children); seconds are a rank's own time before jitter.
Tree = tuple[str, dict[str, Any], float, list]
RANK_TREE: list[Tree] = [
    ("rank.bootstrap", {}, 2.0, []),
    (
        "dist.init",
        {},
        0.1,
        [
            (
                "dist.init_process_group",
                {"sglang.backend": "nccl"},
                0.3,
                [("dist.group_coordinator", {"sglang.group_name": "world"}, 0.05, [])],
            ),
            (
                "dist.model_parallel_groups",
                {},
                0.05,
                [
                    ("dist.group_coordinator", {"sglang.group_name": "tp"}, 0.2, []),
                    ("dist.group_coordinator", {"sglang.group_name": "pp"}, 0.02, []),
                ],
            ),
        ],
    ),
    (
        "scheduler.init_tp_worker",
        {},
        0.1,
        [
            (
                "model_runner.init",
                {"sglang.is_draft": False},
                0.2,
                [
                    (
                        "model.load_weights",
                        {"sglang.is_draft": False},
                        0.1,
                        [
                            (
                                "model.loader",
                                {"sglang.loader": "DefaultModelLoader"},
                                0.1,
                                [("model.weights_iterator", {"sglang.shards": 4}, 4.0, [])],
                            )
                        ],
                    )
                ],
            )
        ],
    ),
    (
        "scheduler.init_draft_worker",
        {},
        0.05,
        [
            (
                "eagle.worker_init",
                {"sglang.speculative_num_steps": 3},
                0.05,
                [
                    (
                        "model_runner.init",
                        {"sglang.is_draft": True},
                        0.1,
                        [("model.load_weights", {"sglang.is_draft": True}, 0.5, [])],
                    )
                ],
            )
        ],
    ),
    ("scheduler.init_memory_pools", {}, 0.05, [("kv_cache.alloc", {"sglang.is_draft": False}, 1.0, [])]),
    ("scheduler.init_attention_backends", {}, 0.05, [("attention.init", {"sglang.is_draft": False}, 0.2, [])]),
    ("scheduler.init_cuda_graphs", {}, 0.05, [("graph.init", {}, 0.05, [])]),  # capture passes added here
]


@dataclass
class SyntheticRun:
    path: Path
    labels: list[str]  # rank labels, in rank order
    pids: dict[str, int]  # label -> pid (launcher included)
    stalled: str | None = None
    slow: str | None = None  # the rank made slowest at loading weights
    broken: list[str] = field(default_factory=list)  # "file:line" the journals' damage is at


class _Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[str] = []
        self.ids = 0

    def write(self, record: dict[str, Any]) -> None:
        self.lines.append(json.dumps(record, separators=(",", ":")))

    def span_id(self, salt: int) -> str:
        self.ids += 1
        return format((salt * 1_000_003 + self.ids) & (2**64 - 1) or 1, "016x")

    def save(self, tail: str = "") -> None:
        self.path.write_text("\n".join(self.lines) + "\n" + tail)


def _process(
    j: _Journal,
    t: int,
    pid: int,
    label: str,
    role: str,
    run_id: str,
    ident: dict[str, Any],
    host: str = HOST,
    launcher_pid: int = LAUNCHER_PID,
) -> None:
    attrs = {"host.name": host, "process.pid": pid, "sglang.role": role, "sglang.rank": label, **ident}
    ppid = launcher_pid if role == "rank" else 1
    j.write(records.process(t, pid, ppid, host, run_id, t, {"service.name": "sglang", **attrs}))
    j.write(records.identity(t, label, role, attrs))


def build_run(
    path: Path,
    ranks: int = 2,
    spans: int = 40,
    *,
    slow_rank: int | None = None,
    stalled_rank: int | None = None,
    failed_rank: int | None = None,
    corrupt: bool = False,
    same_ids: bool = False,
    end_ns: int | None = None,
) -> SyntheticRun:
    """Write a run directory at ``path`` whose latest record is at ``end_ns`` (default: now).

    ``failed_rank`` raises in its target weight loading; ``same_ids`` gives every rank the same
    span ids (as ranks that seed Python's ``random`` identically draw them)."""
    end_ns = end_ns or time.time_ns()
    run_id = path.name
    for sub in ("journal", "status", "stacks"):
        (path / sub).mkdir(parents=True, exist_ok=True)
    trace = format(0x5EED << 64 | ranks, "032x")
    labels = [f"tp{r}" for r in range(ranks)]
    pids = {"launcher": LAUNCHER_PID, **{label: 2000 + r for r, label in enumerate(labels)}}
    duration = (90 if stalled_rank is not None else 30) * S
    t0 = end_ns - duration
    launcher = _Journal(path / "journal" / f"{HOST}-{LAUNCHER_PID}.jsonl")
    _process(launcher, t0, LAUNCHER_PID, "launcher", "launcher", run_id, {})
    root = launcher.span_id(1 << 40)  # unlike any rank's (``same_ids``: theirs repeat)
    wait = launcher.span_id(1 << 40)
    launcher.write(
        records.begin(
            t0,
            root,
            None,
            trace,
            "sglang.launch",
            {keys.PHASE: keys.PHASE_LAUNCH_ENGINE, "sglang.tp_size": ranks},
            "MainThread",
        )
    )
    launcher.write(
        records.begin(
            t0 + S // 2, wait, root, trace, "launch.wait_ranks", {keys.PHASE: "launch.wait_ranks"}, "MainThread"
        )
    )
    result = SyntheticRun(path, labels, pids, slow=labels[slow_rank] if slow_rank is not None else None)
    latest = t0
    for r, label in enumerate(labels):
        pid = pids[label]
        j = _Journal(path / "journal" / f"{HOST}-{pid}.jsonl")
        start = t0 + S + r * 1_000_000
        _process(j, start, pid, label, "rank", run_id, {"sglang.tp_rank": r, "sglang.gpu_id": r % 8})
        stuck = r == stalled_rank
        waiting = stalled_rank is not None and not stuck
        t, opened = _rank(
            j,
            trace,
            root,
            label,
            0 if same_ids else r,
            start,
            spans,
            slow=r == slow_rank,
            stuck=stuck,
            waiting=waiting,
            fail=r == failed_rank,
        )
        last_beat = (t - S if stuck else end_ns - S) if opened else t
        beat = _heartbeat(pid, label, last_beat, opened, ready=not opened)
        j.write(beat)
        (path / "status" / f"{HOST}-{pid}.json").write_text(json.dumps(beat))
        latest = max(latest, t)
        tail = ""
        if corrupt and r == 0:
            j.lines.insert(5, '{"kind": "begin", "t": 12, "span": "broken')
            result.broken.append(f"{j.path}:6")
        if corrupt and stuck:  # the process was killed in the middle of writing a line
            tail = '{"kind":"event","t":1,"span":"'
            result.broken.append(f"{j.path}:{len(j.lines) + 1}")
        j.save(tail)
    if stalled_rank is None:
        launcher.write(records.end(latest + S // 10, wait, "ok", {}))
        launcher.write(records.end(latest + S // 5, root, "ok", {}))
    else:
        result.stalled = label = labels[stalled_rank]
        pid = pids[label]
        stack = path / "stacks" / f"{HOST}-{pid}.txt"
        stack.write_text(
            f"\n=== stacks of pid {pid} requested: stalled in {STALL_PHASE} ===\n"
            "Thread 0x00007f (most recent call first):\n"
            '  File "torch/distributed/distributed_c10d.py", line 1710 in init_process_group\n'
            '  File "sglang/srt/distributed/parallel_state.py", line 1312 in '
            "init_distributed_environment\n"
        )
        peers = {lab: PEER_WAIT_PHASE for lab in labels if lab != label}
        message = f"{label} has been in {STALL_PHASE} for 85 s while {len(peers)} peers wait in {PEER_WAIT_PHASE}"
        launcher.write(
            records.diagnosis(end_ns, "straggler", label, pid, STALL_PHASE, 85.0, message, peers, [str(stack)])
        )
    launcher.save()
    return result


def _rank(
    j: _Journal,
    trace: str,
    parent: str,
    label: str,
    r: int,
    start: int,
    spans: int,
    *,
    slow: bool,
    stuck: bool,
    waiting: bool,
    fail: bool,
) -> tuple[int, bool]:
    """Write one rank's phases from ``start``; return the time reached and whether it stopped open."""
    root = j.span_id(r)
    j.write(
        records.begin(start, root, parent, trace, f"rank {label} @ {HOST}", {keys.PHASE: keys.PHASE_RANK}, "MainThread")
    )
    budget = [spans - 1]
    jitter = 1.0 + (r % 7) * 0.01
    error = records.error("RuntimeError", FAIL_MESSAGE, "Traceback (most recent call last):\n  ...")

    def walk(items: list[Tree], parent_id: str, t: int) -> tuple[int, str]:
        """Returns the time reached and how it stopped: ``done``, ``open`` (stuck) or ``error``."""
        for name, attrs, own_s, children in items:
            if budget[0] <= 0:
                return t, "done"
            budget[0] -= 1
            sid = j.span_id(r)
            j.write(records.begin(t, sid, parent_id, trace, name, {keys.PHASE: name, **attrs}, "MainThread"))
            if (stuck and name == STALL_PHASE) or (waiting and attrs.get(keys.GROUP_NAME) == "tp"):
                return t + int(2 * S), "open"
            t += int(own_s * jitter * (3.0 if slow and name == "model.weights_iterator" else 1.0) * S / 2)
            if name == "model.weights_iterator":
                j.write(
                    records.event(t, sid, "shard_loaded", {"done": 4, "total": 4, "shard": "model-00004.safetensors"})
                )
            if name == "graph.init":
                children = [
                    ("graph.capture_bs", {"sglang.batch_size": bs}, 0.002, []) for bs in range(1, max(1, budget[0]) + 1)
                ]
            state = "error" if fail and name == "model.load_weights" else "done"
            if state == "done":
                t, state = walk(children, sid, t)
            if state == "open":
                return t, state
            t += int(own_s * jitter * S / 2)
            failed = state == "error"
            j.write(records.end(t, sid, "error" if failed else "ok", {}, error if failed else None))
            if state == "error":
                return t, state
        return t, "done"

    t, state = walk(RANK_TREE, root, start)
    if state != "open":
        t += S // 100
        failed = state == "error"
        j.write(records.end(t, root, "error" if failed else "ok", {}, error if failed else None))
    return t, state == "open"


def _heartbeat(pid: int, label: str, t: int, busy: bool, ready: bool) -> dict[str, Any]:
    phases, collective = [], None
    if busy:
        phases = [
            {
                "name": "dist.init",
                "phase": "dist.init",
                "since_s": 2.0,
                "progress": {"done": 1, "total": 2, "unit": "groups"},
            }
        ]
        collective = {"op": "barrier", "group": "tp", "seq": 4, "since_s": 2.0}
    return records.heartbeat(t, 3, pid, label, ready, 5.0, phases, 0.4, 2_500_000_000, 12, collective=collective)


@dataclass
class NodeRun:
    path: Path
    host: str
    labels: list[str]  # rank labels (``tp2``), in rank order
    pids: dict[str, int]  # label -> pid (``launcher`` included)
    trace: str  # the trace id this node's spans started with


def build_node(
    path: Path,
    node: int,
    nnodes: int,
    *,
    ranks: int = 2,
    spans: int = 20,
    local_trace: str,
    agreed_trace: str | None = None,
    skew_s: float = 0.0,
    open_rank: int | None = None,
    end_ns: int | None = None,
) -> NodeRun:
    """One node's run directory of a multi-node launch, as that node's launcher writes it: its
    launcher (``launcher`` on node 0, ``launcher-node1`` …) and its ``ranks`` ranks (tp ranks
    ``node * ranks`` on), every identity stamped with ``sglang.node_rank``/``sglang.nnodes``.

    Its spans carry ``local_trace``; its launcher's ``launch`` record maps it to ``agreed_trace``
    (None: the node never learnt the launch's id, no ``launch`` record). Its host's clock is
    ``skew_s`` ahead of the caller's (every time shifted); ``open_rank`` (an index on this node)
    stays in its distributed init, still running."""
    end_ns = (end_ns or time.time_ns()) + int(skew_s * S)
    host = f"node{node}-host"
    run_id = path.name
    for sub in ("journal", "status", "stacks"):
        (path / sub).mkdir(parents=True, exist_ok=True)
    node_attrs = {keys.NODE_RANK: node, keys.NNODES: nnodes}
    launcher_pid = 10_000 * (node + 1)
    labels = [f"tp{node * ranks + r}" for r in range(ranks)]
    pids = {"launcher": launcher_pid, **{label: launcher_pid + 1 + r for r, label in enumerate(labels)}}
    t0 = end_ns - 30 * S
    launcher = _Journal(path / "journal" / f"{host}-{launcher_pid}.jsonl")
    launcher_label = f"launcher-node{node}" if node else "launcher"
    _process(launcher, t0, launcher_pid, launcher_label, "launcher", run_id, node_attrs, host, launcher_pid)
    root = launcher.span_id(1000 + node)
    launcher.write(
        records.begin(
            t0, root, None, local_trace, "sglang.launch", {keys.PHASE: keys.PHASE_LAUNCH_ENGINE}, "MainThread"
        )
    )
    if agreed_trace is not None:
        launcher.write(
            records.launch(
                t0 + S // 2,
                agreed_trace,
                local_trace=local_trace if local_trace != agreed_trace else None,
                launch_id=None,
                source="rendezvous",
                node_rank=node,
                nnodes=nnodes,
                rendezvous="127.0.0.1:29500",
            )
        )
    latest = t0
    for r, label in enumerate(labels):
        pid = pids[label]
        tp = node * ranks + r
        j = _Journal(path / "journal" / f"{host}-{pid}.jsonl")
        start = t0 + S + r * 1_000_000
        ident = {"sglang.tp_rank": tp, "sglang.gpu_id": r, **node_attrs}
        _process(j, start, pid, label, "rank", run_id, ident, host, launcher_pid)
        stuck = r == open_rank
        t, opened = _rank(
            j, local_trace, root, label, tp + 1, start, spans, slow=False, stuck=stuck, waiting=False, fail=False
        )
        last_beat = end_ns - S if opened else t
        beat = _heartbeat(pid, label, last_beat, opened, ready=not opened)
        j.write(beat)
        (path / "status" / f"{host}-{pid}.json").write_text(json.dumps(beat))
        j.save()
        latest = max(latest, t)
    if open_rank is None:
        launcher.write(records.end(latest + S // 5, root, "ok", {}))
    launcher.save()
    return NodeRun(path, host, labels, pids, local_trace)
