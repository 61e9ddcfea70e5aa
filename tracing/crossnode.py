"""Multi-node launches: one launch identity (trace id) for every node, and one view across nodes.

A launch with ``--nnodes N --node-rank k --dist-init-addr HOST:PORT`` runs one launcher per node.

* **Launch identity.** Known at start when the environment names the launch on every node
  (``SGLANG_PHASETRACE_LAUNCH_ID``, else ``SLURM_JOB_ID`` + step + restart count, else
  ``TORCHELASTIC_RUN_ID`` + restart count): the trace id is derived from it, the same on every
  node, and the run directory is named after it (one directory on a shared filesystem). Else it
  is agreed at the rendezvous: node 0's trace id, written to the launch's own store (torch's
  TCPStore at HOST:PORT, created by world rank 0) as soon as that exists; each other node writes a
  ``launch`` record mapping its local trace id to it (readers and exports use the mapping) and
  ``RUN_DIR/launch.json`` so its processes' OTLP exporters send under the launch's id. A node that
  never reaches the rendezvous keeps its own id; its spans carry ``sglang.node_rank`` and
  ``sglang.dist_init_addr`` as resource attributes, so they are still found.
* **One view.** Each node's launcher publishes a snapshot of its processes (identity, open
  phases, the latest heartbeats, collectives in flight: the same records as its journals; of the
  phases that ended, how many per phase and the latest end: whether peers left a rank behind) to that
  store every heartbeat, through its own client connection (``tracing.relay``); node 0 reads every
  other node's and its watchdog diagnoses all ranks as one launch. Times are moved onto node 0's
  clock by the snapshot's own ``now`` at arrival (no comparison across clocks); a node whose
  snapshot stops changing is said once, as a notice, rather than blamed rank by rank.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import files, keys, process_state, records
from .journal import read_regular
from .relay import Relay, decode, encode
from .rundir import ProcessRec, RunView

log = logging.getLogger("sglang_phasetrace")

LAUNCH_FILE = "launch.json"  # RUN_DIR/launch.json: the launch's trace id, for this node's processes
# (variable, the variables appended to it): a job id that names one launch on every node
JOB_IDS = (
    ("SLURM_JOB_ID", ("SLURM_STEP_ID", "SLURM_RESTART_COUNT")),
    ("TORCHELASTIC_RUN_ID", ("TORCHELASTIC_RESTART_COUNT",)),
)
# span attributes a snapshot keeps (the rest of a phase's attributes stay in that node's journal)
_KEPT_ATTRS = frozenset(
    {
        keys.PHASE,
        keys.GROUP_NAME,
        keys.IS_DRAFT,
        keys.SHAPE_INDEX,
        keys.CAPTURE_SHAPES,
        keys.WORLD_SIZE,
        keys.INIT_METHOD,
    }
)
HEARTBEATS_SENT = 4


def launch_from_env(env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(launch id, the variable it came from) when the environment names the launch, else None."""
    env = os.environ if env is None else env
    if env.get(keys.ENV_LAUNCH_ID):
        return env[keys.ENV_LAUNCH_ID], keys.ENV_LAUNCH_ID
    for name, parts in JOB_IDS:
        if env.get(name):
            return ".".join([env[name], *(env.get(p) or "-" for p in parts)]), name
    return None


