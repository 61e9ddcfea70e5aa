"""Keep secrets out of everything we write, and escapes out of everything we print: the one place
that knows what a secret looks like and what a terminal must not be sent.

``redact`` is for structured values (server args, span attributes, records): a key that names a
secret hides its value, a ``["--api-key", v]`` list hides ``v``, JSON held in a string is parsed,
redacted and written back; nesting deeper than ``MAX_DEPTH`` becomes a marker. ``redact_text`` is
for free text (exception messages and stacks, status descriptions, warnings, stack dumps, what the
viewers show): credentials in URLs and DSNs, secret query parameters, ``Authorization``/``Cookie``
headers, ``key=value``, ``--flag value`` (``--api-key -abc…`` too) and ``"key": "value"`` pairs, a
credential-like word after a secret's name in prose (``Using token Tk7pQ2…``), and the token shapes
providers issue (``hf_…``, ``sk-…``, ``AKIA…``, ``ghp_…``, ``xox…-``, ``ya29.…``, ``hvs.…``,
JWTs, PEM private keys); one field keeps at most ``MAX_TEXT`` characters (its head and its end,
saying how many were cut between). ``printable`` is every line we print or log: redacted, and
without escape sequences or control characters (``clean``). Hiding an innocent word costs less
than leaking a credential.

Text anyone can write (a journal, a remote snapshot) costs its length, not its square: a pattern
starts only where a key, flag, scheme or token can start (never inside one, so a run of ``a.a.a…``
is tried once), and a value is read only after a key that names a secret, once, the search going
on after it. ``scripts/bench_redact.py`` shows time per byte flat from 1 kB to 256 kB.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import unicodedata
from collections.abc import Callable, Mapping
from typing import Any

REDACTED = "[REDACTED]"
MAX_TEXT = 16 * 1024  # characters one free-text field keeps (exception, warning, label, printed line)
MAX_SCAN = 64 * 1024  # characters of a field read at all: its head and end, enough for what MAX_TEXT keeps
MAX_DEPTH = 32  # levels of a structured value; deeper content is replaced by TOO_DEEP
TOO_DEEP = f"[nested deeper than {MAX_DEPTH} levels: not kept]"
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
    "privkey",
    "authtoken",
    "accesstoken",
    "apitoken",
    "sessiontoken",
    "passphrase",
    "sas",
    "pw",  # ``db_pw``
    "dsn",  # ``sentry_dsn``: a connection string, its credentials inside
    "csrftoken",
    "xsrftoken",
    "sessionid",  # Django's session cookie
}
_ANY_WORDS = {"pwd", "credential", "credentials"}
_ANY_PARTS = ("secret", "password", "passwd", "passphrase")  # ``PGPASSWORD``, ``db_secret_name``
# Whole keys (their words joined by ``_``) that hold a secret though no word of theirs says so.
_WHOLE = {
    "session",
    "tokens",
    "connection_string",
    "conn_string",
    "conn_str",
    "connstr",
    "x_honeycomb_team",
    "key",  # ``{"key": …}``, and ``keys``: alone, a key names no purpose but its secret
    "keys",
    "pass",
    "sig",  # Azure SAS
    "session_id",
}
# In text, only as a quoted key: ``"tokens": […]``, not ``special tokens: …``; ``"session_id": "…"``,
# not SGLang's ``session_id=abc123 rid=42``; ``"pass": "…"``, not ``pass: 3``.
_BARE_PROSE = {"session", "tokens", "pass", "sig", "session_id"}
# Never in text (structured values only): ``{"key": "sglang.phase", "value": …}`` is every OTLP JSON
# attribute, and a report's ``"keys": […]`` its phases.
_STRUCTURED_ONLY = {"key", "keys"}
# ``*_pass`` that counts passes or names a kind of pass (``forward_pass``), not a password.
_PASSES = {
    "forward",
    "backward",
    "first",
    "second",
    "third",
    "last",
    "final",
    "two",
    "multi",
    "single",
    "one",
    "by",
    "num",
    "per",
    "each",
    "next",
    "extra",
}
# A list of secrets is secret: ``api_key_list``, ``token_set``.
_COLLECTIONS = {"list", "lists", "array", "set"}
# ``*_headers`` sent to a collector or with credentials: ``otlp_headers``, ``OTEL_EXPORTER_OTLP_TRACES_HEADERS``.
_HEADER_OWNERS = {"otlp", "otel", "auth", "authorization", "exporter", "secret", "credential", "credentials"}
# ``*_key`` is a secret only after one of these (``api_key``, ``watermark_key``); ``hash_key`` is not.
_KEY_QUALIFIERS = {
    "api",
    "access",
    "private",
    "priv",
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
    "functions",
    "rapidapi",
}
# ``*_tokens`` is a count (``max_total_tokens``) unless one of these says whose tokens they are.
_TOKENS_QUALIFIERS = _KEY_QUALIFIERS | {"bearer", "refresh", "oauth", "hf", "id"}
# ``*_token`` that counts tokens or names a tokenizer's, not a credential (``bucket_time_to_first_token``,
# ``…_per_token``, SGLang's ``#new-token: 6, #cached-token: 0``, ``pad_token``).
_COUNTING = {
    "per",
    "first",
    "to",
    "each",
    "next",
    "last",
    "max",
    "min",
    "num",
    "new",
    "cached",
    "total",
    "input",
    "output",
    "prompt",
    "completion",
    "generated",
    "pad",
    "eos",
    "bos",
    "unk",
    "sep",
    "cls",
    "mask",
    "special",
}
# Short query parameter names that hold credentials (``?sig=…`` in Azure SAS URLs, ``?pw=…``).
_QUERY_NAMES = {"pw", "pass", "sig", "key", "code", "apikey", "api-key"}
_LONG_KEY = 128  # a longer key is checked uncached (only text makes such keys; the cache holds real ones)


def _words(key: str) -> list[str]:
    key = unicodedata.normalize("NFKC", key)  # a fullwidth ``password`` is password
    words = [w for w in re.split(r"[^a-z0-9]+", re.sub(r"([a-z])([A-Z])", r"\1_\2", key).lower()) if w]
    while len(words) > 1 and (len(words[-1]) == 1 or words[-1].isdigit()):  # ``watermark_key_b``, ``key_2``
        words.pop()
    return words


def _is_secret_key(key: str) -> bool:
    words = _words(key)
    if not words:
        return False
    if _ANY_WORDS.intersection(words) or any(part in word for word in words for part in _ANY_PARTS):
        return True
    if "_".join(words) in _WHOLE:
        return True
    last = words[-1]
    before = words[-2] if len(words) > 1 else ""
    if last in _COLLECTIONS and len(words) > 1:
        return _is_secret_key("_".join(words[:-1]))
    if last in ("id", "ids") and before in ("key", "keys"):  # ``private_key_id``, ``access_key_id``
        return len(words) > 2 and words[-3] in _KEY_QUALIFIERS
    if last in ("headers", "header"):
        return bool(_HEADER_OWNERS.intersection(words))
    if last == "pass":
        return before not in _PASSES
    if last == "sig":
        return True
    if words[-2:] == ["session", "id"]:  # ``user_session_id``
        return True
    if last in ("key", "keys"):
        return before in _KEY_QUALIFIERS
    if last == "tokens":
        return before in _TOKENS_QUALIFIERS
    if last == "token" and before in _COUNTING:
        return False
    return last in _LAST_WORDS


_is_secret_key_cached = functools.lru_cache(maxsize=4096)(_is_secret_key)  # called per attribute: keys repeat


def is_secret_key(key: str) -> bool:
    """``api_key``, ``hf_token``, ``ssl_keyfile_password`` are secrets; ``req_to_token_pool`` is not.

    A secret word counts at the end of the key (``hf_token``, ``admin_api_key``), except words
    that are secret anywhere (``password``, ``secret``); ``*_key(s)`` needs a qualifier
    (``api_keys``), ``*_tokens`` too (``max_total_tokens`` is a count).
    """
    return _is_secret_key_cached(key) if len(key) <= _LONG_KEY else _is_secret_key(key)


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
# the path); ``scheme://token@host`` too. A scheme starts only where a word does. The single-slash
# ``postgresql:/user:pass@host`` (a mistyped DSN, seen in a directory name) too.
_URL_USERINFO = re.compile(
    r"(?P<scheme>(?<![\w+.-])[a-zA-Z][a-zA-Z0-9+.-]*:/{1,2})(?:[^\s/?#@:]*:[^\n/?#]*|[^\s/?#@]+)@"
)
# Go's ``user:pw@tcp(db:3306)/x`` (no scheme): found by its ``@tcp(``, the password read back from there.
_GO_DSN = re.compile(r"@(?:tcp[46]?|udp[46]?|unix)\(")
_SCHEMES = "bearer|basic|digest|token|negotiate|ntlm|apikey|key|sso-key|aws4-hmac-sha256"
_HEADER = re.compile(  # the scheme word is kept; without one, the whole value goes
    r"(?i)(?P<head>\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?"
    rf"(?:(?:{_SCHEMES})\s+|(?!(?:{_SCHEMES})\s)))"
    r"(?!\[REDACTED\])[^\s\"',;]+"
)
_COOKIE = re.compile(r"(?i)(?P<head>\b(?:set-)?cookie[\"']?\s*:\s*[\"']?)[^\n\"']+")
_BEARER = re.compile(r"(?i)(?P<head>\bbearer\s+)(?!\[REDACTED\])[A-Za-z0-9._~+/=-]+")
_BASIC = re.compile(r"(?P<head>\bBasic\s+)(?=[A-Za-z0-9+/]*[0-9+/=])[A-Za-z0-9+/]{8,}={0,2}")
# Each shape with the literal(s) it cannot match without: most text holds none, and ``in`` is cheap.
_AWS = ("AKIA", "ASIA", "AGPA", "AIDA", "AROA", "ANPA", "ANVA", "AIPA", "ABIA", "ACCA")
_TOKEN_SHAPES = (
    (("hf_",), r"\b(?P<head>hf_)[A-Za-z0-9]{16,}"),
    (("api_org_",), r"\b(?P<head>api_org_)[A-Za-z0-9]{16,}"),
    (("sk-",), r"\b(?P<head>sk-(?:ant-(?:api\d+-|admin\d+-)?|proj-|svcacct-|admin-)?)[A-Za-z0-9_-]{16,}"),
    (("k_live_", "k_test_"), r"\b(?P<head>[rsp]k_(?:live|test)_)[A-Za-z0-9]{10,}"),
    (("whsec_",), r"\b(?P<head>whsec_)[A-Za-z0-9]{16,}"),  # Stripe webhook secret
    (_AWS, rf"\b(?P<head>{'|'.join(_AWS)})[A-Z0-9]{{16}}\b"),
    (("gh",), r"\b(?P<head>gh[pousr]_)[A-Za-z0-9]{20,}"),
    (("github_pat_",), r"\b(?P<head>github_pat_)[A-Za-z0-9_]{20,}"),
    (("glpat-",), r"\b(?P<head>glpat-)[A-Za-z0-9_-]{20,}"),
    (("glsa_", "glc_"), r"\b(?P<head>gl(?:sa|c)_)[A-Za-z0-9_=-]{20,}"),  # Grafana
    (("xox",), r"\b(?P<head>xox[abposre]-)[A-Za-z0-9-]{10,}"),
    (("xapp-",), r"\b(?P<head>xapp-)[A-Za-z0-9-]{10,}"),
    (("eyJ",), r"(?<![\w-])(?P<head>)eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"),  # JWT
    (("AIza",), r"\b(?P<head>AIza)[0-9A-Za-z_-]{35}"),
    (("ya29.",), r"\b(?P<head>ya29\.)[0-9A-Za-z_-]{20,}"),  # Google OAuth access token
    (("1//0",), r"\b(?P<head>1//0)[0-9A-Za-z_-]{20,}"),  # Google OAuth refresh token
    (("GOCSPX-",), r"\b(?P<head>GOCSPX-)[0-9A-Za-z_-]{20,}"),  # Google OAuth client secret
    (("hvs.", "hvb.", "hvr."), r"\b(?P<head>hv[sbr]\.)[A-Za-z0-9_-]{20,}"),  # HashiCorp Vault
    (("npm_",), r"\b(?P<head>npm_)[A-Za-z0-9]{36}"),
    (("pypi-",), r"\b(?P<head>pypi-)[A-Za-z0-9_-]{50,}"),
    (("dckr_pat_",), r"\b(?P<head>dckr_pat_)[A-Za-z0-9_-]{20,}"),
    (("gsk_",), r"\b(?P<head>gsk_)[A-Za-z0-9]{20,}"),
    (("r8_",), r"\b(?P<head>r8_)[A-Za-z0-9]{20,}"),
    (("nvapi-",), r"\b(?P<head>nvapi-)[A-Za-z0-9_-]{20,}"),
    (("pplx-",), r"\b(?P<head>pplx-)[A-Za-z0-9]{20,}"),
    (("lsv2_",), r"\b(?P<head>lsv2_(?:pt|sk)_)[A-Za-z0-9_]{20,}"),  # LangSmith
    (("dop_v1_",), r"\b(?P<head>dop_v1_)[a-f0-9]{40,}"),  # DigitalOcean
    (("shp",), r"\b(?P<head>shp(?:at|ss|ca|pa)_)[a-fA-F0-9]{20,}"),  # Shopify
    (("ATATT",), r"\b(?P<head>ATATT)[A-Za-z0-9_=-]{20,}"),  # Atlassian
    (("lin_api_",), r"\b(?P<head>lin_api_)[A-Za-z0-9]{20,}"),  # Linear
    (("AGE-SECRET-KEY-1",), r"\b(?P<head>AGE-SECRET-KEY-1)[0-9A-Z]{20,}"),
    (("dapi",), r"\b(?P<head>dapi)[0-9a-f]{32}\b"),
    (("SG.",), r"\b(?P<head>SG\.)[\w-]{16,}\.[\w-]{16,}"),
    (("hooks.slack.com/",), r"(?P<head>hooks\.slack\.com/services/)[A-Za-z0-9/]+"),
    (("/api/webhooks/",), r"(?P<head>discord(?:app)?\.com/api/webhooks/)[A-Za-z0-9/_-]+"),
)
_TOKENS = [(hints, re.compile(p)) for hints, p in _TOKEN_SHAPES]
# Any shape's literal, in one search: a text holding none (nearly every one) is not looked at 35 times.
_ANY_TOKEN_HINT = re.compile("|".join(re.escape(hint) for hints, _ in _TOKEN_SHAPES for hint in hints))

# A key and its separator, never its value (read by ``_pair_value`` only after a secret's key):
# ``key=value``, ``key: value``, ``"key": "value"``, ``'key': 'value'``, ``\"key\": \"value\"``,
# ``--key=value``, ``API key: value``, and fullwidth or lookalike ``=`` and ``:``. A key starts
# only where no key character precedes it, and a run of backslashes only at its first.
_SEP_CHARS = "=\uff1d\ufe66\u207c\u208c\ua78a:\uff1a\ufe55\ua789\u2236"
_QUALIFIERS_RE = "|".join(sorted(_KEY_QUALIFIERS, key=len, reverse=True))
_PAIR_KEY = re.compile(
    r"(?P<kq>(?<!\\)\\+[\"']?|[\"']?)(?<![\w.-])"
    rf"(?:(?P<pre>(?i:{_QUALIFIERS_RE})) )?-*(?P<key>[^\W\d][\w.-]*)(?P=kq)"
    rf"(?P<sep>\s*(?:=>|[{_SEP_CHARS}])\s*)"
)
# ``--api-key value`` on a command line (``=value`` is a pair), and ``'--api-key', 'value'`` in a
# printed argv list.
_FLAG_KEY = re.compile(r"(?<![\w.-])--?(?P<key>[A-Za-z][\w.-]*)(?P<sep>\s+)")
_ARGV_KEY = re.compile(r"(?P<q>[\"'])--?(?P<key>[A-Za-z][\w.-]*)(?P=q)\s*,\s*(?P<q2>[\"'])")
_QUERY_KEY = re.compile(r"[?&;](?P<key>[\w.-]+)=")
_EMPTY = {"null", "none", "None", "false", "False", "", "0"}
_VALUE_CHARS = r"(?:\[REDACTED\]|[^\s,;&}\])'\"<>])+"
# An unquoted value; ``abc,def`` is one value, ``abc,host=db`` two pairs.
_UNQUOTED = re.compile(rf"{_VALUE_CHARS}(?:,(?![\w.-]*\s*[{_SEP_CHARS}]){_VALUE_CHARS})*")
_FLAG_VALUE = re.compile(r"[^\s\"']+")
_QUERY_VALUE = re.compile(r"[^&#\s\"'<>]+")
_QUOTE = re.compile(r"\\*[\"']")
_CLOSING = {q: re.compile(rf"(?:[^{q}\\\n]|\\.)*{q}") for q in "\"'"}  # a quote a backslash escapes is inside
_HEADER_NAMES = re.compile(r"(?i)(?:proxy-)?authorization|(?:set-)?cookie")
# A secret's name in prose, then a space: ``Using token X``, ``with password X``, ``api key X``.
_PROSE_KEY = re.compile(
    r"(?i)(?<![\w.#-])(?:(?:api|access|secret|auth|bearer|private|session|refresh|hf|github) )?"
    r"(?:api key|access key|secret key|private key|token|password|passwd|passphrase|secret|apikey)"
    r"[ \t]+"
)
_CAMEL = re.compile(r"[a-z][A-Z]")
_USER_FLAGS = {"u", "user", "proxy-user"}  # ``curl -u alice:pw``: the part after the colon
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
# A replacement for ``text[start:end]``, or None: keep the text, search on after the key.
_Hit = tuple[int, int, str] | None


def _quoted(text: str, pos: int) -> tuple[str, int, int] | None:
    """The quote at ``pos`` (backslashes included), where its value ends, and where its closing
    quote ends; an unclosed one runs to the end of the line (a truncated message cut it)."""
    q = _QUOTE.match(text, pos)
    if q is None:
        return None
    quote, start = q[0], q.end()
    eol = text.find("\n", start)
    eol = len(text) if eol < 0 else eol
    if len(quote) == 1:
        closing = _CLOSING[quote].match(text, start, eol)
        end = closing.end() - 1 if closing else -1
    else:
        end = text.find(quote, start, eol)
    return (quote, end, end + len(quote)) if end >= 0 else (quote, eol, eol)


def _quoted_hit(text: str, pos: int, quote: str, end: int, after: int, head: str = "") -> _Hit:
    value = text[pos + len(quote) : end]
    if value in _EMPTY or value == REDACTED:
        return None
    closing = quote if after > end else ""
    return pos, after, f"{head}{quote}{REDACTED}{closing}"


def _in_text(key: str, quoted: bool = False) -> bool:
    """A secret's key (``is_secret_key``) names one in text too: not one that only a structured
    value's key is (``_STRUCTURED_ONLY``), nor, unquoted, one that prose uses (``_BARE_PROSE``)."""
    if len(key) > 12:  # longer than any of those, however spelled
        return True
    whole = _joined(key)
    return whole not in _STRUCTURED_ONLY and (quoted or whole not in _BARE_PROSE)


