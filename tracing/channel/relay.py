"""The channel between nodes: each node's launcher holds its own client connection to the launch's
rendezvous store (the torch ``TCPStore`` that world rank 0 creates at ``--dist-init-addr`` inside
``init_process_group``), so no server of ours runs anywhere.

Keys we write all start with ``PREFIX`` (SGLang's own live under ``default_pg/`` and others):
``phasetrace/launch`` (the launch identity, first value wins) and ``phasetrace/node/<k>`` (node k's
latest snapshot, overwritten every heartbeat, never deleted: a node that went quiet keeps its last
word, which says when it was written). Our client never counts as a worker (``wait_for_workers=False``),
so it cannot disturb the store's world-size accounting or the process group's barrier.

Every operation is bounded by ``timeout_s`` and never raises: a failure drops the connection (the
caller may ``connect()`` again later) and warns once per problem, naming the endpoint. ``TCPStore.get``
and ``multi_get`` wait for a missing key, so ``read`` asks ``check`` first and fetches only what exists.

Anyone who can reach the store can write these keys (it has no authentication): what is read back
is decoded into a schema's types (``tracing.channel.node_snapshot``) or refused with a reason, never trusted as is.

Stdlib and msgspec at import (the launcher imports tracing early); torch is imported on ``connect``.
"""

from __future__ import annotations

import datetime
import socket
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from ..redact import redact_text

PREFIX = "phasetrace/"
LAUNCH_KEY = PREFIX + "launch"
DECODE_LIMIT = 4 << 20  # inflated bytes of one snapshot (8 ranks: ~0.1 MiB; 64 ranks: under 1 MiB)
LAUNCH_LIMIT = 4096  # bytes of the stored launch identity
T = TypeVar("T")
CONNECT_TRIES = 3  # failed connects in a row to a listening store before we warn


def node_key(node_rank: int) -> str:
    return f"{PREFIX}node/{node_rank}"


