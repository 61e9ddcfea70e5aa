"""The start-up endpoint under hostile clients: p99 of a well-behaved probe and scrape while 1000 idle,
50 slowloris and 20 header-flood connections are open (each reopened once the endpoint closes it),
against the same with none, and the launcher's threads and RSS before, during and after. Loopback
only; bounded in count and time; it stops by itself (and stops the launch it started).

    python scripts/make_tiny_model.py /tmp/tiny
    python scripts/bench_endpoint.py /tmp/tiny [--seconds 20]       # starts a traced launch_server tp=2 on CPU
    python scripts/bench_endpoint.py --pid PID --port PORT           # or an endpoint already listening

Goals (issue 47): p99 <= 100 ms under abuse, the launcher's threads flat, its RSS +<= 16 MiB.
``Hostile`` is also the real test's misbehaving client (tests/test_orchestrators_real.py).
"""

from __future__ import annotations

import argparse
import http.client
import os
import resource
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOOD_LINE = b"X-Flood: " + b"a" * 64_000 + b"\r\n"  # 64 kB header lines, 99 of them, never finished
FLOOD_LINES = 99


@dataclass
class Client:
    kind: str  # idle, slow, flood
    sock: socket.socket | None = None
    sent: int = 0
    next_at: float = 0.0  # when it sends (slow) or reopens (closed)


@dataclass
class Hostile:
    """Misbehaving clients of ``port`` on loopback, run from one thread until ``stop`` or ``seconds``:
    ``idle`` connections that send nothing, ``slow`` ones that send a header byte a second, ``flood``
    ones that send 99 unfinished 64 kB header lines as fast as they are read. Each one the server
    closes is reopened ``reopen_s`` later, so the count stays as asked."""

    port: int
    idle: int = 1000
    slow: int = 50
    flood: int = 20
    seconds: float = 60.0
    reopen_s: float = 0.5
    host: str = "127.0.0.1"
    closed_by_server: dict[str, int] = field(default_factory=lambda: {"idle": 0, "slow": 0, "flood": 0})
    opened: int = 0
    held: list[int] = field(default_factory=list)  # connections open (or connecting), sampled twice a second

    def __post_init__(self) -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = self.idle + self.slow + self.flood + 256
        if soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
        self.sel = selectors.DefaultSelector()
        self.clients = [Client(k) for k, n in (("idle", self.idle), ("slow", self.slow), ("flood", self.flood))
                        for _ in range(n)]  # fmt: skip
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="hostile", daemon=True)

    def start(self) -> Hostile:
        for c in self.clients:
            self._open(c)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.done.set()
        self.thread.join(10)
        for c in self.clients:
            self._close(c)
        self.sel.close()

    def open_now(self) -> int:
        return sum(c.sock is not None for c in self.clients)

    def _open(self, c: Client) -> None:
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((self.host, self.port))
        c.sock, c.sent, c.next_at = s, 0, time.monotonic() + 0.2
        self.sel.register(s, selectors.EVENT_READ, c)
        self.opened += 1

    def _close(self, c: Client) -> None:
        if c.sock is not None:
            try:
                self.sel.unregister(c.sock)
            except (KeyError, ValueError):
                pass
            c.sock.close()
            c.sock = None

    def _lost(self, c: Client) -> None:
        self.closed_by_server[c.kind] += 1
        self._close(c)
        c.next_at = time.monotonic() + self.reopen_s

    def _run(self) -> None:
        end = time.monotonic() + self.seconds
        sampled = 0.0
        while not self.done.is_set() and time.monotonic() < end:
            if time.monotonic() - sampled >= 0.5:
                self.held.append(self.open_now())
                sampled = time.monotonic()
            for key, _ in self.sel.select(0.05):
                c = key.data
                try:
                    if not c.sock.recv(65536):  # the server closed it (maybe after a 408/431)
                        self._lost(c)
                except BlockingIOError:
                    pass
                except OSError:
                    self._lost(c)
            now = time.monotonic()
            for c in self.clients:
                if c.sock is None:
                    if now >= c.next_at:
                        self._open(c)
                    continue
                try:
                    if c.kind == "slow" and now >= c.next_at:
                        c.sock.send(b"GET /metrics HTTP/1.1\r\nX-Slow: " if c.sent == 0 else b"a")
                        c.sent += 1
                        c.next_at = now + 1.0
                    elif c.kind == "flood" and c.sent < FLOOD_LINES * len(FLOOD_LINE):
                        head = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" if c.sent == 0 else b""
                        c.sent += c.sock.send(head + FLOOD_LINE) - len(head)
                except BlockingIOError:
                    pass
                except OSError:
                    self._lost(c)
        self.done.set()


def timed_get(port: int, path: str, host: str = "127.0.0.1") -> float | None:
    """Seconds for one GET on a fresh connection (as a Kubernetes probe or a scrape makes it); None: failed."""
    tic = time.perf_counter()
    try:
        conn = http.client.HTTPConnection(host, port, timeout=5.0)
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        conn.close()
        return time.perf_counter() - tic if r.status in (200, 503) else None
    except OSError:
        return None


