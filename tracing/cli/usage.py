"""The command line's one table: what each exit code means, which codes each verb returns, the
argument types that refuse bad values as argparse does, and the help texts two verbs share.

Every verb's help epilog is made from it, and ``docs/cli.md`` (options, units, defaults, exit codes)
is made from it and the parsers: ``scripts/cli_doc.py`` rewrites that file, and a test fails when
the file, the help or the code disagree. A new verb is one line in ``RETURNS`` (a verb not listed
returns 0, 1, 2 and 130 only).
"""

from __future__ import annotations

import argparse

from ..verdicts.startup import CODES

EXIT_STALLED = CODES["stalled"]
EXIT_FAILED = CODES["failed"]
EXIT_INCOMPLETE = 10  # nothing stalled or failed that the view can see, but a journal could not be read
STILL_STARTING = 9  # ``probe --wait``: the time given ran out while the start progresses

# code -> what it means, for every verb that returns it
MEANING: dict[int, str] = {
    0: "fine (probe: the start progresses, or the launch serves)",
    1: "error: one line on stderr says why",
    2: "bad usage: the verb's usage on stderr says why",
    EXIT_STALLED: "a rank is stalled",
    EXIT_FAILED: "a rank failed or died (probe: or the launcher ended before serving)",
    CODES["not_started"]: "not started: no rank began",
    CODES["stopped"]: "stopped from outside",
    CODES["no_run"]: "no run directory yet",
    CODES["ended"]: "the launch served and has ended",
    STILL_STARTING: "--wait ran out while the start still progresses",
    EXIT_INCOMPLETE: "the view is incomplete: a journal could not be read, nothing worse seen",
    130: "interrupted (Ctrl-C)",
}
COMMON = (0, 1, 2, 130)

# verb -> the codes it returns beyond COMMON
RETURNS: dict[str, tuple[int, ...]] = {
    "preflight": (EXIT_STALLED, EXIT_FAILED),
    "status": (EXIT_STALLED, EXIT_FAILED, EXIT_INCOMPLETE),
    "watch": (EXIT_STALLED,),
    "inspect": (EXIT_STALLED, EXIT_FAILED),
    "probe": (
        EXIT_STALLED,
        EXIT_FAILED,
        CODES["not_started"],
        CODES["stopped"],
        CODES["no_run"],
        CODES["ended"],
        STILL_STARTING,
    ),
    "timeline": (EXIT_INCOMPLETE,),
    "compare": (EXIT_INCOMPLETE,),
    "report": (EXIT_INCOMPLETE,),
    "export": (EXIT_INCOMPLETE,),
}
OWN_CODE = {"run": "the command's own exit code (a signal N: 128+N); 1 or 2 when it cannot start it"}

SILENT_HELP = (
    "no heartbeat for this long counts as silent (default: $SGLANG_PHASETRACE_SILENT_S, else 4 heartbeats: "
    "8 s at the usual 2 s beat)"
)
UNITS = {"S": "seconds", "N": "a count", "COLS": "terminal columns"}


def codes(verb: str) -> list[int]:
    return sorted({*COMMON, *RETURNS.get(verb, ())})


def epilog(verb: str | None) -> str:
    """``exit codes:`` one per line; ``verb`` None: the top-level help's (every code)."""
    if verb in OWN_CODE:
        return f"exit codes:\n  {OWN_CODE[verb]}\n\n"
    shown = sorted(MEANING) if verb is None else codes(verb)
    lines = [f"  {c:<3} {MEANING[c]}" for c in shown]
    return "exit codes:\n" + "\n".join(lines) + "\n\n"


# -- argument types: a bad value is a usage error naming the option (argparse's ArgumentTypeError) --


def seconds(value: str) -> float:
    """A duration in seconds, more than 0."""
    try:
        n = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not n > 0 or n == float("inf"):
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, not {value}")
    return n


def at_least(low: int) -> argparse._ActionType:  # type: ignore[name-defined]
    """An integer of at least ``low``."""

    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, not {n}")
        return n

    parse.__name__ = f"at_least_{low}"
    return parse


# -- docs/cli.md ---------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(parser: argparse.ArgumentParser) -> str:
    """``docs/cli.md``: each verb's options (value, unit, default) and exit codes, from ``parser``
    (``phasetrace``'s, every verb in it, in ``--help``'s order)."""
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    out = [
        "# The command line: options, units, exit codes",
        "",
        "Generated from the parsers and `tracing/cli/usage.py` (`scripts/cli_doc.py` rewrites it;",
        "`tests/test_cli_usage.py` fails when it, `--help` or the code disagree). Every verb's",
        "`--help` ends with the same exit codes. Units: " + ", ".join(f"`{k}` {v}" for k, v in UNITS.items()) + ".",
        "`NO_COLOR` (any non-empty value): no escape codes at all on a terminal: no colour, no bold, dim or italic;",
        "off a terminal nothing prints escape codes either. `COLUMNS` sets the width of tables and the",
        "timeline, on a terminal or not.",
        "",
        "## Exit codes",
        "",
        "| code | meaning | verbs |",
        "|---|---|---|",
    ]
    for c, meaning in sorted(MEANING.items()):
        verbs = "every verb" if c in COMMON else ", ".join(f"`{v}`" for v in sub.choices if c in RETURNS.get(v, ()))
        out.append(f"| {c} | {_cell(meaning)} | {verbs} |")
    out.append(f"| CMD's | {_cell(OWN_CODE['run'])} | `run` |")
    for verb, p in sub.choices.items():
        out += ["", f"## `phasetrace {verb}`", "", "| option | value | default | meaning |", "|---|---|---|---|"]
        for a in p._actions:
            if isinstance(a, argparse._HelpAction) or a.help == argparse.SUPPRESS:
                continue
            name = ", ".join(f"`{o}`" for o in a.option_strings) or f"`{a.metavar or a.dest}`"
            value = "" if a.nargs == 0 else (a.metavar or a.dest.upper())
            if value in UNITS:
                value = f"`{value}` ({UNITS[value]})"
            elif value:
                value = f"`{value}`"
            default = "" if a.default in (None, False) or a.nargs == 0 else f"`{a.default}`"
            out.append(f"| {name} | {value} | {default} | {_cell((a.help or '') % {'default': a.default})} |")
        listed = OWN_CODE.get(verb) or ", ".join(str(c) for c in codes(verb))
        out += ["", f"Exit codes: {listed}."]
    return "\n".join(out) + "\n"