def parse_addr(value: str) -> tuple[str, int] | None:
    """``(host, port)`` from ``HOST:PORT``, ``[v6]:PORT`` or ``tcp://`` either; None when not usable
    (no port, a port out of range, a bare IPv6 address whose port cannot be told apart)."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    if text.startswith("tcp://"):
        text = text[len("tcp://") :]
    text = text.rstrip("/")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            return None
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or ":" in host:
            return None
    if not host or any(c.isspace() for c in host) or not port_text.isdigit():
        return None
    port = int(port_text)
    return (host, port) if 0 < port < 65536 else None


def endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def encode(value: Any) -> bytes:
    """Compact JSON, zlib-compressed (a node's snapshot of 8 ranks: a few KiB)."""
    return zlib.compress(msgspec.json.encode(value), 6)


def decode(data: bytes, schema: type[T], limit: int = DECODE_LIMIT) -> T:
    """The ``schema`` value in ``data``; ``ValueError`` saying why when it is not one (not ours, not of that
    schema, nested too deep) or would inflate past ``limit`` bytes (decompressed with a cap, never
    all at once). The reason names the place in the value, never quotes much of it."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValueError(f"expected bytes, got {type(data).__name__}")
    if len(data) > limit:
        raise ValueError(f"payload of {len(data)} bytes is over the {limit}-byte limit")
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise ValueError(f"not zlib-compressed data ({exc})") from None
    if len(raw) > limit or inflater.unconsumed_tail:
        raise ValueError(f"payload inflates past the {limit}-byte limit")
    if not inflater.eof:
        raise ValueError("truncated compressed data")
    if inflater.unused_data:
        raise ValueError("trailing bytes after the compressed data")
    return loads(raw, schema)


def loads(raw: bytes, schema: type[T]) -> T:
    """``raw`` JSON as ``schema`` (msgspec checks the types, sizes and ranges as it decodes)."""
    try:
        return msgspec.json.decode(raw, type=schema)
    except msgspec.DecodeError as exc:  # ValidationError too: "Expected `int`, got `str` - at `$.seq`"
        raise ValueError(printable(str(exc))) from None
    except RecursionError:  # nested past the interpreter's limit in a field the schema skips
        raise ValueError("nested too deep") from None


def printable(text: str, limit: int = 200) -> str:
    """``text`` (from data another party wrote) capped and with control characters shown as ``?``."""
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return "".join(c if c.isprintable() else "?" for c in text)


class Relay:
    """One node's client connection to the launch's rendezvous store."""

    def __init__(
        self,
        addr: str,
        node_rank: int,
        nnodes: int,
        *,
        timeout_s: float = 5.0,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.addr = addr
        self.node_rank = node_rank
        self.nnodes = nnodes
        self.timeout_s = max(0.1, float(timeout_s))
        self._warn_fn = warn
        self._parsed = parse_addr(addr)
        self.endpoint = endpoint(*self._parsed) if self._parsed else str(addr)
        self._store: Any = None
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._present: set[int] = set()  # nodes seen to have published (keys are never deleted)
        self._connect_failures = 0  # in a row, against a store that accepts TCP connections

    @property
    def connected(self) -> bool:
        return self._store is not None

    # -- connection ------------------------------------------------------------------------------

    def connect(self) -> bool:
        """One bounded attempt; True when connected. Nothing listening yet (rank 0 has not created
        the store) is the normal state before the rendezvous: answered at once by a TCP probe, quiet.
        Against a listening store, torch's client takes up to ``max(timeout_s, ~5 s)``: its retry
        loop has a floor of its own."""
        with self._lock:
            if self._store is not None:
                return True
            if self._parsed is None:
                self._warn("address", f"not a usable HOST:PORT address ({redact_text(str(self.addr))[:120]})")
                return False
            host, port = self._parsed
            deadline = time.monotonic() + self.timeout_s
            # TCPStore's own connect retries with back-off well past its timeout (5 s for 2 s): a
            # plain TCP probe answers "nothing listens yet" at once and bounds the unreachable case.
            try:
                socket.create_connection((host, port), timeout=self.timeout_s).close()
            except socket.gaierror as exc:
                self._warn("resolve", f"cannot resolve the host ({exc.strerror or exc})")
                return False
            except OSError:
                return False  # refused / unreachable / timed out: the store is not there (yet)
            remaining = max(0.5, deadline - time.monotonic())
            try:
                from torch.distributed import TCPStore

                store = TCPStore(
                    host,
                    port,
                    None,
                    False,
                    timeout=datetime.timedelta(seconds=remaining),
                    wait_for_workers=False,
                )
                store.set_timeout(datetime.timedelta(seconds=self.timeout_s))
            except Exception as exc:
                # torch's client now and then times out against a live store (about 1 connect in 40
                # on loopback, libuv or not); the next attempt succeeds: say so only when it persists
                self._connect_failures += 1
                if self._connect_failures >= CONNECT_TRIES:
                    self._warn("connect", f"{self._connect_failures} connect attempts failed ({_brief(exc)})")
                return False
            self._connect_failures = 0
            self._store = store
            self._present.clear()
            return True

    def close(self) -> None:
        """Drop the connection (torch closes the socket when the client object goes)."""
        with self._lock:
            self._store = None

    # -- operations ------------------------------------------------------------------------------

    def agree(self, proposal: T, schema: type[T]) -> T | None:
        """The launch identity all nodes share. Node 0 stores ``proposal`` unless a value is there
        already (first one wins) and returns what is stored; another node returns the stored value,
        or None while node 0 has not written one (it does not wait). A stored value that is not a
        ``schema`` is said once and taken as none: the caller keeps its own identity."""
        value = msgspec.json.encode(proposal)

        def op(store: Any) -> bytes | None:
            if self.node_rank == 0:
                return store.compare_set(LAUNCH_KEY, b"", value)
            return store.get(LAUNCH_KEY) if store.check([LAUNCH_KEY]) else None

        stored = self._op("agree", op)
        if stored is None:
            return None
        try:
            if len(stored) > LAUNCH_LIMIT:
                raise ValueError(f"{len(stored)} bytes, over the {LAUNCH_LIMIT}-byte limit")
            return loads(bytes(stored), schema)
        except ValueError as exc:
            self._warn("agree-value", f"the launch identity stored under {LAUNCH_KEY!r} is not usable ({exc})")
            return None

    def publish(self, payload: bytes) -> None:
        """This node's latest snapshot (overwrites the previous one)."""
        self._op("publish", lambda store: store.set(node_key(self.node_rank), payload))

    def read(self) -> dict[int, bytes]:
        """node rank -> latest payload, for every other node that has published. One ``check`` of
        all keys and one ``multi_get`` once every node has published; per-key checks only for the
        nodes not seen yet."""
        others = [k for k in range(self.nnodes) if k != self.node_rank]
        if not others:
            return {}

        def op(store: Any) -> dict[int, bytes]:
            if store.check([node_key(k) for k in others]):
                present = others
            else:
                known = [k for k in others if k in self._present]
                if known and not store.check([node_key(k) for k in known]):
                    known = []  # a key went away (a new store at the same address): look again
                present = sorted({*known, *(k for k in others if k not in known and store.check([node_key(k)]))})
            if not present:
                return {}
            values = store.multi_get([node_key(k) for k in present])
            self._present.update(present)
            return {k: bytes(v) for k, v in zip(present, values, strict=True)}

        got = self._op("read", op)
        return got if got is not None else {}

    # -- failures --------------------------------------------------------------------------------

    def _op(self, what: str, fn: Callable[[Any], Any]) -> Any:
        with self._lock:
            store = self._store
            if store is None:
                return None
            try:
                return fn(store)
            except Exception as exc:
                self._store = None
                self._present.clear()
                problem = "timeout" if "timeout" in str(exc).lower() or "timed out" in str(exc).lower() else "lost"
                self._warn(problem, f"{what} failed, reconnecting later ({_brief(exc)})")
                return None

    def _warn(self, problem: str, text: str) -> None:
        if problem in self._warned or self._warn_fn is None:
            self._warned.add(problem)
            return
        self._warned.add(problem)
        try:
            self._warn_fn(f"sglang-phasetrace: cross-node relay to {self.endpoint}: {text}")
        except Exception:
            pass


def _brief(exc: BaseException) -> str:
    """The exception's type and first line (torch appends C++ frames), redacted and capped."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return redact_text(f"{type(exc).__name__}: {first}"[:300])
