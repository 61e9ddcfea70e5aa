"""``phasetrace doctor``: which patch targets resolve on the installed SGLang, phase by phase."""

from __future__ import annotations

import argparse
import importlib
import json
from dataclasses import asdict
from typing import Any

from ..recorder.runtime import sglang_version
from ..render.doctor_table import doctor_table
from ..render.term import text
from .command import make_console


def check_json(plan: Any) -> dict[str, Any]:
    """One phase of the engine's dry run, as ``doctor --json`` prints it."""
    phase = plan.phase
    return {
        "phase": phase.name,
        "mode": phase.mode,
        "required": phase.required,
        "targets": [asdict(c) for c in plan.candidates],
        "status": plan.status,
    }


def phase_targets() -> dict[str, tuple[str, str]]:
    """Every patch target (``module:qualname``, ``*:attr``) -> (its phase, the phase's kind): how
    ``phasetrace inspect`` names the phase of a frame it read with py-spy. Here because doctor is
    where the CLI meets the patch tables (``tracing/`` imports ``patches/`` nowhere else)."""
    from ... import patches

    return {t: (p.name, p.kind) for p in patches.table_phases() for t in p.targets}


class Check:
    """What the table shows of a phase (``render.doctor_table``)."""

    def __init__(self, plan: Any) -> None:
        self.phase, self.mode, self.required = plan.phase.name, plan.phase.mode, plan.phase.required
        self.targets, self.status = plan.candidates, plan.status


class Doctor:
    name = "doctor"
    help = "check which patch targets resolve on the installed SGLang, per phase"
    description = """\
Ask the patch engine for a dry run: it imports every module the phase tables name and resolves
each candidate target as it would at run time, patching nothing. 'first' phases wrap only the
first candidate that resolves (later ones are fallbacks for other SGLang releases); 'all' phases
wrap every candidate that resolves.
Targets written '*:attr' are looked up on the model classes loaded at run time, so they cannot
be checked here. Exits 1 when a required phase resolves nowhere (tracing would miss it).

  phasetrace doctor            # table
  phasetrace doctor --json     # for CI"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.add_argument("--all", action="store_true", help="list every candidate target, not only problems")

    def run(self, args: argparse.Namespace) -> int:
        from ... import patches  # doctor is where the CLI meets the patch tables: it asks the engine

        plans = patches.dry_run()
        covered = {p.name for p in patches.table_phases()}
        row = {plan.phase.name: plan.cell for plan in plans if plan.phase.name in covered}
        checks = [Check(plan) for plan in plans]
        try:
            importlib.import_module("sglang.version")
        except Exception:  # not installed: the table says so
            pass
        version = sglang_version()
        broken = [c for c in checks if c.required and c.status == "missing"]
        from ..history.store import check as check_history  # the history's place; a DSN without its password

        history_ok, history = check_history()
        if args.json:
            print(
                json.dumps(
                    {
                        "sglang": version,
                        "phases": [check_json(plan) for plan in plans],
                        "missing_required": [c.phase for c in broken],
                        "coverage_row": row,
                        "history": {"ok": history_ok, "said": history},
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
            console.print(text(f"history: {history}", "" if history_ok else "bold red"))
            if any(c.status == "run time" for c in checks):
                console.print(
                    "'run time': '*:attr' targets are resolved on the model classes SGLang loads at "
                    "run time (any architecture); they cannot be checked before a start."
                )
        return 1 if broken else 0
