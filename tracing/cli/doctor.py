"""``phasetrace doctor``: which patch targets resolve on the installed SGLang, phase by phase."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ..render.doctor_table import doctor_table
from .command import make_console

# Target states: what the patch engine would do with each candidate in this environment.
USED, FALLBACK, UNUSED, MISSING, NO_MODULE, IMPORT_ERROR, NOT_FUNCTION, RUN_TIME = (
    "used",
    "fallback",
    "unused",
    "missing",
    "no module",
    "import error",
    "not a function",
    "run time",
)


@dataclass
class TargetCheck:
    target: str
    state: str
    detail: str = ""


@dataclass
class PhaseCheck:
    phase: str
    mode: str
    required: bool
    targets: list[TargetCheck] = field(default_factory=list)

    @property
    def status(self) -> str:
        """``ok`` (a target will be wrapped), ``run time`` (model classes), or ``missing``."""
        states = {t.state for t in self.targets}
        if USED in states:
            return "ok"
        return RUN_TIME if RUN_TIME in states else "missing"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status}


class Importer:
    """Imports each module once; remembers why one could not be imported."""

    def __init__(self) -> None:
        self.modules: dict[str, Any] = {}

    def get(self, name: str) -> tuple[Any, str]:
        if name not in self.modules:
            try:
                self.modules[name] = (importlib.import_module(name), "")
            except ModuleNotFoundError as exc:
                missing = exc.name or name
                self.modules[name] = (None, f"{NO_MODULE}: {missing}")
            except Exception as exc:  # SGLang modules can fail to import without a GPU, etc.
                self.modules[name] = (None, f"{IMPORT_ERROR}: {type(exc).__name__}: {str(exc)[:200]}")
        return self.modules[name]


def _is_function(raw: Any) -> bool:
    func = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    return inspect.isfunction(func)


def check_phase(phase: Any, importer: Importer) -> PhaseCheck:
    from ...patches.engine import resolve
    from ...patches.spec import split

    check = PhaseCheck(phase.name, phase.mode, phase.required)
    claimed = False
    for target in phase.targets:
        module_name, qualname = split(target)
        if module_name == "*":
            check.targets.append(TargetCheck(target, RUN_TIME, "resolved on the model classes loaded at run time"))
            continue
        module, why = importer.get(module_name)
        if module is None:
            state, _, detail = why.partition(": ")
            check.targets.append(TargetCheck(target, state, detail))
            continue
        found = resolve(module, qualname)
        if found is None:
            check.targets.append(TargetCheck(target, MISSING, f"{qualname} not found in {module_name}"))
        elif not _is_function(found.raw):
            check.targets.append(TargetCheck(target, NOT_FUNCTION, type(found.raw).__name__))
        elif phase.mode == "first" and claimed:
            check.targets.append(TargetCheck(target, FALLBACK, "resolves, but an earlier candidate wins"))
        else:
            claimed = True
            inherited = "" if found.own else f"inherited by {qualname.rsplit('.', 1)[0]}"
            check.targets.append(TargetCheck(target, USED, inherited))
    return check


def coverage_row(importer: Importer) -> dict[str, str]:
    """This release's row of docs/coverage.md, from the imported modules (same rules, live)."""
    from ...patches.coverage import table_row
    from ...patches.engine import resolve
    from ...patches.spec import split

    def resolves(target: str) -> bool:
        module_name, qualname = split(target)
        module = importer.get(module_name)[0]
        found = resolve(module, qualname) if module is not None else None
        return found is not None and _is_function(found.raw)

    return table_row(resolves)


def sglang_version() -> str | None:
    try:
        from sglang.version import __version__

        return str(__version__)
    except Exception:
        return None


class Doctor:
    name = "doctor"
    help = "check which patch targets resolve on the installed SGLang, per phase"
    description = """\
Import every module the phase tables name and resolve each candidate target the way the patch
engine does. 'first' phases wrap only the first candidate that resolves (later ones are
fallbacks for other SGLang releases); 'all' phases wrap every candidate that resolves.
Targets written '*:attr' are looked up on the model classes loaded at run time, so they cannot
be checked here. Exits 1 when a required phase resolves nowhere (tracing would miss it).

  phasetrace doctor            # table
  phasetrace doctor --json     # for CI"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.add_argument("--all", action="store_true", help="list every candidate target, not only problems")

    def run(self, args: argparse.Namespace) -> int:
        from ... import patches

        importer = Importer()
        checks = [check_phase(p, importer) for p in (*patches.PHASES, *patches.MODEL_PHASES)]
        version = sglang_version()
        broken = [c for c in checks if c.required and c.status == "missing"]
        row = coverage_row(importer)
        if args.json:
            print(
                json.dumps(
                    {
                        "sglang": version,
                        "phases": [c.to_json() for c in checks],
                        "missing_required": [c.phase for c in broken],
                        "coverage_row": row,
                    },
                    indent=1,
                )
            )
        else:
            console = make_console()
            console.print(
                doctor_table(checks, f"patch targets on SGLang {version or '(not installed)'}", every_target=args.all)
            )
            ok = sum(c.status == "ok" for c in checks)
            console.print(
                f"{ok} of {len(checks)} phases resolve; "
                + (
                    f"required but missing: {', '.join(c.phase for c in broken)}"
                    if broken
                    else "every required phase resolves"
                )
            )
            console.print(
                f"this release's row of docs/coverage.md (SGLang {version}): "
                + "  ".join(f"{phase} {cell}" for phase, cell in row.items()),
                soft_wrap=False,
            )
            if any(c.status == RUN_TIME for c in checks):
                console.print(
                    "'run time': '*:attr' targets are resolved on the model classes SGLang loads at "
                    "run time (any architecture); they cannot be checked before a start."
                )
        return 1 if broken else 0
