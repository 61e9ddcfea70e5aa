"""What is patched: the phase tables, one module per SGLang area, and the engine that applies them.

None of these modules imports SGLang; the engine patches each target module when it is imported.
"""

from __future__ import annotations

from . import collectives, distributed, graphs, installed, model_runner, processes, scheduler, server, speculative
from .engine import PatchEngine, Plan
from .installed import current_engine, patch_model_class
from .spec import Call, Phase

PHASES: tuple[Phase, ...] = (
    *server.PHASES,
    *processes.PHASES,
    *scheduler.PHASES,
    *distributed.PHASES,
    *model_runner.PHASES,
    *graphs.PHASES,
    *speculative.PHASES,
    *collectives.PHASES,
)
MODEL_PHASES: tuple[Phase, ...] = speculative.MODEL_PHASES
MODEL_CLASSES: tuple[str, ...] = speculative.MODEL_CLASSES


def install(warn=None) -> PatchEngine:
    """Create the process's engine for ``PHASES`` and register its post-import hooks (once)."""
    return installed.install(PHASES, MODEL_PHASES, warn)


def table_phases() -> list[Phase]:
    """The phases of the coverage table (docs/coverage.md, doctor's row): those with targets in
    SGLang (``collective.torch`` wraps torch itself)."""
    return [p for p in (*PHASES, *MODEL_PHASES) if any(t.startswith(("sglang.", "*:")) for t in p.targets)]


def dry_run() -> list[Plan]:
    """Every phase as the engine would patch it here (importing SGLang, patching nothing)."""
    return PatchEngine((*PHASES, *MODEL_PHASES)).dry_run(model_classes=MODEL_CLASSES)


__all__ = [
    "MODEL_CLASSES",
    "MODEL_PHASES",
    "PHASES",
    "Call",
    "PatchEngine",
    "Phase",
    "Plan",
    "current_engine",
    "dry_run",
    "install",
    "patch_model_class",
    "table_phases",
]
