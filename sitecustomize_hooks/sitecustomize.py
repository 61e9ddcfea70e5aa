"""sglang-phasetrace: put this folder on PYTHONPATH to trace SGLang startup in every process.

Runs in every Python process started under it, most of which never import SGLang, so it imports
nothing that ``site`` has not already imported (``os``, ``sys``, ``time``) and does no work up front:
one ``sys.meta_path`` entry that wakes on the first ``import sglang`` and only then loads
``_phasetrace_boot``; then the ``sitecustomize`` this one shadows runs, as Python would have run it.
"""

import os
import sys
import time

BOOT_NS = time.time_ns()  # the closest cheap stand-in for "process start"
HOOKS_DIR = os.path.dirname(os.path.abspath(__file__))


def warn(message):
    sys.stderr.write(f"sglang-phasetrace: {message}\n")


def activate():
    """Load the boot module from this folder (whatever ``sys.path`` is by now) and activate tracing."""
    boot = sys.modules.get("_phasetrace_boot")
    if boot is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "_phasetrace_boot", os.path.join(HOOKS_DIR, "_phasetrace_boot.py")
        )
        boot = importlib.util.module_from_spec(spec)
        sys.modules["_phasetrace_boot"] = boot
        spec.loader.exec_module(boot)
    boot.activate(BOOT_NS)


class _FirstSglangImport:
    """Meta-path finder that fires once, on the first ``sglang`` import, and never finds anything."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "sglang" or fullname.startswith("sglang."):
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            try:
                activate()
            except Exception as exc:  # never fail SGLang's import
                warn(f"tracing disabled: {exc!r}")
        return None


def install():
    if os.environ.get("SGLANG_PHASETRACE", "1").strip().lower() in ("0", "false", "off", "no"):
        return
    if "sglang" in sys.modules:  # imported before site ran (unusual): activate now
        activate()
    elif not any(type(finder).__name__ == "_FirstSglangImport" for finder in sys.meta_path):
        sys.meta_path.insert(0, _FirstSglangImport())


def chain_sitecustomize():
    """Import the ``sitecustomize`` this one shadows (a venv's, a distro's) through the ordinary
    import system, with this folder off ``sys.path`` for that one import; ours, when shadowed in
    turn, stays reachable as ``_phasetrace_sitecustomize``."""
    ours = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in saved if os.path.abspath(p or os.curdir) != HOOKS_DIR]
    try:
        __import__("sitecustomize")
    except ModuleNotFoundError as exc:
        if exc.name != "sitecustomize":
            warn(f"the shadowed sitecustomize failed: {exc!r}")
    except Exception as exc:
        warn(f"the shadowed sitecustomize failed: {exc!r}")
    finally:
        sys.path[:] = saved
        if ours is not None and sys.modules.setdefault("sitecustomize", ours) is not ours:
            sys.modules["_phasetrace_sitecustomize"] = ours


try:
    install()
except Exception as exc:  # never raise into the host process
    warn(f"tracing disabled: {exc!r}")
chain_sitecustomize()