def trace_id_of(launch_id: str) -> int:
    """The launch's trace id: the same on every node for the same launch id, never 0."""
    digest = hashlib.sha256(b"sglang-phasetrace/launch/" + launch_id.encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1


@dataclass
class Node:
    """This launcher's place in a multi-node launch."""

    rank: int
    nnodes: int
    rendezvous: str | None  # HOST:PORT
    launch_id: str | None = None  # known at start (environment), else agreed at the rendezvous
    source: str = "rendezvous"

    def env_value(self) -> str:
        return f"{self.rank}/{self.nnodes}/{self.source}/{self.rendezvous or ''}"


def node_from_env() -> Node | None:
    """The node a launcher said its processes run on (``SGLANG_PHASETRACE_NODE``:
    ``RANK/NNODES/SOURCE/HOST:PORT``)."""
    parts = os.environ.get(keys.ENV_NODE, "").split("/", 3)
    try:
        rank, nnodes, source, addr = parts
        return Node(int(rank), int(nnodes), addr or None, source=source)
    except ValueError:
        return None


def node_attrs() -> dict[str, Any]:
    """Resource attributes of a process of a multi-node launch (empty on a single node)."""
    node = node_from_env()
    if node is None:
        return {}
    attrs: dict[str, Any] = {keys.NODE_RANK: node.rank, keys.NNODES: node.nnodes}
    if node.rendezvous:
        attrs[keys.DIST_INIT_ADDR] = node.rendezvous
    launch = launch_from_env()
    if launch is not None:
        attrs[keys.LAUNCH_ID] = launch[0]
    return attrs


def begin(attrs: Mapping[str, Any]) -> Node | None:
    """The launcher's entry point was called with these server-args attributes: for a multi-node
    launch, say which node this is (to its processes too) and, when the environment names the
    launch, fix the trace id before the launch root starts. None on a single node."""
    nnodes = attrs.get(keys.NNODES)
    if not isinstance(nnodes, int) or nnodes < 2:
        return None
    rank = attrs.get(keys.NODE_RANK)
    addr = attrs.get(keys.DIST_INIT_ADDR)
    node = Node(rank if isinstance(rank, int) else 0, nnodes, addr if isinstance(addr, str) else None)
    launch = launch_from_env()
    if launch is not None:
        node.launch_id, node.source = launch
    elif os.environ.get(keys.ENV_TRACEPARENT):
        node.source = keys.ENV_TRACEPARENT  # an outer trace every node was started in
    os.environ[keys.ENV_NODE] = node.env_value()
    return node


def mapping_of(run_dir: Path | str | None) -> dict[str, str] | None:
    """This node's ``launch.json`` ({"trace", "local_trace"}) once its launcher learnt the launch's id."""
    if run_dir is None:
        return None
    try:
        data = json.loads(read_regular(Path(run_dir) / LAUNCH_FILE, limit=4096))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("trace"), str) else None


# -- snapshots: what a node tells the others ----------------------------------------------------------


def snapshot(view: RunView, node: int, seq: int, now: int) -> dict[str, Any]:
    """This node's processes as records (the journal's schema), small enough to send every beat."""
    procs = []
    for p in view.processes:
        if p.remote is not None or p.role not in ("rank", "launcher"):
            continue
        recs: list[dict[str, Any]] = [
            records.process(
                p.boot_t or p.last_t,
                p.pid,
                None,
                p.host,
                view.run_id,
                p.boot_t,
                {},
                start_ticks=p.start_ticks,
                boot_id=p.boot_id,
            ),
            records.identity(p.last_t, p.label, p.role, p.identity),
        ]
        root = p.root
        shown = [s for s in p.spans.values() if s.status == "open" or s is root]
        ended = p.ended_phases({s.span_id for s in shown})  # of the phases that ended, what it does not send
        for s in shown:
            attrs = {k: v for k, v in s.attrs.items() if k in _KEPT_ATTRS}
            recs.append(records.begin(s.start, s.span_id, s.parent_id, s.trace_id, s.name, attrs, s.thread))
            if s.end is not None:
                recs.append(records.end(s.end, s.span_id, s.status, {}))
        recs += p.heartbeats[-HEARTBEATS_SENT:]
        recs += [
            records.collective(c["t"], "enter", c["op"], c["group"], c["seq"])
            for c in sorted(p.coll_open.values(), key=lambda c: c["t"])
        ]
        if p.exit is not None:
            recs.append(p.exit)
        procs.append({"progress_t": p.last_progress_t, "records": recs, "ended": ended})
    return {"v": 1, "node": node, "seq": seq, "now": now, "procs": procs}