@functools.lru_cache(maxsize=4096)
def _joined(key: str) -> str:
    return "_".join(_words(key))


def _pair_value(m: re.Match, text: str) -> _Hit:
    key = m["key"]
    secret = (is_secret_key(key) and _in_text(key, bool(m["kq"]))) or (
        m["pre"] is not None and is_secret_key(f"{m['pre']}_{key}")
    )
    if not secret or _HEADER_NAMES.fullmatch(key):
        return None
    pos = m.end()
    if text.startswith(REDACTED, pos):
        return None
    quoted = _quoted(text, pos)
    if quoted is not None:
        return _quoted_hit(text, pos, *quoted)
    if text.startswith(("[", "{"), pos):  # ``"tokens": ["a", "b"]``: the whole list
        end = _bracketed(text, pos)
    else:
        value = _UNQUOTED.match(text, pos)
        if value is None or value[0] in _EMPTY or (value[0].isdigit() and _counts(key)):
            return None
        end = value.end()
    return pos, end, f'"{REDACTED}"' if m["kq"] == '"' else REDACTED  # JSON stays JSON


def _counts(key: str) -> bool:
    """A ``token``/``tokens`` key holding a whole number counts tokens (SGLang's ``#token: 38``)."""
    return _words(key)[-1:] in (["token"], ["tokens"])


