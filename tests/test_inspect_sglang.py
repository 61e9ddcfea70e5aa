"""``phasetrace inspect`` on real SGLang launches started WITHOUT the hook (CPU, tiny model, tp=2).

Two starts, each shared by the tests of this module (module-scoped, in order):

* an ``sglang.Engine`` with an EAGLE draft (``scripts/start_engine.py``), planted by
  ``tests/plants`` (alone on PYTHONPATH: no hook): rank 1 blocks in ``get_embed_and_head`` while
  rank 0 waits in the TP group's barrier — the 8-hour EAGLE draft-init deadlock's shape;
* a ``python -m sglang.launch_server`` planted by ``tests/plants_untraced`` inside the real
  ``ModelRunner.load_model``: rank 1 first holds the GIL in C (a backtracking regular expression),
  then waits for a file lock another process holds, while rank 0 waits in the TP barrier; released,
  the same server serves (the healthy case).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import CPU_ENV, PLANTS, ROOT, end_group, free_port, requires_sglang

pytestmark = [pytest.mark.sglang, requires_sglang]

UNTRACED_PLANTS = ROOT / "tests" / "plants_untraced"
ALARMS = ("STALL", "DIED", "FAILED", "NOT STARTED", "STOPPED")
SECRET = "sk-inspect0123456789abcdefghijklmnop"


def untraced_env(plants: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_PHASETRACE", "OTEL_", "TRACEPARENT"))}
    env.update(CPU_ENV)
    env["PYTHONPATH"] = str(plants)  # the plant only: nothing of sglang-phasetrace is loaded
    env.update(extra)
    return env


def inspect(*args: str, py_spy: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    extra = ["--py-spy", py_spy] if py_spy else []
    done = subprocess.run(
        [sys.executable, "-m", "sglang_phasetrace.tracing.cli", "inspect", *args, *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done


def titled(launcher: int, title: str) -> int | None:
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rpartition(")")[2].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")[0].decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == launcher and cmd == title:
            return int(name)
    return None


def start_untraced(command: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen:
    """``command`` in its own process group, its output to ``log``."""
    with open(log, "w") as out:
        return subprocess.Popen(
            command, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def wait_in_stack(proc: subprocess.Popen, title: str, marker: str, log: Path, timeout: float = 300) -> int:
    """The pid of the launch's process ``title`` once py-spy shows ``marker`` in its stack."""
    py_spy = str(Path(sys.executable).parent / "py-spy")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        pid = titled(proc.pid, title)
        if pid is not None:
            done = subprocess.run([py_spy, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True, text=True)
            if marker in done.stdout:
                return pid
        time.sleep(2)
    raise AssertionError(f"{title} never showed {marker!r}:\n{log.read_text(errors='replace')[-4000:]}")


@pytest.fixture(scope="module")
def engine(tiny_model: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    target, draft = tiny_model
    base = tmp_path_factory.mktemp("inspect-engine")
    log = base / "engine.log"
    command = [
        sys.executable,
        str(ROOT / "scripts" / "start_engine.py"),
        str(target),
        "--tp",
        "2",
        "--draft",
        str(draft),
    ]
    proc = start_untraced(command, untraced_env(PLANTS, {"PLANT_STALL_TP_RANK": "1"}), base, log)
    try:
        tp1 = wait_in_stack(proc, "sglang::scheduler_TP1", "get_embed_and_head", log)
        tp0 = wait_in_stack(proc, "sglang::scheduler_TP0", "barrier", log, timeout=60)
        yield {"proc": proc, "tp0": tp0, "tp1": tp1, "base": base}
    finally:
        end_group(proc)


def test_engine_rank_blocked_in_get_embed_and_head_is_named_with_its_peer_in_the_barrier(engine) -> None:
    done = inspect(str(engine["tp0"]))  # any process of the launch: a rank
    assert done.returncode == 3, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith(f"sglang-phasetrace: STALL tp1 (pid {engine['tp1']}) is in 'eagle.get_embed_and_head' (")
    assert ", idle;" in first and "tp0 waits in a barrier (GroupCoordinator.barrier" in first
    assert "on the TP group" in first
    assert done.stdout.splitlines()[1].startswith("sglang-phasetrace: HINT (not a verdict) EAGLE draft init")
    doc = json.loads(inspect(str(engine["proc"].pid), "--json").stdout)  # the launcher: the same launch
    launch = doc["launches"][0]
    procs = {p["label"]: p for p in launch["processes"]}
    assert doc["exit_code"] == 3 and launch["launcher"] == engine["proc"].pid
    assert {"launcher", "tp0", "tp1", "detokenizer"} <= set(procs)
    assert procs["tp1"]["phase"] == "eagle.get_embed_and_head" and procs["tp1"]["state"] == "blocked"
    assert procs["tp0"]["collective"].startswith("a barrier (GroupCoordinator.barrier")
    assert "get_embed_and_head" in procs["tp1"]["stack"] and "EagleDraftWorker" in procs["tp1"]["stack"]
    assert procs["detokenizer"]["state"] == "serving" and procs["tp1"]["rss"] > 0


def test_engine_without_ptrace_is_judged_from_proc_alone(engine, tmp_path: Path) -> None:
    fake = tmp_path / "py-spy"
    fake.write_text(
        '#!/bin/sh\necho "Error: Failed to suspend process: Operation not permitted (os error 1)" >&2\nexit 1\n'
    )
    fake.chmod(0o700)
    refused = inspect(str(engine["tp1"]), py_spy=str(fake))
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert refused.stdout.startswith("sglang-phasetrace: STALL no rank moved in 3 s (no stacks: from /proc alone)")
    assert "tp1 (pid" in refused.stdout.splitlines()[0] and "waits on a sleep" in refused.stdout.splitlines()[0]
    notes = [line for line in refused.stdout.splitlines() if "ptrace is not allowed" in line]
    assert len(notes) == 1 and "ptrace_scope" in notes[0]
    missing = inspect(str(engine["tp1"]), py_spy=str(tmp_path / "absent"))
    assert missing.returncode == 3 and "py-spy is not installed" in missing.stdout


def test_engine_bundle_holds_every_stack(engine, tmp_path: Path) -> None:
    out = tmp_path / "stuck.tar.gz"
    done = inspect(str(engine["tp1"]), "--bundle", str(out))
    assert done.returncode == 3 and out.is_file() and (out.stat().st_mode & 0o777) == 0o600
    with tarfile.open(out) as tar:
        names = tar.getnames()
        summary = tar.extractfile("phasetrace-bundle/SUMMARY.md").read().decode()
        tp1 = next(n for n in names if f"/tp1-{engine['tp1']}.txt" in n)
        stack = tar.extractfile(tp1).read().decode()
    assert "**Verdict:** sglang-phasetrace: STALL tp1" in summary
    assert "get_embed_and_head" in stack and "with native frames" in stack
    assert any(n.endswith(f"/tp0-{engine['tp0']}.txt") for n in names)
    assert "phasetrace-bundle/system/versions.json" in names


@pytest.fixture(scope="module")
def server(tiny_model: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    base = tmp_path_factory.mktemp("inspect-server")
    log, lock, go = base / "server.log", base / "weights.lock", base / "go"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl,sys,time; f=open(sys.argv[1],'a'); fcntl.flock(f, fcntl.LOCK_EX); "
         "print('held', flush=True); time.sleep(900)", str(lock)],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "held"
    port = free_port()
    command = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(tiny_model[0]), "--device", "cpu"]
    command += ["--tp-size", "2", "--max-total-tokens", "4096", "--port", str(port), "--api-key", SECRET]
    plant = {"INSPECT_PLANT_RANK": "1", "INSPECT_PLANT_GO": str(go), "INSPECT_PLANT_LOCK": str(lock)}
    proc = start_untraced(command, untraced_env(UNTRACED_PLANTS, plant), base, log)
    try:
        tp1 = wait_in_stack(proc, "sglang::scheduler_TP1", "fullmatch", log)
        tp0 = wait_in_stack(proc, "sglang::scheduler_TP0", "barrier", log, timeout=60)
        yield {"proc": proc, "tp0": tp0, "tp1": tp1, "go": go, "lock": lock, "holder": holder, "port": port, "log": log}
    finally:
        end_group(proc)
        end_group(holder)


def test_server_rank_holding_the_gil_in_c_is_read_and_named(server) -> None:
    done = inspect(str(server["proc"].pid), "--json")
    launch = json.loads(done.stdout)["launches"][0]
    procs = {p["label"]: p for p in launch["processes"]}
    assert procs["tp1"]["state"] == "busy" and procs["tp1"]["holds_gil"] is True
    assert "fullmatch" in procs["tp1"]["stack"] and "ModelRunner.load_model" in procs["tp1"]["stack"]
    assert procs["tp1"]["phase"] == "model.load_weights"
    assert launch["line"].startswith(f"sglang-phasetrace: NOTICE tp1 (pid {server['tp1']}) is in 'model.load_weights'")
    assert "holding the GIL" in launch["line"] and "tp0 waits in a barrier" in launch["line"]
    assert done.returncode == 0  # busy in one frame for 3 s is not yet a stall: the line says so
    assert SECRET not in done.stdout and SECRET[:12] not in done.stdout  # the --api-key in argv is redacted


def test_server_rank_waiting_for_a_file_lock_names_the_lock_and_its_holder(server) -> None:
    server["go"].touch()
    deadline = time.monotonic() + 60
    while True:
        done = inspect(str(server["tp0"]))
        if done.returncode == 3 or time.monotonic() > deadline:
            break
    assert done.returncode == 3, done.stdout
    first = done.stdout.splitlines()[0]
    assert first.startswith(f"sglang-phasetrace: STALL tp1 (pid {server['tp1']}) is in 'model.load_weights'")
    assert f"waits for an exclusive lock on {server['lock']} held by pid {server['holder'].pid}" in first
    assert "not part of this launch" in first and "tp0 waits in a barrier" in first
    assert SECRET[:12] not in done.stdout


def test_healthy_serving_server_exits_0_and_says_serving(server) -> None:
    server["holder"].kill()  # the lock is free: rank 1 joins the barrier, the server starts
    url = f"http://127.0.0.1:{server['port']}/health"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        time.sleep(1)
    else:
        raise AssertionError(server["log"].read_text(errors="replace")[-4000:])
    done = inspect(str(server["tp1"]))
    assert done.returncode == 0, done.stdout
    assert done.stdout.startswith(f"sglang-phasetrace: serving: launch pid {server['proc'].pid}, 2 ranks")
    assert "/health: 200" in done.stdout.splitlines()[0]
    assert not any(word in done.stdout for word in ALARMS)
