"""Evidence said in words: the cause a read points at (``finish``), one phrase a verdict line carries
after the rank's name (``phrase``), and the cause every idle rank of a launch shares
(``shared_cause``): one lock holder, one remote address, their own busy children."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping

import msgspec

from .values import BUSY_PCT, SOCKETISH, Child, Evidence, FileLock, Shared, Socket


def finish(ev: Evidence) -> Evidence:
    """``cause``, ``busy`` and ``text`` from what was read."""
    busy_child = next((c for c in ev.children if c.cpu_pct >= BUSY_PCT), None)
    own = {c.pid for c in ev.children}  # a lock its own busy child holds: the child is what it waits for
    if ev.gone:
        cause, busy = "gone", False
    elif ev.locks and (busy_child is None or any(lk.holder_pid not in own for lk in ev.locks)):
        cause, busy = "lock", False
    elif busy_child is not None:
        cause, busy = "child", True
    elif ev.sockets and ev.main is not None and ev.main.kind in SOCKETISH | {"nccl", "gloo"}:
        cause, busy = "socket", False
    elif ev.main is not None and ev.main.kind == "wait_child" and ev.children:
        cause, busy = "child", False
    elif ev.main is not None and ev.main.kind not in ("unknown",):
        cause, busy = "native", False
    else:
        cause, busy = "none", False
    ev = msgspec.structs.replace(ev, cause=cause, busy=busy)
    return msgspec.structs.replace(ev, text=phrase(ev))


def _for(ev: Evidence) -> str:
    return f" for {ev.waited_s:.0f} s" if ev.waited_s is not None else ""


def _path(path: str, width: int = 120) -> str:
    return path if len(path) <= width else "…/" + "/".join(path.split("/")[-3:])


def _cmd(cmd: str | None, width: int = 60) -> str:
    if not cmd:
        return ""
    words = cmd.split()
    for i in range(min(2, len(words))):  # the program and its script, by name; the record keeps the whole line
        if i == 0 or words[i].startswith("/"):
            words[i] = os.path.basename(words[i]) or words[i]
    text = " ".join(words)
    return text if len(text) <= width else text[: width - 1] + "…"


def lock_text(lock: FileLock, syscall: str | None = None) -> str:
    """``an exclusive lock on PATH held by pid 4242 (`flock`, not part of this launch: python3 x.py)``."""
    mode = "an exclusive" if lock.exclusive else "a shared"
    on = _path(lock.path) if lock.path else f"inode {lock.inode} of device {lock.device} (no access to its path)"
    what = f"{mode} lock on {on}"
    if lock.holder_pid is None:
        return f"{what} ({lock.kind}; its holder is " + (
            "not recorded: an open-file-description lock)" if lock.kind == "ofd" else "outside this pid namespace)"
        )
    notes = [f"`{syscall or lock.kind}`"]
    if lock.holder_in_launch is False:
        notes.append("not part of this launch")
    elif lock.holder_in_launch:
        notes.append(
            "part of this launch" if lock.holder_via == lock.holder_pid else f"a child of pid {lock.holder_via}"
        )
    if lock.holder_alive is False:
        notes.append("it has ended: whoever inherited its descriptor holds the lock")
    elif lock.holder_has_it_open is False:
        notes.append("no longer has the file open: a process that inherited the descriptor holds the lock")
    if lock.holder_age_s is not None and lock.holder_age_s >= 600:
        notes.append(f"running for {lock.holder_age_s / 60:.0f} min")
    cmd = f": {_cmd(lock.holder_cmd)}" if lock.holder_cmd else ""
    return f"{what} held by pid {lock.holder_pid} ({', '.join(notes)}{cmd})"


def child_text(child: Child) -> str:
    """``nvcc (pid 5151, CUDA compiler) at 100 % CPU, running 70 s``."""
    what = f", {child.build.split(' (', 1)[-1].rstrip(')')}" if child.build else ""
    return f"{child.name} (pid {child.pid}{what}) at {child.cpu_pct:.0f} % CPU, running {child.age_s:.0f} s"


def socket_text(sock: Socket) -> str:
    """``the rendezvous 10.0.0.1:29500 (connecting (SYN_SENT), no answer yet, …)``."""
    if sock.proto == "unix":
        return sock.meaning
    role = "the rendezvous " if sock.role == "rendezvous" else ""
    return f"{role}{sock.remote} ({sock.meaning})"


def phrase(ev: Evidence) -> str:
    """What it waits on, in one phrase a verdict line can carry after the rank's name."""
    main = ev.main
    call = f"`{main.syscall}`" if main and main.syscall else None
    if ev.cause == "gone":
        return "ended before or while it was read"
    if ev.cause == "lock":
        lock = next(lk for lk in ev.locks)
        verb = "polls for" if lock.how == "polls" else "waits for"
        more = f" (and {len(ev.locks) - 1} more lock{'s' if len(ev.locks) > 2 else ''})" if len(ev.locks) > 1 else ""
        call = main.syscall if main and main.kind in ("flock", "lock") else None
        return f"{verb} {lock_text(lock, call)}{more}{_for(ev)}"
    if ev.cause == "child":
        child = ev.children[0]
        if ev.busy:
            builds = [c for c in ev.children if c.build and c.cpu_pct >= BUSY_PCT]
            lead = "compiles" if builds else "works"
            others = len([c for c in ev.children if c.cpu_pct >= BUSY_PCT]) - 1
            tail = f" (+{others} more at work)" if others > 0 else ""
            return f"is busy, not stuck: its child {lead}: {child_text(builds[0] if builds else child)}{tail}"
        return f"waits for its child {child.name} (pid {child.pid}, {child.cpu_pct:.0f} % CPU, {child.state}){_for(ev)}"
    if ev.cause == "socket":
        sock = ev.sockets[0]
        inside = f" in {main.library}" if main and main.library else ""
        via = call or f"`{main.kind}`" if main else "a socket call"
        which = socket_text(sock)
        if ev.sockets_from and ev.sockets_from.startswith("its open sockets") and len(ev.sockets) > 1:
            which = f"one of its sockets (the call does not say which), e.g. {which}"
        return f"waits in {via}{inside} on {which}{_for(ev)}"
    if ev.cause == "native" and main is not None:
        if main.kind == "running":
            return "is running on a CPU (its main thread is not waiting)"
        if main.kind == "stopped":
            return "is stopped (SIGSTOP or a debugger)"
        where = f" at {main.python}" if main.python and main.source == "py-spy" else ""
        return f"waits on {main.words}{where}{_for(ev)}"
    return "waits on something /proc does not show" + (f" ({ev.unread[0]})" if ev.unread else "")