_BRACKETS = {"[": re.compile(r"[\[\]\n]"), "{": re.compile(r"[{}\n]")}


def _bracketed(text: str, pos: int) -> int:
    """The end of the list or object opened at ``pos`` (or of its line, if it is not closed there)."""
    opening, depth = text[pos], 0
    for m in _BRACKETS[opening].finditer(text, pos):
        if m[0] == "\n":
            return m.start()
        depth += 1 if m[0] == opening else -1
        if depth == 0:
            return m.end()
    return len(text)


def _flag_value(m: re.Match, text: str) -> _Hit:
    key, pos = m["key"], m.end()
    if key in _USER_FLAGS:  # ``-u alice:pw``
        value = _FLAG_VALUE.match(text, pos)
        colon = value[0].find(":") if value else -1
        secret = value[0][colon + 1 :] if value else ""
        if colon < 0 or not secret or secret == REDACTED or secret.isdigit():  # ``-u 1000:1000`` is a uid:gid
            return None
        return pos + colon + 1, value.end(), REDACTED
    if not (is_secret_key(key) and _in_text(key)) or text.startswith(REDACTED, pos):
        return None
    quoted = _quoted(text, pos)
    if quoted is not None:
        return _quoted_hit(text, pos, *quoted)
    value = _FLAG_VALUE.match(text, pos)
    if value is None or value[0] in _PROSE:
        return None
    if value[0].startswith("-") and (value[0].startswith("--") or len(value[0]) <= 2):
        return None  # the next flag (``--port``, ``-v``); ``--api-key -abcSecret`` is a value
    return pos, value.end(), REDACTED


