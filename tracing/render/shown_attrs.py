"""What renderers show of a span's attributes, error and events: redacted here, once for all of them
(a journal written by hand or by another version may hold what ours never writes), with memos, for
values repeat across spans and ranks; and an id per distinct attrs object as shown, so renderers
build what they make of one once."""

from __future__ import annotations

import itertools
from typing import Any

from .. import keys
from ..reader.view import SpanRec, key_text
from ..redact import is_secret_key, redact

_MEMO: dict[tuple[str, str], Any] = {}  # (key, text) -> redacted: values repeat across spans and ranks


def _redacted(key: str, value: Any) -> Any:
    if isinstance(value, str):
        hit = _MEMO.get((key, value))
        if hit is None:
            if len(_MEMO) > 100_000:
                _MEMO.clear()
            hit = _MEMO[(key, value)] = redact(value, key)
        return hit
    if isinstance(value, (bool, int, float)) or value is None:
        return redact(value, key) if value not in (None, False) and key and _secret_key(key) else value
    return redact(value, key)


_SECRET_KEYS: dict[str, bool] = {}


def _secret_key(key: str) -> bool:
    hit = _SECRET_KEYS.get(key)
    if hit is None:
        hit = _SECRET_KEYS[key] = is_secret_key(key)
    return hit


_CLEAN: set[tuple] = set()  # items of attrs known to need no redaction: they repeat across copies and ranks


def _clean(values: dict[str, Any]) -> dict[str, Any] | None:
    """``values`` redacted, or None when nothing changes."""
    try:
        items = tuple(values.items())
        if items in _CLEAN:
            return None
    except TypeError:  # a list value: not hashable
        items = None
    clean = {k: _redacted(str(k), v) for k, v in values.items()}
    if clean != values:
        return clean
    if items is not None:
        if len(_CLEAN) > 100_000:
            _CLEAN.clear()
        _CLEAN.add(items)
    return None


IDS: dict[tuple, int] = {}  # attrs as read (items, value types) known clean -> their id
SHOWN_IDS: dict[tuple, int] = {}  # attrs as redacted -> their id
_NEXT_ID = itertools.count()  # ids are never reused, even once the tables above are emptied


def attrs_key(attrs: dict[str, Any]) -> tuple | None:
    """Equal attrs, value types included (``True`` is not ``1`` to an export), have equal keys."""
    key = (tuple(attrs.items()), tuple(map(type, attrs.values())))
    try:
        hash(key)
    except TypeError:  # a list value
        return None
    return key


def new_id(table: dict[tuple, int], key: tuple | None) -> int:
    if key is None:
        return -1
    if len(table) > 100_000:
        table.clear()
    new = table[key] = next(_NEXT_ID)
    return new


def redact_span(span: SpanRec) -> None:
    """Redact what every renderer shows of ``span`` (in place; a no-op on already clean values)."""
    attrs = _clean(span.attrs)
    if attrs is not None:
        span.attrs = attrs
    if isinstance(span.error, dict):
        error = _clean(span.error)
        if error is not None:
            span.error = error
    for event in span.events:
        if isinstance(event, dict) and isinstance(event.get("attrs"), dict):
            clean = _clean(event["attrs"])
            if clean is not None:
                event["attrs"] = clean


_RAW_KEYS: dict[tuple, str] = {}  # (phase, draft, group) as written -> the phase key, redacted


def raw_key(attrs: dict[str, Any], name: str) -> str:
    """``phase_key`` of a span whose attrs were not redacted: as it reads once they are."""
    phase, draft, group = attrs.get(keys.PHASE), attrs.get(keys.IS_DRAFT) is True, attrs.get(keys.GROUP_NAME)
    raw: tuple | None = (phase, draft, group, name)
    try:
        hit = _RAW_KEYS.get(raw)
    except TypeError:  # a list value (a hand-written journal)
        hit, raw = None, None
    if hit is None:
        phase = (_redacted(keys.PHASE, phase) if phase else phase) or name
        group = _redacted(keys.GROUP_NAME, group) if group else group
        hit = key_text(phase, draft, group)
        if raw is not None:
            if len(_RAW_KEYS) > 100_000:
                _RAW_KEYS.clear()
            _RAW_KEYS[raw] = hit
    return hit
