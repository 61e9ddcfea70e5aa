"""The processes of a running SGLang launch, found from outside: ``/proc`` only, no signal.

SGLang names its processes through setproctitle (``sglang::scheduler_TP0``,
``sglang::scheduler_DP0_TP1``, ``sglang::detokenizer``, ``sglang::tokenizer_worker:PID``,
``sglang::data_parallel_controller``), which rewrites ``/proc/PID/cmdline``; the launcher (``python
-m sglang.launch_server``, ``sglang serve``, a script that builds ``sglang.Engine``) is the first
ancestor of those that is not one of them. A PID given is any of them; without one, every launch of
this user on this host.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ..evidence.proc import stat_fields, zombie

TITLE = "sglang::"
_RANK = re.compile(r"(DP|PP|ATTN_CP|MOE_DP|TP|EP)(\d+)")
_ROLES = (  # title prefix (after sglang::) -> role
    ("scheduler", "scheduler"),
    ("detokenizer_router", "detokenizer_router"),
    ("detokenizer", "detokenizer"),
    ("tokenizer_worker", "tokenizer_worker"),
    ("data_parallel_controller", "dp_controller"),
)
_LAUNCHER_CMD = re.compile(r"sglang[./]launch_server|sglang\s+serve\b|sglang\.Engine|sglang/cli|-m\s+sglang\b")


class NotInspectable(Exception):
    """A PID that names no launch we can read: one line, and the exit code to give."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Member:
    pid: int
    ppid: int
    role: str  # launcher, scheduler, detokenizer, tokenizer_worker, dp_controller, helper
    label: str  # tp1, dp0-tp1, detokenizer, launcher…
    cmd: str  # as /proc says (redacted by the caller before it is shown)
    uid: int | None = None
    zombie: bool = False


@dataclass
class Launch:
    launcher: Member
    members: list[Member] = field(default_factory=list)  # the launcher first, then ranks, then the others

    @property
    def ranks(self) -> list[Member]:
        return [m for m in self.members if m.role == "scheduler"]

    @property
    def pids(self) -> set[int]:
        return {m.pid for m in self.members}


