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
  phases that ended, how many per phase and the latest end: whether peers left a rank behind; what
  a rank its watchdog suspects waits on, read from its own ``/proc``: ``verdicts.evidence``) to that
  store every heartbeat, through its own client connection (``tracing.channel.relay``); node 0 reads every
  other node's and its watchdog diagnoses all ranks as one launch. Times are moved onto node 0's
  clock by the snapshot's own ``now`` at arrival (no comparison across clocks); a node whose
  snapshot stops changing is said once, as a notice, rather than blamed rank by rank.
* **Trust.** Anyone who can reach the store can write its keys. A snapshot is decoded into one
  schema (``tracing.channel.node_snapshot``: types, sizes, depth, ranges) and must speak for its own node only:
  this node's processes are judged from its own journals, never from a report; a snapshot naming
  this node's host, a host another node reported from, or a process (host and pid, or label) of
  this node or of another node's report is not used. A verdict names its processes by host, pid
  and source (``reader.view.ProcId``): a reported process that shares a pid with one of this host's
  is never mistaken for it, and only processes read from this host's journals are signalled. Each
  refusal is one warning naming the node, never a lost pass. What is left to a store writer: false
  verdicts about the node it claims to be, labelled with that node (``docs/multinode-channel.md``,
  "Trust")."""

from __future__ import annotations

import ipaddress
import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from .. import files, keys, other_processes, process_state
from ..journal import records
from ..journal.waits_on import Evidence, from_builtins
from ..reader.view import ProcessRec, RunView, node_of
from ..recorder.launch import LAUNCH_FILE, Node
from .node_snapshot import Launch, LaunchFile, Proc, Process, Record, Snapshot
from .relay import Relay, decode, encode, parse_addr, printable

log = logging.getLogger("sglang_phasetrace")

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


# -- snapshots: what a node tells the others ----------------------------------------------------------


def snapshot(view: RunView, node: int, seq: int, now: int, evidence: Mapping[int, Evidence] | None = None) -> Snapshot:
    """This node's processes as records (the journal's schema), small enough to send every beat;
    ``evidence``: pid -> what a rank this node's watchdog suspects waits on (read here, said there)."""
    sent = []
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
                {},  # no start ticks nor boot id: node 0 never proves (or signals) another node's process
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
        proc = _fit(p, {"progress_t": p.last_progress_t, "records": recs, "ended": ended})
        ev = (evidence or {}).get(p.pid)
        if ev is not None and from_builtins(msgspec.to_builtins(ev)) is not None:  # within the schema's bounds
            proc.evidence = ev
        sent.append(proc)
    return Snapshot(1, node, seq, now, sent)


def _fit(p: ProcessRec, entry: dict[str, Any]) -> Proc:
    """``entry`` as the schema node 0 accepts: a record (or an ended phase) that does not fit it
    (a name over its size bound, ...) is left out here, said once, rather than the whole snapshot
    refused there."""
    try:
        return msgspec.convert(entry, Proc)
    except msgspec.ValidationError:
        pass
    kept: list[Record] = []
    for r in entry["records"]:
        try:
            kept.append(msgspec.convert(r, Record))
        except msgspec.ValidationError as exc:
            if process_state.say_once(("snapshot-fit", p.pid, r.get("kind"))):
                log.warning(
                    "sglang-phasetrace: a %s record of %s is not sent to node 0 (%s)", r.get("kind"), p.who, exc
                )
    try:
        ended = msgspec.convert({"records": [], "ended": entry["ended"]}, Proc).ended
    except msgspec.ValidationError:
        ended = {}
    return Proc(kept, entry["progress_t"], ended)


def remote_evidence(snap: Snapshot) -> dict[tuple[str, int], Evidence]:
    """(host, pid) -> what that node's launcher read its rank waits on, from its snapshot."""
    out = {}
    for entry in snap.procs:
        head = next((r for r in entry.records if isinstance(r, Process)), None)
        if entry.evidence is not None and head is not None and head.host is not None:
            out[(head.host, head.pid)] = entry.evidence
    return out


