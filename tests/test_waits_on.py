"""What a waiting rank waits on, said in the verdict: real SGLang on CPU with stalls planted inside its
ranks (a plant ``sitecustomize`` written here, chained after ours as ``tests/plants`` is), and the
rules, the records, the exports and the cross-node snapshot on hand-written runs.

* every rank of an ``Engine`` tp=2 waits, in ``attention.init``, for an exclusive ``flock`` held by a
  process outside the launch: a STALL naming the file and its holder within the blocked bound at
  the default settings (before: 121 s, the no-progress bound);
* a rank waits on its own busy child named like a compiler while its peer waits in a barrier: a
  NOTICE naming the child, never a STALL;
* a rank in weight loading blocked on a TCP peer that accepted and never replies: its line names
  the address and the state, and the storage hint is not printed.

Every process started here is bounded in time and its process group killed when the test ends.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from conftest import HOOKS, ROOT, end_group, hook_env, kill_group, requires_sglang, wait_for_output
from sglang_phasetrace.tracing import other_processes as procs
from sglang_phasetrace.tracing.channel import crossnode, relay
from sglang_phasetrace.tracing.channel.node_snapshot import Snapshot
from sglang_phasetrace.tracing.journal import records, schema
from sglang_phasetrace.tracing.reader.load import load_run
from sglang_phasetrace.tracing.reader.view import RunView
from sglang_phasetrace.tracing.verdicts import evidence, hints
from sglang_phasetrace.tracing.verdicts.diagnose import Finding, Thresholds, analyze
from sglang_phasetrace.tracing.verdicts.evidence import ranks as ranks_mod
from sglang_phasetrace.tracing.verdicts.evidence import words
from sglang_phasetrace.tracing.verdicts.evidence.ranks import RankReader
from sglang_phasetrace.tracing.verdicts.evidence.values import Child, Evidence, FileLock, MainWait, Socket
from sglang_phasetrace.tracing.verdicts.findings import by_process, from_record
from sglang_phasetrace.tracing.verdicts.voice import diagnosis_record
from sglang_phasetrace.tracing.verdicts.watchdog import Watchdog

S = 1_000_000_000
PLANT = '''
"""Plants for tests/test_waits_on.py: ``PLANT_WAIT`` = ``WHERE:RANKS:HOW`` makes the ranks RANKS
(``0,1``) of the phase WHERE (``attention``: ``ModelRunner.init_attention_backends``; ``loader``:
``DefaultModelLoader.load_model``; ``kv``: ``ModelRunner.alloc_memory_pool``) wait first, HOW:
``flock=PATH`` (an exclusive lock), ``child=PROGRAM`` (run it to its end), ``socket=HOST,PORT``
(connect, send a request, read the answer); then every rank does the phase's work and a TP barrier."""

import os

if os.environ.get("PLANT_WAIT"):
    import functools

    import wrapt

    WHERE, RANKS, HOW = os.environ["PLANT_WAIT"].split(":", 2)
    TARGETS = {
        "attention": ("sglang.srt.model_executor.model_runner", "ModelRunner", "init_attention_backends"),
        "loader": ("sglang.srt.model_loader.loader", "DefaultModelLoader", "load_model"),
        "kv": ("sglang.srt.model_executor.model_runner", "ModelRunner", "alloc_memory_pool"),
    }
    MODULE, CLASS, METHOD = TARGETS[WHERE]

    def wait():
        what, _, arg = HOW.partition("=")
        if what == "flock":
            import fcntl

            f = open(arg, "a")
            fcntl.flock(f, fcntl.LOCK_EX)
        elif what == "child":
            import subprocess

            subprocess.run([arg], check=False)
        elif what == "socket":
            import socket

            host, port = arg.split(",")
            s = socket.create_connection((host, int(port)))
            s.sendall(b"GET /api/models/tiny HTTP/1.1\\r\\nHost: hub\\r\\n\\r\\n")
            s.recv(1)

    @wrapt.when_imported(MODULE)
    def _plant(module):
        cls = getattr(module, CLASS)
        original = getattr(cls, METHOD)

        @functools.wraps(original)
        def planted(*args, **kwargs):
            from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_rank, get_tp_group

            if str(get_tensor_model_parallel_rank()) in RANKS.split(","):
                wait()
            result = original(*args, **kwargs)
            get_tp_group().barrier()
            return result

        setattr(cls, METHOD, planted)
