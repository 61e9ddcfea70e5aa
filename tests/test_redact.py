"""Secrets never reach span attributes, journal records or exported spans.

The end-to-end check (a real ``--api-key`` through ``sglang.launch_server``, absent from every
journal and every span the OTLP receiver got) is in ``test_traced_start.py``; here the rules.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap

import pytest
from conftest import read_journal
from sglang_phasetrace.patches._attrs import server_args_attrs, server_args_json
from sglang_phasetrace.tracing.recorder import runtime
from sglang_phasetrace.tracing.recorder.spans import clean_attrs
from sglang_phasetrace.tracing.redact import MAX_DEPTH, MAX_TEXT, REDACTED, TOO_DEEP, is_secret_key, redact, redact_text

SECRET = "s3cr3t-VALUE-42"


@pytest.mark.parametrize(
    "key",
    [
        "api_key",
        "admin_api_key",
        "hf_token",
        "ssl_keyfile_password",
        "HF_TOKEN",
        "apiKey",
        "authorization",
        "aws_secret_access_key",
        "db_password",
        "client_secret",
        "sglang.api_key",
        "private_key",
        "session_cookie",
        "x-auth-token",
        # issue 29: structured keys that kept their value
        "sas",
        "session",
        "connection_string",
        "tokens",
        "privkey",
        "x-honeycomb-team",
        "PGPASSWORD",
        "api_tokens",
        "\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44",  # fullwidth
    ],
)
def test_secret_keys(key):
    assert is_secret_key(key)
    assert redact(SECRET, key) == REDACTED


@pytest.mark.parametrize(
    "key",
    [
        "req_to_token_pool_size",
        "max_total_tokens",
        "tokenizer_path",
        "skip_tokenizer_init",
        "max_prefill_tokens",
        "token_to_kv_pool",
        "tokenizer_mode",
        "ssl_keyfile",
        "kv_cache_dtype",
        "sglang.max_total_num_tokens",
        "sglang.req_to_token_pool_size",
        "num_tokens",
        "hash_key",
        "prompt_tokens",
        "new_token",
        "pad_token",
        "eos_token",
        "special_tokens",
        "enable_session_radix_cache",
        "forward_passes",
    ],
)
def test_ordinary_keys_are_kept(key):
    assert not is_secret_key(key)
    assert redact(4096, key) == 4096
    assert redact("/models/tiny", key) == "/models/tiny"


def test_empty_secret_values_are_left_as_they_are():
    assert redact(None, "api_key") is None  # "no key set" is worth seeing
    assert redact("", "api_key") == ""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("https://user:pa55@hub.example.com/org/model", f"https://{REDACTED}@hub.example.com/org/model"),
        ("postgres://admin:hunter2@db:5432/x", f"postgres://{REDACTED}@db:5432/x"),
        # a mistyped DSN with one slash: once a directory's name (issue 49)
        ("postgresql:/phasetrace:hunter2@127.0.0.1:5432/fleet", f"postgresql:/{REDACTED}@127.0.0.1:5432/fleet"),
        (
            "./postgresql:/phasetrace:hunter2@10.0.0.5:5432/fleet/history.sqlite-wal",
            f"./postgresql:/{REDACTED}@10.0.0.5:5432/fleet/history.sqlite-wal",
        ),
        ("/data/a:b/c@d", "/data/a:b/c@d"),
        ("https://ghp_abcdef@github.com/org/repo.git", f"https://{REDACTED}@github.com/org/repo.git"),
        ("http://127.0.0.1:30000/generate", "http://127.0.0.1:30000/generate"),
        ("tcp://127.0.0.1:25753", "tcp://127.0.0.1:25753"),
        ("/models/tiny-llama", "/models/tiny-llama"),
    ],
)
def test_url_credentials(text, expected):
    assert redact_text(text) == expected
    assert redact(text, "sglang.model_path") == expected


def test_secret_query_parameters():
    url = "https://s3.example.com/w.safetensors?X-Amz-Signature=abc123&X-Amz-Date=20260101&token=t0k&rev=main"
    out = redact_text(url)
    assert "abc123" not in out and "t0k" not in out
    assert "X-Amz-Date=20260101" in out and "rev=main" in out
    assert f"X-Amz-Signature={REDACTED}" in out and f"token={REDACTED}" in out
    assert redact_text("https://hub/x?api_key=k1&page=2") == f"https://hub/x?api_key={REDACTED}&page=2"


def test_nested_structures():
    data = {
        "model_path": "/m",
        "api_key": SECRET,
        "max_total_tokens": 4096,
        "nested": {"hf_token": SECRET, "tokenizer_path": "/t", "items": [{"ssl_keyfile_password": SECRET}]},
        "urls": ["https://u:" + SECRET + "@h/x", "https://h/x?signature=" + SECRET],
        "tuple": ("a", {"password": SECRET}),
    }
    out = redact(data)
    assert SECRET not in json.dumps(out)
    assert out["api_key"] == out["nested"]["hf_token"] == out["nested"]["items"][0]["ssl_keyfile_password"] == REDACTED
    assert out["model_path"] == "/m" and out["max_total_tokens"] == 4096 and out["nested"]["tokenizer_path"] == "/t"
    assert data["api_key"] == SECRET, "the input is not modified"


# Stand-ins for SGLang's ServerArgs (a dataclass in 0.5.x; the real one, with a real --api-key, is
# exercised end to end in test_traced_start.py): the three shapes server_args_json accepts.
@dataclasses.dataclass
class DataclassArgs:
    model_path: str = "/models/tiny"
    tokenizer_path: str = "/models/tiny"
    tp_size: int = 2
    max_total_tokens: int = 4096
    api_key: str = SECRET
    admin_api_key: str | None = None
    hf_token: str = SECRET
    ssl_keyfile_password: str = SECRET
    json_model_override_args: dict = dataclasses.field(default_factory=lambda: {"rope": {"auth_token": SECRET}})
    download_dir: str = f"https://me:{SECRET}@mirror.example.com/models"


try:  # SGLang's own dependency; 0.5.x uses msgspec structs for some of its arguments
    import msgspec
except ImportError:  # pragma: no cover
    msgspec = None
else:

    class StructArgs(msgspec.Struct):
        model_path: str = "/models/tiny"
        max_total_tokens: int = 4096
        api_key: str = SECRET
        nested: dict = msgspec.field(default_factory=lambda: {"hf_token": SECRET, "req_to_token_pool_size": 48})


class PlainArgs:
    def __init__(self) -> None:
        self.model_path, self.api_key, self.req_to_token_pool_size = "/models/tiny", SECRET, 48


ARGS = [pytest.param(DataclassArgs(), id="dataclass"), pytest.param(PlainArgs(), id="object")]
if msgspec is not None:
    ARGS.append(pytest.param(StructArgs(), id="msgspec"))


@pytest.mark.parametrize("args", ARGS)
def test_server_args_json_is_redacted(args):
    text = server_args_json(args)
    assert SECRET not in text
    data = json.loads(text)
    assert data["api_key"] == REDACTED and data["model_path"] == "/models/tiny"
    if "max_total_tokens" in data:
        assert data["max_total_tokens"] == 4096
    if "nested" in data:
        assert data["nested"] == {"hf_token": REDACTED, "req_to_token_pool_size": 48}
    if "json_model_override_args" in data:
        assert data["json_model_override_args"] == {"rope": {"auth_token": REDACTED}}
        assert data["download_dir"] == f"https://{REDACTED}@mirror.example.com/models"
        assert data["admin_api_key"] is None and data["tokenizer_path"] == "/models/tiny"


def test_server_args_attrs_and_span_attributes_are_redacted():
    attrs = clean_attrs(server_args_attrs(DataclassArgs()))
    assert SECRET not in json.dumps(attrs)
    assert attrs["sglang.model_path"] == "/models/tiny" and attrs["sglang.tp_size"] == 2
    direct = clean_attrs(
        {
            "sglang.api_key": SECRET,
            "sglang.url": f"http://a:{SECRET}@h",
            "sglang.max_total_tokens": 4096,
            "sglang.none": None,
        }
    )
    assert direct == {"sglang.api_key": REDACTED, "sglang.url": f"http://{REDACTED}@h", "sglang.max_total_tokens": 4096}


def test_warning_records_are_redacted(trace_run_dir):
    rt = runtime.current().start()
    rt.warn(f"exporter failed for https://user:{SECRET}@collector:4318/v1/traces")
    records, problems = read_journal(rt.journal.path)
    assert problems == []
    (warning,) = [r for r in records if r["kind"] == "warning"]
    assert SECRET not in warning["message"] and REDACTED in warning["message"]


def test_no_server_arg_of_sglang_is_taken_for_a_secret_but_the_secret_ones():
    server_args = pytest.importorskip("sglang.srt.server_args")
    names = getattr(server_args.ServerArgs, "__struct_fields__", None) or [
        f.name for f in dataclasses.fields(server_args.ServerArgs)
    ]
    secret = {"api_key", "admin_api_key", "ssl_keyfile_password", "watermark_key", "watermark_key_b", "hf_token"}
    assert len(names) > 100
    assert {n for n in names if is_secret_key(n)} <= secret
    assert "api_key" in names and is_secret_key("api_key")


# issue 29, item 3: text anyone who can write a journal or the rendezvous store hands the readers.
# The old ``_PAIR`` search restarted after each key that was not a secret and read its value again:
# 16 kB of ``a=`` took 2.3 s and 56 kB of ``ab://x:`` 20 s. Each shape here is ~56 kB.
ADVERSARIAL = ["a=", "ab://x:", "?a=", "x=1 a.", "x=1 -a.", "-eyJ", "\\", "a.b://", "?://@tcp(aeyJ", "@'sk-}0"]


def test_adversarial_text_is_redacted_in_linear_time():
    """All shapes, whole (no cap) and capped, in a child given 20 s: the old code needs minutes;
    this one about a second on a busy 2-core machine (``scripts/bench_redact.py`` has the figures)."""
    program = textwrap.dedent(
        f"""
        from sglang_phasetrace.tracing.redact import redact_text
        for unit in {ADVERSARIAL!r}:
            text = (unit * (56_000 // len(unit) + 1))[:56_000] + " password=tail-secret-77"
            for limit in (None, 16384):
                assert "tail-secret-77" not in redact_text(text, limit), unit
        print("done")
        """
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-2000:]


def test_one_field_is_capped_with_a_visible_marker():
    text = "HEAD password=head-secret-1 " + "x" * 100_000 + " token=tail-secret-2 TAIL"
    out = redact_text(text)
    assert len(out) <= MAX_TEXT
    assert out.startswith("HEAD password=[REDACTED]") and out.endswith("token=[REDACTED] TAIL")
    assert "head-secret-1" not in out and "tail-secret-2" not in out
    cut = int(out.split(" [… ")[1].split(" characters cut …] ")[0])
    assert cut == len(redact_text(text, None)) - (len(out) - len(f" [… {cut} characters cut …] "))
    assert redact_text(out) == out, "a capped field is not cut again"
    assert redact_text(text, None).count("x") == 100_000, "a whole file (limit=None) is not cut"
    huge = "token=first-secret-3 " + "y" * 3_000_000 + " api_key=last-secret-4"  # past MAX_SCAN: the middle is not read
    out = redact_text(huge)
    assert len(out) <= MAX_TEXT and "secret-3" not in out and "secret-4" not in out
    assert int(out.split(" [… ")[1].split(" ")[0]) > 2_900_000
    record = redact({"message": "z" * 50_000, "n": 1})
    assert len(record["message"]) <= MAX_TEXT and record["n"] == 1


def _nest(depth: int, leaf: object) -> object:
    value = leaf
    for i in range(depth):
        value = {"unknown": value} if i % 2 else [value]
    return value


def test_deep_nesting_is_cut_not_a_crash():
    """issue 29, item 6: an unknown field nested 900 deep (a 6 kB journal line) stopped ``bundle``
    with RecursionError inside ``redact``."""
    record = {"kind": "begin", "attrs": {"x": _nest(900, {"api_key": "deep-secret-5"})}}  # no writer of ours makes it
    out = redact(record)
    text = json.dumps(out)
    assert "deep-secret-5" not in text and TOO_DEEP in text
    assert text.count("[") + text.count("{") <= MAX_DEPTH + 2
    line = json.dumps(_nest(900, "v"))  # JSON held in a string, as deep
    assert TOO_DEEP in redact(line, "model_loader_extra_config")
    assert len(redact("[" * 100_000, "x")) <= MAX_TEXT, "not JSON the parser can take: capped text"
    shallow = {"a": [{"b": 1}], "model_path": "/m"}
    assert redact(shallow) is shallow, "nothing to hide: the same object back"
