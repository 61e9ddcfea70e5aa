"""The process's one patch engine, once installed: where a hook that learns of a class only at run
time (the loaded model's, for embed/head sharing) asks for it to be patched too. Its own module, so
the tables (``model_runner``) reach the engine without importing the package that imports them."""

from __future__ import annotations

from .engine import PatchEngine
from .spec import Phase

_engine: PatchEngine | None = None
_model_phases: tuple[Phase, ...] = ()


def install(phases: tuple[Phase, ...], model_phases: tuple[Phase, ...], warn=None) -> PatchEngine:
    """Create the process's engine for ``phases`` and register its post-import hooks (once)."""
    global _engine, _model_phases
    if _engine is None:
        _engine, _model_phases = PatchEngine(phases, warn), model_phases
        _engine.install()
    return _engine


def current_engine() -> PatchEngine | None:
    return _engine


def patch_model_class(cls: type) -> None:
    """Trace embed/head sharing on a model class loaded at run time (any architecture)."""
    if _engine is not None:
        _engine.patch_class(cls, _model_phases)
