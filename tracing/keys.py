"""Attribute keys, the phase names readers test, and the environment variables we read: one place,
so a name a writer (``patches/``, the runtime) sets is the very name every reader looks for."""

import os

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
TORCH_VERSION = "torch.version"  # resource attribute, where torch is imported when tracing starts
DEVICE_MODEL = "sglang.device_model"  # resource attribute: "NVIDIA H200" (the driver's name), where known
RUN_ID = "phasetrace.run_id"
# Multi-node: which node of the launch this process runs on, and the launch all nodes share.
NODE_RANK = "sglang.node_rank"
NNODES = "sglang.nnodes"
DIST_INIT_ADDR = "sglang.dist_init_addr"  # the rendezvous HOST:PORT every node meets at
INIT_METHOD = "sglang.init_method"  # on dist.init_process_group: where its ranks meet (tcp://HOST:PORT)
LAUNCH_ID = "phasetrace.launch_id"  # resource attribute: the launch, whatever trace a node's spans have

# Phase bookkeeping.
PHASE = "sglang.phase"
TARGET = "phasetrace.target"
AFTER_READY = "phasetrace.after_ready"
ALIVE_AT_TEARDOWN = "phasetrace.alive_pids"  # on launch.teardown: local ranks the launcher saw running then
INCOMPLETE = "phasetrace.incomplete"
# The start ends when the launch serves (``tracing.phases``). On a root span's end: it ended because
# serving began (the launch's "ready to roll", ``Engine.__init__`` returned; a rank: its launch serves).
SERVING = "phasetrace.serving"
# The event on a rank's root when its own init is done (``Scheduler.__init__`` returned) while its
# launch does not serve yet: the rank is "initialised" until then, and still watched.
INITIALISED = "phasetrace.initialised"
# In an export, on a process (Jaeger process tag, OTLP resource, Perfetto process label): its state as
# the reader saw it: ``running``, ``initialised``, ``ready``, ``serving`` (a launcher), ``failed`` …
PROCESS_STATE = "phasetrace.state"
SNAPSHOT = "phasetrace.snapshot"  # on spans a snapshot export closed for the reader (still open in the run)

# Phase attributes readers use (set by patches/, read by the watchdog and the renderers).
# On ``server.wait_ready``: the server came up (SGLang's ``server_status``); a tokenizer worker's says,
# with ``--tokenizer-worker-num`` > 1, that the launch serves (its launcher never warms up itself).
SERVER_READY = "sglang.server_ready"
TOKENIZER_WORKERS = "sglang.tokenizer_worker_num"  # on the launch root: how many must come up
GROUP_NAME = "sglang.group_name"  # a communication group: phases per group are told apart
IS_DRAFT = "sglang.is_draft"  # a speculative draft model's phase, told apart from the target's
SERVER_ARGS = "sglang.server_args"  # the launch's server arguments, redacted JSON (``patches/_attrs``)
MODEL_CONFIG = "sglang.model_config"  # a hash of the model's config.json, read where the path resolves
DRAFT_MODEL_CONFIG = "sglang.draft_model_config"  # ... and of the speculative draft model's
SHAPE_INDEX = "sglang.shape_index"  # graph capture progress: this shape's 1-based index ...
CAPTURE_SHAPES = "sglang.capture_shapes"  # ... of this many
FORWARD_MODE = "sglang.forward_mode"  # a warm-up forward pass: ``extend``, ``decode``, ``idle`` … (the enum's name)
BATCH_SIZE = "sglang.batch_size"  # ... and its batch size

# The watchdog's event on a stalled process's root span.
STALL_EVENT = "phasetrace.stall"
FINDING = "phasetrace.finding"
MESSAGE = "phasetrace.message"