def labels_text(labels: list[str]) -> str:
    """``tp0..tp7, tp9`` for runs of three or more consecutive ranks; other labels as they are."""
    out: list[str] = []
    run: list[int] = []

    def close() -> None:
        out.extend([f"tp{run[0]}..tp{run[-1]}"] if len(run) > 2 else [f"tp{n}" for n in run])
        run.clear()

    for label in labels:
        n = int(label[2:]) if label.startswith("tp") and label[2:].isdigit() else None
        if n is None or (run and n != run[-1] + 1):
            close()
        if n is None:
            out.append(label)
        else:
            run.append(n)
    close()
    return ", ".join(out)


def shared_cause(evidence: Mapping[str, Evidence], idle: Collection[str] | None = None) -> Shared | None:
    """The cause every idle rank shares, or None when they differ (the caller then names each).

    ``evidence``: label -> Evidence for every rank of the launch (a lock holder among them is looked
    up there); ``idle``: the labels judged idle (default: every rank neither busy nor gone; when
    every rank is busy, they share that). All waiting for one holder's lock: an alarm naming the
    file, the holder, whether it belongs to the launch — unless the holder is a rank (or a rank's
    child) that is busy: then busy, not stuck. All on one remote address: an alarm naming it. All
    waiting on their own busy children: busy, never an alarm."""
    alive = {lb: ev for lb, ev in evidence.items() if not ev.gone}
    if idle is not None:
        evs = {lb: ev for lb, ev in alive.items() if lb in idle}
    else:
        evs = {lb: ev for lb, ev in alive.items() if not ev.busy} or alive
    if not evs:
        return None
    keys = {lb: cause_key(ev) for lb, ev in evs.items()}
    first = next(iter(keys.values()))
    if first is None or any(k != first for k in keys.values()):
        return None
    names, pids = list(evs), [ev.pid for ev in evs.values()]
    who = labels_text(names)
    verb = "waits" if len(names) == 1 else "wait"
    waited = min((ev.waited_s for ev in evs.values() if ev.waited_s is not None), default=None)
    for_s = f" for {waited:.0f} s" if waited is not None else ""
    if first[0] == "busy":
        if len(evs) == 1:
            text = f"{who} {next(iter(evs.values())).text}"
        else:
            leads = "; ".join(f"{lb}: {child_text(_busy_child(ev))}" for lb, ev in evs.items())
            text = f"{who} are busy, not stuck: their children work: {leads}"
        return Shared(kind="child", alarm=False, labels=names, pids=pids, text=text, waited_s=waited)
    ev0 = next(iter(evs.values()))
    if first[0] == "lock":
        lock = ev0.locks[0]
        call = ev0.main.syscall if ev0.main and ev0.main.kind in ("flock", "lock") else None
        rank_pid = lock.holder_via or lock.holder_pid  # the rank it is, or descends from
        holder = next((lb for lb, e in evidence.items() if rank_pid and e.pid == rank_pid), None)
        if holder is not None and evidence[holder].busy:
            text = (
                f"{who} {verb} for {lock_text(lock, call).split(' held by ')[0]} held by {holder} "
                f"(pid {lock.holder_pid}), which {evidence[holder].text}"
            )
            return Shared(kind="lock", alarm=False, labels=names, pids=[*pids, lock.holder_pid], text=text,
                          waited_s=waited, holder_pid=lock.holder_pid)  # fmt: skip
        text = f"{who} {verb} for {lock_text(lock, call)}{for_s}"
        if holder is not None:
            text = text.replace(f"held by pid {lock.holder_pid} (", f"held by {holder} (pid {lock.holder_pid}, ", 1)
        extra = [lock.holder_pid] if lock.holder_pid else []
        return Shared(kind="lock", alarm=True, labels=names, pids=[*pids, *extra], text=text, waited_s=waited,
                      holder_pid=lock.holder_pid)  # fmt: skip
    sock = ev0.sockets[0]
    call = f" in `{ev0.main.syscall}`" if ev0.main and ev0.main.syscall else ""
    text = f"{who} {verb}{call} on {socket_text(sock)}{for_s}"
    return Shared(kind="socket", alarm=True, labels=names, pids=pids, text=text, waited_s=waited)