def _argv_value(m: re.Match, text: str) -> _Hit:
    if not (is_secret_key(m["key"]) and _in_text(m["key"])):
        return None
    pos = m.start("q2")
    quoted = _quoted(text, pos)
    return None if quoted is None else _quoted_hit(text, pos, *quoted)


def _query_value(m: re.Match, text: str) -> _Hit:
    key = m["key"]
    if not (is_secret_key(key) or key.lower() in _QUERY_NAMES) or text.startswith(REDACTED, m.end()):
        return None
    value = _QUERY_VALUE.match(text, m.end())
    return None if value is None else (m.end(), value.end(), REDACTED)


def _prose_value(m: re.Match, text: str) -> _Hit:
    """``Using token Tk7pQ2mZx9``: a word after a secret's name in prose, when it looks like a
    credential (letters and digits, or camel case, 8 characters or more), never a common word
    (``token usage``, ``password authentication failed``) or a number."""
    value = _FLAG_VALUE.match(text, m.end())
    if value is None or value[0].startswith(REDACTED) or not _credential_like(value[0].rstrip(".,;:)")):
        return None
    return m.end(), m.end() + len(value[0].rstrip(".,;:)")), REDACTED


def _credential_like(word: str) -> bool:
    letters = any(c.isalpha() for c in word)
    return (
        len(word) >= 8
        and letters
        and (any(c.isdigit() for c in word) or _CAMEL.search(word) is not None)
        and "://" not in word
        and not word.startswith(("/", "./", "~"))
    )


