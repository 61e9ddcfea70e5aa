"""``phasetrace bundle``: the archive for a bug report holds what the issue needs, and no secret.

The runs are synthetic (``cli_fixtures.build_run``) with the secret corpus planted where a journal
written by hand or by another version could hold it (attributes, server args, errors, events, a
torn line, status files, stack dumps, diagnosis records) and in the environment of the bundling
process: no secret may survive in any member of the archive.
"""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
from pathlib import Path

import pytest
from cli_fixtures import HOST, STALL_PHASE, build_run
from sglang_phasetrace.tracing.cli import main
from sglang_phasetrace.tracing.cli.bundle import TOP
from sglang_phasetrace.tracing.journal import records
from sglang_phasetrace.tracing.redact import REDACTED
from test_secret_corpus import CORPUS

SECRETS = [s for shape in CORPUS for s in shape.secrets]
TEXTS = [s.text for s in CORPUS]
ENV_SECRET = "envS3cretValue-9f8e7d"
PER_RUN = {"diagnosis.txt", "phases.md", "report.html", "server-args.json", "timeline.txt"}


def plant_secrets(run: Path, pid: int) -> None:
    """The corpus in every place a journal, a status file and a stack dump can hold text."""
    journal = run / "journal" / f"{HOST}-{pid}.jsonl"
    written = [json.loads(x) for x in journal.read_text().splitlines() if x.strip().startswith("{") and x.endswith("}")]
    t = written[-1]["t"]
    args = {"model_path": "/models/m", "api_key": SECRETS[0], "notes": TEXTS[:20], "tp_size": 2}
    root = next(r["span"] for r in written if r["kind"] == "begin" and r.get("parent") is not None)
    span = "feedfeedfeedfeed"
    attrs = {
        "sglang.phase": "model.load_weights",
        "sglang.server_args": json.dumps(args),
        "sglang.note": " | ".join(TEXTS[20:40]),
    }
    error = records.error("RuntimeError", "\n".join(TEXTS[50:]), "\n".join(TEXTS))
    message = "tp0 stalled; " + " ".join(TEXTS[:10])
    # records as our writers make them, holding the corpus unredacted (as one written by hand or another version may)
    planted = [
        records.begin(t, span, root, "a" * 32, "model.load_weights", attrs, "MainThread"),
        records.event(t, span, "shard_loaded", {"why": TEXTS[40]}),
        records.warning(t, "\n".join(TEXTS[41:50])),
        records.end(t + 1, span, "error", {}, error),
        records.diagnosis(t + 2, "straggler", "tp0", pid, STALL_PHASE, 9.0, message, {}, []),
    ]
    torn = '{"kind":"event","t":1,"span":"' + " ".join(TEXTS[10:30])  # cut by kill -9
    with journal.open("a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in planted) + torn)
    status = run / "status" / f"{HOST}-{pid}.json"
    beat = json.loads(status.read_text())
    status.write_text(json.dumps({**beat, "note": TEXTS}))
    (run / "stacks" / f"{HOST}-{pid}.txt").write_text("Thread 0x1 (most recent call first):\n" + "\n".join(TEXTS))


def members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive, "r:gz") as tar:
        infos = tar.getmembers()
        assert all(i.isreg() and i.mode == 0o600 for i in infos), "regular files, 0600"
        return {i.name[len(TOP) + 1 :]: tar.extractfile(i).read() for i in infos}


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_API_KEY", ENV_SECRET)  # a name that looks secret: the whole value goes
    monkeypatch.setenv("SGLANG_MIRROR", f"https://bob:{ENV_SECRET}@mirror.example.com/m")  # userinfo
    monkeypatch.setenv("NCCL_IB_AUTH_TOKEN", ENV_SECRET)
    monkeypatch.setenv("HF_TOKEN", ENV_SECRET)  # not on the allowlist at all
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"Authorization=Bearer {ENV_SECRET}")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")


