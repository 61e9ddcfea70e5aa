"""The serving hot path is untouched: once a traced process is ready, requests call no patched wrapper.

At ready — serving: an ``Engine``'s ranks once initialised, ``launch_server``'s at "ready to roll"
(``tests/test_serving.py``) — the init-only patches (the collectives, the warm-up's forward pass)
come off, copies included; whatever patched wrapper still runs after ready is counted per process,
with what tracing added to it, in the ``runtime_calls`` field of the process's status file. End to
end: a real ``sglang.Engine`` (tp=2, CPU, tiny model) under the hook (``tests/programs/serve_engine.py``),
heartbeats every 0.5 s, a batch of generate requests, then a weight reload (init work rerun after ready).
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest
from conftest import ROOT, hook_env, kill_group, requires_sglang, run_dirs
from sglang_phasetrace.patches import PatchEngine, Phase
from sglang_phasetrace.tracing import keys
from sglang_phasetrace.tracing.reader.load import load_run
from sglang_phasetrace.tracing.recorder import heartbeat, runtime

PROGRAM = ROOT / "tests" / "programs" / "serve_engine.py"
HEARTBEAT_S = 0.5


# -- in-process: the counting, and the copies taken off at ready -----------------------------------
def test_wrapper_calls_after_ready_are_counted_with_their_cost(trace_run_dir: Path, make_module) -> None:
    mod = make_module(
        "def recapture(): return 1\ndef probe(): return 2\ndef all_reduce(): return 3\ndef forward(): return 4\n"
    )
    PatchEngine(
        [
            Phase("t.recapture", (f"{mod.__name__}:recapture",)),
            Phase("t.probe", (f"{mod.__name__}:probe",), after_ready="skip"),
            Phase("t.collective", (f"{mod.__name__}:all_reduce",), kind="collective"),
            Phase("t.forward", (f"{mod.__name__}:forward",), kind="warmup"),  # a copy left once serving
        ]
    ).apply_module(mod.__name__)
    calls = (mod.recapture, mod.probe, mod.all_reduce, mod.forward)
    assert [f() for f in calls] == [1, 2, 3, 4]  # during init: not counted
    rt = runtime.current()
    assert rt.runtime_calls == {}
    rt.mark_ready()
    for _ in range(3):
        assert [f() for f in calls] == [1, 2, 3, 4]
    summary = rt.runtime_calls_summary()
    assert {name: c["calls"] for name, c in summary.items()} == {
        "t.recapture": 3,
        "t.probe": 3,
        "t.collective": 3,
        "t.forward": 3,
    }
    assert all(c["cost_us"] > 0 for c in summary.values())
    assert summary["t.recapture"]["cost_us"] > summary["t.probe"]["cost_us"]  # a span costs more than a check
    heartbeat.current().beat()
    assert json.loads(heartbeat.current().status_path.read_text())["runtime_calls"] == rt.runtime_calls_summary()


@pytest.mark.parametrize("wait", [True, False])
def test_copies_made_after_patching_are_restored(trace_run_dir: Path, make_module, wait: bool) -> None:
    """``import *`` after the post-import hook copies the wrapper (as ``torch.distributed`` does
    with the c10d collectives); the engine's undo finds that copy too (on a thread: bootstrap at ready)."""
    mod = make_module("def all_reduce(): return 3\ndef load(): return 4\n")
    original = mod.all_reduce
    engine = PatchEngine(
        [
            Phase("t.hot", (f"{mod.__name__}:all_reduce",), kind="collective", init_only=True),
            Phase("t.load", (f"{mod.__name__}:load",)),
        ]
    )
    engine.apply_module(mod.__name__)
    reexport = make_module(f"from {mod.__name__} import *\n")
    assert reexport.all_reduce is not original
    assert engine.unapply(lambda phase: phase.init_only, wait=wait) == 1
    assert mod.all_reduce is original
    deadline = time.monotonic() + 10
    while reexport.all_reduce is not original and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reexport.all_reduce is original
    assert reexport.load is mod.load and reexport.load is not mod.load.__wrapped__  # labelled phases stay


