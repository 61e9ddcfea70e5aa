"""Pre-flight arithmetic, pure: rewrite an ``sglang.launch_server`` argument list to load dummy
weights (target and draft), optionally shrink what does not matter for a hang, and estimate the
real start from a pre-flight run plus the checkpoint's size and a measured read rate — or, where
the history holds earlier starts of the real launch, from those.

Dummy weights: ``--load-format dummy`` for the target; SGLang 0.5.23 loads the draft with
``--speculative-draft-load-format`` when given, else with ``--load-format`` — we set both, so the
draft is dummy on releases whose draft does not follow the target's format too.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .. import keys
from ..reader.view import RunView, SpanRec

NS = 1_000_000_000
SHRUNK_TOTAL_TOKENS = 4096
DRAFT_PATH = ("--speculative-draft-model-path", "--speculative-draft-model")
MODEL_PATH = ("--model-path", "--model")
WEIGHT_PHASES = ("model.load_weights",)  # target and every draft runner: siblings, not nested
GRAPH_PHASES = ("scheduler.init_cuda_graphs", "graph.init", "eagle.draft_graphs")
# server arguments a pre-flight changes: its launch fingerprint is the real launch's but for these
PREFLIGHT_ARGS = ("load_format", "speculative_draft_load_format", "max_total_tokens")


class NotLaunchServer(ValueError):
    """The command is not ``python -m sglang.launch_server …`` or ``sglang serve …``: we rewrite only
    their arguments."""


@dataclass
class Rewritten:
    command: list[str]
    changed: list[str]  # "--load-format auto → dummy", "added --speculative-draft-load-format dummy"
    model_path: str | None
    draft_path: str | None
    node_rank: int = 0  # ``--node-rank`` of a multi-node launch (each node runs its own pre-flight)


def _server_args_start(command: list[str]) -> int:
    """Index of the first server argument, or ``NotLaunchServer``."""
    for i, word in enumerate(command):
        if word == "-m" and i + 1 < len(command) and command[i + 1] == "sglang.launch_server":
            return i + 2
        if word.endswith(("sglang/launch_server.py", "sglang.launch_server")) and word != "sglang.launch_server":
            return i + 1
        if os.path.basename(word) == "sglang" and command[i + 1 : i + 2] == ["serve"]:  # the newer CLI entry
            return i + 2
    raise NotLaunchServer(
        "pre-flight rewrites only `python -m sglang.launch_server …` and `sglang serve …` argument lists; for a "
        "script that builds "
        'sglang.Engine, pass load_format="dummy" (and speculative_draft_load_format="dummy") yourself and use '
        "`phasetrace run`"
    )


def _find(args: list[str], names: tuple[str, ...]) -> tuple[int, str | None] | None:
    """(index, value) of the last ``--name V`` or ``--name=V`` among ``args``."""
    found = None
    for i, word in enumerate(args):
        for name in names:
            if word == name:
                found = (i, args[i + 1] if i + 1 < len(args) else None)
            elif word.startswith(name + "="):
                found = (i, word.split("=", 1)[1])
    return found


def _set(args: list[str], name: str, value: str, changed: list[str]) -> None:
    at = _find(args, (name,))
    if at is None:
        args += [name, value]
        changed.append(f"added {name} {value}")
        return
    i, old = at
    if old == value:
        return
    if args[i] == name:
        args[i + 1 : i + 2] = [value]
    else:
        args[i] = f"{name}={value}"
    changed.append(f"{name} {old} → {value}")


def rewrite(command: list[str], shrink: bool = False, total_tokens: int = SHRUNK_TOTAL_TOKENS) -> Rewritten:
    """The same launch with dummy weights for target and draft; with ``shrink``, a small KV pool
    (``--max-total-tokens``). Parallel layout, graph batch sizes, attention backend, the draft and
    its settings are never touched."""
    start = _server_args_start(command)
    head, args = command[:start], list(command[start:])
    changed: list[str] = []
    _set(args, "--load-format", "dummy", changed)
    draft = _find(args, DRAFT_PATH)
    if draft is not None:
        _set(args, "--speculative-draft-load-format", "dummy", changed)
    if shrink:
        at = _find(args, ("--max-total-tokens",))
        if at is None or at[1] is None or not at[1].isdigit() or int(at[1]) > total_tokens:
            _set(args, "--max-total-tokens", str(total_tokens), changed)
    model = _find(args, MODEL_PATH)
    node = _find(args, ("--node-rank",))
    node_rank = int(node[1]) if node and node[1] and node[1].isdigit() else 0
    return Rewritten(head + args, changed, model[1] if model else None, draft[1] if draft else None, node_rank)


@dataclass
class Earlier:
    """The real launch's earlier starts that became ready (``tracing.history``)."""

    launch: str  # its fingerprint id
    starts: int
    median_s: float  # launcher start to ready
    p95_s: float
    weights_s: float | None  # the median of its slowest rank's weight loading


def real_launch(preflight: dict[str, Any], launches: Iterable[tuple[str, dict[str, Any]]]) -> str | None:
    """The fingerprint id (of ``launches``: (id, fields)) of the launch a pre-flight stands for: the
    same fields but for the arguments the pre-flight changes (``PREFLIGHT_ARGS``), its weights read
    (not a pre-flight itself); the first such, as given (the most recent first)."""

    def without(fields: dict[str, Any]) -> dict[str, Any]:
        args = {k: v for k, v in (fields.get("args") or {}).items() if k not in PREFLIGHT_ARGS}
        return {**fields, "args": args}

    mine = without(preflight)
    for fid, fields in launches:
        if (fields.get("args") or {}).get("load_format") != "dummy" and without(fields) == mine:
            return fid
    return None


