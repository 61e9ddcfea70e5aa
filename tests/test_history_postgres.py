"""The history in a fleet's PostgreSQL (``SGLANG_PHASETRACE_HISTORY=postgresql://…``), against a real
PostgreSQL 15 server each module starts (``pg_server``: initdb/pg_ctl in a temporary directory, as
``nobody`` when run as root, on a loopback port, password authentication) and stops. The same
tests run on both backends where both must behave alike (``backend``). Synthetic runs
(``test_history.synthetic``) for what needs many starts, hosts or a failing database; two real
traced starts (``sglang``): a fresh "pod" that reads "usually" from PostgreSQL, and a start whose
database is stopped while it loads its weights.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pg_server
import pytest
from conftest import HOOKS, PLANTS, SCRIPTS, Ran, hook_env, kill_group, read_journal, requires_sglang
from sglang_phasetrace.tracing import process_state
from sglang_phasetrace.tracing.cli import main
from sglang_phasetrace.tracing.history import History, keeper, live, record, store, transfer, where
from sglang_phasetrace.tracing.history.where import Dsn, HistoryError
from sglang_phasetrace.tracing.reader.load import load_run
from test_history import _start_until, fresh_state, synthetic, warnings_of  # noqa: F401  (fresh_state: autouse)

pytest.importorskip("psycopg", reason="psycopg 3 is not installed (scripts/install-cpu.sh installs it)")


@pytest.fixture(scope="module")
def pg():
    server = pg_server.start()
    if server is None:
        pytest.skip("no PostgreSQL server installed (scripts/install-test-tools.sh installs Debian's postgresql)")
    yield server
    pg_server.stop(server)


_made = iter(range(10_000))


@pytest.fixture
def dsn(pg: pg_server.Server) -> Dsn:
    """A new database of its own on the module's server."""
    return Dsn(pg.create(f"fleet{next(_made)}"))


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Path | Dsn:
    """Each history test's database: a SQLite file, then a PostgreSQL database."""
    if request.param == "sqlite":
        return tmp_path / "history.sqlite"
    return request.getfixturevalue("dsn")


def on_host(path: Path, host: str) -> Path:
    """The synthetic run as if it ran on ``host`` (its journals' host names)."""
    for journal in (path / "journal").iterdir():
        journal.write_text(journal.read_text().replace('"node0"', json.dumps(host)))
    return path


def model_dir(path: Path) -> Path:
    """A model directory whose ``config.json`` is the same bytes wherever it is mounted."""
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": 64}')
    return path


# -- both backends alike -----------------------------------------------------------------------------


