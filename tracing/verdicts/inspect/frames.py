"""A stack read with py-spy, said in the project's words: the phase it is in (the innermost frame
that is one of the patch tables' targets: ``eagle.get_embed_and_head``, not ``llama.py:412``), the
collective it waits in (barrier, all_reduce, broadcast…; through GroupCoordinator, torch.distributed,
PyNccl, the custom all-reduce, gloo or NCCL), and whether it is in its event loop (serving).

The targets come from the CLI (``cli.doctor.phase_targets``): ``tracing/`` does not import ``patches/``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

Targets = dict[str, tuple[str, str]]  # "module:qualname" or "*:attr" -> (phase, kind)

_LOOP = re.compile(r"^(event_loop\w*|multi_http_worker_event_loop|serve_forever|_serve)$")
_C10D_OPS = re.compile(
    r"^(monitored_barrier|barrier|all_reduce|all_gather\w*|broadcast\w*|reduce_scatter\w*|all_to_all\w*|gather\w*|"
    r"scatter\w*|send|recv|isend|irecv|reduce|new_group|init_process_group|wait|_store_based_barrier)$"
)
_VIA = (  # (file path part, words)
    ("device_communicators/pynccl", "PyNccl"),
    ("device_communicators/custom_all_reduce", "the custom all-reduce"),
    ("device_communicators/quick_all_reduce", "the quick all-reduce"),
    ("device_communicators/shm_broadcast", "the shared-memory broadcast queue"),
    ("torch/distributed/distributed_c10d", "torch.distributed"),
)


@dataclass(frozen=True)
class Phase:
    name: str
    kind: str
    where: str  # the frame's short file:line
    function: str


@dataclass(frozen=True)
class Collective:
    op: str  # barrier, all_reduce…
    via: str  # GroupCoordinator.barrier, torch.distributed, PyNccl…
    backend: str | None  # gloo, NCCL (from native frames)
    where: str

    @property
    def words(self) -> str:
        op = "a barrier" if self.op in ("barrier", "monitored_barrier", "_store_based_barrier") else f"`{self.op}`"
        backend = f", {self.backend}" if self.backend else ""
        return f"{op} ({self.via}{backend}, {self.where})"


def module_of(path: str) -> str | None:
    """``…/site-packages/sglang/srt/models/llama.py`` -> ``sglang.srt.models.llama``."""
    at = path.rfind("/sglang/")
    if at < 0 or not path.endswith(".py"):
        return None
    parts = path[at + 1 : -3].split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def short(path: str, line: Any) -> str:
    return f"{'/'.join(str(path).split('/')[-2:])}:{line}"


class PhaseMap:
    """Targets indexed for frames: exact ``module:qualname``, ``module`` + last name, ``*:attr``."""

    def __init__(self, targets: Targets) -> None:
        self.exact: dict[tuple[str, str], tuple[str, str]] = {}
        self.last: dict[tuple[str, str], tuple[str, str]] = {}
        self.anywhere: dict[str, tuple[str, str]] = {}
        for target, phase in targets.items():
            module, _, qualname = target.partition(":")
            if module == "*":
                self.anywhere.setdefault(qualname, phase)
            else:
                self.exact.setdefault((module, qualname), phase)
                self.last.setdefault((module, qualname.rsplit(".", 1)[-1]), phase)

    def phase(self, frames: list[dict[str, Any]]) -> Phase | None:
        """The innermost frame that is a phase's target (py-spy names frames by qualname on 3.11+,
        by function name before)."""
        for f in frames:
            path, name = str(f.get("filename", "")), str(f.get("name", ""))
            if not path.endswith(".py"):
                continue
            module, last = module_of(path), name.rsplit(".", 1)[-1]
            hit = (self.exact.get((module, name)) or self.last.get((module, last))) if module else None
            hit = hit or self.anywhere.get(last)
            if hit is not None and hit[1] != "collective":  # a collective is said as one (``collective``)
                return Phase(hit[0], hit[1], short(path, f.get("line")), name)
        return None


def serving(frames: list[dict[str, Any]], phase: Phase | None) -> bool:
    """In its event loop: a ``loop`` phase, or a frame SGLang's loops are named by."""
    if phase is not None and phase.kind == "loop":
        return True
    return loop_frame(frames) is not None


def loop_frame(frames: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The frame of its event loop (a scheduler's ``event_loop_*``, uvicorn's server), if it is in one."""
    for f in frames:
        if _LOOP.match(str(f.get("name", "")).rsplit(".", 1)[-1]) or "uvicorn/server.py" in str(f.get("filename")):
            return f
    return None


def collective(frames: list[dict[str, Any]], native_frames: list[dict[str, Any]] = ()) -> Collective | None:
    """The collective the innermost frames wait in, with the library below it where native frames say."""
    via = op = where = None
    for f in frames:
        path, name = str(f.get("filename", "")), str(f.get("name", ""))
        last = name.rsplit(".", 1)[-1]
        if name.startswith("GroupCoordinator.") and "parallel_state" in path:
            via, op, where = name, last, short(path, f.get("line"))
            break
        if via is None:
            hit = next((words for part, words in _VIA if part in path), None)
            if hit is not None and (hit != "torch.distributed" or _C10D_OPS.match(last)):
                via, op, where = hit, last, short(path, f.get("line"))
    if via is None:
        return None
    backend = None
    for f in native_frames:
        blob = f"{f.get('name', '')} {f.get('module') or ''}"
        if "nccl" in blob.lower():
            backend = "NCCL"
            break
        if "gloo" in blob:
            backend = "gloo"
            break
    return Collective(op or "?", via, backend, where or "?")
