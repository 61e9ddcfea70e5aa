"""The stall rules on small hand-written run directories (journals as the runtime writes them).

Processes sit on another host name, so the rules cannot consult the OS about them (their pids are
made up); everything else is what ``analyze`` reads from a real run.
"""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
from pathlib import Path

from sglang_phasetrace.tracing.diagnose import Thresholds, analyze, this_host
from sglang_phasetrace.tracing.keys import ENV_ABORT_AFTER
from sglang_phasetrace.tracing.rundir import RunView
from sglang_phasetrace.tracing.watchdog import Watchdog

S = 1_000_000_000
NOW = 1_900_000_000 * S
TH = Thresholds(heartbeat_s=5, silent_s=15, stall_s=30, no_progress_s=120)


class Rank:
    def __init__(self, run: Path, world: int, members: str = "0,1,2") -> None:
        self.world, self.members = world, members
        self.path = run / "journal" / f"other-{100 + world}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.records: list[dict] = [
            {"kind": "process", "t": NOW - 300 * S, "pid": 100 + world, "host": "other", "resource": {}},
            {"kind": "identity", "t": NOW - 300 * S, "label": f"tp{world}", "role": "rank",
             "attrs": {"sglang.world_rank": world, "sglang.tp_rank": world}},
            {"kind": "begin", "t": NOW - 300 * S, "span": f"{world}000000000000001", "parent": None, "trace": "a" * 32,
             "name": f"rank tp{world}", "attrs": {"sglang.phase": "rank"}},
        ]
        self.n = 1

    def phase(self, name: str, begin_ago: float, end_ago: float | None = None) -> Rank:
        self.n += 1
        span = f"{self.world}{self.n:015d}"
        self.records.append({"kind": "begin", "t": NOW - int(begin_ago * S), "span": span,
                             "parent": f"{self.world}000000000000001", "trace": "a" * 32, "name": name,
                             "attrs": {"sglang.phase": name}})
        if end_ago is not None:
            self.records.append({"kind": "end", "t": NOW - int(end_ago * S), "span": span, "status": "ok", "attrs": {}})
        return self

    def collective(self, op: str, seq: int, ago: float, group: str | None = None,
                   left_ago: float | None = None) -> Rank:
        group = group or f"tp:0[{self.members}]"
        self.records.append({"kind": "collective", "t": NOW - int(ago * S), "edge": "enter", "op": op,
                             "group": group, "seq": seq})
        if left_ago is not None:
            self.records.append({"kind": "collective", "t": NOW - int(left_ago * S), "edge": "exit", "op": op,
                                 "group": group, "seq": seq})
        return self

    def heartbeat(self, ago: float, progress: dict | None = None) -> Rank:
        phases = [{"span": "x", "phase": "p", "progress": progress}] if progress else []
        self.records.append({"kind": "heartbeat", "t": NOW - int(ago * S), "phases": phases})
        return self

    def write(self) -> None:
        self.records.sort(key=lambda r: r["t"])
        self.path.write_text("".join(json.dumps(r) + "\n" for r in self.records))


def findings(run: Path, *ranks: Rank):
    for rank in ranks:
        rank.heartbeat(1).write()
    return analyze(RunView(run).refresh(final=True), NOW, TH)


def test_straggler_named_with_the_peers_waiting_in_the_collective_it_never_entered(tmp_path: Path) -> None:
    ranks = [Rank(tmp_path, w).phase("eagle.get_embed_and_head", 45).collective("barrier", 1, 200, left_ago=199)
             for w in range(3)]
    for peer in ranks[:2]:
        peer.collective("barrier", 2, 40)
    [f] = findings(tmp_path, *ranks)
    assert (f.kind, f.label, f.phase) == ("straggler", "tp2", "eagle.get_embed_and_head")
    assert set(f.waiting) == {"tp0", "tp1"} and "barrier #2 on group 'tp:0[0,1,2]'" in f.waiting["tp0"]
    assert "rank tp2 (pid 102) has been in 'eagle.get_embed_and_head'" in f.message


def test_a_rank_still_making_progress_is_not_a_straggler(tmp_path: Path) -> None:
    ranks = [Rank(tmp_path, w).phase("model.weights_iterator", 45) for w in range(3)]
    for peer in ranks[:2]:
        peer.collective("new_group", 1, 40)
    ranks[2].heartbeat(6, {"done": 3, "total": 10}).heartbeat(2, {"done": 4, "total": 10})
    assert findings(tmp_path, *ranks) == []


