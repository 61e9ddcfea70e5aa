"""A finished run is read once (issue 27.4): its parsed state is kept next to its journals
(``reader.index``), every viewer reads it instead of the journals with the same output, a journal
that grew is read on from where the index stops, and an index that is stale, cut short, edited,
another run's, a link or unreadable is one warning and the journals are read.

A real traced start (``engine_run``) is copied per test: each test damages its own copy.
Speed is measured by ``scripts/bench_viewers_1024.py``, not here."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import requires_sglang
from sglang_phasetrace.tracing import other_processes as procs
from sglang_phasetrace.tracing.cli import main
from sglang_phasetrace.tracing.journal.tail import JournalTail
from sglang_phasetrace.tracing.reader import index, load
from sglang_phasetrace.tracing.reader.view import RunView

pytestmark = [pytest.mark.sglang, requires_sglang]


@pytest.fixture
def run(engine_run, tmp_path: Path) -> Path:
    """A private copy of the real run (journals and status files; no index yet)."""
    path = tmp_path / engine_run.run_dir.name
    shutil.copytree(engine_run.run_dir, path, ignore=shutil.ignore_patterns(index.INDEX_NAME, "*.html", "export-*"))
    return path


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index, "_SAID", set())  # one warning per index and process: per test here
    monkeypatch.delenv(index.ENV_INDEX, raising=False)


def _status(text: str) -> Any:
    """``status --json`` without what changes with the clock (ages, times in a phase)."""
    doc = json.loads(text)
    (doc.get("ended") or {}).pop("ago_s", None)
    for row in doc["ranks"]:
        for key in ("heartbeat_age_s", "in_phase_s", "cpu_pct"):
            row.pop(key, None)
    return doc


def outputs(capsys: pytest.CaptureFixture[str], run: Path, out: Path, bundle: bool = True) -> dict[str, Any]:
    """What every viewer verb writes for ``run``: status, timeline, compare, report, the three
    exports, and the bundle's members made from the read (its journal copies included: the bundle
    reads the journals to copy them, redacted)."""
    out.mkdir(exist_ok=True)
    got: dict[str, Any] = {}

    def cli(*argv: str) -> str:
        code = main([*argv])
        text = capsys.readouterr().out
        assert code == 0, (argv, text)
        return text

    got["status"] = _status(cli("status", str(run), "--json"))
    got["status table"] = re.sub(r"[\d.]+ \w+ ago", "… ago", cli("status", str(run), "--once"))  # heartbeat ages
    got["timeline"] = cli("timeline", str(run), "--width", "150", "--depth", "2")
    got["compare"] = cli("compare", str(run), "--json")
    got["compare table"] = cli("compare", str(run))
    cli("report", str(run), "-o", str(out / "report.html"))
    got["report"] = (out / "report.html").read_bytes()
    for fmt in ("jaeger", "otlp-json", "perfetto"):
        cli("export", str(run), "--format", fmt, "-o", str(out / f"{fmt}.json"))
        got[fmt] = (out / f"{fmt}.json").read_bytes()
    if not bundle:
        return got
    cli("bundle", str(run), "-o", str(out / "bundle.tar.gz"))
    with tarfile.open(out / "bundle.tar.gz") as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if len(parts) > 2 and parts[2] in ("journal", "timeline.txt", "report.html", "phases.md", "diagnosis.txt"):
                got[f"bundle {'/'.join(parts[2:])}"] = tar.extractfile(member).read()
    return got


def journal_bytes_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Bytes the journal reader reads, one entry per read (a spy on ``JournalTail._read_more``)."""
    read: list[int] = []
    real = JournalTail._read_more

    def spy(self: JournalTail, limit: int) -> tuple[bytes, int]:
        data, size = real(self, limit)
        read.append(len(data))
        return data, size

    monkeypatch.setattr(JournalTail, "_read_more", spy)
    return read


def warnings_about(caplog: pytest.LogCaptureFixture, path: Path) -> list[str]:
    return [r.getMessage() for r in caplog.records if "index" in r.getMessage() and str(path) in r.getMessage()]


