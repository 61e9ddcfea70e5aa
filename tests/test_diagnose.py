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

import pytest
from sglang_phasetrace.tracing import keys
from sglang_phasetrace.tracing.journal import records
from sglang_phasetrace.tracing.keys import ENV_ABORT_AFTER
from sglang_phasetrace.tracing.reader import load
from sglang_phasetrace.tracing.reader.view import RunView
from sglang_phasetrace.tracing.verdicts import diagnose
from sglang_phasetrace.tracing.verdicts.diagnose import Thresholds, analyze
from sglang_phasetrace.tracing.verdicts.watchdog import Watchdog

S = 1_000_000_000
NOW = 1_900_000_000 * S
TH = Thresholds(heartbeat_s=5, silent_s=15, stall_s=30, no_progress_s=120)


class Rank:
    def __init__(self, run: Path, world: int, members: str = "0,1,2", start: int = NOW - 300 * S) -> None:
        self.world, self.members = world, members
        self.pid, self.label = 100 + world, f"tp{world}"
        self.path = run / "journal" / f"other-{self.pid}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.records: list[dict] = [
            records.process(start, self.pid, None, "other", run.name, None, {}),
            records.identity(start, self.label, "rank", {"sglang.world_rank": world, "sglang.tp_rank": world}),
            records.begin(start, self.root, None, "a" * 32, f"rank tp{world}", {"sglang.phase": "rank"}, "MainThread"),
        ]
        self.n = 1

    @property
    def root(self) -> str:
        return f"{self.world}000000000000001"

    def span(self, name: str, t: int) -> str:
        """Begin a phase under the rank's root at ``t``; returns its span id."""
        self.n += 1
        span = f"{self.world}{self.n:015d}"
        self.records.append(records.begin(t, span, self.root, "a" * 32, name, {"sglang.phase": name}, "MainThread"))
        return span

    def phase(self, name: str, begin_ago: float, end_ago: float | None = None) -> Rank:
        span = self.span(name, NOW - int(begin_ago * S))
        if end_ago is not None:
            self.records.append(records.end(NOW - int(end_ago * S), span, "ok", {}))
        return self

    def collective(
        self, op: str, seq: int, ago: float, group: str | None = None, left_ago: float | None = None
    ) -> Rank:
        group = group or f"tp:0[{self.members}]"
        self.records.append(records.collective(NOW - int(ago * S), "enter", op, group, seq))
        if left_ago is not None:
            self.records.append(records.collective(NOW - int(left_ago * S), "exit", op, group, seq))
        return self

    def beat(
        self,
        t: int,
        seq: int,
        phases: list[dict],
        *,
        interval_s: float = TH.heartbeat_s,
        cpu_s: float = 0.0,
        **activity,
    ) -> dict:
        """A heartbeat as the rank's heartbeat thread writes it while it initialises; ``activity``: the
        optional figures (``dt_s``, ``main`` …), left out as a writer that cannot tell leaves them out."""
        return records.heartbeat(t, seq, self.pid, self.label, False, interval_s, phases, cpu_s, 0, 1, **activity)

    def heartbeat(self, ago: float, progress: dict | None = None) -> Rank:
        phases = [{"span": "x", "phase": "p", "progress": progress}] if progress else []
        self.records.append(self.beat(NOW - int(ago * S), len(self.records), phases))
        return self

    def write(self) -> None:
        self.records.sort(key=lambda r: r["t"])
        self.path.write_text("".join(json.dumps(r) + "\n" for r in self.records))


def findings(run: Path, *ranks: Rank):
    for rank in ranks:
        rank.heartbeat(1).write()
    return analyze(RunView(run).refresh(final=True), NOW, TH)


