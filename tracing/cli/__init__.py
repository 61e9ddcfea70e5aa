"""The ``phasetrace`` command line: one name, one module per verb.

To add a verb, write a module with a class satisfying ``command.Command`` and add an instance to
``commands()`` below (``watch`` goes there).
"""

from __future__ import annotations

import argparse
import gc
import sys

from .command import EXIT_FAILED, EXIT_STALLED, Command, CommandError, where

EPILOG = f"""\
exit codes: 0 fine, 1 error, 2 bad usage, {EXIT_STALLED} a rank is stalled, {EXIT_FAILED} a rank failed.
Run directories are written by traced processes under $SGLANG_PHASETRACE_DIR (default ./phasetrace-runs).
Start with:  phasetrace run -- python -m sglang.launch_server --model-path M --tp 2
"""


def commands() -> list[Command]:
    from .bundle import BundleCommand
    from .compare import Compare
    from .doctor import Doctor
    from .env import Env
    from .export import Export
    from .preflight import Preflight
    from .report import Report
    from .run import Run
    from .status import Status
    from .timeline import Timeline
    from .watch import Watch

    return [
        Run(),
        Preflight(),
        Status(),
        Watch(),
        Timeline(),
        Compare(),
        Report(),
        Export(),
        BundleCommand(),
        Doctor(),
        Env(),
    ]


def build_parser(verbs: list[Command]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="phasetrace",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
        description="See where each SGLang rank spends its startup, live or after the fact.",
    )
    sub = parser.add_subparsers(dest="verb", metavar="COMMAND", required=True)
    for verb in verbs:
        p = sub.add_parser(
            verb.name,
            help=verb.help,
            description=verb.description,
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        verb.add_arguments(p)
        p.set_defaults(command=verb)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser(commands()).parse_args(argv)
    except SystemExit as exc:  # --help, or bad usage (argparse printed why)
        return exc.code if isinstance(exc.code, int) else 2
    if getattr(args.command, "bulk", False):
        gc.disable()  # one large acyclic graph of records, then exit: rescanning it cost half the time
    try:
        return args.command.run(args)
    except CommandError as exc:
        print(f"phasetrace {args.verb}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `phasetrace timeline RUN | head`
        sys.stderr.close()
        return 0
    except Exception as exc:  # a bug of ours: one line that says where, not a traceback
        print(f"phasetrace {args.verb}: internal error: {exc!r}{where(exc)}; please report it", file=sys.stderr)
        return 1
    finally:
        gc.enable()


__all__ = ["Command", "CommandError", "main"]
