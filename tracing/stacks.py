"""Stacks on demand: every traced process dumps all its threads' stacks when asked by a signal.

``faulthandler`` writes the dump from its C signal handler, so it works while the main thread
is stuck in C code holding the GIL — exactly when a Python-level dumper cannot. Dumps append to
``RUN_DIR/stacks/<host>-<pid>.txt``; the requester writes a header line first. ``py-spy`` (native
frames) is used too where it is installed and allowed; if not, that is said once.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import keys
from .rundir import STACKS_DIR

log = logging.getLogger("sglang_phasetrace")
_files: dict[int, Any] = {}  # pid -> open dump file (kept alive for faulthandler)
_pyspy_problem: list[str] = []


def stack_signal() -> signal.Signals:
    name = os.environ.get(keys.ENV_STACK_SIGNAL, "SIGUSR2").upper()
    return signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]


def dump_path(run_dir: Path | str, stem: str) -> Path:
    return Path(run_dir) / STACKS_DIR / f"{stem}.txt"


def arm(rt: Any) -> None:
    """Register the stack-dump signal in this process (SGLang does not use SIGUSR2)."""
    pid = os.getpid()
    if pid in _files:
        return
    try:
        path = dump_path(rt.run_dir, rt.journal.path.stem)
        path.parent.mkdir(parents=True, exist_ok=True)
        _files[pid] = open(path, "a", buffering=1)  # kept open: faulthandler writes to its fd
        sig = stack_signal()
        # chain only to a real handler: chaining to SIG_DFL would re-raise it and end the process
        chain = signal.getsignal(sig) not in (signal.SIG_DFL, signal.SIG_IGN)
        faulthandler.register(sig, file=_files[pid], all_threads=True, chain=chain)
    except Exception as exc:
        log.warning("sglang-phasetrace: stack dumps on request not armed: %r", exc)


def request(pid: int, path: Path, reason: str, wait_s: float = 2.0) -> bool:
    """Ask process ``pid`` for a dump into ``path`` (its own file); True once the dump arrived."""
    try:
        with open(path, "a") as f:
            f.write(f"\n=== stacks of pid {pid} requested at {time.strftime('%Y-%m-%d %H:%M:%S')}: {reason} ===\n")
        marker = path.stat().st_size
        os.kill(pid, stack_signal())
    except (OSError, ValueError) as exc:
        log.warning("sglang-phasetrace: could not request stacks of pid %s: %r", pid, exc)
        return False
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if path.stat().st_size > marker:
            return True
        time.sleep(0.05)
    return False


def py_spy(pid: int, path: Path) -> Path | None:
    """``py-spy dump --native`` into ``path``; None (said once) when py-spy is missing or refused."""
    beside = Path(sys.executable).parent / "py-spy"  # a venv's, when the venv is not on PATH
    exe = str(beside) if beside.exists() else shutil.which("py-spy")
    if exe is None:
        _say_once("py-spy is not installed; native stacks skipped (faulthandler stacks only)")
        return None
    for args in ([exe, "dump", "--pid", str(pid), "--native"], [exe, "dump", "--pid", str(pid)]):
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            _say_once(f"py-spy failed ({exc!r}); native stacks skipped")
            return None
        if done.returncode == 0 and done.stdout.strip():
            path.write_text(done.stdout)
            return path
    _say_once(f"py-spy could not read pid {pid} ({done.stderr.strip()[:200]}); native stacks skipped")
    return None


def _say_once(message: str) -> None:
    if not _pyspy_problem:
        _pyspy_problem.append(message)
        log.warning("sglang-phasetrace: %s", message)
