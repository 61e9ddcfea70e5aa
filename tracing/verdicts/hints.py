"""Hints from known fixes: when a verdict matches the shape of an init failure that SGLang users have
reported (phase, finding kind, evidence), one line naming the workaround they found, and where.

A hint is never a verdict: it follows the verdict line, says ``HINT (not a verdict)``, and cites its
source (an SGLang issue, pull request or release). The table is data; ``docs/hints.md`` lists it
with the sources. The first matching pattern wins, so the specific ones come first: the rows keyed
on what the rank waits on (``evidence.Evidence``: a lock's file, a busy child's command line, a
socket's address) before the rows keyed on where it stopped (an EAGLE draft graph capture before
graph capture in general). A phase row whose premise the evidence rules out is not printed (a rank
waiting on a socket is not waiting on its storage: ``contradicted``).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Collection
from dataclasses import dataclass

from ..reader.view import ProcessRec, RunView
from . import evidence
from .diagnose import Finding
from .evidence import BUSY_PCT, Evidence
from .findings import process_of

STALLS = frozenset({"silent", "straggler", "divergence", "no_progress", "rendezvous", "waits_on"})
CONSEQUENCE = "— a consequence of"  # postmortem's words for a rank that failed after another ended
WAITS = STALLS | {"not_started"}  # the verdicts that name a rank waiting on something


@dataclass(frozen=True)
class Pattern:
    name: str
    phases: tuple[str, ...]  # fnmatch patterns; one must match the named phase or a phase around it
    kinds: frozenset[str]  # the finding kinds it applies to
    hint: str
    source: str  # "sgl-project/sglang#NNNN, #MMMM"
    evidence: str = ""  # a regular expression the verdict's message must match (empty: none needed)
    cause: str | None = None  # an evidence row: the ``Evidence.cause`` it needs ("lock", "child", "socket")
    subject: str = ""  # ... and a regular expression searched in the evidence's ``subject``

    def matches(self, finding: Finding, phases: Collection[str], ev: Evidence | None = None) -> bool:
        if finding.kind not in self.kinds:
            return False
        if self.evidence and re.search(self.evidence, finding.message) is None:
            return False
        return self.applies(ev, phases)

    def applies(self, ev: Evidence | None, phases: Collection[str] = ()) -> bool:
        """Its phase and evidence conditions (not the finding's kind and message)."""
        if self.phases and not any(fnmatch.fnmatchcase(p, pat) for p in phases for pat in self.phases):
            return False
        if self.cause is None:  # a phase row: unless the evidence rules it out
            return ev is None or self.name not in contradicted(ev)
        return ev is not None and ev.cause == self.cause and re.search(self.subject, subject(ev)) is not None


_JIT_SERVERS = "two servers compiling into one cache, or ranks taking turns on a cold one"
_LOCK, _CHILD, _SOCKET = WAITS, frozenset({"busy"}) | WAITS, WAITS

HINTS: tuple[Pattern, ...] = (
    # -- keyed on what the rank waits on (``evidence``) -------------------------------------------------------
    Pattern(
        "flashinfer_jit_lock",
        (),
        _LOCK,
        "FlashInfer's JIT cache lock (~/.cache/flashinfer): another process builds or loads kernels there "
        f"({_JIT_SERVERS}). A holder left from an earlier run: stop it; else let it finish, or give each server "
        "its own cache (FLASHINFER_WORKSPACE_BASE)",
        "sgl-project/sglang#19583, #3578; flashinfer-ai/flashinfer#972",
        cause="lock",
        subject=r"flashinfer",
    ),
    Pattern(
        "deepgemm_jit_lock",
        (),
        _LOCK,
        "DeepGEMM's compile lock: one rank compiles each kernel, the others wait for it (minutes on a cold "
        "cache). Pre-compile once with `python -m sglang.compile_deep_gemm` and the launch_server arguments; keep "
        "SGLANG_DG_CACHE_DIR on local disk and across restarts",
        "sgl-project/sglang#29170, #4773, #5580",
        cause="lock",
        subject=r"deep_gemm|DeepGEMM|DG_JIT",
    ),
    Pattern(
        "inductor_cache_lock",
        (),
        _LOCK,
        "torch inductor's cache lock (locks/ under TORCHINDUCTOR_CACHE_DIR, default /tmp/torchinductor_$USER): "
        f"another process compiles into it ({_JIT_SERVERS}); give each server its own TORCHINDUCTOR_CACHE_DIR "
        "or let it finish",
        "sgl-project/sglang#34231; pytorch/torchdynamo#1347, #1400",
        cause="lock",
        subject=r"torchinductor|/inductor/|TORCHINDUCTOR",
    ),
    Pattern(
        "triton_cache_lock",
        (),
        _LOCK,
        "Triton's kernel cache (~/.triton/cache): another process compiles into it; give each server (and each "
        "node, never a shared network file system) its own TRITON_CACHE_DIR",
        "triton-lang/triton#518; PrimeIntellect-ai/prime-rl#2305; pytorch/pytorch#173679",
        cause="lock",
        subject=r"\.triton/|triton_cache|TRITON_CACHE",
    ),
    Pattern(
        "torch_extension_baton",
        (),
        _LOCK,
        "torch cpp_extension's build lock is a plain file (…/torch_extensions/…/lock), not a kernel lock: a "
        "build killed mid-way leaves it and every later start waits forever. If no build process runs, delete "
        "that lock file",
        "pytorch/pytorch#189245, #59146",
        cause="lock",
        subject=r"torch_extensions|file_baton|FileBaton",
    ),
    Pattern(
        "file_lock_outside",
        (),
        _LOCK,
        "the lock's holder is named: if it is a leftover process from an earlier run (a server that never "
        "exited), stop it; if it is a live server sharing a cache directory with this one, separate their caches",
        "sgl-project/sglang#19583, #3578",
        cause="lock",
    ),
    Pattern(
        "deepgemm_compile",
        (),
        _CHILD,
        "DeepGEMM compiles on a cold cache (10 to 20 min reported): busy, not stuck. Pre-compile once with "
        "`python -m sglang.compile_deep_gemm` and the launch_server arguments; keep SGLANG_DG_CACHE_DIR",
        "sgl-project/sglang#29170, #4773, #5580",
        cause="child",
        subject=r"compile_deep_gemm|deep_gemm|DeepGEMM",
    ),
    Pattern(
        "flashinfer_compile",
        (),
        _CHILD,
        "FlashInfer JIT-compiles kernels it has no prebuilt copy of: busy, not stuck. A warm ~/.cache/flashinfer "
        "(FLASHINFER_WORKSPACE_BASE kept across restarts) or FlashInfer's prebuilt kernel packages avoid it",
        "sgl-project/sglang#7339; flashinfer-ai/flashinfer#972",
        cause="child",
        subject=r"flashinfer",
    ),
    Pattern(
        "jit_compile",
        (),
        _CHILD,
        "a compiler child is at work (a JIT build on a cold cache): busy, not stuck. It runs again on every start "
        "if the cache is not kept: keep the JIT cache directories (SGLANG_CACHE_DIR, TRITON_CACHE_DIR, "
        "TORCHINDUCTOR_CACHE_DIR) on local disk across restarts",
        "sgl-project/sglang#29170, #34231",
        cause="child",
    ),
    Pattern(
        "rendezvous_socket",
        (),
        _SOCKET,
        "the rendezvous address (--dist-init-addr HOST:PORT, node 0) does not answer from here: check that "
        "node 0 runs and listens there, the port is open between the nodes, and on multi-homed hosts "
        "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME",
        "sgl-project/sglang#7478, #2892, #3226",
        cause="socket",
        subject=r"rendezvous",
    ),
    Pattern(
        "rendezvous_phase_socket",
        ("dist.init_process_group", "dist.*"),
        _SOCKET,
        "a socket that does not answer while ranks meet: every node must reach --dist-init-addr HOST:PORT; with "
        "several network interfaces set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME to the one between the nodes",
        "sgl-project/sglang#7478, #3226",
        cause="socket",
    ),
    Pattern(
        "hub_or_proxy_socket",
        (),
        _SOCKET,
        "an HTTP(S) endpoint or proxy does not answer (a model hub download or metadata check, a dead "
        "HTTPS_PROXY): with the model already on local disk, start with HF_HUB_OFFLINE=1 (and "
        "TRANSFORMERS_OFFLINE=1) or pass a local --model-path; else fix the proxy (HTTPS_PROXY / NO_PROXY)",
        "huggingface_hub docs (HF_HUB_OFFLINE); raullenchai/Rapid-MLX#1865, #1888; runpod-workers/worker-vllm#46",
        cause="socket",
        subject=r":(443|80|3128|8080|8888)\b",
    ),
    # -- keyed on where the rank stopped ----------------------------------------------------------------------
    Pattern(
        "eagle_draft_graph",
        ("eagle.draft_graph*",),
        STALLS | {"failed"},
        "EAGLE draft graph capture: SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1 runs the draft-extend step "
        "eagerly (SGLang releases that have it); if it then starts, the draft graphs were the problem",
        "sgl-project/sglang#30944, #10088",
    ),
    Pattern(
        "eagle_embed_head",
        ("eagle.get_embed_and_head", "eagle.set_embed*", "eagle.init_lm_head"),
        STALLS,
        "EAGLE draft init, the draft sharing the target's embedding and LM head: one rank stopped there while its "
        "peers wait in a collective is a collective only some ranks entered (the draft's sub-communicator on its "
        "first use). Start once without the draft (no --speculative-algorithm) to confirm; every rank needs the "
        "same --speculative-* arguments and draft model",
        "sgl-project/sglang#29144, #4417",
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


# Rows keyed on the phase (by name) whose premise the evidence rules out: not printed beside it.
_STALL_HINTS = frozenset({"slow_load_straggler", "graph_capture", "custom_all_reduce", "eagle_draft_graph"})
CONTRADICTS: dict[str, frozenset[str]] = {
    "lock": _STALL_HINTS | {"rendezvous"},  # a file lock is none of storage, graphs, all-reduce or the network
    "socket": _STALL_HINTS,  # waiting on the network, not the disk; a socket in the rendezvous *is* the rendezvous
    "child": _STALL_HINTS | {"rendezvous"},  # it works: busy, not stuck
}
_COLLECTIVE_LIBS = ("NCCL", "gloo", "torch.distributed")


def subject(ev: Evidence) -> str:
    """What an evidence row's ``subject`` is searched in: the lock's file and the Python frame polling
    for it; the busy children's names and command lines; the socket's remote address and role."""
    main = ev.main
    if ev.cause == "lock":
        return " ".join(filter(None, [*(lk.path for lk in ev.locks), main.python if main else None]))
    if ev.cause == "child":
        return " ".join(f"{c.name} {c.cmd}" for c in ev.children if c.cpu_pct >= BUSY_PCT or not ev.busy)
    if ev.cause == "socket":
        return " ".join(f"{s.remote or ''} {s.role or ''}" for s in ev.sockets)
    return ""


def contradicted(ev: Evidence) -> frozenset[str]:
    """Names of the phase rows this evidence rules out. None are, for a socket a collective library
    (NCCL, gloo) waits on: that is the peer the phase row is about."""
    if ev.main is not None and ev.main.library and ev.main.library.startswith(_COLLECTIVE_LIBS):
        return frozenset()
    return CONTRADICTS.get(ev.cause, frozenset())


def for_evidence(ev: Evidence, phases: Collection[str] = ()) -> Pattern | None:
    """The first evidence row ``ev`` matches (``phases``: the rank's phase and those around it)."""
    return next((p for p in HINTS if p.cause is not None and p.applies(ev, phases)), None)


def _process(run: RunView | None, finding: Finding) -> ProcessRec | None:
    if run is None:
        return None
    return process_of(run, finding)


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


def evidence_of(finding: Finding) -> Evidence | None:
    """What the named rank waits on, as the finding carries it (``Finding.evidence``)."""
    value = finding.evidence.get(finding.label) or next(iter(finding.evidence.values()), None)
    return evidence.from_builtins(value) if value is not None else None


def match(finding: Finding, run: RunView | None = None) -> Pattern | None:
    """The first pattern the verdict matches; None for a consequence of another rank, and for a
    notice unless an evidence row names what it does (a busy rank's compiler)."""
    if CONSEQUENCE in finding.message:
        return None
    phases, ev = phases_around(finding, run), evidence_of(finding)
    return next((p for p in HINTS if p.matches(finding, phases, ev)), None)


def line(pattern: Pattern) -> str:
    """``HINT (not a verdict) … [source: sgl-project/sglang#NNNN]`` (callers add the prefix)."""
    return f"HINT (not a verdict) {pattern.hint}  [source: {pattern.source}]"


def for_finding(finding: Finding, run: RunView | None = None) -> list[str]:
    """The hint lines to print after the verdict line of ``finding`` (zero or one), without the
    ``sglang-phasetrace:`` prefix, as ``verdicts.voice.line`` returns the verdict."""
    pattern = match(finding, run)
    return [line(pattern)] if pattern is not None else []
