"""The ``phasetrace`` command line: one name, one module per verb.

To add a verb, write a module with a class satisfying ``command.Command`` and add it to ``VERBS``
below (and to ``usage.RETURNS`` when it returns codes beyond 0, 1, 2 and 130). Only the verb
asked for is imported (a viewer never loads the bundle's or the pre-flight's modules);
``phasetrace --help`` imports them all.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys

from ..redact import printable
from .command import _KEPT, PREFIX, Command, CommandError, where
from .usage import epilog

ABOUT = """\
Run directories are written by traced processes under $SGLANG_PHASETRACE_DIR (default ./phasetrace-runs).
Start with:  phasetrace run -- python -m sglang.launch_server --model-path M --tp 2
"""


# name -> (module, class), in the order ``--help`` lists them
VERBS = {
    "run": ("run", "Run"),
    "preflight": ("preflight", "Preflight"),
    "status": ("status", "Status"),
    "watch": ("watch", "Watch"),
    "probe": ("probe", "Probe"),
    "timeline": ("timeline", "Timeline"),
    "compare": ("compare", "Compare"),
    "report": ("report", "Report"),
    "history": ("history", "HistoryCommand"),
    "export": ("export", "Export"),
    "bundle": ("bundle", "BundleCommand"),
    "doctor": ("doctor", "Doctor"),
    "inspect": ("inspect", "Inspect"),
    "env": ("env", "Env"),
}


def commands(only: str | None = None) -> list[Command]:
    """Every verb, or only the one named ``only`` when it is one."""
    names = [only] if only in VERBS else list(VERBS)
    return [getattr(importlib.import_module(f"{__name__}.{VERBS[n][0]}"), VERBS[n][1])() for n in names]


class _Version(argparse.Action):
    """``--version``, the installed version looked up only when asked (package metadata: 15 ms a verb)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        print(f"{parser.prog} {_version()}")
        parser.exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang-phasetrace")
    except PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown"


def build_parser(verbs: list[Command]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="phasetrace",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=epilog(None) + ABOUT,
        description="See where each SGLang rank spends its startup, live or after the fact.",
    )
    parser.add_argument("--version", action=_Version, nargs=0, help="show the program's version number and exit")
    sub = parser.add_subparsers(dest="verb", metavar="COMMAND", required=True)
    for verb in verbs:
        p = sub.add_parser(
            verb.name,
            help=verb.help,
            description=verb.description,
            epilog=epilog(verb.name) + ABOUT,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        verb.add_arguments(p)
        p.set_defaults(command=verb)
    return parser


def main(argv: list[str] | None = None, *, exiting: bool = False) -> int:
    """Run one verb; ``exiting``: the process ends next (``console``), so what the verb read is kept
    (``keep``) rather than freed, and a bulk verb leaves the cycle collector off (turned on, the next
    allocation scans all the verb made: 0.1 s at 1024 ranks). A caller that goes on (a test) has it
    freed on return (a detached index writer waits for the view to close its descriptor), the
    collector on."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = build_parser(commands(argv[0] if argv else None))
        args, extra = parser.parse_known_args(argv)
        if extra:  # the verb's own usage, not the top level's: it is the verb's option that is wrong
            verb_parser = parser._subparsers._group_actions[0].choices[args.verb]  # type: ignore[union-attr]
            verb_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # --help, or bad usage (argparse printed why)
        return exc.code if isinstance(exc.code, int) else 2
    if getattr(args.command, "bulk", False):
        gc.disable()  # one large acyclic graph of records, then exit: rescanning it cost half the time
    try:
        return args.command.run(args)
    except CommandError as exc:
        print(printable(f"{PREFIX} {args.verb}: {exc}"), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `phasetrace timeline RUN | head`
        sys.stderr.close()
        return 0
    except Exception as exc:  # a bug of ours: one line that says where, not a traceback
        print(
            printable(f"{PREFIX} {args.verb}: internal error: {exc!r}{where(exc)}; please report it"), file=sys.stderr
        )
        return 1
    finally:
        if not exiting:
            _KEPT.clear()
            gc.enable()


# verbs that read runs and write output, nothing else: they end without freeing what they read
VIEWERS = frozenset({"status", "timeline", "compare", "report", "export", "bundle"})


def console() -> None:
    """The ``phasetrace`` command. A viewer exits without freeing what it read (a 1024-rank run:
    half a second of deallocation), as mypy does: its output flushed, its files already closed."""
    code = main(exiting=True)
    if sys.argv[1:2] and sys.argv[1] in VIEWERS:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing more to say
                pass
        os._exit(code)
    sys.exit(code)


__all__ = ["Command", "CommandError", "main"]
