"""Keep secrets out of everything we write: the one place that knows what a secret looks like.

``redact`` is for structured values (server args, span attributes, records): a key that names a
secret hides its value, a ``["--api-key", v]`` list hides ``v``, JSON held in a string is parsed,
redacted and written back. ``redact_text`` is for free text (exception messages and stacks, status
descriptions, warnings, stack dumps, what the viewers show): credentials in URLs, secret query
parameters, ``Authorization``/``Cookie`` headers, ``key=value`` and ``"key": "value"`` pairs, and
the token shapes providers issue (``hf_…``, ``sk-…``, ``AKIA…``, ``ghp_…``, ``xox…-``, JWTs, PEM
private keys). Hiding an innocent word costs less than leaking a credential.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "[REDACTED]"
_LAST_WORDS = {
    "token",
    "auth",
    "authorization",
    "cookie",
    "signature",
    "apikey",
    "bearer",
    "accesskey",
    "secretkey",
    "privatekey",
    "authtoken",
    "accesstoken",
    "apitoken",
    "sessiontoken",
    "passphrase",
}
_ANY_WORDS = {"secret", "password", "passwd", "pwd", "credential", "credentials", "passphrase"}
# ``*_key`` is a secret only after one of these (``api_key``, ``watermark_key``); ``hash_key`` is not.
_KEY_QUALIFIERS = {
    "api",
    "access",
    "private",
    "secret",
    "auth",
    "signing",
    "encryption",
    "watermark",
    "hmac",
    "master",
    "license",
    "account",
    "storage",
    "subscription",
    "sas",
    "session",
    "client",
}
# ``*_token`` that counts tokens, not a credential (``bucket_time_to_first_token``, ``…_per_token``).
_COUNTING = {"per", "first", "to", "each", "next", "last", "max", "min", "num"}
# Short query parameter names that hold credentials (``?sig=…`` in Azure SAS URLs, ``?pw=…``).
_QUERY_NAMES = {"pw", "pass", "sig", "key", "code", "apikey", "api-key"}


def _words(key: str) -> list[str]:
    words = [w for w in re.split(r"[^a-z0-9]+", re.sub(r"([a-z])([A-Z])", r"\1_\2", key).lower()) if w]
    while len(words) > 1 and (len(words[-1]) == 1 or words[-1].isdigit()):  # ``watermark_key_b``, ``key_2``
        words.pop()
    return words


@functools.lru_cache(maxsize=4096)  # pure, and called per attribute of every record: keys repeat
def is_secret_key(key: str) -> bool:
    """``api_key``, ``hf_token``, ``ssl_keyfile_password`` are secrets; ``req_to_token_pool`` is not.

    A secret word counts at the end of the key (``hf_token``, ``admin_api_key``), except words
    that are secret anywhere (``password``, ``secret``); ``*_key(s)`` needs a qualifier (``api_keys``).
    """
    words = _words(key)
    if not words or _ANY_WORDS.intersection(words):
        return bool(words)
    last = words[-1]
    if last in ("key", "keys"):
        return len(words) > 1 and words[-2] in _KEY_QUALIFIERS
    if last == "token" and len(words) > 1 and words[-2] in _COUNTING:
        return False
    return last in _LAST_WORDS


# -- free text -----------------------------------------------------------------------------------
def _keep(group: str) -> Any:
    """Replacement keeping the named group (a prefix that says what kind of secret it was)."""
    return lambda m: m[group] + REDACTED


_PEM = re.compile(
    r"(?P<head>-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----).*?"
    r"(?P<tail>-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)",
    re.DOTALL,
)
# ``scheme://user:pass@host``: the password may hold ``@`` and spaces (up to the last ``@`` before
# the path); ``scheme://token@host`` too.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?:[^\s/?#@:]*:[^\n/?#]*|[^\s/?#@]+)@")
_SCHEMES = "bearer|basic|digest|token|negotiate|ntlm|apikey|key|sso-key|aws4-hmac-sha256"
_HEADER = re.compile(  # the scheme word is kept; without one, the whole value goes
    r"(?i)(?P<head>\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?"
    rf"(?:(?:{_SCHEMES})\s+|(?!(?:{_SCHEMES})\s)))"
    r"(?!\[REDACTED\])[^\s\"',;]+"
)
_COOKIE = re.compile(r"(?i)(?P<head>\b(?:set-)?cookie[\"']?\s*:\s*[\"']?)[^\n\"']+")
_BEARER = re.compile(r"(?i)(?P<head>\bbearer\s+)(?!\[REDACTED\])[A-Za-z0-9._~+/=-]+")
_BASIC = re.compile(r"(?P<head>\bBasic\s+)(?=[A-Za-z0-9+/]*[0-9+/=])[A-Za-z0-9+/]{8,}={0,2}")
_TOKEN_SHAPES = (
    r"\b(?P<head>hf_)[A-Za-z0-9]{16,}",
    r"\b(?P<head>api_org_)[A-Za-z0-9]{16,}",
    r"\b(?P<head>sk-(?:ant-(?:api\d+-|admin\d+-)?|proj-|svcacct-|admin-)?)[A-Za-z0-9_-]{16,}",
    r"\b(?P<head>[rsp]k_(?:live|test)_)[A-Za-z0-9]{10,}",
    r"\b(?P<head>A(?:KIA|SIA|GPA|IDA|ROA|NPA|NVA|IPA|BIA|CCA))[A-Z0-9]{16}\b",
    r"\b(?P<head>gh[pousr]_)[A-Za-z0-9]{20,}",
    r"\b(?P<head>github_pat_)[A-Za-z0-9_]{20,}",
    r"\b(?P<head>glpat-)[A-Za-z0-9_-]{20,}",
    r"\b(?P<head>xox[abposre]-)[A-Za-z0-9-]{10,}",
    r"\b(?P<head>xapp-)[A-Za-z0-9-]{10,}",
    r"\b(?P<head>)eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*",  # JWT
    r"\b(?P<head>AIza)[0-9A-Za-z_-]{35}",
    r"\b(?P<head>npm_)[A-Za-z0-9]{36}",
    r"\b(?P<head>pypi-)[A-Za-z0-9_-]{50,}",
    r"\b(?P<head>dckr_pat_)[A-Za-z0-9_-]{20,}",
    r"\b(?P<head>gsk_)[A-Za-z0-9]{20,}",
    r"\b(?P<head>r8_)[A-Za-z0-9]{20,}",
    r"\b(?P<head>nvapi-)[A-Za-z0-9_-]{20,}",
    r"\b(?P<head>dapi)[0-9a-f]{32}\b",
    r"\b(?P<head>SG\.)[\w-]{16,}\.[\w-]{16,}",
    r"(?P<head>hooks\.slack\.com/services/)[A-Za-z0-9/]+",
    r"(?P<head>discord(?:app)?\.com/api/webhooks/)[A-Za-z0-9/_-]+",
)
_TOKENS = [re.compile(p) for p in _TOKEN_SHAPES]
# ``key=value``, ``key: value``, ``"key": "value"``, ``'key': 'value'``, ``\"key\": \"value\"``.
_PAIR = re.compile(
    r"(?P<kq>\\*[\"']?)(?P<key>\b[A-Za-z_][\w.-]*)(?P=kq)(?P<sep>\s*(?::|=>?)\s*)"
    r"(?:(?P<done>\[REDACTED\])|(?P<q>\\*[\"'])(?P<qv>[^\n]*?)(?P=q)|(?P<uv>(?:\[REDACTED\]|[^\s,;&}\])'\"<>])+))"
)
# ``--api-key value`` on a command line, and ``'--api-key', 'value'`` in a printed argv list.
_FLAG = re.compile(
    r"(?P<head>(?<![\w-])--?(?P<key>[A-Za-z][\w.-]*)\s+)(?P<q>[\"']?)(?!-)(?!\[REDACTED\])"
    r"(?P<v>[^\s\"']+)(?P=q)"
)
_ARGV = re.compile(
    r"(?P<head>(?P<q>[\"'])--?(?P<key>[A-Za-z][\w.-]*)(?P=q)\s*,\s*(?P<q2>[\"']))"
    r"(?!\[REDACTED\])(?P<v>[^\"'\n]*)(?P=q2)"
)
_QUERY = re.compile(r"(?P<head>[?&;](?P<key>[\w.-]+)=)(?!\[REDACTED\])[^&#\s\"'<>]+")
_EMPTY = {"null", "none", "None", "false", "False", "", "0"}


_HEADER_NAMES = re.compile(r"(?i)(?:proxy-)?authorization|(?:set-)?cookie")


def _pair(m: re.Match) -> str | None:
    if m["done"] is not None or not is_secret_key(m["key"]) or _HEADER_NAMES.fullmatch(m["key"]):
        return None
    head = m[0][: m.end("sep") - m.start()]
    if m["q"] is not None:
        return None if m["qv"] in _EMPTY else f"{head}{m['q']}{REDACTED}{m['q']}"
    if m["uv"] in _EMPTY:
        return None
    return f'{head}"{REDACTED}"' if m["kq"] == '"' else head + REDACTED  # JSON stays JSON


# ``--ssl-keyfile-password has no effect…``: prose about a flag, not its value.
_PROSE = {
    "has",
    "have",
    "is",
    "was",
    "are",
    "must",
    "should",
    "will",
    "can",
    "cannot",
    "requires",
    "needs",
    "not",
    "and",
    "or",
    "with",
    "without",
    "to",
    "for",
    "only",
    "also",
    "be",
    "flag",
    "option",
    "argument",
    "given",
}


def _flag(m: re.Match) -> str | None:
    if not is_secret_key(m["key"]) or (not m["q"] and m["v"] in _PROSE):
        return None
    return f"{m['head']}{m['q']}{REDACTED}{m['q']}"


def _argv(m: re.Match) -> str | None:
    return f"{m['head']}{REDACTED}{m['q2']}" if is_secret_key(m["key"]) and m["v"] else None


def _query(m: re.Match) -> str | None:
    key = m["key"]
    return m["head"] + REDACTED if is_secret_key(key) or key.lower() in _QUERY_NAMES else None


def _scan(pattern: re.Pattern, text: str, replace: Any) -> str:
    """Like ``pattern.sub``, but a match ``replace`` keeps (None) is searched again right after its
    key, so ``note: password=x`` still finds ``password=x`` inside the value of ``note``."""
    out, pos = [], 0
    while (m := pattern.search(text, pos)) is not None:
        new = replace(m)
        if new is None:
            out.append(text[pos : m.end("key")])
            pos = m.end("key")
        else:
            out.append(text[pos : m.start()] + new)
            pos = m.end()
    out.append(text[pos:])
    return "".join(out)


# Cheap first looks: text with neither (most attribute values) is returned as it is.
_STRUCTURE_HINT = re.compile(r"[:=@]|-----BEGIN|(?<![\w-])--?[A-Za-z]|(?i:bearer|basic|cookie)")
_TOKEN_HINT = re.compile(
    r"hf_|api_org_|sk-|k_(?:live|test)_|A(?:KIA|SIA|GPA|IDA|ROA|NPA|NVA|IPA|BIA|CCA)|"
    r"gh[pousr]_|github_pat_|glpat-|xox|xapp-|eyJ|AIza|npm_|pypi-|dckr_pat_|gsk_|r8_|nvapi-|"
    r"dapi|SG\.|hooks\.slack|/webhooks/"
)
_KEEP_HEAD = _keep("head")


def redact_text(text: str) -> str:
    """``text`` with every credential we can recognise replaced by ``[REDACTED]``."""
    if not isinstance(text, str):
        text = str(text)
    if _STRUCTURE_HINT.search(text):
        text = _PEM.sub(lambda m: m["head"] + REDACTED + m["tail"], text)
        text = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
        for pattern in (_HEADER, _COOKIE, _BEARER, _BASIC):
            text = pattern.sub(_KEEP_HEAD, text)
        text = _scan(_ARGV, text, _argv)
        text = _scan(_FLAG, text, _flag)
        text = _scan(_PAIR, text, _pair)
        text = _scan(_QUERY, text, _query)
    if _TOKEN_HINT.search(text):
        for pattern in _TOKENS:
            text = pattern.sub(_KEEP_HEAD, text)
    return text


# -- structured values -----------------------------------------------------------------------------
_FLAG_ITEM = re.compile(r"--?(?P<key>[A-Za-z][\w.-]*)")


def _redact_json_text(text: str) -> str | None:
    """JSON held in a string (``model_loader_extra_config``): parsed, redacted, written back; None
    when it is not JSON."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, (dict, list)):
        return None
    clean = redact(data)
    return text if clean == data else json.dumps(clean)


def redact(value: Any, key: str = "") -> Any:
    """Return ``value`` with secrets replaced, recursing through mappings and sequences."""
    if key and value not in (None, "", False) and is_secret_key(key):
        return REDACTED
    if isinstance(value, str):
        if value.startswith(("{", "[")):
            parsed = _redact_json_text(value)
            if parsed is not None:
                return parsed
        return redact_text(value)
    if isinstance(value, Mapping):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        out = []
        for i, item in enumerate(value):
            flag = _FLAG_ITEM.fullmatch(value[i - 1]) if i and isinstance(value[i - 1], str) else None
            if flag and isinstance(item, str) and item and is_secret_key(flag["key"]):
                out.append(REDACTED)  # ["--api-key", "sk-…"]
            else:
                out.append(redact(item))
        return out
    return value
