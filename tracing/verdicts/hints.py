"""Hints from known fixes: when a verdict matches the shape of an init failure that SGLang users have
reported (phase, finding kind, evidence), one line naming the workaround they found, and where.

A hint is never a verdict: it follows the verdict line, says ``HINT (not a verdict)``, and cites its
source (an SGLang issue, pull request or release). The table is data; ``docs/hints.md`` lists it
with the sources. The first matching pattern wins, so the specific ones come first (an EAGLE draft
graph capture before graph capture in general).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from ..reader.run import ProcessRec, RunView
from .diagnose import Finding

STALLS = frozenset({"silent", "straggler", "divergence", "no_progress", "rendezvous"})
CONSEQUENCE = "— a consequence of"  # postmortem's words for a rank that failed after another ended


@dataclass(frozen=True)
class Pattern:
    name: str
    phases: tuple[str, ...]  # fnmatch patterns; one must match the named phase or a phase around it
    kinds: frozenset[str]  # the finding kinds it applies to
    hint: str
    source: str  # "sgl-project/sglang#NNNN, #MMMM"
    evidence: str = ""  # a regular expression the verdict's message must match (empty: none needed)

    def matches(self, finding: Finding, phases: set[str]) -> bool:
        if finding.kind not in self.kinds:
            return False
        if self.phases and not any(fnmatch.fnmatchcase(p, pat) for p in phases for pat in self.phases):
            return False
        return not self.evidence or re.search(self.evidence, finding.message) is not None


HINTS: tuple[Pattern, ...] = (
    Pattern(
        "eagle_draft_graph",
        ("eagle.draft_graph*",),
        STALLS | {"failed"},
        "EAGLE draft graph capture: SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1 runs the draft-extend step "
        "eagerly (SGLang releases that have it); if it then starts, the draft graphs were the problem",
        "sgl-project/sglang#30944, #10088",
    ),
    Pattern(
        "custom_all_reduce",
        ("dist.custom_all_reduce",),
        STALLS | {"failed"},
        "custom all-reduce setup: restart with --disable-custom-all-reduce (NCCL does the all-reduce); "
        "if it then starts, report the GPUs and their topology (nvidia-smi topo -m)",
        "sgl-project/sglang#1118, #1148",
    ),
    Pattern(
        "graph_capture",
        ("graph.capture*",),
        STALLS | {"failed"},
        "CUDA graph capture: --disable-cuda-graph confirms it (slower serving, not a fix); a lower "
        "--cuda-graph-max-bs captures fewer batch sizes and uses less memory",
        "sgl-project/sglang#3547, #4007",
    ),
    Pattern(
        "oom_kill_in_load",
        ("model.*",),
        frozenset({"died"}),
        "SIGKILL while loading weights is most often the kernel's OOM killer (host memory): look for "
        "'Killed process' in dmesg / journalctl -k and check free host memory per node; if GPU memory is "
        "the limit instead, lower --mem-fraction-static",
        "sgl-project/sglang#20287",
        evidence=r"SIGKILL",
    ),
    Pattern(
        "unbalanced_load_barrier",
        (),
        frozenset({"failed"}),
        "SGLang's post-load barrier: a peer did not finish loading within UNBALANCED_MODEL_LOADING_TIMEOUT_S "
        "(480 s, a constant in model_runner_components/load_model_utils.py) or died; find the rank that "
        "was still loading (slow disk, OOM) before raising the timeout",
        "sgl-project/sglang#5457, #5602",
        evidence=r"could finish the model loading, but there are other ranks",
    ),
    Pattern(
        "slow_load_straggler",
        ("model.load_weights*", "model.loader", "model.weights_iterator"),
        STALLS,
        "its peers wait at SGLang's post-load barrier, which gives up after 480 s "
        "(UNBALANCED_MODEL_LOADING_TIMEOUT_S) without naming this rank: look at its storage (shards on a "
        "slow or network filesystem) and host memory",
        "sgl-project/sglang#5457, #9917",
    ),
    Pattern(
        "rendezvous",
        ("dist.init_process_group",),
        STALLS,
        "distributed rendezvous: every node must reach --dist-init-addr HOST:PORT (node 0's address, port "
        "open); with several network interfaces set NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME to the one "
        "that connects the nodes",
        "sgl-project/sglang#7478",
    ),
)


def _process(run: RunView | None, finding: Finding) -> ProcessRec | None:
    if run is None:
        return None
    procs = run.processes
    return next((p for p in procs if finding.pid and p.pid == finding.pid), None) or next(
        (p for p in procs if finding.label and p.label == finding.label), None
    )


def phases_around(finding: Finding, run: RunView | None) -> set[str]:
    """The named phase and the phases enclosing it in the named rank (a graph capture inside an
    EAGLE draft graph runner is both); just the named phase when the run does not show it."""
    out = {finding.phase} if finding.phase else set()
    proc = _process(run, finding)
    if proc is None or not finding.phase:
        return out
    spans = [s for s in proc.spans.values() if s.phase == finding.phase]
    if not spans:
        return out
    span = max(spans, key=lambda s: (s.end is None, s.start))  # the open one, else the latest
    seen = 0
    while span is not None and seen < 64:
        out.add(span.phase)
        span = proc.spans.get(span.parent_id) if span.parent_id else None
        seen += 1
    return out


def match(finding: Finding, run: RunView | None = None) -> Pattern | None:
    """The first pattern the verdict matches; None for notices and for consequences of another rank."""
    if not finding.alarm or CONSEQUENCE in finding.message:
        return None
    phases = phases_around(finding, run)
    return next((p for p in HINTS if p.matches(finding, phases)), None)


def line(pattern: Pattern) -> str:
    """``HINT (not a verdict) … [source: sgl-project/sglang#NNNN]`` (callers add the prefix)."""
    return f"HINT (not a verdict) {pattern.hint}  [source: {pattern.source}]"


def for_finding(finding: Finding, run: RunView | None = None) -> list[str]:
    """The hint lines to print after the verdict line of ``finding`` (zero or one), without the
    ``sglang-phasetrace:`` prefix, as ``render.verdict.line`` returns the verdict."""
    pattern = match(finding, run)
    return [line(pattern)] if pattern is not None else []
