"""Stacks of a stalled process, read with as little disturbance as possible.

In order of preference, for a process proven to be the traced one (``tracing.procs``):

1. ``/proc`` (always, never perturbs): each thread's name, state and kernel wait channel.
2. ``py-spy dump`` (out of process, where installed and ptrace is allowed): Python and native
   frames. It pauses the process for the read (milliseconds).
3. ``faulthandler`` on a signal (default SIGUSR2, ``SGLANG_PHASETRACE_STACK_SIGNAL``): every traced
   process registers it when tracing starts; its C-level handler writes all threads' Python stacks
   even while the main thread holds the GIL in C. The signal is sent only when ``/proc`` shows the
   process catches it. What a signal can interrupt: a system call in progress returns EINTR where
   it is not restarted (``poll``/``epoll_wait``/``nanosleep`` never are; Python retries its own,
   PEP 475); a C ``sleep()`` returns early. NCCL/gloo waits retry; an application's own C code may not.

Dumps go to ``RUN_DIR/stacks/<host>-<pid>.txt`` (faulthandler appends to it from C, so what it
writes is Python frames: file names, line numbers, function names — no values) and
``<host>-<pid>-py-spy-<time>.txt`` (redacted before it is written).
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

from . import keys, process_state, procs
from .redact import redact_text
from .rundir import STACKS_DIR

log = logging.getLogger("sglang_phasetrace")
ALLOWED = ("SIGUSR1", "SIGUSR2")  # signals whose default action nobody relies on during init


def _say_once(message: str) -> None:
    if process_state.say_once(("stacks", message)):
        log.warning("sglang-phasetrace: %s", message)


def stack_signal() -> signal.Signals:
    """The dump signal: ``SGLANG_PHASETRACE_STACK_SIGNAL`` if it names one of ``ALLOWED``, else
    SIGUSR2 (a bad value is said once)."""
    raw = os.environ.get(keys.ENV_STACK_SIGNAL, "").strip().upper()
    if not raw:
        return signal.SIGUSR2
    name = raw if raw.startswith("SIG") else f"SIG{raw}"
    if name in ALLOWED:
        return signal.Signals[name]
    _say_once(f"{keys.ENV_STACK_SIGNAL}={raw!r} is not one of {', '.join(ALLOWED)}; using SIGUSR2")
    return signal.SIGUSR2


def dump_path(run_dir: Path | str, stem: str) -> Path:
    return Path(run_dir) / STACKS_DIR / f"{stem}.txt"


def arm(rt: Any) -> None:
    """Register the dump signal in this process with faulthandler (SGLang does not use it)."""
    fds = process_state.STATE.stack_fds  # pid -> dump file (kept open: faulthandler writes to it)
    pid = os.getpid()
    if pid in fds:
        return
    try:
        from .files import open_append, private_dir

        path = dump_path(rt.run_dir, rt.journal.path.stem)
        private_dir(path.parent)
        fd = open_append(path)
        sig = stack_signal()
        # chain only to a real handler: chaining to SIG_DFL would re-raise it and end the process
        chain = signal.getsignal(sig) not in (signal.SIG_DFL, signal.SIG_IGN, None)
        faulthandler.register(sig, file=fd, all_threads=True, chain=chain)
        fds[pid] = fd
    except Exception as exc:
        _say_once(f"stack dumps on request not armed: {exc!r}")


def proc_snapshot(pid: int) -> str:
    """Each thread's name, state and kernel wait channel from ``/proc``: read from outside, no signal."""
    lines = []
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:
        return ""
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/stat", "rb") as f:
                stat = f.read()
            name = stat[stat.index(b"(") + 1 : stat.rindex(b")")].decode(errors="replace")
            state = stat.rpartition(b")")[2].split()[0].decode()
            with open(f"{base}/wchan") as f:
                wchan = f.read().strip() or "-"
        except (OSError, ValueError, IndexError):
            continue
        lines.append(f"  thread {tid} {name!r}: state {state}, waiting in {wchan if wchan != '0' else '-'}")
    return "\n".join(lines)


def request(pid: int, path: Path, reason: str, wait_s: float = 2.0) -> bool:
    """Header + ``/proc`` snapshot into ``path``, then, if ``pid`` catches the dump signal, a
    faulthandler dump; True once the dump arrived. The caller has proven ``pid`` is ours."""
    sig = stack_signal()
    try:
        from .files import open_append

        header = (
            f"\n=== stacks of pid {pid} requested at {time.strftime('%Y-%m-%d %H:%M:%S')}: "
            f"{redact_text(reason)} ===\n{proc_snapshot(pid)}\n"
        )
        fd = open_append(path)
        try:
            os.write(fd, header.encode("utf-8", "replace"))
        finally:
            os.close(fd)
        marker = path.stat().st_size
        if not procs.catches(pid, sig):
            return False  # not armed (yet): the default action would end it
        os.kill(pid, sig)
    except (OSError, ValueError) as exc:
        _say_once(f"could not request stacks of pid {pid} into {path}: {exc!r}")
        return False
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if path.stat().st_size > marker:
            return True
        time.sleep(0.05)
    return False


def py_spy(pid: int, path: Path) -> Path | None:
    """``py-spy dump`` (Python frames) and ``py-spy dump --native`` (with C frames; on some builds it
    loses the Python ones) into ``path``, redacted; None (said once) when missing or refused."""
    beside = Path(sys.executable).parent / "py-spy"  # a venv's, when the venv is not on PATH
    exe = str(beside) if beside.exists() else shutil.which("py-spy")
    if exe is None:
        _say_once("py-spy is not installed; native stacks skipped (faulthandler stacks only)")
        return None
    parts, problem = [], ""
    for extra, title in (([], "Python frames"), (["--native"], "with native frames")):
        try:
            done = subprocess.run([exe, "dump", "--pid", str(pid), *extra], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            problem = repr(exc)
            continue
        if done.returncode == 0 and done.stdout.strip():
            parts.append(f"=== py-spy dump, {title} ===\n{done.stdout}")
        else:
            problem = done.stderr.strip()[:200]
    if not parts:
        _say_once(f"py-spy could not read pid {pid} ({redact_text(problem)}); faulthandler stacks only")
        return None
    from .files import write_atomic

    write_atomic(path, redact_text("\n".join(parts)).encode("utf-8", "replace"))
    return path
