"""Stacks of a stalled process, read with as little disturbance as possible.

In order of preference, for a process proven to be the traced one (``tracing.other_processes``):

1. ``/proc`` (always, never perturbs): each thread's name, state and kernel wait channel.
2. ``py-spy dump`` (out of process, where installed and ptrace is allowed): Python and native
   frames. It pauses the process for the read (milliseconds).
3. ``faulthandler`` on a signal (default SIGUSR2, ``SGLANG_PHASETRACE_STACK_SIGNAL``): every traced
   process registers it when tracing starts; its C-level handler writes the Python stack of the
   thread the signal reaches, even while that thread holds the GIL in C. The signal is aimed at the
   main thread (where SGLang initialises) and sent only when ``/proc`` shows the process catches
   it; other threads' stacks come from py-spy (``recorder.stackdump`` says why). What a signal can
   interrupt: a system call in progress returns EINTR where it is not restarted
   (``poll``/``epoll_wait``/``nanosleep`` never are; Python retries its own, PEP 475); a C ``sleep()``
   returns early. NCCL/gloo waits retry; an application's own C code may not.

The process's own faulthandler writes to ``RUN_DIR/stacks/<host>-<pid>.txt``, a file it made
itself (it appends to it from C, so what it writes is Python frames: file names, line numbers,
function names — no values). A reader never writes into a file it did not create: each request
is a new ``<host>-<pid>-request-<time>.txt`` (its reason and the ``/proc`` view, and where in the
process's own file the dump it asked for begins), each py-spy read a new
``<host>-<pid>-py-spy-<time>.txt`` (redacted), both made in the checked ``stacks/`` directory
(``files.open_dir``, ``files.create_new``). A forked child does not dump into its parent's file
(``process_state``: its registration is undone in the child, which arms its own when it traces).
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

from .. import other_processes
from ..journal.layout import STACKS_DIR
from ..recorder.stackdump import stack_signal, warn_once
from ..redact import redact_text

log = logging.getLogger("sglang_phasetrace")


def thread_states(pid: int) -> str:
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


def request(target: other_processes.Pinned, run_dir: Path, stem: str, reason: str, wait_s: float = 2.0) -> list[Path]:
    """A new request file in ``run_dir/stacks/`` (the reason, the ``/proc`` view), then, if the
    process catches the dump signal and has its own dump file there, the signal; the paths of
    what holds its stacks: its own file first once the dump arrived, then the request file.
    ``target``: a process proven to be ours (``other_processes.pin``)."""
    sig, pid = stack_signal(), target.pid
    stacks = Path(run_dir) / STACKS_DIR
    own = f"{stem}.txt"
    try:
        from ..files import create_new, open_dir, write_all

        dir_fd = open_dir(stacks)
    except OSError as exc:
        _refused(stacks, exc)
        return []
    try:
        marker = _size(dir_fd, own)
        header = (
            f"=== stacks of pid {pid} requested at {time.strftime('%Y-%m-%d %H:%M:%S')}: {redact_text(reason)} ===\n"
            f"{thread_states(pid)}\n"
        )
        armed = marker is not None and other_processes.catches(pid, sig)
        if armed:
            header += f"=== its Python stacks: {stacks / own}, from byte {marker} ===\n"
        fd, name = create_new(dir_fd, f"{stem}-request-{int(time.time())}.txt")
        try:
            write_all(fd, header.encode("utf-8", "replace"))
        finally:
            os.close(fd)
        paths = [stacks / name]
        if not armed or not target.send_to_main_thread(sig):  # not armed (yet): the default would end it
            return paths
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if (_size(dir_fd, own) or 0) > marker:
                return [stacks / own, *paths]
            time.sleep(0.05)
        return paths
    except OSError as exc:
        warn_once(f"could not request stacks of pid {pid} into {stacks}: {exc!r}")
        return []
    finally:
        os.close(dir_fd)


def _refused(stacks: Path, exc: OSError) -> None:
    """One warning: nothing is written into ``stacks`` (a link, another user's, not a directory…)."""
    from ..files import UnsafeDirectory

    why = str(exc) if isinstance(exc, UnsafeDirectory) else f"{stacks}: {exc.strerror or exc}"
    warn_once(f"stacks not written: {why}")


def _size(dir_fd: int, name: str) -> int | None:
    """Size of the regular file ``name`` in ``dir_fd`` (a link is not followed); None when there is none."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def py_spy(target: other_processes.Pinned, run_dir: Path, stem: str) -> Path | None:
    """``py-spy dump`` (Python frames) and ``py-spy dump --native`` (with C frames; on some builds it
    loses the Python ones) into a new ``run_dir/stacks/<stem>-py-spy-<time>.txt``, redacted; None
    (said once) when missing or refused. ``target``: proven ours; what py-spy read is kept only if
    it is still that process afterwards (its pid was not recycled meanwhile)."""
    beside = Path(sys.executable).parent / "py-spy"  # a venv's, when the venv is not on PATH
    exe = str(beside) if beside.exists() else shutil.which("py-spy")
    if exe is None:
        warn_once("py-spy is not installed; native stacks skipped (faulthandler stacks only)")
        return None
    pid = target.pid
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
    if parts and not target.running():
        return None  # it ended while read: the pid may have named another process by then
    if not parts:
        warn_once(f"py-spy could not read pid {pid} ({redact_text(problem)}); faulthandler stacks only")
        return None
    from ..files import create_new, open_dir, write_all

    stacks = Path(run_dir) / STACKS_DIR
    try:
        dir_fd = open_dir(stacks)
    except OSError as exc:
        _refused(stacks, exc)
        return None
    try:
        fd, name = create_new(dir_fd, f"{stem}-py-spy-{int(time.time())}.txt")
        try:
            write_all(fd, redact_text("\n".join(parts)).encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except OSError as exc:
        warn_once(f"py-spy stacks of pid {pid} not written into {stacks}: {exc!r}")
        return None
    finally:
        os.close(dir_fd)
    return stacks / name