def _scan(pattern: re.Pattern, text: str, value: Callable[[re.Match, str], _Hit]) -> str:
    """Each key ``pattern`` finds gets its value replaced if ``value`` says so; the search goes on
    after the replaced value or after the key, so ``note: password=x`` still finds ``password=x``
    inside the value of ``note``, and nothing is read twice."""
    out, done, pos = [], 0, 0
    while (m := pattern.search(text, pos)) is not None:
        hit = value(m, text)
        if hit is None:
            pos = m.end()
            continue
        start, end, new = hit
        out += [text[done:start], new]
        done = pos = max(end, m.end())
    out.append(text[done:])
    return "".join(out)


def _go_dsns(text: str) -> str:
    """``user:pw@tcp(db)/x``: the password between the user's colon and ``@tcp(``."""
    out, done, floor = [], 0, 0
    for m in _GO_DSN.finditer(text):
        at = m.start()
        start = max(floor, *(text.rfind(c, floor, at) + 1 for c in " \t\n\"'=,("))  # where the DSN starts
        colon = text.find(":", start, at)
        floor = m.end()
        if colon < 0 or colon + 1 == at or text[colon + 1 : at] == REDACTED:
            continue
        out += [text[done : colon + 1], REDACTED]
        done = at
    out.append(text[done:])
    return "".join(out)


