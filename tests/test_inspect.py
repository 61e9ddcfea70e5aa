"""``phasetrace inspect`` without SGLang: its bad inputs (no such pid, not SGLang, a zombie, a process
that ends mid-read, py-spy missing or refused by ptrace), a launch traced after all, and the frame
reading (phases through the patch tables, collectives, SGLang's process titles).

A "launch" here is a stand-in: Python processes titled as SGLang 0.5.23 titles its own
(``setproctitle("sglang::scheduler_TP0")``), below a launcher process; no SGLang runs. The real,
untraced SGLang launches are in tests/test_inspect_real.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import end_group
from sglang_phasetrace.tracing.cli.doctor import phase_targets
from sglang_phasetrace.tracing.verdicts.inspect.frames import PhaseMap, collective, module_of, serving
from sglang_phasetrace.tracing.verdicts.inspect.launch import role_of

pytest.importorskip("setproctitle")

ALARMS = ("STALL", "DIED", "FAILED", "NOT STARTED", "STOPPED")
RANK = "import sys, time, setproctitle\nsetproctitle.setproctitle(sys.argv[1])\ntime.sleep(float(sys.argv[2]))\n"
LAUNCHER = """
import subprocess, sys, time
ranks = [subprocess.Popen([sys.executable, "-c", sys.argv[3], f"sglang::scheduler_TP{n}", sys.argv[1]]) for n in (0, 1)]
if sys.argv[2] == "zombie":  # the ranks end and are never collected
    time.sleep(600)
for r in ranks:
    r.wait()
if sys.argv[2] != "end":  # else the whole launch ends with its ranks
    time.sleep(600)
"""


def inspect(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sglang_phasetrace.tracing.cli", "inspect", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def ranks_of(launcher: int, timeout: float = 20) -> list[int]:
    """The pids titled ``sglang::scheduler_TP*`` below ``launcher``, once both are up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = []
        for name in os.listdir("/proc"):
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rpartition(")")[2].split()[1])
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    title = f.read().decode(errors="replace")
            except (OSError, ValueError, IndexError):
                continue
            if ppid == launcher and title.startswith("sglang::scheduler"):
                found.append(int(name))
        if len(found) == 2:
            return sorted(found)
        time.sleep(0.1)
    raise AssertionError("the stand-in ranks did not come up")


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator:
    """Start a stand-in launch: ``start(rank_seconds, env)`` -> (launcher, [tp0, tp1])."""
    started: list[subprocess.Popen] = []

    def start(rank_s: str = "600", env: dict[str, str] | None = None, mode: str = "") -> tuple[int, list[int]]:
        proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, rank_s if rank_s != "zombie" else "1.5", mode or rank_s, RANK],
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        started.append(proc)
        return proc.pid, ranks_of(proc.pid)

    yield start
    for proc in started:
        end_group(proc)


