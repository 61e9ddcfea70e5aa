"""The start-up endpoint: HTTP in the launcher while its launch starts and serves, opt-in by
``SGLANG_PHASETRACE_HTTP`` (``127.0.0.1:9464``, ``:9464`` or ``9464``: loopback unless an address is
given). SGLang's own ``/metrics`` and ``/health`` exist only once the server serves; this answers
from the launcher's first watchdog pass:

* ``/metrics``: the Prometheus text format (``render.prometheus``);
* ``/startup``: the start as one JSON document (``verdicts.startup``: the state, the line, every
  process's figures);
* ``/startup/probe``: 200 while the start progresses or the launch serves, 503 once a verdict
  stands (an ``httpGet`` probe), the line as the body.

Each answer is made from the latest pass's state, never by reading the run again: a scrape costs the
launcher less than one watchdog pass. It never delays or fails a start: an address that cannot be
bound (a port in use) is one warning, and the launch goes on without it.

Its cost is bounded whatever clients do (a probe must be answered within a second, Kubernetes'
default): one thread running one asyncio event loop, HTTP parsed by ``h11`` (SGLang's environment
ships it: uvicorn's parser). At most ``MAX_CONNECTIONS`` are open (a quarter of the descriptors
where that is fewer: the launcher's own need theirs); one more closes the oldest (every answer is
made and written at once, so none is being answered), so a probe that arrives is read. A request must arrive whole
(line, headers, any body: at most ``REQUEST_BYTES_MAX``, headers ``HEADER_BYTES_MAX``) within
``REQUEST_TIMEOUT_S`` of the connection or of the previous answer, or the connection is closed: an
idle or slowloris client holds a few kB for a few seconds. The listen backlog is ``BACKLOG``.
docs/orchestrators.md says why this rather than uvicorn or the stdlib server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import resource
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

import h11

from .. import keys, process_state
from ..redact import printable
from ..verdicts.startup import Startup
from ..verdicts.watchdog import Watchdog

log = logging.getLogger("sglang_phasetrace")
REQUEST_TIMEOUT_S = 5.0  # a whole request, from the connection (or the previous answer) to its last byte
MAX_CONNECTIONS = 1024  # open at once (a few kB each; at most a quarter of the descriptors): more closes the oldest
HEADER_BYTES_MAX = 16 * 1024  # request line and headers (h11's bound on an event not yet whole)
REQUEST_BYTES_MAX = 64 * 1024  # all a request may send, body included (a GET has none)
WRITE_BUFFER_MAX = 256 * 1024  # answers a client has not read: one that asks and never reads is closed
BACKLOG = 1024  # connections the kernel holds before we accept them (capped by net.core.somaxconn)
TEXT = "text/plain; charset=utf-8"
_REFUSED = {  # answered as is, then the connection closed: no parser state needed to say them
    400: b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    408: b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    413: b"HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    431: b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
}


def parse(value: str) -> tuple[str, int] | None:
    """``HOST:PORT``, ``[V6]:PORT``, ``:PORT`` or ``PORT`` (loopback) -> (host, port); None if not one."""
    m = re.fullmatch(r"\s*(?:(\[[0-9A-Fa-f:.]+\]|[^:\s\[\]]*):)?(\d{1,5})\s*", value)
    if m is None or not 0 < int(m.group(2)) < 65536:
        return None
    host = (m.group(1) or "127.0.0.1").strip("[]")
    return host, int(m.group(2))


def url(host: str, port: int) -> str:
    """``http://HOST:PORT``, an IPv6 address in brackets (a usable URL); no name is looked up."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def open_from_env(dog: Watchdog) -> Endpoint | None:
    """The endpoint, where ``SGLANG_PHASETRACE_HTTP`` asks for one; None (and at most one warning,
    naming the address) where it is off or cannot be bound. Never raises. Where it listens is said
    once on stderr, whatever SGLang's log level: an orchestrator's user must find the URL."""
    value = os.environ.get(keys.ENV_HTTP, "").strip()
    if not value:
        return None
    addr = parse(value)
    if addr is None:
        if process_state.say_once(("http", "value")):
            log.warning("sglang-phasetrace: %s=%r is not HOST:PORT; no start-up endpoint", keys.ENV_HTTP, value)
        return None
    try:
        server = serve(addr, lambda: dog.startup)
    except Exception as exc:
        if process_state.say_once(("http", addr)):
            why = getattr(exc, "strerror", None) or repr(exc)
            log.warning("sglang-phasetrace: no start-up endpoint: cannot listen on %s:%d (%s)", *addr, why)
        return None
    if process_state.say_once(("http", "url")):
        where = url(*server.server_address[:2])
        print(printable(f"sglang-phasetrace: start-up endpoint on {where}/metrics"), file=sys.stderr, flush=True)
    return server


def serve(addr: tuple[str, int], get: Callable[[], Startup | None]) -> Endpoint:
    """Listen on ``addr`` and answer from ``get()`` (the latest ``Startup``) on one daemon thread.
    The address is bound as given: no name is looked up for it (``socket.getfqdn`` may wait on a
    slow resolver)."""
    host, port = addr
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return Endpoint(sock, get)


