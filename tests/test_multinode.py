"""Multi-node launches: one launch identity, one cross-node verdict, node ≥ 1 ready.

The real tests start two SGLang "nodes" on this machine, as a 2-node deployment would:
two ``python -m sglang.launch_server --tp 2 --nnodes 2 --node-rank 0/1 --dist-init-addr
127.0.0.1:PORT --device cpu`` processes (gloo over loopback), each with its own run directory
(or one shared directory), only PYTHONPATH enabling tracing. A plant makes tp1 (on node 1) stall
inside ``attention.init`` while tp0 (on node 0) waits for it in a TP barrier.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import HOOKS, ROOT, free_port, hook_env, kill_group, requires_sglang
from otlp_receiver import OtlpReceiver
from sglang_phasetrace.tracing import keys
from sglang_phasetrace.tracing.channel import crossnode, relay
from sglang_phasetrace.tracing.channel.node_snapshot import Snapshot
from sglang_phasetrace.tracing.journal import records
from sglang_phasetrace.tracing.reader.load import load_run
from sglang_phasetrace.tracing.reader.view import RunView
from sglang_phasetrace.tracing.recorder import launch
from sglang_phasetrace.tracing.verdicts.diagnose import Thresholds, analyze
from sglang_phasetrace.tracing.verdicts.watchdog import Watchdog
from test_relay import MALFORMED, MASTER, spawn, stop, up

PLANTS = ROOT / "tests" / "plants"
S = 1_000_000_000


# -- the launch identity --------------------------------------------------------------------------


def test_the_environment_names_a_launch_in_this_order() -> None:
    assert launch.launch_from_env({}) is None
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "3", "SLURM_RESTART_COUNT": "1"}
    assert launch.launch_from_env(slurm) == ("4242.3.1", "SLURM_JOB_ID")
    assert launch.launch_from_env({"SLURM_JOB_ID": "4242"}) == ("4242.-.-", "SLURM_JOB_ID")
    assert launch.launch_from_env({"TORCHELASTIC_RUN_ID": "r7"}) == ("r7.-", "TORCHELASTIC_RUN_ID")
    both = {**slurm, keys.ENV_LAUNCH_ID: "rollout-12"}
    assert launch.launch_from_env(both) == ("rollout-12", keys.ENV_LAUNCH_ID)


def test_one_launch_one_trace_id_on_every_node_and_another_for_the_next() -> None:
    a = launch.trace_id_of("4242.3.0")
    assert a == launch.trace_id_of("4242.3.0") and 0 < a < 1 << 128
    assert launch.trace_id_of("4242.3.1") != a  # the job restarted: a new launch


# -- snapshots: another node's ranks in this node's view --------------------------------------------


HERE = socket.gethostname()


def _journal(
    run: Path, pid: int, label: str, role: str, node: int, t0: int, recs: list[dict], host: str = "host"
) -> None:
    (run / "journal").mkdir(parents=True, exist_ok=True)
    ident = {keys.RANK_LABEL: label, keys.NODE_RANK: node, keys.NNODES: 2}
    if role == "rank":
        ident[keys.TP_RANK] = int(label[2:])
    head = [
        records.process(t0, pid, 1, host, run.name, t0, {}),
        records.identity(t0, label, role, ident),
    ]
    text = "".join(json.dumps(r) + "\n" for r in head + recs)
    (run / "journal" / f"host{node}-{pid}.jsonl").write_text(text)


def _beat(pid: int, label: str, t: int, seq: int) -> dict:
    return records.heartbeat(t, seq, pid, label, False, 2.0, [], 0.0, 1 << 20, 4, dt_s=2.0, main={"state": "S"})


def _node(
    run: Path, node: int, tp: int, t0: int, now: int, waits: bool, host: str = "host", pid: int | None = None
) -> None:
    """A node holding one rank: tp``tp`` either waits in a TP barrier (``waits``) or sits in
    ``attention.init`` without progress; heartbeats up to ``now``."""
    pid = 100 + node if pid is None else pid
    trace = f"{node + 1:032x}"
    root = records.begin(t0, f"{10 + node:016x}", None, trace, f"rank tp{tp}", {keys.PHASE: "rank"}, "MainThread")
    attrs = {keys.PHASE: "attention.init"}
    phase = records.begin(t0 + S, f"{20 + node:016x}", root["span"], trace, "attention.init", attrs, "MainThread")
    recs = [root, phase]
    if waits:
        recs.append(records.end(t0 + 2 * S, phase["span"], "ok", {}))
        recs.append(records.collective(t0 + 2 * S, "enter", "barrier", "tp:0[0,1]", 5))
    recs += [_beat(pid, f"tp{tp}", t, i) for i, t in enumerate(range(t0, now, 2 * S))]
    _journal(run, pid, f"tp{tp}", "rank", node, t0, recs, host)


def test_a_node_snapshot_puts_its_ranks_on_this_clock_and_node0_names_the_stalled_one(tmp_path: Path) -> None:
    skew = 7 * S  # node 1's clock runs 7 s behind node 0's
    now0 = time.time_ns()
    t0 = now0 - 60 * S
    _node(tmp_path / "n0", 0, 0, t0, now0, waits=True)
    _node(tmp_path / "n1", 1, 1, t0 - skew, now0 - skew, waits=False)
    snap = crossnode.snapshot(RunView(tmp_path / "n1").refresh(), 1, 1, now0 - skew)
    data = relay.encode(snap)
    assert len(data) < 4096, len(data)  # what node 1 sends per beat for one rank

    view = RunView(tmp_path / "n0").refresh()
    offset = now0 - relay.decode(data, Snapshot).now
    view.set_remote("node-1", crossnode.remote_processes(relay.decode(data, Snapshot), offset, "node-1"))
    tp1 = next(p for p in view.ranks if p.label == "tp1")
    assert tp1.remote == "node-1" and tp1.node == 1 and tp1.who == f"pid {tp1.pid} on node-1"
    assert tp1.current is not None and tp1.current.phase == "attention.init"
    assert abs(tp1.heartbeats[-1]["t"] - (now0 - 2 * S)) <= 2 * S  # moved onto node 0's clock: not stale
    found = analyze(view, now0, Thresholds(stall_s=30, blocked_s=8))
    (named,) = [f for f in found if f.kind == "straggler"]
    assert named.label == "tp1" and "on node-1" in named.message and "attention.init" in named.message
    assert "tp0" in named.waiting and "barrier #5" in named.waiting["tp0"]
    assert "tp0 on node-0 waits in barrier #5 on group 'tp:0[0,1]'" in named.message
    assert not any(f.kind == "silent" for f in found)  # the skew is not taken for silence


def test_a_rank_whose_peers_on_another_node_left_its_phase_is_named(tmp_path: Path) -> None:
    """tp0 (node 0) sits in ``attention.init``; tp1 (node 1) ended it long ago and is in the next
    phase, in no collective: node 1's snapshot sends only open phases, and says how many of each
    phase ended and when, so node 0 still sees that its peer left tp0 behind."""
    skew = 7 * S
    now0 = time.time_ns()
    t0 = now0 - 90 * S
    _node(tmp_path / "n0", 0, 0, t0, now0, waits=False)
    t1, trace = t0 - skew, f"{2:032x}"
    root = records.begin(t1, f"{11:016x}", None, trace, "rank tp1", {keys.PHASE: "rank"}, "MainThread")
    init = records.begin(
        t1 + S, f"{21:016x}", root["span"], trace, "attention.init", {keys.PHASE: "attention.init"}, ""
    )
    graphs = records.begin(t1 + 3 * S, f"{31:016x}", root["span"], trace, "graph.init", {keys.PHASE: "graph.init"}, "")
    beats = [_beat(101, "tp1", t, i) for i, t in enumerate(range(t1, now0 - skew, 2 * S))]
    _journal(
        tmp_path / "n1",
        101,
        "tp1",
        "rank",
        1,
        t1,
        [root, init, records.end(t1 + 2 * S, init["span"], "ok", {}), graphs, *beats],
    )

    sent = relay.encode(crossnode.snapshot(RunView(tmp_path / "n1").refresh(), 1, 1, now0 - skew))
    snap = relay.decode(sent, Snapshot)
    assert snap.procs[0].ended == {"attention.init": (1, t1 + 2 * S)}  # sent as a count, not as spans
    view = RunView(tmp_path / "n0").refresh()
    view.set_remote("node-1", crossnode.remote_processes(snap, now0 - snap.now, "node-1"))
    tp1 = next(p for p in view.ranks if p.label == "tp1")
    assert tp1.ended("attention.init") == (1, t0 + 2 * S)  # on node 0's clock
    found = analyze(view, now0, Thresholds(stall_s=30, blocked_s=8))
    (named,) = [f for f in found if f.label == "tp0"]
    assert named.kind == "straggler" and "peers left it: tp1" in named.message, named.message
    bad = relay.decode(sent, dict)
    bad["procs"][0]["ended"] = {"attention.init": ["1", -5]}
    with pytest.raises(ValueError, match=r"procs\[0\]\.ended"):  # a malformed summary: the snapshot is refused
        relay.decode(relay.encode(bad), Snapshot)


def test_ranks_waiting_at_the_rendezvous_say_what_they_wait_for(tmp_path: Path) -> None:
    now = time.time_ns()
    t0 = now - 60 * S
    trace = "1" * 32
    root = records.begin(t0, "a" * 16, None, trace, "rank tp2", {keys.PHASE: "rank"}, "MainThread")
    pg = records.begin(
        t0 + S,
        "b" * 16,
        root["span"],
        trace,
        "dist.init_process_group",
        {keys.PHASE: "dist.init_process_group", "sglang.init_method": "tcp://10.0.0.1:5000", keys.WORLD_SIZE: 4},
        "MainThread",
    )
    beats = [_beat(102, "tp2", t, i) for i, t in enumerate(range(t0, now, 2 * S))]
    _journal(tmp_path, 102, "tp2", "rank", 1, t0, [root, pg, *beats])
    (found,) = analyze(load_run(tmp_path), now, Thresholds(stall_s=30))
    assert found.kind == "rendezvous" and found.phase == "dist.init_process_group"
    assert found.message.startswith("tp2 on node-1 has waited 59 s in 'dist.init_process_group'")
    assert "tcp://10.0.0.1:5000" in found.message and "world size 4, 1 seen" in found.message


# -- what another party may write to the store ---------------------------------------------------------
#
# Anyone who reaches the launch's store can write node k's key. This node's processes are judged from
# its own journals only; a snapshot that does not fit the schema, or names what is not its node's, costs
# one warning naming the node, never the pass (docs/multinode-channel.md, "Trust").

TH = Thresholds(stall_s=30, blocked_s=8)


@pytest.fixture
def store() -> Iterator[int]:
    """A real torch ``TCPStore`` master in its own process, as world rank 0's: its port."""
    port = free_port()
    proc = spawn(MASTER, port)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        yield port
    finally:
        stop(proc)


