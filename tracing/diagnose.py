"""Stall analysis over a run directory: which rank stopped, where, and who waits for it.

Pure (reads a ``RunView`` and the clock), so the live watchdog, ``phasetrace watch`` and
``phasetrace status`` share it. Rules, on ranks that are neither ready nor finished:

* silent: no heartbeat for ``silent_s`` (dead, stopped, or its Python threads cannot run);
* straggler: peers wait in a collective this rank has not entered, or this rank is still in a
  phase all peers have left — and it has made no progress for ``stall_s``;
* divergence: ranks of one group entered different collectives at the same sequence number;
* no progress: nothing moved on any rank for ``no_progress_s``.

Progress is any phase begin/end/event, collective, or a heartbeat whose phase progress changed
(shards loaded, shapes captured): a slow phase that keeps moving is not stuck.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field
from typing import Any

from . import keys
from .rundir import ProcessRec, RunView

NS = 1_000_000_000
_P2P = {"send", "recv", "send_object", "recv_object", "send_tensor_dict", "recv_tensor_dict"}  # paired, not divergent
_MEMBERS = re.compile(r"\[(\d+(?:,\d+)*)\]$")


@dataclass(frozen=True)
class Thresholds:
    heartbeat_s: float = 5.0
    silent_s: float = 15.0  # no heartbeat for this long
    stall_s: float = 30.0  # no progress while peers wait / moved on
    no_progress_s: float = 120.0  # nothing anywhere

    @classmethod
    def from_env(cls) -> Thresholds:
        """``SGLANG_PHASETRACE_{HEARTBEAT,SILENT,STALL,NO_PROGRESS}_S``; silent defaults to 3 beats."""
        def num(name: str, default: float) -> float:
            try:
                return float(os.environ.get(keys.ENV_SECONDS.format(name), default))
            except ValueError:
                return default

        hb = num("HEARTBEAT", cls.heartbeat_s)
        return cls(hb, num("SILENT", max(3 * hb, 2.0)), num("STALL", cls.stall_s),
                   num("NO_PROGRESS", cls.no_progress_s))


@dataclass
class Finding:
    kind: str  # "silent" | "straggler" | "divergence" | "no_progress"
    label: str  # the rank it names, e.g. "tp1"
    pid: int
    phase: str | None
    since_s: float
    message: str  # the one-line diagnosis
    waiting: dict[str, str] = field(default_factory=dict)  # peer label -> what it waits in
    stacks: list[str] = field(default_factory=list)  # stack dump paths, when taken
    pids: list[int] = field(default_factory=list)  # every process involved (named rank first)

    @property
    def key(self) -> tuple:
        """Same stall, same key: the watchdog reports each once."""
        return (self.kind, self.label, self.phase)


def this_host() -> str:
    return socket.gethostname()


def process_state(proc: ProcessRec) -> str:
    """``running``, ``sleeping``, ``disk-sleep``, ``stopped``, ``zombie``, ``exited`` or ``unknown``."""
    if proc.host != this_host():
        return "unknown (other host)"
    try:
        import psutil

        return psutil.Process(proc.pid).status()
    except Exception:  # NoSuchProcess, AccessDenied
        return "exited"


def _world_rank(proc: ProcessRec) -> int | None:
    value = proc.identity.get("sglang.world_rank")
    return value if isinstance(value, int) else None


def _where(proc: ProcessRec, now: int) -> tuple[str | None, str]:
    """(phase, "in 'x' for N s") of the innermost open phase, or after which one it idles."""
    span = proc.current
    if span is not None:
        return span.phase, f"in '{span.phase}' for {(now - span.start) / NS:.0f} s"
    ended = [s for s in proc.spans.values() if s.end is not None]
    if ended:
        last = max(ended, key=lambda s: s.end or 0)
        return None, f"between phases ('{last.phase}' ended {(now - (last.end or now)) / NS:.0f} s ago)"
    return None, "before its first phase"


def _heartbeat_t(run: RunView, proc: ProcessRec) -> int:
    times = [hb["t"] for hb in proc.heartbeats]
    status = run.status_file(proc)
    if status and isinstance(status.get("t"), int):
        times.append(status["t"])
    return max(times) if times else proc.last_t


def _wait_text(coll: dict[str, Any], now: int) -> str:
    return f"{coll['op']} #{coll['seq']} on group '{coll['group']}' since {(now - coll['t']) / NS:.0f} s"


def _initialising(proc: ProcessRec) -> bool:
    """Inside init: its root (or, for root-less programs, some phase) is still open."""
    root = proc.root
    return root.status == "open" if root is not None else bool(proc.open_spans)


def analyze(run: RunView, now_ns: int, thresholds: Thresholds | None = None) -> list[Finding]:
    th = thresholds or Thresholds()
    ranks = [p for p in run.processes if p.role == "rank"]
    active = [p for p in ranks if _initialising(p) and process_state(p) not in ("exited", "zombie")]
    if not active:
        return []
    findings: list[Finding] = []
    stalled = [p for p in active if (now_ns - p.last_progress_t) / NS >= th.stall_s]
    by_world = {w: p for p in ranks if (w := _world_rank(p)) is not None}

    for p in active:  # silent
        age = (now_ns - _heartbeat_t(run, p)) / NS
        if age >= th.silent_s:
            phase, where = _where(p, now_ns)
            findings.append(Finding(
                "silent", p.label, p.pid, phase, age,
                f"rank {p.label} (pid {p.pid}) is silent: no heartbeat for {age:.0f} s, process "
                f"{process_state(p)}, {where}", pids=[p.pid]))

    findings += _stragglers(active, stalled, ranks, by_world, now_ns, th)
    findings += _divergence(ranks)

    if len(stalled) == len(active) and not any(f.kind in ("straggler", "divergence") for f in findings):
        quiet = min((now_ns - p.last_progress_t) / NS for p in active)
        if quiet >= th.no_progress_s:
            places = "; ".join(f"{p.label} {_where(p, now_ns)[1]}" for p in active)
            first = active[0]
            findings.append(Finding("no_progress", first.label, first.pid, _where(first, now_ns)[0], quiet,
                                    f"no progress on any rank for {quiet:.0f} s: {places}",
                                    pids=[p.pid for p in active]))
    return findings


def _stragglers(active: list[ProcessRec], stalled: list[ProcessRec], ranks: list[ProcessRec],
                by_world: dict[int, ProcessRec], now: int, th: Thresholds) -> list[Finding]:
    findings = []
    for s in stalled:
        waiting: dict[str, str] = {}
        for peer in active:
            coll = peer.waiting_in
            if peer is s or coll is None or (now - coll["t"]) / NS < th.stall_s:
                continue
            members = _MEMBERS.search(coll["group"])
            world = _world_rank(s)
            if members and world is not None and str(world) not in members.group(1).split(","):
                continue  # s is not in that group
            if s.coll_counts.get(coll["group"], 0) < coll["seq"]:
                waiting[peer.label] = _wait_text(coll, now)
        phase, where = _where(s, now)
        left = _peers_left(s, ranks) if phase else []
        if not waiting and not left:
            continue
        quiet = (now - s.last_progress_t) / NS
        by_wait: dict[str, list[str]] = {}
        for label, text in waiting.items():
            by_wait.setdefault(text, []).append(label)
        detail = "; ".join(f"{', '.join(labels)} {'waits' if len(labels) == 1 else 'wait'} in {text}"
                           for text, labels in by_wait.items())
        if not detail:
            detail = "peers left it: " + ", ".join(f"{p.label} ({_where(p, now)[1]})" for p in left)
        own = s.waiting_in
        if own is not None:
            where += f", itself in {_wait_text(own, now)}"
        in_phase = (now - s.current.start) / NS if s.current is not None else quiet
        where += " without progress" if abs(in_phase - quiet) < 2 else f", without progress for {quiet:.0f} s"
        findings.append(Finding(
            "straggler", s.label, s.pid, phase, quiet,
            f"rank {s.label} (pid {s.pid}) has been {where}; {detail}",
            waiting=waiting, pids=[s.pid, *(p.pid for p in active if p.label in waiting or p in left)]))
    return findings


def _peers_left(s: ProcessRec, ranks: list[ProcessRec]) -> list[ProcessRec]:
    """Peers that ran ``s``'s current phase as often as ``s`` did and are out of it now."""
    phase = s.current.phase if s.current else None
    if phase is None:
        return []
    mine = sum(1 for span in s.spans.values() if span.phase == phase)
    peers = [p for p in ranks if p is not s]
    left = [p for p in peers
            if sum(1 for span in p.spans.values() if span.phase == phase and span.end is not None) >= mine
            and not any(span.phase == phase for span in p.open_spans)]
    return left if peers and len(left) == len(peers) else []


def _divergence(ranks: list[ProcessRec]) -> list[Finding]:
    findings = []
    groups = {g for p in ranks for g in p.coll_ops}
    for group in sorted(groups):
        members = [p for p in ranks if group in p.coll_ops]
        common = set.intersection(*(set(p.coll_ops[group]) for p in members)) if len(members) > 1 else set()
        for seq in sorted(common):
            ops = {p.label: p.coll_ops[group][seq] for p in members}
            if len({"p2p" if op in _P2P else op for op in ops.values()}) > 1:
                shown = ", ".join(f"{label} in {op}" for label, op in ops.items())
                first = members[0]
                findings.append(Finding("divergence", first.label, first.pid, None, 0.0,
                                        f"ranks diverged on group '{group}' at #{seq}: {shown}",
                                        waiting={label: f"{op} #{seq} on group '{group}'" for label, op in ops.items()},
                                        pids=[p.pid for p in members]))
                break  # the first divergence of a group is the one that matters
    return findings
