"""What is patched: the phase tables, one module per SGLang area, and the engine that applies them.

None of these modules imports SGLang; the engine patches each target module when it is imported.
"""

from __future__ import annotations

from . import collectives, distributed, graphs, model_runner, scheduler, server, speculative
from .engine import PatchEngine
from .spec import Call, Phase

PHASES: tuple[Phase, ...] = (
    *server.PHASES, *scheduler.PHASES, *distributed.PHASES, *model_runner.PHASES, *graphs.PHASES,
    *speculative.PHASES, *collectives.PHASES,
)
MODEL_PHASES: tuple[Phase, ...] = speculative.MODEL_PHASES

_engine: PatchEngine | None = None


def install(warn=None) -> PatchEngine:
    """Create the process's engine for ``PHASES`` and register its post-import hooks (once)."""
    global _engine
    if _engine is None:
        _engine = PatchEngine(PHASES, warn)
        _engine.install()
    return _engine


def current_engine() -> PatchEngine | None:
    return _engine


def patch_model_class(cls: type) -> None:
    """Trace embed/head sharing on a model class loaded at run time (any architecture)."""
    if _engine is not None:
        _engine.patch_class(cls, MODEL_PHASES)


__all__ = ["MODEL_PHASES", "PHASES", "Call", "PatchEngine", "Phase", "current_engine", "install", "patch_model_class"]
