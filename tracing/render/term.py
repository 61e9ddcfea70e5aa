"""Untrusted strings on a terminal: every renderer that prints one passes it through ``clean``.

Phase names, labels, messages and attributes come from journals anyone who can write the run
directory controls. An escape sequence in one would act on the reader's terminal (OSC 52 writes
their clipboard, OSC 8 hides a link, CSI moves the cursor over earlier lines), so escape
sequences and control characters (C0, C1, DEL, bidirectional overrides) are removed; a line
break or tab becomes a space so a value stays on its table row. ``text`` wraps the result in a
rich ``Text``, which rich never parses for ``[markup]``.
"""

from __future__ import annotations

import re
from typing import Any

from rich.text import Text

_SEQUENCES = re.compile(
    r"\x1b\][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC … BEL or ST (OSC 52 clipboard, OSC 8 links)
    r"|\x1b[P^_X][^\x1b\x9c]*(?:\x1b\\|\x9c)?"  # DCS, PM, APC, SOS … ST
    r"|\x1b\[[0-?]*[ -/]*[@-~]?"  # CSI
    r"|\x1b[ -/]*[0-~]?"  # any other escape (charset, keypad, 2-character)
    r"|\x9d[^\x07\x9c]*(?:\x07|\x9c)?"  # 8-bit OSC
    r"|[\x90\x98\x9e\x9f][^\x9c]*\x9c?"  # 8-bit DCS, SOS, PM, APC
    r"|\x9b[0-?]*[ -/]*[@-~]?"  # 8-bit CSI
)
_BLANK = re.compile(r"[\t\n\r\v\f]")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def clean(value: Any) -> str:
    """``value`` as a string safe to print: no escape sequence, no control character."""
    text = value if isinstance(value, str) else "" if value is None else str(value)
    if text.isprintable():  # the usual case: nothing to remove
        return text
    return _CONTROL.sub("", _BLANK.sub(" ", _SEQUENCES.sub("", text)))


def text(value: Any, style: str = "") -> Text:
    """A rich ``Text`` of the cleaned value (never read as markup)."""
    return Text(clean(value), style=style)