def test_record_and_read_back(backend: Path | Dsn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fid = None
    for i in range(3):
        done = record(load_run(synthetic(tmp_path / f"r{i}", i, slow_rank=1 if i == 2 else None)), backend)
        assert done is not None and done.path == backend
        fid = done.fingerprint.id
    assert record(load_run(tmp_path / "r1"), backend) is not None  # again: replaced, not added
    with History.open(backend) as history:
        assert [s.run_id for s in history.starts()] == ["r2", "r1", "r0"]
        (launch,) = history.launches()
        assert launch.id == fid and launch.starts == 3
        usuals = history.usuals(fid)
        pools = usuals["scheduler.init_memory_pools"]
        assert pools.n == 3 and pools.min <= pools.median <= pools.p95 <= pools.max
        assert history.resolve(fid[:4]) == fid
        newest, changes = history.trend(fid)
        assert newest is not None and newest.run_id == "r2" and changes
        assert set(history.by_host(fid)) == {"", "node0"}
    assert live.usuals(fid, backend, exclude={"r2"})["scheduler.init_memory_pools"].n == 2
    got = live.eta(fid, {"scheduler.init_memory_pools": 0.1}, path=backend)
    assert got is not None and got.starts == 3


def test_retention_on_both(backend: Path | Dsn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "KEEP_PER_FINGERPRINT", 3)
    monkeypatch.setattr(store, "KEEP_ALL", 5)
    monkeypatch.setattr(store, "OVERALL_EVERY", 1)  # the overall limit checked at every recording
    monkeypatch.setattr(store, "KEEP_DETAIL", 2)
    monkeypatch.setattr(store, "FLEET_KEEP", (3, 5, 2))
    for i in range(5):
        assert record(load_run(synthetic(tmp_path / f"a{i}", i)), backend) is not None
    for i in range(3):
        assert record(load_run(synthetic(tmp_path / f"b{i}", 10 + i, ranks=3)), backend) is not None
    with History.open(backend) as history:
        assert [s.run_id for s in history.starts()] == ["b2", "b1", "b0", "a4", "a3"]
        detail = history._query("SELECT run_id FROM starts WHERE labels IS NOT NULL ORDER BY started")
        assert [r[0] for r in detail] == ["b1", "b2"]
        assert history._query("SELECT count(DISTINCT run_id) FROM phases")[0][0] == 5


def test_a_slow_start_is_flagged_against_its_history_through_the_cli(
    backend: Path | Dsn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``history --record``, ``compare --baseline`` and ``history`` as a user runs them, the setting
    naming the database (a SQLite path, or the fleet's DSN)."""
    base = tmp_path / "runs"
    monkeypatch.setenv(where.ENV_HISTORY, backend.conninfo if isinstance(backend, Dsn) else str(backend))
    for i in range(4):
        assert main(["history", "--record", str(synthetic(base / f"ok{i}", i))]) == 0
    slow = synthetic(base / "slow", 10, slow_rank=1)
    capsys.readouterr()
    assert main(["compare", str(slow), "--baseline", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["starts"] == 4 and doc["culprit"] == "model.weights_iterator"
    assert main(["history", "--record", str(slow)]) == 0
    capsys.readouterr()
    assert main(["history", "--json"]) == 0
    out = capsys.readouterr().out
    (launch,) = json.loads(out)["launches"]
    assert launch["starts"] == 5 and launch["trend"]["grew"] == "model.weights_iterator"
    if isinstance(backend, Dsn):
        assert pg_password(backend) not in out and json.loads(out)["history"] == str(backend)


def test_an_old_schema_is_migrated_and_read_meanwhile(backend: Path | Dsn, tmp_path: Path) -> None:
    """A database at schema 1 (before ``starts_by_host``, ``starts_detailed`` and ``launch_usuals``):
    read as it is (the watchdog's read worked out from the phases), migrated by the next writer
    (every step), which keeps its launch's row."""
    if isinstance(backend, Dsn):
        import psycopg

        with psycopg.connect(backend.conninfo, autocommit=True) as con:
            for statement in store.MIGRATIONS[0]:
                con.execute(statement.format(**store._TYPES["postgresql"]))
            con.execute("CREATE TABLE phasetrace_schema (version INTEGER NOT NULL)")
            con.execute("INSERT INTO phasetrace_schema VALUES (1)")
    else:
        import sqlite3

        con = sqlite3.connect(backend)
        for statement in store.MIGRATIONS[0]:
            con.execute(statement.format(**store._TYPES["sqlite"]))
        con.execute("PRAGMA user_version = 1")
        con.commit()
        con.close()
        backend.chmod(0o600)
    with History.open(backend) as history:
        assert history.launches() == [] and history.fleet("0123456789ab") == store.Fleet()
    done = record(load_run(synthetic(tmp_path / "r", 0)), backend)
    assert done is not None
    with History.open(backend) as history:
        assert history.db is not None and history.db.version() == store.SCHEMA == 4
        index = (
            "SELECT count(*) FROM pg_indexes WHERE indexname IN ('starts_by_host', 'starts_detailed')"
            if isinstance(backend, Dsn)
            else "SELECT count(*) FROM sqlite_master WHERE name IN ('starts_by_host', 'starts_detailed')"
        )
        assert history._query(index)[0][0] == 2
        assert history._kept(done.fingerprint.id) is not None


def test_the_watchdogs_read_from_the_kept_row_is_the_read_from_the_phases(
    backend: Path | Dsn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``History.fleet`` reads the row its writers keep per launch (``launch_usuals``) and the host's
    own newest starts beside it; the answer is the one worked out from the phases, after recordings
    on two hosts, a start recorded again, retention, an import, and with the start in progress
    left out (then worked out)."""
    monkeypatch.setattr(store, "USUAL_STARTS", 4)  # the host's newest starts reach past the fleet's newest
    monkeypatch.setattr(store, "HOST_STARTS", 3)
    fid = None
    for i in range(8):
        host = "pod-b" if i in (1, 6) else "pod-a"
        run = on_host(synthetic(tmp_path / f"r{i}", i, slow_rank=1 if host == "pod-b" else None), host)
        done = record(load_run(run), backend)
        assert done is not None
        fid = done.fingerprint.id
    assert record(load_run(tmp_path / "r6"), backend) is not None  # recorded again: replaced

    def same(history: History, exclude: frozenset[str] = frozenset()) -> None:
        for host in (None, "pod-a", "pod-b", "pod-c"):
            got = history.fleet(fid, exclude, host)
            assert got == history._worked_out(fid, exclude, host), host
            assert got.usuals and got.seconds

    with History.open(backend) as history:
        assert history._kept(fid) is not None
        same(history)
        same(history, frozenset({"r7"}))  # the newest: not in the row, worked out
        same(history, frozenset({"r1"}))  # pod-b's oldest: only among its own newest
        assert len(history.fleet(fid, host="pod-b").seconds["model.weights_iterator"]["pod-b"]) == 2
    monkeypatch.setattr(store, "OVERALL_EVERY", 1)
    monkeypatch.setattr(store, "KEEP_ALL", 3)
    monkeypatch.setattr(store, "FLEET_KEEP", (50, 3, 2000))
    other = record(load_run(synthetic(tmp_path / "o", 20, ranks=3)), backend)  # another launch: r0-r5 dropped
    assert other is not None and other.fingerprint.id != fid
    with History.open(backend) as history:
        assert [s.run_id for s in history.starts()] == ["o", "r7", "r6"]
        assert history._kept(fid)[0] == {"r6", "r7"} and history._kept(other.fingerprint.id) is not None
        same(history)
    lines = tmp_path / "h.jsonl"
    with History.open(backend) as history:
        transfer.write_lines(transfer.documents(history), lines)
    copy = tmp_path / "copy" / "history.sqlite"
    copy.parent.mkdir(mode=0o700)
    assert transfer.load(transfer.read_lines(lines), copy) == 3
    with History.open(copy) as history:
        assert history._kept(fid) is not None
        same(history)


def test_a_newer_schema_is_refused_with_one_line(dsn: Dsn, tmp_path: Path, caplog) -> None:
    import psycopg

    with psycopg.connect(dsn.conninfo, autocommit=True) as con:
        con.execute("CREATE TABLE phasetrace_schema (version INTEGER NOT NULL)")
        con.execute("INSERT INTO phasetrace_schema VALUES (99)")
    for i in (0, 1):
        assert record(load_run(synthetic(tmp_path / f"r{i}", i)), dsn) is None
    (said,) = warnings_of(caplog)
    assert "schema 99, newer" in said and "not used by this process" in said


# -- the setting: a DSN, a path, or refused; the password never shown ------------------------------------


def test_a_value_neither_a_path_nor_a_dsn_is_refused_with_one_line_and_nothing_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog, capsys: pytest.CaptureFixture[str]
) -> None:
    """The trial's mistyped DSN (one slash) once became ``./postgresql:/user:PASSWORD@host/`` with a SQLite
    database in it; now it is refused, said once, and the password is in no line."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for value in ("postgresql:/phasetrace:SECRETPW@127.0.0.1:5432/fleet", "mysql://u:SECRETPW@db/fleet"):
        process_state.reset()
        caplog.clear()
        monkeypatch.setenv(where.ENV_HISTORY, value)
        with pytest.raises(HistoryError) as raised:
            where.location()
        assert raised.value.kind == "refused" and "SECRETPW" not in str(raised.value)
        for i in (0, 1):
            assert record(load_run(synthetic(tmp_path / f"r{i}", i))) is None
        assert live.usuals("0123456789ab") == {}
        (said,) = warnings_of(caplog)
        assert "neither a path nor a PostgreSQL DSN" in said and "SECRETPW" not in said, said
        code, out, err = 0, "", ""
        code = main(["history"])
        got = capsys.readouterr()
        out, err = got.out, got.err
        assert code == 1 and err.count("\n") == 1 and "neither a path" in err and "SECRETPW" not in out + err
    assert os.listdir(work) == []  # nothing written where we run


def test_a_dsn_is_taken_as_a_dsn_and_shown_without_its_password(pg: pg_server.Server, dsn: Dsn) -> None:
    assert where.parse(dsn.conninfo) == dsn and isinstance(where.parse("/x/history.sqlite"), Path)
    assert isinstance(where.parse("service=fleet"), Dsn) and isinstance(where.parse("host=db dbname=x"), Dsn)
    assert pg.password not in str(dsn) and pg.password not in repr(dsn) and f"127.0.0.1:{pg.port}" in str(dsn)
    assert dsn.host == f"127.0.0.1:{pg.port}"
    assert Dsn("host=db.internal port=5433 password=x dbname=y").host == "db.internal:5433"


def test_a_database_down_or_refusing_the_password_costs_one_line_naming_the_host(
    pg: pg_server.Server, tmp_path: Path, caplog
) -> None:
    bad = Dsn(pg.dsn("postgres", password="WRONGPASSWORD"))
    for i in (0, 1):
        tic = time.monotonic()
        assert record(load_run(synthetic(tmp_path / f"r{i}", i)), bad) is None
        assert time.monotonic() - tic < 1.0
    assert live.usuals("0123456789ab", bad) == {}
    (said,) = warnings_of(caplog)
    assert f"127.0.0.1:{pg.port}" in said and "password authentication failed" in said
    assert "WRONGPASSWORD" not in said and pg.password not in said


def test_doctor_says_where_the_history_is_never_the_password(
    pg: pg_server.Server, dsn: Dsn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert record(load_run(synthetic(tmp_path / "r", 0)), dsn) is not None
    monkeypatch.setenv(where.ENV_HISTORY, dsn.conninfo)
    ok, said = store.check()
    assert ok and said.endswith("(PostgreSQL): 1 start") and f"127.0.0.1:{pg.port}" in said
    monkeypatch.setenv(where.ENV_HISTORY, pg.dsn("postgres", password="WRONGPASSWORD"))
    ok, said = store.check()
    assert not ok and "password authentication failed" in said and "WRONGPASSWORD" not in said
    monkeypatch.setenv(where.ENV_HISTORY, "postgresql:/u:WRONGPASSWORD@h/db")
    ok, said = store.check()
    assert not ok and "neither a path" in said and "WRONGPASSWORD" not in said
    assert pg.password not in said


def test_a_database_that_does_not_answer_costs_a_reader_one_second(tmp_path: Path, caplog) -> None:
    """A listener that never answers: libpq would wait 2 s (its least connect_timeout); the watchdog's
    read gives up after ``postgres.READ_WAIT_S``, said once; the next reads answer from memory."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        mute = Dsn(f"postgresql://phasetrace:SECRETPW@127.0.0.1:{silent.getsockname()[1]}/fleet")
        tic = time.monotonic()
        assert live.usuals("0123456789ab", mute) == {}
        assert 0.9 < time.monotonic() - tic < 1.5
        tic = time.monotonic()
        assert live.usuals("0123456789ab", mute) == {}
        assert time.monotonic() - tic < 0.1
    finally:
        silent.close()
    (said,) = warnings_of(caplog)
    assert "did not answer within 1 s" in said and "127.0.0.1" in said and "SECRETPW" not in said


# -- a fleet: many writers, two hosts, one launch ------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import sys
    from sglang_phasetrace.tracing.history import record
    from sglang_phasetrace.tracing.history.where import Dsn
    from sglang_phasetrace.tracing.reader.load import load_run
    runs = [load_run(run) for run in sys.argv[2:]]
    sys.stdin.readline()  # all at once
    print(sum(record(run, Dsn(sys.argv[1])) is not None for run in runs))
    """
)


def test_many_launches_recording_at_once_lose_and_duplicate_nothing(dsn: Dsn, tmp_path: Path) -> None:
    """16 writers x 4 starts (64 nodes ending a start in the same second), each start also
    recorded twice at once: 64 starts, each once."""
    runs = [synthetic(tmp_path / f"run{i}", i) for i in range(64)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, dsn.conninfo, *map(str, runs[w::16] + runs[(w + 1) % 16 :: 16][:1])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(16)
    ]
    time.sleep(0.5)
    outs = [p.communicate("go\n", timeout=120) for p in procs]
    for proc, (out, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0 and "Traceback" not in err and "history:" not in err, err
        assert int(out) == 5
    with History.open(dsn) as history:
        ids = [s.run_id for s in history.starts()]
        assert sorted(ids) == sorted(f"run{i}" for i in range(64))
        assert history._query("SELECT count(DISTINCT run_id) FROM phases")[0][0] == 64


def test_two_hosts_write_one_database_at_once_and_are_one_launch(
    dsn: Dsn, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two pods: their own base directories, host names and model paths (the same config.json):
    one fingerprint; ``history --by host`` shows each against the fleet, the slow one marked."""
    runs = []
    for h, host in enumerate(("pod-a", "pod-b")):
        model = model_dir(tmp_path / host / "models" / ("x" if h == 0 else "cache/snapshots/abc"))
        for i in range(3):
            base = tmp_path / host / "runs"
            base.mkdir(parents=True, exist_ok=True)
            slow = 1 if host == "pod-b" else None
            run = synthetic(base / f"{host}-{i}", 2 * i + h, args={"model_path": str(model)}, slow_rank=slow)
            runs.append(on_host(run, host))
    views = [load_run(r) for r in runs]
    done: list = []
    threads = [threading.Thread(target=lambda v=v: done.append(record(v, dsn))) for v in views]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(done) == 6 and all(d is not None for d in done)
    assert len({d.fingerprint.id for d in done}) == 1  # the model's path differs, its config does not
    fid = done[0].fingerprint.id
    with History.open(dsn) as history:
        hosts = history.by_host(fid)
        assert set(hosts) == {"", "pod-a", "pod-b"} and {s.host for s in history.starts()} == {"pod-a", "pod-b"}
    monkeypatch.setenv(where.ENV_HISTORY, dsn.conninfo)
    assert main(["history", "--by", "host", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert pg_password(dsn) not in json.dumps(doc)
    assert set(doc["launches"][0]["hosts"]) == {"fleet", "pod-a", "pod-b"}
    assert main(["history", "--by", "host"]) == 0
    out = capsys.readouterr().out
    assert "pod-a" in out and "pod-b" in out
    assert "unusual on host pod-b: 'model.weights_iterator'" in out and "unusual on host pod-a" not in out
    # a start in progress on pod-b: a notice about its weights load says the host is the outlier
    from sglang_phasetrace.tracing.verdicts import usual as usual_

    monkeypatch.setenv(where.ENV_HISTORY, dsn.conninfo)
    store.forget()
    known = usual_.known(load_run(runs[-1]))
    assert known is not None and set(known.seconds["model.weights_iterator"]) == {"pod-a", "pod-b"}
    procs = {p.label: p for p in load_run(runs[-1]).processes}
    said = usual_.on_this_host(known, procs["tp1"], "model.weights_iterator")
    assert said is not None and said.startswith("unusual on this host: 'model.weights_iterator' usually takes")
    assert "the fleet's median" in said and "on 1 other host)" in said
    assert usual_.on_this_host(known, procs["tp1"], "dist.init") is None


def pg_password(dsn: Dsn) -> str:
    return dsn.conninfo.split(":")[2].split("@")[0]


# -- the database stopped mid-start ---------------------------------------------------------------------------


def test_the_database_stopped_mid_start_costs_one_line_and_the_start_goes_on(
    pg: pg_server.Server, tmp_path: Path, caplog
) -> None:
    """The keeper records at the first stall (the database up) and at ready (stopped meanwhile): the
    second is said once, naming the host, and the exiting process waits at most ``EXIT_WAIT_S``."""
    dsn = Dsn(pg.create("stopped"))
    view = load_run(synthetic(tmp_path / "r", 0))
    kept = keeper.Keeper(view, path=dsn)
    kept.record("stalled", final=False)
    assert kept.wait(5) and kept.recorded is not None
    pg.ctl("stop")
    try:
        for _ in range(2):
            kept.record()
            tic = time.monotonic()
            kept.wait()
            assert time.monotonic() - tic <= keeper.EXIT_WAIT_S + 0.2
        kept.wait(5)
    finally:
        pg.ctl("start")
    said = warnings_of(caplog)
    assert len(said) == 1 and f"127.0.0.1:{pg.port}" in said[0] and "not recorded" in said[0], said
    assert pg.password not in said[0]


def _sessions(pg: pg_server.Server, db: str) -> int:
    """Sessions the server has seen on ``db`` (each reader's and writer's connection is one)."""
    import psycopg

    with psycopg.connect(pg.dsn(), autocommit=True) as con:
        return con.execute("SELECT sessions FROM pg_stat_database WHERE datname = %s", (db,)).fetchone()[0]


def _loading(base: Path) -> bool:
    """A rank of the start under ``base`` has begun ``model.load_weights`` (its journal says so)."""
    for journal in base.glob("*/journal/*.jsonl"):
        for line in journal.read_text(errors="replace").splitlines():
            if '"model.load_weights"' in line and '"begin"' in line:
                return True
    return False


@requires_sglang
@pytest.mark.sglang
def test_the_database_stopped_during_a_real_start_costs_one_line_and_the_start_serves(
    pg: pg_server.Server, tiny_model: tuple[Path, Path], engine_run: Ran, tmp_path: Path
) -> None:
    """A real traced tp=2 start (each rank busy 20 s in weight loading: ``PLANT_BUSY_LOAD_S``, slow,
    never stuck) whose launcher reads its launch's earlier start (the suite's shared one) from
    PostgreSQL; the server is stopped once that read is made and the ranks are loading. The start
    serves (it generates), its journals are whole, one warning line names the database's host and
    port (never the password) and says the start is not recorded; the keeper keeps nothing for a
    later start, so with the server back the history holds the earlier start only: this one is
    lost, and said so. One SGLang start, bounded at 6 min; the server is started again whatever fails."""
    name = "stoppedreal"
    dsn = Dsn(pg.create(name))
    assert engine_run.run_dir is not None
    earlier = record(load_run(engine_run.run_dir), dsn)
    assert earlier is not None
    for _ in range(40):  # the recording's one session, counted once its backend has exited
        if _sessions(pg, name) == 1:
            break
        time.sleep(0.25)
    assert _sessions(pg, name) == 1
    base = tmp_path / "runs"
    base.mkdir()
    env = {
        where.ENV_HISTORY: dsn.conninfo,
        "PYTHONPATH": os.pathsep.join((str(HOOKS), str(PLANTS))),
        "PLANT_BUSY_LOAD_S": "20",
    }
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPTS / "start_engine.py"), str(tiny_model[0]), "--tp", "2"],
            env=hook_env(base, env),
            cwd=base,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    stopped = False
    try:
        deadline = time.monotonic() + 180
        read = loading = False
        while not (read and loading):  # the launcher's watchdog has read the database; the ranks load
            assert proc.poll() is None, (tmp_path / "err").read_text()[-3000:]
            assert time.monotonic() < deadline, "the start neither read the database nor loaded in 180 s"
            read = read or _sessions(pg, name) > 1
            loading = loading or _loading(base)
            time.sleep(0.5)
        pg.ctl("stop")
        stopped = True
        assert proc.wait(timeout=180) == 0, (tmp_path / "err").read_text()[-3000:]
    finally:
        kill_group(proc.pid)
        if stopped:
            pg.ctl("start")
    assert "generated 4 tokens" in (tmp_path / "out").read_text()
    (run,) = [p for p in base.iterdir() if (p / "journal").is_dir()]
    for journal in (run / "journal").iterdir():
        assert read_journal(journal)[1] == [], journal
    prepared = store.prepare(load_run(run))
    assert prepared is not None and prepared.measured.outcome == "ready"
    assert prepared.fingerprint.id == earlier.fingerprint.id  # the launch the watchdog read
    text = (tmp_path / "err").read_text()
    # SGLang's logging puts its time before the launcher's lines: ours is found where it is
    said = [line for line in text.splitlines() if "sglang-phasetrace: history:" in line]
    assert len(said) == 1, (said, text[-3000:])
    assert f"the database at 127.0.0.1:{pg.port} cannot be used" in said[0], said
    assert "this start is not recorded" in said[0], said
    assert pg.password not in text and pg.password not in (tmp_path / "out").read_text()
    with History.open(dsn) as history:  # the server back: the stopped start is not there
        assert [s.run_id for s in history.starts()] == [earlier.run_id]


# -- export / import ----------------------------------------------------------------------------------------------


def test_export_and_import_between_sqlite_postgresql_and_json_lines(
    dsn: Dsn, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "runs"
    base.mkdir()
    for i in range(4):
        assert record(load_run(synthetic(base / f"r{i}", i))) is not None  # base's SQLite
    sqlite_db = base / "history.sqlite"
    lines = tmp_path / "history.jsonl"
    assert main(["history", "--dir", str(base), "export", str(lines)]) == 0
    assert "exported 4 starts" in capsys.readouterr().out
    assert len(lines.read_text().splitlines()) == 4 and (lines.stat().st_mode & 0o777) == 0o600
    monkeypatch.setenv(where.ENV_HISTORY, dsn.conninfo)
    assert main(["history", "import", str(sqlite_db)]) == 0
    assert main(["history", "import", str(lines)]) == 0  # again: upserted, nothing added
    out = capsys.readouterr().out
    assert "imported 4 starts" in out and pg_password(dsn) not in out
    monkeypatch.delenv(where.ENV_HISTORY)
    with History.open(dsn) as pg_history, History.open(sqlite_db) as sq:
        assert [s.to_json() for s in pg_history.starts()] == [s.to_json() for s in sq.starts()]
        fid = sq.launches()[0].id
        assert pg_history.usuals(fid) == sq.usuals(fid)
    back = tmp_path / "back" / "history.sqlite"
    back.parent.mkdir(mode=0o700)
    assert main(["history", "--dir", str(back.parent), "import", dsn.conninfo]) == 0
    with History.open(back) as got:
        assert len(got.starts()) == 4
    bad = tmp_path / "bad.jsonl"
    bad.write_text(lines.read_text().splitlines()[0] + "\n{not json\n")
    assert main(["history", "--dir", str(back.parent), "import", str(bad)]) == 1
    assert "bad.jsonl:2:" in capsys.readouterr().err


# -- real SGLang: a fresh pod's first start says "usually" from the fleet's history ---------------------------


@requires_sglang
@pytest.mark.sglang
def test_a_fresh_pods_first_start_says_usually_from_the_fleets_postgresql(
    pg: pg_server.Server, tiny_model: tuple[Path, Path], engine_run: Ran, tmp_path: Path
) -> None:
    """The fleet's history holds the suite's shared real tp=2 start (recorded from its run directory)
    and the same start as another pod's (its record copied under another run id and host). A "pod"
    whose filesystem never held a run — its own base directory and HOME, the model at another path
    (the same bytes) — starts tp=2 with rank 1 stalled in ``attention.init`` (``tests/plants``): its
    verdict says how long that phase usually takes, read from PostgreSQL, and the start is recorded
    there at that first verdict. One SGLang start."""
    dsn = Dsn(pg.create("fleetreal"))
    assert engine_run.run_dir is not None
    done = record(load_run(engine_run.run_dir), dsn)
    assert done is not None
    with History.open(dsn) as history:
        (doc,) = list(transfer.documents(history))
    doc["start"].update(run_id="pod-a-earlier", host="pod-a")
    for phase in doc["phases"]:
        phase["run_id"] = "pod-a-earlier"
    assert transfer.load([doc], dsn) == 1

    pod = tmp_path / "pod"
    (pod / "home").mkdir(parents=True)
    model = pod / "mnt" / "cache" / "tiny-llama"
    shutil.copytree(tiny_model[0], model)
    engine = [str(SCRIPTS / "start_engine.py"), str(model), "--no-generate", "--tp", "2"]
    plant = {
        where.ENV_HISTORY: dsn.conninfo,
        "HOME": str(pod / "home"),
        "PYTHONPATH": os.pathsep.join((str(HOOKS), str(PLANTS))),
        "PLANT_STALL_PHASE_TP_RANK": "1",
    }
    proc, lines = _start_until(engine, pod, plant, " STALL ", 300)
    try:
        (verdict,) = [line for line in list(lines) if line.startswith("sglang-phasetrace:") and " STALL " in line]
        print(f"\nthe fresh pod said: {verdict}")
        assert "rank tp1" in verdict and "usually takes" in verdict and "2 starts)" in verdict, verdict
        for _ in range(60):  # recorded at its first verdict, into the fleet's history
            with History.open(dsn) as history:
                if len(history.starts()) == 3:
                    break
            time.sleep(0.5)
    finally:
        kill_group(proc.pid)
    with History.open(dsn) as history:
        starts = history.starts()
        assert len(starts) == 3 and len({s.fingerprint for s in starts}) == 1, [s.to_json() for s in starts]
        assert starts[0].outcome == "stalled"
    assert not list(pod.rglob("history.sqlite*")), "the pod's filesystem holds no history"
    ours = [line for line in list(lines) if line.startswith("sglang-phasetrace:")]
    assert not any(pg.password in line for line in ours) and not any("history:" in line for line in ours), ours


def test_the_html_report_shows_the_start_against_its_history(
    backend: Path | Dsn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``phasetrace report``: per phase, this start's time over the earlier starts' spread (the slow
    step flagged), and the trend of the launch's total time, this start last; either backend."""
    monkeypatch.setenv(where.ENV_HISTORY, backend.conninfo if isinstance(backend, Dsn) else str(backend))
    base = tmp_path / "runs"
    for i in range(4):
        assert record(load_run(synthetic(base / f"ok{i}", i))) is not None
    slow = synthetic(base / "slow", 10, slow_rank=1)
    assert record(load_run(slow)) is not None
    page = tmp_path / "report.html"
    assert main(["report", str(slow), "-o", str(page)]) == 0
    html = page.read_text()
    section = html[html.index('<section id="history">') : html.index("</section>", html.index('id="history"'))]
    assert "Against its history" in section and "from 4 earlier starts" in section
    assert '<tr class="flagged"><td>model.weights_iterator</td>' in section
    assert "<tr><td>dist.init</td>" in section  # as usual: not flagged
    assert section.count("<circle") >= 5 + 5 and "Total time of the last 5 starts" in section
    if isinstance(backend, Dsn):
        assert pg_password(backend) not in html
    monkeypatch.setenv(where.ENV_HISTORY, "0")
    assert main(["report", str(slow), "-o", str(page)]) == 0
    assert 'id="history"' not in page.read_text()
