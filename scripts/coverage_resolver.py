"""Which candidate of each phase resolves in an SGLang release, read from its sources, not imported.

Tooling (``scripts/coverage.py``, the coverage tests), not part of the installed package. The
rules are the engine's, over the same tables: a module resolves when its source exists (the
engine: when it is importable); ``Qual.name`` is walked attribute by attribute, a class attribute
through the class's bases (the engine reads the MRO's ``__dict__``), a module attribute through
``from X import name`` and ``import *``; it must be a function (``staticmethod``/``classmethod``
kept; ``property`` and caches are not); the candidates are chosen by the engine's own ``choose``
(``"first"``: the first that resolves, ``"all"``: every one). Nothing is imported, so releases
that need a GPU to import can be checked, all 35 of them, in seconds. ``"*:attr"`` targets are
checked on ``patches.MODEL_CLASSES``, as ``phasetrace doctor`` does.
"""

from __future__ import annotations

import ast
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sglang_phasetrace.patches import MODEL_CLASSES, table_phases
from sglang_phasetrace.patches.engine import NONE, cell, choose, letter
from sglang_phasetrace.patches.spec import Phase, split

# Every base release from 0.4.0 to 0.5.23 on PyPI (0.5.0 was never published).
RELEASES = (*(f"0.4.{i}" for i in range(11)), "0.4.10.post2", *(f"0.5.{i}" for i in range(1, 24)))
_NOT_FUNCTION_DECORATORS = {"property", "cached_property", "setter", "getter", "deleter", "lru_cache", "cache"}
__all__ = ["NONE", "RELEASES", "Sources", "cell", "letter", "table_phases", "wrapped"]


@dataclass
class _Def:
    """A function definition and where it lives."""

    module: str
    qualname: str
    node: ast.FunctionDef | ast.AsyncFunctionDef


@dataclass
class _Class:
    module: str
    qualname: str
    node: ast.ClassDef
    names: dict[str, object] = field(default_factory=dict)


@dataclass
class _Module:
    name: str
    is_package: bool
    names: dict[str, object] = field(default_factory=dict)
    stars: list[str] = field(default_factory=list)


@dataclass
class _Ref:
    """``from X import y`` / ``import X``: a dotted path from the top of the import system."""

    dotted: str


@dataclass
class _Expr:
    """An assignment's value, evaluated in its scope when asked for."""

    module: str
    klass: _Class | None
    node: ast.expr


Value = _Def | _Class | _Module | None