def earlier(fid: str, totals: list[float], weights_s: float | None) -> Earlier | None:
    """``Earlier`` from the ready starts' times (and their usual weight loading); None without any."""
    if not totals:
        return None
    ordered = sorted(totals)
    p95 = ordered[max(0, -(-95 * len(ordered) // 100) - 1)]  # nearest rank: a value that occurred
    return Earlier(fid, len(totals), statistics.median(totals), p95, weights_s)


@dataclass
class Estimate:
    launch_s: float  # the pre-flight's start, launcher start to ready
    dummy_weights_s: float  # the pre-flight's weight phases (dummy: no reading)
    graphs_s: float
    rest_s: float
    checkpoint_bytes: int | None
    read_rate: float | None  # bytes per second
    earlier: Earlier | None = None  # the real launch's earlier starts, where the history has some

    @property
    def weights_s(self) -> float | None:
        """Reading the checkpoint at the measured rate (never less than the dummy load took)."""
        if not self.checkpoint_bytes or not self.read_rate:
            return None
        return max(self.dummy_weights_s, self.checkpoint_bytes / self.read_rate)

    @property
    def total_s(self) -> float | None:
        weights = self.weights_s
        return None if weights is None else weights + self.graphs_s + self.rest_s

    def text(self) -> str:
        """``expected start ≈ 14 min: weights ≈ 11 min (680 GB at ≈ 1.0 GB/s), graphs ≈ 2 min, the rest ≈ 1 min``;
        with earlier starts of the real launch, theirs first: ``expected start ≈ 15 min, as the 6
        earlier starts of this launch (p95 17 min; weights 12 min); from this pre-flight: ≈ 14 min: …``."""
        measured = self.measured()
        e = self.earlier
        if e is None:
            return f"expected start{measured}"
        weights = f"; weights {span(e.weights_s)}" if e.weights_s is not None else ""
        starts = "the one earlier start" if e.starts == 1 else f"the {e.starts} earlier starts"
        return (
            f"expected start ≈ {span(e.median_s)}, as {starts} of this launch ({e.launch}; "
            f"p95 {span(e.p95_s)}{weights}); from this pre-flight{measured}"
        )

    def measured(self) -> str:
        """What the pre-flight and the read rate say: `` ≈ 14 min: weights ≈ …`` or ``: weights unknown …``."""
        tail = f"graphs ≈ {span(self.graphs_s)}, the rest ≈ {span(self.rest_s)}"
        weights, total = self.weights_s, self.total_s
        if weights is None or total is None:
            size = gigabytes(self.checkpoint_bytes) if self.checkpoint_bytes else "size unknown"
            return f": weights unknown ({size}, read rate not measured), then {tail}"
        assert self.checkpoint_bytes and self.read_rate
        return (
            f" ≈ {span(total)}: weights ≈ {span(weights)} ({gigabytes(self.checkpoint_bytes)} "
            f"at ≈ {self.read_rate / 1e9:.1f} GB/s), {tail}"
        )


def gigabytes(n: int | None) -> str:
    """``680 GB``, ``1.5 GB``, ``0.28 MB`` (a test model)."""
    if n is None:
        return "? GB"
    if n < 100e6:
        return f"{n / 1e6:.2g} MB"
    return f"{n / 1e9:.0f} GB" if n >= 10e9 else f"{n / 1e9:.2g} GB"


def span(seconds: float) -> str:
    """``40 s``, ``14 min``, ``2.5 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _outermost(spans: list[SpanRec], phases: tuple[str, ...]) -> float:
    """Seconds in the given phases, a span inside another counted span not counted again."""
    chosen = {s.span_id: s for s in spans if s.phase in phases and s.end is not None}
    by_id = {s.span_id: s for s in spans}

    def inside(s: SpanRec) -> bool:
        seen = {s.span_id}  # ids can repeat across processes: a parent chain may loop
        parent = by_id.get(s.parent_id or "")
        while parent is not None and parent.span_id not in seen:
            if parent.span_id in chosen:
                return True
            seen.add(parent.span_id)
            parent = by_id.get(parent.parent_id or "")
        return False

    return sum((s.end - s.start) / NS for s in chosen.values() if s.end is not None and not inside(s))


def estimate(
    run: RunView, checkpoint_bytes: int | None, read_rate: float | None, before: Earlier | None = None
) -> Estimate:
    """The real start ≈ the pre-flight's start with its weight phases replaced by reading the
    checkpoint at ``read_rate``. Per phase, the slowest rank (everyone waits for it). ``before``:
    the real launch's earlier starts, said first where there are some."""
    starts = [p.boot_t for p in run.processes if p.boot_t] + [s.start for p in run.processes for s in p.spans.values()]
    ends = [  # ready: the roots that ended well (not the teardown after it)
        s.end for p in run.processes for s in p.spans.values() if s.phase in keys.ROOT_PHASES and s.status == "ok"
    ]
    launch = (max(ends) - min(starts)) / NS if starts and ends else 0.0
    ranks = run.ranks or run.processes
    weights = max((_outermost(list(p.spans.values()), WEIGHT_PHASES) for p in ranks), default=0.0)
    graphs = max((_outermost(list(p.spans.values()), GRAPH_PHASES) for p in ranks), default=0.0)
    rest = max(0.0, launch - weights - graphs)
    return Estimate(launch, weights, graphs, rest, checkpoint_bytes, read_rate, before)