def _silent_tp0(run: Path, now: int) -> None:
    """Node 0's tp0, this very process (alive, on this machine), silent for 40 s in ``attention.init``."""
    _node(run, 0, 0, now - 60 * S, now - 40 * S, waits=False, host=HERE, pid=os.getpid())


def _node0(run: Path, port: int) -> crossnode.CrossNode:
    cross = crossnode.CrossNode(crossnode.Node(0, 2, f"127.0.0.1:{port}"), run, "1" * 32, 2.0, 10.0)
    assert up(cross.relay)
    return cross


def _warned(caplog: pytest.LogCaptureFixture, node: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and node in r.getMessage()]


def test_a_fake_ready_snapshot_of_this_nodes_rank_does_not_hide_its_stall(
    tmp_path: Path, store: int, caplog: pytest.LogCaptureFixture
) -> None:
    now = time.time_ns()
    _silent_tp0(tmp_path / "n0", now)
    (alone,) = analyze(RunView(tmp_path / "n0").refresh(), now, TH)
    assert alone.kind == "silent" and alone.label == "tp0"
    # Another party writes node 1's key: "tp0, this host, this pid: ready" (pid and host are easy to learn).
    t0 = now - 60 * S
    root = records.begin(t0, "c" * 16, None, "3" * 32, "rank tp0", {keys.PHASE: "rank"}, "MainThread")
    ended = records.end(t0 + S, root["span"], "ok", {})
    _journal(
        tmp_path / "fake", os.getpid(), "tp0", "rank", 1, t0, [root, ended, _beat(os.getpid(), "tp0", now, 1)], HERE
    )
    writer = relay.Relay(f"127.0.0.1:{store}", 1, 2, timeout_s=2.0)
    assert up(writer)
    writer.publish(relay.encode(crossnode.snapshot(RunView(tmp_path / "fake").refresh(), 1, 1, now)))
    cross = _node0(tmp_path / "n0", store)
    cross.pass_once()
    assert list(cross.inbox) == [1]
    view = RunView(tmp_path / "n0").refresh()
    with caplog.at_level(logging.WARNING, logger="sglang_phasetrace"):
        assert cross.exchange(view, now) == []
    (found,) = analyze(view, now, TH)
    assert (found.kind, found.label, found.pid) == ("silent", "tp0", os.getpid())
    assert [p.remote for p in view.processes] == [None]
    (said,) = _warned(caplog, "node-1")
    assert said.startswith("sglang-phasetrace: node-1's snapshot not used: it names pid") and "of this node" in said
    writer.close()
    cross.relay.close()


