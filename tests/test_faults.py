"""Faults an operator meets, tried for real: signals on ranks blocked in C, processes that are not
ours, a rank killed in weight loading. Real SGLang on CPU (gloo), bounded, process groups killed.

Each signal test runs the same program traced and untraced and compares how the rank ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import HOOKS, ROOT, SCRIPTS, dist_ranks, hook_env, kill_group, requires_sglang
from sglang_phasetrace.tracing import other_processes as procs
from sglang_phasetrace.tracing.journal import records
from sglang_phasetrace.tracing.reader.load import load_run

pytestmark = [requires_sglang, pytest.mark.sglang]
PLANTS = ROOT / "tests" / "plants"


class Ranks:
    """tests/programs/dist_ranks.py, 2 gloo ranks, rank 1 blocked before model-parallel groups: rank 0
    then waits in a gloo collective (C++). Started traced or not, in its own process group."""

    def __init__(self, model: Path, base: Path, traced: bool, ignore: tuple[int, ...] = ()) -> None:
        self.base = base
        self.planted = base / "planted"  # rank 1 is in its plant: rank 0 is past init_process_group
        base.mkdir(parents=True, exist_ok=True)
        extra = {"SGLANG_PHASETRACE_RUN_DIR": str(base / "run"), "DIST_RANKS_PLANTED": str(self.planted)}
        env = hook_env(base, extra, hooks=traced)
        args = [sys.executable, *dist_ranks(model, 2, "sleep", 1)]

        def setup() -> None:
            for sig in ignore:  # as a shell does for background jobs
                signal.signal(sig, signal.SIG_IGN)

        self.proc = subprocess.Popen(
            args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, preexec_fn=setup
        )

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc: object) -> None:
        kill_group(self.proc.pid)
        self.proc.communicate(timeout=30)

    def rank0_waiting(self, timeout: float = 120) -> psutil.Process:
        """Rank 0's process once it has waited a while inside gloo for rank 1, blocked in its plant
        (before that, rank 0 may still wait in init_process_group's store barrier: a Python loop)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.planted.exists():
                time.sleep(0.5)
                continue
            children = [c for c in psutil.Process(self.proc.pid).children() if "spawn_main" in " ".join(c.cmdline())]
            ranks = sorted(children, key=lambda c: c.create_time())
            if len(ranks) == 2 and _in_gloo(ranks[0]):
                return ranks[0]
            time.sleep(0.5)
        raise AssertionError("rank 0 never waited in gloo")


def _in_gloo(proc: psutil.Process) -> bool:
    """Blocked in C for a while: sleeping, with a gloo thread or a TCP connection to its peer."""
    try:
        return (
            proc.status() == psutil.STATUS_SLEEPING
            and proc.cpu_times().user > 1.0
            and bool(proc.net_connections(kind="tcp"))
            and _idle(proc)
        )
    except psutil.Error:
        return False


def _idle(proc: psutil.Process) -> bool:
    before = sum(proc.cpu_times()[:2])
    time.sleep(1.0)
    return sum(proc.cpu_times()[:2]) - before < 0.2


def _ended(proc: psutil.Process, timeout: float) -> float | None:
    """Seconds until ``proc`` is gone or a zombie; None if it was still running at ``timeout``."""
    tic = time.monotonic()
    while time.monotonic() - tic < timeout:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return time.monotonic() - tic
        except psutil.NoSuchProcess:
            return time.monotonic() - tic
        time.sleep(0.02)
    return None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGQUIT])