def test_a_rank_outside_the_group_is_not_blamed(tmp_path: Path) -> None:
    ranks = [Rank(tmp_path, w, members="0,1").phase("graph.capture", 45) for w in range(2)]
    ranks[0].collective("all_reduce", 1, 40)
    outsider = Rank(tmp_path, 2, members="2").phase("graph.capture", 45)
    [f] = findings(tmp_path, *ranks, outsider)
    assert f.label == "tp1" and set(f.waiting) == {"tp0"}


def test_divergent_collectives_at_one_sequence_number(tmp_path: Path) -> None:
    r0 = Rank(tmp_path, 0, "0,1").phase("dist.init", 10).collective("all_gather", 7, 5)
    r1 = Rank(tmp_path, 1, "0,1").phase("dist.init", 10).collective("broadcast", 7, 5)
    [f] = findings(tmp_path, r0, r1)
    assert f.kind == "divergence" and "#7" in f.message and "tp0 in all_gather" in f.message


def test_send_and_recv_pair_up_and_are_not_divergent(tmp_path: Path) -> None:
    r0 = Rank(tmp_path, 0, "0,1").phase("dist.init", 10).collective("send", 1, 5, left_ago=4)
    r1 = Rank(tmp_path, 1, "0,1").phase("dist.init", 10).collective("recv", 1, 5, left_ago=4)
    assert findings(tmp_path, r0, r1) == []


def test_phase_all_peers_left(tmp_path: Path) -> None:
    r0 = Rank(tmp_path, 0).phase("model.load_weights", 100, 90).phase("kv_cache.alloc", 89, 88)
    r1 = Rank(tmp_path, 1).phase("model.load_weights", 100, 91).phase("kv_cache.alloc", 89, 88)
    r2 = Rank(tmp_path, 2).phase("model.load_weights", 100)
    [f] = findings(tmp_path, r0, r1, r2)
    assert (f.kind, f.label, f.phase) == ("straggler", "tp2", "model.load_weights")
    assert "peers left it" in f.message


def test_silent_rank(tmp_path: Path) -> None:
    r0 = Rank(tmp_path, 0).phase("dist.init", 10)
    r1 = Rank(tmp_path, 1).phase("dist.init", 10)
    r1.heartbeat(40).write()
    r0.heartbeat(1).write()
    [f] = analyze(RunView(tmp_path).refresh(final=True), NOW, TH)
    assert (f.kind, f.label) == ("silent", "tp1") and "no heartbeat for 40 s" in f.message


def test_no_progress_anywhere(tmp_path: Path) -> None:
    r0 = Rank(tmp_path, 0).phase("graph.capture", 200)
    r1 = Rank(tmp_path, 1).phase("attention.init", 200)
    [f] = findings(tmp_path, r0, r1)
    assert f.kind == "no_progress" and "tp0 in 'graph.capture'" in f.message and "tp1 in 'attention.init'" in f.message


def test_ready_ranks_are_never_reported(tmp_path: Path) -> None:
    r0 = Rank(tmp_path, 0).phase("graph.capture", 300, 290)
    r0.records.append({"kind": "end", "t": NOW - 280 * S, "span": "0000000000000001", "status": "ok", "attrs": {}})
    assert findings(tmp_path, r0) == []


def _launcher(run: Path, pid: int) -> None:
    (run / "journal" / f"{this_host()}-{pid}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"kind": "process", "t": NOW - 300 * S, "pid": pid, "host": this_host(), "resource": {}},
        {"kind": "identity", "t": NOW - 300 * S, "label": "launcher", "role": "launcher", "attrs": {}}]))


def test_the_watchdog_kills_nothing_unless_abort_after_is_asked(tmp_path: Path, monkeypatch) -> None:
    r0 = Rank(tmp_path, 0).phase("graph.capture", 200)
    r1 = Rank(tmp_path, 1).phase("attention.init", 200)
    findings(tmp_path, r0, r1)
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        _launcher(tmp_path, launcher.pid)
        out = io.StringIO()
        assert Watchdog(tmp_path, TH, out=out, py_spy=False).step(NOW)  # reported, not acted on
        assert launcher.poll() is None and "STALL no progress on any rank" in out.getvalue()
        monkeypatch.setenv(ENV_ABORT_AFTER, "0")
        Watchdog(tmp_path, TH, out=out, py_spy=False).step(NOW)
        assert launcher.wait(10) == -signal.SIGTERM
        assert f"sending SIGTERM to the launcher (pid {launcher.pid})" in out.getvalue()
    finally:
        launcher.kill()