def test_no_secret_survives_in_any_member(tmp_path: Path, secret_env, capsys) -> None:
    run = build_run(tmp_path / "20250101-120000-stall", ranks=3, stalled_rank=1, corrupt=True)
    plant_secrets(run.path, run.pids["tp0"])
    raw = b"".join(p.read_bytes() for p in run.path.rglob("*") if p.is_file())
    assert all(s.encode() in raw for s in SECRETS), "every secret is in the run directory"
    out = tmp_path / "out" / "bundle.tar.gz"
    assert main(["bundle", str(run.path), "-o", str(out)]) == 0
    printed = capsys.readouterr()
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    files = members(out)
    leaks = [(name, s) for name, data in files.items() for s in [*SECRETS, ENV_SECRET] if s.encode() in data]
    assert leaks == []
    assert not any(s in printed.out + printed.err for s in [*SECRETS, ENV_SECRET])
    journal = files[f"20250101-120000-stall/journal/{HOST}-{run.pids['tp0']}.jsonl"].decode()
    assert REDACTED in journal and "model.load_weights" in journal, "redacted, not dropped"
    env = files["system/environment.txt"].decode()
    assert f"SGLANG_API_KEY={REDACTED}" in env and f"NCCL_IB_AUTH_TOKEN={REDACTED}" in env
    assert "NCCL_SOCKET_IFNAME=eth0" in env and "CUDA_VISIBLE_DEVICES=0,1" in env
    assert "mirror.example.com" in env and "HF_TOKEN" not in env and "OTEL_EXPORTER_OTLP_HEADERS" not in env
    args = json.loads(files["20250101-120000-stall/server-args.json"])
    assert args[0]["server_args"]["api_key"] == REDACTED and args[0]["server_args"]["tp_size"] == 2


def test_members_are_what_the_issue_lists(tmp_path: Path) -> None:
    run = build_run(tmp_path / "run-a", ranks=2, stalled_rank=1)
    plant_secrets(run.path, run.pids["tp0"])  # gives it server args
    out = tmp_path / "b.tar.gz"
    assert main(["bundle", str(run.path), "-o", str(out)]) == 0
    files = members(out)
    names = list(files)
    assert names[0] == "SUMMARY.md"
    journals = {f"run-a/journal/{p.name}" for p in (run.path / "journal").iterdir()}
    status = {f"run-a/status/{p.name}" for p in (run.path / "status").iterdir()}
    stacks = {f"run-a/stacks/{p.name}" for p in (run.path / "stacks").iterdir()}
    per_run = {f"run-a/{n}" for n in PER_RUN}
    assert journals | status | stacks | per_run <= set(names)
    assert {"system/versions.json", "system/environment.txt"} <= set(names)
    optional = {"system/nvidia-smi.txt", "system/kernel-log.txt", "run-a/journal-problems.txt"}
    assert set(names) - {"SUMMARY.md"} - journals - status - stacks - per_run - optional == {
        "system/versions.json",
        "system/environment.txt",
    }
    summary = files["SUMMARY.md"].decode()
    verdict = summary.index("**Verdict:** STALL")
    assert verdict < summary.index("| rank | host | pid | state |") < summary.index("## Versions")
    assert "| tp1 | node0 |" in summary and "stalled" in summary
    assert "HINT (not a verdict)" in summary and "[source: sgl-project/sglang#" in summary
    assert "the environment of" in files["system/environment.txt"].decode()
    assert "process that made this bundle" in summary
    for missing in ("system/nvidia-smi.txt", "system/kernel-log.txt"):  # optional: present or said why not
        assert missing in names or "## Not collected" in summary
    versions = json.loads(files["system/versions.json"])
    assert versions["python"] and "sglang-phasetrace" in versions
    timeline = files["run-a/timeline.txt"].decode()
    assert "tp1" in timeline and "\x1b" not in timeline
    assert b"<html" in files["run-a/report.html"][:200].lower()
    assert "STALL" in files["run-a/diagnosis.txt"].decode()


def test_a_finished_failed_run_gets_its_root_cause(tmp_path: Path) -> None:
    run = build_run(tmp_path / "failed", ranks=3, failed_rank=1)
    out = tmp_path / "f.tar.gz"
    assert main(["bundle", str(run.path), "-o", str(out)]) == 0
    diagnosis = members(out)["failed/diagnosis.txt"].decode()
    assert "FAILED" in diagnosis and "ROOT CAUSE" in diagnosis and "tp1" in diagnosis


def test_links_are_not_followed_and_odd_files_are_said(tmp_path: Path, capsys) -> None:
    run = build_run(tmp_path / "linked", ranks=2)
    outside = tmp_path / "outside.txt"
    outside.write_text(f"private {ENV_SECRET}\n")
    (run.path / "stacks" / f"{HOST}-2000.txt").symlink_to(outside)
    (run.path / "journal" / "evil.jsonl").symlink_to(outside)
    os.mkfifo(run.path / "stacks" / "fifo.txt")
    out = tmp_path / "l.tar.gz"
    assert main(["bundle", str(run.path), "-o", str(out)]) == 0
    files = members(out)
    assert not any(ENV_SECRET.encode() in data for data in files.values())
    assert not any(name.endswith(("evil.jsonl", "fifo.txt", f"{HOST}-2000.txt")) for name in files)
    assert "not a regular file" in files["SUMMARY.md"].decode()
    capsys.readouterr()


