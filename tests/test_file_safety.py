"""What tracing writes is private and never follows a planted link; an unwritable, unsafe or full
run directory costs SGLang one warning per process, never a flood, a leak, a torn record or its
OTLP export. Read-only and full filesystems are real tmpfs mounts where this user may mount (root);
a full disk is also faked at ``os.write`` so the torn-record logic runs everywhere.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_fixtures import build_run
from conftest import ROOT, free_port, read_journal, requires_sglang, run_program
from sglang_phasetrace.tracing import files, process_state
from sglang_phasetrace.tracing.cli import main
from sglang_phasetrace.tracing.journal import records
from sglang_phasetrace.tracing.journal import tail as journal
from sglang_phasetrace.tracing.journal.writer import JournalWriter
from sglang_phasetrace.tracing.reader.load import load_run
from sglang_phasetrace.tracing.recorder import heartbeat, runtime, spans

PHASES = 30


@pytest.fixture(autouse=True)
def said_afresh() -> Iterator[None]:
    """Each test is a fresh process as far as "said once" goes."""
    process_state.STATE.said.clear()
    yield
    process_state.STATE.said.clear()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sglang_phasetrace" and r.levelno >= logging.WARNING]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "64k", ro: bool = False) -> Iterator[Path]:
    """A real tmpfs of ``size`` at ``path`` (mode 0700), unmounted after; skips where mount is refused."""
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size},mode=0700" + (",ro" if ro else "")
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True, timeout=30
        )
    except OSError as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def fill(directory: Path) -> Path:
    """Fill the filesystem of ``directory`` to the last byte; returns the filler file."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"x" * 4096)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"x")
    finally:
        os.close(fd)
    return filler


def run_phases(n: int = PHASES) -> list[spans.PhaseSpan | None]:
    started = []
    for i in range(n):
        phase = spans.start_phase(f"phase.{i}", {"sglang.phase": f"phase.{i}", "i": i})
        if phase is not None:
            phase.event("tick", {"i": i})
            phase.end()
        started.append(phase)
    return started