def remote_processes(snap: dict[str, Any], offset_ns: int, source: str) -> list[ProcessRec]:
    """Another node's snapshot as processes, its times moved onto this host's clock by ``offset_ns``."""
    out = []
    for entry in snap.get("procs") or ():
        proc = ProcessRec(Path(source) / "remote.jsonl", remote=source)
        told = []
        for r in entry.get("records") or ():
            if records.validate(r) is not None:
                continue
            r = dict(r, t=r["t"] + offset_ns)
            if r["kind"] == "process" and isinstance(r.get("boot_t"), int):
                r["boot_t"] += offset_ns
            if r["kind"] == "exit":
                told.append(r)
                continue
            proc.apply(r)
        if not proc.pid:
            continue
        proc.path = Path(source) / f"{proc.host}-{proc.pid}.jsonl"
        if isinstance(entry.get("progress_t"), int):
            proc.last_progress_t = entry["progress_t"] + offset_ns
        proc.dropped = _ended(entry.get("ended"), offset_ns)
        proc.exit = next((r for r in told if r.get("pid") == proc.pid), None)
        out.append(proc)
    return out


def _ended(value: Any, offset_ns: int) -> dict[str, list[int]]:
    """A snapshot's phases that ended and were not sent ({phase: [how many, latest end]}), moved onto
    this clock (whether its peers left a rank behind: ``ProcessRec.ended``); a malformed one is not used."""
    if not isinstance(value, dict):
        return {}
    out = {}
    for phase, item in value.items():
        if (
            isinstance(phase, str)
            and isinstance(item, list)
            and len(item) == 2
            and all(type(x) is int and x >= 0 for x in item)
        ):
            out[phase] = [item[0], item[1] + offset_ns]
    return out


