"""Benchmark: seconds from a fault planted in one of a launch's processes (not a rank) to the
launcher's first verdict, per class, at the default settings; beside it what the same launch said
before every process of the launch was watched (the 120 s no-progress bound, naming no process).

Each class is a real tp=2 start on CPU (``scripts/start_engine.py`` or ``python -m
sglang.launch_server``) with the plant of ``tests/programs/launch_plant.py``: the launcher's
tokenizer manager blocked on a TCP peer that never answers (a dead proxy) and on a file lock held
outside the launch; the detokenizer asleep before its loop; a tokenizer worker that never
registers (``--tokenizer-worker-num 2``); the DP controller blocked on a dead peer (``--dp 2``);
and, with ``--draft``, a rank: tp1 asleep in EAGLE's ``get_embed_and_head`` while tp0 waits in the TP
barrier (``tests/plants``). The time runs from the planted phase's begin in the journal to the
verdict line; the goal is 10 s for every one (issue 41).

    python scripts/bench_launch_processes.py MODEL_DIR [--draft DRAFT_DIR]      # ≈ 7 min on 2 cores
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import CPU_ENV, ROOT, silent_peer

PLANT = ROOT / "tests" / "programs" / "launch_plant.py"
RANK_PLANT = ROOT / "tests" / "plants" / "sitecustomize.py"
VERDICT = re.compile(r"sglang-phasetrace: (STALL|DIED|FAILED|NOT STARTED|STOPPED) [^\n]*")
WORKERS, DP = ("--tokenizer-worker-num", "2"), ("--dp", "2", "--tp", "1")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(
    model: str,
    plant: str,
    phase: str,
    server: bool,
    args: tuple[str, ...] = (),
    sitecustomize: Path = PLANT,
    env_extra: dict[str, str] | None = None,
) -> tuple[float, str]:
    """(seconds from ``phase``'s begin to the first verdict, the verdict line)."""
    from sglang_phasetrace.tracing.reader.load import load_run

    tmp = Path(tempfile.mkdtemp(prefix="bench-launch-"))
    (tmp / "plants").mkdir()
    shutil.copyfile(sitecustomize, tmp / "plants" / "sitecustomize.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_PHASETRACE")} | CPU_ENV
    env |= {"PYTHONPATH": f"{ROOT / 'sitecustomize_hooks'}{os.pathsep}{tmp / 'plants'}", "PLANT": plant}
    env |= {"PLANT_ONCE": str(tmp / "once"), "SGLANG_PHASETRACE_RUN_DIR": str(tmp / "run"), **(env_extra or {})}
    if server:
        command = [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--device", "cpu"]
        command += ["--tp-size", "2", "--max-total-tokens", "4096", "--port", str(_port()), *args]
    else:
        command = [sys.executable, str(ROOT / "scripts" / "start_engine.py"), model, "--tp", "2", "--no-generate"]
        command += list(args)
    err = tmp / "err"
    with open(err, "w") as out:
        proc = subprocess.Popen(command, env=env, cwd=tmp, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            m = VERDICT.search(err.read_text(errors="replace"))
            if m is not None:
                said = time.time_ns()
                began = min(
                    s.start for p in load_run(tmp / "run").processes for s in p.spans.values() if s.phase == phase
                )
                return (said - began) / 1e9, m.group(0)
            time.sleep(0.25)
        return float("nan"), "no verdict"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    model = sys.argv[1] if len(sys.argv) > 1 else "/tmp/tiny"
    draft = sys.argv[sys.argv.index("--draft") + 1] if "--draft" in sys.argv else None
    lock = Path(tempfile.mkdtemp(prefix="bench-lock-")) / "tokenizer.lock"
    holder = open(lock, "a")
    fcntl.flock(holder, fcntl.LOCK_EX)  # held by this process, outside the launch
    print(f"{'fault':<62} {'verdict after':>13}   before: 120 s catch-all naming no process")
    with silent_peer() as port:
        peer = f"socket=127.0.0.1,{port}"
        cases = (  # (what, plant, is it launch_server, more arguments)
            ("launcher: tokenizer manager on a dead proxy (Engine)", f"tokenizer_manager:{peer}", False, ()),
            ("launcher: tokenizer manager waits for a lock (Engine)", f"tokenizer_manager:flock={lock}", False, ()),
            ("detokenizer asleep before its loop (launch_server)", "detokenizer:sleep", True, ()),
            ("tokenizer worker never registers (2 workers)", "tokenizer_worker:sleep", True, WORKERS),
            ("DP controller on a dead peer (Engine, --dp 2 --tp 1)", f"dp_controller:{peer}", False, DP),
        )
        for name, plant, server, args in cases:
            seconds, line = one(model, plant, f"{plant.partition(':')[0]}.init", server, args)
            print(f"{name:<62} {seconds:11.1f} s   {line[:150]}", flush=True)
    if draft is not None:
        seconds, line = one(
            model, "", "eagle.get_embed_and_head", False, ("--draft", draft), RANK_PLANT, {"PLANT_STALL_TP_RANK": "1"}
        )
        print(f"{'rank tp1 asleep in get_embed_and_head, tp0 in the barrier':<62} {seconds:11.1f} s   {line[:150]}")
    holder.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