# A cheap first look: text with no separator, flag or header word (most attribute values) has no pair.
_STRUCTURE_HINT = re.compile(rf"[{_SEP_CHARS}@]|-----BEGIN|(?<![\w-])--?[A-Za-z]|(?i:bearer|basic|cookie)")
_KEEP_HEAD = _keep("head")
# What ``_PROSE_KEY`` cannot match without (most text, ``max_total_tokens=4096`` too, holds none).
_PROSE_WORDS = tuple(
    f"{w}{gap}" for w in ("token", "password", "passwd", "passphrase", "secret", "apikey", "key") for gap in " \t"
)


def _redact(text: str) -> str:
    if _STRUCTURE_HINT.search(text):
        if "-----BEGIN" in text:
            text = _PEM.sub(lambda m: m["head"] + REDACTED + m["tail"], text)
        if ":/" in text:
            text = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
        if "@" in text:
            text = _go_dsns(text)
        lower = text.lower()
        for word, pattern in (("authorization", _HEADER), ("cookie", _COOKIE), ("bearer", _BEARER), ("basic", _BASIC)):
            if word in lower:
                text = pattern.sub(_KEEP_HEAD, text)
        text = _scan(_ARGV_KEY, text, _argv_value)
        text = _scan(_FLAG_KEY, text, _flag_value)
        text = _scan(_PAIR_KEY, text, _pair_value)
        text = _scan(_QUERY_KEY, text, _query_value)
    lower = text.lower()
    if any(word in lower for word in _PROSE_WORDS):  # a secret's name, then a space or a tab
        text = _scan(_PROSE_KEY, text, _prose_value)
    if _ANY_TOKEN_HINT.search(text):
        for hints, pattern in _TOKENS:
            if any(hint in text for hint in hints):
                text = pattern.sub(_KEEP_HEAD, text)
    return text