class CrossNode:
    """A node launcher's side of the cross-node channel: a thread that talks to the launch's store
    (connect, agree on the launch's trace id, publish this node's snapshot, and on node 0 read the
    others'), and ``exchange`` for the watchdog's pass. Stops at this node's ready."""

    def __init__(self, node: Node, run_dir: Path, trace: str, interval: float, stale_s: float) -> None:
        self.node, self.run_dir, self.trace = node, run_dir, trace
        self.interval, self.stale_s = interval, stale_s
        self.relay = Relay(node.rendezvous or "", node.rank, node.nnodes, warn=_warn_once)
        self.lock = threading.Lock()
        self.outbox: bytes | None = None
        self.inbox: dict[int, bytes] = {}
        self.agreed: dict[str, Any] | None = None
        self.seq = itertools.count(1)  # two threads take numbers (a pass, and the last word): next() is atomic
        self.seen: dict[int, tuple[int, int]] = {}  # node -> (its seq, local time it arrived)
        self.offsets: dict[int, int] = {}
        self.payloads: dict[int, bytes] = {}  # node -> its latest payload, as received
        self.stale_said: set[int] = set()
        self.stop = threading.Event()
        self.write: Callable[[dict], None] | None = None  # the launcher's journal
        if node.launch_id is not None or node.source == keys.ENV_TRACEPARENT:
            self.agreed = {"trace": trace, "launch_id": node.launch_id, "source": node.source}

    def start(self, write: Callable[[dict], None]) -> None:
        self.write = write
        if self.agreed is not None:
            self._record(self.agreed)
        if self.node.rendezvous:
            threading.Thread(target=self.run, name="phasetrace-relay", daemon=True).start()

    def run(self) -> None:
        while True:
            finishing = self.stop.is_set()
            try:
                if finishing:  # this node is ready: its last snapshot says so (read here, off the caller)
                    snap = snapshot(RunView(self.run_dir).refresh(), self.node.rank, next(self.seq), time.time_ns())
                    with self.lock:
                        self.outbox = encode(snap)
                self.pass_once()
            except Exception as exc:  # never let the thread die; said once
                if process_state.say_once(("relay", "pass")):
                    log.warning("sglang-phasetrace: cross-node relay pass failed: %r", exc)
            if finishing:
                break
            self.stop.wait(self.interval)
        self.relay.close()

    def pass_once(self) -> None:
        if not self.relay.connected and not self.relay.connect():
            return
        if self.agreed is None:
            proposal = {"trace": self.trace, "launch_id": None, "source": "rendezvous"}
            agreed = self.relay.agree(proposal)
            if agreed is not None and isinstance(agreed.get("trace"), str):
                self.agreed = agreed
                self._record(agreed)
        with self.lock:
            payload, self.outbox = self.outbox, None
        if payload is not None:
            self.relay.publish(payload)
        if self.node.rank == 0:
            got = self.relay.read()
            with self.lock:
                self.inbox.update(got)

    def _record(self, agreed: dict[str, Any]) -> None:
        """The ``launch`` record, and ``launch.json`` for this node's processes' exporters."""
        trace = agreed["trace"]
        local = self.trace if trace != self.trace else None
        rec = records.launch(
            time.time_ns(),
            trace,
            local_trace=local,
            launch_id=agreed.get("launch_id"),
            source=str(agreed.get("source") or "rendezvous"),
            node_rank=self.node.rank,
            nnodes=self.node.nnodes,
            rendezvous=self.node.rendezvous,
        )
        if self.write is not None:
            self.write(rec)
        if local is not None:
            try:
                files.write_atomic(
                    self.run_dir / LAUNCH_FILE, json.dumps({"trace": trace, "local_trace": local}).encode()
                )
            except OSError as exc:
                files.say_once(self.run_dir / LAUNCH_FILE, exc, "spans are sent under this node's own trace id")

    def exchange(self, view: RunView, now: int) -> list[str]:
        """One watchdog pass: offer this node's snapshot; put the other nodes' into ``view``.
        Returns notices (a node that stopped reporting), each once."""
        payload = encode(snapshot(view, self.node.rank, next(self.seq), now))
        with self.lock:
            self.outbox = payload
            inbox, self.inbox = self.inbox, {}
        for node, data in inbox.items():
            if self.payloads.get(node) == data:  # unchanged since last pass: nothing to decode
                continue
            self.payloads[node] = data
            try:
                snap = decode(data)
                seq = int(snap["seq"])
                if self.seen.get(node, (None, 0))[0] == seq:
                    continue
                self.seen[node] = (seq, now)
                self.offsets[node] = now - int(snap["now"])
                view.set_remote(f"node-{node}", remote_processes(snap, self.offsets[node], f"node-{node}"))
                self.stale_said.discard(node)
            except (KeyError, TypeError, ValueError) as exc:
                if process_state.say_once(("relay", "decode", node)):
                    log.warning("sglang-phasetrace: node-%s's snapshot not used: %r", node, exc)
        notices = []
        for node, (_, t) in self.seen.items():
            age = (now - t) / 1e9
            procs = view.remote.get(f"node-{node}") or []
            done = all(p.ready for p in procs if p.role == "rank")
            if age > self.stale_s and node not in self.stale_said and not done:
                self.stale_said.add(node)
                notices.append(
                    f"node-{node} stopped reporting {age:.0f} s ago (its launcher, or the network to "
                    f"{self.node.rendezvous}): its ranks' last known state is shown, not judged"
                )
                view.set_remote(f"node-{node}", [p for p in procs if p.role == "launcher"])
        return notices

    def finish(self) -> None:
        """At ready: the relay thread sends this node's last snapshot (its ranks ready), then stops."""
        self.stop.set()


def _warn_once(message: str) -> None:
    if process_state.say_once(("relay", message)):
        log.warning("%s", message)