def remote_processes(snap: Snapshot, offset_ns: int, source: str) -> list[ProcessRec]:
    """Another node's snapshot (decoded into the schema, which takes only records the journal's
    ``schema.validate`` takes) as processes, its times moved onto this host's clock by ``offset_ns``."""
    out = []
    for entry in snap.procs:
        proc = ProcessRec(Path(source) / "remote.jsonl", remote=source)
        told = []
        for r in msgspec.to_builtins(entry.records):
            r["t"] += offset_ns
            if r["kind"] == "process" and r.get("boot_t") is not None:
                r["boot_t"] += offset_ns
            if r["kind"] == "exit":
                told.append(r)
                continue
            proc.apply(r)
        if not proc.pid:
            continue
        proc.path = Path(source) / f"{proc.host}-{proc.pid}.jsonl"
        if entry.progress_t is not None:
            proc.last_progress_t = entry.progress_t + offset_ns
        proc.dropped = {phase: [n, last + offset_ns] for phase, (n, last) in entry.ended.items()}
        proc.exit = next((r for r in told if r.get("pid") == proc.pid), None)
        out.append(proc)
    return out


class Refused(Exception):
    """A snapshot that decoded but may not be used: why, in words (a warning naming the node)."""


def one_machine(rendezvous: str | None) -> bool:
    """The rendezvous is a loopback address: every node of the launch runs on this machine (the
    others could not reach the store otherwise), so they share its host name."""
    parsed = parse_addr(rendezvous or "")
    if parsed is None:
        return False
    try:
        return parsed[0] == "localhost" or ipaddress.ip_address(parsed[0]).is_loopback
    except ValueError:
        return False


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
        self.agreed: Launch | None = None
        self.seq = itertools.count(1)  # two threads take numbers (a pass, and the last word): next() is atomic
        self.seen: dict[int, tuple[int, int]] = {}  # node -> (its seq, local time it arrived)
        self.offsets: dict[int, int] = {}
        self.payloads: dict[int, bytes] = {}  # node -> its latest payload, as received
        self.evidence: dict[int, dict[tuple[str, int], Evidence]] = {}  # node -> (host, pid) -> what it waits on
        self.hosts: dict[int, str] = {}  # node -> the host its used snapshots named
        self.one_machine = one_machine(node.rendezvous)
        self.stale_said: set[int] = set()
        self.said: set[tuple] = set()  # (node, problem) warned about: once each
        self.stop = threading.Event()
        self.write: Callable[[dict], None] | None = None  # the launcher's journal
        if node.launch_id is not None or node.source == keys.ENV_TRACEPARENT:
            self.agreed = Launch(trace, node.launch_id, node.source)

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
            agreed = self.relay.agree(Launch(self.trace), Launch)  # a malformed stored value: None, said once
            if agreed is not None:
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

    def _record(self, agreed: Launch) -> None:
        """The ``launch`` record, and ``launch.json`` for this node's processes' exporters."""
        trace = agreed.trace
        local = self.trace if trace != self.trace else None
        rec = records.launch(
            time.time_ns(),
            trace,
            local_trace=local,
            launch_id=agreed.launch_id,
            source=agreed.source,
            node_rank=self.node.rank,
            nnodes=self.node.nnodes,
            rendezvous=self.node.rendezvous,
        )
        if self.write is not None:
            self.write(rec)
        if local is not None:
            try:
                files.write_atomic(self.run_dir / LAUNCH_FILE, msgspec.json.encode(LaunchFile(trace, local)))
            except OSError as exc:
                files.say_once(self.run_dir / LAUNCH_FILE, exc, "spans are sent under this node's own trace id")

    def exchange(self, view: RunView, now: int, evidence: Mapping[int, Evidence] | None = None) -> list[str]:
        """One watchdog pass: offer this node's snapshot (with ``evidence``: pid -> what a suspect rank
        waits on); put the other nodes' into ``view``. Returns notices (a node that stopped reporting),
        each once. Never raises: whatever another party wrote to the store costs at most one warning
        naming the node, never the pass."""
        try:
            payload: bytes | None = encode(snapshot(view, self.node.rank, next(self.seq), now, evidence))
        except Exception as exc:  # this node's own view: a bug here must not cost the pass either
            payload = None
            self._say(self.node.rank, "encode", f"this node's snapshot not sent: {exc!r}")
        with self.lock:
            if payload is not None:
                self.outbox = payload
            inbox, self.inbox = self.inbox, {}
        for node, data in inbox.items():
            if self.payloads.get(node) == data:  # unchanged since last pass: nothing to decode
                continue
            self.payloads[node] = data
            try:
                self._take(view, node, data, now)
            except Refused as exc:
                self._say(node, "refused", f"node-{node}'s snapshot not used: {exc}")
            except Exception as exc:  # ValueError: not of the schema; anything else: still one warning
                self._say(node, "unreadable", f"node-{node}'s snapshot not used: {printable(str(exc) or repr(exc))}")
        notices = []
        for node, (_, t) in self.seen.items():
            age = (now - t) / 1e9
            reported = view.remote.get(f"node-{node}") or []
            done = all(p.ready for p in reported if p.role == "rank")
            if age > self.stale_s and node not in self.stale_said and not done:
                self.stale_said.add(node)
                notices.append(
                    f"node-{node} stopped reporting {age:.0f} s ago (its launcher, or the network to "
                    f"{self.node.rendezvous}): its ranks' last known state is shown, not judged"
                )
                view.set_remote(f"node-{node}", [p for p in reported if p.role == "launcher"])
        return notices

    def _take(self, view: RunView, node: int, data: bytes, now: int) -> None:
        """Node ``node``'s payload into ``view``, or ``Refused``/``ValueError`` saying why not."""
        snap = decode(data, Snapshot)
        if snap.node != node:
            raise Refused(f"it says it is node-{snap.node}")
        if self.seen.get(node, (None, 0))[0] == snap.seq:
            return
        offset = now - snap.now
        reported = remote_processes(snap, offset, f"node-{node}")
        host = self._check(view, node, reported)
        self.seen[node] = (snap.seq, now)
        self.offsets[node] = offset
        if host is not None:
            self.hosts[node] = host
        view.set_remote(f"node-{node}", reported)
        self.evidence[node] = remote_evidence(snap)
        self.stale_said.discard(node)

    def _check(self, view: RunView, node: int, reported: list[ProcessRec]) -> str | None:
        """A snapshot speaks for its own node only: the node its processes say they run on, one host,
        not this node's host nor one another node reported from (unless every node runs on this
        machine: a loopback rendezvous), and none of this node's processes or another node's.
        Returns the host it names; ``Refused`` when it may not be used."""
        here = other_processes.this_host()
        for p in reported:
            claimed = p.identity.get(keys.NODE_RANK)
            if claimed is not None and claimed != node:
                raise Refused(f"its pid {p.pid} says it runs on node-{printable(str(claimed), 20)}")
            p.identity[keys.NODE_RANK] = node  # who names it so (``ProcessRec.who``)
        hosts = {p.host for p in reported}
        if len(hosts) > 1:
            raise Refused(f"it names {len(hosts)} hosts (a node is one machine)")
        host = next(iter(hosts), None)
        shown = printable(repr(host), 80)
        if host is not None and self.one_machine and host != here:
            raise Refused(
                f"it names host {shown}, but the rendezvous {self.node.rendezvous} is a loopback address: "
                f"every node runs on this one ({here})"
            )
        if host is not None and not self.one_machine:
            if host == here:
                raise Refused(f"it names this node's host {shown}")
            other = next((k for k, h in self.hosts.items() if h == host and k != node), None)
            if other is not None:
                raise Refused(f"it names host {shown}, node-{other}'s")
        own = [p for p in view.processes if p.remote is None and node_of(p) in (None, self.node.rank)]
        mine = {(p.host, p.pid) for p in own}
        labels = {p.label for p in own}
        others = [(src, p) for src, ps in view.remote.items() if src != f"node-{node}" for p in ps]
        theirs = {(p.host, p.pid): src for src, p in others}
        named = {p.label: src for src, p in others}
        for p in reported:
            if (p.host, p.pid) in mine:
                raise Refused(f"it names pid {p.pid} on {shown}, a process of this node (judged from its journal)")
            if (p.host, p.pid) in theirs:
                raise Refused(f"it names pid {p.pid} on {shown}, which {theirs[p.host, p.pid]} reported")
            # labels name ranks in verdicts, metrics and what is said once: one label, one process of the launch
            if p.label in labels:
                raise Refused(f"it names {printable(repr(p.label), 40)}, a process of this node's (its journal's)")
            if p.label in named:
                raise Refused(f"it names {printable(repr(p.label), 40)}, which {named[p.label]} reported")
        return host

    def evidence_of(self, proc: ProcessRec) -> Evidence | None:
        """What another node's rank waits on, as its node's launcher read it (never read from here)."""
        if proc.remote is None or not proc.remote.startswith("node-"):
            return None
        node = proc.remote.removeprefix("node-")
        return self.evidence.get(int(node), {}).get((proc.host, proc.pid)) if node.isdigit() else None

    def _say(self, node: int, problem: str, text: str) -> None:
        """One warning per node and problem (a key rewritten every pass is said once)."""
        if (node, problem) not in self.said:
            self.said.add((node, problem))
            log.warning("sglang-phasetrace: %s", text)

    def finish(self) -> None:
        """At ready: the relay thread sends this node's last snapshot (its ranks ready), then stops."""
        self.stop.set()


def _warn_once(message: str) -> None:
    if process_state.say_once(("relay", message)):
        log.warning("%s", message)
