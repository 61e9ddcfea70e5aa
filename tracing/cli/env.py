"""``phasetrace env``: the environment lines that turn tracing on for a launch, wherever pip put us."""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

from .. import keys


def hooks_dir() -> Path:
    """The installed ``sitecustomize_hooks`` directory (the PYTHONPATH entry)."""
    from ... import sitecustomize_hooks

    return Path(sitecustomize_hooks.__file__).resolve().parent


class Env:
    name = "env"
    help = 'print the PYTHONPATH line that enables tracing (eval "$(phasetrace env)")'
    description = """\
Print shell lines that put this installation's sitecustomize hook on PYTHONPATH, so that any
SGLang launch started from that shell is traced, without knowing where pip installed the package.

  eval "$(phasetrace env)" && python -m sglang.launch_server --model-path M --tp 8
  phasetrace env --dir /var/log/phasetrace      # also set where run directories go"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--dir", metavar="BASE", help=f"also export {keys.ENV_BASE_DIR}=BASE")

    def run(self, args: argparse.Namespace) -> int:
        hooks = str(hooks_dir())
        current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != hooks]
        print(f"export PYTHONPATH={shlex.quote(os.pathsep.join([hooks, *current]))}")
        if args.dir:
            print(f"export {keys.ENV_BASE_DIR}={shlex.quote(str(Path(args.dir).absolute()))}")
        return 0