# -- end to end: a real Engine serving a batch --------------------------------------------------
class Served:
    """The running ``serve_engine.py``: send a command, read its one-line JSON answer; read the
    processes' status files."""

    def __init__(self, proc: subprocess.Popen, base: Path) -> None:
        self.proc, self.base = proc, base
        self.answers: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self.answers.put(line) for line in proc.stdout], daemon=True).start()

    @classmethod
    def start(cls, model: Path, runs: Path, cwd: Path, err: IO[str]) -> Served:
        """``serve_engine.py`` tp=2 under the hook (run directories in ``runs``), its own process group;
        its answers on stdout, its log to ``err`` (``cwd/engine.err``, which a missing answer shows)."""
        proc = subprocess.Popen(
            [sys.executable, str(PROGRAM), str(model), "--tp", "2"],
            env=hook_env(runs, {"SGLANG_PHASETRACE_HEARTBEAT_S": str(HEARTBEAT_S)}),
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
        return cls(proc, cwd)

    def answer(self, timeout: float) -> dict:
        try:
            return json.loads(self.answers.get(timeout=timeout))
        except queue.Empty:
            log = (self.base / "engine.err").read_text()[-4000:]
            raise AssertionError(f"no answer in {timeout} s:\n{log}") from None

    def ask(self, command: str, timeout: float = 180) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.answer(timeout)

    @property
    def run_dir(self) -> Path:
        (run_dir,) = run_dirs(self.base)
        return run_dir

    def statuses(self, after_ns: int, timeout: float = 30) -> dict[str, dict]:
        """label -> latest status record of the launcher and each rank, once every one is newer than
        ``after_ns`` (so it counts every call made before then)."""
        deadline = time.monotonic() + timeout
        while True:
            records = {}
            for path in (self.run_dir / "status").glob("*.json"):
                try:
                    record = json.loads(path.read_text())
                except (OSError, json.JSONDecodeError):
                    continue
                if record["label"] == "launcher" or record["label"].startswith("tp"):  # not the detokenizer's
                    records[record["label"]] = record
            if {"launcher", "tp0", "tp1"} <= set(records) and all(r["t"] > after_ns for r in records.values()):
                return records
            assert time.monotonic() < deadline, f"no fresh heartbeats: {[(k, r['t']) for k, r in records.items()]}"
            time.sleep(HEARTBEAT_S / 2)


@pytest.fixture(scope="module")
def served(tiny_model: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("hot-path")
    with open(base / "engine.err", "w") as err:
        server = Served.start(tiny_model[0], base, base, err)
    proc = server.proc
    try:
        assert server.answer(timeout=300).get("ready")
        yield server
        proc.stdin.close()  # serve_engine shuts the engine down at end of input
        proc.wait(timeout=60)
    finally:
        kill_group(proc.pid)
        proc.wait(timeout=30)


def calls(record: dict, phase: str) -> int:
    return record.get("runtime_calls", {}).get(phase, {}).get("calls", 0)


@requires_sglang
@pytest.mark.sglang
def test_serving_a_batch_calls_no_patched_wrapper(served: Served) -> None:
    """The decode hot path is untouched: between a heartbeat before the batch and one after it,
    no process (launcher, tp0, tp1) counted a single wrapper call."""
    before = served.statuses(time.time_ns())
    done = served.ask("generate 16")
    assert done["tokens"] == [8] * 16
    after = served.statuses(done["t"])
    for label, record in after.items():
        assert record["ready"] is True, label
        assert record.get("runtime_calls", {}) == before[label].get("runtime_calls", {}), label
        assert keys.PHASE_WARMUP not in record.get("runtime_calls", {}), label  # the forward wrapper is off
    for rank in load_run(served.run_dir).ranks:  # an Engine's ranks serve once initialised: no warm-up pass
        assert not [s for s in rank.spans.values() if s.phase == keys.PHASE_WARMUP], rank.label


@requires_sglang
@pytest.mark.sglang
def test_init_work_rerun_after_ready_is_labelled_runtime_with_its_cost(served: Served) -> None:
    """A weight reload reruns SGLang's weight iterator in each rank: one span labelled
    ``phasetrace.after_ready``, counted with its cost in the status file."""
    before = served.statuses(time.time_ns())
    done = served.ask("reload")
    assert done["ok"], done["message"]
    after = served.statuses(done["t"])
    for label in ("tp0", "tp1"):
        assert calls(after[label], "model.weights_iterator") == calls(before[label], "model.weights_iterator") + 1
        assert after[label]["runtime_calls"]["model.weights_iterator"]["cost_us"] > 0
    for rank in load_run(served.run_dir).ranks:
        iterators = [s for s in rank.spans.values() if s.phase == "model.weights_iterator"]
        runtime_spans = [s for s in iterators if s.attrs.get("phasetrace.after_ready") is True]
        assert len(runtime_spans) == 1 and len(iterators) == 2, rank.label
        assert runtime_spans[0].status == "ok"