def test_straggler_named_with_the_peers_waiting_in_the_collective_it_never_entered(tmp_path: Path) -> None:
    ranks = [
        Rank(tmp_path, w).phase("eagle.get_embed_and_head", 45).collective("barrier", 1, 200, left_ago=199)
        for w in range(3)
    ]
    for peer in ranks[:2]:
        peer.collective("barrier", 2, 40)
    [f] = findings(tmp_path, *ranks)
    assert (f.kind, f.label, f.phase) == ("straggler", "tp2", "eagle.get_embed_and_head")
    assert set(f.waiting) == {"tp0", "tp1"} and "barrier #2 on group 'tp:0[0,1,2]'" in f.waiting["tp0"]
    # these heartbeats carry no activity figures: named at the plain stall bound, without a verdict on its state
    assert f.message.startswith("rank tp2 (pid 102) has made no progress in 'eagle.get_embed_and_head' for 45 s")


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


@pytest.mark.forks
def test_peers_read_shallow_by_a_forked_child_still_left_the_straggler_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``status`` has a forked child read a large run's last journals shallow: the phases its ranks
    ended and left are still counted, so status names the straggler as the watchdog does."""
    r0 = Rank(tmp_path, 0).phase("model.load_weights", 100, 90).phase("model.load_weights", 89, 80)
    r1 = Rank(tmp_path, 1).phase("model.load_weights", 100, 91).phase("model.load_weights", 89, 81)
    r2 = Rank(tmp_path, 2).phase("model.load_weights", 100, 95).phase("model.load_weights", 89)
    for rank in (r0, r1, r2):
        rank.phase("kv_cache.alloc", 79, 78) if rank is not r2 else None
        rank.heartbeat(1).write()
    whole = analyze(RunView(tmp_path).refresh(final=True), NOW, TH)
    monkeypatch.setattr(load.Child, "MIN_BYTES", 0)
    monkeypatch.setattr(load.Child, "SHALLOW_SHARE", 0.7)  # the child reads tp1's and tp2's journals
    shallow = load.refresh_parallel(RunView(tmp_path), final=True, shallow=0)
    assert sum(n for p in shallow.processes for n, _ in p.dropped.values()) > 0  # some spans were left out
    assert [(f.kind, f.label, f.message) for f in analyze(shallow, NOW, TH)] == [
        (f.kind, f.label, f.message) for f in whole
    ]
    assert [(f.kind, f.label) for f in whole] == [("straggler", "tp2")] and "peers left it" in whole[0].message


def test_a_rank_that_waited_for_its_peers_in_a_phase_is_not_left_behind_as_they_leave(tmp_path: Path) -> None:
    """tp1 waited 40 s in the rendezvous for tp0, which has just left it: tp1 leaves a moment later
    (and another node's view of it lags); the peers must have been out for the blocked bound."""
    r0 = Rank(tmp_path, 0).phase("dist.init_process_group", 12, 1).phase("model_runner.init", 1)
    r1 = Rank(tmp_path, 1).phase("dist.init_process_group", 40)
    assert findings(tmp_path, r0, r1) == []


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


def _launcher_waiting(run: Path, ago: float) -> None:
    """The launcher's journal (pid 99): in ``server.wait_ready`` since ``ago`` s."""
    root = "9000000000000001"
    lines = [
        records.process(NOW - 300 * S, 99, None, "other", run.name, None, {}),
        records.identity(NOW - 300 * S, "launcher", "launcher", {}),
        records.begin(NOW - 300 * S, root, None, "a" * 32, "sglang.launch", {"sglang.phase": "launch.server"}, "M"),
        records.begin(NOW - int(ago * S), "9" * 16, root, "a" * 32, "x", {"sglang.phase": "server.wait_ready"}, "M"),
    ]
    (run / "journal" / "other-99.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_no_progress_with_every_rank_initialised_names_the_launcher_first(tmp_path: Path) -> None:
    """Every rank's own init is done and the launch does not serve: what is left is the launcher's."""
    ranks = [Rank(tmp_path, w, "0,1").phase("model.load_weights", 290, 280) for w in range(2)]
    for rank in ranks:
        rank.records.append(records.event(NOW - 200 * S, rank.root, keys.INITIALISED, {}))
    _launcher_waiting(tmp_path, 250)
    [f] = findings(tmp_path, *ranks)
    assert (f.kind, f.label, f.pid) == ("no_progress", "launcher", 99), f  # the process the launch waits for
    assert f.message.startswith("no progress for 200 s; the launch waits for the launcher (pid 99) in "), f.message
    assert "'server.wait_ready'; tp0, tp1 initialised, waiting" in f.message, f.message


def test_initialised_ranks_waiting_for_a_launcher_that_progresses_are_not_stuck(tmp_path: Path) -> None:
    """The pre-flight regression: with dummy weights both ranks are initialised within seconds and
    then wait, idle, for the launcher's own start (its tokenizer, its server, the warm-up) for longer
    than the no-progress bound. The launcher moved 10 s ago: nothing is stuck."""
    ranks = [Rank(tmp_path, w, "0,1").phase("model.load_weights", 290, 280) for w in range(2)]
    for rank in ranks:
        rank.records.append(records.event(NOW - 250 * S, rank.root, keys.INITIALISED, {}))
    _launcher_waiting(tmp_path, 10)
    assert findings(tmp_path, *ranks) == []


def test_ready_ranks_are_never_reported(tmp_path: Path) -> None:
    r0 = Rank(tmp_path, 0).phase("graph.capture", 300, 290)
    r0.records.append(records.end(NOW - 280 * S, r0.root, "ok", {}))
    assert findings(tmp_path, r0) == []


def test_the_watchdog_kills_nothing_unless_abort_after_is_asked(tmp_path: Path, monkeypatch) -> None:
    """A launcher proven ours (it writes, and holds open, its own journal): reported, not acted on;
    SIGTERMed only with ``ABORT_AFTER_S`` (a journal merely naming a process: ``test_process_proof.py``)."""
    r0 = Rank(tmp_path, 0).phase("graph.capture", 200)
    r1 = Rank(tmp_path, 1).phase("attention.init", 200)
    findings(tmp_path, r0, r1)
    holds = (
        "import json, os, socket, sys, time\n"
        "from sglang_phasetrace.tracing import other_processes as procs\n"
        "from sglang_phasetrace.tracing.journal import records\n"
        "pid, t = os.getpid(), int(sys.argv[2])\n"
        "fd = os.open(f'{sys.argv[1]}/{socket.gethostname()}-{pid}.jsonl', os.O_WRONLY | os.O_CREAT, 0o600)\n"
        "recs = [records.process(t, pid, os.getppid(), socket.gethostname(), 'run', None, {}, **procs.fingerprint()),"
        " records.identity(t, 'launcher', 'launcher', {})]\n"
        "os.write(fd, ''.join(json.dumps(r) + '\\n' for r in recs).encode())\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", holds, str(tmp_path / "journal"), str(NOW - 300 * S)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert launcher.stdout.readline().strip() == "ready"
        out = io.StringIO()
        assert Watchdog(tmp_path, TH, out=out, py_spy=False).step(NOW)  # reported, not acted on
        assert launcher.poll() is None and "STALL no progress on any rank" in out.getvalue()
        monkeypatch.setenv(ENV_ABORT_AFTER, "0")
        Watchdog(tmp_path, TH, out=out, py_spy=False).step(NOW)
        assert launcher.wait(10) == -signal.SIGTERM
        assert f"sending SIGTERM to the launcher (pid {launcher.pid})" in out.getvalue()
    finally:
        launcher.kill()
        launcher.wait()


# -- at the default thresholds, on timelines: what each kind of rank looks like beat by beat ---------------------

DEFAULTS = Thresholds()
T0 = NOW - 400 * S  # the timelines below start here; the stall (or the slow phase) begins at T0 + 100 s


def at(t: float) -> int:
    """The time ``t`` seconds into a timeline, in ns."""
    return T0 + int(t * S)


class Timeline:
    """Ranks on a clock: records at absolute times, analysed at any moment with only what was written by then."""

    def __init__(self, run: Path, world: int = 2) -> None:
        self.run = run
        self.ranks = [Rank(run, w, ",".join(str(i) for i in range(world)), start=T0) for w in range(world)]

    def at(self, world: int, record: dict) -> None:
        self.ranks[world].records.append(record)

    def phase(self, world: int, name: str, begin: float, end: float | None = None) -> str:
        rank = self.ranks[world]
        span = rank.span(name, at(begin))
        if end is not None:
            self.at(world, records.end(at(end), span, "ok", {}))
        return span

    def collective(
        self, world: int, op: str, seq: int, enter: float, leave: float | None = None, group: str | None = None
    ) -> None:
        group = group or f"tp:0[{self.ranks[world].members}]"
        self.at(world, records.collective(at(enter), "enter", op, group, seq))
        if leave is not None:
            self.at(world, records.collective(at(leave), "exit", op, group, seq))

    def beats(
        self,
        world: int,
        start: float,
        stop: float,
        *,
        cpu_pct: float = 1.0,
        state: str = "S",
        io_bps: float = 0.0,
        gpu_util: float | None = None,
        progress=None,
        span: str = "x",
    ) -> None:
        """Heartbeats every 2 s with these figures; ``progress(t)`` gives a phase progress dict."""
        t, dt = start, DEFAULTS.heartbeat_s
        while t < stop:
            phases = (
                [] if progress is None else [{"span": span, "phase": "model.weights_iterator", "progress": progress(t)}]
            )
            gpu = None if gpu_util is None else {"util": gpu_util, "power_w": 300.0 if gpu_util else 90.0}
            beat = self.ranks[world].beat(
                at(t),
                int(t * 10),
                phases,
                interval_s=dt,
                cpu_s=cpu_pct / 100 * dt,
                dt_s=dt,
                main={"state": state, "cpu_s": cpu_pct / 100 * dt},
                io_b=int(io_bps * dt),
                majflt=0,
                child_cpu_s=0.0,
                gpu=gpu,
            )
            self.at(world, beat)
            t += dt

    def analyze(self, t: float, notices: bool = False) -> list:
        for rank in self.ranks:
            rank.path.write_text(
                "".join(
                    json.dumps(r) + "\n"
                    for r in sorted(rank.records, key=lambda r: r["t"])
                    if r["t"] <= T0 + int(t * S)
                )
            )
        return analyze(RunView(self.run).refresh(final=True), T0 + int(t * S), DEFAULTS, notices=notices)

    def first(self, start: float, stop: float, notices: bool = False) -> tuple[float, list]:
        """The first moment (every 0.5 s) with a finding."""
        t = start
        while t <= stop:
            found = self.analyze(t, notices)
            if found:
                return t, found
            t += 0.5
        return stop, []


def _stall_eagle(tl: Timeline, **tp1) -> None:
    """tp0 leaves 'eagle.get_embed_and_head' at 100.5 s and waits in barrier #2; tp1 stays in it from 100 s."""
    for w in (0, 1):
        tl.phase(w, "model.load_weights", 10, 90)
        tl.collective(w, "barrier", 1, 95, 95.2)
    tl.phase(0, "eagle.get_embed_and_head", 100)
    tl.collective(0, "barrier", 2, 100.5)
    tl.phase(1, "eagle.get_embed_and_head", 100)
    tl.beats(0, 1, 300)
    tl.beats(1, 1, 100, cpu_pct=100, state="R")  # working until the stall
    tl.beats(1, 101, 300, **tp1)


def test_blocked_rank_named_within_15_s_of_the_stall_at_the_defaults(tmp_path: Path) -> None:
    tl = Timeline(tmp_path)
    _stall_eagle(tl)  # tp1 after 100 s: asleep, 1 % CPU, no I/O, no GPU figures
    found_at, [f] = tl.first(100, 200)
    assert f.kind == "straggler" and f.alarm and (f.label, f.phase) == ("tp1", "eagle.get_embed_and_head")
    # the watchdog polls every heartbeat: it prints at most one interval after the rule holds
    assert found_at - 100 + DEFAULTS.heartbeat_s <= 15, found_at
    assert f.message.startswith("rank tp1 (pid 101) is blocked in 'eagle.get_embed_and_head' for ")
    assert "(1 % CPU, sleeping; no GPU figures): tp0 waits in barrier #2 on group 'tp:0[0,1]' since" in f.message
    assert f.doing.startswith("blocked") and set(f.waiting) == {"tp0"}
    assert [g.key for g in tl.analyze(found_at + 30)] == [f.key]  # the same stall keeps its key: reported once


def test_blocked_on_the_gpu_is_busy_and_a_spinning_collective_is_still_blocked(tmp_path: Path) -> None:
    tl = Timeline(tmp_path)
    _stall_eagle(tl, gpu_util=97)  # host asleep, GPU working: it computes
    assert tl.first(100, 159)[1] == [] and tl.first(100, 159, notices=True)[1] == []
    [f] = tl.analyze(165, notices=True)
    assert f.kind == "busy" and not f.alarm and "GPU 97 % util, 300 W" in f.message
    tl = Timeline(tmp_path / "spin")
    _stall_eagle(tl, gpu_util=100)
    tl.collective(1, "all_reduce", 1, 100.2, group="ep:0[0,1]")  # tp1 in another group's collective: NCCL spins
    found_at, found = tl.first(100, 200)  # tp0 never entered that all-reduce: named too (a cross wait)
    f = next(f for f in found if f.label == "tp1")
    assert f.kind == "straggler" and found_at <= 113 and "itself in all_reduce #1" in f.message


def test_busy_rank_is_not_named_before_the_busy_bound_and_never_stuck(tmp_path: Path) -> None:
    tl = Timeline(tmp_path)
    _stall_eagle(tl, cpu_pct=100, state="R")  # computing, no progress counters
    assert tl.first(100, 100 + DEFAULTS.busy_s - 1, notices=True)[1] == []
    found_at, [f] = tl.first(100, 300, notices=True)
    assert f.kind == "busy" and not f.alarm and found_at - 100 <= DEFAULTS.busy_s + 2
    assert f.message.startswith("rank tp1 (pid 101) is busy, not stuck, in 'eagle.get_embed_and_head'")
    assert "100 % CPU, running" in f.message and "tp0 waits in barrier #2" in f.message
    assert tl.first(100, 299)[1] == []  # no alarm at all, however long (no_progress included)


def test_reading_weights_without_counters_is_busy_not_blocked(tmp_path: Path) -> None:
    tl = Timeline(tmp_path)
    _stall_eagle(tl, cpu_pct=3, state="D", io_bps=200 * 2**20)
    assert tl.first(100, 159)[1] == []
    [f] = tl.analyze(170, notices=True)
    assert f.kind == "busy" and "I/O 200.0 MiB/s" in f.message and "disk-sleep" in f.message


def test_slow_rank_with_moving_counters_gets_an_estimate_never_a_stall(tmp_path: Path) -> None:
    tl = Timeline(tmp_path)
    for w in (0, 1):
        tl.phase(w, "model.load_weights", 10)
    tl.phase(0, "model.weights_iterator", 11, 20)
    tl.phase(0, "model.load_weights.done", 21, 22)
    tl.collective(0, "barrier", 1, 22)  # tp0 loaded its 64 shards in 10 s and waits
    span = tl.phase(1, "model.weights_iterator", 11)
    shards = lambda t: {"done": int((t - 11) / 33), "total": 64, "unit": "shards", "tensors": int(t - 11)}  # noqa: E731
    for k in range(1, 12):  # the shard_loaded events the weights iterator journals
        tl.at(1, records.event(at(11 + 33 * k), span, "shard_loaded", {"done": k, "total": 64}))
    tl.beats(0, 1, 400)
    tl.beats(1, 1, 400, cpu_pct=2, state="D", progress=shards, span=span)  # a shard every 33 s, a tensor a second
    assert tl.first(12, 398)[1] == []  # never an alarm
    [f] = tl.analyze(300, notices=True)
    assert f.kind == "slow" and not f.alarm and f.label == "tp1"
    assert "is slow, not stuck: loading shards 8/64 at 1.8 shards/min, ~31 min left" in f.message
    assert "tp0 waits in barrier #1" in f.message
    assert f.key == tl.analyze(380, notices=True)[0].key  # one notice per phase


def test_silent_rank_after_three_missed_beats(tmp_path: Path) -> None:
    tl = Timeline(tmp_path)
    _stall_eagle(tl)
    tl.ranks[1].records = [r for r in tl.ranks[1].records if r["kind"] != "heartbeat" or r["t"] <= T0 + 101 * S]
    found_at, found = tl.first(100, 200)
    [f] = [f for f in found if f.kind == "silent"]
    assert f.label == "tp1" and found_at - 101 == pytest.approx(DEFAULTS.silent_s, abs=0.5)
    assert "is silent: no heartbeat for 8 s (GIL held or process stopped), in 'eagle.get_embed_and_head'" in f.message
    assert "tp0 waits in barrier #2" in f.message
    assert [g.kind for g in tl.analyze(found_at + 60)] == ["silent"]  # not named twice (silent, then straggler)


def test_thresholds_from_env_keep_their_names(monkeypatch) -> None:
    assert Thresholds.from_env() == DEFAULTS
    monkeypatch.setenv("SGLANG_PHASETRACE_HEARTBEAT_S", "5")
    monkeypatch.setenv("SGLANG_PHASETRACE_STALL_S", "12")
    monkeypatch.setenv("SGLANG_PHASETRACE_NO_PROGRESS_S", "50")
    th = Thresholds.from_env()
    assert (th.heartbeat_s, th.silent_s, th.stall_s, th.no_progress_s, th.blocked_s) == (5, 20, 12, 50, 20)
    assert th.blocked_bound == 12 and th.busy_bound == 60
    monkeypatch.setenv("SGLANG_PHASETRACE_SILENT_S", "7")
    monkeypatch.setenv("SGLANG_PHASETRACE_BLOCKED_S", "6")
    monkeypatch.setenv("SGLANG_PHASETRACE_BUSY_S", "90")
    assert Thresholds.from_env() == Thresholds(5, 7, 12, 50, 6, 90)


@pytest.mark.sglang
def test_a_healthy_tp2_start_replayed_beat_by_beat_raises_nothing(engine_run, tmp_path: Path, monkeypatch) -> None:
    """The real tp=2 start (default heartbeat), replayed: analysed before every heartbeat and halfway to the next,
    with only the records written by then, as the live watchdog would see it. Nothing, not even a notice."""
    monkeypatch.setattr(diagnose, "this_host", lambda: "replay")  # the processes have exited; don't ask the OS
    journaled = []  # (when it was written: no earlier than any record before it in its file, record, file)
    for path in sorted((engine_run.run_dir / "journal").glob("*.jsonl")):
        written_at = 0
        for line in filter(str.strip, path.read_text().splitlines()):
            record = json.loads(line)
            written_at = max(written_at, record["t"])  # a span's begin may carry an earlier start (rank.bootstrap)
            journaled.append((written_at, record, path.name))
    journaled.sort(key=lambda item: item[0])
    beats = [r["t"] for _, r, _ in journaled if r["kind"] == "heartbeat"]
    assert len(beats) >= 5
    replay = tmp_path / "replay"
    (replay / "journal").mkdir(parents=True)
    # just before each beat and halfway to the next: not inside the microseconds between two records written
    # together (rank.bootstrap's begin, backdated to process start, and its end)
    view, written, moments = RunView(replay), 0, sorted({*(t - 1 for t in beats), *(t + S for t in beats)})
    for now in moments:
        while written < len(journaled) and journaled[written][0] <= now:
            _, record, name = journaled[written]
            with open(replay / "journal" / name, "a") as f:
                f.write(json.dumps(record) + "\n")
            written += 1
        found = analyze(view.refresh(), now, DEFAULTS, notices=True)
        assert found == [], (now - beats[0]) / S
