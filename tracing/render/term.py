"""Untrusted strings on a terminal: every renderer that prints one passes it through ``clean``.

Phase names, labels, messages and attributes come from journals anyone who can write the run
directory controls. ``clean`` (``tracing.redact``'s, beside ``printable``, which the rank-side
modules use without loading rich) removes escape sequences and control characters; ``text``
wraps the result in a rich ``Text``, which rich never parses for ``[markup]``.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

from ..redact import clean

__all__ = ["clean", "text"]


def text(value: Any, style: str = "") -> Text:
    """A rich ``Text`` of the cleaned value (never read as markup)."""
    return Text(clean(value), style=style)
