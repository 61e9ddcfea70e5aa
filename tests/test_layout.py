"""The layout's rule, checked on the code and on a real traced rank: what runs in every SGLang rank
is the recorder; judgement lives in the readers.

* Static: the import graph of ``tracing/``, ``patches/`` and ``sitecustomize_hooks/`` (every import:
  module level, inside functions, under ``TYPE_CHECKING``) has no circle, and no module imports a
  layer above its own (``LAYERS``, lowest first).
* Live: a rank of a real traced ``sglang.Engine`` (tp=2 on CPU) has, once ready, imported no module
  of the reader or verdict side (``tests/plants``: each rank writes its ``sys.modules`` then).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import ROOT

PKG = "sglang_phasetrace"
# lowest first; a module may import its own layer and those below it
LAYERS = (
    ("tracing.keys", "tracing.redact", "tracing.files", "tracing.other_processes", "tracing.process_state"),
    ("tracing.journal",),
    ("tracing.recorder",),
    ("tracing.reader",),
    ("tracing.channel",),
    ("tracing.history",),
    ("tracing.verdicts",),
    ("tracing.render",),
    ("tracing.launcher",),
    ("tracing.cli",),
    ("tracing.phases",),
    ("patches",),
    ("tracing.bootstrap",),
    ("tracing.plugin", "sitecustomize_hooks"),
)
READER_SIDE = (
    "tracing.reader",
    "tracing.channel",
    "tracing.verdicts",
    "tracing.history",
    "tracing.render",
    "tracing.launcher",
    "tracing.cli",
)
# What every traced rank runs: it imports nothing of the reader side, lazily or not (the launcher's
# side is handed to ``tracing.phases`` by ``tracing.bootstrap``, which may import anything).
RANK_SIDE = (
    "tracing.phases",
    "tracing.recorder",
    "tracing.journal.layout",
    "tracing.journal.records",
    "tracing.journal.writer",
    "patches",
    "sitecustomize_hooks",
)


def _layer(module: str) -> int:
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return -1 if module == "tracing" else len(LAYERS)


def _modules() -> dict[str, Path]:
    out = {}
    for top in ("tracing", "patches", "sitecustomize_hooks"):
        for path in (ROOT / top).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imports(modules: dict[str, Path]) -> set[tuple[str, str]]:
    """(importer, imported) for every import of one of ``modules``, wherever it is written."""
    edges = set()
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                elif node.module and node.module.startswith(PKG + "."):
                    base = node.module[len(PKG) + 1 :]
                else:
                    continue
                for alias in node.names:
                    target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    if target in modules and target != name:
                        edges.add((name, target))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    target = alias.name[len(PKG) + 1 :] if alias.name.startswith(PKG + ".") else ""
                    if target in modules and target != name:
                        edges.add((name, target))
    return edges


def test_no_import_runs_upward() -> None:
    upward = sorted((a, b) for a, b in _imports(_modules()) if _layer(b) > _layer(a))
    assert not upward, f"imports of a higher layer: {upward}"


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_rank_side_imports_nothing_of_the_reader_side() -> None:
    """Checked on the code, not only on a run: every import a rank-side module writes, wherever it
    is written (a lazy one in a function that only a launcher calls included)."""
    edges = _imports(_modules())
    wrong = sorted((a, b) for a, b in edges if _within(a, RANK_SIDE) and _within(b, READER_SIDE))
    assert not wrong, f"the rank side imports the reader side: {wrong}"


def test_no_import_circle() -> None:
    graph: dict[str, set[str]] = {}
    for a, b in _imports(_modules()):
        graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                pytest.fail("import circle: " + " -> ".join([*path[path.index(nxt) :], nxt]))
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_the_wheel_carries_every_package() -> None:
    """A folder with an ``__init__.py`` missing from ``packages`` is left out of the wheel: the
    checkout works, the installed tool dies on import (a CI run found it only in test_install)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(tool["packages"])
    on_disk = set()
    for name, folder in tool["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            on_disk.add(".".join([name, *init.parent.relative_to(ROOT / folder).parts]))
    assert on_disk - listed == set(), "add to pyproject.toml's packages"


@pytest.mark.sglang
def test_a_traced_rank_imports_nothing_of_the_reader_side(engine_run) -> None:
    dumps = sorted((engine_run.run_dir.parent / "modules").glob("*.txt"))
    assert len(dumps) == 2, "each of the two ranks writes its modules at ready"
    for dump in dumps:
        ours = [m[len(PKG) + 1 :] for m in dump.read_text().split() if m.startswith(PKG + ".")]
        assert "tracing.recorder.runtime" in ours, "a traced rank"
        judged = [m for m in ours if m.startswith(READER_SIDE)]
        assert not judged, f"rank {dump.stem} imported {judged}"
