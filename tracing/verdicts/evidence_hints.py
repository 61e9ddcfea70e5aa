"""Hints keyed on what a rank waits on (``evidence.Evidence``), not only on its phase.

A phase-keyed hint guesses from where a rank stopped; the evidence says what it stopped on. So the
rows here match the evidence's *subject* — a lock's file, a busy child's command line, a socket's
remote address — and ``contradicted`` names the phase-keyed rows of ``hints.HINTS`` that the same
evidence rules out (a rank waiting on a socket is not waiting on its storage). Like ``hints.HINTS``:
data, specific rows first, each citing where users found the fix; never a verdict.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Collection
from dataclasses import dataclass

from .evidence import BUSY_PCT, Evidence


@dataclass(frozen=True)
class EvidenceHint:
    name: str
    cause: str  # the Evidence.cause it applies to: "lock" | "child" | "socket"
    subject: str  # a regular expression searched in the evidence's subject (``subject``)
    hint: str
    source: str
    phases: tuple[str, ...] = ()  # fnmatch patterns, one must match a phase around the rank; empty: any

    def matches(self, ev: Evidence, phases: Collection[str] = ()) -> bool:
        if ev.cause != self.cause:
            return False
        if self.phases and not any(fnmatch.fnmatchcase(p, pat) for p in phases for pat in self.phases):
            return False
        return re.search(self.subject, subject(ev)) is not None


_JIT_SERVERS = "two servers compiling into one cache, or ranks taking turns on a cold one"

HINTS: tuple[EvidenceHint, ...] = (
    EvidenceHint(
        "flashinfer_jit_lock",
        "lock",
        r"flashinfer",
        "FlashInfer's JIT cache lock (~/.cache/flashinfer): another process builds or loads kernels there "
        f"({_JIT_SERVERS}). A holder left from an earlier run: stop it; else let it finish, or give each server "
        "its own cache (FLASHINFER_WORKSPACE_BASE)",
        "sgl-project/sglang#19583, #3578; flashinfer-ai/flashinfer#972",
    ),
    EvidenceHint(
        "deepgemm_jit_lock",
        "lock",
        r"deep_gemm|DeepGEMM|DG_JIT",
        "DeepGEMM's compile lock: one rank compiles each kernel, the others wait for it (minutes on a cold "
        "cache). Pre-compile once with `python -m sglang.compile_deep_gemm` and the launch_server arguments; keep "
        "SGLANG_DG_CACHE_DIR on local disk and across restarts",
        "sgl-project/sglang#29170, #4773, #5580",
    ),
    EvidenceHint(
        "inductor_cache_lock",
        "lock",
        r"torchinductor|/inductor/|TORCHINDUCTOR",
        "torch inductor's cache lock (locks/ under TORCHINDUCTOR_CACHE_DIR, default /tmp/torchinductor_$USER): "
        f"another process compiles into it ({_JIT_SERVERS}); give each server its own TORCHINDUCTOR_CACHE_DIR "
        "or let it finish",
        "pytorch/torchdynamo#1347, #1400; sgl-project/sglang#34231",
    ),
    EvidenceHint(
        "triton_cache_lock",
        "lock",
        r"\.triton/|triton_cache|TRITON_CACHE",
        "Triton's kernel cache (~/.triton/cache): another process compiles into it; give each server (and each "
        "node, never a shared network file system) its own TRITON_CACHE_DIR",
        "triton-lang/triton#518; PrimeIntellect-ai/prime-rl#2305; pytorch/pytorch#173679",
    ),
    EvidenceHint(
        "torch_extension_baton",
        "lock",
        r"torch_extensions|file_baton|FileBaton",
        "torch cpp_extension's build lock is a plain file (…/torch_extensions/…/lock), not a kernel lock: a "
        "build killed mid-way leaves it and every later start waits forever. If no build process runs, delete "
        "that lock file",
        "pytorch/pytorch#189245, #59146",
    ),
    EvidenceHint(
        "file_lock_outside",
        "lock",
        r"",
        "the lock's holder is named: if it is a leftover process from an earlier run (a server that never "
        "exited), stop it; if it is a live server sharing a cache directory with this one, separate their caches",
        "sgl-project/sglang#19583, #3578",
    ),
    EvidenceHint(
        "deepgemm_compile",
        "child",
        r"compile_deep_gemm|deep_gemm|DeepGEMM",
        "DeepGEMM compiles on a cold cache (10 to 20 min reported): busy, not stuck. Pre-compile once with "
        "`python -m sglang.compile_deep_gemm` and the launch_server arguments; keep SGLANG_DG_CACHE_DIR",
        "sgl-project/sglang#29170, #4773, #5580",
    ),
    EvidenceHint(
        "flashinfer_compile",
        "child",
        r"flashinfer",
        "FlashInfer JIT-compiles kernels it has no prebuilt copy of: busy, not stuck. A warm ~/.cache/flashinfer "
        "(FLASHINFER_WORKSPACE_BASE kept across restarts) or FlashInfer's prebuilt kernel packages avoid it",
        "sgl-project/sglang#7339; flashinfer-ai/flashinfer#972",
    ),
    EvidenceHint(
        "jit_compile",
        "child",
        r"",
        "a compiler child is at work (a JIT build on a cold cache): busy, not stuck. It runs again on every start "
        "if the cache is not kept: keep the JIT cache directories (SGLANG_CACHE_DIR, TRITON_CACHE_DIR, "
        "TORCHINDUCTOR_CACHE_DIR) on local disk across restarts",
        "sgl-project/sglang#29170, #34231",
    ),
    EvidenceHint(
        "rendezvous_socket",
        "socket",
        r"rendezvous",
        "the rendezvous address (--dist-init-addr HOST:PORT, node 0) does not answer from here: check that "
        "node 0 runs and listens there, the port is open between the nodes, and on multi-homed hosts "
        "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME",
        "sgl-project/sglang#7478, #2892, #3226",
    ),
    EvidenceHint(
        "rendezvous_phase_socket",
        "socket",
        r"",
        "a socket that does not answer while ranks meet: every node must reach --dist-init-addr HOST:PORT; with "
        "several network interfaces set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME to the one between the nodes",
        "sgl-project/sglang#7478, #3226",
        phases=("dist.init_process_group", "dist.*"),
    ),
    EvidenceHint(
        "hub_or_proxy_socket",
        "socket",
        r":(443|80|3128|8080|8888)\b",
        "an HTTP(S) endpoint or proxy does not answer (a model hub download or metadata check, a dead "
        "HTTPS_PROXY): with the model already on local disk, start with HF_HUB_OFFLINE=1 (and "
        "TRANSFORMERS_OFFLINE=1) or pass a local --model-path; else fix the proxy (HTTPS_PROXY / NO_PROXY)",
        "huggingface_hub docs (HF_HUB_OFFLINE); raullenchai/Rapid-MLX#1865, #1888; runpod-workers/worker-vllm#46",
    ),
)

# Rows of ``hints.HINTS`` (by name) whose premise the evidence rules out: not printed beside it.
_STALL_HINTS = frozenset({"slow_load_straggler", "graph_capture", "custom_all_reduce", "eagle_draft_graph"})
CONTRADICTS: dict[str, frozenset[str]] = {
    "lock": _STALL_HINTS | {"rendezvous"},  # a file lock is none of storage, graphs, all-reduce or the network
    "socket": _STALL_HINTS,  # waiting on the network, not the disk; a socket in the rendezvous *is* the rendezvous
    "child": _STALL_HINTS | {"rendezvous"},  # it works: busy, not stuck
}
_COLLECTIVE_LIBS = ("NCCL", "gloo", "torch.distributed")


def subject(ev: Evidence) -> str:
    """What a row's ``subject`` is searched in: the lock's file and the Python frame polling for it;
    the busy children's names and command lines; the socket's remote address and role."""
    main = ev.main
    if ev.cause == "lock":
        return " ".join(filter(None, [*(lk.path for lk in ev.locks), main.python if main else None]))
    if ev.cause == "child":
        return " ".join(f"{c.name} {c.cmd}" for c in ev.children if c.cpu_pct >= BUSY_PCT or not ev.busy)
    if ev.cause == "socket":
        return " ".join(f"{s.remote or ''} {s.role or ''}" for s in ev.sockets)
    return ""


def match(ev: Evidence, phases: Collection[str] = ()) -> EvidenceHint | None:
    """The first row ``ev`` matches (``phases``: the rank's phase and those around it)."""
    return next((h for h in HINTS if h.matches(ev, phases)), None)


def line(hint: EvidenceHint) -> str:
    """``HINT (not a verdict) … [source: …]``, as ``hints.line`` writes a phase-keyed one."""
    return f"HINT (not a verdict) {hint.hint}  [source: {hint.source}]"


def contradicted(ev: Evidence) -> frozenset[str]:
    """Names of ``hints.HINTS`` rows this evidence rules out. None are, for a socket a collective
    library (NCCL, gloo) waits on: that is the peer the phase-keyed hint is about."""
    if ev.main is not None and ev.main.library and ev.main.library.startswith(_COLLECTIVE_LIBS):
        return frozenset()
    return CONTRADICTS.get(ev.cause, frozenset())