def test_signal_ends_a_rank_blocked_in_gloo_exactly_as_untraced(sig: signal.Signals, tiny_model, tmp_path) -> None:
    """Seconds from the signal to the rank's end (None: still running), traced and not."""
    seen = {}
    # SIGINT: Python raises KeyboardInterrupt when the main thread is back in Python. Rank 0 waits in
    # C (gloo's process group setup, for rank 1's address in the store) with no Python turn for
    # minutes; if it had one (torch's store barrier: waits of 10 s in a Python loop) it would end
    # then: watched for 25 s, traced or not, it ends the same.
    window = 25 if sig == signal.SIGINT else 10
    for traced in (False, True):
        with Ranks(tiny_model[0], tmp_path / f"traced-{traced}", traced) as ranks:
            rank0 = ranks.rank0_waiting()
            rank0.send_signal(sig)
            seen[traced] = _ended(rank0, window)
    if sig == signal.SIGINT:
        assert (seen[False] is None) == (seen[True] is None), seen
        assert all(t is None or t < 12 for t in seen.values()), seen  # at the barrier's next turn
    else:
        assert seen[False] is not None and seen[False] < 2, seen
        assert seen[True] is not None and seen[True] < 2, f"traced rank did not die on {sig.name}: {seen}"


def test_ignored_signal_stays_ignored_and_nothing_is_closed(tiny_model, tmp_path) -> None:
    """A launch started with SIGINT/SIGQUIT ignored (a background job): the traced rank keeps them
    ignored, goes on, and its journal does not end any phase because of them."""
    with Ranks(tiny_model[0], tmp_path, traced=True, ignore=(signal.SIGINT, signal.SIGQUIT)) as ranks:
        rank0 = ranks.rank0_waiting()
        for sig in (signal.SIGINT, signal.SIGQUIT):
            rank0.send_signal(sig)
        time.sleep(2)
        assert rank0.is_running() and rank0.status() != psutil.STATUS_ZOMBIE
        run = load_run(tmp_path / "run")
        proc = next(p for p in run.processes if p.pid == rank0.pid)
        assert proc.open_spans and not [s for s in proc.spans.values() if s.status == "incomplete"]


def test_watchdog_never_signals_a_process_that_is_not_ours(tmp_path) -> None:
    """A journal naming a live pid that is not the process which wrote it (recycled pid, old run):
    the stall is reported, and that process receives nothing (SIGUSR2's default would kill it)."""
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run_dir = silent_rank_run(tmp_path, stranger.pid, start_ticks=None)  # an old journal: no start time
        done = watch(run_dir, {"SGLANG_PHASETRACE_STACK_SIGNAL": "SIGKILL"})
        text = done.stderr
        assert done.returncode == 3, text
        assert stranger.poll() is None, "the stranger was signalled"
        assert text.count("SIGKILL") == 1 and "using SIGUSR2" in text  # a bad signal: one warning, the default
        assert "sglang-phasetrace: STALL" in text  # and the verdict still comes
    finally:
        stranger.kill()
        stranger.wait()


def test_a_recycled_pid_is_gone_not_signalled(tmp_path) -> None:
    """The journal's start time differs from the live pid's: that rank is gone, the pid is another
    process now; it is reported as gone and never signalled."""
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run_dir = silent_rank_run(tmp_path, stranger.pid, start_ticks=(procs.start_ticks(stranger.pid) or 0) + 1)
        done = watch(run_dir)
        assert "DIED rank tp1" in done.stderr and "is gone" in done.stderr, done.stderr
        assert stranger.poll() is None, "the stranger was signalled"
    finally:
        stranger.kill()
        stranger.wait()