class Sources:
    """One release's ``.py`` sources (a wheel, or an installed ``site-packages``), indexed lazily."""

    def __init__(self, read: Callable[[str], str | None], is_dir: Callable[[str], bool], label: str) -> None:
        self._read, self._is_dir = read, is_dir
        self.label = label
        self._modules: dict[str, _Module | None] = {}

    @classmethod
    def wheel(cls, path: str | Path) -> Sources:
        archive = zipfile.ZipFile(path)
        names = set(archive.namelist())
        dirs = {name.rsplit("/", i)[0] for name in names for i in range(1, name.count("/") + 1)}
        return cls(lambda p: archive.read(p).decode() if p in names else None, dirs.__contains__, Path(path).name)

    @classmethod
    def directory(cls, root: str | Path) -> Sources:
        """``root`` holds the ``sglang`` package (a ``site-packages``)."""
        root = Path(root)

        def read(p: str) -> str | None:
            f = root / p
            return f.read_text(encoding="utf-8") if f.is_file() else None

        return cls(read, lambda p: (root / p).is_dir(), str(root))

    def resolves(self, target: str) -> bool:
        return self.module(split(target)[0]) is not None and self.resolve(target) is not None

    def module(self, name: str) -> _Module | None:
        if name not in self._modules:
            self._modules[name] = None  # an import cycle sees no module, not a loop
            self._modules[name] = self._load(name)
        return self._modules[name]

    def _load(self, name: str) -> _Module | None:
        base = name.replace(".", "/")
        for path, is_package in ((f"{base}.py", False), (f"{base}/__init__.py", True)):
            text = self._read(path)
            if text is not None:
                module = _Module(name, is_package)
                try:
                    self._bind(module, ast.parse(text, path).body, module.names, None)
                except SyntaxError:
                    pass
                return module
        # A directory without __init__.py is a namespace package (``sglang.srt`` is one).
        return _Module(name, True) if self._is_dir(base) else None

    def _bind(self, module: _Module, body: list[ast.stmt], names: dict[str, object], klass: _Class | None) -> None:
        """The names a block binds at run time (both arms of ``if``/``try``; not ``if TYPE_CHECKING``)."""
        prefix = f"{klass.qualname}." if klass else ""
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names[node.name] = _Def(module.name, prefix + node.name, node)
            elif isinstance(node, ast.ClassDef):
                inner = _Class(module.name, prefix + node.name, node)
                self._bind(module, node.body, inner.names, inner)
                names[node.name] = inner
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(module, node.module, node.level)
                for alias in node.names:
                    if alias.name == "*":
                        module.stars.append(source)
                    else:
                        names[alias.asname or alias.name] = _Ref(f"{source}.{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    names[alias.asname or alias.name.partition(".")[0]] = _Ref(
                        alias.name if alias.asname else alias.name.partition(".")[0]
                    )
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Name):
                        names[target.id] = _Expr(module.name, klass, node.value)
            elif isinstance(node, ast.If):
                if not _is_type_checking(node.test):
                    self._bind(module, node.body, names, klass)
                self._bind(module, node.orelse, names, klass)
            elif isinstance(node, ast.Try):
                for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                    self._bind(module, block, names, klass)
            elif isinstance(node, ast.With):
                self._bind(module, node.body, names, klass)

    # -- resolution ----------------------------------------------------------------------------
    def resolve(self, target: str) -> str | None:
        """Where ``target`` is defined (``"module:Qual.name"``) when the engine would wrap it."""
        found = self.function(target)
        return f"{found.module}:{found.qualname}" if found else None

    def function(self, target: str) -> _Def | None:
        """The definition the engine would wrap for ``target`` (its ``node`` has the signature)."""
        module_name, qualname = split(target)
        value: Value = self.module(module_name)
        for part in qualname.split("."):
            value = self._attr(value, part) if isinstance(value, (_Module, _Class)) else None
        return value if isinstance(value, _Def) and _is_function(value.node) else None

    def text(self, module: str) -> str | None:
        base = module.replace(".", "/")
        return self._read(f"{base}.py") or self._read(f"{base}/__init__.py")

    def _attr(self, owner: _Module | _Class, name: str, depth: int = 0) -> Value:
        """``getattr(owner, name)``: a class through its bases; a module through its own names,
        its ``import *`` sources, then its submodules."""
        if depth > 16:
            return None
        if isinstance(owner, _Class):
            for klass in self._mro(owner):
                if name in klass.names:
                    return self._deref(klass.names[name], depth + 1)
            return None
        if name in owner.names:
            return self._deref(owner.names[name], depth + 1)
        for star in owner.stars:
            source = self.module(star)
            found = self._attr(source, name, depth + 1) if source else None
            if found is not None:
                return found
        return self.module(f"{owner.name}.{name}") if owner.is_package else None

    def _deref(self, binding: object, depth: int) -> Value:
        if depth > 16:
            return None
        if isinstance(binding, (_Def, _Class, _Module)):
            return binding
        if isinstance(binding, _Ref):
            head, *rest = binding.dotted.split(".")
            value: Value = self.module(head)
            for part in rest:
                value = self._attr(value, part, depth + 1) if isinstance(value, (_Module, _Class)) else None
            return value
        if isinstance(binding, _Expr):
            return self._eval(binding.node, binding.module, binding.klass, depth + 1)
        return None

    def _eval(self, node: ast.expr, module: str, klass: _Class | None, depth: int) -> Value:
        """The few expressions that name a function or class: ``f``, ``a.b.f``, ``staticmethod(f)``."""
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and len(node.args) == 1
            and node.func.id in ("staticmethod", "classmethod")
        ):
            return self._eval(node.args[0], module, klass, depth + 1)
        if isinstance(node, ast.Name):
            if klass is not None and node.id in klass.names:
                return self._deref(klass.names[node.id], depth + 1)
            owner = self.module(module)
            return self._attr(owner, node.id, depth + 1) if owner else None
        if isinstance(node, ast.Attribute):
            value = self._eval(node.value, module, klass, depth + 1)
            return self._attr(value, node.attr, depth + 1) if isinstance(value, (_Module, _Class)) else None
        return None

    def _mro(self, klass: _Class) -> list[_Class]:
        """Depth-first, left to right, each class once: enough to say whether and where an
        attribute is defined; bases outside the sources (torch, stdlib) hold nothing we patch."""
        order: list[_Class] = []
        stack = [klass]
        while stack and len(order) < 64:
            k = stack.pop()
            if any(k is seen for seen in order):
                continue
            order.append(k)
            bases = [self._eval(expr, k.module, None, 0) for expr in k.node.bases]
            stack.extend(reversed([b for b in bases if isinstance(b, _Class)]))
        return order


def wrapped(phase: Phase, resolves: Callable[[str], bool]) -> list[str]:
    """The candidates of ``phase`` the engine wraps, given which ``"module:Qual"`` targets resolve
    (read from sources here). ``"*:attr"`` asks each of ``MODEL_CLASSES``."""

    def resolves_any(target: str) -> bool:
        module, attr = split(target)
        return any(resolves(f"{m}.{attr}") for m in MODEL_CLASSES) if module == "*" else resolves(target)

    return choose(phase, resolves_any)


def _absolute(module: _Module, name: str | None, level: int) -> str:
    if not level:
        return name or ""
    package = module.name.split(".")
    package = package if module.is_package else package[:-1]
    package = package[: len(package) - (level - 1)]
    return ".".join([*package, *([name] if name else [])])


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _is_function(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for decorator in node.decorator_list:
        d = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", "")
        if name in _NOT_FUNCTION_DECORATORS:
            return False
    return True