def test_a_key_rewritten_with_garbage_every_pass_costs_one_warning_and_every_pass_names_the_local_stall(
    tmp_path: Path, store: int, caplog: pytest.LogCaptureFixture
) -> None:
    now = time.time_ns()
    _silent_tp0(tmp_path / "n0", now)
    writer = relay.Relay(f"127.0.0.1:{store}", 1, 2, timeout_s=2.0)
    assert up(writer)
    cross = _node0(tmp_path / "n0", store)
    with caplog.at_level(logging.WARNING, logger="sglang_phasetrace"):
        for name, data in MALFORMED.items():
            writer.publish(data)  # a new value every pass: each is decoded, and refused
            cross.pass_once()
            assert cross.inbox == {1: data}, name
            out = io.StringIO()
            dog = Watchdog(tmp_path / "n0", TH, out=out, py_spy=False)  # a pass that has not named it yet
            dog.crossnode = cross
            (found,) = dog.step(now)
            assert (found.kind, found.label) == ("silent", "tp0"), name
            assert out.getvalue().startswith("sglang-phasetrace: STALL rank tp0 (pid"), out.getvalue()
    (said,) = _warned(caplog, "node-1")
    assert said.startswith("sglang-phasetrace: node-1's snapshot not used: "), said
    assert len(said) < 300 and "\x1b" not in said, said
    writer.close()
    cross.relay.close()