def watch(run_dir: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``phasetrace watch RUN_DIR --exit-on-stall`` as a user runs it (faulthandler stacks only)."""
    argv = ["watch", str(run_dir), "--exit-on-stall", "--timeout", "20", "--no-py-spy"]
    return subprocess.run(
        [sys.executable, "-m", "sglang_phasetrace.tracing.cli", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


def silent_rank_run(tmp_path: Path, pid: int, start_ticks: int | None) -> Path:
    """A run directory whose rank tp1 (``pid`` on this host) is inside a phase with its last heartbeat
    a minute old."""
    import json

    run_dir = tmp_path / "run"
    (run_dir / "journal").mkdir(parents=True)
    now = time.time_ns()
    t0 = now - 90 * 10**9
    host = procs.this_host()
    attrs = {"sglang.tp_rank": 1, "sglang.role": "rank", "sglang.rank": "tp1"}
    proof = {"start_ticks": start_ticks, "boot_id": procs.boot_id()} if start_ticks else {}
    journal = [
        records.process(t0, pid, 1, host, "run", t0, {}, **proof),
        records.identity(t0, "tp1", "rank", attrs),
        records.begin(t0, "a" * 16, None, "b" * 32, "rank tp1", {"sglang.phase": "rank"}, "MainThread"),
        records.begin(
            t0 + 10**9, "c" * 16, "a" * 16, "b" * 32, "model.loader", {"sglang.phase": "model.loader"}, "MainThread"
        ),
        records.heartbeat(now - 60 * 10**9, 1, pid, "tp1", False, 5.0, [], 0.0, 1, 1),
    ]
    (run_dir / "journal" / f"{host}-{pid}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in journal))
    return run_dir


def test_rank_sigkilled_in_weight_loading_is_named_by_the_launcher_before_teardown(tiny_model, tmp_path) -> None:
    """Engine tp=2; tp1 is SIGKILLed inside the model loader (as by the OOM killer). tp0 then fails
    at SGLang's post-load barrier, SIGQUITs the launcher, and SGLang kills the tree: the launcher's
    last words name tp1, how it ended and where, tp0 as a consequence, and the root cause."""
    env = hook_env(
        tmp_path,
        {
            "PYTHONPATH": os.pathsep.join([str(HOOKS), str(PLANTS)]),
            "PLANT_KILL_TP_RANK": "1",
            "SGLANG_PHASETRACE_RUN_DIR": str(tmp_path / "run"),
        },
    )
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "start_engine.py"), str(tiny_model[0]), "--tp", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=240)
    finally:
        kill_group(proc.pid)
    assert proc.returncode != 0
    ours = [line for line in err.splitlines() if line.startswith("sglang-phasetrace:")]
    died = [line for line in ours if " DIED rank tp1 " in line]
    assert len(died) == 1, err[-4000:]
    assert "killed by SIGKILL (likely the OOM killer" in died[0] and "in 'model.loader'" in died[0]
    root = [line for line in ours if "ROOT CAUSE rank tp1" in line]
    assert len(root) == 1 and "SIGKILL" in root[0], ours
    consequences = [line for line in ours if "rank tp0" in line and "a consequence of tp1's death" in line]
    assert consequences or "tp0 ended as a consequence" in root[0], ours
    launcher = next(p for p in load_run(tmp_path / "run").processes if p.role == "launcher")
    exits = [r for r in launcher.told if r["kind"] == "exit" and r.get("label") == "tp1"]
    assert exits and exits[0]["signal"] == "SIGKILL"
    print("\n".join(ours))


def test_rank_hung_before_its_first_phase_is_named_by_the_launcher(tiny_model, tmp_path) -> None:
    """Engine tp=2; tp1 hangs at the top of its process, before Scheduler.__init__. The launcher
    knows tp1's pid from spawning it, tp1 is visible (journal, heartbeats, identity) from its first
    ``import sglang``, and one line names it while tp0 waits for it."""
    run_dir = tmp_path / "run"
    env = hook_env(
        tmp_path,
        {
            "PYTHONPATH": os.pathsep.join([str(HOOKS), str(PLANTS)]),
            "PLANT_HANG_EARLY_TP_RANK": "1",
            "SGLANG_PHASETRACE_RUN_DIR": str(run_dir),
        },
    )
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPTS / "start_engine.py"), str(tiny_model[0]), "--tp", "2"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        named: list[str] = []
        while time.monotonic() < deadline and not named and proc.poll() is None:
            time.sleep(1)
            named = [
                line
                for line in err_path.read_text().splitlines()
                if line.startswith("sglang-phasetrace:") and "rank tp1" in line
            ]
    finally:
        kill_group(proc.pid)
        proc.wait(30)
    assert len(named) == 1, err_path.read_text()[-4000:]
    assert "before its first phase" in named[0] or "has not reached its first phase" in named[0], named
    run = load_run(run_dir)
    (tp1,) = [p for p in run.ranks if p.label == "tp1"]
    assert tp1.spans == {} and tp1.heartbeats, "visible from import, before any phase"
