"""Rewrite ``docs/cli.md`` from the parsers and ``tracing/cli/usage.py`` (the CLI's one table of
options, units and exit codes); ``tests/test_cli_usage.py`` fails while the file is stale."""

from __future__ import annotations

from pathlib import Path

from sglang_phasetrace.tracing.cli import build_parser, commands
from sglang_phasetrace.tracing.cli.usage import markdown

if __name__ == "__main__":
    path = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
    path.write_text(markdown(build_parser(commands())))
    print(f"wrote {path}")
