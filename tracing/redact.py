"""Keep secrets out of every attribute: keys that name a secret, and credentials inside URLs."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "[REDACTED]"
_LAST_WORDS = {"token", "auth", "authorization", "cookie", "signature", "apikey", "bearer", "key"}
_ANY_WORDS = {"secret", "password", "passwd", "pwd", "credential", "credentials"}
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")
_QUERY_SECRET = re.compile(
    r"(?P<key>[?&][\w.-]*(?:token|key|secret|password|signature|sig)[\w.-]*)=[^&#\s]+",
    re.IGNORECASE,
)


def is_secret_key(key: str) -> bool:
    """``api_key``, ``hf_token``, ``ssl_keyfile_password`` are secrets; ``req_to_token_pool`` is not.

    A secret word counts at the end of the key (``hf_token``, ``admin_api_key``), except words
    that are secret anywhere (``password``, ``secret``); ``*_key`` needs a qualifier (``api_key``).
    """
    words = [w for w in re.split(r"[^a-z0-9]+", re.sub(r"([a-z])([A-Z])", r"\1_\2", key).lower()) if w]
    if not words or _ANY_WORDS.intersection(words):
        return bool(words)
    last = words[-1]
    if last == "key":
        return len(words) > 1 and words[-2] in {"api", "access", "private", "secret", "auth", "signing", "encryption"}
    return last in _LAST_WORDS


def redact_text(text: str) -> str:
    text = _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
    return _QUERY_SECRET.sub(lambda m: f"{m['key']}={REDACTED}", text)


def redact(value: Any, key: str = "") -> Any:
    """Return ``value`` with secrets replaced, recursing through mappings and sequences."""
    if key and value not in (None, "", False) and is_secret_key(key):
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value