def _one_rank(run: Path, node: int, host: str, now: int) -> bytes:
    """Node ``node``'s snapshot of one rank on ``host``, in ``attention.init``."""
    _node(run, node, node, now - 60 * S, now, waits=False, host=host)
    return relay.encode(crossnode.snapshot(RunView(run).refresh(), node, 1, now))


def test_a_snapshot_naming_this_nodes_host_or_another_nodes_is_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = time.time_ns()
    _node(tmp_path / "n0", 0, 0, now - 60 * S, now, waits=True, host=HERE)
    cross = crossnode.CrossNode(crossnode.Node(0, 5, "10.0.0.1:29500"), tmp_path / "n0", "1" * 32, 2.0, 10.0)
    view = RunView(tmp_path / "n0").refresh()
    cross.inbox = {
        1: _one_rank(tmp_path / "n1", 1, "host1", now),
        2: _one_rank(tmp_path / "n2", 2, "host1", now),  # node 1's host
        3: _one_rank(tmp_path / "n3", 3, HERE, now),  # this node's host
    }
    lying = relay.decode(_one_rank(tmp_path / "n4", 4, "host4", now), dict)
    lying["node"] = 1  # node 4's key, saying it is node 1
    cross.inbox[4] = relay.encode(lying)
    with caplog.at_level(logging.WARNING, logger="sglang_phasetrace"):
        assert cross.exchange(view, now) == []
        cross.inbox = {k: relay.encode(relay.decode(v, dict) | {"seq": 2}) for k, v in cross.inbox.items()}
        assert cross.exchange(view, now + S) == []  # the same again: not said twice
    assert {(p.label, p.remote) for p in view.ranks} == {("tp0", None), ("tp1", "node-1")}
    assert "names host 'host1', node-1's" in _warned(caplog, "node-2's")[0]
    assert "names this node's host" in _warned(caplog, "node-3's")[0]
    assert "it says it is node-1" in _warned(caplog, "node-4's")[0]
    assert len(_warned(caplog, "snapshot not used")) == 3

    # Every node of a launch whose rendezvous is a loopback address runs on this machine.
    here = crossnode.CrossNode(crossnode.Node(0, 2, "127.0.0.1:29500"), tmp_path / "n0", "1" * 32, 2.0, 10.0)
    here.inbox = {1: _one_rank(tmp_path / "n1", 1, "host1", now)}
    with caplog.at_level(logging.WARNING, logger="sglang_phasetrace"):
        here.exchange(view := RunView(tmp_path / "n0").refresh(), now)
    assert view.remote == {} and "loopback address" in _warned(caplog, "node-1's")[-1]


