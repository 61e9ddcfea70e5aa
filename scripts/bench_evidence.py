"""Benchmark: what one evidence read (``tracing.verdicts.evidence.read``) costs, for one pid with N
open descriptors, in the shapes the watchdog meets.

Starts real processes and reads each many times, in one run, printing the median per read:

* a rank blocked in ``flock`` (the holder outside, 8 descriptors) with N more descriptors open;
* a rank asleep with N files open while another process holds a lock (the poll-for-a-lock check
  reads the ``fdinfo`` of up to ``MAX_POLL_SCAN`` of its files);
* a rank in ``select`` with N TCP sockets (the system call does not say which: every socket is
  looked up in one ``sock_diag`` dump of the host's TCP table, also shown alone);
* a rank waiting for K children (``psutil`` per child);
* ``read_locks()`` alone, and the py-spy text classification alone.

Beside each, the ratio to one heartbeat's own ``/proc`` sample (``Activity.sample``) measured in this
run: evidence is read only for ranks under suspicion, never on a heartbeat, so this is what one
suspicion costs the watcher, not what a healthy rank pays.

    python scripts/bench_evidence.py
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from sglang_phasetrace.tracing.verdicts import evidence

try:
    from sglang_phasetrace.tracing.recorder.activity import Activity
except ImportError:  # before the re-layout
    from sglang_phasetrace.tracing.recorder.activity import Activity  # type: ignore[no-redef]

REPS = 200
NATIVE = (
    'Thread 4242 (idle): "MainThread"\n    __futex_abstimed_wait_common (libc.so.6)\n'
    "    pthread_cond_wait@@GLIBC_2.3.2 (libc.so.6)\n    ncclCommInitRank (libnccl.so.2)\n"
    "    all_reduce (torch/distributed/distributed_c10d.py:2050)\n" + "    frame (x.py:1)\n" * 60
)


def _median_us(fn: Callable[[], object], reps: int = REPS) -> float:
    fn()  # warm: imports, first /proc reads
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _settle(ready: Callable[[], bool]) -> None:
    """Wait (10 s at most) until the process sits where the row says it does."""
    deadline = time.monotonic() + 10
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit("a benchmark process never reached its wait")
        time.sleep(0.02)


STARTED: list[subprocess.Popen] = []  # every process of the run, stopped at its end whatever happens


def _start(code: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True)
    STARTED.append(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        for child in evidence.children.child_pids(proc.pid, [64]):
            with contextlib.suppress(OSError):
                os.kill(child, 9)
    time.sleep(0.1)
    for proc in procs:
        proc.kill()
        proc.wait()
        if proc in STARTED:
            STARTED.remove(proc)


def main() -> None:
    act = Activity()
    beat = _median_us(act.sample)
    print(f"one heartbeat's /proc sample (Activity.sample): {beat:.0f} us (the unit of the ratios below)\n")
    rows: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        lock = Path(tmp) / "sampling.lock"
        _start(  # the holder of the lock every waiter below waits for
            f"""
            import fcntl, time
            f = open({str(lock)!r}, 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('ready', flush=True); time.sleep(600)
            """
        )
        try:
            for n in (8, 64, 512, 2048):
                waiter = subprocess.Popen(
                    [sys.executable, "-c", f"import fcntl, os\nfds = [os.open('/dev/null', os.O_RDONLY) for _ in "
                     f"range({n})]\nf = open({str(lock)!r}, 'a')\nfcntl.flock(f, fcntl.LOCK_EX)"]
                )  # fmt: skip
                STARTED.append(waiter)
                _settle(lambda w=waiter: evidence.read(w.pid).cause == "lock")
                us = _median_us(lambda w=waiter: evidence.read(w.pid, launch_pids={w.pid}))
                rows.append((f"blocked in flock, {n + 4} fds (holder: 4)", us))
                table = evidence.read_locks()
                us = _median_us(lambda w=waiter, t=table: evidence.read(w.pid, launch_pids={w.pid}, locks=t))
                rows.append(("  the same, /proc/locks read once per pass", us))
                _stop(waiter)

                sleeper = _start(
                    f"""
                    import os, time
                    fds = [os.open(os.path.join({tmp!r}, f'f{{i}}'), os.O_RDWR | os.O_CREAT) for i in range({n})]
                    print('ready', flush=True); time.sleep(600)
                    """
                )
                rows.append((f"asleep, {n + 4} files open, a lock held elsewhere", _median_us(
                    lambda s=sleeper: evidence.read(s.pid))))  # fmt: skip
                _stop(sleeper)

            for n in (8, 128, 1024):
                poller = _start(
                    f"""
                    import select, socket
                    srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen({n})
                    cs = [socket.create_connection(srv.getsockname()) for _ in range({n // 2})]
                    ss = [srv.accept()[0] for _ in cs]
                    print('ready', flush=True); select.select(cs, [], [])
                    """
                )
                _settle(lambda p=poller: evidence.read(p.pid).cause == "socket")
                rows.append((f"in select, {n} TCP sockets", _median_us(lambda p=poller: evidence.read(p.pid), reps=50)))
                table = evidence.read_tcp()
                rows.append(("  the same, the TCP table read once per pass", _median_us(
                    lambda p=poller, t=table: evidence.read(p.pid, tcp=t))))  # fmt: skip
                _stop(poller)

            for k in (1, 4, 16):
                parent = _start(
                    f"""
                    import subprocess, sys
                    kids = [subprocess.Popen(['sleep', '600']) for _ in range({k})]
                    print('ready', flush=True); kids[0].wait()
                    """
                )
                rows.append((f"waiting for {k} children", _median_us(lambda p=parent: evidence.read(p.pid), reps=50)))
                _stop(parent)
        finally:
            _stop(*STARTED)

    rows.append(("read_locks() alone", _median_us(evidence.read_locks)))
    rows.append((f"read_tcp() alone ({len(evidence.read_tcp() or {})} TCP sockets on the host)", _median_us(
        evidence.read_tcp, reps=50)))  # fmt: skip
    rows.append(("py-spy --native text (64 frames) classified", _median_us(lambda: evidence.native_frame(NATIVE))))
    width = max(len(name) for name, _ in rows)
    for name, us in rows:
        print(f"{name:<{width}}  {us / 1000:8.2f} ms  {us / beat:7.0f} x a heartbeat sample")


if __name__ == "__main__":
    main()