def _cut(text: str, limit: int, dropped: int = 0) -> str:
    """``text`` in at most ``limit`` characters: its head and its end, and how many were cut."""
    if len(text) <= limit and not dropped:
        return text
    keep = max(limit - 48, 0)  # the marker is shorter than 48 characters
    cut = len(text) - keep + dropped
    return f"{text[: keep // 2]} [… {cut} characters cut …] {text[len(text) - (keep - keep // 2) :]}"


_MEMO_TEXT, _MEMO_SIZE = 256, 4096  # texts this short are remembered, this many at most (≤ 3 MB)
_memo: dict[tuple[str, int | None], str] = {}  # (text, limit) -> redacted: a pure function's answers


def redact_text(text: str, limit: int | None = MAX_TEXT) -> str:
    """``text`` with every credential we can recognise replaced by ``[REDACTED]``, in at most
    ``limit`` characters (None: a whole file, which its reader bounds)."""
    if not isinstance(text, str):
        text = str(text)
    if len(text) > _MEMO_TEXT:
        return _redact_text(text, limit)
    hit = _memo.get((text, limit))  # names and values repeat in every record of a journal
    if hit is None:
        if len(_memo) >= _MEMO_SIZE:
            _memo.clear()
        hit = _memo[(text, limit)] = _redact_text(text, limit)
    return hit