# Phase names readers test. A process's root phase: it ends well when the process is ready (a
# rank's ``Scheduler.__init__``, the launcher's entry point). The launcher's ready phase: it ends
# well when the server answers. ``patches/`` names its root and ready phases with these, and
# tests/test_schema.py checks that every phase of those kinds is in these sets.
PHASE_RANK = "rank"
PHASE_LAUNCH_ENGINE = "launch.engine"
PHASE_LAUNCH_SERVER = "launch.server"
PHASE_WAIT_READY = "server.wait_ready"
PHASE_WARMUP = "server.warmup"  # a rank's forward pass between its own init and serving (the server's warm-up)
# The root of every other process a launch starts (detokenizer, tokenizer worker, DP controller …):
# from its process start; its start is done when it enters its loop (a ``loop`` phase).
PHASE_PROCESS = "process"
ROOT_PHASES = frozenset({PHASE_RANK, PHASE_LAUNCH_ENGINE, PHASE_LAUNCH_SERVER, PHASE_PROCESS})
# Launcher phases that wait for the launch's other processes (their next step is not the launcher's).
WAITS_FOR_OTHERS = frozenset({"launch.wait_ranks", PHASE_WAIT_READY})
READY_PHASES = frozenset({PHASE_WAIT_READY})
# Init steps of the launch's other processes (and the launcher's own managers) that wait for no
# other process of the launch: idle in one for the blocked bound is a stall, whatever it waits on
# (a detokenizer asleep in its init is named then, not once the ranks are initialised and idle too).
# Not the DP controller's init: it waits for its ranks.
WORKS_ALONE = frozenset(
    {"tokenizer_manager.init", "template_manager.init", "detokenizer.init", "tokenizer_worker.init"}
)

# Environment (the on/off switch SGLANG_PHASETRACE is read by the stdlib-only boot module).
ENV_BASE_DIR = "SGLANG_PHASETRACE_DIR"
ENV_RUN_DIR = "SGLANG_PHASETRACE_RUN_DIR"
ENV_HTTP = "SGLANG_PHASETRACE_HTTP"  # the launcher's start-up endpoint: HOST:PORT (``launcher.endpoint``)
ENV_DISABLE_PATCHES = "SGLANG_PHASETRACE_SKIP"  # comma list of phase names not to patch
ENV_SECONDS = "SGLANG_PHASETRACE_{}_S"  # HEARTBEAT, SILENT, STALL, NO_PROGRESS
HEARTBEAT_S = 2.0  # the heartbeat interval's default


def env_seconds(name: str, default: float) -> float:
    """``SGLANG_PHASETRACE_<NAME>_S`` as seconds; ``default`` when unset or not a number."""
    try:
        return float(os.environ.get(ENV_SECONDS.format(name), default))
    except ValueError:
        return default


ENV_STACK_SIGNAL = "SGLANG_PHASETRACE_STACK_SIGNAL"
ENV_WATCHDOG = "SGLANG_PHASETRACE_WATCHDOG"  # "0": no watchdog thread in the launcher
ENV_ABORT_AFTER = "SGLANG_PHASETRACE_ABORT_AFTER_S"  # opt-in: SIGTERM the launcher after a stall this long
ENV_WRITE_WAIT = "SGLANG_PHASETRACE_WRITE_WAIT_S"  # how long a journal write may hold its caller (default 1 s)
ENV_METRICS = "SGLANG_PHASETRACE_METRICS"  # "0": no OTLP metrics even with an endpoint set
ENV_LAUNCHER = "SGLANG_PHASETRACE_LAUNCHER"  # pid of the traced launcher; its children trace from import
ENV_TRACEPARENT = "TRACEPARENT"
ENV_LAUNCH_ID = "SGLANG_PHASETRACE_LAUNCH_ID"  # names the launch on every node (multi-node); overrides job ids
ENV_NODE = "SGLANG_PHASETRACE_NODE"  # set by a node's launcher for its children: "NODE_RANK/NNODES"
# Set by a ``launch_server`` launcher for the ranks it spawns: the name of the file in the run directory
# it creates when the launch serves; until it appears, its initialised ranks are still starting. Unset
# (an ``Engine``, a node ≥ 1 of a multi-node launch): a rank serves once its own init is done.
ENV_SERVING = "SGLANG_PHASETRACE_SERVING"
ENV_HISTORY = "SGLANG_PHASETRACE_HISTORY"  # where the history of starts is (a path), or "0": none
DEFAULT_BASE_DIR = "phasetrace-runs"
