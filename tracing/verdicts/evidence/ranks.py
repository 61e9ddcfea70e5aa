"""What the ranks of a run wait on, for one watchdog pass or one ``status`` frame: each rank read at
most once a pass, and only when a rule asks (``diagnose``: the ranks it is about to name or finds
idle), so a healthy rank is never read and a rank's heartbeat does nothing new.

A rank of this host is read from ``/proc`` (``evidence.read``): ``/proc/locks`` once a pass, the
host's TCP table once a pass and only when a rank waits on a socket, its children's CPU since the
previous pass, the main thread's native frame from the py-spy dump the watchdog took for a verdict
(``native``, for that one read). A rank of another node is never read here: what its own node's launcher read comes
in its snapshot (``remote``). Nothing raises: a rank that cannot be read has no evidence.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ... import keys, other_processes
from ...reader.view import ProcessRec, RunView
from . import read
from .locks import LockLine, read_locks
from .sockets import TcpRow, read_tcp
from .values import Evidence

log = logging.getLogger("sglang_phasetrace")


class RankReader:
    def __init__(self, remote: Callable[[ProcessRec], Evidence | None] | None = None) -> None:
        self.remote = remote  # another node's rank: what its launcher read, from its snapshot
        self.previous: dict[int, Evidence] = {}  # pid -> its latest read: children's CPU since then
        self.now: dict[int, Evidence] = {}  # pid -> read in this pass
        self.run: RunView | None = None
        self._pass: dict[str, Any] = {}  # what every rank of the pass shares, read at first need

    def start(self, run: RunView) -> RankReader:
        """A new pass over ``run``: nothing of the last pass is reused but the previous readings."""
        self.run, self.now, self._pass = run, {}, {}
        return self

    def __call__(self, proc: ProcessRec, native: str | None = None) -> Evidence | None:
        """What ``proc`` waits on (read once a pass); ``native``: a py-spy dump's text just taken, to
        read it again with its native frame (a dump is used once: the rank may wait elsewhere later)."""
        try:
            if proc.remote is not None or proc.host != other_processes.this_host():
                return self.remote(proc) if self.remote is not None else None
            got = self.now.get(proc.pid)
            if got is not None and native is None:
                return got
            got = read(
                proc.pid,
                launch_pids=self.launch(),
                since_ns=proc.last_progress_t or None,
                native=native,
                start_ticks=proc.start_ticks,
                previous=self.previous.get(proc.pid),
                locks=self.locks(),
                tcp=self.tcp,
                rendezvous=self.rendezvous(),
            )
        except Exception as exc:  # ``read`` never raises on what it reads; a bug here costs the detail only
            log.debug("sglang-phasetrace: evidence of pid %s not read: %r", proc.pid, exc)
            return None
        self.now[proc.pid] = self.previous[proc.pid] = got
        return got

    def _once(self, name: str, make: Callable[[], Any]) -> Any:
        if name not in self._pass:
            self._pass[name] = make()
        return self._pass[name]

    def locks(self) -> list[LockLine] | None:
        return self._once("locks", read_locks)

    def tcp(self) -> dict[int, TcpRow] | None:
        """The host's TCP table, read at the first rank of the pass that waits on a socket."""
        return self._once("tcp", read_tcp)

    def launch(self) -> set[int]:
        """The pids of this launch on this host (its journals'): a lock holder among them, or below one,
        is part of it."""
        here = other_processes.this_host()
        run = self.run.processes if self.run is not None else []
        return self._once("launch", lambda: {p.pid for p in run if p.remote is None and p.host == here and p.pid})

    def rendezvous(self) -> str | None:
        """The launch's ``HOST:PORT`` (a rank's ``dist.init_process_group``; a node's launch record)."""
        return self._once("rendezvous", self._find_rendezvous)

    def _find_rendezvous(self) -> str | None:
        for p in self.run.processes if self.run is not None else []:
            addr = (p.launch or {}).get("rendezvous") or next(
                (s.attrs[keys.INIT_METHOD] for s in p.spans.values() if keys.INIT_METHOD in s.attrs), None
            )
            if isinstance(addr, str):
                return addr
        return None
