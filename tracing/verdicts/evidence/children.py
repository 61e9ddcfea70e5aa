"""A process's descendants (a compiler, a build tool, a JIT worker): name, pid, command line, CPU and
age, each named as a build when it looks like one. ``/proc/PID/task/*/children`` (a compiler may be
started from any thread), else psutil; CPU over a window, since the previous read, or a lifetime."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable

import psutil

from ...redact import printable
from .values import BUSY_PCT, MAX_CHILDREN, MAX_CMD, Child, Evidence

MAX_TASKS = 1024  # threads whose children are listed, over all descendants

# A compile or JIT build, by process name (``comm``, 15 characters) or an argv word's base name.
_BUILD_NAMES = {
    **dict.fromkeys(("nvcc", "cicc", "ptxas", "nvlink", "fatbinary", "cudafe++", "nvdisasm"), "CUDA compiler"),
    **dict.fromkeys(("hipcc", "clang-offload-bundler"), "ROCm compiler"),
    **dict.fromkeys(("gcc", "g++", "cc", "c++", "cc1", "cc1plus", "clang", "clang++", "as"), "C/C++ compiler"),
    **dict.fromkeys(("ld", "ld.gold", "ld.lld", "lld", "collect2"), "linker"),
    **dict.fromkeys(("ninja", "make", "cmake", "gmake"), "build tool"),
}
_BUILD_CMDS = (  # (regular expression on the command line, what it is)
    (re.compile(r"sglang\.compile_deep_gemm"), "DeepGEMM pre-compile"),
    (re.compile(r"torch\._inductor\.compile_worker"), "torch inductor compile worker"),
    (re.compile(r"triton.*(compile|ptxas)|(compile|ptxas).*triton"), "Triton compile"),
    (re.compile(r"flashinfer.*(jit|build|ninja)"), "FlashInfer JIT build"),
    (re.compile(r"deep_gemm"), "DeepGEMM JIT build"),
)


def looks_like_build(name: str, cmdline: Iterable[str]) -> str | None:
    """``"nvcc (CUDA compiler)"`` when a process looks like a compile or JIT build, else None."""
    argv = list(cmdline)
    for word in (name, *(os.path.basename(a) for a in argv[:2])):
        what = _BUILD_NAMES.get(word)
        if what is not None:
            return f"{word} ({what})"
    text = " ".join(argv)[:4096]
    for pattern, what in _BUILD_CMDS:
        if pattern.search(text):
            return what
    return None


def child_pids(pid: int, budget: list[int]) -> list[int]:
    """Children of every thread of ``pid`` (a compiler may be started from any thread)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        if budget[0] <= 0:
            break
        budget[0] -= 1
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out += [int(c) for c in f.read().split()]
        except FileNotFoundError:  # no CONFIG_PROC_CHILDREN: psutil walks /proc for the parent ids
            try:
                return [c.pid for c in psutil.Process(pid).children()]
            except (psutil.Error, OSError):
                return out
        except (OSError, ValueError):
            continue
    return out


def children(pid: int, now: float, window_s: float, previous: Evidence | None) -> list[Child]:
    """Its descendants (``MAX_CHILDREN``), those at work and builds first."""
    todo, found, budget = child_pids(pid, [MAX_TASKS]), [], [MAX_TASKS]
    while todo and len(found) < MAX_CHILDREN:
        cpid = todo.pop(0)
        try:
            p = psutil.Process(cpid)
            with p.oneshot():
                times = p.cpu_times()
                info = (p.name(), p.ppid(), p.cmdline(), times.user + times.system, p.create_time(), p.status())
        except (psutil.Error, OSError):
            continue  # ended, or not ours to read: one fewer child
        found.append((p, *info))
        todo += child_pids(cpid, budget)
    if window_s > 0 and found:
        time.sleep(window_s)
    before = {(c.pid, round(c.started, 2)): c for c in previous.children} if previous else {}
    out = []
    for p, name, ppid, argv, cpu_s, created, state in found:
        over, age, sampled = "lifetime", max(now - created, 1e-3), now
        pct = 100 * cpu_s / age
        if window_s > 0:
            try:
                t = p.cpu_times()
                sampled = time.time()
                pct, over = 100 * max(0.0, t.user + t.system - cpu_s) / window_s, "window"
                cpu_s = t.user + t.system
            except (psutil.Error, OSError):
                continue
        elif (prev := before.get((p.pid, round(created, 2)))) is not None and now - prev.sampled > 0.05:
            pct, over = 100 * max(0.0, cpu_s - prev.cpu_s) / (now - prev.sampled), "since_previous"
        out.append(
            Child(
                pid=p.pid,
                ppid=ppid,
                name=printable(name)[:64],
                cmd=printable(" ".join(argv))[:MAX_CMD],
                cpu_pct=round(pct, 1),
                cpu_over=over,  # type: ignore[arg-type]
                cpu_s=round(cpu_s, 3),
                sampled=round(sampled, 3),
                started=round(created, 3),
                age_s=round(age, 1),
                state=str(state),
                build=looks_like_build(name, argv),
            )
        )
    out.sort(key=lambda c: (c.cpu_pct >= BUSY_PCT, c.build is not None, c.cpu_pct), reverse=True)
    return out
