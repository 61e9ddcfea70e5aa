"""The one place a verdict is spoken: its words, its line (prefix first, verdict first, redacted),
the ``diagnosis`` record that keeps it, and the known-fix hints after it. The launcher's watchdog,
``phasetrace watch`` and ``phasetrace run`` (for what no watchdog of the run said) all speak here,
so a user reads each verdict once, in one voice, wherever it was judged."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TextIO

from ..journal import records
from ..reader.view import RunView
from ..redact import printable, redact_text
from .diagnose import PREFIX, VERDICT, Finding

WAITING_BYTES = 64 << 10  # characters of the peers a diagnosis record says wait (``kept_waiting``)


def word(finding: Finding) -> str:
    """``STALL``, ``DIED``, ``FAILED``, ``NOT STARTED``, ``STOPPED`` (alarms) or ``NOTICE``."""
    return VERDICT.get(finding.kind, "STALL") if finding.alarm else "NOTICE"


def line(finding: Finding) -> str:
    """``STALL rank tp1 (pid 4242) is blocked in 'x' for 12 s (…): tp0 waits in barrier #3 …``."""
    return f"{word(finding)} {redact_text(finding.message)}"


def said(finding: Finding) -> str:
    """The line as a user sees it, prefix first (callers make it terminal-safe)."""
    return f"{PREFIX} {line(finding)}"


def diagnosis_record(finding: Finding) -> dict[str, Any]:
    """The ``diagnosis`` journal record of a verdict (its message redacted), whoever said it."""
    return records.diagnosis(
        time.time_ns(),
        finding.kind,
        finding.label,
        finding.pid,
        finding.phase,
        round(finding.since_s, 3),
        redact_text(finding.message),
        kept_waiting(finding.waiting),
        finding.stacks,
        evidence=finding.evidence or None,
    )


def kept_waiting(waiting: dict[str, str]) -> dict[str, str]:
    """The peers a record says wait, in order, while their words fit ``WAITING_BYTES``; then one
    entry ``…`` saying how many more. At 1024 ranks in a world barrier each peer's words name the
    group and its 1024 members (~4 KB): all of them made a 4.2 MB record no reader takes
    (``writer.RECORD_MAX``); the verdict's message names them all, compactly."""
    out: dict[str, str] = {}
    used = 0
    for n, (label, text) in enumerate(waiting.items()):
        used += len(label) + len(text)
        if used > WAITING_BYTES:
            out["…"] = f"{len(waiting) - n} more peers wait (not kept in this record)"
            break
        out[label] = text
    return out


def speak(
    finding: Finding,
    out: TextIO,
    record: Callable[[dict[str, Any]], None] | None,
    run: RunView,
    hints_said: set[str],
) -> None:
    """Record the verdict (first: whoever saw the line finds the record in the journal), print its
    line with its stacks, then each known-fix hint not said yet in this watch."""
    from .hints import for_finding

    finding.message = redact_text(finding.message)
    if record is not None:
        record(diagnosis_record(finding))
    text = said(finding)
    if finding.stacks:
        text += f"; stacks: {', '.join(finding.stacks)}"
    print(printable(text), file=out, flush=True)
    for hint in (h for h in for_finding(finding, run) if h not in hints_said):
        hints_said.add(hint)
        print(printable(f"{PREFIX} {hint}"), file=out, flush=True)