def wait_for(path: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert path.exists(), f"{path} never appeared"


# -- private, and no link followed -------------------------------------------------------------------


def test_everything_a_traced_process_writes_is_private_whatever_the_umask(trace_run_dir: Path) -> None:
    old = os.umask(0)
    try:
        root = spans.start_phase("rank tp0", {"sglang.phase": "rank"}, root=True)
        run_phases(3)
        beat = heartbeat.current()
        wait_for(beat.status_path)
        beat.beat()
        root.end()
    finally:
        os.umask(old)
    made = [trace_run_dir, *trace_run_dir.rglob("*")]
    assert {p.relative_to(trace_run_dir).parts[0] for p in made[1:]} >= {"journal", "status"}
    for path in made:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        assert not path.is_symlink()
        assert mode == (0o700 if path.is_dir() else 0o600), f"{path}: {mode:o}"


def _plant(link: Path, target: Path) -> None:
    files.private_dir(link.parent)
    link.symlink_to(target)


def test_a_link_planted_at_the_journal_is_not_followed(
    trace_run_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    ident = runtime.current().identity
    link = trace_run_dir / "journal" / f"{ident.host}-{ident.pid}.jsonl"
    _plant(link, victim)
    assert run_phases(3) == [None] * 3
    assert victim.read_text() == "precious\n"
    (warning,) = warnings_of(caplog)
    assert str(link) in warning and "tracing off in this process" in warning


def test_links_planted_at_the_status_file_and_its_old_temp_are_not_followed(
    trace_run_dir: Path, tmp_path: Path
) -> None:
    ident = runtime.current().identity
    status = trace_run_dir / "status" / f"{ident.host}-{ident.pid}.json"
    victims = {status: tmp_path / "victim1.txt", status.with_suffix(".tmp"): tmp_path / "victim2.txt"}
    for link, victim in victims.items():
        victim.write_text("precious\n")
        _plant(link, victim)
    phase = spans.start_phase("phase", {"sglang.phase": "phase"})
    beat = heartbeat.current()
    beat.beat()
    phase.end()
    assert all(v.read_text() == "precious\n" for v in victims.values())
    assert not status.is_symlink() and json.loads(status.read_text())["kind"] == "heartbeat"
    assert stat.S_IMODE(status.stat().st_mode) == 0o600


def test_a_link_at_the_atomic_writes_temp_name_is_refused(tmp_path: Path, monkeypatch) -> None:
    victim, target = tmp_path / "victim.txt", tmp_path / "status.json"
    victim.write_text("precious\n")
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: "fixed")
    (tmp_path / ".status.json.fixed.tmp").symlink_to(victim)
    with pytest.raises(FileExistsError):
        files.write_atomic(target, b"new")
    assert victim.read_text() == "precious\n" and not target.exists()


def test_a_run_directory_that_is_a_link_is_refused(
    trace_run_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    trace_run_dir.symlink_to(elsewhere)
    assert run_phases(3) == [None] * 3
    assert list(elsewhere.iterdir()) == []
    (warning,) = warnings_of(caplog)
    assert str(trace_run_dir) in warning and "symbolic link" in warning


@pytest.mark.parametrize("unsafe", ["world-writable", "another user's", "a link"])
def test_an_unsafe_base_directory_is_refused_with_one_warning(
    unsafe: str, trace_run_dir: Path, tmp_path: Path, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    base = tmp_path / "shared"
    if unsafe == "a link":
        (tmp_path / "real").mkdir(mode=0o700)
        base.symlink_to(tmp_path / "real")
    else:
        base.mkdir()
        os.chmod(base, 0o777 if unsafe == "world-writable" else 0o755)
    if unsafe == "another user's":
        if os.geteuid() != 0:
            pytest.skip("needs root to give a directory away")
        os.chown(base, 12345, 12345)
    monkeypatch.delenv("SGLANG_PHASETRACE_RUN_DIR")  # the default: a fresh run under the base
    monkeypatch.setenv("SGLANG_PHASETRACE_DIR", str(base))
    assert run_phases() == [None] * PHASES
    (warning,) = warnings_of(caplog)
    assert warning.startswith("sglang-phasetrace: refusing") and str(base) in warning
    assert warning.endswith("tracing off in this process")
    assert list(base.iterdir()) == []


def test_a_sticky_shared_base_is_used(trace_run_dir: Path, tmp_path: Path, monkeypatch) -> None:
    base = tmp_path / "tmp-like"
    base.mkdir()
    os.chmod(base, 0o1777)
    monkeypatch.setenv("SGLANG_PHASETRACE_RUN_DIR", str(base / "run"))
    assert all(run_phases(2))
    assert stat.S_IMODE((base / "run").stat().st_mode) == 0o700


# -- a base another user can write in (/tmp): this user's runs and history in a private subdirectory --


@pytest.fixture
def other_user() -> tuple[int, int]:
    """A second user (``nobody``, else one ``useradd`` makes): its uid and gid. Needs root."""
    if os.geteuid() != 0:
        pytest.skip("planting files as a second user needs root (setuid)")
    for attempt in range(2):
        try:
            pw = pwd.getpwnam("nobody")
            return pw.pw_uid, pw.pw_gid
        except KeyError:
            if attempt == 0:
                subprocess.run(["useradd", "--no-create-home", "nobody"], capture_output=True, timeout=30)
    pytest.skip("no second user, and useradd could not make one")


def as_user(user: tuple[int, int], act: Callable[[], None]) -> None:
    """``act()`` in a forked child that runs as ``user`` (its files are that user's)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(user[1])
            os.setuid(user[0])
            act()
            code = 0
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0, "the second user's planting failed"


@pytest.fixture
def shared_base() -> Iterator[Path]:
    """A directory like ``/tmp``: root's, mode 1777, reachable by every user."""
    base = Path(tempfile.mkdtemp(prefix="phasetrace-shared-", dir="/tmp"))
    os.chmod(base, 0o1777)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


PLANTED = ("history.sqlite", "history.sqlite-wal", "history.sqlite-shm")


def plant_history(user: tuple[int, int], where: Path) -> None:
    """The second user's ``history.sqlite`` and SQLite's ``-wal``/``-shm`` beside it, mode 0666."""

    def plant() -> None:
        for name in PLANTED:
            fd = os.open(where / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            os.write(fd, b"planted by another user " + name.encode())
            os.fchmod(fd, 0o666)
            os.close(fd)

    as_user(user, plant)


def still_planted(user: tuple[int, int], where: Path) -> bool:
    return all(
        (where / n).read_bytes() == b"planted by another user " + n.encode() and (where / n).stat().st_uid == user[0]
        for n in PLANTED
    )


def test_a_shared_base_keeps_runs_and_history_in_a_private_subdirectory_beside_planted_files(
    other_user: tuple[int, int], shared_base: Path, trace_run_dir: Path, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``SGLANG_PHASETRACE_DIR=/tmp``: the second user's ``history.sqlite`` and its ``-wal``/``-shm``
    wait there; the run directory and the history go in ``phasetrace-<uid>`` (0700, this user's)
    and never touch them."""
    from sglang_phasetrace.tracing.history import store, where
    from test_history import synthetic

    plant_history(other_user, shared_base)
    monkeypatch.delenv("SGLANG_PHASETRACE_RUN_DIR")  # the default: a fresh run under the base
    monkeypatch.delenv("SGLANG_PHASETRACE_HISTORY", raising=False)
    monkeypatch.setenv("SGLANG_PHASETRACE_DIR", str(shared_base))
    assert all(run_phases(2))
    home = shared_base / files.home_name()
    run_dir = runtime.current().run_dir
    assert run_dir is not None and run_dir.parent == home
    for made in (home, run_dir):
        st = os.lstat(made)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    assert where.location() == home / "history.sqlite" == store.of_run_dir(run_dir)
    assert store.of_run_dir(shared_base / "named-run") == home / "history.sqlite"  # SGLANG_PHASETRACE_RUN_DIR=/tmp/x

    done = store.record(load_run(synthetic(home / "synthetic", 0)))
    assert done is not None and done.path == home / "history.sqlite"
    assert stat.S_IMODE(done.path.stat().st_mode) == 0o600 and done.path.stat().st_uid == os.geteuid()
    with store.History.open(done.path) as history:
        assert history.con is not None
    assert still_planted(other_user, shared_base)
    assert sorted(os.listdir(shared_base)) == sorted([home.name, *PLANTED])
    assert warnings_of(caplog) == []


def test_a_history_named_in_a_shared_directory_is_refused_with_one_warning(
    other_user: tuple[int, int], shared_base: Path, tmp_path: Path, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``SGLANG_PHASETRACE_HISTORY=/tmp/history.sqlite``, the second user's files already there:
    neither written nor read (SQLite would take their ``-wal`` as ours); one warning naming it."""
    from sglang_phasetrace.tracing.history import store
    from test_history import synthetic

    plant_history(other_user, shared_base)
    db = shared_base / "history.sqlite"
    monkeypatch.setenv("SGLANG_PHASETRACE_HISTORY", str(db))
    for i in (0, 1):
        assert store.record(load_run(synthetic(tmp_path / f"r{i}", i))) is None
    (said,) = warnings_of(caplog)
    assert str(db) in said and "not used by this process" in said, said
    with pytest.raises(store.HistoryError, match=f"will not use {db} is owned by uid {other_user[0]}"):
        store.History.open(db)
    ours = shared_base / "ours.sqlite"  # a history of this user's, copied there: beside it, anyone's -wal
    assert store.record(load_run(synthetic(tmp_path / "r2", 2)), tmp_path / "h.sqlite") is not None
    shutil.copyfile(tmp_path / "h.sqlite", ours)
    ours.chmod(0o600)
    with pytest.raises(store.HistoryError, match=f"{shared_base} is writable by other users"):
        store.History.open(ours)
    assert still_planted(other_user, shared_base)


def test_a_second_users_directory_at_our_private_name_is_refused_with_one_warning(
    other_user: tuple[int, int], shared_base: Path, trace_run_dir: Path, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The second user made ``phasetrace-<our uid>`` first (mode 0777, their files in it): tracing is
    off with one warning naming it, and nothing of ours is written there."""
    home = shared_base / files.home_name()
    as_user(other_user, lambda: (os.mkdir(home), os.chmod(home, 0o777)))
    plant_history(other_user, home)
    monkeypatch.delenv("SGLANG_PHASETRACE_RUN_DIR")
    monkeypatch.setenv("SGLANG_PHASETRACE_DIR", str(shared_base))
    assert run_phases() == [None] * PHASES
    (warning,) = warnings_of(caplog)
    assert warning.startswith("sglang-phasetrace: refusing") and f"{home} is owned by uid {other_user[0]}" in warning
    assert sorted(os.listdir(home)) == sorted(PLANTED) and still_planted(other_user, home)


# -- unwritable or full: one warning, tracing off, nothing leaked -------------------------------------


@pytest.fixture(params=["read-only", "a file"])
def unwritable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A run directory path that cannot be written, and the reason the warning must give (a full
    disk will take records again: ``test_a_disk_full_from_the_start_...``)."""
    if request.param == "a file":
        (tmp_path / "run").write_text("not a directory\n")
        yield tmp_path / "run", "[Errno 20] Not a directory"
    else:
        with tmpfs(tmp_path / "ro", ro=True) as mnt:
            yield mnt / "run", "[Errno 30] Read-only file system"


def test_an_unwritable_run_directory_says_so_once_and_leaks_nothing(
    unwritable: tuple[Path, str], trace_run_dir: Path, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir, reason = unwritable
    monkeypatch.setenv("SGLANG_PHASETRACE_RUN_DIR", str(run_dir))
    before = open_fds()
    t0 = time.perf_counter()
    assert run_phases() == [None] * PHASES
    spent = time.perf_counter() - t0
    (warning,) = warnings_of(caplog)
    assert warning.startswith(f"sglang-phasetrace: cannot write {run_dir}")
    assert warning.endswith(f": {reason}; tracing off in this process")
    assert open_fds() == before
    rt = runtime.current()
    assert not rt.started and rt.journal is None and rt._pending == []
    with pytest.raises(runtime.TracingOff):  # sticky: not retried at every phase
        rt.start()
    assert spent < 5


def test_a_disk_full_from_the_start_holds_every_record_and_writes_them_once_there_is_room(
    trace_run_dir: Path, tmp_path: Path, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Not even the first record fits: the journal is kept, empty (readers pass it over), tracing
    goes on, and every record is written, in order, once the disk has room; one warning."""
    with tmpfs(tmp_path / "full") as mnt:
        filler = fill(mnt)
        run_dir = mnt / "run"
        monkeypatch.setenv("SGLANG_PHASETRACE_RUN_DIR", str(run_dir))
        t0 = time.perf_counter()
        assert all(run_phases())
        assert time.perf_counter() - t0 < 5
        (warning,) = warnings_of(caplog)
        assert warning.startswith(f"sglang-phasetrace: cannot write {run_dir}/journal/")
        assert ": [Errno 28] No space left on device; records are held back" in warning
        path = runtime.current().journal.path
        assert path.stat().st_size == 0 and load_run(run_dir).processes == []
        filler.unlink()
        beat = heartbeat.current()
        beat.beat()  # room again: what was held back is written, then a note of the gap
        records, problems = read_journal(path)
        assert problems == [] and records[0]["kind"] == "process"
        (proc,) = load_run(run_dir).processes
        ended = [s for s in proc.spans.values() if s.phase.startswith("phase.") and s.status == "ok"]
        assert len(ended) == PHASES and any("written late, 0 dropped" in w for w in proc.warnings)
        assert len(warnings_of(caplog)) == 1
        runtime.current().journal.close()


# -- a full disk mid-run: whole records, nothing a reader misreads ----------------------------------


def test_a_disk_full_mid_run_keeps_records_whole_and_loses_no_end(
    trace_run_dir: Path, tmp_path: Path, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    with tmpfs(tmp_path / "disk", size="256k") as mnt:
        run_dir = mnt / "run"
        monkeypatch.setenv("SGLANG_PHASETRACE_RUN_DIR", str(run_dir))
        root = spans.start_phase("rank tp0", {"sglang.phase": "rank"}, root=True)
        assert root is not None
        beat = heartbeat.current()
        wait_for(beat.status_path)  # its first beat done: no file of its own open while we count
        filler = fill(mnt)
        before = open_fds()
        assert all(run_phases())  # tracing goes on: spans (and OTLP) do not depend on the journal
        root.end()  # the rank is ready while its journal cannot be written
        assert open_fds() == before
        (warning,) = warnings_of(caplog)  # the journal's or the status file's, whichever failed first
        assert warning.startswith(f"sglang-phasetrace: cannot write {run_dir}/")
        assert ": [Errno 28] No space left on device; " in warning
        path = runtime.current().journal.path
        beat.beat()  # still full: nothing written, nothing said again
        assert len(warnings_of(caplog)) == 1
        unwritten = json.loads(beat.status_path.read_text())["journal_unwritten"]  # rewritten in place
        assert unwritten["held"] > 0 and unwritten["error"] == "[Errno 28] No space left on device"
        filler.unlink()
        beat.beat()  # room again: what was held back is written, then a note of the gap
        assert read_journal(path)[1] == []
        for line in path.read_bytes().splitlines():
            json.loads(line)
        view = load_run(run_dir)
        (proc,) = view.processes
        assert proc.ready  # the root's end was not lost: not "gone"
        ended = [s for s in proc.spans.values() if s.phase.startswith("phase.") and s.status == "ok"]
        assert len(ended) == PHASES
        assert any("written late, 0 dropped" in w for w in proc.warnings)
        status = json.loads(beat.status_path.read_text())
        assert "journal_unwritten" not in status
        assert len(warnings_of(caplog)) == 1
        runtime.current().journal.close()


def test_status_says_what_a_full_disk_kept_out_of_each_journal(tmp_path: Path, capsys) -> None:
    """Each process's status file says what its journal lacks (``journal_unwritten``): ``status``
    names it, held while the process runs, lost once it is gone; and journals with no record yet."""
    from sglang_phasetrace.tracing.render.missing import missing

    run = tmp_path / "run"
    build_run(run)
    status = run / "status" / "node0-2000.json"
    beat = json.loads(status.read_text())
    trouble = {"error": "[Errno 28] No space left on device", "since": time.time_ns(), "held": 31, "dropped": 2}
    status.write_text(json.dumps({**beat, "journal_unwritten": trouble}))
    (run / "journal" / "node0-3000.jsonl").write_bytes(b"")
    view = load_run(run)
    held, empty = missing(view)
    assert held.startswith("tp0: its journal lacks 31 records since ")
    assert "([Errno 28] No space left on device)" in held
    assert held.endswith(", 2 more dropped: held in its memory while it runs")
    assert empty.startswith("node0-3000.jsonl: no record written yet")
    assert missing(view, {("node0", 2000): False})[0].endswith("lost: it ended before they could be written")
    main(["status", str(run), "--once", "--json"])
    assert json.loads(capsys.readouterr().out)["missing"] == [held, empty]


class CutShort:
    """``files.write_all`` on a disk that fills up mid-record: part of it written, then ENOSPC."""

    def __init__(self, times: int) -> None:
        self.times = times

    def __call__(self, fd: int, data: bytes) -> None:
        if self.times:
            self.times -= 1
            os.write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write_all(fd, data)


real_write_all = files.write_all


def test_a_record_cut_short_is_removed_whole(tmp_path: Path, monkeypatch, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "journal" / "p.jsonl"
    writer = JournalWriter(path)
    assert writer.write(records.warning(1, "first"))
    monkeypatch.setattr(files, "write_all", CutShort(2))
    assert not writer.write(records.warning(2, "second " * 50))
    assert path.read_bytes().count(b"\n") == 1 and path.read_bytes().endswith(b"\n")  # no half line left
    assert writer.trouble()["held"] == 1
    assert not writer.write(records.warning(3, "third"))  # the held one is cut again
    assert writer.write(records.warning(4, "fourth"))
    written, problems = read_journal(path)
    assert problems == []
    assert [r["t"] for r in written[:3]] + [written[4]["t"]] == [1, 2, 3, 4]
    assert "written late, 0 dropped" in written[3]["message"]  # said after the late ones, before the rest
    assert len(warnings_of(caplog)) == 1 and str(path) in warnings_of(caplog)[0]
    assert writer.trouble() is None
    writer.close()


def test_a_cut_record_that_cannot_be_removed_still_leaves_the_next_on_a_fresh_line(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "p.jsonl"
    writer = JournalWriter(path)
    monkeypatch.setattr(files, "write_all", CutShort(1))

    def no_truncate(fd: int, length: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(journal.os, "ftruncate", no_truncate)
    assert not writer.write(records.warning(1, "cut " * 40))
    assert writer.write(records.warning(2, "next"))
    written, problems = read_journal(path)
    assert len(problems) == 1 and f"{path}:1:" in problems[0]  # the torn line, named once
    assert written[0]["t"] == 1 and written[-1]["t"] == 2  # written again whole, on lines of their own
    writer.close()


# -- the journal and the OTLP export never stop each other ------------------------------------------


def test_a_failing_journal_never_stops_the_otlp_export(
    trace_run_dir: Path, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    from otlp_receiver import OtlpReceiver

    with OtlpReceiver("http/protobuf") as rx:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rx.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        first = spans.start_phase("phase.ok", {"sglang.phase": "phase.ok"})
        first.end()

        def broken(self: JournalWriter, record: dict) -> bool:
            raise RuntimeError("journal broke")

        monkeypatch.setattr(JournalWriter, "write", broken)
        later = run_phases(5)
        assert all(later)
        runtime.current().provider.force_flush(10_000)
        ids = {format(p.span_id, "016x") for p in [first, *later]}
        assert rx.wait_for_spans(ids, timeout=10) == set()
        assert len([w for w in warnings_of(caplog) if "journal record not written" in w]) == 1


def test_a_failing_exporter_never_stops_the_journal(trace_run_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    from opentelemetry.sdk.trace import SpanProcessor

    class Broken(SpanProcessor):
        def on_start(self, span, parent_context=None) -> None:
            raise RuntimeError("exporter broke")

        def on_end(self, span) -> None:
            raise RuntimeError("exporter broke")

    rt = runtime.current().start()
    rt.provider.add_span_processor(runtime.Contained(Broken()))  # as the OTLP processor is added: last
    assert all(run_phases(3))
    (proc,) = load_run(trace_run_dir).processes
    assert [s.status for s in proc.spans.values() if s.phase.startswith("phase.")] == ["ok"] * 3
    assert [w for w in warnings_of(caplog) if "exporter" in w] == [
        "sglang-phasetrace: span exporter failed: RuntimeError('exporter broke')"
    ]


# -- real SGLang: ranks on a read-only base start anyway, one warning each --------------------------


@pytest.mark.sglang
@requires_sglang
def test_sglang_ranks_start_on_a_read_only_base_with_one_warning_each(tiny_model, tmp_path: Path) -> None:
    world = 2
    with tmpfs(tmp_path / "ro", ro=True) as base:
        ran = run_program(
            [
                str(ROOT / "tests" / "programs" / "dist_ranks.py"),
                str(tiny_model[0]),
                "--world",
                str(world),
                "--plant",
                "none",
                "--port",
                str(free_port()),
            ],
            base,
            cwd=tmp_path,
            timeout=300,
        )
    assert ran.returncode == 0, ran.stderr[-4000:]
    lines = [line for line in ran.stderr.splitlines() if "sglang-phasetrace" in line]  # the launcher imports no sglang
    assert len(lines) == world, "\n".join(lines)
    assert all(
        f"cannot write {base}/" in line and "[Errno 30] Read-only file system; tracing off in this process" in line
        for line in lines
    )


@pytest.mark.parametrize(
    "verb", [["export", "--format", "jaeger"], ["export", "--format", "perfetto"], ["report"], ["bundle"]]
)
def test_what_the_cli_writes_is_private_and_a_link_at_it_is_replaced(verb: list[str], tmp_path: Path) -> None:
    """An export, a report or a bundle holds the run's (redacted) arguments and stacks: each is made
    like the run's own files whatever the umask, and a link planted at its path is not written through."""
    run = build_run(tmp_path / "run", ranks=2, spans=10).path
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    linked, fresh = tmp_path / "linked.out", tmp_path / "new" / "dirs" / "fresh.out"
    linked.symlink_to(victim)
    old = os.umask(0o022)
    try:
        for out in (linked, fresh):
            assert main([verb[0], str(run), *verb[1:], "-o", str(out)]) == 0
    finally:
        os.umask(old)
    assert victim.read_text() == "precious\n" and not linked.is_symlink()
    for out in (linked, fresh):
        assert stat.S_IMODE(out.lstat().st_mode) == 0o600 and out.stat().st_size > 0
    assert {stat.S_IMODE(d.stat().st_mode) for d in (fresh.parent, fresh.parent.parent)} == {0o700}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["linked.out", "new", "run", "victim.txt"]  # no temp left
