"""Which launch this process belongs to: the identity every node of a multi-node launch shares
(from the environment, or node 0's trace id agreed at the rendezvous: ``RUN_DIR/launch.json``), and
this node's place in it. Runs in every traced process; the cross-node channel that agrees on it and
carries node snapshots is ``channel.crossnode``, in the launcher only."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import keys

_TRACE_ID = re.compile("(?!0{32})[0-9a-f]{32}")  # an OTel trace id, never 0
LAUNCH_FILE = "launch.json"  # RUN_DIR/launch.json: the launch's trace id, for this node's processes


# (variable, the variables appended to it): a job id that names one launch on every node
JOB_IDS = (
    ("SLURM_JOB_ID", ("SLURM_STEP_ID", "SLURM_RESTART_COUNT")),
    ("TORCHELASTIC_RUN_ID", ("TORCHELASTIC_RESTART_COUNT",)),
)


def launch_from_env(env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(launch id, the variable it came from) when the environment names the launch, else None."""
    env = os.environ if env is None else env
    if env.get(keys.ENV_LAUNCH_ID):
        return env[keys.ENV_LAUNCH_ID], keys.ENV_LAUNCH_ID
    for name, parts in JOB_IDS:
        if env.get(name):
            return ".".join([env[name], *(env.get(p) or "-" for p in parts)]), name
    return None


def trace_id_of(launch_id: str) -> int:
    """The launch's trace id: the same on every node for the same launch id, never 0."""
    digest = hashlib.sha256(b"sglang-phasetrace/launch/" + launch_id.encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1


@dataclass
class Node:
    """This launcher's place in a multi-node launch."""

    rank: int
    nnodes: int
    rendezvous: str | None  # HOST:PORT
    launch_id: str | None = None  # known at start (environment), else agreed at the rendezvous
    source: str = "rendezvous"

    def env_value(self) -> str:
        return f"{self.rank}/{self.nnodes}/{self.source}/{self.rendezvous or ''}"


def node_from_env() -> Node | None:
    """The node a launcher said its processes run on (``SGLANG_PHASETRACE_NODE``:
    ``RANK/NNODES/SOURCE/HOST:PORT``)."""
    parts = os.environ.get(keys.ENV_NODE, "").split("/", 3)
    try:
        rank, nnodes, source, addr = parts
        return Node(int(rank), int(nnodes), addr or None, source=source)
    except ValueError:
        return None


def node_attrs() -> dict[str, Any]:
    """Resource attributes of a process of a multi-node launch (empty on a single node)."""
    node = node_from_env()
    if node is None:
        return {}
    attrs: dict[str, Any] = {keys.NODE_RANK: node.rank, keys.NNODES: node.nnodes}
    if node.rendezvous:
        attrs[keys.DIST_INIT_ADDR] = node.rendezvous
    launch = launch_from_env()
    if launch is not None:
        attrs[keys.LAUNCH_ID] = launch[0]
    return attrs


def begin(attrs: Mapping[str, Any]) -> Node | None:
    """The launcher's entry point was called with these server-args attributes: for a multi-node
    launch, say which node this is (to its processes too) and, when the environment names the
    launch, fix the trace id before the launch root starts. None on a single node."""
    nnodes = attrs.get(keys.NNODES)
    if not isinstance(nnodes, int) or nnodes < 2:
        return None
    rank = attrs.get(keys.NODE_RANK)
    addr = attrs.get(keys.DIST_INIT_ADDR)
    node = Node(rank if isinstance(rank, int) else 0, nnodes, addr if isinstance(addr, str) else None)
    launch = launch_from_env()
    if launch is not None:
        node.launch_id, node.source = launch
    elif os.environ.get(keys.ENV_TRACEPARENT):
        node.source = keys.ENV_TRACEPARENT  # an outer trace every node was started in
    os.environ[keys.ENV_NODE] = node.env_value()
    return node


def mapping_of(run_dir: Path | str | None) -> dict[str, str] | None:
    """This node's ``launch.json`` ({"trace", "local_trace"}: two trace ids) once its launcher learnt
    the launch's id; None while it has not, or when the file is not exactly that."""
    if run_dir is None:
        return None
    try:
        fd = os.open(Path(run_dir) / LAUNCH_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            data = json.loads(os.read(fd, 4096))
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None
    ids = {k: data.get(k) for k in ("trace", "local_trace")} if isinstance(data, dict) else {}
    if not ids or not all(isinstance(v, str) and _TRACE_ID.fullmatch(v) for v in ids.values()):
        return None
    return ids