class Endpoint:
    """The listening socket, its thread and its event loop; ``shutdown`` then ``server_close`` end it."""

    def __init__(self, sock: socket.socket, get: Callable[[], Startup | None]) -> None:
        from ..render import prometheus

        self.sock = sock
        self.server_address = sock.getsockname()
        self.answer = Answers(get, prometheus.registry(get))
        self.loop = asyncio.new_event_loop()
        self.open: dict[Connection, None] = {}  # in order of arrival: the oldest is closed first
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, name="phasetrace-http", daemon=True)
        self.thread.start()
        self.started.wait(5.0)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)  # this thread's only: no signal handler is installed
        self.loop.set_exception_handler(_quiet)  # nothing of ours in SGLang's log: asyncio's own logger stays out
        try:
            self.server = self.loop.run_until_complete(
                self.loop.create_server(lambda: Connection(self), sock=self.sock, backlog=BACKLOG)
            )
            self.started.set()
            self.loop.run_forever()
        except Exception as exc:  # a bug of ours ends the endpoint, never the launch
            log.debug("sglang-phasetrace: start-up endpoint ended: %r", exc)
        finally:
            self.started.set()

    def admit(self, conn: Connection) -> None:
        """Count ``conn`` in; one too many closes the oldest (none is being answered: an answer is
        made and written at once), so a probe that arrives is read whatever holds the others."""
        self.open[conn] = None
        if len(self.open) > min(MAX_CONNECTIONS, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 4):
            next(iter(self.open)).close()

    def shutdown(self) -> None:
        def stop() -> None:
            for conn in list(self.open):
                conn.close()
            if getattr(self, "server", None) is not None:
                self.server.close()
            self.loop.stop()

        if self.loop.is_running():
            self.loop.call_soon_threadsafe(stop)
        self.thread.join(5.0)

    def server_close(self) -> None:
        self.sock.close()
        if not self.thread.is_alive():
            self.loop.close()


class Answers:
    """What each path answers: (status, content type, body), from the latest pass's state."""

    def __init__(self, get: Callable[[], Startup | None], reg: Any) -> None:
        self.get, self.reg = get, reg

    def __call__(self, target: bytes) -> tuple[int, str, bytes]:
        from ..render import prometheus

        path = target.split(b"?", 1)[0].rstrip(b"/") or b"/"
        try:
            s = self.get()
            if path == b"/metrics":
                return 200, prometheus.CONTENT_TYPE, prometheus.text(self.reg)
            if path == b"/startup":
                doc = s.to_json() if s is not None else {"state": "starting", "line": _first_pass(), "code": 0}
                return 200, "application/json", json.dumps(doc).encode()
            if path == b"/startup/probe":
                code, line = (s.code, s.line) if s is not None else (0, _first_pass())
                return (200 if code == 0 else 503), TEXT, printable(line).encode() + b"\n"
            return 404, TEXT, b"not found: /metrics, /startup, /startup/probe\n"
        except Exception as exc:  # a bug of ours answers 500; the launch never sees it
            log.debug("sglang-phasetrace: start-up endpoint: %r", exc)
            return 500, TEXT, b"internal error\n"


class Connection(asyncio.Protocol):
    """One client: requests parsed by h11 as bytes arrive, each answered at once; closed when a
    request is not whole within ``REQUEST_TIMEOUT_S``, too large, or not HTTP."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=HEADER_BYTES_MAX)
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.received = 0  # bytes of the request under way
        self.target: bytes | None = None
        self.head = False
        self.method_ok = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.timer = self.endpoint.loop.call_later(REQUEST_TIMEOUT_S, self.refuse, 408)
        self.endpoint.admit(self)

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.received += len(data)
        try:
            self.conn.receive_data(data)
            while self.transport is not None and not self.transport.is_closing():
                event = self.conn.next_event()  # headers past HEADER_BYTES_MAX: 431
                if event is h11.NEED_DATA or event is h11.PAUSED:
                    if self.received > REQUEST_BYTES_MAX:  # a body, or requests sent ahead unanswered
                        self.refuse(413)
                    return
                if isinstance(event, h11.Request):
                    self.target, self.head = event.target, event.method == b"HEAD"
                    self.method_ok = event.method in (b"GET", b"HEAD")
                elif isinstance(event, h11.EndOfMessage):
                    self.respond()
                elif isinstance(event, h11.ConnectionClosed):
                    return self.close()
        except h11.RemoteProtocolError as exc:
            self.refuse(431 if exc.error_status_hint == 431 else 400)
        except Exception as exc:  # a bug of ours closes this connection, nothing else
            log.debug("sglang-phasetrace: start-up endpoint: %r", exc)
            self.close()

    def respond(self) -> None:
        if self.method_ok:
            status, kind, body = self.endpoint.answer(self.target or b"/")
        else:
            status, kind, body = 405, TEXT, b"method not allowed: GET, HEAD\n"
        headers = [("Content-Type", kind), ("Content-Length", str(len(body))), ("Cache-Control", "no-store")]
        if status == 405:
            headers.append(("Allow", "GET, HEAD"))
        out = self.conn.send(h11.Response(status_code=status, headers=headers))
        out += self.conn.send(h11.Data(data=b"" if self.head else body)) or b""
        out += self.conn.send(h11.EndOfMessage()) or b""
        assert self.transport is not None
        self.transport.write(out)
        if self.conn.our_state is h11.MUST_CLOSE or self.transport.get_write_buffer_size() > WRITE_BUFFER_MAX:
            return self.close()
        self.conn.start_next_cycle()  # keep-alive (a Prometheus scrape): a new request, a new deadline
        self.received = 0
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.endpoint.loop.call_later(REQUEST_TIMEOUT_S, self.refuse, 408)

    def refuse(self, status: int) -> None:
        """Answer ``status`` as is where no answer has begun, then close."""
        if self.transport is not None and not self.transport.is_closing():
            if self.conn.our_state is h11.IDLE and (status != 408 or self.received):
                self.transport.write(_REFUSED[status])
            self.close()

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.close()  # what was written goes first
        self.endpoint.open.pop(self, None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.close()
        self.transport = None


def _quiet(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    log.debug("sglang-phasetrace: start-up endpoint: %s", context.get("exception") or context.get("message"))


def _first_pass() -> str:
    return "sglang-phasetrace: starting: the watchdog's first pass is under way"