def test_two_runs_of_one_name_and_a_link_at_the_output(tmp_path: Path) -> None:
    a = build_run(tmp_path / "a" / "same", ranks=2)
    b = build_run(tmp_path / "b" / "same", ranks=2, failed_rank=0)
    target = tmp_path / "target.txt"
    target.write_text("untouched")
    out = tmp_path / "link.tar.gz"
    out.symlink_to(target)
    assert main(["bundle", str(a.path), str(b.path), "-o", str(out)]) == 0
    assert target.read_text() == "untouched" and not out.is_symlink()
    names = set(members(out))
    assert {"same/diagnosis.txt", "same-2/diagnosis.txt"} <= names
    summary = members(out)["SUMMARY.md"].decode()
    assert "## Run `same`" in summary and "## Run `same-2`" in summary


@pytest.mark.parametrize("make", ["missing", "file", "no_journal"])
def test_a_bad_run_dir_is_a_clear_error_and_writes_nothing(tmp_path: Path, capsys, make: str) -> None:
    bad = tmp_path / "bad"
    if make == "file":
        bad.write_text("x")
    elif make == "no_journal":
        bad.mkdir()
    out = tmp_path / "never.tar.gz"
    assert main(["bundle", str(bad), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sglang-phasetrace: bundle: ") and str(bad) in err and "run directory" in err
    assert not out.exists() and not list(tmp_path.glob(".never*"))


def test_the_archive_opens_with_plain_tar(tmp_path: Path) -> None:
    run = build_run(tmp_path / "plain", ranks=2)
    out = tmp_path / "p.tar.gz"
    assert main(["bundle", str(run.path), "-o", str(out)]) == 0
    with tarfile.open(out, "r:gz") as tar:
        tar.extractall(tmp_path / "x", filter="data")
    summary = (tmp_path / "x" / TOP / "SUMMARY.md").read_text()
    assert summary.startswith("# sglang-phasetrace bug-report bundle") and "READY" in summary
    assert io.StringIO(summary).readline()


def test_a_huge_journal_and_deep_json_are_bounded_not_fatal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 100 MB sparse journal (one line of zeros) is copied as every reader reads it: the line over
    the line cap and what lies past the journal cap (made 32 MiB here) left out and said; a status
    file and a server-args attribute holding JSON nested 100 000 deep (which the stdlib's parser
    recursed into: RecursionError) go in as redacted text."""
    run = build_run(tmp_path / "big", ranks=2, stalled_rank=1)
    monkeypatch.setenv("SGLANG_PHASETRACE_JOURNAL_MAX_MB", "32")
    sparse = run.path / "journal" / f"{HOST}-9999.jsonl"
    with open(sparse, "wb") as f:
        f.truncate(100 << 20)
    deep = "[" * 100_000 + "]" * 100_000
    (run.path / "status" / f"{HOST}-2000.json").write_text(deep)
    journal = run.path / "journal" / f"{HOST}-2000.jsonl"
    t = json.loads(journal.read_text().splitlines()[-1])["t"]
    attrs = {"sglang.phase": "x", "sglang.server_args": deep}
    begin = records.begin(t, "feedfeedfeedfeed", None, "a" * 32, "x", attrs, "MainThread")
    with journal.open("a") as f:
        f.write(json.dumps(begin) + "\n")
    out = tmp_path / "big.tar.gz"
    assert main(["bundle", str(run.path), "-o", str(out)]) == 0
    files = members(out)
    assert files[f"big/journal/{HOST}-9999.jsonl"] == b""
    assert files[f"big/status/{HOST}-2000.json"].startswith(b"[[[")
    assert json.loads(files["big/server-args.json"])[0]["server_args"].startswith("[[[")
    summary = files["SUMMARY.md"].decode()
    assert f"{HOST}-9999.jsonl:1: a line over 1 MiB (the cap on one journal line)" in summary
    assert f"{HOST}-9999.jsonl:1: the rest of this journal, past 32 MiB" in summary
