"""A launch's processes sampled over a short window from outside: ``/proc`` counters at both ends,
``py-spy dump --nonblocking`` (the process is never paused) at the start, the middle and the end,
and from the middle on one ``py-spy dump --native`` (paused for that dump only) of each process whose
stack had not moved and the caller suspects, for the native call it sits in (kept only if the last
round shows it still there). Every dump of a round runs at once, one py-spy per process,
so eight processes cost what one does. Nothing is signalled or written into any process."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..evidence.proc import TICK, Proc, stat_fields

DUMP_TIMEOUT_S = 10.0
NATIVE_TIMEOUT_S = 2.5  # a --native dump pauses the process while it unwinds: cut short past this
_REFUSED = re.compile(r"permission denied|operation not permitted|os error (1|13)\b|ptrace", re.IGNORECASE)
_NOT_PYTHON = re.compile(r"python version|not a python|failed to find python|python interpreter", re.I)
_GONE = re.compile(r"no such process|os error 3\b|process .* (not found|exited)|failed to find process", re.I)


@dataclass
class Counters:
    t: float
    ticks: int | None = None  # utime + stime
    io: int | None = None  # rchar + wchar (ptrace read access)
    state: str | None = None
    rss: int | None = None


@dataclass
class Dump:
    threads: list[dict[str, Any]] | None = None
    problem: str | None = None  # why there is no dump: "refused", "gone", "missing", or py-spy's words
    words: str = ""


@dataclass
class Sampled:
    pid: int
    first: Counters
    last: Counters
    dumps: list[Dump] = field(default_factory=list)
    native: Dump | None = None
    paused: Counters | None = None  # when its native dump began: the CPU after it is py-spy's pause

    @property
    def cpu_pct(self) -> float | None:
        end = self.paused if self.paused is not None and self.paused.t > self.first.t + 0.2 else self.last
        if self.first.ticks is None or end.ticks is None or end.t <= self.first.t:
            return None
        return max(0.0, (end.ticks - self.first.ticks) / TICK / (end.t - self.first.t) * 100)

    @property
    def io_bytes(self) -> int | None:
        return None if self.first.io is None or self.last.io is None else self.last.io - self.first.io


def counters(pid: int) -> Counters:
    out = Counters(time.monotonic())
    fields = stat_fields(pid)
    if fields and len(fields) > 21:
        out.state = fields[0]
        out.ticks = int(fields[11]) + int(fields[12])
        out.rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    io = Proc(pid).text("io", limit=4096)
    if io:
        got = dict(line.split(":", 1) for line in io.splitlines() if ":" in line)
        try:
            out.io = int(got["rchar"]) + int(got["wchar"])
        except (KeyError, ValueError):
            pass
    return out


def py_spy_exe() -> str | None:
    """py-spy beside this interpreter (a venv not on PATH), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() and os.access(beside, os.X_OK) else shutil.which("py-spy")


def dump(exe: str | None, pid: int, native: bool = False) -> Dump:
    """``read`` once more where a non-blocking read caught the process mid-change."""
    got = read(exe, pid, native)
    return read(exe, pid, native) if got.problem == "failed" and not native else got


