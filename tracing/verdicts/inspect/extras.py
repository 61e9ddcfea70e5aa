"""What a person at hour 8 checks by hand, read for ``phasetrace inspect``: how long the launch's log
has been silent (its stdout/stderr file, from ``/proc/PID/fd``), GPU use and memory per process where
NVML answers, ``/health`` of an HTTP server whose port its arguments name, and whether the launch is
traced after all (its environment carries our hook or a run directory)."""

from __future__ import annotations

import os
import re
import stat
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from ... import keys
from ..evidence.proc import Proc

_PORT = re.compile(r"--port[= ](\d+)")
_HOST = re.compile(r"--host[= ](\S+)")
_SERVER = re.compile(r"sglang[./]launch_server|sglang\s+serve\b")


@dataclass
class Log:
    path: str
    silent_s: float


def log_silence(pids: list[int]) -> Log | None:
    """The launch's log file (a regular file on fd 1 or 2 of its processes) and how long since it was
    last written; None when they write to a terminal or a pipe."""
    best: Log | None = None
    for pid in pids:
        for fd in (2, 1):
            target = Proc(pid).link(fd)
            if not target or not target.startswith("/") or target.startswith("/dev/"):
                continue
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                log = Log(target, max(0.0, time.time() - st.st_mtime))
                if best is None or log.silent_s < best.silent_s:
                    best = log
    return best


def endpoint(cmd: str) -> str | None:
    """``http://HOST:PORT/health`` of a ``launch_server`` / ``sglang serve`` command line."""
    if not _SERVER.search(cmd):
        return None
    port = _PORT.search(cmd)
    host = _HOST.search(cmd)
    h = host.group(1) if host else "127.0.0.1"
    h = "127.0.0.1" if h in ("0.0.0.0", "::", "") else h
    return f"http://{h}:{port.group(1) if port else 30000}/health"


def health(url: str, timeout_s: float = 2.0) -> str:
    """``200 in 12 ms``, ``503``, ``no answer in 2 s``, ``refused``."""
    t = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return f"{r.status} in {(time.monotonic() - t) * 1000:.0f} ms"
    except urllib.error.HTTPError as exc:
        return f"{exc.code}"
    except (TimeoutError, urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            return f"no answer in {timeout_s:.0f} s"
        if isinstance(reason, ConnectionRefusedError):
            return "refused (nothing listens there)"
        return f"no answer ({reason})"


def gpus(pids: set[int]) -> tuple[dict[int, dict[str, Any]], str | None]:
    """pid -> {index, util, mem_used} for the processes NVML sees on a GPU; the reason when none."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no driver, no library
        return {}, f"no GPU figures (NVML: {type(exc).__name__})"
    out: dict[int, dict[str, Any]] = {}
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            util = pynvml.nvmlDeviceGetUtilizationRates(h).gpu
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                if p.pid in pids:
                    out[p.pid] = {"index": i, "util": util, "mem_used": p.usedGpuMemory}
    except Exception as exc:
        return out, f"GPU figures incomplete (NVML: {type(exc).__name__})"
    return out, None


def traced(pids: list[int]) -> str | None:
    """The run directory of a launch that is traced after all (a rank's environment names it), or
    ``""`` when it carries the hook but no run directory is named; None when untraced or unreadable."""
    hooked = False
    for pid in pids:
        env = Proc(pid).text("environ", limit=1 << 20)
        if not env:
            continue
        pairs = dict(item.split("=", 1) for item in env.split("\0") if "=" in item)
        if pairs.get(keys.ENV_RUN_DIR):
            return pairs[keys.ENV_RUN_DIR]
        hooked = hooked or "sitecustomize_hooks" in pairs.get("PYTHONPATH", "") or pairs.get("SGLANG_PHASETRACE") == "1"
    return "" if hooked else None