def test_a_finished_run_is_indexed_once_and_every_verb_reads_the_same(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(index.ENV_INDEX, "0")  # off: the journals, as before
    plain = outputs(capsys, run, tmp_path / "plain")
    assert not (run / index.INDEX_NAME).exists()
    monkeypatch.delenv(index.ENV_INDEX)
    first = outputs(capsys, run, tmp_path / "first")  # the first viewer reads the journals and writes it
    st = os.lstat(run / index.INDEX_NAME)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    loaded = index.open_index(run)
    assert loaded is not None and loaded.index.finished
    assert {state for _, state in loaded.journals.values()} == {index.FRESH}
    read = journal_bytes_read(monkeypatch)
    indexed = outputs(capsys, run, tmp_path / "indexed", bundle=False)
    assert not any(read), "a verb read a journal although the index held it"
    assert first == plain and indexed == {k: v for k, v in plain.items() if not k.startswith("bundle")}
    assert outputs(capsys, run, tmp_path / "again") == plain


def test_the_index_is_keyed_to_the_code_that_reads_the_journals() -> None:
    """Each source the layout digest covers exists: a module renamed away (``run.py`` became ``view.py``)
    would drop out of it silently, and an index written by older code be taken for this code's."""
    assert all(path.is_file() for path in index.sources()), index.sources()
    assert {path.name for path in index.sources()} >= {"view.py", "load.py", "tail.py", "bulk_decode.py"}


def test_the_index_holds_every_field_of_each_process(run: Path) -> None:
    """``ProcessRec`` is carried field by field: a field added to it is carried without a change
    (but ``exit``, which the view sets from other journals' records, on every read)."""
    view = load.refresh_parallel(RunView(run), final=False, write=False)
    assert index.write(view, True, load._levels, load._shallow) == [run / index.INDEX_NAME]
    loaded = index.open_index(run)
    assert loaded is not None
    for path, (tail, proc) in view._tails.items():
        tail2, proc2 = loaded.restore(path)

        def fields(p: Any) -> dict[str, Any]:
            return {k: v for k, v in vars(p).items() if k not in ("spans", "exit")}

        assert fields(proc2) == fields(proc)
        assert [msgspec.structs.asdict(s) for s in proc2.spans.values()] == [
            msgspec.structs.asdict(s) for s in proc.spans.values()
        ]
        assert {k: v for k, v in vars(tail2).items() if k != "_chunk"} == {
            k: v for k, v in vars(tail).items() if k != "_chunk"
        }
    again = load.refresh_parallel(RunView(run), final=False, write=False)
    assert [p.exit for _, p in again._tails.values()] == [p.exit for _, p in view._tails.values()]


def test_a_journal_that_grew_is_read_on_from_where_the_index_stops(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    load.index_run([run])
    journal = max((run / "journal").glob("*.jsonl"), key=lambda p: p.stat().st_size)
    size = journal.stat().st_size
    added = b'{"kind":"warning","t":%d,"message":"appended after the index"}\n' % time.time_ns()
    with open(journal, "ab") as f:
        f.write(added)
    loaded = index.open_index(run)
    assert loaded is not None and loaded.journals[journal][1] == index.GROWN
    read = journal_bytes_read(monkeypatch)
    view = load.refresh_parallel(RunView(run), final=True, write=False)
    assert sum(read) == len(added)  # only the tail
    assert "appended after the index" in view._tails[journal][1].warnings
    grown = outputs(capsys, run, tmp_path / "grown")
    monkeypatch.setenv(index.ENV_INDEX, "0")
    assert grown == outputs(capsys, run, tmp_path / "fresh")
    assert not warnings_about(caplog, run)  # growing is no fault
    monkeypatch.delenv(index.ENV_INDEX)
    again = index.open_index(run)  # the viewer wrote it again: the journal as it is now
    assert again is not None and again.journals[journal][1] == index.FRESH and size < again.journals[journal][0].size


def _truncated(path: Path, other: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _span_edited(path: Path, other: Path) -> None:
    data = path.read_bytes()
    name = b"model.load_weights"
    assert name in data
    path.write_bytes(data.replace(name, b"model.load_weighTS", 1))


def _spans_edited(path: Path, other: Path) -> None:
    """A span's name changed in the last journal's spans: found only where they are decoded."""
    loaded = index.open_index(path.parent)
    assert loaded is not None
    data = bytearray(path.read_bytes())
    for name in sorted(loaded.journals, reverse=True):  # the last rank's journal (a detokenizer's has none)
        entry, _ = loaded.journals[name]
        start = entry.at + entry.sizes[0]
        if (at := data.find(b"rank.bootstrap", start, start + entry.sizes[1])) >= 0:
            break
    data[at : at + 4] = b"RANK"
    del loaded
    path.write_bytes(bytes(data))


def _wrong_version(path: Path, other: Path) -> None:
    data = path.read_bytes()
    start = len(index.MAGIC) + 8
    size = int.from_bytes(data[len(index.MAGIC) : start], "little")
    header = msgspec.msgpack.decode(data[start : start + size], type=index.Index)
    edited = msgspec.msgpack.encode(msgspec.structs.replace(header, version=index.VERSION + 1))
    assert len(edited) == size
    path.write_bytes(data[:start] + edited + data[start + size :])


def _foreign(path: Path, other: Path) -> None:
    """Another run's index: its largest journal was a line longer (a copy of this run's own index
    is its index: ``test_damaged_runs.py``)."""
    stranger = other.parent.parent / "stranger" / other.name
    shutil.copytree(other, stranger, ignore=shutil.ignore_patterns(index.INDEX_NAME))
    journal = max((stranger / "journal").glob("*.jsonl"), key=lambda p: p.stat().st_size)
    with journal.open("ab") as f:
        f.write(journal.read_bytes().splitlines(keepends=True)[-1])
    load.index_run([stranger])
    shutil.copy(stranger / index.INDEX_NAME, path)


def _link(path: Path, other: Path) -> None:
    path.unlink()
    path.symlink_to(other / index.INDEX_NAME)


def _fifo(path: Path, other: Path) -> None:
    path.unlink()
    os.mkfifo(path, 0o600)


def _journal_replaced(path: Path, other: Path) -> None:
    """The largest journal copied and renamed over itself: the same bytes, another file (stale)."""
    journal = max((path.parent / "journal").glob("*.jsonl"), key=lambda p: p.stat().st_size)
    copy = journal.with_suffix(".tmp")
    shutil.copy2(journal, copy)
    copy.replace(journal)


def _journal_rewritten(path: Path, other: Path) -> None:
    """The largest journal written again in place, to the same size (its time changed): stale."""
    journal = max((path.parent / "journal").glob("*.jsonl"), key=lambda p: p.stat().st_size)
    journal.write_bytes(journal.read_bytes())
    st = journal.stat()
    os.utime(journal, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def _unreadable(path: Path, other: Path) -> None:
    path.chmod(0)  # root reads it anyway: ``open`` is refused below as it is for another user


@pytest.mark.parametrize(
    "damage, why",
    [
        (_truncated, "cut short"),
        (_span_edited, "checksum"),
        (_spans_edited, "checksum"),
        (_wrong_version, "another version"),
        (_foreign, "of another run"),
        (_link, "symbolic link"),
        (_fifo, "not a regular file"),
        (_unreadable, "cannot be read"),
        (_journal_replaced, "another copy of"),
        (_journal_rewritten, "changed since it was indexed"),
    ],
)
def test_a_bad_index_is_one_warning_and_the_journals_are_read(
    run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    damage,
    why: str,
) -> None:
    monkeypatch.setenv(index.ENV_INDEX, "0")
    plain = outputs(capsys, run, tmp_path / "plain")
    monkeypatch.delenv(index.ENV_INDEX)
    other = tmp_path / "other" / run.name  # another run: the same start copied, its own index
    shutil.copytree(run, other)
    load.index_run([other])
    load.index_run([run])
    target = (other / index.INDEX_NAME).read_bytes()
    path = run / index.INDEX_NAME
    damage(path, other)
    if damage is _unreadable:
        real_open = os.open

        def refused(file: Any, *args: Any, **kwargs: Any) -> int:
            if str(file) == str(path):
                raise PermissionError(13, "Permission denied", str(file))
            return real_open(file, *args, **kwargs)

        monkeypatch.setattr(index.os, "open", refused)
    caplog.set_level(logging.WARNING, "sglang_phasetrace")
    got = outputs(capsys, run, tmp_path / "damaged")
    said = warnings_about(caplog, path)
    assert len(said) == 1 and why in said[0], said
    assert said[0].startswith("sglang-phasetrace: ")
    assert got == plain
    assert (other / index.INDEX_NAME).read_bytes() == target  # a link is replaced, never written through
    if damage is not _unreadable:  # the viewer wrote a good one in its place
        monkeypatch.setattr(index, "_SAID", set())
        st = os.lstat(path)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        loaded = index.open_index(run)
        assert loaded is not None and {s for _, s in loaded.journals.values()} == {index.FRESH}


def test_index_off_neither_reads_nor_writes_one(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SGLANG_PHASETRACE_INDEX=0``: an index there is not opened, none is written or replaced."""
    load.index_run([run])
    path = run / index.INDEX_NAME
    before = os.lstat(path)
    monkeypatch.setenv(index.ENV_INDEX, "0")

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the index was read although it is turned off")

    monkeypatch.setattr(index, "_open", never)
    read = journal_bytes_read(monkeypatch)
    outputs(capsys, run, tmp_path / "off", bundle=False)
    assert sum(read) >= sum(p.stat().st_size for p in (run / "journal").glob("*.jsonl"))  # every journal parsed
    after = os.lstat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert index.open_index(run) is None
    assert load.index_run([run]) == [] and os.lstat(path).st_ino == before.st_ino


def _as_if_alive(run: Path) -> None:
    """The launcher's journal names this test's own process: a run whose launcher still runs."""
    journal = next(p for p in (run / "journal").glob("*.jsonl") if b'"role":"launcher"' in p.read_bytes())
    lines = journal.read_bytes().splitlines(keepends=True)
    first = json.loads(lines[0])
    assert first["kind"] == "process"
    first.update(pid=os.getpid(), host=procs.this_host(), start_ticks=procs.start_ticks(os.getpid()))
    first["boot_id"] = procs.boot_id()
    lines[0] = json.dumps(first, separators=(",", ":")).encode() + b"\n"
    journal.write_bytes(b"".join(lines))


def test_a_live_run_is_never_indexed_as_finished(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _as_if_alive(run)
    view = load.load_run(run, parallel=True)
    assert not index.finished(view)
    plain = outputs(capsys, run, tmp_path / "plain")
    assert not (run / index.INDEX_NAME).exists()  # no viewer writes it while the launcher runs
    assert load.index_run([run]) == []
    # a launcher whose ranks are ready (its launch serves) may have it written: not as finished
    assert load.index_run([run], allow_serving=True) == [run / index.INDEX_NAME]
    loaded = index.open_index(run)
    assert loaded is not None and not loaded.index.finished
    assert outputs(capsys, run, tmp_path / "serving") == plain


@pytest.mark.forks
def test_a_split_read_takes_the_childs_half_from_the_index(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large run is read by two processes: each decodes its half of the index, and the parent
    takes the shallow state of the child's half from it; the same output as one plain read."""
    monkeypatch.setenv(index.ENV_INDEX, "0")
    plain = outputs(capsys, run, tmp_path / "plain")
    monkeypatch.delenv(index.ENV_INDEX)
    load.index_run([run])
    monkeypatch.setattr(load.Child, "MIN_BYTES", 0)
    monkeypatch.setattr(load, "_cores", lambda: 2)
    restore = index.Loaded.restore

    def spy(self: index.Loaded, path: Path, shallow: bool = False) -> Any:
        if shallow:
            taken.append(path)
        return restore(self, path, shallow)

    taken: list[Path] = []
    monkeypatch.setattr(index.Loaded, "restore", spy)
    started: list[load.Child | None] = []
    start = load.Child.start

    def forks(*args: Any, **kwargs: Any) -> load.Child | None:
        started.append(start(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(load.Child, "start", staticmethod(forks))
    read = journal_bytes_read(monkeypatch)
    split = outputs(capsys, run, tmp_path / "split", bundle=False)
    assert any(child is not None and child.serving for child in started)  # the split verbs forked
    assert taken and not any(read)
    assert split == {k: v for k, v in plain.items() if not k.startswith("bundle")}


@pytest.mark.forks
def test_a_split_read_whose_child_finds_its_spans_damaged_reads_the_journals(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """The spans of the child's journal are checked where they are decoded (in the child): it
    fails, and its journals are read from the files; one warning; the same output."""
    monkeypatch.setenv(index.ENV_INDEX, "0")
    plain = outputs(capsys, run, tmp_path / "plain", bundle=False)
    monkeypatch.delenv(index.ENV_INDEX)
    load.index_run([run])
    _spans_edited(run / index.INDEX_NAME, run)
    monkeypatch.setattr(load.Child, "MIN_BYTES", 0)
    monkeypatch.setattr(load, "_cores", lambda: 2)
    monkeypatch.setattr(load, "_write_index", lambda view: None)  # keep the damaged one for every verb
    caplog.set_level(logging.WARNING, "sglang_phasetrace")
    assert outputs(capsys, run, tmp_path / "damaged", bundle=False) == plain
    said = warnings_about(caplog, run / index.INDEX_NAME)
    assert len(said) == 1 and "checksum" in said[0], said


def test_a_large_run_has_its_index_written_by_a_process_of_its_own(
    run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off the viewer's path: a detached writer starts once the viewer is done with its read."""
    monkeypatch.setattr(index, "INLINE_BYTES", 0)
    assert main(["timeline", str(run)]) == 0
    capsys.readouterr()
    _wait_for_index(run)
    loaded = index.open_index(run)
    assert loaded is not None and loaded.index.finished
    assert {state for _, state in loaded.journals.values()} == {index.FRESH}


def test_a_viewer_waits_for_a_writer_at_work_and_reads_its_index(
    run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer holds the run directory while it reads and writes (``index.hold``): a viewer that
    starts meanwhile waits for its index (at most ``WRITER_WAIT_S``) rather than reading the
    journals beside it, a second writer leaves it to the first, and a writer that never ends
    costs a viewer the bound, not more."""
    import fcntl
    import threading

    held = index.hold([run])
    assert held and index.hold([run]) is None  # a second writer: the first one writes
    reads: list[bool] = []  # per journal: taken from the index
    first_read = load._first_read

    def spy(view: RunView, journals: list[Path], used: dict, *args: Any) -> None:
        if threading.current_thread() is threading.main_thread():  # the viewer's (not the writer's)
            reads.extend(bool(used.get(path)) for path in view.paths)
        first_read(view, journals, used, *args)

    monkeypatch.setattr(load, "_first_read", spy)

    def write_then_let_go() -> None:
        time.sleep(0.5)
        assert load.index_run([run]) and (run / index.INDEX_NAME).exists()
        os.close(held[0])

    writer = threading.Thread(target=write_then_let_go)
    tic = time.monotonic()
    writer.start()
    assert main(["status", str(run), "--once"]) in (0, 8)
    writer.join()
    assert time.monotonic() - tic >= 0.5 and reads == [True]  # it waited, then read the index
    capsys.readouterr()

    fd = os.open(run, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a writer that never lets go
    try:
        tic = time.monotonic()
        index.await_writer(run, bound=0.3)
        assert 0.3 <= time.monotonic() - tic < 2
    finally:
        os.close(fd)
    tic = time.monotonic()
    index.await_writer(run)  # nobody holds it: no wait
    assert time.monotonic() - tic < 0.1


def test_whoever_ends_the_run_has_it_indexed_once_it_has_exited(run: Path) -> None:
    """A launcher at its end (or ``phasetrace run``) asks for the index and exits at once: a
    detached writer waits for it to be gone, then writes it."""
    ask = f"from sglang_phasetrace.tracing.reader import index; index.spawn_writer([{str(run)!r}], 'exit')"
    tic = time.monotonic()
    subprocess.run([sys.executable, "-c", ask], check=True, timeout=60)
    assert time.monotonic() - tic < 30  # it did not wait for the writer
    _wait_for_index(run)
    loaded = index.open_index(run)
    assert loaded is not None and loaded.index.finished


def _wait_for_index(run: Path) -> None:
    deadline = time.monotonic() + 120
    while not (run / index.INDEX_NAME).exists() and time.monotonic() < deadline:
        time.sleep(0.2)


def test_a_launcher_has_its_run_indexed_when_the_launch_serves(engine_run) -> None:
    """The real traced start: its launcher's watchdog, at serving, started the writer (``watchdog.index_later``);
    every viewer after it reads the index."""
    _wait_for_index(engine_run.run_dir)
    assert index.open_index(engine_run.run_dir) is not None