def sample(port: int, seconds: float, every: float = 0.05) -> dict[str, list[float | None]]:
    out: dict[str, list[float | None]] = {"/startup/probe": [], "/metrics": []}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for path in out:
            out[path].append(timed_get(port, path))
        time.sleep(every)
    return out


def serving(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5.0)
        conn.request("GET", "/startup")
        return b'"state": "serving"' in conn.getresponse().read()
    except OSError:
        return False


def p99(times: list[float | None]) -> str:
    ok = sorted(t for t in times if t is not None)
    failed = len(times) - len(ok)
    if not ok:
        return "no answer"
    q = statistics.quantiles(ok, n=100)[98] if len(ok) > 1 else ok[0]
    return f"p50 {statistics.median(ok) * 1e3:.1f} ms, p99 {q * 1e3:.1f} ms, max {ok[-1] * 1e3:.0f} ms" + (
        f", {failed} of {len(times)} failed" if failed else f" ({len(ok)} requests)"
    )


def proc_status(pid: int) -> tuple[int, int]:
    """(threads, RSS bytes) of ``pid``."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0]) * 1024


def launch(model: Path, tmp: Path, http: int) -> subprocess.Popen:
    cpu = {
        "SGLANG_USE_CPU_ENGINE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "SGLANG_CPU_OMP_THREADS_BIND": "0|1",
    }  # as tests/conftest.py's CPU_ENV
    env = {**cpu, **os.environ, "PYTHONPATH": str(ROOT / "sitecustomize_hooks"),
           "SGLANG_PHASETRACE_DIR": str(tmp / "runs"), "SGLANG_PHASETRACE_HTTP": f"127.0.0.1:{http}"}  # fmt: skip
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--device", "cpu",
               "--tp-size", "2", "--max-total-tokens", "4096", "--port", str(port)]  # fmt: skip
    with open(tmp / "launch.log", "w") as log:
        return subprocess.Popen(command, env=env, cwd=tmp, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def bench(pid: int, port: int, seconds: float, counts: tuple[int, int, int]) -> None:
    mib = 1 << 20
    quiet = sample(port, seconds / 2)
    threads0, rss0 = proc_status(pid)
    hostile = Hostile(port, *counts, seconds=seconds + 30).start()
    try:
        time.sleep(2.0)  # the connections made, the floods sent
        loud = sample(port, seconds)
        threads1, rss1 = proc_status(pid)
        held = hostile.held[4:]  # from the end of the warm-up
    finally:
        hostile.stop()
    time.sleep(1.0)
    threads2, rss2 = proc_status(pid)
    after = sample(port, seconds / 2)
    idle, slow, flood = counts
    print(f"start-up endpoint of pid {pid} on 127.0.0.1:{port}, {seconds:.0f} s each:")
    for path in quiet:
        print(f"  {path:15} alone: {p99(quiet[path])}")
        print(f"  {path:15} under {idle} idle + {slow} slowloris + {flood} header-flood: {p99(loud[path])}")
        print(f"  {path:15} alone again: {p99(after[path])}")
    print(f"  hostile connections open: {statistics.mean(held):.0f} on average, {min(held)} at least, of "
          f"{sum(counts)} ({hostile.opened} opened in all, each reopened 0.5 s after the endpoint closed it; "
          f"closed by the endpoint: {hostile.closed_by_server})")  # fmt: skip
    print(f"  launcher threads: {threads0} before, {threads1} during, {threads2} after")
    print(f"  launcher RSS: {rss0 / mib:.1f} MiB before, {rss1 / mib:.1f} during (+{(rss1 - rss0) / mib:.1f}), "
          f"{rss2 / mib:.1f} after (+{(rss2 - rss0) / mib:.1f})")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", type=Path, help="a model directory (scripts/make_tiny_model.py)")
    parser.add_argument("--pid", type=int, help="an endpoint's process, already running (with --port)")
    parser.add_argument("--port", type=int)
    parser.add_argument("--seconds", type=float, default=20.0, help="each measurement (alone; under abuse)")
    parser.add_argument("--counts", type=int, nargs=3, default=(1000, 50, 20), metavar=("IDLE", "SLOW", "FLOOD"))
    args = parser.parse_args()
    if args.pid is not None:
        bench(args.pid, args.port, args.seconds, tuple(args.counts))
        return 0
    if args.model is None:
        parser.error("a model directory, or --pid and --port")
    with tempfile.TemporaryDirectory() as tmp:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            http = s.getsockname()[1]
        proc = launch(args.model, Path(tmp), http)
        try:
            deadline = time.monotonic() + 300
            while not serving(http):  # measured once it serves: the launcher's threads and RSS settled
                if proc.poll() is not None or time.monotonic() > deadline:
                    print((Path(tmp) / "launch.log").read_text()[-3000:], file=sys.stderr)
                    return 1
                time.sleep(1.0)
            time.sleep(10.0)  # its warm-up request and first passes done
            bench(proc.pid, http, args.seconds, tuple(args.counts))
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