def _busy_child(ev: Evidence) -> Child:
    busy = [c for c in ev.children if c.cpu_pct >= BUSY_PCT]
    return next((c for c in busy if c.build), busy[0])


def cause_key(ev: Evidence) -> tuple | None:
    """Ranks with one key share one cause: their own busy children, one lock holder, one address."""
    if ev.busy:
        return ("busy",)
    if ev.cause == "lock":
        lock = ev.locks[0]
        return ("lock", lock.holder_pid or f"{lock.device}:{lock.inode}")
    if ev.cause == "socket" and ev.sockets[0].remote:
        return ("socket", ev.sockets[0].remote)
    return None


ATTR = "phasetrace.waits_on"  # span and event attributes: the phrase, then its parts under this prefix


def attributes(ev: Evidence) -> dict[str, str | int | float | bool]:
    """What a rank waits on as OTel attributes (scalars) for the exports: the phrase and the cause,
    the lock's file and holder, the busy child, the socket, the native frame."""
    out: dict[str, str | int | float | bool] = {ATTR: ev.text, f"{ATTR}.cause": ev.cause}
    if ev.busy:
        out[f"{ATTR}.busy"] = True
    if ev.waited_s is not None:
        out[f"{ATTR}.waited_s"] = ev.waited_s
    main = ev.main
    if main is not None:
        out[f"{ATTR}.main.kind"] = main.kind
        for name in ("syscall", "frame", "library", "python"):
            value = getattr(main, name)
            if value:
                out[f"{ATTR}.main.{name}"] = value
    if ev.locks:
        lock = ev.locks[0]
        out[f"{ATTR}.lock.file"] = lock.path or f"{lock.device}:{lock.inode}"
        out[f"{ATTR}.lock.kind"] = lock.kind
        out[f"{ATTR}.lock.exclusive"] = lock.exclusive
        if lock.holder_pid is not None:
            out[f"{ATTR}.lock.holder_pid"] = lock.holder_pid
        if lock.holder_cmd:
            out[f"{ATTR}.lock.holder_cmd"] = lock.holder_cmd
        if lock.holder_in_launch is not None:
            out[f"{ATTR}.lock.holder_in_launch"] = lock.holder_in_launch
    busy = [c for c in ev.children if c.cpu_pct >= BUSY_PCT]
    if busy or ev.cause == "child":
        child = _busy_child(ev) if busy else ev.children[0]
        out.update({f"{ATTR}.child.name": child.name, f"{ATTR}.child.pid": child.pid})
        out.update({f"{ATTR}.child.cpu_pct": child.cpu_pct, f"{ATTR}.child.age_s": child.age_s})
        if child.build:
            out[f"{ATTR}.child.build"] = child.build
    if ev.sockets:
        sock = ev.sockets[0]
        out.update({f"{ATTR}.socket.state": sock.state, f"{ATTR}.socket.proto": sock.proto})
        if sock.remote:
            out[f"{ATTR}.socket.remote"] = sock.remote
        if sock.last_recv_s is not None:
            out[f"{ATTR}.socket.last_recv_s"] = sock.last_recv_s
    return out
