"""The one engine that applies the phase tables: post-import hooks, resolution, wrapping, undo.

* Post-import: a target module is patched the moment its body finishes executing (wrapt's
  post-import hooks), before any other module can ``from X import f`` a copy of a target.
* Late (module already imported): the wrapper also replaces every module-level alias of the
  original, and a target captured as a default argument is reported (it cannot be reached).
* Descriptors keep their kind (the raw attribute is read from the MRO's ``__dict__``);
  inherited methods are wrapped on the named class only; nothing is wrapped twice.
* Everything inside a hook is caught: an exception there would fail SGLang's own import.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import sys
import threading
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .spec import Phase, split
from .wrappers import MARK, make_wrapper

log = logging.getLogger("sglang_phasetrace")


@dataclass
class Applied:
    phase: Phase
    target: str
    owner: Any  # module or class the wrapper was set on
    attr: str
    original: Any  # raw attribute that was there, or None when it was inherited
    aliases: list[tuple[types.ModuleType, str]] = field(default_factory=list)


@dataclass
class Resolved:
    owner: Any
    attr: str
    raw: Any
    own: bool  # defined on owner itself (not inherited)


def resolve(root: Any, qualname: str) -> Resolved | None:
    *path, attr = qualname.split(".")
    owner = root
    for part in path:
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if attr in vars(klass):
                return Resolved(owner, attr, vars(klass)[attr], klass is owner)
        return None
    namespace = getattr(owner, "__dict__", {})
    return Resolved(owner, attr, namespace[attr], True) if attr in namespace else None


def _function_of(raw: Any) -> Callable | None:
    func = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    return func if inspect.isfunction(func) else None


class PatchEngine:
    def __init__(self, phases: Iterable[Phase], warn: Callable[[str], None] | None = None) -> None:
        self.phases = tuple(phases)
        self.warn = warn or (lambda message: log.warning("sglang-phasetrace: %s", message))
        self.applied: dict[tuple[int, str], Applied] = {}
        self.claimed: dict[str, str] = {}  # phase name -> target ("first" phases)
        self.failed: dict[str, set[str]] = {}  # phase name -> candidates that cannot resolve
        self.reported: set[str] = set()
        self.lock = threading.RLock()
        self._unswept: dict[int, tuple[Callable, Callable, Applied]] = {}  # wrapped, aliases not yet swept
        self.modules: dict[str, list[Phase]] = {}
        for phase in self.phases:
            for target in phase.targets:
                module = split(target)[0]
                if module != "*" and phase not in self.modules.setdefault(module, []):
                    self.modules[module].append(phase)

    # -- installation --------------------------------------------------------------------------
    def install(self) -> None:
        """Register a post-import hook per target module (runs now for modules already imported)."""
        import wrapt

        for module in self.modules:
            if module in sys.modules:
                self._guarded(module, late=True)
            else:
                wrapt.register_post_import_hook(lambda m: self._guarded(m.__name__, late=False), module)

    def _guarded(self, name: str, late: bool) -> None:
        try:
            self.apply_module(name, late)
        except Exception as exc:  # never fail the import
            log.warning("sglang-phasetrace: patching %s failed: %r", name, exc)

    # -- applying ------------------------------------------------------------------------------
    def apply_module(self, name: str, late: bool = True) -> None:
        """Wrap the targets of module ``name``. ``late``: it was imported before we were installed,
        so copies of its functions may be anywhere; else only its own package can hold one (a
        circular import during its execution), and the alias sweep stays there."""
        with self.lock:
            for phase in self.modules.get(name, ()):
                if phase.mode == "all":
                    for target in phase.targets:
                        if split(target)[0] == name:
                            self._try(phase, target)
                else:
                    self._apply_first(phase)
            if self._unswept:
                self._repoint(None if late else name.partition(".")[0])

    def _apply_first(self, phase: Phase) -> None:
        """Walk candidates in order; a later one may win only once every earlier one cannot."""
        failed = self.failed.setdefault(phase.name, set())
        for target in phase.targets:
            if phase.name in self.claimed:
                return
            if target in failed:
                continue
            module = split(target)[0]
            if module not in sys.modules:
                if not _importable(module):
                    failed.add(target)
                    continue
                try:  # an earlier candidate must be decided first; its own hook decides it
                    importlib.import_module(module)
                except Exception:
                    failed.add(target)
                continue
            if not self._try(phase, target):
                failed.add(target)
        if phase.name not in self.claimed and failed.issuperset(phase.targets):
            self.report_unresolved(phase)

    def report_unresolved(self, phase: Phase) -> None:
        """One warning per required phase; an optional phase absent from this release is normal
        (e.g. ``Scheduler.init_memory_pools`` before 0.5.14): its trace simply lacks it."""
        if not phase.required:
            log.debug("sglang-phasetrace: phase %r absent from this SGLang", phase.name)
        elif phase.name not in self.reported:
            self.reported.add(phase.name)
            self.warn(f"phase {phase.name!r} not traced: no target resolves in this SGLang "
                      f"(tried {', '.join(phase.targets)})")

    def _try(self, phase: Phase, target: str) -> bool:
        module_name, qualname = split(target)
        module = sys.modules.get(module_name)
        found = resolve(module, qualname) if module is not None else None
        if found is None:
            return False
        if self.wrap(phase, target, found):
            if phase.mode == "first":
                self.claimed[phase.name] = target
            return True
        return False

    def wrap(self, phase: Phase, target: str, found: Resolved) -> bool:
        key = (id(found.owner), found.attr)
        func = _function_of(found.raw)
        if func is None:
            self.warn(f"{target}: not a function ({type(found.raw).__name__}); not traced")
            return False
        if key in self.applied or getattr(func, MARK, None) == phase.name:
            return True  # already ours (here, or inherited from a patched base)
        is_method = isinstance(found.owner, type) and not isinstance(found.raw, staticmethod)
        wrapper = make_wrapper(phase, func, target, is_method)
        raw = type(found.raw)(wrapper) if isinstance(found.raw, (staticmethod, classmethod)) else wrapper
        setattr(found.owner, found.attr, raw)
        applied = Applied(phase, target, found.owner, found.attr, found.raw if found.own else None)
        if isinstance(found.owner, types.ModuleType):
            self._unswept[id(func)] = (func, wrapper, applied)
        self.applied[key] = applied
        return True

    def _repoint(self, package: str | None) -> None:
        """One sweep for all module-level functions just wrapped: replace ``from X import f``
        copies, and report copies frozen into default arguments (those cannot be reached).
        ``package`` limits the sweep to one top-level package (plus ``__main__``)."""
        pending, self._unswept = self._unswept, {}
        for module_name, module in list(sys.modules.items()):
            if package is not None and module_name.partition(".")[0] not in (package, "__main__"):
                continue
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            for name, value in list(namespace.items()):
                hit = pending.get(id(value))
                if hit is not None and hit[0] is value:
                    setattr(module, name, hit[1])
                    hit[2].aliases.append((module, name))
                # ``type() is``, not isinstance(): that reads ``__class__``, which warns on some
                # module attributes (``torch.distributed.reduce_op``) and fails under ``-W error``.
                elif type(value) is types.FunctionType and (value.__defaults__ or value.__kwdefaults__):
                    for default in _defaults(value):
                        captured = pending.get(id(default))
                        if captured is not None and captured[0] is default:
                            self.warn(f"{captured[2].target} is captured as a default argument of "
                                      f"{value.__module__}.{value.__qualname__}; calls through it are not traced")

    def patch_class(self, cls: type, phases: Iterable[Phase]) -> None:
        """Wrap ``"*:attr"`` targets on a class found at run time (e.g. the loaded model's class)."""
        with self.lock:
            for phase in phases:
                for target in phase.targets:
                    found = resolve(cls, split(target)[1])
                    if found is not None:
                        self.wrap(phase, f"{cls.__module__}:{cls.__qualname__}.{found.attr}", found)

    # -- undoing -------------------------------------------------------------------------------
    def unapply(self, predicate: Callable[[Phase], bool] = lambda phase: True) -> int:
        """Restore the originals of applied phases matching ``predicate``; return how many."""
        with self.lock:
            undone = [k for k, a in self.applied.items() if predicate(a.phase)]
            for key in undone:
                a = self.applied.pop(key)
                if a.original is not None:
                    setattr(a.owner, a.attr, a.original)
                else:
                    delattr(a.owner, a.attr)
                for module, name in a.aliases:
                    current = getattr(module, name, None)
                    if getattr(current, MARK, None) == a.phase.name:
                        setattr(module, name, _function_of(a.original) or a.original)
                if a.phase.mode == "first":
                    self.claimed.pop(a.phase.name, None)
            return len(undone)

    def resolved(self) -> dict[str, list[str]]:
        """Phase name -> targets wrapped in this process."""
        out: dict[str, list[str]] = {}
        for a in self.applied.values():
            out.setdefault(a.phase.name, []).append(a.target)
        return out


def _defaults(func: Callable) -> tuple:
    return (func.__defaults__ or ()) + tuple((func.__kwdefaults__ or {}).values())


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
