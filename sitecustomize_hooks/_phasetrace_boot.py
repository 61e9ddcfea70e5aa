"""Hand-over to ``sglang_phasetrace.tracing.bootstrap``, loaded by ``sitecustomize`` on the first
``import sglang`` (before any SGLang module body runs), never earlier: processes that never import
SGLang do not load it. Stdlib-only.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import time
import types

BOOT_NS = time.time_ns()  # replaced by sitecustomize's earlier reading in activate()
_HOOKS_DIR = os.path.dirname(os.path.abspath(__file__))


def activate(boot_ns: int) -> None:
    global BOOT_NS
    BOOT_NS = boot_ns
    _package().tracing.bootstrap.activate(boot_ns=boot_ns)


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
