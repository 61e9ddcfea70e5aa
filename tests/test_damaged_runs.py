"""Viewers tell the truth about a damaged or finished run (issue 41.3): a journal whose last line was
cut by ``kill -9``, a run whose processes all ended long ago, a journal that cannot be read, a run
directory viewed read-only, and a run directory copied elsewhere. Every view says the same thing,
names what is wrong once, and writes nothing but the index it documents.

The runs are ``cli_fixtures.build_run``'s (a launcher and two ranks shaped like a traced start),
damaged here as ``kill -9``, ``cp -r`` or ``chmod`` damage them; no SGLang process is started."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
from cli_fixtures import HOST, LAUNCHER_PID, S, build_run
from sglang_phasetrace.tracing.cli import command, main
from sglang_phasetrace.tracing.journal import records
from sglang_phasetrace.tracing.journal import tail as journal_tail
from sglang_phasetrace.tracing.reader import index, load

ARGS = {"model_path": "/models/tiny", "tp_size": 2, "dp_size": 1, "device": "cpu", "port": 30000}


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index, "_SAID", set())  # one warning per index and process: per test here
    monkeypatch.delenv(index.ENV_INDEX, raising=False)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def report_verdict(html: str) -> str:
    m = re.search(r'<div id="verdict" class="verdict (\w+)">([^<]*)</div>', html)
    assert m, "the report's first line is its verdict"
    return f"{m[1]}: {m[2]}"


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def rank_journal(run: Path, pid: int) -> Path:
    return run / "journal" / f"{HOST}-{pid}.jsonl"


def served(run: Path) -> None:
    """The launcher's root ends as a ``launch_server``'s does: serving began (``keys.SERVING``)."""
    journal = run / "journal" / f"{HOST}-{LAUNCHER_PID}.jsonl"
    out = []
    for line in lines_of(journal):
        r = json.loads(line)
        if r["kind"] == "end" and r["span"] == _launch_root(journal):
            r["attrs"] = {**r["attrs"], "phasetrace.serving": True}
            line = json.dumps(r, separators=(",", ":")) + "\n"
        out.append(line)
    journal.write_text("".join(out))


def _launch_root(journal: Path) -> str:
    return next(r["span"] for r in map(json.loads, lines_of(journal)) if r["kind"] == "begin" and r["parent"] is None)


def cut_root_end(run: Path, pid: int) -> str:
    """Cut the rank's last line, its ``rank`` end record, as ``kill -9`` mid-write does (the lines
    after it, its last heartbeat, were never written); ``file:line`` of the cut line. Its status
    file still says ready. The journal was last written a minute ago."""
    journal = rank_journal(run, pid)
    lines = lines_of(journal)
    root = next(
        r["span"] for r in map(json.loads, lines) if r["kind"] == "begin" and r["attrs"].get("sglang.phase") == "rank"
    )
    at = max(i for i, line in enumerate(lines) if '"kind":"end"' in line and f'"span":"{root}"' in line)
    journal.write_text("".join(lines[:at]) + lines[at][:40])
    old = time.time() - 60
    os.utime(journal, (old, old))
    return f"{journal}:{at + 1}"


# -- a cut last line -----------------------------------------------------------------------------


def test_a_cut_last_line_is_named_once_and_every_view_uses_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = build_run(tmp_path / "run", ranks=2, spans=40, end_ns=time.time_ns() - 20 * S)
    served(run.path)
    where = cut_root_end(run.path, run.pids["tp0"])
    path = str(run.path)
    said: dict[str, str] = {}

    code, out, err = cli(capsys, "status", path, "--json")
    said["status --json"] = err
    doc = json.loads(out)
    rows = {r["label"]: r for r in doc["ranks"]}
    assert code == 0 and doc["exit_code"] == 0, doc["findings"]
    assert rows["tp0"]["state"] == "ready" and rows["tp0"]["verdict"] == "", rows["tp0"]
    assert rows["launcher"]["state"] == "serving" and not doc["findings"]

    code, out, err = cli(capsys, "status", path, "--once")
    said["status"] = err
    assert code == 0 and "died" not in out and "stalled" not in out, out

    code, out, err = cli(capsys, "probe", path, "--json")
    said["probe"] = err
    doc = json.loads(out)
    assert code == 0 and doc["state"] == "serving", doc["line"]

    code, out, err = cli(capsys, "report", path, "-o", str(tmp_path / "r.html"))
    said["report"] = err
    assert code == 0 and report_verdict((tmp_path / "r.html").read_text()).startswith("ready: READY — 2 ranks ready")

    code, out, err = cli(capsys, "timeline", path, "--json")
    said["timeline"] = err
    lanes = {lane["label"]: lane for lane in json.loads(out)["lanes"]}
    assert code == 0 and lanes["tp0"]["state"] == "ready", lanes["tp0"]["state"]

    code, out, err = cli(capsys, "compare", path, "--json")
    said["compare"] = err
    phases = {p["phase"]: p for p in json.loads(out)["phases"]}
    assert code == 0 and phases["rank"]["open"] == [] and set(phases["rank"]["per_rank_s"]) == {"tp0", "tp1"}

    for verb, err in said.items():  # the cut line, said once by every view (probe: on stderr, its line on stdout)
        assert err.count(where + ":") == 1, (verb, err)


def test_a_journal_cut_a_while_ago_is_cut_for_a_live_reader_too(tmp_path: Path) -> None:
    """A line without its newline is a write in progress only for a moment: the writer writes each
    record in one ``os.write``. One left so for seconds was cut (``kill -9``, a crash)."""
    path = tmp_path / "j.jsonl"
    whole = json.dumps(records.warning(1, "whole"), separators=(",", ":"))
    path.write_text(whole + "\n" + whole[:20])
    reader = journal_tail.JournalTail(path)
    assert len(reader.read()) == 1 and not reader.problems  # just written: left for the next read
    old = time.time() - 60
    os.utime(path, (old, old))
    assert reader.read() == [] and reader.problems == [f"{path}:2: " + reader.problems[0].split(": ", 1)[1]]
    assert "not a JSON record" in reader.problems[0]


# -- a finished run ------------------------------------------------------------------------------


def test_a_run_whose_processes_ended_long_ago_is_told_as_ended(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    end = time.time_ns() - 5000 * S
    run = build_run(tmp_path / "run", ranks=2, spans=40, end_ns=end)
    served(run.path)
    journal = run.path / "journal" / f"{HOST}-{LAUNCHER_PID}.jsonl"
    with journal.open("a") as f:  # the launcher saw its ranks end, as a SIGTERM to the group ends them
        for label in ("tp0", "tp1"):
            f.write(json.dumps(records.exit(end + S, run.pids[label], HOST, label, None, "SIGTERM")) + "\n")
    path = str(run.path)

    code, out, _ = cli(capsys, "status", path, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["exit_code"] == 0
    ended = doc["ended"]
    assert ended is not None and ended["t"] == end + S and 4990 < ended["ago_s"] < 5100, ended
    assert "killed by SIGTERM" in ended["how"] and "tp0" in ended["how"], ended
    assert {r["state"] for r in doc["ranks"]} == {"ended"}, doc["ranks"]

    code, out, _ = cli(capsys, "status", path, "--once")
    assert code == 0 and "serving" not in out and " ready " not in out, out
    line = next(line for line in out.splitlines() if "ended" in line and "SIGTERM" in line)
    assert re.search(r"ended (83|84) min ago", line) and time.strftime("%Y-%m-%d", time.gmtime(end / S)) in line

    cli(capsys, "report", path, "-o", str(tmp_path / "r.html"))
    verdict = report_verdict((tmp_path / "r.html").read_text())
    assert verdict.startswith("ended: ENDED — ") and "SIGTERM" in verdict, verdict

    code, out, _ = cli(capsys, "probe", path)
    assert code == 8 and "served, then ended" in out, out


# -- an unreadable journal -----------------------------------------------------------------------


def test_a_rank_whose_journal_cannot_be_read_keeps_its_row_and_the_view_says_it_is_incomplete(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = build_run(tmp_path / "run", ranks=2, spans=40)
    locked = rank_journal(run.path, run.pids["tp1"])
    locked.chmod(0)
    if os.geteuid() == 0:  # root reads it anyway: ``open`` is refused as it is for another user
        real_open = journal_tail._open_regular

        def refused(path: Path) -> tuple[int, os.stat_result]:
            if Path(path) == locked:
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(path)

        monkeypatch.setattr(journal_tail, "_open_regular", refused)
    path = str(run.path)
    try:
        code, out, err = cli(capsys, "status", path, "--json")
        doc = json.loads(out)
        rows = {r["label"]: r for r in doc["ranks"]}
        assert code == command.EXIT_INCOMPLETE == doc["exit_code"], doc
        assert set(rows) == {"launcher", "tp0", "tp1"}, rows  # its label from its status file
        assert rows["tp1"]["state"] == "unreadable" and rows["tp1"]["pid"] == run.pids["tp1"]
        assert "journal unreadable" in rows["tp1"]["verdict"] and "Permission denied" in rows["tp1"]["verdict"]
        assert err.count(f"{locked}: cannot read") == 1, err

        code, out, _ = cli(capsys, "status", path, "--once")
        assert code == command.EXIT_INCOMPLETE and "(3 processes)" in out
        assert re.search(r"^ tp1 +\d+ +unreadable", out, re.M) and "tp1: journal unreadable" in out, out

        code, out, err = cli(capsys, "compare", path, "--json")
        doc = json.loads(out)
        assert code == command.EXIT_INCOMPLETE and [u["label"] for u in doc["unreadable"]] == ["tp1"], doc.keys()
        code, out, err = cli(capsys, "compare", path)
        assert code == command.EXIT_INCOMPLETE and "tp1: journal unreadable" in out + err

        code, out, err = cli(capsys, "timeline", path)
        assert code == command.EXIT_INCOMPLETE and re.search(r"^tp1 .*journal unreadable", out, re.M), out
        code, _, _ = cli(capsys, "report", path, "-o", str(tmp_path / "r.html"))
        assert code == command.EXIT_INCOMPLETE and "journal unreadable" in (tmp_path / "r.html").read_text()
        code, _, _ = cli(capsys, "export", path, "--format", "perfetto", "-o", str(tmp_path / "p.json"))
        assert code == command.EXIT_INCOMPLETE
    finally:
        locked.chmod(0o600)
    code, out, err = cli(capsys, "--help")
    assert re.search(rf"^  {command.EXIT_INCOMPLETE} +the view is incomplete", out, re.M)


# -- viewers write nothing -----------------------------------------------------------------------


def _recorded(run: Path) -> None:
    """The launch root says what was launched (a fingerprint for the history)."""
    journal = run / "journal" / f"{HOST}-{LAUNCHER_PID}.jsonl"
    out = []
    for line in lines_of(journal):
        r = json.loads(line)
        if r["kind"] == "begin" and r["parent"] is None:
            r["attrs"]["sglang.server_args"] = json.dumps(ARGS, sort_keys=True)
        out.append(json.dumps(r) + "\n")
    journal.write_text("".join(out))


def test_read_only_verbs_write_nothing_but_the_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sglang_phasetrace.tracing.history import store

    base = tmp_path / "runs"
    for name in ("20261207-010000-aaaaaa", "20261207-020000-bbbbbb"):
        build_run(base / name, ranks=2, spans=40, end_ns=time.time_ns() - 5000 * S)
        _recorded(base / name)
    store.write(load.load_run(base / "20261207-010000-aaaaaa"), base / "history.sqlite")
    store.forget()
    before = sorted(p.name for p in base.iterdir())
    assert before == ["20261207-010000-aaaaaa", "20261207-020000-bbbbbb", "history.sqlite"]
    run = base / "20261207-020000-bbbbbb"
    files = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    for argv in (["status", "--once"], ["status", "--json"], ["timeline"], ["compare"], ["probe"]):
        cli(capsys, argv[0], str(run), *argv[1:])
        assert sorted(p.name for p in base.iterdir()) == before, argv  # no history.sqlite-wal, -shm
        now = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
        assert [f for f in now if f != index.INDEX_NAME] == files, argv
    code, out, err = cli(capsys, "compare", str(run), "--baseline")  # reads the history
    assert code == 0 and "against 1 earlier start" in out, err
    assert sorted(p.name for p in base.iterdir()) == before


def test_watch_refuses_a_directory_that_is_not_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = cli(capsys, "watch", str(empty), "--timeout", "0.2", "--interval", "0.1", "--no-py-spy")
    assert code == 1 and "not a phasetrace run directory" in err and str(empty) in err, err
    assert list(empty.iterdir()) == []


# -- a copied run --------------------------------------------------------------------------------


def test_a_copied_run_directory_uses_its_own_index_without_a_word(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    run = build_run(tmp_path / "a" / "20261207-010000-aaaaaa", ranks=2, spans=40)
    assert load.index_run([run.path], allow_serving=True) == [run.path / index.INDEX_NAME]
    copy = tmp_path / "b" / run.path.name
    shutil.copytree(run.path, copy)  # new inodes, new times: ``cp -r`` to another host
    copy.chmod(0o500)  # a read-only copy: nothing can be written there
    try:
        for _ in range(2):
            cli(capsys, "status", str(copy), "--json")
            cli(capsys, "timeline", str(copy))
        assert not [r.getMessage() for r in caplog.records if "index" in r.getMessage()]
        loaded = index.open_index(copy)
        assert loaded is not None and {s for _, s in loaded.journals.values()} == {index.FRESH}
        renamed = tmp_path / "c" / "renamed"
        shutil.copytree(run.path, renamed)
        loaded = index.open_index(renamed)
        assert loaded is not None and {s for _, s in loaded.journals.values()} == {index.FRESH}
    finally:
        copy.chmod(0o700)


def test_an_index_of_other_journals_is_refused_saying_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run = build_run(tmp_path / "a" / "20261207-010000-aaaaaa", ranks=2, spans=40)
    other = build_run(tmp_path / "b" / run.path.name, ranks=2, spans=40, end_ns=time.time_ns() - 7 * S)
    load.index_run([other.path], allow_serving=True)
    shutil.copy(other.path / index.INDEX_NAME, run.path / index.INDEX_NAME)
    assert index.open_index(run.path) is None
    said = [r.getMessage() for r in caplog.records if "index" in r.getMessage()]
    assert len(said) == 1 and "is not the journal it indexed" in said[0], said


def test_a_run_with_a_journal_that_cannot_be_read_is_not_indexed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its index would stand for the journal as read: empty, for every later viewer."""
    monkeypatch.setattr(index, "finished", lambda view: True)  # as if every process had ended
    run = build_run(tmp_path / "run", ranks=2, spans=40)
    locked = rank_journal(run.path, run.pids["tp1"])
    data = locked.read_bytes()
    locked.unlink()
    os.mkfifo(locked, 0o600)  # not a regular file: refused as unreadable, root or not
    assert load.index_run([run.path]) == []
    view = load.load_run(run.path)
    assert [p.label for p in view.processes if p.unreadable] == ["tp1"]
    locked.unlink()
    locked.write_bytes(data)
    assert load.index_run([run.path]) == [run.path / index.INDEX_NAME]
