"""The start-up endpoint's cost is bounded whatever its clients do (issue 47): one thread however many
connections, a real listen backlog, the oldest connection closed at the cap so a probe is read, a
request bounded in time and bytes, no name looked up, and its URL said once on stderr at any log
level. Hostile clients here are bounded in count and time, on loopback only; the real launch's
check is ``tests/test_orchestrators_real.py``."""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import free_port
from sglang_phasetrace.tracing import keys, process_state
from sglang_phasetrace.tracing.launcher import endpoint
from sglang_phasetrace.tracing.verdicts import startup
from test_orchestrators import http_get

PROBE = b"GET /startup/probe HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture
def served() -> Iterator[int]:
    port = free_port()
    state = startup.Startup("starting", "sglang-phasetrace: starting: 2 ranks")
    server = endpoint.serve(("127.0.0.1", port), lambda: state)
    try:
        yield port
    finally:
        server.shutdown()
        server.server_close()


def connect(port: int, n: int) -> list[socket.socket]:
    """``n`` connections, made without waiting for each (a burst), then waited for together."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
    for s in socks:
        select.select([], [s], [], 5.0)
        s.setblocking(True)
    return socks


def timed_probe(port: int) -> float:
    tic = time.monotonic()
    code, _, body = http_get(f"http://127.0.0.1:{port}/startup/probe", 5.0)
    took = time.monotonic() - tic
    assert (code, body) == (200, "sglang-phasetrace: starting: 2 ranks\n")
    return took


def closed_by_server(s: socket.socket, within: float) -> bytes | None:
    """What the server sent before closing ``s`` within ``within`` s; None: still open."""
    s.settimeout(within)
    got = b""
    try:
        while chunk := s.recv(4096):
            got += chunk
    except TimeoutError:
        return None
    except OSError:
        pass
    return got


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()


def test_idle_connections_cost_no_thread_and_the_probe_is_answered_at_once(served: int) -> None:
    """One thread per connection (the stdlib ThreadingHTTPServer) took a launcher from 9 threads to 61."""
    before = threading.active_count()
    socks = connect(served, 200)
    try:
        time.sleep(0.5)
        assert threading.active_count() == before, threading.enumerate()
        assert max(timed_probe(served) for _ in range(5)) < 1.0
    finally:
        close_all(socks)


def _listen_overflows() -> int:
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            row = dict(zip(names.split()[1:], values.split()[1:], strict=True))
            return int(row["ListenOverflows"]) + int(row["ListenDrops"])
    return 0


def test_a_burst_of_connections_overflows_no_listen_queue(served: int) -> None:
    """A backlog of 5 dropped hundreds of SYNs a run: a probe then waited 1-3 s to connect."""
    before = _listen_overflows()
    tic = time.monotonic()
    socks = connect(served, 400)
    try:
        assert time.monotonic() - tic < 2.0
        assert _listen_overflows() == before
        assert timed_probe(served) < 1.0
    finally:
        close_all(socks)


def test_at_the_cap_the_oldest_connection_is_closed_and_a_probe_is_read(
    served: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(endpoint, "MAX_CONNECTIONS", 16)
    socks = connect(served, 16)
    try:
        time.sleep(0.3)
        assert timed_probe(served) < 1.0  # the 17th connection: the oldest idle one makes room
        assert closed_by_server(socks[0], 2.0) == b""
    finally:
        close_all(socks)


def test_a_slowloris_client_is_closed_once_its_request_time_is_spent(monkeypatch: pytest.MonkeyPatch) -> None:
    """One header byte every 0.2 s reset the stdlib's per-read timeout forever; here the whole
    request has ``REQUEST_TIMEOUT_S`` (1 s in this test), then 408 and the connection closed."""
    monkeypatch.setattr(endpoint, "REQUEST_TIMEOUT_S", 1.0)
    port = free_port()
    server = endpoint.serve(("127.0.0.1", port), lambda: None)
    slow = socket.create_connection(("127.0.0.1", port), timeout=5.0)
    try:
        slow.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
        tic, answer = time.monotonic(), None
        while answer is None and time.monotonic() - tic < 4.0:
            try:
                slow.sendall(b"a")
            except OSError:
                answer = b""
                break
            answer = closed_by_server(slow, 0.2)
        assert answer is not None and time.monotonic() - tic < 2.5, "still open after 4 s of slow bytes"
        assert answer in (b"", endpoint._REFUSED[408]), answer
    finally:
        slow.close()
        server.shutdown()
        server.server_close()


def test_a_header_flood_is_refused_at_the_header_bound(served: int) -> None:
    """99 header lines of 60 kB (under the stdlib's 64 kB line and 100 header limits: 6 MB held per
    connection) is refused with 431 once the header bytes pass ``HEADER_BYTES_MAX``."""
    flood = socket.create_connection(("127.0.0.1", served), timeout=5.0)
    sent = 0
    try:
        flood.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        line = b"X-Flood: " + b"a" * 60_000 + b"\r\n"
        try:
            for _ in range(99):
                flood.sendall(line)
                sent += len(line)
        except OSError:
            pass  # closed by the server while we still sent: what is wanted
        answer = closed_by_server(flood, 3.0)
        assert answer is not None, "still open after a 6 MB header"
        assert answer in (b"", endpoint._REFUSED[431]) and sent < 99 * len(line), (answer, sent)
    finally:
        flood.close()
    assert timed_probe(served) < 1.0


def test_odd_methods_and_garbage_get_a_fixed_answer(served: int) -> None:
    for raw, status in ((b"DELETE /metrics HTTP/1.1\r\nHost: x\r\n\r\n", b"405"), (b"\x00\xffgarbage\r\n\r\n", b"400")):
        s = socket.create_connection(("127.0.0.1", served), timeout=5.0)
        try:
            s.sendall(raw)
            answer = s.recv(4096)
            assert answer.split(b" ")[1] == status, answer
        finally:
            s.close()
    assert timed_probe(served) < 1.0


def test_binding_looks_up_no_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stdlib's HTTPServer asked ``socket.getfqdn`` (reverse DNS) on the launcher's thread."""

    def no_lookup(*_: object) -> str:
        raise AssertionError("a name was looked up")

    monkeypatch.setattr(socket, "getfqdn", no_lookup)
    monkeypatch.setattr(socket, "gethostbyaddr", no_lookup)
    port = free_port()
    server = endpoint.serve(("127.0.0.1", port), lambda: None)
    try:
        assert http_get(f"http://127.0.0.1:{port}/startup/probe", 5.0)[0] == 200
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("family", ["v4", "v6"])
def test_the_url_is_said_once_on_stderr_whatever_the_log_level(
    family: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if family == "v6" and not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    host = "::1" if family == "v6" else "127.0.0.1"
    port = free_port()
    monkeypatch.setenv(keys.ENV_HTTP, f"[{host}]:{port}" if family == "v6" else f"{host}:{port}")
    monkeypatch.setattr(process_state, "STATE", process_state.ProcessState())
    logging.getLogger("sglang_phasetrace").setLevel(logging.ERROR)

    class Dog:
        startup = None

    try:
        server = endpoint.open_from_env(Dog())  # type: ignore[arg-type]
    except OSError:
        pytest.skip("cannot bind ::1 here")
    finally:
        logging.getLogger("sglang_phasetrace").setLevel(logging.NOTSET)
    if server is None:
        pytest.skip(f"cannot listen on {host} here")
    try:
        shown = f"[{host}]" if family == "v6" else host
        said = [line for line in capsys.readouterr().err.splitlines() if "start-up endpoint" in line]
        assert said == [f"sglang-phasetrace: start-up endpoint on http://{shown}:{port}/metrics"]
    finally:
        server.shutdown()
        server.server_close()


def test_the_endpoint_installs_no_signal_handler() -> None:
    """A traced process dies on every signal exactly as an untraced one: the event loop's thread
    touches no handler (asyncio installs one only for ``add_signal_handler``, never called)."""
    import signal

    every = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]
    before = {s: signal.getsignal(s) for s in every}
    port = free_port()
    server = endpoint.serve(("127.0.0.1", port), lambda: None)
    try:
        assert http_get(f"http://127.0.0.1:{port}/startup/probe", 5.0)[0] == 200
        assert {s: signal.getsignal(s) for s in every} == before
    finally:
        server.shutdown()
        server.server_close()