def test_a_snapshot_naming_a_label_of_this_node_or_of_another_report_is_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A label names one process of the launch in verdicts, metrics and what is said once: a report of
    another host that calls its rank ``tp0`` (this node's) or ``tp1`` (node 1's) is not used."""
    now = time.time_ns()
    _node(tmp_path / "n0", 0, 0, now - 60 * S, now, waits=True, host=HERE)
    cross = crossnode.CrossNode(crossnode.Node(0, 4, "10.0.0.1:29500"), tmp_path / "n0", "1" * 32, 2.0, 10.0)
    view = RunView(tmp_path / "n0").refresh()

    def rank(node: int, tp: int, host: str) -> bytes:
        _node(tmp_path / f"n{node}", node, tp, now - 60 * S, now, waits=False, host=host)
        return relay.encode(crossnode.snapshot(RunView(tmp_path / f"n{node}").refresh(), node, 1, now))

    cross.inbox = {1: rank(1, 1, "host1"), 2: rank(2, 0, "host2"), 3: rank(3, 1, "host3")}
    with caplog.at_level(logging.WARNING, logger="sglang_phasetrace"):
        assert cross.exchange(view, now) == []
    assert {(p.label, p.remote) for p in view.ranks} == {("tp0", None), ("tp1", "node-1")}
    assert "names 'tp0', a process of this node's (its journal's)" in _warned(caplog, "node-2's")[0]
    assert "names 'tp1', which node-1 reported" in _warned(caplog, "node-3's")[0]


def test_a_report_stands_in_only_for_its_own_nodes_journal(tmp_path: Path) -> None:
    """One shared run directory: node 0 reads node 1's journals too. Node 1's report replaces its own
    journal (its times are on node 0's clock); nobody's report replaces node 0's processes, and the
    first report of a (host, pid) is the one shown."""
    now = time.time_ns()
    _node(tmp_path, 0, 0, now - 60 * S, now, waits=False, host="host0")
    _node(tmp_path, 1, 1, now - 60 * S, now, waits=False, host="host1")
    mine = RunView(tmp_path).refresh()
    (tp0,) = [p for p in mine.processes if p.label == "tp0"]

    def reported(node: int, host: str, pid: int, source: str) -> list:
        other = tmp_path / f"report-{source}-{pid}"
        _node(other, node, node, now - 60 * S, now, waits=False, host=host, pid=pid)
        snap = relay.decode(relay.encode(crossnode.snapshot(RunView(other).refresh(), node, 1, now)), Snapshot)
        return crossnode.remote_processes(snap, 0, source)

    view = RunView(tmp_path).refresh()
    view.set_remote("node-1", reported(1, "host1", 101, "node-1"))
    view.set_remote("node-2", reported(2, "host0", 100, "node-2") + reported(2, "host1", 101, "node-2"))
    got = {(p.host, p.pid): p.remote for p in view.processes}
    assert got == {("host0", 100): None, ("host1", 101): "node-1"}
    assert next(p for p in view.processes if p.pid == 100).spans.keys() == tp0.spans.keys()

    # Node 1's rank early on: its identity does not say its node yet; its journal's resource does.
    early = [
        records.process(now, 103, 1, "host1", "r", now, {keys.NODE_RANK: 1}),
        records.identity(now, "tp3", "rank", {}),
    ]
    (tmp_path / "journal" / "host1-103.jsonl").write_text("".join(json.dumps(r) + "\n" for r in early))
    cross = crossnode.CrossNode(crossnode.Node(0, 3, "10.0.0.1:1"), tmp_path, "1" * 32, 2.0, 10.0)
    view = RunView(tmp_path).refresh()
    (report,) = reported(1, "host1", 103, "node-1")
    assert cross._check(view, 1, [report]) == "host1"  # not taken for one of node 0's
    view.set_remote("node-1", [report])
    assert next(p for p in view.processes if p.pid == 103).remote == "node-1"


# -- real two-node launches ---------------------------------------------------------------------------


class TwoNodes:
    """Two ``launch_server`` nodes of one tp=2 launch on this machine; stopped and cleaned up on exit."""

    def __init__(
        self,
        tmp_path: Path,
        model: Path,
        env: dict[str, str],
        shared: bool = False,
        run1: bool = False,
        only: int | None = None,
    ) -> None:
        self.tmp, self.procs, self.logs = tmp_path, [], []
        dist = free_port()
        self.bases = [tmp_path / ("shared" if shared else f"node{k}") for k in (0, 1)]
        for k in (0, 1):
            self.logs.append(tmp_path / f"node{k}.log")
            if only is not None and k != only:
                self.logs[-1].write_text("")
                continue
            command = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--device", "cpu"]
            command += ["--tp", "2", "--nnodes", "2", "--node-rank", str(k), "--dist-init-addr", f"127.0.0.1:{dist}"]
            command += ["--port", str(free_port()), "--max-total-tokens", "4096"]
            if run1 and k == 1:  # node 1 under `phasetrace run`, as a user watching that node would
                command = [sys.executable, "-m", "sglang_phasetrace.tracing.cli", "run", "--", *command]
            log = self.logs[-1].open("w")
            self.procs.append(
                subprocess.Popen(
                    command,
                    env=hook_env(self.bases[k], env),
                    cwd=tmp_path,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def log(self, k: int) -> str:
        return self.logs[k].read_text(errors="replace")

    def wait_for(self, k: int, text: str, timeout: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if text in self.log(k):
                return time.monotonic() - t0
            for i, p in enumerate(self.procs):
                assert p.poll() is None, f"node {i} exited {p.returncode}:\n{self.log(i)[-4000:]}"
            time.sleep(0.5)
        raise AssertionError(f"node {k} never said {text!r} in {timeout} s:\n{self.log(k)[-6000:]}")

    def run_dirs(self, k: int) -> list[Path]:
        return sorted(p for p in self.bases[k].iterdir() if (p / "journal").is_dir())

    def stop(self) -> None:
        for p in self.procs:
            with_group = p.pid
            try:
                os.killpg(with_group, signal.SIGTERM)
            except ProcessLookupError:
                pass
        time.sleep(1)
        for p in self.procs:
            kill_group(p.pid)
            p.wait(timeout=30)


@pytest.fixture
def two_nodes(tmp_path: Path, tiny_model: tuple[Path, Path]):
    started: list[TwoNodes] = []

    def start(env: dict[str, str] | None = None, **kwargs) -> TwoNodes:
        nodes = TwoNodes(tmp_path, tiny_model[0], env or {}, **kwargs)
        started.append(nodes)
        return nodes

    yield start
    for nodes in started:
        nodes.stop()


STALL = {"PLANT_STALL_PHASE_TP_RANK": "1", "PYTHONPATH": os.pathsep.join((str(HOOKS), str(PLANTS)))}


@pytest.mark.sglang
@requires_sglang
def test_node1_is_ready_on_its_own_and_both_nodes_share_one_trace(two_nodes) -> None:
    receiver = OtlpReceiver("http/protobuf").start()  # a collector both nodes export to, as Jaeger would be
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": receiver.protocol}
    try:
        _one_trace(two_nodes(env, run1=True), receiver)
    finally:
        receiver.stop()


def _one_trace(nodes: TwoNodes, receiver: OtlpReceiver) -> None:
    nodes.wait_for(0, "The server is fired up and ready to roll!", 240)
    nodes.wait_for(1, "phasetrace: report:", 60)  # node 1's `phasetrace run` printed its summary at ready
    assert nodes.procs[1].poll() is None  # ... while that node runs on (it waits for node 0's shutdown)
    (run0,), (run1,) = nodes.run_dirs(0), nodes.run_dirs(1)
    launcher1 = next(p for p in load_run(run1).processes if p.role == "launcher")
    assert launcher1.label == "launcher-node1" and launcher1.ready
    view0, view1 = load_run(run0), load_run(run1)
    trace = next(p for p in view0.processes if p.role == "launcher").root.trace_id
    assert {s.trace_id for p in view0.processes for s in p.spans.values()} == {trace}
    assert launcher1.launch is not None and launcher1.launch["trace"] == trace
    assert launcher1.launch["source"] == "rendezvous" and launcher1.launch["node_rank"] == 1
    local = launcher1.launch["local_trace"]
    assert {s.trace_id for p in view1.processes for s in p.spans.values()} == {local} != {trace}
    assert view1.trace_map == {local: trace}
    assert json.loads((run1 / "launch.json").read_text()) == {"trace": trace, "local_trace": local}
    assert oct((run1 / "launch.json").stat().st_mode & 0o777) == "0o600"
    tp1 = next(p for p in view1.ranks)
    assert tp1.label == "tp1" and tp1.node == 1 and tp1.ready
    # live OTLP: node 1's spans were held until its launcher learnt the launch's trace id, then sent under it
    ended = {s.span_id for p in view1.processes for s in p.spans.values() if s.end is not None}
    assert receiver.wait_for_spans(ended, timeout=30) == set(), "node 1's spans did not all arrive"
    got = receiver.by_id()
    assert {got[sid].trace_id for sid in ended} == {trace}
    assert got[tp1.root.span_id].resource.get("sglang.node_rank") == 1


@pytest.mark.sglang
@requires_sglang
def test_node0_names_a_rank_stalled_on_node1(two_nodes) -> None:
    nodes = two_nodes(STALL)
    waited = nodes.wait_for(0, "sglang-phasetrace: STALL rank tp1 (pid", 240)
    line = next(x for x in nodes.log(0).splitlines() if "sglang-phasetrace: STALL rank tp1" in x)
    assert "on node-1)" in line and "'attention.init'" in line and "tp0 on node-0 waits in barrier" in line, line
    assert waited < 200
    (run0,) = nodes.run_dirs(0)
    launcher0 = next(p for p in load_run(run0).processes if p.role == "launcher")
    assert any(d.get("label") == "tp1" for d in launcher0.diagnoses)


@pytest.mark.sglang
@requires_sglang
def test_one_shared_run_directory_named_by_the_launch(two_nodes) -> None:
    env = {**STALL, keys.ENV_LAUNCH_ID: "rollout-7"}
    nodes = two_nodes(env, shared=True)
    nodes.wait_for(0, "sglang-phasetrace: STALL rank tp1 (pid", 240)
    (run,) = nodes.run_dirs(0)
    assert run.name == "launch-rollout-7"
    view = load_run(run)
    assert {p.label for p in view.processes} >= {"launcher", "launcher-node1", "tp0", "tp1"}
    trace = format(launch.trace_id_of("rollout-7"), "032x")
    assert {s.trace_id for p in view.processes for s in p.spans.values()} == {trace}
    line = next(x for x in nodes.log(0).splitlines() if "sglang-phasetrace: STALL rank tp1" in x)
    assert "on node-1)" in line and "'attention.init'" in line, line


@pytest.mark.sglang
@requires_sglang
def test_a_node_alone_says_it_waits_for_the_rendezvous(two_nodes) -> None:
    nodes = two_nodes({"SGLANG_PHASETRACE_STALL_S": "10"}, only=1)  # node 0 never comes
    nodes.wait_for(1, "sglang-phasetrace: STALL tp1 on node-1 has waited", 180)
    line = next(x for x in nodes.log(1).splitlines() if "sglang-phasetrace: STALL tp1" in x)
    assert "'dist.init_process_group' for the rendezvous at tcp://127.0.0.1:" in line, line
    assert "world size 2, 1 seen" in line, line
    assert "HINT (not a verdict) distributed rendezvous" in nodes.log(1)


@pytest.mark.sglang
@requires_sglang
def test_a_two_node_preflight_passes_on_both_nodes(tmp_path: Path, tiny_model: tuple[Path, Path]) -> None:
    """Each node runs ``phasetrace preflight`` with its own --node-rank: node 1 passes when its ranks
    are ready and keeps them up for node 0's warm-up; node 0 passes at server ready and stops its
    launch, which ends node 1's."""
    dist, procs = free_port(), []
    try:
        for k in (0, 1):
            command = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(tiny_model[0])]
            command += ["--device", "cpu", "--tp", "2", "--nnodes", "2", "--node-rank", str(k)]
            command += ["--dist-init-addr", f"127.0.0.1:{dist}", "--port", str(free_port())]
            args = [sys.executable, "-m", "sglang_phasetrace.tracing.cli", "preflight", "--shrink", "--deadline"]
            args += ["300", "--no-read-rate", "--", *command]
            procs.append(
                subprocess.Popen(
                    args,
                    env=hook_env(tmp_path / f"node{k}", hooks=False),
                    cwd=tmp_path,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                )
            )
        errs = [p.communicate(timeout=400)[1] for p in procs]
    finally:
        for p in procs:
            kill_group(p.pid)
    assert procs[0].returncode == 0, errs[0][-4000:]
    assert procs[1].returncode == 0, errs[1][-4000:]
    assert "node 1 is ready; its launch runs on until node 0's pre-flight stops it" in errs[1]
    assert "PASSED after" in errs[1] and "node 1's ranks were ready" in errs[1]
    assert "PASSED after" in errs[0] and "ready; stopped it" in errs[0]


