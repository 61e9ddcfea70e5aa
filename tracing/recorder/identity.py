"""Who this process is: host, pid, role and SGLang ranks, as attributes and as a short label."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any

from .. import keys

# rank name -> attribute key, in the order labels show them
RANK_KEYS = {"tp": keys.TP_RANK, "pp": keys.PP_RANK, "dp": keys.DP_RANK, "ep": keys.EP_RANK}
EXTRA_KEYS = {
    "world": keys.WORLD_RANK,
    "world_size": keys.WORLD_SIZE,
    "gpu": keys.GPU_ID,
    "node": keys.NODE_RANK,
    "nnodes": keys.NNODES,
}
# every key ``Identity.attributes`` may stamp on a span (the journal leaves them to ``identity``)
IDENTITY_KEYS = frozenset(
    {"host.name", "process.pid", keys.ROLE, keys.RANK_LABEL, *RANK_KEYS.values(), *EXTRA_KEYS.values()}
)


@dataclass
class Identity:
    pid: int = field(default_factory=os.getpid)
    host: str = field(default_factory=socket.gethostname)
    role: str = "process"  # "launcher" | "rank" | a helper's (``handover.ROLES``) | "process" (unknown)
    ranks: dict[str, int] = field(default_factory=dict)

    def update(self, role: str | None = None, **ranks: Any) -> bool:
        """Merge what became known; return whether anything changed."""
        known = {k: int(v) for k, v in ranks.items() if isinstance(v, int) and not isinstance(v, bool)}
        changed = (role is not None and role != self.role) or any(self.ranks.get(k) != v for k, v in known.items())
        if role is not None:
            self.role = role
        elif self.role == "process" and ("tp" in known or "world" in known):
            self.role = "rank"  # a process in SGLang's distributed init is a rank, Scheduler or not
        self.ranks.update(known)
        return changed

    @property
    def label(self) -> str:
        """``tp1``, ``tp0-pp1``, ``tp0-dp1``, ``rank3`` (world rank only), ``launcher``,
        ``launcher-node1`` (another node's), ``detokenizer``, ``pid4242``."""
        if self.role not in ("rank", "process"):  # one per node (readers number several: tokenizer-2)
            return f"{self.role}-node{self.ranks['node']}" if self.ranks.get("node") else self.role
        r = self.ranks
        if "tp" in r:
            parts = [f"tp{r['tp']}"]
            parts += [f"{k}{r[k]}" for k in ("pp", "dp") if r.get(k) or r.get(f"{k}_size", 1) > 1]
            return "-".join(parts)
        if "world" in r:
            return f"rank{r['world']}"
        return f"pid{self.pid}"

    @property
    def process_name(self) -> str:
        """Another process's root span name: ``detokenizer @ node3:4242``."""
        return f"{self.label} @ {self.host}:{self.pid}"

    @property
    def rank_name(self) -> str:
        """Rank root span name: every known rank, host and pid, e.g. ``rank tp1 pp0 ep1 @ node3:4242``."""
        shown = " ".join(f"{k}{self.ranks[k]}" for k in RANK_KEYS if k in self.ranks)
        if not shown:
            shown = self.label
        return f"rank {shown} @ {self.host}:{self.pid}"

    def attributes(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {"host.name": self.host, "process.pid": self.pid, keys.ROLE: self.role}
        for name, key in {**RANK_KEYS, **EXTRA_KEYS}.items():
            if name in self.ranks:
                attrs[key] = self.ranks[name]
        attrs[keys.RANK_LABEL] = self.label
        return attrs


SIZE_KEYS = {f"{k}_size": f"sglang.{k}_size" for k in ("tp", "pp", "dp", "ep")}
_FROM_ATTR = {key: name for name, key in {**RANK_KEYS, **EXTRA_KEYS, **SIZE_KEYS}.items()}


def ranks_from_attrs(attrs: dict[str, Any]) -> dict[str, int]:
    """The rank fields among span attributes (``sglang.tp_rank`` → ``tp``), to update identity."""
    return {_FROM_ATTR[k]: v for k, v in attrs.items() if k in _FROM_ATTR and isinstance(v, int)}
