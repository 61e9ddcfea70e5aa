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
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .. import keys, process_state
from ..redact import printable
from ..verdicts.startup import Startup
from ..verdicts.watchdog import Watchdog

log = logging.getLogger("sglang_phasetrace")
REQUEST_TIMEOUT_S = 5.0  # a client that sends nothing holds one thread this long at most


def parse(value: str) -> tuple[str, int] | None:
    """``HOST:PORT``, ``[V6]:PORT``, ``:PORT`` or ``PORT`` (loopback) -> (host, port); None if not one."""
    m = re.fullmatch(r"\s*(?:(\[[0-9A-Fa-f:.]+\]|[^:\s\[\]]*):)?(\d{1,5})\s*", value)
    if m is None or not 0 < int(m.group(2)) < 65536:
        return None
    host = (m.group(1) or "127.0.0.1").strip("[]")
    return host, int(m.group(2))


def open_from_env(dog: Watchdog) -> ThreadingHTTPServer | None:
    """The endpoint, where ``SGLANG_PHASETRACE_HTTP`` asks for one; None (and at most one warning,
    naming the address) where it is off or cannot be bound. Never raises."""
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
    log.info("sglang-phasetrace: start-up endpoint on http://%s:%d/metrics", *server.server_address[:2])
    return server


def serve(addr: tuple[str, int], get: Any) -> ThreadingHTTPServer:
    """Listen on ``addr`` and answer from ``get()`` (the latest ``Startup``) on a daemon thread."""
    from ..render import prometheus

    reg = prometheus.registry(get)

    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT_S
        server_version = "phasetrace"
        sys_version = ""

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/") or "/"
            try:
                s: Startup | None = get()
                if path == "/metrics":
                    self._send(200, prometheus.text(reg), prometheus.CONTENT_TYPE)
                elif path == "/startup":
                    doc = s.to_json() if s is not None else {"state": "starting", "line": _first_pass(), "code": 0}
                    self._send(200, json.dumps(doc).encode(), "application/json")
                elif path == "/startup/probe":
                    code, line = (s.code, s.line) if s is not None else (0, _first_pass())
                    self._send(200 if code == 0 else 503, printable(line).encode() + b"\n", "text/plain; charset=utf-8")
                else:
                    self._send(404, b"not found: /metrics, /startup, /startup/probe\n", "text/plain; charset=utf-8")
            except Exception as exc:  # a bug of ours answers 500; the launch never sees it
                log.debug("sglang-phasetrace: start-up endpoint: %r", exc)
                self._send(500, b"internal error\n", "text/plain; charset=utf-8")

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # a scrape every 15 s is not news
            pass

    host, port = addr
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class = type("Server", (ThreadingHTTPServer,), {"address_family": family, "daemon_threads": True})
    server = server_class((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="phasetrace-http", daemon=True).start()
    return server


def _first_pass() -> str:
    return "sglang-phasetrace: starting: the watchdog's first pass is under way"