def test_a_node_that_stops_reporting_is_said_once_not_blamed_rank_by_rank(tmp_path: Path) -> None:
    now = time.time_ns()
    _node(tmp_path / "n0", 0, 0, now - 60 * S, now, waits=True)
    _node(tmp_path / "n1", 1, 1, now - 60 * S, now, waits=False)
    snap = relay.encode(crossnode.snapshot(RunView(tmp_path / "n1").refresh(), 1, 1, now))
    cross = crossnode.CrossNode(crossnode.Node(0, 2, "10.0.0.1:1"), tmp_path / "n0", "1" * 32, 2.0, 10.0)
    view = RunView(tmp_path / "n0").refresh()
    cross.inbox = {1: snap}
    assert cross.exchange(view, now) == [] and {p.label for p in view.ranks} == {"tp0", "tp1"}
    assert cross.exchange(view, now + 5 * S) == []  # the same snapshot again: nothing new, not stale yet
    (notice,) = cross.exchange(view, now + 11 * S)
    assert notice.startswith("node-1 stopped reporting 11 s ago (its launcher, or the network to 10.0.0.1:1)")
    assert {p.label for p in view.ranks} == {"tp0"}  # its ranks are not judged on stale figures
    assert cross.exchange(view, now + 20 * S) == []  # said once
    cross.inbox = {1: relay.encode(crossnode.snapshot(RunView(tmp_path / "n1").refresh(), 1, 2, now + 21 * S))}
    assert cross.exchange(view, now + 21 * S) == [] and {p.label for p in view.ranks} == {"tp0", "tp1"}