def no_traceback(done: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in done.stdout + done.stderr, done.stderr


def test_a_pid_that_does_not_exist() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    done = inspect(str(gone.pid))
    no_traceback(done)
    assert done.returncode == 1 and f"pid {gone.pid}: no such process" in done.stderr


def test_a_process_that_is_not_sglang() -> None:
    other = subprocess.Popen(["sleep", "60"])
    try:
        done = inspect(str(other.pid))
    finally:
        other.kill()
        other.wait()
    no_traceback(done)
    assert done.returncode == 1 and f"pid {other.pid} is not an SGLang process (sleep 60)" in done.stderr


def test_a_zombie_rank(stand_in) -> None:
    _, ranks = stand_in("zombie")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and open(f"/proc/{ranks[1]}/stat").read().rpartition(")")[2].split()[0] != "Z":
        time.sleep(0.1)
    done = inspect(str(ranks[1]))
    no_traceback(done)
    assert done.returncode == 4 and f"pid {ranks[1]} is a zombie" in done.stderr


def test_a_rank_that_ends_while_it_is_read(stand_in) -> None:
    _, ranks = stand_in("3")  # the ranks end 3 s after they start: inside the 3 s window
    done = inspect(str(ranks[0]))
    no_traceback(done)
    assert done.returncode == 4, done.stdout + done.stderr
    assert done.stdout.startswith("sglang-phasetrace: DIED tp0 (pid"), done.stdout
    assert "ended while it was read" in done.stdout.splitlines()[0]


def test_a_launch_that_ends_while_it_is_read(stand_in) -> None:
    launcher, _ = stand_in("3", mode="end")
    done = inspect(str(launcher))
    no_traceback(done)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith(f"sglang-phasetrace: ended: launch pid {launcher} ended while it was read")


def test_py_spy_missing_or_refused_judges_from_proc_alone(stand_in, tmp_path: Path) -> None:
    launcher, ranks = stand_in()
    missing = inspect(str(launcher), "--window", "1", "--py-spy", str(tmp_path / "no-py-spy"))
    no_traceback(missing)
    assert missing.returncode == 3, missing.stdout + missing.stderr
    assert "py-spy is not installed (pip install py-spy): no stacks; judged from /proc alone" in missing.stdout
    assert missing.stdout.startswith("sglang-phasetrace: STALL no rank moved in 1 s (no stacks: from /proc alone)")
    fake = tmp_path / "py-spy"
    refusal = "Error: Failed to suspend process: Operation not permitted (os error 1)"
    fake.write_text(f'#!/bin/sh\necho "{refusal}" >&2\nexit 1\n')  # what py-spy says without ptrace
    fake.chmod(0o700)
    refused = inspect(str(ranks[1]), "--window", "1", "--py-spy", str(fake))
    no_traceback(refused)
    assert refused.returncode == 3
    notes = [line for line in refused.stdout.splitlines() if "ptrace is not allowed" in line]
    assert len(notes) == 1 and "kernel.yama.ptrace_scope=0" in notes[0] and "CAP_SYS_PTRACE" in notes[0]
    assert "waits on a sleep" in refused.stdout  # what /proc says each rank waits on


def test_stand_in_stacks_are_read_and_the_launch_is_found_from_any_pid(stand_in) -> None:
    launcher, ranks = stand_in()
    done = inspect(str(ranks[1]), "--window", "1", "--json")
    no_traceback(done)
    import json

    doc = json.loads(done.stdout)
    procs = {p["label"]: p for p in doc["launches"][0]["processes"]}
    assert doc["launches"][0]["launcher"] == launcher and {"tp0", "tp1", "launcher"} <= set(procs)
    assert procs["tp1"]["pid"] == ranks[1] and procs["tp1"]["state"] == "blocked"
    assert "<module> (<string>:3)" in procs["tp1"]["stack"]  # read with py-spy
    assert doc["exit_code"] == 3 and doc["launches"][0]["verdict"] == "STALL"


def test_a_traced_launch_says_so(stand_in, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    launcher, _ = stand_in(env={"SGLANG_PHASETRACE_RUN_DIR": str(run_dir)})
    done = inspect(str(launcher), "--window", "0.5")
    no_traceback(done)
    assert f"this launch is traced after all (run directory {run_dir})" in done.stdout


def test_bad_window_is_a_usage_error() -> None:
    done = inspect("--window", "0")
    assert done.returncode == 2 and "--window 0" in done.stderr


def test_titles_name_role_and_rank() -> None:
    assert role_of("sglang::scheduler_TP3") == ("scheduler", "tp3")
    assert role_of("sglang::scheduler_DP1_TP0") == ("scheduler", "dp1-tp0")
    assert role_of("sglang::scheduler_PP1_TP2_EP2") == ("scheduler", "pp1-tp2-ep2")
    assert role_of("sglang::scheduler") == ("scheduler", "tp0")
    assert role_of("sglang::detokenizer") == ("detokenizer", "detokenizer")
    assert role_of("sglang::data_parallel_controller") == ("dp_controller", "dp_controller")
    assert role_of("sglang::tokenizer_worker:77") == ("tokenizer_worker", "tokenizer_worker-77")


def _frame(name: str, path: str, line: int = 1) -> dict:
    return {"name": name, "filename": path, "line": line, "module": None}


SITE = "/venv/lib/python3.11/site-packages"


def test_frames_map_to_phases_through_the_patch_tables() -> None:
    where = PhaseMap(phase_targets())
    assert module_of(f"{SITE}/sglang/srt/models/llama.py") == "sglang.srt.models.llama"
    head = [_frame("LlamaForCausalLM.get_embed_and_head", f"{SITE}/sglang/srt/models/llama.py", 412)]
    assert where.phase(head).name == "eagle.get_embed_and_head" and where.phase(head).where == "models/llama.py:412"
    barrier = [
        _frame("barrier", f"{SITE}/torch/distributed/distributed_c10d.py", 5356),
        _frame("GroupCoordinator.barrier", f"{SITE}/sglang/srt/distributed/parallel_state.py", 2060),
        *head,
    ]
    assert where.phase(barrier).name == "eagle.get_embed_and_head"  # a collective is said as one, not as the phase
    got = collective(barrier, [{"name": "gloo::transport::tcp::Pair::recv", "module": "/x/libtorch_cpu.so"}])
    assert got.op == "barrier" and got.via == "GroupCoordinator.barrier" and got.backend == "gloo"
    assert got.words.startswith("a barrier (GroupCoordinator.barrier, gloo, distributed/parallel_state.py:2060)")
    pynccl = f"{SITE}/sglang/srt/distributed/device_communicators/pynccl.py"
    nccl = collective([_frame("PyNcclCommunicator.all_reduce", pynccl)])
    assert nccl.via == "PyNccl" and nccl.op == "all_reduce"
    loop = [_frame("Scheduler.event_loop_normal", f"{SITE}/sglang/srt/managers/scheduler.py")]
    assert serving(loop, where.phase(loop)) and not serving(head, where.phase(head))