def read(exe: str | None, pid: int, native: bool = False) -> Dump:
    """One ``py-spy dump --json`` of ``pid``: non-blocking unless ``native`` (py-spy cannot read
    native frames without pausing the process for the dump; that one is cut short, py-spy ending
    detaches it, after ``NATIVE_TIMEOUT_S``)."""
    if exe is None:
        return Dump(problem="missing", words="py-spy is not installed")
    argv = [exe, "dump", "--pid", str(pid), "--json", "--native" if native else "--nonblocking"]
    try:
        limit = NATIVE_TIMEOUT_S if native else DUMP_TIMEOUT_S
        done = subprocess.run(argv, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return Dump(problem="timeout", words=f"py-spy did not answer in {limit:g} s")
    except OSError as exc:
        return Dump(problem="missing", words=f"py-spy could not run: {exc.strerror or exc}")
    said = (done.stderr or done.stdout).strip()
    if done.returncode != 0:
        first = next((line.strip() for line in said.splitlines() if line.strip()), f"exit {done.returncode}")[:200]
        if _REFUSED.search(said):
            return Dump(problem="refused", words=first)
        if _GONE.search(said) or stat_fields(pid) is None:
            return Dump(problem="gone", words="the process ended while it was read")
        if _NOT_PYTHON.search(said):
            return Dump(problem="not_python", words=first)
        return Dump(problem="failed", words=first)
    try:
        threads = json.loads(done.stdout)
    except ValueError:
        return Dump(problem="failed", words="py-spy's output is not JSON")
    return Dump(threads=threads if isinstance(threads, list) else [])


def sample(
    pids: list[int], window_s: float, exe: str | None, rounds: int = 3, native: Callable[[Sampled], bool] | None = None
) -> dict[int, Sampled]:
    """Each pid's counters at both ends of ``window_s`` and ``rounds`` non-blocking dumps spread over
    it, then a native dump of those whose main-thread stack stayed where it was and ``native`` asks
    for (``exe``: py-spy; None: not installed, the counters only)."""
    out = {pid: Sampled(pid, counters(pid), Counters(0.0)) for pid in pids}
    start = time.monotonic()
    natives: dict[int, Future[Dump]] = {}
    with ThreadPoolExecutor(max_workers=max(1, 2 * len(pids))) as pool:
        for n in range(max(1, rounds)):
            if n:
                time.sleep(max(0.0, start + window_s * n / max(1, rounds - 1) - time.monotonic()))
            for pid, got in zip(pids, pool.map(lambda p: dump(exe, p), pids), strict=True):
                out[pid].dumps.append(got)
            if exe is None and rounds > 1:  # nothing to sample but the counters: wait out the window
                time.sleep(max(0.0, start + window_s - time.monotonic()))
                break
            if n == max(1, rounds - 2) and native is not None:  # mid-window: the native dumps run beside the rest
                for pid in pids:
                    if stayed(out[pid]) and native(out[pid]):
                        out[pid].paused = counters(pid)
                        natives[pid] = pool.submit(dump, exe, pid, True)
        for pid in pids:
            out[pid].last = counters(pid)
        for pid, future in natives.items():
            got = future.result()
            out[pid].native = got if stayed(out[pid]) else None  # it moved after all: that native dump is stale
    return out


def main_frames(threads: list[dict[str, Any]] | None, pid: int) -> list[dict[str, Any]]:
    """The main thread's frames, innermost first (its OS thread id is the pid)."""
    for t in threads or []:
        if t.get("os_thread_id") == pid or t.get("thread_name") == "MainThread":
            return list(t.get("frames") or [])
    return []


def python_frames(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in frames if str(f.get("filename", "")).endswith(".py") or f.get("module") is None]


def signature(d: Dump, pid: int) -> tuple | None:
    if d.threads is None:
        return None
    return tuple((f.get("name"), f.get("filename"), f.get("line")) for f in python_frames(main_frames(d.threads, pid)))


def stayed(s: Sampled) -> bool:
    """Every dump shows the main thread's Python stack in the same place."""
    sigs = [signature(d, s.pid) for d in s.dumps]
    return bool(sigs) and None not in sigs and len(set(sigs)) == 1


def gil(s: Sampled) -> bool:
    """Its main thread held the GIL in most dumps."""
    main = [
        t
        for d in s.dumps
        for t in d.threads or []
        if t.get("os_thread_id") == s.pid or t.get("thread_name") == "MainThread"
    ]
    return bool(main) and sum(bool(t.get("owns_gil")) for t in main) * 2 > len(main)


def text(threads: list[dict[str, Any]] | None, pid: int) -> str:
    """Threads as ``py-spy dump`` prints them (``evidence.native`` reads this form), main thread first."""
    lines = []
    ordered = sorted(threads or [], key=lambda t: t.get("os_thread_id") != pid)
    for t in ordered:
        tid = t.get("os_thread_id") or t.get("thread_id")
        name = "MainThread" if tid == pid else t.get("thread_name") or ""
        state = "active" if t.get("active") else "idle"
        state += "+gil" if t.get("owns_gil") else ""
        lines.append(f'Thread {tid} ({state}): "{name}"' if name else f"Thread {tid} ({state})")
        for f in t.get("frames") or []:
            if str(f.get("filename", "")).endswith(".py") or f.get("module") is None:
                lines.append(f"    {f.get('name')} ({f.get('filename')}:{f.get('line')})")
            else:
                lines.append(f"    {f.get('name')} ({f.get('module') or f.get('filename')})")
    return "\n".join(lines)
