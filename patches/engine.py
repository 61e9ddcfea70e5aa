"""The one engine that applies the phase tables: post-import hooks, resolution, wrapping, undo.

* Post-import: a target module is patched the moment its body finishes executing (wrapt's
  post-import hooks), before any other module can ``from X import f`` a copy of a target.
* Late (module already imported): the wrapper also replaces every module-level alias of the
  original, and a target captured as a default argument is reported (it cannot be reached).
* Descriptors keep their kind (the raw attribute is read from the MRO's ``__dict__``);
  inherited methods are wrapped on the named class only; nothing is wrapped twice.
* Everything inside a hook is caught: an exception there would fail SGLang's own import.
* It owns every patch it applied and its undo: ``unapply(predicate)`` puts the originals back on
  their owners, on the aliases it repointed, and on copies modules made after patching.
* ``dry_run()`` resolves every phase the same way without patching (``phasetrace doctor``).
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
    wrapper: Callable  # the function we set (inside a staticmethod/classmethod where the original was)
    aliases: list[tuple[types.ModuleType, str]] = field(default_factory=list)  # copies repointed when wrapped


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


def function_of(raw: Any) -> Callable | None:
    func = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    return func if inspect.isfunction(func) else None


# What the engine does with a candidate (its dry run, ``phasetrace doctor``).
USED, FALLBACK, MISSING, NO_MODULE, IMPORT_ERROR, NOT_FUNCTION, RUN_TIME = (
    "used",
    "fallback",
    "missing",
    "no module",
    "import error",
    "not a function",
    "run time",
)
NONE = "·"  # a phase with no candidate wrapped, in a coverage cell


@dataclass
class Candidate:
    target: str
    state: str  # one of USED … RUN_TIME
    detail: str = ""
    defined: str | None = None  # "module:Qual.name" of the function's definition (a base class, a re-export)


@dataclass
class Plan:
    """One phase as the engine would patch it in this process: each candidate's fate, and what is
    wrapped (for ``"*:attr"`` targets: on the sample model classes, else nothing before run time)."""

    phase: Phase
    candidates: list[Candidate]
    wrapped: list[str]

    @property
    def status(self) -> str:
        """``ok`` (a target will be wrapped), ``run time`` (model classes), or ``missing``."""
        states = {c.state for c in self.candidates}
        return "ok" if USED in states else RUN_TIME if RUN_TIME in states else "missing"

    @property
    def cell(self) -> str:
        return cell(self.phase, self.wrapped)


def choose(phase: Phase, resolves: Callable[[str], bool]) -> list[str]:
    """The candidates the engine wraps, given which resolve: ``first`` the first, ``all`` each."""
    chosen = [t for t in phase.targets if resolves(t)]
    return chosen[:1] if phase.mode == "first" else chosen


def letter(index: int) -> str:
    """Candidates are named A, B, C… in their order in the table (docs/coverage.md, doctor)."""
    return chr(ord("A") + index)


def cell(phase: Phase, wrapped: Iterable[str]) -> str:
    """The letters of the candidates wrapped (``A+C``), or ``·``."""
    wrapped = set(wrapped)
    return "+".join(letter(i) for i, t in enumerate(phase.targets) if t in wrapped) or NONE


class PatchEngine:
    def __init__(self, phases: Iterable[Phase], warn: Callable[[str], None] | None = None) -> None:
        self.phases = tuple(phases)
        self.warn = warn or (lambda message: log.warning("sglang-phasetrace: %s", message))
        self.applied: dict[tuple[int, str], Applied] = {}
        self.claimed: dict[str, str] = {}  # phase name -> target ("first" phases)
        self.failed: dict[str, set[str]] = {}  # phase name -> candidates that cannot resolve
        self.reported: set[str] = set()
        self.lock = threading.RLock()
        self._unswept: dict[int, tuple[Callable, Callable, Applied]] = {}  # id(func) -> wrapped, not yet swept
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
            self.warn(
                f"phase {phase.name!r} not traced: no target resolves in this SGLang (tried {', '.join(phase.targets)})"
            )

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
        func = function_of(found.raw)
        if func is None:
            self.warn(f"{target}: not a function ({type(found.raw).__name__}); not traced")
            return False
        if key in self.applied or getattr(func, MARK, None) == phase.name:
            return True  # already ours (here, or inherited from a patched base)
        is_method = isinstance(found.owner, type) and not isinstance(found.raw, staticmethod)
        wrapper = make_wrapper(phase, func, target, is_method)
        raw = type(found.raw)(wrapper) if isinstance(found.raw, (staticmethod, classmethod)) else wrapper
        setattr(found.owner, found.attr, raw)
        applied = Applied(phase, target, found.owner, found.attr, found.raw if found.own else None, wrapper)
        if isinstance(found.owner, types.ModuleType):
            self._unswept[id(func)] = (func, wrapper, applied)
        self.applied[key] = applied
        return True

    def _repoint(self, package: str | None) -> None:
        """One sweep for all module-level functions just wrapped: replace ``from X import f``
        copies, and report copies frozen into default arguments (those cannot be reached).
        ``package`` limits the sweep to one top-level package (plus ``__main__``)."""
        pending, self._unswept = self._unswept, {}
        swaps = {key: (func, wrapper) for key, (func, wrapper, _) in pending.items()}

        def captured(original: Any, holder: types.FunctionType) -> None:
            self.warn(
                f"{pending[id(original)][2].target} is captured as a default argument of "
                f"{holder.__module__}.{holder.__qualname__}; calls through it are not traced"
            )

        for module, name, original in _sweep(swaps, package, captured):
            pending[id(original)][2].aliases.append((module, name))

    def patch_class(self, cls: type, phases: Iterable[Phase]) -> None:
        """Wrap ``"*:attr"`` targets on a class found at run time (e.g. the loaded model's class)."""
        with self.lock:
            for phase in phases:
                for target in phase.targets:
                    found = resolve(cls, split(target)[1])
                    if found is not None:
                        self.wrap(phase, f"{cls.__module__}:{cls.__qualname__}.{found.attr}", found)

    # -- undoing -------------------------------------------------------------------------------
    def unapply(self, predicate: Callable[[Phase], bool] = lambda phase: True, *, wait: bool = True) -> int:
        """Take off the patches of phases matching ``predicate``; return how many.

        The original goes back on its owner and on the copies repointed when it was wrapped, now;
        then one pass over every module namespace restores the copies modules made of a wrapper
        *after* it was set (``from X import f`` or ``import *`` run later: ``torch.distributed``
        re-exports the c10d collectives that way, and SGLang's scheduler loop calls them through
        it). That pass costs tens of ms at 200 k names: ``wait=False`` runs it on a daemon thread
        (bootstrap, at ready); a call through a copy before it ends is counted as a runtime call."""
        with self.lock:
            undone = [self.applied.pop(k) for k in [k for k, a in self.applied.items() if predicate(a.phase)]]
            for a in undone:
                if a.original is not None:
                    setattr(a.owner, a.attr, a.original)
                else:
                    delattr(a.owner, a.attr)
                for module, name in a.aliases:
                    if getattr(module, name, None) is a.wrapper:
                        setattr(module, name, a.wrapper.__wrapped__)
                if a.phase.mode == "first":
                    self.claimed.pop(a.phase.name, None)
        swaps = {id(a.wrapper): (a.wrapper, a.wrapper.__wrapped__) for a in undone}
        if swaps and wait:
            _sweep(swaps)
        elif swaps:
            threading.Thread(target=_sweep, args=(swaps,), name="phasetrace-unpatch", daemon=True).start()
        return len(undone)

    def dry_run(
        self,
        phases: Iterable[Phase] | None = None,
        model_classes: Iterable[str] = (),
        import_module: Callable[[str], types.ModuleType] = importlib.import_module,
    ) -> list[Plan]:
        """Resolve every phase the way ``install`` would, patching nothing: each candidate's module
        is imported (once), its target resolved along the MRO and checked to be a function, and the
        candidates chosen by the phase's mode. ``"*:attr"`` targets are resolved on
        ``model_classes`` (``"module:Qual"``), the classes a run would load."""
        modules: dict[str, tuple[Any, str, str]] = {}

        def load(name: str) -> tuple[Any, str, str]:
            if name not in modules:
                try:
                    modules[name] = (import_module(name), "", "")
                except ModuleNotFoundError as exc:
                    modules[name] = (None, NO_MODULE, exc.name or name)
                except Exception as exc:  # SGLang modules can fail to import without a GPU, etc.
                    modules[name] = (None, IMPORT_ERROR, f"{type(exc).__name__}: {str(exc)[:200]}")
            return modules[name]

        def find(target: str) -> tuple[Callable | None, Candidate]:
            module_name, qualname = split(target)
            module, state, detail = load(module_name)
            if module is None:
                return None, Candidate(target, state, detail)
            found = resolve(module, qualname)
            if found is None:
                return None, Candidate(target, MISSING, f"{qualname} not found in {module_name}")
            func = function_of(found.raw)
            if func is None:
                return None, Candidate(target, NOT_FUNCTION, type(found.raw).__name__)
            defined = f"{func.__module__}:{func.__qualname__}"
            return func, Candidate(target, USED, "" if defined == target else f"defined as {defined}", defined)

        samples = []
        for spec in model_classes:
            module_name, qualname = split(spec)
            owner = load(module_name)[0]
            for part in qualname.split(".") if owner is not None else ():
                owner = getattr(owner, part, None)
            if isinstance(owner, type):
                samples.append(owner)
        plans = []
        for phase in self.phases if phases is None else phases:
            candidates, resolving = [], set()
            for target in phase.targets:
                module_name, attr = split(target)
                if module_name == "*":
                    candidate = Candidate(target, RUN_TIME, "resolved on the model classes loaded at run time")
                    if any(function_of(r.raw) for r in (resolve(k, attr) for k in samples) if r is not None):
                        resolving.add(target)
                else:
                    func, candidate = find(target)
                    if func is not None:
                        resolving.add(target)
                candidates.append(candidate)
            wrapped = choose(phase, resolving.__contains__)
            for i, c in enumerate(candidates):
                if c.state == USED and c.target not in wrapped:
                    candidates[i] = Candidate(c.target, FALLBACK, "resolves, but an earlier candidate wins", c.defined)
            plans.append(Plan(phase, candidates, wrapped))
        return plans

    def resolved(self) -> dict[str, list[str]]:
        """Phase name -> targets wrapped in this process."""
        out: dict[str, list[str]] = {}
        for a in self.applied.values():
            out.setdefault(a.phase.name, []).append(a.target)
        return out


Captured = Callable[[Any, types.FunctionType], None]


def _sweep(
    swaps: dict[int, tuple[Any, Any]], package: str | None = None, captured: Captured | None = None
) -> list[tuple[types.ModuleType, str, Any]]:
    """One pass over module namespaces: every name bound to an ``old`` of ``swaps`` (``id(old) ->
    (old, new)``, by identity) is rebound to its ``new``; returns ``(module, name, old)`` for each.
    ``package``: that top-level package (and ``__main__``) only. ``captured(old, function)``: also
    called for each module-level function holding an ``old`` as a default argument (unreachable)."""
    ids = frozenset(swaps)
    replaced = []
    for module_name, module in list(sys.modules.items()):
        if package is not None and module_name.partition(".")[0] not in (package, "__main__"):
            continue
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        try:
            if captured is None and ids.isdisjoint(map(id, namespace.values())):
                continue  # the common case, checked in C
            for name, value in list(namespace.items()):
                hit = swaps.get(id(value))
                if hit is not None and hit[0] is value:
                    setattr(module, name, hit[1])
                    replaced.append((module, name, value))
                # ``type() is``, not isinstance(): that reads ``__class__``, which warns on some
                # module attributes (``torch.distributed.reduce_op``) and fails under ``-W error``.
                elif (
                    captured is not None
                    and type(value) is types.FunctionType
                    and (value.__defaults__ or value.__kwdefaults__)
                ):
                    for default in _defaults(value):
                        hit = swaps.get(id(default))
                        if hit is not None and hit[0] is default:
                            captured(default, value)
        except RuntimeError:  # the namespace changed under us (an import on another thread): skip it
            continue
    return replaced


def _defaults(func: Callable) -> tuple:
    return (func.__defaults__ or ()) + tuple((func.__kwdefaults__ or {}).values())


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
