"""Interpreter-start bootstrap: arm tracing for the moment SGLang is first imported.

Runs in every Python process that has ``sitecustomize_hooks/`` on PYTHONPATH, so it stays
stdlib-only and does no work up front: it adds one ``sys.meta_path`` finder that wakes on the
first ``import sglang`` (before any SGLang module body runs) and then hands over to
``sglang_phasetrace.tracing.bootstrap``. Processes that never import SGLang pay one list entry.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import time
import types

BOOT_NS = time.time_ns()  # the closest cheap stand-in for "process start"
_HOOKS_DIR = os.path.dirname(os.path.abspath(__file__))


def warn(message: str) -> None:
    sys.stderr.write(f"sglang-phasetrace: {message}\n")


def enabled() -> bool:
    return os.environ.get("SGLANG_PHASETRACE", "1").strip().lower() not in ("0", "false", "off", "no")


class _FirstSglangImport:
    """Meta-path finder that fires once, on the first ``sglang`` import, and never finds anything."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "sglang" or fullname.startswith("sglang."):
            _remove_finder()
            try:
                _package().tracing.bootstrap.activate(boot_ns=BOOT_NS)
            except Exception as exc:  # never fail SGLang's import
                warn(f"tracing disabled: {exc!r}")
        return None


_FINDER = _FirstSglangImport()


def _remove_finder() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


def _package() -> types.ModuleType:
    """Import ``sglang_phasetrace``; from a source checkout, map it onto the repository root."""
    try:
        import sglang_phasetrace.tracing.bootstrap
    except ModuleNotFoundError as exc:
        if exc.name not in ("sglang_phasetrace", "sglang_phasetrace.tracing"):
            raise
        root = os.path.dirname(_HOOKS_DIR)
        spec = importlib.machinery.ModuleSpec("sglang_phasetrace", None, is_package=True)
        spec.submodule_search_locations = [root]
        sys.modules["sglang_phasetrace"] = importlib.util.module_from_spec(spec)
        import sglang_phasetrace.tracing.bootstrap  # noqa: F401
    return sys.modules["sglang_phasetrace"]


def install() -> None:
    if not enabled():
        return
    if "sglang" in sys.modules:  # imported before site ran (unusual): activate now
        _package().tracing.bootstrap.activate(boot_ns=BOOT_NS)
    elif _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def chain_sitecustomize() -> None:
    """Run the ``sitecustomize`` this one shadows (a venv's, a distro's), as Python would have."""
    ours = sys.modules.get("sitecustomize")
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HOOKS_DIR]
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception as exc:
        warn(f"the shadowed sitecustomize failed: {exc!r}")
    finally:
        sys.path[:] = saved
        if ours is not None and sys.modules.get("sitecustomize") is not ours:
            sys.modules["_phasetrace_sitecustomize"] = ours
