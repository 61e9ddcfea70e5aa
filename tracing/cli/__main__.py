"""``python -m sglang_phasetrace.tracing.cli`` — the same as the ``phasetrace`` command."""

from . import console

console()
