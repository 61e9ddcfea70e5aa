"""Attribute keys and the environment variables we read: one place, so names never drift."""

# Identity (stamped on every span, and resource attributes where known at provider creation).
TP_RANK = "sglang.tp_rank"
PP_RANK = "sglang.pp_rank"
DP_RANK = "sglang.dp_rank"
EP_RANK = "sglang.ep_rank"
WORLD_RANK = "sglang.world_rank"
WORLD_SIZE = "sglang.world_size"
GPU_ID = "sglang.gpu_id"
ROLE = "sglang.role"
RANK_LABEL = "sglang.rank"
SGLANG_VERSION = "sglang.version"
RUN_ID = "phasetrace.run_id"

# Phase bookkeeping.
PHASE = "sglang.phase"
TARGET = "phasetrace.target"
AFTER_READY = "phasetrace.after_ready"
INCOMPLETE = "phasetrace.incomplete"

# Environment (the on/off switch SGLANG_PHASETRACE is read by the stdlib-only boot module).
ENV_BASE_DIR = "SGLANG_PHASETRACE_DIR"
ENV_RUN_DIR = "SGLANG_PHASETRACE_RUN_DIR"
ENV_DISABLE_PATCHES = "SGLANG_PHASETRACE_SKIP"  # comma list of phase names not to patch
ENV_SECONDS = "SGLANG_PHASETRACE_{}_S"  # HEARTBEAT, SILENT, STALL, NO_PROGRESS
ENV_STACK_SIGNAL = "SGLANG_PHASETRACE_STACK_SIGNAL"
ENV_WATCHDOG = "SGLANG_PHASETRACE_WATCHDOG"  # "0": no watchdog thread in the launcher
ENV_ABORT_AFTER = "SGLANG_PHASETRACE_ABORT_AFTER_S"  # opt-in: SIGTERM the launcher after a stall this long
ENV_LAUNCHER = "SGLANG_PHASETRACE_LAUNCHER"  # pid of the traced launcher; its children trace from import
ENV_TRACEPARENT = "TRACEPARENT"
DEFAULT_BASE_DIR = "phasetrace-runs"
