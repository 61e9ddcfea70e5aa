"""No secret survives anywhere we write: a corpus of secret shapes, unit level and end to end.

Each corpus entry is a realistic piece of free text (an exception message, a log line, an
argument value) holding a distinctive secret, and a piece of its context that must stay readable.
Unit level: ``redact_text`` and ``redact`` remove every secret and keep the context. End to end:
real SGLang ranks fail inside a traced phase with the whole corpus in their exception (chained,
so the traceback holds it twice) and secrets in the server args, under ``phasetrace run`` with an
OTLP receiver attached; no secret may appear in any file of the run directory (journals, status,
stacks, report.html, exports), in what the CLI prints, or in any byte the receiver got.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import NamedTuple

import pytest
from conftest import ROOT, free_port, requires_sglang, run_program
from otlp_receiver import OtlpReceiver
from sglang_phasetrace.tracing.recorder.spans import exception_attrs
from sglang_phasetrace.tracing.redact import REDACTED, redact, redact_text

PROGRAM = ROOT / "tests" / "programs" / "secret_ranks.py"


class Shape(NamedTuple):
    name: str
    text: str
    secrets: tuple[str, ...]  # substrings that must not survive
    keep: str  # context that must


def _fake(prefix: str, n: int, alphabet: str = "Zq7Lm2Xw9Rt4Vb8Nc3") -> str:
    """A token of the provider's shape: its prefix and ``n`` characters, unique per call site."""
    return prefix + (alphabet * (n // len(alphabet) + 1))[:n]


HF = _fake("hf_", 34)
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJ0ZXN0LXVzZXItNDIiLCJpYXQiOjE3MDAwMDAwMDB9."
    "c2lnbmF0dXJlLWZvci1qd3QtY29ycHVz"
)
PEM_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7pemcorpusRSA"
SSH_BODY = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABcorpusSSH"

CORPUS: list[Shape] = [
    # credentials in URLs
    Shape(
        "url-userinfo",
        "could not fetch https://alice:Pa55w0rd-url1@hub.example.com/org/m",
        ("Pa55w0rd-url1",),
        "hub.example.com/org/m",
    ),
    Shape(
        "url-at-in-password",
        "GET https://alice:p@ss@w0rdAt2@hub.example.com/m failed",
        ("p@ss@w0rdAt2", "w0rdAt2"),
        "hub.example.com/m failed",
    ),
    Shape(
        "url-space-in-password",
        "mirror https://alice:open sesame 33x@hub.example.com/m is down",
        ("open sesame 33x", "sesame 33x"),
        "hub.example.com/m is down",
    ),
    Shape(
        "url-token-user",
        "git clone https://ghs_cloneTokenUser44aa@github.com/org/repo.git",
        ("ghs_cloneTokenUser44aa", "cloneTokenUser44aa"),
        "github.com/org/repo.git",
    ),
    Shape(
        "postgres-dsn",
        "connect postgresql://svc:Db-Secret-55@db.internal:5432/app refused",
        ("Db-Secret-55",),
        "db.internal:5432/app refused",
    ),
    Shape("redis-empty-user", "redis://:R3disPass66@cache:6379/0 timed out", ("R3disPass66",), "cache:6379/0"),
    Shape(
        "mongodb-srv",
        "mongodb+srv://app:M0ngoPw77@cluster0.x.mongodb.net/db",
        ("M0ngoPw77",),
        "cluster0.x.mongodb.net/db",
    ),
    # secret query parameters
    Shape("query-token", "download https://hub/x.safetensors?token=qtok88xyz&rev=main", ("qtok88xyz",), "rev=main"),
    Shape(
        "query-amz-signature",
        "https://s3.example.com/w?X-Amz-Date=20260101&X-Amz-Signature=amzsig99abcdef&X-Amz-Expires=300",
        ("amzsig99abcdef",),
        "X-Amz-Expires=300",
    ),
    Shape(
        "query-amz-credential",
        "https://s3/w?X-Amz-Credential=AKIAQQQQWWWWEEEERRRR%2F20260101&x=1",
        ("AKIAQQQQWWWWEEEERRRR",),
        "x=1",
    ),
    Shape(
        "query-amz-security-token",
        "https://s3/w?X-Amz-Security-Token=FwoGZXIvsesstok10&part=2",
        ("FwoGZXIvsesstok10",),
        "part=2",
    ),
    Shape("query-access-token", "https://api/x?access_token=acctok11zz&page=2", ("acctok11zz",), "page=2"),
    Shape("query-auth", "https://api/x?auth=authq12zz&v=1", ("authq12zz",), "v=1"),
    Shape("query-pw", "https://nas/share?user=bob&pw=pwq13zz", ("pwq13zz",), "user=bob"),
    Shape(
        "query-azure-sas",
        "https://acct.blob.core.windows.net/c/w?sv=2022-11-02&sp=r&sig=AbCsas14%2Bdef%3D",
        ("AbCsas14",),
        "sv=2022-11-02",
    ),
    Shape("query-api-key", "https://hub/x?api_key=apikq15zz&limit=3", ("apikq15zz",), "limit=3"),
    Shape(
        "query-goog-signature",
        "https://storage.googleapis.com/b/o?X-Goog-Signature=googsig16ff&alt=media",
        ("googsig16ff",),
        "alt=media",
    ),
    # Authorization and friends
    Shape(
        "authorization-bearer",
        "request failed with Authorization: Bearer brtok17.abc-def",
        ("brtok17",),
        "request failed with",
    ),
    Shape(
        "authorization-basic",
        "Authorization: Basic YWxpY2U6c2VjcmV0MTg= rejected",
        ("YWxpY2U6c2VjcmV0MTg",),
        "rejected",
    ),
    Shape("bearer-bare", "retrying with Bearer bare19tokenvalue after 401", ("bare19tokenvalue",), "after 401"),
    Shape(
        "proxy-authorization",
        "Proxy-Authorization: Basic cHJveHk6cHcyMA== at proxy:3128",
        ("cHJveHk6cHcyMA",),
        "proxy:3128",
    ),
    Shape(
        "headers-dict-repr",
        "headers={'Authorization': 'Bearer hdr21tok', 'User-Agent': 'sglang/0.5'}",
        ("hdr21tok",),
        "'User-Agent': 'sglang/0.5'",
    ),
    Shape("cookie-header", "Cookie: session=ck22sessionvalue; theme=dark", ("ck22sessionvalue",), "Cookie"),
    Shape("x-api-key-header", "sent X-Api-Key: xak23keyvalue to the gateway", ("xak23keyvalue",), "to the gateway"),
    Shape(
        "private-token-header", "Private-Token: ptk24value rejected by gitlab", ("ptk24value",), "rejected by gitlab"
    ),
    # provider token shapes, bare in free text
    Shape("hf-token", f"401 Client Error for model org/m (token {HF})", (HF[3:],), "401 Client Error"),
    Shape("openai-sk", f"openai key {_fake('sk-', 48)} is invalid", (_fake("sk-", 48)[3:],), "is invalid"),
    Shape(
        "openai-sk-proj",
        f"using {_fake('sk-proj-', 56, 'Pr0jAbCd')}!",
        (_fake("sk-proj-", 56, "Pr0jAbCd")[8:],),
        "using",
    ),
    Shape(
        "anthropic-sk-ant",
        f"ANTHROPIC key {_fake('sk-ant-api03-', 60, 'AnThR0p1c')} expired",
        (_fake("sk-ant-api03-", 60, "AnThR0p1c")[13:],),
        "expired",
    ),
    Shape(
        "aws-access-key-id",
        "AccessDenied for AKIAIOSFODNN7EXAMPL2 on bucket weights",
        ("IOSFODNN7EXAMPL2",),
        "on bucket weights",
    ),
    Shape(
        "aws-session-key-id",
        "assumed ASIAY34FZKBOKMUTVV7A with aws_session_token=FQoGZXIvYXdzsess29",
        ("Y34FZKBOKMUTVV7A", "FQoGZXIvYXdzsess29"),
        "assumed",
    ),
    Shape(
        "aws-secret-ini",
        "[default]\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYsecret30\nregion=x",
        ("wJalrXUtnFEMI/K7MDENG",),
        "region=x",
    ),
    Shape(
        "aws-secret-env",
        "env: AWS_SECRET_ACCESS_KEY=je7MtGbClwBF/2Zp9Utk/h3yCo8nvbsecret31 AWS_REGION=us-east-1",
        ("je7MtGbClwBF",),
        "AWS_REGION=us-east-1",
    ),
    Shape(
        "github-ghp",
        f"push rejected for {_fake('ghp_', 36, 'GhP32tok')}",
        (_fake("ghp_", 36, "GhP32tok")[4:],),
        "push rejected",
    ),
    Shape(
        "github-gho", f"oauth {_fake('gho_', 36, 'GhO33tok')} revoked", (_fake("gho_", 36, "GhO33tok")[4:],), "revoked"
    ),
    Shape(
        "github-pat",
        f"token {_fake('github_pat_', 82, 'Pat34xY_')} lacks scope",
        (_fake("github_pat_", 82, "Pat34xY_")[11:],),
        "lacks scope",
    ),
    Shape("gitlab-pat", f"glpat {_fake('glpat-', 20, 'GlPat35')} ok?", (_fake("glpat-", 20, "GlPat35")[6:],), "ok?"),
    Shape("slack-bot", "notify via xoxb-1234567890-0987654321-SlackBot36Tok failed", ("SlackBot36Tok",), "failed"),
    Shape("slack-user", "xoxp-1111111111-2222222222-SlackUsr37Tok", ("SlackUsr37Tok",), ""),
    Shape(
        "slack-webhook",
        "POST https://hooks.slack.com/services/T000A38/B000B38/XyZwebhook38secret -> 404",
        ("XyZwebhook38secret",),
        "-> 404",
    ),
    Shape("jwt", f"token rejected: {JWT} (expired)", (JWT.split(".")[1], JWT.split(".")[2]), "(expired)"),
    Shape(
        "pem-rsa",
        f"key file:\n-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n-----END RSA PRIVATE KEY-----\nloaded",
        (PEM_BODY,),
        "loaded",
    ),
    Shape(
        "pem-openssh-escaped",
        f"ValueError('-----BEGIN OPENSSH PRIVATE KEY-----\\n{SSH_BODY}\\n-----END OPENSSH PRIVATE KEY-----\\n')",
        (SSH_BODY,),
        "ValueError",
    ),
    Shape(
        "pem-truncated",
        f"-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIEcTruncated41{PEM_BODY[:20]}",
        ("MHcCAQEEIEcTruncated41",),
        "",
    ),
    Shape(
        "google-api-key",
        f"maps key {_fake('AIza', 35, 'SyGoog42')} over quota",
        (_fake("AIza", 35, "SyGoog42")[4:],),
        "over quota",
    ),
    Shape(
        "npm-token",
        f"//registry.npmjs.org/:_authToken={_fake('npm_', 36, 'Npm43')}",
        (_fake("npm_", 36, "Npm43")[4:],),
        "registry.npmjs.org",
    ),
    Shape(
        "pypi-token",
        f"twine password {_fake('pypi-', 80, 'AgEIcHlwaS44')}",
        (_fake("pypi-", 80, "AgEIcHlwaS44")[5:],),
        "twine",
    ),
    Shape(
        "stripe-live",
        f"charge with {_fake('sk_live_', 24, 'Str1pe45')}",
        (_fake("sk_live_", 24, "Str1pe45")[8:],),
        "charge with",
    ),
    Shape(
        "nvidia-ngc", f"NGC_API_KEY? no: {_fake('nvapi-', 64, 'NgC46x')}", (_fake("nvapi-", 64, "NgC46x")[6:],), "NGC"
    ),
    Shape("sendgrid", "mail via SG.sendgrid47abcdefgh.sendgrid47ijklmnopqrstuvwx", ("sendgrid47ijklmnop",), "mail via"),
    Shape(
        "docker-pat",
        f"docker login -p {_fake('dckr_pat_', 27, 'Dckr48')}",
        (_fake("dckr_pat_", 27, "Dckr48")[9:],),
        "docker login",
    ),
    Shape(
        "discord-webhook",
        "https://discord.com/api/webhooks/1234/Disc49webhookTokenValue failed",
        ("Disc49webhookTokenValue",),
        "failed",
    ),
    # key=value and JSON pairs in free text
    Shape("password-kv", "login failed: user=alice password=hunter2-kv50 host=db", ("hunter2-kv50",), "host=db"),
    Shape(
        "json-api-key", 'bad config {"api_key": "jsonkey51value", "tp_size": 2}', ("jsonkey51value",), '"tp_size": 2'
    ),
    Shape(
        "python-dict-hf-token",
        "kwargs={'hf_token': 'pyrepr52value', 'revision': 'main'}",
        ("pyrepr52value",),
        "'revision': 'main'",
    ),
    Shape(
        "env-hf-token",
        "HF_TOKEN=envtok53value python -m sglang.launch_server",
        ("envtok53value",),
        "python -m sglang.launch_server",
    ),
    Shape(
        "yaml-client-secret",
        "oauth:\n  client_id: app\n  client_secret: yaml54secret\n",
        ("yaml54secret",),
        "client_id: app",
    ),
    Shape(
        "cli-flag-space",
        "launch_server --model-path /m --api-key cliflag55value --port 30000",
        ("cliflag55value",),
        "--port 30000",
    ),
    Shape("cli-flag-equals", "launch_server --api-key=cliflag56value --tp 2", ("cliflag56value",), "--tp 2"),
    Shape(
        "argv-list-repr",
        "argv ['--admin-api-key', 'argv57value', '--tp-size', '2']",
        ("argv57value",),
        "'--tp-size', '2'",
    ),
    Shape(
        "watermark-key",
        "watermark_key=58583858 watermark_context_window=4",
        ("58583858",),
        "watermark_context_window=4",
    ),
    Shape(
        "ssl-keyfile-password",
        "ssl_keyfile_password: sslpw59value (ssl_keyfile=/etc/k.pem)",
        ("sslpw59value",),
        "ssl_keyfile=/etc/k.pem",
    ),
    Shape("passphrase", "unlock with passphrase='pass phrase 60'", ("pass phrase 60",), "unlock with"),
    Shape(
        "escaped-json",
        'RuntimeError(\'{\\"api_key\\": \\"escjson61value\\", \\"x\\": 1}\')',
        ("escjson61value",),
        "RuntimeError",
    ),
    Shape(
        "libpq-kv",
        "host=db port=5432 user=app password=LibPq62Secret dbname=weights",
        ("LibPq62Secret",),
        "dbname=weights",
    ),
    Shape("nested-in-value", "note: password=nested63value", ("nested63value",), "note:"),
    Shape(
        "wandb-env",
        "WANDB_API_KEY=0123456789abcdef0123456789abcdefwandb64 wandb: offline",
        ("abcdefwandb64",),
        "wandb: offline",
    ),
    Shape(
        "model-loader-extra-config",
        '{"hf_token": "mlec65value", "endpoint": "https://u:mlecpw65@mirror/m", "num_threads": 8}',
        ("mlec65value", "mlecpw65"),
        "num_threads",
    ),
    Shape(
        "json-model-override-args",
        '{"rope_theta": 1000000, "extra": {"auth_token": "jmoa66value"}}',
        ("jmoa66value",),
        "rope_theta",
    ),
    # issue 29, item 8: shapes that survived (the first twelve), then more of the same families
    Shape(
        "cli-flag-quoted-spaces",
        "launch_server --api-key 'value with spaces 70' --tp 2",
        ("value with spaces 70", "spaces 70"),
        "--tp 2",
    ),
    Shape(
        "honeycomb-header",
        "OTEL_EXPORTER_OTLP_HEADERS=x-honeycomb-team=hcteam71abcdef,x-honeycomb-dataset=sglang",
        ("hcteam71abcdef",),
        "x-honeycomb-dataset=sglang",
    ),
    Shape(
        "google-ya29",
        "GCS 401 with ya29.a0AfH6SMCgoogle72TokenValue_abc-def for bucket weights",
        ("a0AfH6SMCgoogle72TokenValue",),
        "for bucket weights",
    ),
    Shape(
        "vault-hvs",
        "vault read failed: token hvs.CAESIvault73TokenValueabcdef permission denied",
        ("CAESIvault73TokenValue",),
        "permission denied",
    ),
    Shape(
        "invalid-api-key-prose",
        "openai.AuthenticationError: Invalid API key: prose74keyvalue",
        ("prose74keyvalue",),
        "AuthenticationError",
    ),
    Shape(
        "go-dsn",
        "dial root:GoDsn75pw@tcp(db.internal:3306)/weights failed",
        ("GoDsn75pw",),
        "@tcp(db.internal:3306)/weights failed",
    ),
    Shape("comma-in-value", "login password=abc76,def76tail host=db", ("abc76", "def76tail"), "host=db"),
    Shape("fullwidth-equals", "password\uff1dfullwidth77value retry", ("fullwidth77value",), "retry"),
    Shape("structured-sas", '{"sas": "sas78value", "region": "westus"}', ("sas78value",), '"region": "westus"'),
    Shape("structured-session", '{"session": "sess79value", "user": "bob"}', ("sess79value",), '"user": "bob"'),
    Shape(
        "structured-connection-string",
        '{"connection_string": "Endpoint=sb://ns.x/;SharedAccessKeyName=k;SharedAccessKey=cs80value", "n": 1}',
        ("cs80value",),
        '"n": 1',
    ),
    Shape(
        "structured-tokens",
        '{"tokens": ["tok81first", "tok81second"], "count": 2}',
        ("tok81first", "tok81second"),
        '"count": 2',
    ),
    Shape("structured-privkey", "{'privkey': 'privk82value', 'cert': '/etc/ssl/c.pem'}", ("privk82value",), "c.pem"),
    Shape(
        "aws-sts-json",
        '{"AccessKeyId": "ASIAQWERTYUIOPASDF83", "SecretAccessKey": "awsjs83secret/abc+def",'
        ' "SessionToken": "FwoGsess83tokvalue", "Expiration": "2026-01-01"}',
        ("QWERTYUIOPASDF83", "awsjs83secret", "FwoGsess83tokvalue"),
        '"Expiration": "2026-01-01"',
    ),
    Shape(
        "azure-storage-connection-string",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=azkey84+abc/def==;EndpointSuffix=core.windows.net",
        ("azkey84",),
        "EndpointSuffix=core.windows.net",
    ),
    Shape(
        "azure-sas-token",
        "SharedAccessSignature=sv=2022-11-02&ss=b&sig=azsig85abc%3D&se=2026",
        ("azsig85abc",),
        "se=2026",
    ),
    Shape(
        "azure-servicebus",
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=sbkey86value=",
        ("sbkey86value",),
        "SharedAccessKeyName=Root",
    ),
    Shape(
        "gcp-service-account-json",
        '{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----\\nMIIEgcp87body\\n'
        '-----END PRIVATE KEY-----\\n", "client_email": "sa@p.iam.gserviceaccount.com"}',
        ("MIIEgcp87body",),
        '"client_email": "sa@p.iam.gserviceaccount.com"',
    ),
    Shape(
        "gcp-oauth-client-secret",
        f"client_id=app.apps.googleusercontent.com secret {_fake('GOCSPX-', 28, 'Gcp88Oa')}",
        (_fake("GOCSPX-", 28, "Gcp88Oa")[7:],),
        "client_id=app",
    ),
    Shape(
        "google-refresh-token",
        f"refresh with {_fake('1//0g', 40, 'Rf89Tok')} failed",
        (_fake("1//0g", 40, "Rf89Tok")[5:],),
        "failed",
    ),
    Shape(
        "curl-bearer-header",
        'curl -H "Authorization: Bearer curlbr90token" https://api.example.com/v1',
        ("curlbr90token",),
        "https://api.example.com/v1",
    ),
    Shape(
        "github-refresh-ghr", f"refresh {_fake('ghr_', 36, 'GhR91tok')} ok", (_fake("ghr_", 36, "GhR91tok")[4:],), "ok"
    ),
    Shape(
        "slack-user-xoxp",
        "post as xoxp-1234567890-1234567890-1234567890-SlackUser92Tok denied",
        ("SlackUser92Tok",),
        "denied",
    ),
    Shape(
        "slack-webhook-services",
        "alert via https://hooks.slack.com/services/T000/B000/SlackHook93Value failed",
        ("SlackHook93Value",),
        "failed",
    ),
    Shape(
        "stripe-webhook-secret",
        f"verify with {_fake('whsec_', 32, 'Whs94')}",
        (_fake("whsec_", 32, "Whs94")[6:],),
        "verify",
    ),
    Shape(
        "stripe-restricted",
        f"key {_fake('rk_live_', 24, 'Rk95Live')} lacks scope",
        (_fake("rk_live_", 24, "Rk95Live")[8:],),
        "lacks scope",
    ),
    Shape("jwt-query", f"GET /cb?id_token={JWT}&state=s96", (JWT[:40], JWT[-20:]), "state=s96"),
    Shape("mysql-dsn", "mysql://root:MyPw97@db:3306/x refused", ("MyPw97",), "db:3306/x refused"),
    Shape("sqlalchemy-dsn", "engine mysql+pymysql://u:SqlaPw98@db/x?charset=utf8", ("SqlaPw98",), "db/x?charset=utf8"),
    Shape("amqp-dsn", "amqp://guest:AmqpPw99@rabbit:5672/ closed", ("AmqpPw99",), "rabbit:5672/ closed"),
    Shape("rediss-dsn", "rediss://:RedisTls100@cache:6380/0", ("RedisTls100",), "cache:6380/0"),
    Shape(
        "jdbc-query",
        "jdbc:postgresql://db:5432/x?user=app&password=Jdbc101pw&ssl=true",
        ("Jdbc101pw",),
        "ssl=true",
    ),
    Shape(
        "odbc",
        "Driver={ODBC Driver 18};Server=tcp:x,1433;Uid=app;Pwd=Odbc102pw;Encrypt=yes",
        ("Odbc102pw",),
        "Encrypt=yes",
    ),
    Shape(
        "mongodb-replica",
        "mongodb://u:Mongo103pw@h1:27017,h2:27017/db?replicaSet=rs",
        ("Mongo103pw",),
        "replicaSet=rs",
    ),
    Shape(
        "kafka-jaas",
        'sasl.jaas.config=PlainLoginModule required username="u" password="Kafka104pw";',
        ("Kafka104pw",),
        'username="u"',
    ),
    Shape("semicolon-list", "k1=v1;password=Semi105pw;k2=v2", ("Semi105pw",), "k2=v2"),
    Shape("yaml-flow-map", "creds: {user: u, password: Yaml106pw}", ("Yaml106pw",), "user: u"),
    Shape("double-quoted-spaces", 'password="dq pass 107" retry', ("dq pass 107", "pass 107"), "retry"),
    Shape("single-quoted-spaces", "api_key: 'sq key 108' (from env)", ("sq key 108", "key 108"), "(from env)"),
    Shape("json-escaped-quote", '{"password": "pa\\"ss109word", "port": 5432}', ("ss109word", "pa\\"), '"port": 5432'),
    Shape("fullwidth-colon", "password\uff1afwcolon110 next", ("fwcolon110",), "next"),
    Shape("small-equals", "token\ufe66smalleq111 next", ("smalleq111",), "next"),
    Shape("ideographic-space", "api_key =\u3000idsp112value next", ("idsp112value",), "next"),
    Shape("fullwidth-key", "\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44=fwkey113 next", ("fwkey113",), "next"),
    Shape("curl-user", "curl -u admin:Curl114pw https://x.example.com", ("Curl114pw",), "https://x.example.com"),
    Shape("pgpassword-env", "PGPASSWORD=Pg115pw psql -h db", ("Pg115pw",), "psql -h db"),
    Shape("unclosed-quote", "RuntimeError: passphrase='Trunc116 tail116", ("Trunc116", "tail116"), "RuntimeError"),
    Shape("flag-equals-quoted", '--api-key="eq quoted 117" --port 1', ("eq quoted 117", "quoted 117"), "--port 1"),
    Shape("argv-double-quotes", 'argv ["--api-key", "argvdq118"]', ("argvdq118",), "argv"),
    Shape("vault-header", "X-Vault-Token: hvs.VaultHdr119abcdefghijklm", ("VaultHdr119",), "X-Vault-Token"),
    Shape("openrouter", f"router {_fake('sk-or-v1-', 64, 'Or120')}", (_fake("sk-or-v1-", 64, "Or120")[9:],), "router"),
    Shape(
        "langsmith",
        f"LANGSMITH {_fake('lsv2_pt_', 40, 'Ls121')} bad",
        (_fake("lsv2_pt_", 40, "Ls121")[8:],),
        "bad",
    ),
    Shape("api-key-spaced-prose", "Secret key = spaced122value; retry", ("spaced122value",), "retry"),
    # issue 35: shapes that survived
    Shape(
        "gcp-private-key-id-json",
        '{"type": "service_account", "private_key_id": "9f3c1a7e5b2d123pkid", "client_id": "10442"}',
        ("9f3c1a7e5b2d123pkid",),
        '"client_id": "10442"',
    ),
    Shape(
        "access-key-id-pair", "aws_access_key_id = AKID124notAKIAshape region=x", ("AKID124notAKIAshape",), "region=x"
    ),
    Shape(
        "flag-value-with-a-dash",
        "launch_server --api-key -abcSecret125 --port 30000",
        ("abcSecret125", "-abcSecret125"),
        "--port 30000",
    ),
    Shape("flag-password-with-a-dash", "mysql --password -Xy9Pw126 -h db", ("Xy9Pw126",), "-h db"),
    Shape("prose-using-token", "Using token Tk7pQ2mZx9127 for the hub download", ("Tk7pQ2mZx9127",), "for the hub"),
    Shape("prose-camel-token", "Using token abcSecretTok. Retrying", ("abcSecretTok",), "Retrying"),
    Shape("prose-password", "login with password Hunter2pw128, user alice", ("Hunter2pw128",), "user alice"),
    Shape("prose-secret-key", "signed with secret key Sk129abcDEF at boot", ("Sk129abcDEF",), "at boot"),
    Shape("dsn-pair", "sentry_dsn=https://k130@o1.ingest.sentry.io/42 ok", ("k130",), "ok"),
    Shape("csrftoken-pair", "csrftoken=Csrf131abcDEF; theme=dark", ("Csrf131abcDEF",), "theme=dark"),
    Shape("session-id-json", '{"session_id": "sess132abcdef", "rid": 42}', ("sess132abcdef",), '"rid": 42'),
    Shape(
        "otlp-headers-env",
        "OTEL_EXPORTER_OTLP_HEADERS=x-tenant-auth=Hdr133value env set",
        ("Hdr133value",),
        "env set",
    ),
    Shape("pass-json", '{"user": "bob", "pass": "Pass134word"}', ("Pass134word",), '"user": "bob"'),
]

# issue 35: keys of structured values (server args, span attributes, JSON held in a string) that name
# a secret, and their kin; every value must go
SECRET_KEYS = {
    "pass": "s-pass-01",
    "db_pass": "s-pass-02",
    "pw": "s-pw-03",
    "user_pw": "s-pw-04",
    "key": "s-key-05",
    "keys": ["s-key-06", "s-key-07"],
    "key_b": "s-key-08",
    "sig": "s-sig-09",
    "url_sig": "s-sig-10",
    "dsn": "postgres://u:s-dsn-11@db/x",
    "sentry_dsn": "https://s-dsn-12@o1.ingest.sentry.io/1",
    "session_id": "s-sid-13",
    "sessionId": "s-sid-14",
    "user_session_id": "s-sid-15",
    "sessionid": "s-sid-16",
    "csrftoken": "s-csrf-17",
    "xsrftoken": "s-csrf-18",
    "csrf_token": "s-csrf-19",
    "private_key_id": "s-pkid-20",
    "access_key_id": "s-akid-21",
    "otlp_headers": "x-tenant=s-hdr-22",
    "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=s-hdr-23",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-tenant=s-hdr-24",
    "auth_headers": {"X-Org": "s-hdr-25"},
    "api_key_list": ["s-akl-26", "s-akl-27"],
    "api_keys_list": ["s-akl-28"],
    "token_list": ["s-tl-29"],
}
# ... and their neighbours that name no secret: kept as they are
NOT_SECRET_KEYS = {
    "forward_pass": 2,
    "first_pass": True,
    "num_passes": 3,
    "bypass": "/m",
    "key_id": "kms-alias-1",
    "hash_key": "layers.0",
    "signal": "SIGTERM",
    "enable_session_radix_cache": True,
    "session_len": 4,
    "input_token_list": [1, 2, 3],
    "speculative_token_map": "/m/map.pt",
    "tokenizer_metrics_custom_labels_header": "x-labels",
    "headers_sent": 2,
    "key_size": 64,
    "password_file_present": False,
}

# Ordinary text that must come out exactly as it went in.
BENIGN = [
    "req_to_token_pool_size=48 max_total_tokens=4096 max_prefill_tokens=16384",
    "http://127.0.0.1:30000/generate",
    "tcp://127.0.0.1:25753",
    "/models/tiny-llama/model-00001-of-00004.safetensors",
    "Loading safetensors checkpoint shards: 100% Completed | 4/4",
    'File "/sglang/srt/distributed/parallel_state.py", line 1312, in init_distributed_environment',
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275",
    "Basic authentication failed for user alice",
    "KeyError: 'api_key'",
    "rank tp1 pp0 @ node3:4242 in dist.init_process_group",
    "tokenizer_mode=auto skip_tokenizer_init=False kv_cache_dtype=auto",
    "bucket_time_to_first_token=[0.1, 0.5]",
    "launch_server --model-path /models/tiny --tp 2 --dp 1 --port 30000 --host 0.0.0.0",
    "dist.init_process_group",
    "model.load_weights tokenizer_manager.init scheduler.init_memory_pool",
    "/models/meta-llama/Llama-3.1-8B-Instruct",
    "tokenizer: meta-llama/Llama-3.1-8B-Instruct, tokenizer_mode=auto",
    "Prefill batch. #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00, #running-req: 0",
    "Decode batch. #running-req: 1, #token: 38, token usage: 0.00, gen throughput (token/s): 3.21",
    "KV Cache is allocated. #tokens: 1024, K size: 0.50 GB, V size: 0.50 GB",
    "max_total_num_tokens=1024, chunked_prefill_size=8192, max_prefill_tokens=16384",
    "Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=62.02 GB, mem usage=15.06 GB.",
    "special tokens: pad_token=<pad> eos_token=</s> bos_token=<s>",
    "docker run -u 1000:1000 --shm-size 16g lmsysorg/sglang",
    "NCCL_SOCKET_IFNAME=eth0 NCCL_IB_DISABLE=1 GLOO_SOCKET_IFNAME=eth0",
    "git@github.com:sgl-project/sglang.git",
    "rank tp3 (pid 4242) stalled 95 s in dist.init_process_group; stacks: /runs/x/stacks/node-4242.txt",
    "Capture cuda graph bs [1, 2, 4, 8, 16]",
    "API key loaded from the environment",
    "session_id=abc123 rid=42 enable_session_radix_cache=False",
    # issue 35: the common words beside the shapes added
    "Using token from the HF_TOKEN environment variable",
    "Using token ids [1, 2, 3] for the prompt",
    "password authentication failed for user alice",
    "secret key loaded from the environment",
    "the token budget 4096 is spent",
    "private key file /etc/ssl/key.pem not found",
    "pass: 3 of 5 passes done, forward_pass=2",
    "sig=SIGTERM received",
    '{"key": "sglang.phase", "value": {"stringValue": "model.load"}}',
    "key=layers.0.self_attn cache hit",
    "launch_server --api-key --port 30000",
    "cmd --password -p 30000",
    "Secret Manager unavailable, using the environment",
]


def test_the_corpus_has_at_least_100_shapes():
    assert len(CORPUS) >= 100
    assert len({s.name for s in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("shape", CORPUS, ids=lambda s: s.name)
def test_redact_text_removes_the_secret_and_keeps_the_context(shape):
    out = redact_text(shape.text)
    for secret in shape.secrets:
        assert secret not in out, out
    assert REDACTED in out
    assert shape.keep in out, out


@pytest.mark.parametrize("shape", CORPUS, ids=lambda s: s.name)
def test_redact_removes_the_secret_from_any_structured_value(shape):
    data = {"message": shape.text, "items": [shape.text, {"nested": shape.text}], "tp_size": 2}
    out = json.dumps(redact(data))
    for secret in shape.secrets:
        assert secret not in out
    assert '"tp_size": 2' in out


@pytest.mark.parametrize("text", BENIGN)
def test_ordinary_text_is_left_alone(text):
    assert redact_text(text) == text


def test_every_key_that_names_a_secret_hides_its_value_and_no_other_key_does():
    values = {**SECRET_KEYS, **NOT_SECRET_KEYS}
    assert len(re.findall(r"s-[a-z]+-\d\d", json.dumps(SECRET_KEYS))) == 29  # each secret value holds one
    for data in (values, {"server_args": json.dumps(values)}, [values], {"a": {"b": values}}):
        out = json.dumps(redact(data))
        assert re.findall(r"s-[a-z]+-\d\d", out) == [], out
    out = redact(values)
    assert {k: out[k] for k in NOT_SECRET_KEYS} == NOT_SECRET_KEYS
    assert all(out[k] == REDACTED for k in SECRET_KEYS)


def test_redaction_is_idempotent():
    for shape in CORPUS:
        once = redact_text(shape.text)
        assert redact_text(once) == once, shape.name


def test_server_arg_shapes():
    args = {
        "api_key": "sk-a1",
        "api_keys": ["k-one-67", "k-two-67"],
        "watermark_key": 68686868,
        "watermark_key_b": "wmb69",
        "model_loader_extra_config": '{"hf_token": "mlec70", "num_threads": 8}',
        "json_model_override_args": '{"rope_scaling": {"type": "yarn"}, "secret": "jmoa71"}',
        "broken_json_config": '{"api_key": "brk72", ',  # not JSON: text redaction still applies
        "argv": ["--model-path", "/m", "--api-key", "argv73", "--port", "30000"],
        "req_to_token_pool_size": 48,
        "max_total_tokens": 4096,
        "tokenizer_path": "/m",
        "bucket_time_to_first_token": [0.1, 0.5],
        "watermark_context_window": 4,
    }
    out = redact(args)
    text = json.dumps(out)
    for secret in ("sk-a1", "k-one-67", "k-two-67", "68686868", "wmb69", "mlec70", "jmoa71", "brk72", "argv73"):
        assert secret not in text
    assert json.loads(out["model_loader_extra_config"]) == {"hf_token": REDACTED, "num_threads": 8}
    assert json.loads(out["json_model_override_args"]) == {"rope_scaling": {"type": "yarn"}, "secret": REDACTED}
    assert out["argv"] == ["--model-path", "/m", "--api-key", REDACTED, "--port", "30000"]
    for key in (
        "req_to_token_pool_size",
        "max_total_tokens",
        "tokenizer_path",
        "bucket_time_to_first_token",
        "watermark_context_window",
    ):
        assert out[key] == args[key], key
    unchanged = '{"rope_theta": 10000}'
    assert redact(unchanged, "json_model_override_args") is not None
    assert redact(unchanged, "json_model_override_args") == unchanged, "JSON without secrets keeps its text"


def test_exception_event_attributes_are_redacted():
    texts = [s.text for s in CORPUS]
    try:
        try:
            raise ValueError("\n".join(texts[::2]))
        except ValueError as inner:
            raise RuntimeError("\n".join(texts[1::2])) from inner
    except RuntimeError as exc:
        attrs = exception_attrs(exc)
    assert attrs["exception.type"] == "RuntimeError"
    assert "ValueError" in attrs["exception.stacktrace"] and "test_secret_corpus.py" in attrs["exception.stacktrace"]
    dumped = json.dumps(attrs)
    for shape in CORPUS:
        for secret in shape.secrets:
            assert secret not in dumped, shape.name


# -- end to end: real SGLang ranks failing with the corpus ------------------------------------------
ARG_SECRET = "-argS3cr3t" + os.urandom(4).hex()


class RawReceiver(OtlpReceiver):
    """Keeps every request's bytes too: events and status are searched, not only attributes."""

    def __init__(self, protocol: str) -> None:
        super().__init__(protocol)
        self.raw: list[bytes] = []

    def accept(self, request) -> None:
        self.raw.append(request.SerializeToString())
        super().accept(request)


def _secrets() -> list[str]:
    out = [s for shape in CORPUS for s in shape.secrets]
    out += [ARG_SECRET[1:], ARG_SECRET]  # every server-arg secret holds it
    return out


def _leaks(blob: bytes | str, where: str) -> list[str]:
    data = blob if isinstance(blob, bytes) else blob.encode("utf-8", "replace")
    return [f"{where}: {s!r}" for s in _secrets() if s.encode() in data]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sglang_phasetrace.tracing.cli", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.sglang
@requires_sglang
@pytest.mark.parametrize("mode", ["dist", "engine"])
def test_no_secret_reaches_the_run_directory_or_the_collector(mode, tiny_model, tmp_path):
    corpus = tmp_path / "corpus.json"
    corpus.write_text(json.dumps([s.text for s in CORPUS]))
    base = tmp_path / "runs"
    base.mkdir()
    with RawReceiver("http/protobuf") as receiver:
        env = {
            "SECRET_RANKS_CORPUS": str(corpus),
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": receiver.protocol,
        }
        ran = run_program(
            [
                "-m",
                "sglang_phasetrace.tracing.cli",
                "run",
                "--",
                sys.executable,
                str(PROGRAM),
                str(tiny_model[0]),
                "--mode",
                mode,
                "--port",
                str(free_port()),
                f"--secret={ARG_SECRET}",
            ],
            base,
            env=env,
            timeout=300,
        )
        assert ran.returncode != 0, ran.output[-3000:]
        run = ran.run_dir
        assert run is not None, ran.output[-3000:]
        journals = "".join(p.read_text() for p in (run / "journal").glob("*.jsonl"))
        assert journals.count('"status":"error"') + journals.count('"status": "error"') >= 2, "the ranks failed"
        assert REDACTED in journals and "could not initialise" in journals, "the exception was journaled"
        # what we print (the program's own traceback on stderr is Python's, not ours)
        printed = ["\n".join(line for line in ran.output.splitlines() if "phasetrace" in line)]
        for args in (
            ("report", str(run)),
            ("export", str(run), "--format", "otlp-json", "-o", str(run / "o.json")),
            ("export", str(run), "--format", "jaeger", "-o", str(run / "j.json")),
            ("export", str(run), "--format", "perfetto", "-o", str(run / "p.json")),
            ("status", str(run), "--once"),
            ("timeline", str(run)),
            ("compare", str(run)),
            ("compare", str(run), "--json"),
        ):
            done = _cli(*args)
            printed.append(done.stdout + done.stderr)
        assert (run / "report.html").is_file()
        # the ranks flush at exit; wait for an exception event to arrive (not for lost spans)
        for _ in range(100):
            if any(b"exception.stacktrace" in raw for raw in receiver.raw):
                break
            __import__("time").sleep(0.1)
        raw = list(receiver.raw)
    leaks: list[str] = []
    files = [p for p in run.rglob("*") if p.is_file()]
    assert any(p.parent.name == "journal" for p in files) and (run / "report.html") in files
    for path in files:
        leaks += _leaks(path.read_bytes(), str(path.relative_to(run)))
    for n, text in enumerate(printed):
        leaks += _leaks(text, f"printed output {n}")
    for n, blob in enumerate(raw):
        leaks += _leaks(blob, f"OTLP request {n}")
    assert not leaks, "\n".join(leaks[:40])
    assert raw, "the collector got spans"
    assert any(b"exception.stacktrace" in blob and REDACTED.encode() in blob for blob in raw), (
        "a redacted exception event reached the collector"
    )
    if mode == "engine":
        assert "sglang.server_args" in journals and f"wm{ARG_SECRET}" not in journals
