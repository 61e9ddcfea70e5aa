"""The ``doctor`` table: one row per phase, with the target it wraps and any that fail to load."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

STATUS_STYLE = {"ok": "green", "run time": "cyan", "missing": "bold red"}
TROUBLE = ("import error", "not a function")  # a candidate that exists but cannot be traced


def _shown(check: Any, every_target: bool) -> list[Any]:
    """All candidates of a missing phase (or with ``every_target``); else the first one wrapped
    and any that exist but cannot be traced. Absent alternatives are normal across releases."""
    if every_target or check.status == "missing":
        return check.targets
    used = [t for t in check.targets if t.state in ("used", "run time")]
    return used[:1] + [t for t in check.targets if t.state in TROUBLE]


def doctor_table(checks: list[Any], title: str, every_target: bool = False) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("phase", "mode", "required", "status", "target", "state", "detail"):
        wide = name in ("target", "detail")
        table.add_column(
            name,
            no_wrap=not wide,
            overflow="fold" if wide else "ellipsis",
            min_width=None if wide else len(name) if name != "phase" else 30,
        )
    for check in checks:
        status_style = STATUS_STYLE.get(check.status, "")
        if check.status == "missing" and not check.required:
            status_style = "yellow"
        shown = _shown(check, every_target)
        wrapped = sum(t.state == "used" for t in check.targets)
        for n, t in enumerate(shown or check.targets[:1]):
            detail = t.detail if t.state != "run time" else ""
            if n == 0 and not every_target and wrapped > 1:
                detail = f"+{wrapped - 1} more wrapped (--all lists them)"
            table.add_row(
                Text(check.phase if n == 0 else ""),
                check.mode if n == 0 else "",
                ("yes" if check.required else "") if n == 0 else "",
                Text(check.status if n == 0 else "", style=status_style),
                Text(t.target),
                Text(t.state, style="" if t.state in ("used", "run time", "fallback") else "red"),
                Text(detail),
            )
    return table