def _cmdline(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(8192)
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def _uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


@dataclass
class Table:
    """Every process of this host as ``/proc`` shows it at one moment: parent and command line."""

    parent: dict[int, int] = field(default_factory=dict)
    cmd: dict[int, str] = field(default_factory=dict)
    _kids: dict[int, list[int]] = field(default_factory=dict)

    @classmethod
    def read(cls) -> Table:
        table = cls()
        for name in os.listdir("/proc"):
            if name.isdigit():
                fields = stat_fields(name)
                if fields and len(fields) > 1:
                    table.parent[int(name)] = int(fields[1])
                    table.cmd[int(name)] = _cmdline(int(name)) or ""
        return table

    def children(self, pid: int) -> list[int]:
        if not self._kids:
            for p, pp in sorted(self.parent.items()):
                self._kids.setdefault(pp, []).append(p)
        return self._kids.get(pid, [])

    def below(self, pid: int) -> list[int]:
        out, todo = [], [pid]
        while todo and len(out) < 4096:
            for child in self.children(todo.pop()):
                out.append(child)
                todo.append(child)
        return out


def titled(cmd: str) -> bool:
    return cmd.startswith(TITLE)


def role_of(cmd: str) -> tuple[str, str]:
    """(role, label) of a process SGLang named: ``sglang::scheduler_DP0_TP1`` -> (scheduler, dp0-tp1)."""
    title = cmd[len(TITLE) :].split()[0] if cmd[len(TITLE) :].split() else ""
    for prefix, role in _ROLES:
        if title.startswith(prefix):
            if role != "scheduler":
                return role, role if role != "tokenizer_worker" else title.replace(":", "-")
            dims = {k.lower().replace("_", ""): v for k, v in _RANK.findall(title)}
            dims.setdefault("tp", "0")
            order = ("dp", "pp", "attncp", "moedp", "tp", "ep")
            return role, "-".join(f"{k}{dims[k]}" for k in order if k in dims)
    return "helper", title or "helper"


def launcher_of(pid: int, table: Table) -> int:
    """The launcher of the launch ``pid`` belongs to: the first ancestor (or itself) not named ``sglang::``."""
    seen = 0
    while titled(table.cmd.get(pid, "")) and seen < 64:
        parent = table.parent.get(pid, 0)
        if parent <= 1:
            break
        pid, seen = parent, seen + 1
    return pid


def looks_like_launcher(pid: int, table: Table) -> bool:
    """Named ``sglang::`` below it, or a command line that runs SGLang."""
    return any(titled(table.cmd.get(p, "")) for p in table.below(pid)) or bool(
        _LAUNCHER_CMD.search(table.cmd.get(pid, ""))
    )


def collect(launcher: int, table: Table) -> Launch:
    """The launcher, every ``sglang::`` process below it, and its own direct helpers (resource tracker)."""
    lm = Member(launcher, table.parent.get(launcher, 0), "launcher", "launcher", table.cmd.get(launcher, ""))
    lm.uid, lm.zombie = _uid(launcher), zombie(launcher)
    members = []
    for pid in table.below(launcher):
        cmd = table.cmd.get(pid, "")
        if titled(cmd):
            role, label = role_of(cmd)
        elif table.parent.get(pid) == launcher and not cmd:
            role, label = "helper", "exited child"
        elif table.parent.get(pid) == launcher and "multiprocessing" in cmd:
            role, label = "helper", "resource_tracker" if "resource_tracker" in cmd else "helper"
        else:
            continue  # a rank's compiler or other child: the evidence of its rank shows it
        m = Member(pid, table.parent.get(pid, 0), role, label, cmd, _uid(pid), zombie(pid))
        members.append(m)
    order = {"scheduler": 0, "dp_controller": 1, "detokenizer": 2, "detokenizer_router": 3, "tokenizer_worker": 4}
    members.sort(key=lambda m: (order.get(m.role, 9), _natural(m.label), m.pid))
    return Launch(lm, [lm, *members])


def _natural(label: str) -> list[object]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", label)]


def find(pids: list[int], uid: int | None = None) -> list[Launch]:
    """The launches the PIDs belong to (each once), or every launch of ``uid`` (default: this user)
    on this host; ``NotInspectable`` for a PID that is no SGLang process."""
    table = Table.read()
    launchers: list[int] = []
    if pids:
        for pid in pids:
            if pid not in table.parent:
                raise NotInspectable(f"pid {pid}: no such process")
            if zombie(pid) and not titled(table.cmd.get(pid, "")):
                parent = table.parent.get(pid, 0)
                raise NotInspectable(
                    f"pid {pid} is a zombie: it has exited and its parent (pid {parent}) has not collected it; "
                    "nothing of it is left to read",
                    4,
                )
            if not titled(table.cmd.get(pid, "")) and not looks_like_launcher(pid, table):
                shown = table.cmd.get(pid, "")[:80] or "(no command line)"
                raise NotInspectable(
                    f"pid {pid} is not an SGLang process ({shown}): no process named {TITLE}* below it, "
                    "and its command line does not run SGLang"
                )
            roots = [launcher_of(pid, table)]
            if roots[0] == pid and not _LAUNCHER_CMD.search(table.cmd.get(pid, "")):
                # a shell or a job runner above a launch: the launches below it, not itself
                below = [p for p in table.below(pid) if titled(table.cmd.get(p, ""))]
                roots = list(dict.fromkeys(launcher_of(p, table) for p in below)) or roots
            launchers += [r for r in roots if r not in launchers]
    else:
        me = os.getuid() if uid is None else uid
        for pid, cmd in sorted(table.cmd.items()):
            if titled(cmd) and _uid(pid) == me:
                root = launcher_of(pid, table)
                if root not in launchers:
                    launchers.append(root)
    return [collect(root, table) for root in launchers]
