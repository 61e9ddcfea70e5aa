"""Every dotted ``tracing.…`` name in a comment, a docstring or ``docs/`` names something that exists:
modules move, and a name left pointing at the old place sends the next reader looking for nothing."""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

from conftest import ROOT

PKG = "sglang_phasetrace"
NAME = re.compile(r"(?<![\w.])(?:sglang_phasetrace\.)?(tracing(?:\.\w+)+)")
CODE = ("tracing", "patches", "sitecustomize_hooks", "scripts", "tests")


def _python_prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of each comment and docstring of a Python file."""
    source = path.read_text()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    yield first.lineno, first.value.value


def _prose() -> Iterator[tuple[str, int, str]]:
    for top in CODE:
        for path in sorted((ROOT / top).rglob("*.py")):
            for line, text in _python_prose(path):
                yield str(path.relative_to(ROOT)), line, text
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for line, text in enumerate(path.read_text().splitlines(), 1):
            yield str(path.relative_to(ROOT)), line, text


def _resolves(dotted: str) -> bool:
    """The longest importable prefix, then attributes; a field declared without a default counts."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join([PKG, *parts[:cut]]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            fields = getattr(obj, "__dataclass_fields__", None) or getattr(obj, "__struct_fields__", ())
            if hasattr(obj, attr):
                obj = getattr(obj, attr)
            elif attr in fields or attr in getattr(obj, "__annotations__", {}):
                return True
            else:
                return False
        return True
    return False


def test_every_dotted_tracing_name_resolves() -> None:
    names = [
        (where, line + text.count("\n", 0, m.start()), m[1])
        for where, line, text in _prose()
        for m in NAME.finditer(text)
    ]
    assert len(names) > 40, "the scan finds the names it is meant to check"
    unresolved = sorted({f"{where}:{line}: {name}" for where, line, name in names if not _resolves(name)})
    assert not unresolved, "names of nothing:\n" + "\n".join(unresolved)