def _redact_text(text: str, limit: int | None) -> str:
    dropped = 0
    if limit is not None and len(text) > MAX_SCAN:  # the middle would be cut anyway: not read
        half = MAX_SCAN // 2
        dropped = len(text) - 2 * half
        text = f"{text[:half]}\n{text[-half:]}"
        dropped -= 1
    text = _redact(text)
    return text if limit is None else _cut(text, limit, dropped)


# -- terminal --------------------------------------------------------------------------------------
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
    """``value`` as a string safe to print: no escape sequence (OSC 52 writes the reader's
    clipboard, CSI moves the cursor over earlier lines), no control character (C0, C1, DEL,
    bidirectional overrides); a line break or tab becomes a space, so a value stays on its row."""
    text = value if isinstance(value, str) else "" if value is None else str(value)
    if text.isprintable():  # the usual case: nothing to remove
        return text
    return _CONTROL.sub("", _BLANK.sub(" ", _SEQUENCES.sub("", text)))


def printable(value: Any) -> str:
    """``value`` as one line any process of ours may print or log: escape sequences removed (first,
    so one cannot split a secret's name), redacted and capped (``redact_text``), cleaned."""
    text = value if isinstance(value, str) else "" if value is None else str(value)
    if not text.isprintable():
        text = _SEQUENCES.sub("", text)
    return clean(redact_text(text))


def _printable_record(record: logging.LogRecord) -> bool:
    """Our logger's warnings are printed lines too: each is made ``printable`` before any handler
    (SGLang's, the root's, logging's last resort) writes it."""
    try:
        record.msg, record.args = printable(record.getMessage()), None
    except Exception:  # a bad format: logging says so itself
        pass
    return True


logging.getLogger("sglang_phasetrace").addFilter(_printable_record)


# -- structured values -----------------------------------------------------------------------------
_FLAG_ITEM = re.compile(r"--?(?P<key>[A-Za-z][\w.-]*)")


def _redact_json_text(text: str, depth: int) -> str | None:
    """JSON held in a string (``model_loader_extra_config``): parsed, redacted, written back; None
    when it is not JSON (or nests deeper than the parser goes)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, (dict, list)):
        return None
    clean = redact(data, _depth=depth)
    return text if clean is data else json.dumps(clean)


def _unset(value: Any) -> bool:
    """``None``, ``""``, ``False`` (and 0): "no key set" is worth seeing."""
    return value is None or (isinstance(value, (str, int, float)) and not value)


def redact(value: Any, key: str = "", _depth: int = 0) -> Any:
    """Return ``value`` with secrets replaced, recursing through mappings and sequences (to
    ``MAX_DEPTH``); a value with nothing to replace is returned as it is (the same object)."""
    if key and not _unset(value) and is_secret_key(key) and not (isinstance(value, int) and _counts(key)):
        return REDACTED
    if isinstance(value, str):
        if value.startswith(("{", "[")):
            parsed = _redact_json_text(value, _depth + 1)
            if parsed is not None:
                return parsed
        clean = redact_text(value)
        return value if clean == value else clean
    if not isinstance(value, (Mapping, list, tuple)):
        return value
    if _depth >= MAX_DEPTH:
        return TOO_DEEP
    if isinstance(value, Mapping):
        out = {k: redact(v, str(k), _depth + 1) for k, v in value.items()}
        return value if type(value) is dict and all(out[k] is v for k, v in value.items()) else out
    items = []
    for i, item in enumerate(value):
        flag = _FLAG_ITEM.fullmatch(value[i - 1]) if i and isinstance(value[i - 1], str) else None
        if flag and isinstance(item, str) and item and is_secret_key(flag["key"]):
            items.append(REDACTED)  # ["--api-key", "sk-…"]
        else:
            items.append(redact(item, _depth=_depth + 1))
    return value if all(a is b for a, b in zip(items, value, strict=True)) else items