'''
HOLDER = """
import fcntl, sys, time
f = open(sys.argv[1], "a")
fcntl.flock(f, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""
COMPILER = f"""#!{sys.executable}
import time
end = time.time() + float({{seconds}})
while time.time() < end:
    pass
"""


class Launch:
    """``scripts/start_engine.py`` (an ``sglang.Engine`` tp=2) under the hook and the plant, in its own
    process group, killed on exit; its launcher's watchdog does the naming."""

    def __init__(self, tmp: Path, model: Path, plant: str, env: dict[str, str] | None = None) -> None:
        plants = tmp / "plants"
        plants.mkdir(exist_ok=True)
        (plants / "sitecustomize.py").write_text(PLANT)
        self.run_dir = tmp / "run"
        self.err = tmp / "launcher.err"
        full = hook_env(tmp, {"SGLANG_PHASETRACE_RUN_DIR": str(self.run_dir), "PLANT_WAIT": plant, **(env or {})})
        full["PYTHONPATH"] = os.pathsep.join((str(HOOKS), str(plants)))
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "scripts" / "start_engine.py"), str(model), "--tp", "2", "--no-generate"],
                env=full,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        return wait_for_output(self.err, pattern, timeout, self.proc)

    def diagnoses(self) -> list[dict]:
        launcher = next((p for p in load_run(self.run_dir).processes if p.role == "launcher"), None)
        return launcher.diagnoses if launcher is not None else []

    def close(self) -> None:
        end_group(self.proc)


@pytest.fixture
def launch(tmp_path: Path, tiny_model: tuple[Path, Path]) -> Iterator:
    started: list[Launch] = []

    def start(plant: str, env: dict[str, str] | None = None) -> Launch:
        started.append(Launch(tmp_path, tiny_model[0], plant, env))
        return started[-1]

    yield start
    for one in started:
        one.close()


@pytest.fixture
def outside(tmp_path: Path) -> Iterator:
    """Processes started here outside any launch (their own session), killed at the end."""
    procs: list[subprocess.Popen] = []

    def start(argv: list[str], **kw: object) -> subprocess.Popen:
        procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True, **kw))  # type: ignore[call-overload]
        return procs[-1]

    yield start
    for proc in procs:
        kill_group(proc.pid)
        proc.wait(timeout=30)


def _began(run_dir: Path, phase: str) -> dict[str, int]:
    """label -> when each rank began ``phase`` (ns), from the journals."""
    out = {}
    for p in load_run(run_dir).ranks:
        spans = [s for s in p.spans.values() if s.phase == phase]
        if spans:
            out[p.label] = spans[-1].start
    return out


# -- real SGLang ----------------------------------------------------------------------------------------------


@requires_sglang
@pytest.mark.sglang
@pytest.mark.timeout(400)
def test_every_rank_waits_for_a_lock_held_outside_the_launch(tmp_path: Path, launch, outside) -> None:
    """Both ranks of an Engine tp=2 wait, entering attention-backend init, for an exclusive ``flock``
    on a JIT-cache lock file that another process on the host holds. At the default settings."""
    lock = tmp_path / "cache" / "flashinfer" / "cached_ops" / "sampling.lock"
    lock.parent.mkdir(parents=True)
    (tmp_path / "holder.py").write_text(HOLDER)
    holder = outside([sys.executable, str(tmp_path / "holder.py"), str(lock), "600"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    engine = launch(f"attention:0,1:flock={lock}")
    line = engine.wait_for(r"sglang-phasetrace: STALL tp0, tp1 wait for [^\n]*", 300).group(0)
    said_at = time.time_ns()
    began = _began(engine.run_dir, "attention.init")
    assert set(began) == {"tp0", "tp1"}, began
    took = (said_at - max(began.values())) / S
    print(f"\nlock wait named {took:.1f} s after both ranks began waiting: {line}")
    assert took <= 15, took  # the blocked bound (8 s) and a pass or two, not the no-progress bound (120 s)
    assert f"an exclusive lock on {lock} held by pid {holder.pid} (`flock`, not part of this launch" in line
    assert "holder.py" in line and "in 'attention.init'" in line, line
    err = engine.stderr()
    assert err.count("sglang-phasetrace: STALL") == 1, err[-3000:]  # each verdict once: not per rank
    hint = next(x for x in err.splitlines() if "sglang-phasetrace: HINT" in x)
    assert "FlashInfer's JIT cache lock" in hint and "#19583" in hint
    [record] = [d for d in engine.diagnoses() if d["finding"] == "waits_on"]
    assert set(record["evidence"]) == {"tp0", "tp1"}
    for told in record["evidence"].values():
        ev = evidence.from_builtins(told)
        assert ev is not None and ev.cause == "lock" and ev.locks[0].holder_pid == holder.pid
        assert ev.locks[0].path == str(lock) and ev.locks[0].holder_in_launch is False
        assert ev.main is not None and ev.main.kind == "flock"  # the launcher is an ancestor: it reads the call
    if any("-py-spy-" in path for path in record["stacks"]):  # the dump the watchdog took: its native frame
        main = evidence.from_builtins(record["evidence"]["tp0"]).main  # type: ignore[union-attr]
        assert main is not None and main.frame and main.kind == "flock", main  # its top frame, from the dump
    # what status shows of each idle rank, read from /proc
    from sglang_phasetrace.tracing.cli import main as cli_main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli_main(["status", str(engine.run_dir), "--json"])
    doc = json.loads(out.getvalue())
    assert code != 0
    rows = {r["label"]: r for r in doc["ranks"]}
    for label in ("tp0", "tp1"):
        assert rows[label]["state"] == "stalled", rows[label]
        assert rows[label]["waits_on"].startswith(f"waits for an exclusive lock on {lock}"), rows[label]


@requires_sglang
@pytest.mark.sglang
@pytest.mark.timeout(400)
def test_a_rank_waiting_on_its_busy_compiler_child_is_busy_never_stuck(tmp_path: Path, launch) -> None:
    """tp0 runs a child named ``nvcc`` (100 % of a core for 90 s) in ``kv_cache.alloc``; tp1 waits in
    the barrier after it. The busy bound shortened to 20 s (default 60 s) to keep the test short."""
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(COMPILER.format(seconds=90))
    nvcc.chmod(0o700)
    engine = launch(f"kv:0:child={nvcc}", {"SGLANG_PHASETRACE_BUSY_S": "20", "SGLANG_PHASETRACE_STALL_S": "20"})
    line = engine.wait_for(r"sglang-phasetrace: NOTICE rank tp0 [^\n]*", 300).group(0)
    took = (time.time_ns() - _began(engine.run_dir, "kv_cache.alloc")["tp0"]) / S
    print(f"\ncompiler child said {took:.1f} s after tp0 began (busy bound 20 s): {line}")
    assert re.search(r"is busy, not stuck: its child compiles: nvcc \(pid \d+, CUDA compiler\) at \d+ % CPU, ", line)
    assert re.search(r"running \d+ s, in 'kv_cache.alloc'", line) and "tp1 waits in " in line, line  # a collective
    time.sleep(25)  # the child still works: no STALL, ever
    err = engine.stderr()
    assert "sglang-phasetrace: STALL" not in err, err[-3000:]
    assert "HINT (not a verdict) a compiler child is at work" in err  # the jit_compile row, after the notice
    [record] = [d for d in engine.diagnoses() if d["finding"] == "busy"]
    ev = evidence.from_builtins(record["evidence"]["tp0"])
    assert ev is not None and ev.busy and ev.children[0].name == "nvcc" and ev.children[0].build


@requires_sglang
@pytest.mark.sglang
@pytest.mark.timeout(400)
def test_a_rank_blocked_on_a_socket_that_never_answers_in_weight_loading(tmp_path: Path, launch) -> None:
    """tp1 sends a request to a TCP peer that accepts and never replies, inside ``model.loader``; tp0
    waits in the barrier after it. At the default settings."""
    server = socket.socket()
    with contextlib.suppress(OSError):  # a hub or proxy port when free (the hint names it), else any
        server.bind(("127.0.0.1", 8888))
    if server.getsockname()[1] == 0:
        server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(server.accept()[0]), daemon=True).start()
    try:
        engine = launch(f"loader:1:socket=127.0.0.1,{port}")
        line = engine.wait_for(r"sglang-phasetrace: STALL rank tp1 [^\n]*", 300).group(0)
        took = (time.time_ns() - _began(engine.run_dir, "model.loader")["tp1"]) / S
        print(f"\nsocket wait named {took:.1f} s after tp1 began loading: {line}")
    finally:
        for conn in held:
            conn.close()
        server.close()
    assert "is blocked in 'model.loader'" in line and "tp0 waits in barrier" in line, line
    assert re.search(rf"and waits in `recvfrom` on 127\.0\.0\.1:{port} \(connected, nothing received for \d+ s", line)
    err = engine.stderr()
    assert "storage" not in err and "UNBALANCED_MODEL_LOADING_TIMEOUT_S" not in err  # the evidence rules it out
    if port == 8888:
        assert "HINT (not a verdict) an HTTP(S) endpoint or proxy does not answer" in err
    [record] = [d for d in engine.diagnoses() if d["label"] == "tp1"]
    ev = evidence.from_builtins(record["evidence"]["tp1"])
    assert ev is not None and ev.cause == "socket" and ev.sockets[0].remote == f"127.0.0.1:{port}"
    assert ev.sockets[0].state == "ESTABLISHED"


# -- the rules, on hand-written runs (ranks of another host: ``read`` is the test's) --------------------------

T0 = 1_900_000_000 * S
DEFAULTS = Thresholds()
LOCK = "/home/u/.cache/flashinfer/90a/cached_ops/sampling.lock"


def _ev(pid: int, cause: str, since: float, now: float, **parts: object) -> Evidence:
    """What ``evidence.read`` would have found, made by hand and said by its own words."""
    main = parts.pop("main", None) or MainWait(kind="flock", words=evidence.KINDS["flock"], source="syscall",
                                               state="S", syscall="flock")  # fmt: skip
    ev = Evidence(pid=pid, t=int(now * S), cause="none", text="", main=main, waited_s=now - since, **parts)  # type: ignore[arg-type]
    done = words.finish(ev)
    assert done.cause == cause, done
    return done


def _lock(pid: int, since: float, now: float, holder: int = 4242) -> Evidence:
    held = FileLock(path=LOCK, device="254:0", inode=77, kind="flock", exclusive=True, holder_pid=holder,
                    holder_cmd="python3 /opt/other-server/holder.py --port 30000", holder_alive=True,
                    holder_has_it_open=True, holder_in_launch=False, waiters=[100, 101])  # fmt: skip
    return _ev(pid, "lock", since, now, locks=[held])


def _socket(pid: int, since: float, now: float, last_recv_s: float | None = None) -> Evidence:
    main = MainWait(kind="recv", words=evidence.KINDS["recv"], source="syscall", state="S", syscall="recvfrom", fd=9)
    sock = Socket(inode=5, proto="tcp", fd=9, local="10.0.0.2:51234", remote="10.0.0.5:443", state="ESTABLISHED",
                  rx_queue=0, tx_queue=0, retransmits=0, last_recv_s=last_recv_s,
                  meaning=f"connected, nothing received for {last_recv_s or 0:.0f} s")  # fmt: skip
    return _ev(pid, "socket", since, now, main=main, sockets=[sock], sockets_from="the descriptor it waits on")


def _compiling(pid: int, since: float, now: float) -> Evidence:
    main = MainWait(kind="wait_child", words=evidence.KINDS["wait_child"], source="syscall", state="S", syscall="wait4")
    nvcc = Child(pid=5151, ppid=pid, name="nvcc", cmd="nvcc -c /root/.cache/deep_gemm/kernel.cu", cpu_pct=99.0,
                 cpu_over="since_previous", cpu_s=60.0, sampled=now, started=since, age_s=now - since, state="running",
                 build="nvcc (CUDA compiler)")  # fmt: skip
    return _ev(pid, "child", since, now, main=main, children=[nvcc])


class Run:
    """Ranks tp0..tpN-1 (pids 100…) of another host, each entering ``phase`` at ``since``, heartbeats
    every 2 s with the given figures; ``waits``: label -> what the fake reader returns for it."""

    def __init__(self, path: Path, phase: str, since: float, ranks: int = 2) -> None:
        self.path, self.since = path, since
        self.journal: dict[str, list[dict]] = {}
        self.waits: dict[str, object] = {}
        self.read: list[str] = []
        for w in range(ranks):
            label, root, span = f"tp{w}", f"{w + 1:016x}", f"{w + 1:08x}{1:08x}"
            self.journal[label] = [
                records.process(T0, 100 + w, None, "other", "run", None, {}),
                records.identity(T0, label, "rank", {"sglang.world_rank": w, "sglang.tp_rank": w}),
                records.begin(T0, root, None, "a" * 32, f"rank {label}", {"sglang.phase": "rank"}, "MainThread"),
                records.begin(T0 + int(since * S), span, root, "a" * 32, phase, {"sglang.phase": phase}, "MainThread"),
            ]

    def beats(self, label: str, start: float, stop: float, cpu_pct: float = 1.0, child_pct: float = 0.0) -> Run:
        t, w = start, int(label[2:])
        while t < stop:
            self.journal[label].append(
                records.heartbeat(
                    T0 + int(t * S),
                    int(t * 10),
                    100 + w,
                    label,
                    False,
                    2.0,
                    [],
                    cpu_pct / 50,
                    0,
                    1,
                    dt_s=2.0,
                    main={"state": "S", "cpu_s": cpu_pct / 50},
                    io_b=0,
                    majflt=0,
                    child_cpu_s=child_pct / 50,
                )
            )
            t += 2.0
        return self

    def at(self, label: str, record: dict) -> Run:
        self.journal[label].append(record)
        return self

    def reader(self, proc) -> Evidence | None:
        self.read.append(proc.label)
        got = self.waits.get(proc.label)
        return got(proc) if callable(got) else got  # type: ignore[return-value]

    def analyze(self, t: float, notices: bool = False, read: bool = True) -> list[Finding]:
        (self.path / "journal").mkdir(parents=True, exist_ok=True)
        for label, recs in self.journal.items():
            kept = sorted((r for r in recs if r["t"] <= T0 + int(t * S)), key=lambda r: r["t"])
            (self.path / "journal" / f"other-{label}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
        view = RunView(self.path).refresh(final=True)
        return analyze(view, T0 + int(t * S), DEFAULTS, notices=notices, read=self.reader if read else None)

    def first(self, start: float, stop: float, notices: bool = False) -> tuple[float, list[Finding]]:
        t = start
        while t <= stop:
            found = self.analyze(t, notices)
            if found:
                return t, found
            t += 1.0
        return stop, []


def test_every_idle_rank_on_one_lock_is_named_within_the_blocked_bound(tmp_path: Path) -> None:
    run = Run(tmp_path, "attention.init", since=100)
    for label in ("tp0", "tp1"):
        run.beats(label, 1, 100, cpu_pct=100).beats(label, 101, 400)  # working, then asleep in the lock wait
        run.waits[label] = lambda p: _lock(p.pid, 100, time.time() - T0 / S)
    run.waits["tp0"] = lambda p: _lock(100, 100, 109)
    run.waits["tp1"] = lambda p: _lock(101, 100, 109)
    found_at, [f] = run.first(100, 200)
    assert found_at - 100 <= DEFAULTS.blocked_bound + 2, found_at  # before: the no-progress bound, 120 s
    assert (f.kind, f.label, f.phase, f.alarm) == ("waits_on", "tp0", "attention.init", True)
    assert f.message == (
        f"tp0, tp1 wait for an exclusive lock on {LOCK} held by pid 4242 (`flock`, not part of this launch: "
        "python3 holder.py --port 30000) for 9 s, in 'attention.init'"
    )
    assert set(f.evidence) == {"tp0", "tp1"} and f.pids == [100, 101]
    assert [h for h in hints.for_finding(f) if "FlashInfer's JIT cache lock" in h]
    assert [g.key for g in run.analyze(found_at + 30)] == [f.key]  # the same stall: one key, said once
    assert run.analyze(found_at, read=False) == []  # without the evidence: nothing until the no-progress bound


def test_no_early_verdict_unless_every_rank_is_idle_on_an_outside_cause(tmp_path: Path) -> None:
    run = Run(tmp_path / "busy", "attention.init", since=100)
    run.beats("tp0", 1, 400).beats("tp1", 1, 400, cpu_pct=100)  # tp1 computes: not every rank is idle
    run.waits = {"tp0": _lock(100, 100, 130), "tp1": _lock(101, 100, 130)}
    assert run.first(100, 200)[1] == []
    futex = MainWait(kind="futex", words=evidence.KINDS["futex"], source="wchan", state="S", wchan="futex_wait")
    run = Run(tmp_path / "futex", "attention.init", since=100)
    run.beats("tp0", 1, 400).beats("tp1", 1, 400)
    run.waits = {"tp0": _lock(100, 100, 130), "tp1": _ev(101, "native", 100, 130, main=futex)}
    assert run.first(100, 219)[1] == []  # a futex is no outside cause: the no-progress bound
    [f] = run.analyze(221)
    assert f.kind == "no_progress" and "tp0 waits for an exclusive lock on" in f.message
    assert "tp1 waits on a lock or condition (`futex`" in f.message and set(f.evidence) == {"tp0", "tp1"}
    run = Run(tmp_path / "recv", "model.loader", since=100)
    run.beats("tp0", 1, 400).beats("tp1", 1, 400)
    run.waits = {label: _socket(100 + w, 100, 130, last_recv_s=1.0) for w, label in enumerate(("tp0", "tp1"))}
    assert run.first(100, 200)[1] == []  # data came in a second ago: it downloads, slowly
    run = Run(tmp_path / "rendezvous", "dist.init_process_group", since=100)
    run.beats("tp0", 1, 400).beats("tp1", 1, 400)
    run.waits = {label: _socket(100 + w, 100, 130, last_recv_s=30.0) for w, label in enumerate(("tp0", "tp1"))}
    found_at, [f] = run.first(100, 200)  # another node may start late: the rendezvous rule's bound
    assert f.kind == "rendezvous" and found_at - 100 >= DEFAULTS.stall_s
    assert "; tp0, tp1 wait in `recvfrom` on 10.0.0.5:443" in f.message


def test_ranks_on_one_silent_remote_address_are_named_together(tmp_path: Path) -> None:
    run = Run(tmp_path, "model.loader", since=50, ranks=3)
    for w in range(3):
        run.beats(f"tp{w}", 1, 300)
        run.waits[f"tp{w}"] = _socket(100 + w, 50, 60, last_recv_s=10.0)
    found_at, [f] = run.first(50, 100)
    assert found_at <= 60 and f.kind == "waits_on"
    assert f.message.startswith("tp0..tp2 wait in `recvfrom` on 10.0.0.5:443 (connected, nothing received for 10 s)")
    [hint] = hints.for_finding(f)
    assert "HF_HUB_OFFLINE=1" in hint and "storage" not in hint


def test_a_rank_on_its_own_busy_child_is_never_a_stall(tmp_path: Path) -> None:
    """tp1's heartbeats miss the compiler (a grandchild, say): idle by its figures, busy by what the OS
    shows: nothing before the busy bound, then a notice naming the child; never an alarm."""
    run = Run(tmp_path, "kv_cache.alloc", since=100)
    run.at("tp0", records.collective(T0 + 101 * S, "enter", "barrier", "tp:0[0,1]", 3))
    run.beats("tp0", 1, 400).beats("tp1", 1, 400)
    run.waits["tp1"] = _compiling(101, 100, 170)
    assert run.first(100, 100 + DEFAULTS.busy_bound - 1, notices=True)[1] == []
    found_at, [f] = run.first(100, 300, notices=True)
    assert f.kind == "busy" and not f.alarm and found_at - 100 <= DEFAULTS.busy_bound + 1
    assert f.message.startswith(
        "rank tp1 (pid 101) is busy, not stuck: its child compiles: nvcc (pid 5151, CUDA compiler) at 99 % CPU, "
        "running 70 s, in 'kv_cache.alloc'"
    )
    assert "tp0 waits in barrier #3" in f.message
    assert run.first(100, 399)[1] == []  # no alarm, however long (no progress included)
    [hint] = hints.for_finding(f)
    assert "python -m sglang.compile_deep_gemm" in hint  # its command line names DeepGEMM's cache


def test_a_straggler_in_weight_loading_says_its_socket_and_gets_no_storage_hint(tmp_path: Path) -> None:
    run = Run(tmp_path, "model.loader", since=100)
    run.at("tp0", records.collective(T0 + 101 * S, "enter", "barrier", "tp:0[0,1]", 3))
    run.beats("tp0", 1, 400).beats("tp1", 1, 400)
    run.waits["tp1"] = _socket(101, 100, 110, last_recv_s=10.0)
    found_at, [f] = run.first(100, 200)
    assert f.kind == "straggler" and found_at - 100 <= DEFAULTS.blocked_bound + 2
    assert (
        "is blocked in 'model.loader' for " in f.message
        and "(1 % CPU, sleeping; no GPU figures) and waits in " in f.message
    )
    assert "`recvfrom` on 10.0.0.5:443 (connected, nothing received for 10 s): tp0 waits in barrier #3" in f.message
    assert run.read == ["tp1"] * len(run.read)  # only the rank a rule names is read, never its healthy peer
    [hint] = hints.for_finding(f)
    assert "HF_HUB_OFFLINE=1" in hint and "storage" not in hint
    no_evidence = run.analyze(found_at, read=False)[0]
    assert "storage" in hints.for_finding(no_evidence)[0]  # the phase's hint, without the evidence


def test_a_rank_that_vanished_or_cannot_be_read_costs_a_detail_not_the_verdict(tmp_path: Path) -> None:
    run = Run(tmp_path, "model.loader", since=100)
    run.at("tp0", records.collective(T0 + 101 * S, "enter", "barrier", "tp:0[0,1]", 3))
    run.beats("tp0", 1, 400).beats("tp1", 1, 400)
    run.waits["tp1"] = Evidence(pid=101, t=T0, cause="gone", gone=True, text="ended before or while it was read")
    [f] = run.analyze(120)
    assert f.kind == "straggler" and " and waits" not in f.message and "tp0 waits in barrier" in f.message
    view = RunView(tmp_path).refresh(final=True)
    tp1 = next(p for p in view.ranks if p.label == "tp1")
    reader = RankReader()
    assert reader.start(view)(tp1) is None  # another host's rank: never read here

    def broken(*args: object, **kwargs: object) -> Evidence:
        raise RuntimeError("a bug in a reader")

    tp1.host = procs.this_host()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ranks_mod, "read", broken)
        assert reader.start(view)(tp1) is None


# -- records, exports, the cross-node snapshot --------------------------------------------------------------


def test_the_diagnosis_record_carries_what_each_named_rank_waits_on(tmp_path: Path) -> None:
    f = Finding("waits_on", "tp0", 100, "attention.init", 9.0, "tp0, tp1 wait for …")
    f.keep({"tp0": _lock(100, 100, 109), "tp1": _lock(101, 100, 109)})
    record = diagnosis_record(f)
    assert schema.validate(json.loads(json.dumps(record))) is None
    back = from_record(record)
    assert back.evidence == f.evidence and evidence.from_builtins(back.evidence["tp1"]) == _lock(101, 100, 109)
    too_long = msgspec.structs.replace(_lock(100, 100, 109), text="x" * 5000)
    assert (
        Finding("straggler", "tp0", 100, None, 1.0, "m").keep({"tp0": too_long}).evidence == {}
    )  # left out, not refused
    bad = {**record, "evidence": {"tp0": {**record["evidence"]["tp0"], "pid": -1}}}
    assert schema.validate(bad) is not None  # a reader refuses it, naming the field
    many = {f"tp{i}": record["evidence"]["tp0"] for i in range(17)}
    assert schema.validate({**record, "evidence": many}) is not None


def test_exports_carry_what_the_culprit_waits_on(tmp_path: Path) -> None:
    from sglang_phasetrace.tracing.render import jaeger, otlp_json, perfetto
    from sglang_phasetrace.tracing.render.html_report import render_report
    from sglang_phasetrace.tracing.render.lanes import layout

    run = Run(tmp_path, "attention.init", since=100)
    run.beats("tp0", 1, 150).beats("tp1", 1, 150)
    run.waits = {"tp0": _lock(100, 100, 110), "tp1": _lock(101, 100, 110)}
    [f] = run.analyze(110)
    lay = layout(RunView(tmp_path).refresh(final=True), T0 + 110 * S)
    spans = [
        s for t in jaeger.to_jaeger(lay, [f])["data"] for s in t["spans"] if s["operationName"] == "attention.init"
    ]
    assert len(spans) == 2  # both ranks the verdict names
    for span in spans:
        tags = {t["key"]: t["value"] for t in span["tags"]}
        assert tags["phasetrace.waits_on.lock.file"] == LOCK and tags["phasetrace.waits_on.lock.holder_pid"] == 4242
        assert tags["phasetrace.waits_on.cause"] == "lock" and tags["phasetrace.waits_on"].startswith("waits for an")
        assert tags["phasetrace.verdict"].startswith("STALL tp0, tp1 wait for an exclusive lock")
    otlp = [
        s
        for r in otlp_json.to_otlp_json(lay, [f])["resourceSpans"]
        for s in r["scopeSpans"][0]["spans"]
        if s["name"] == "attention.init"
    ]
    assert all(any(a["key"] == "phasetrace.waits_on.lock.holder_cmd" for a in s["attributes"]) for s in otlp)
    events = [e for e in perfetto.to_perfetto(lay, [f])["traceEvents"] if e.get("cat", "").endswith("attention.init")]
    assert events and all(e["args"]["phasetrace.waits_on.lock.file"] == LOCK for e in events)
    page = render_report(lay, [f], by_process(lay.run, [f]))
    assert '<table class="evidence">' in page and "lock.holder_cmd" in page and "holder.py --port 30000" in page


HOLDS = """
import fcntl, sys, time
f = open(sys.argv[1], "a")
fcntl.flock(f, fcntl.LOCK_EX)
print("ready", flush=True)
time.sleep(120)
"""


def test_node0_says_what_a_rank_on_node1_waits_on_without_reading_it(tmp_path: Path, outside, monkeypatch) -> None:
    """Node 1's launcher reads its own suspect rank (a real process waiting for a lock) and sends it in
    its snapshot; node 0 names it from there, reading and signalling nothing of node 1."""
    lock = tmp_path / ".triton" / "cache" / "k.lock"
    lock.parent.mkdir(parents=True)
    (tmp_path / "holds.py").write_text(HOLDS)
    holder = outside([sys.executable, str(tmp_path / "holds.py"), str(lock)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
    rank = outside([sys.executable, "-c", f"import fcntl; fcntl.flock(open({str(lock)!r}, 'a'), fcntl.LOCK_EX)"])
    deadline = time.monotonic() + 10
    while not any(ln.waiting and ln.pid == rank.pid for ln in evidence.read_locks() or []):
        assert time.monotonic() < deadline, "the rank never waited"
        time.sleep(0.05)
    now, here = time.time_ns(), procs.this_host()
    t0 = now - 60 * S
    node1, node0 = tmp_path / "n1", tmp_path / "n0"
    _rank_journal(node1, rank.pid, "tp1", 1, here, t0, now, waits=False)
    peer = outside([sys.executable, "-c", "import time; time.sleep(120)"])  # tp0, on node 0
    _rank_journal(node0, peer.pid, "tp0", 0, "node0-host", t0, now, waits=True)
    addr = "10.9.9.9:29500"  # never connected to: the snapshot is handed over below

    one = Watchdog(node1, Thresholds(), out=io.StringIO(), py_spy=False)
    one.node, one.crossnode = 1, crossnode.CrossNode(crossnode.Node(1, 2, addr), node1, "2" * 32, 2.0, 30.0)
    one.step()  # reads its suspect rank ...
    one.step()  # ... and offers what it read in its next snapshot
    payload = one.crossnode.outbox
    assert payload is not None
    sent = next(p for p in relay.decode(payload, Snapshot).procs if p.evidence is not None)
    assert sent.evidence.cause == "lock" and sent.evidence.locks[0].holder_pid == holder.pid

    monkeypatch.setattr(procs, "this_host", lambda: "node0-host")  # node 0 runs elsewhere
    asked: list[int] = []
    real_read = ranks_mod.read
    monkeypatch.setattr(ranks_mod, "read", lambda pid, **kw: asked.append(pid) or real_read(pid, **kw))
    out = io.StringIO()
    zero = Watchdog(node0, Thresholds(), out=out, py_spy=False)
    zero.crossnode = crossnode.CrossNode(crossnode.Node(0, 2, addr), node0, "1" * 32, 2.0, 30.0)
    zero.crossnode.inbox = {1: payload}
    found = zero.step()
    [f] = [f for f in found if f.label == "tp1"]
    assert f.kind == "straggler" and "on node-1) is blocked in 'attention.init'" in f.message
    assert f"and waits for an exclusive lock on {lock} held by pid {holder.pid}" in f.message, f.message
    assert "HINT (not a verdict) Triton's kernel cache" in out.getvalue()
    assert rank.pid not in asked and f.stacks == []  # node 1's rank: never read, never signalled from node 0


def _rank_journal(run: Path, pid: int, label: str, node: int, host: str, t0: int, now: int, waits: bool) -> None:
    """A rank's journal: in ``attention.init`` since ``t0`` + 1 s (``waits``: it left it and waits in a
    TP barrier), idle heartbeats every 2 s up to ``now``."""
    trace, w = f"{node + 1:032x}", int(label[2:])
    ident = {"sglang.world_rank": w, "sglang.tp_rank": w, "sglang.node_rank": node}
    root = records.begin(t0, f"{10 + node:016x}", None, trace, f"rank {label}", {"sglang.phase": "rank"}, "MainThread")
    attrs = {"sglang.phase": "attention.init"}
    phase = records.begin(t0 + S, f"{20 + node:016x}", root["span"], trace, "attention.init", attrs, "MainThread")
    recs = [
        records.process(t0, pid, None, host, run.name, t0, {}, start_ticks=procs.start_ticks(pid)),
        records.identity(t0, label, "rank", ident),
        root,
        phase,
    ]
    if waits:
        recs += [
            records.end(t0 + 2 * S, phase["span"], "ok", {}),
            records.collective(t0 + 2 * S, "enter", "barrier", "tp:0[0,1]", 5),
        ]
    recs += [
        records.heartbeat(
            t,
            i,
            pid,
            label,
            False,
            2.0,
            [],
            0.01,
            0,
            1,
            dt_s=2.0,
            main={"state": "S", "cpu_s": 0.01},
            io_b=0,
            majflt=0,
            child_cpu_s=0.0,
        )
        for i, t in enumerate(range(t0, now, 2 * S))
    ]
    (run / "journal").mkdir(parents=True, exist_ok=True)
    (run / "journal" / f"{host}-{pid}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
