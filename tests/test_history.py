"""The history of starts (``tracing.history``) and ``phasetrace history`` / ``compare --baseline``.

Real SGLang on CPU: two healthy tp=2 starts are one launch and ``history`` lists both with medians;
a tp=1 start of the same model is another launch, never compared with them. Synthetic runs
(``cli_fixtures.build_run``, with the server arguments a real launch root carries) for what needs
many starts or damage: several writers at once, a locked, corrupt, read-only or full database, a
link, retention, outcomes, the fingerprint's fields, and a slow start flagged against its history.
"""

from __future__ import annotations

import array
import json
import math
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from cli_fixtures import build_run
from conftest import HOOKS, PLANTS, SCRIPTS, Ran, hook_env, kill_group, requires_sglang, run_dirs, run_program
from sglang_phasetrace.tracing import keys, process_state
from sglang_phasetrace.tracing.cli import main, preflight, preflight_plan
from sglang_phasetrace.tracing.history import History, eta, fingerprint, live, of_run, record, store, usual
from sglang_phasetrace.tracing.history.measure import measure
from sglang_phasetrace.tracing.journal import records
from sglang_phasetrace.tracing.launcher import lifecycle
from sglang_phasetrace.tracing.reader.load import load_run
from sglang_phasetrace.tracing.recorder import gpu, runtime
from sglang_phasetrace.tracing.render.lanes import layout
from sglang_phasetrace.tracing.render.run_text import status_line
from sglang_phasetrace.tracing.verdicts import findings, startup
from sglang_phasetrace.tracing.verdicts import usual as usual_
from sglang_phasetrace.tracing.verdicts.diagnose import Thresholds
from sglang_phasetrace.tracing.verdicts.watchdog import Watchdog

S = 1_000_000_000
T0 = 1_800_000_000 * S  # synthetic runs end at T0 + i seconds: their order is their index
ARGS = {  # what a real launch root carries (``patches/_attrs.server_args_json``), trimmed
    "model_path": "/models/tiny-llama",
    "tp_size": 2,
    "pp_size": 1,
    "dp_size": 1,
    "ep_size": 1,
    "nnodes": 1,
    "device": "cuda",
    "attention_backend": "flashinfer",
    "cuda_graph_max_bs": 160,
    "disable_cuda_graph": False,
    "load_format": "auto",
    "dtype": "auto",
    "mem_fraction_static": 0.85,
    "speculative_algorithm": None,
    "port": 30000,
    "log_level": "info",
    "api_key": None,
}


@pytest.fixture(autouse=True)
def fresh_state():
    """Say-once memory and the live cache start empty (a warning per process per problem)."""
    process_state.reset()
    store.forget()
    yield
    process_state.reset()
    store.forget()


def synthetic(path: Path, i: int = 0, *, args: dict | None = None, ranks: int = 2, **kw) -> Path:
    """A synthetic run ending at ``T0 + i`` s whose launch root carries ``args`` as server arguments."""
    build_run(path, ranks=ranks, spans=40, end_ns=T0 + i * S, **kw)
    journal = path / "journal" / "node0-1000.jsonl"
    lines = journal.read_text().splitlines()
    for n, line in enumerate(lines):
        r = json.loads(line)
        if r["kind"] == "begin" and r["name"] == "sglang.launch":
            r["attrs"]["sglang.server_args"] = json.dumps({**ARGS, "tp_size": ranks, **(args or {})}, sort_keys=True)
            lines[n] = json.dumps(r)
    journal.write_text("\n".join(lines) + "\n")
    return path


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "history:" in r.getMessage()]


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv])
    out = capsys.readouterr()
    return code, out.out, out.err


# -- real SGLang: starts recorded by their launchers, judged live against each other ---------------


def _history_db(engine_run: Ran) -> Path:
    assert engine_run.run_dir is not None
    return engine_run.run_dir.parent / "history.sqlite"


def _starts(db: Path) -> list[tuple[str, str]]:
    if not db.exists():
        return []
    with History.open(db) as history:
        return [(s.run_id, s.outcome) for s in reversed(history.starts())]


def _start_until(args: list[str], base: Path, env: dict[str, str], word: str, timeout: float) -> tuple[Any, list[str]]:
    """Start ``python args`` under the hook in its own process group; read its stderr (a thread)
    until a line of ours holds ``word`` (bounded). Returns the process (the caller kills its group)
    and every stderr line read, which the thread goes on adding to until the process ends."""
    proc = subprocess.Popen(
        [sys.executable, *args],
        env=hook_env(base, env),
        cwd=base,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(line.rstrip("\n") for line in proc.stderr), daemon=True).start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if any(line.startswith("sglang-phasetrace:") and word in line for line in list(lines)):
            return proc, lines
        time.sleep(0.5)
    kill_group(proc.pid)
    raise AssertionError(f"no line with {word!r} in {timeout:.0f} s:\n" + "\n".join(lines[-40:]))


@pytest.fixture(scope="module")
def auto_starts(tiny_model: tuple[Path, Path], engine_run: Ran, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Starts nobody records but their launchers (the hook path), into one history: the suite's
    shared healthy tp=2 ``sglang.Engine`` (its base directory's), one more, then a third with rank 1
    stalled in ``attention.init`` (``tests/plants``), stopped by a Ctrl-C to its launcher once its
    verdict is said; and a tp=1 start while the history it would use is a corrupt file."""
    db = _history_db(engine_run)
    engine = [str(SCRIPTS / "start_engine.py"), str(tiny_model[0]), "--no-generate", "--tp"]
    into = {store.ENV_HISTORY: str(db)}
    out: dict[str, Any] = {"db": db, "a": engine_run.run_dir}
    base = tmp_path_factory.mktemp("history-b")
    ran = run_program([*engine, "2"], base, env=into)
    assert ran.returncode == 0 and ran.run_dir is not None, ran.stderr[-3000:]
    out["b"] = ran.run_dir
    assert [o for _, o in _starts(db)] == ["ready", "ready"], "both healthy starts recorded by their launchers"

    base = tmp_path_factory.mktemp("history-stall")
    plant = {**into, "PYTHONPATH": os.pathsep.join((str(HOOKS), str(PLANTS))), "PLANT_STALL_PHASE_TP_RANK": "1"}
    proc, lines = _start_until([*engine, "2"], base, plant, " STALL ", 300)
    try:
        out["stall_lines"] = [line for line in list(lines) if line.startswith("sglang-phasetrace:")]
        for _ in range(60):  # recorded at its first stall, from the watchdog's thread
            if len(_starts(db)) == 3:
                break
            time.sleep(0.5)
        out["provisional"] = _starts(db)
        tic = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)  # Ctrl-C: the launcher exits, recording its start again on its way
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        out["exit_s"] = time.monotonic() - tic
    finally:
        kill_group(proc.pid)
    (out["stall"],) = run_dirs(base)

    base = tmp_path_factory.mktemp("history-corrupt")
    bad = base / "bad.sqlite"
    bad.write_bytes(b"not a database, " * 512)
    bad.chmod(0o600)
    ran = run_program([*engine, "1"], base, env={store.ENV_HISTORY: str(bad)})
    out["one"], out["one_stderr"], out["bad"] = ran.run_dir, ran.stderr, bad
    assert ran.returncode == 0 and ran.run_dir is not None, ran.stderr[-3000:]
    return out


@requires_sglang
@pytest.mark.sglang
def test_starts_are_recorded_by_their_launchers_and_judged_against_each_other(
    auto_starts: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, a, b, stalled = auto_starts["db"], auto_starts["a"], auto_starts["b"], auto_starts["stall"]
    # the stall's verdict line says how long the phase usually takes, from the two healthy starts
    (verdict,) = [line for line in auto_starts["stall_lines"] if " STALL " in line]
    assert "rank tp1" in verdict and "usually takes" in verdict and "2 starts)" in verdict, verdict
    # recorded as stalled at its first verdict, and again as the launcher exited (within its second)
    assert auto_starts["provisional"][-1] == (stalled.name, "stalled"), auto_starts["provisional"]
    assert _starts(db) == [(a.name, "ready"), (b.name, "ready"), (stalled.name, "stalled")]
    # files are private: the directory 0700, the database and its WAL files 0600
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in db.parent.glob("history.sqlite*"))

    code, out, err = cli(capsys, "history", "--dir", str(db.parent), "--json")
    assert code == 0, err
    (launch,) = json.loads(out)["launches"]
    assert launch["starts"] == 3 and [s["outcome"] for s in launch["recent"]] == ["stalled", "ready", "ready"]
    fields = launch["fields"]
    assert fields["layout"]["tp"] == 2 and fields["device"] == {"kind": "cpu", "model": None, "count": 2}
    assert fields["model"]["config"] and fields["versions"]["sglang"] and fields["versions"]["torch"]
    phases = {p["phase"]: p for p in launch["phases"]}
    for key in ("rank", "rank.bootstrap", "model.load_weights", "attention.init"):
        assert phases[key]["n"] >= 2 and phases[key]["min_s"] <= phases[key]["median_s"] <= phases[key]["max_s"]
    code, out, _ = cli(capsys, "history", "--dir", str(db.parent))
    assert code == 0 and all(run.name in out for run in (a, b, stalled)) and "stalled" in out

    # status of the stalled run: its phases' usual times and its launch, itself left out
    monkeypatch.setenv(store.ENV_HISTORY, str(db))
    code, out, err = cli(capsys, "status", str(stalled), "--json")
    doc = json.loads(out)
    assert doc["history"]["fingerprint"] == launch["id"] and doc["history"]["starts"] == 2, doc["history"]
    assert any(r["usual"] for r in doc["ranks"] if r["label"] in ("tp0", "tp1")), doc["ranks"]

    # a corrupt history at start: one warning, naming it; the start goes on; the file is left as it was
    said = [line for line in auto_starts["one_stderr"].splitlines() if "history:" in line]
    assert len(said) == 1 and str(auto_starts["bad"]) in said[0] and "not a usable history" in said[0], said
    assert auto_starts["bad"].read_bytes() == b"not a database, " * 512
    # another tp size is another launch: recorded beside the tp=2 one, never compared with it
    monkeypatch.delenv(store.ENV_HISTORY)
    one = auto_starts["one"]
    code, out, err = cli(capsys, "history", "--record", str(one), "--dir", str(db.parent))
    assert code == 0 and "ready" in out, err
    code, out, _ = cli(capsys, "history", "--dir", str(db.parent), "--json")
    by_tp = {la["fields"]["layout"]["tp"]: la for la in json.loads(out)["launches"]}
    assert by_tp[1]["starts"] == 1 and by_tp[2]["starts"] == 3 and by_tp[1]["id"] != by_tp[2]["id"]
    monkeypatch.setenv(store.ENV_HISTORY, str(db))
    code, out, _ = cli(capsys, "compare", str(one), "--baseline")
    assert code == 0 and "no earlier start" in out
    code, out, _ = cli(capsys, "compare", str(b), "--baseline", "--json")
    doc = json.loads(out)
    assert doc["fingerprint"]["id"] == by_tp[2]["id"] and doc["starts"] == 2  # a and the stalled one


# -- several writers, and a database that cannot be written -----------------------------------------

WRITER = textwrap.dedent(
    """
    import sys
    from sglang_phasetrace.tracing.history import record
    from sglang_phasetrace.tracing.reader.load import load_run
    print(sum(record(load_run(run), sys.argv[1]) is not None for run in sys.argv[2:]))
    """
)


def test_several_writers_at_once_each_start_recorded_or_one_warning(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    runs = [synthetic(tmp_path / f"run{i}", i) for i in range(18)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(db), *map(str, runs[w::6])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(6)
    ]
    recorded = 0
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "Traceback" not in err, err
        said = [line for line in err.splitlines() if "history:" in line]
        assert len(said) <= 1 and (int(out) == 3 or len(said) == 1), (out, err)  # each problem said once
        recorded += int(out)
    with History.open(db) as history:
        assert len(history.starts()) == recorded >= 15  # a loaded 2-core box: a few may wait past BUSY_S


def test_a_locked_database_costs_one_warning_and_under_a_second(tmp_path: Path, caplog) -> None:
    db = tmp_path / "history.sqlite"
    assert record(load_run(synthetic(tmp_path / "a", 0)), db) is not None
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another launch in the middle of recording
    try:
        for i in (1, 2):
            run = load_run(synthetic(tmp_path / f"r{i}", i))
            tic = time.monotonic()
            assert record(run, db) is None
            assert time.monotonic() - tic < 1.0
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    said = warnings_of(caplog)
    assert len(said) == 1 and "locked" in said[0] and str(db) in said[0], said
    assert record(load_run(tmp_path / "r1"), db) is not None  # free again: recorded


def test_a_corrupt_database_is_one_warning_and_left_as_it_is(
    tmp_path: Path, caplog, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "history.sqlite"
    garbage = os.urandom(8192)
    db.write_bytes(garbage)
    db.chmod(0o600)
    for i in (0, 1):
        assert record(load_run(synthetic(tmp_path / f"r{i}", i)), db) is None
    said = warnings_of(caplog)
    assert len(said) == 1 and "not a usable history database" in said[0] and str(db) in said[0], said
    assert db.read_bytes() == garbage
    code, _, err = cli(capsys, "history", "--dir", str(tmp_path))
    assert code == 1 and str(db) in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert live.usual("0123456789ab", "rank", db) is None  # the watchdog's question: no answer, no exception


def test_a_read_only_database_is_one_warning_and_still_read(
    tmp_path: Path, caplog, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    base = tmp_path / "base"
    db = base / "history.sqlite"
    assert record(load_run(synthetic(tmp_path / "a", 0)), db) is not None
    if os.geteuid() == 0:  # root writes through modes: open it read-only, as a read-only mount would
        connect = sqlite3.connect

        def read_only(path, *a, **kw):
            return connect(f"file:{path}?mode=ro", *a, uri=True, **kw)

        monkeypatch.setattr(store.sqlite3, "connect", read_only)
    else:
        db.chmod(0o400)
        base.chmod(0o500)
    try:
        for i in (1, 2):
            assert record(load_run(synthetic(tmp_path / f"r{i}", i)), db) is None
        monkeypatch.undo()
        code, out, err = cli(capsys, "history", "--dir", str(base), "--json")
    finally:
        base.chmod(0o700)
        db.chmod(0o600)
    said = warnings_of(caplog)
    assert len(said) == 1 and str(db) in said[0] and "not recorded" in said[0], said
    assert code == 0 and [la["starts"] for la in json.loads(out)["launches"]] == [1], err


def test_a_full_database_is_one_warning(tmp_path: Path, caplog, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "history.sqlite"
    assert record(load_run(synthetic(tmp_path / "a", 0)), db) is not None
    connect = sqlite3.connect

    def full(*a, **kw):  # no page beyond those it has: as a full disk answers
        con = connect(*a, **kw)
        con.execute(f"PRAGMA max_page_count = {con.execute('PRAGMA page_count').fetchone()[0]}")
        return con

    monkeypatch.setattr(store.sqlite3, "connect", full)
    for i in (1, 2):
        assert record(load_run(synthetic(tmp_path / f"r{i}", i, ranks=64)), db) is None
    said = warnings_of(caplog)
    assert len(said) == 1 and "full" in said[0], said


def test_a_link_where_the_database_goes_is_refused(tmp_path: Path, caplog) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    db = tmp_path / "history.sqlite"
    db.symlink_to(target)
    assert record(load_run(synthetic(tmp_path / "r", 0)), db) is None
    said = warnings_of(caplog)
    assert len(said) == 1 and "symbolic link" in said[0], said
    assert target.read_bytes() == b""


def test_history_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(store.ENV_HISTORY, "0")
    monkeypatch.chdir(tmp_path)
    assert record(load_run(synthetic(tmp_path / "r", 0))) is None
    assert not list(tmp_path.rglob("*.sqlite"))
    code, _, err = cli(capsys, "history")
    assert code == 1 and "off" in err


# -- what is kept ---------------------------------------------------------------------------------------


def test_retention_keeps_the_newest_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "KEEP_PER_FINGERPRINT", 3)
    monkeypatch.setattr(store, "KEEP_ALL", 5)
    monkeypatch.setattr(store, "OVERALL_EVERY", 1)  # the overall limit checked at every recording
    monkeypatch.setattr(store, "KEEP_DETAIL", 2)
    db = tmp_path / "history.sqlite"
    for i in range(5):  # launch A: 5 starts, the newest 3 kept
        assert record(load_run(synthetic(tmp_path / f"a{i}", i)), db) is not None
    for i in range(3):  # launch B (tp=3): 3 starts, newer than A's; 5 in all: A keeps its newest 2
        assert record(load_run(synthetic(tmp_path / f"b{i}", 10 + i, ranks=3)), db) is not None
    with History.open(db) as history:
        kept = [s.run_id for s in history.starts()]
        assert kept == ["b2", "b1", "b0", "a4", "a3"]
        assert {la.starts for la in history.launches()} == {3, 2}
        detail = history.con.execute("SELECT run_id FROM starts WHERE labels IS NOT NULL ORDER BY started").fetchall()
        assert [r[0] for r in detail] == ["b1", "b2"]
        bare = history.con.execute(
            "SELECT count(*) FROM phases WHERE per_rank IS NOT NULL AND run_id NOT IN ('b1', 'b2')"
        )
        assert bare.fetchone()[0] == 0
        assert history.con.execute("SELECT count(DISTINCT run_id) FROM phases").fetchone()[0] == 5
    for i in range(5):  # launch C (tp=4), the newest: its newest 3 kept, then B's newest 2; A's go, and its fingerprint
        assert record(load_run(synthetic(tmp_path / f"c{i}", 20 + i, ranks=4)), db) is not None
    with History.open(db) as history:
        assert [s.run_id for s in history.starts()] == ["c4", "c3", "c2", "b2", "b1"]
        assert history.con.execute("SELECT count(*) FROM fingerprints").fetchone()[0] == 2
        assert history.con.execute("SELECT count(DISTINCT run_id) FROM phases").fetchone()[0] == 5


def test_each_phase_is_kept_per_process(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    run = load_run(synthetic(tmp_path / "r", 0, ranks=8, slow_rank=5))
    assert record(run, db) is not None
    m = measure(run)
    with History.open(db) as history:
        (labels,) = history.con.execute("SELECT labels FROM starts").fetchone()
        labels = json.loads(zlib.decompress(labels))
        assert labels == m.labels and "tp5" in labels
        got = dict(history.con.execute("SELECT phase, per_rank FROM phases").fetchall())
        slowest = dict(history.con.execute("SELECT phase, slowest FROM phases").fetchall())
    for row in m.phases:
        per = array.array("f", zlib.decompress(got[row.key]))
        back = {label: v for label, v in zip(labels, per, strict=True) if not math.isnan(v)}
        assert back.keys() == row.per_rank.keys()
        assert all(abs(back[k] - v) <= 1e-6 * max(1.0, v) for k, v in row.per_rank.items())
    assert slowest["model.weights_iterator"] == "tp5"


def test_outcomes(tmp_path: Path) -> None:
    assert measure(load_run(synthetic(tmp_path / "ok", 0))).outcome == "ready"
    assert measure(load_run(synthetic(tmp_path / "failed", 1, failed_rank=1))).outcome == "failed"
    stalled = synthetic(tmp_path / "stalled", 2, stalled_rank=1)
    assert measure(load_run(stalled)).outcome == "stalled"
    journal = stalled / "journal" / "node0-1000.jsonl"  # the same start without the watchdog's verdict
    journal.write_text("".join(line + "\n" for line in journal.read_text().splitlines() if '"diagnosis"' not in line))
    assert measure(load_run(stalled)).outcome == "interrupted"
    db = tmp_path / "history.sqlite"
    assert record(load_run(stalled), db, outcome="failed").outcome == "failed"  # the caller knows better


# -- the fingerprint -----------------------------------------------------------------------------------


def test_the_fingerprint_holds_what_changes_start_time_and_nothing_secret(tmp_path: Path) -> None:
    def fp(name: str, **changed) -> fingerprint.Fingerprint:
        got = of_run(load_run(synthetic(tmp_path / name, 0, args=changed)))
        assert got is not None
        return got

    base = fp("base")
    assert base.fields["layout"] == {"tp": 2, "pp": 1, "dp": 1, "ep": 1, "nnodes": 1}
    assert base.fields["args"]["attention_backend"] == "flashinfer" and base.fields["device"]["count"] == 2
    assert "port" not in base.fields["args"] and "log_level" not in base.fields["args"]
    # what does not change how long a start takes does not change the launch
    assert fp("port", port=31000, log_level="debug", api_key="sk-live-abcdefghijklmnop1234").id == base.id
    # what does, does
    for name, change in (
        ("graphs", {"cuda_graph_max_bs": 256}),
        ("attn", {"attention_backend": "triton"}),
        ("spec", {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3}),
        ("quant", {"quantization": "fp8"}),
        ("load", {"load_format": "dummy"}),
        ("dp", {"dp_size": 2}),
        ("model", {"model_path": "/models/other"}),
    ):
        assert fp(name, **change).id != base.id, name
    secret = fp("secret", model_path="/models/hf_abcdefghijklmnopqrstuvwxyz12345/llama")
    text = fingerprint.canonical(secret.fields)
    assert "hf_abcdefghijklmnopqrstuvwxyz12345" not in text and "REDACTED" in text
    # a model directory's config is part of the launch: another config, another launch
    model = tmp_path / "checkpoint"
    model.mkdir()
    (model / "config.json").write_text('{"num_hidden_layers": 2}')
    two = fp("cfg2", model_path=str(model))
    (model / "config.json").write_text('{"num_hidden_layers": 4}')
    fingerprint._config_hash.cache_clear()
    assert fp("cfg4", model_path=str(model)).id != two.id and two.fields["model"]["config"]


def test_server_arguments_cut_at_32_kib_give_the_same_fingerprint(tmp_path: Path) -> None:
    whole = json.dumps({**ARGS, "zz_padding": "x" * 40000}, sort_keys=True)  # cut inside the padding
    cut = fingerprint.server_args(whole[:32768] + "…")
    assert cut == {k: v for k, v in ARGS.items() if k in cut} and "zz_padding" not in cut
    assert {"tp_size", "cuda_graph_max_bs", "attention_backend", "model_path", "device"} <= cut.keys()


# -- compare --baseline, the trend ---------------------------------------------------------------------


def test_a_slow_start_is_flagged_against_its_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    base = tmp_path / "runs"
    monkeypatch.delenv(store.ENV_HISTORY, raising=False)
    for i in range(4):
        code, _, err = cli(capsys, "history", "--record", str(synthetic(base / f"ok{i}", i)))
        assert code == 0, err
    slow = synthetic(base / "slow", 10, slow_rank=1)
    code, out, err = cli(capsys, "compare", str(slow), "--baseline", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["starts"] == 4 and doc["culprit"] == "model.weights_iterator"
    rows = {r["phase"]: r for r in doc["phases"]}
    assert rows["model.weights_iterator"]["past_p95"] and rows["model.weights_iterator"]["usual"]["n"] == 4
    assert not rows["kv_cache.alloc"]["past_p95"]
    code, out, _ = cli(capsys, "compare", str(slow), "--baseline")
    assert code == 0 and "'model.weights_iterator' took" in out and "past the p95" in out
    # recorded, it is the newest start: the trend names the step that grew, not the root around it
    assert cli(capsys, "history", "--record", str(slow))[0] == 0
    code, out, _ = cli(capsys, "history", "--dir", str(base), "--json")
    (launch,) = json.loads(out)["launches"]
    assert launch["starts"] == 5 and launch["trend"]["newest"] == "slow"
    assert launch["trend"]["grew"] == "model.weights_iterator"
    code, out, _ = cli(capsys, "history", "--dir", str(base))
    assert "'model.weights_iterator' grew" in out


def test_history_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "history", "--dir", str(tmp_path))  # nothing recorded yet: said, not an error
    assert code == 0 and "no start recorded yet" in out
    db = tmp_path / "history.sqlite"
    record(load_run(synthetic(tmp_path / "r", 0)), db)
    code, _, err = cli(capsys, "history", "--dir", str(tmp_path), "--fingerprint", "ffffffffffff")
    assert code == 1 and "no fingerprint" in err
    code, _, err = cli(capsys, "history", "--dir", str(tmp_path), "--fingerprint", "not-hex")
    assert code == 1 and "not a fingerprint id" in err
    code, _, err = cli(capsys, "compare", str(tmp_path / "r"), str(tmp_path / "r"), "--baseline")
    assert code == 2 and "one run directory" in err


def test_usual_and_eta_from_history(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    fid = None
    for i in range(3):
        done = record(load_run(synthetic(tmp_path / f"r{i}", i)), db)
        assert done is not None
        fid = done.fingerprint.id
    assert fid is not None
    known = live.usuals(fid, db)
    steps = [u for u in known.values() if u.depth == 1 and u.role == "rank"]
    assert [u.phase for u in steps][:3] == ["rank.bootstrap", "dist.init", "scheduler.init_tp_worker"]
    pools = usual(fid, "scheduler.init_memory_pools", db)
    assert pools is not None and pools.n == 3 and pools.median == pools.p95 == pools.max
    after = [u for u in steps if u.start_s > pools.start_s]
    got = eta(fid, {"scheduler.init_memory_pools": 0.2}, path=db)
    assert got is not None and got.starts == 3
    assert got.remaining_s == pytest.approx(pools.median - 0.2 + sum(u.median for u in after))
    late = eta(fid, {"scheduler.init_memory_pools": 3600.0}, path=db)  # past its usual time: 0 for it, never below
    assert late is not None and late.remaining_s == pytest.approx(sum(u.median for u in after))
    assert eta(fid, {"no.such.phase": 1.0}, path=db) is None  # cannot be placed
    assert eta("0123456789ab", {"rank.bootstrap": 1.0}, path=db) is None  # no history of that launch


# -- live: "usually N s", a phase past every earlier start, the ETA -------------------------------------


def _in_progress(tmp_path: Path, ranks: int = 1) -> tuple[Path, int]:
    """Three healthy synthetic starts recorded in ``tmp_path/runs``, and a fourth of the same launch in
    progress whose rank 0 has sat in ``dist.init_process_group`` for ≈ 87 s (its heartbeat fresh: it
    is not silent). Returns the run and "now"."""
    base = tmp_path / "runs"
    for i in range(3):
        assert record(load_run(synthetic(base / f"ok{i}", i, ranks=ranks))) is not None
    run = synthetic(base / "stuck", 100, ranks=ranks, stalled_rank=0)
    journal = run / "journal" / "node0-1000.jsonl"  # the watchdog has said nothing yet
    journal.write_text("".join(line + "\n" for line in journal.read_text().splitlines() if '"diagnosis"' not in line))
    now = T0 + 100 * S
    status = run / "status" / "node0-2000.json"
    beat = json.loads(status.read_text())
    status.write_text(json.dumps({**beat, "t": now - S // 2}))
    return run, now


def test_a_phase_past_every_earlier_start_is_a_notice_never_an_alarm(tmp_path: Path) -> None:
    run, now = _in_progress(tmp_path)
    patient = Thresholds(stall_s=1000.0, no_progress_s=1000.0)  # nothing else would speak yet
    found = [f for f, _ in findings.live(load_run(run), now, patient, notices=True)]
    (notice,) = found
    assert notice.kind == "unusual" and not notice.alarm and notice.label == "tp0", found
    assert notice.message.startswith("'dist.init_process_group' 87 s on tp0 — no earlier start of this launch spent")
    assert "usually 0.3 s, p95 0.3 s, 3 starts" in notice.message, notice.message
    assert findings.live(load_run(run), now, patient) == []  # a notice: the watchdog's, not a viewer's verdict
    # the evidence says blocked (every rank in the rendezvous for 30 s): the alarm stands, and says what is usual
    (alarm,) = [f for f, _ in findings.live(load_run(run), now, Thresholds(), notices=True)]
    assert alarm.alarm and alarm.kind == "rendezvous", alarm
    assert alarm.message.endswith("; 'dist.init_process_group' usually takes 0.3 s (p95 0.3 s, 3 starts)")
    # progress (an event in the phase a second ago): no notice — history never contradicts the journals
    lines = (run / "journal" / "node0-2000.jsonl").read_text().splitlines()
    stuck = next(json.loads(x)["span"] for x in lines if '"dist.init_process_group"' in x and '"begin"' in x)
    with open(run / "journal" / "node0-2000.jsonl", "a") as f:
        f.write(json.dumps(records.event(now - S, stuck, "step", {"done": 3, "total": 9})) + "\n")
    assert findings.live(load_run(run), now, patient, notices=True) == []


def test_a_start_without_history_is_judged_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run, now = _in_progress(tmp_path, ranks=2)

    def judged() -> list[tuple[str, str, str]]:
        return [(f.kind, f.label, f.message) for f, _ in findings.live(load_run(run), now, Thresholds(), notices=True)]

    with_history = judged()  # tp0 is the straggler; tp1, its peer waiting for it, is explained by it
    monkeypatch.setenv(store.ENV_HISTORY, "0")
    without = judged()
    assert [k for k, _, _ in without] == [k for k, _, _ in with_history] == ["straggler"]
    assert all("usual" not in m and "earlier start" not in m for _, _, m in without)
    ((_, _, said),), ((_, _, plain),) = with_history, without
    assert said.startswith(plain) and "usually takes" in said[len(plain) :]
    monkeypatch.setenv(store.ENV_HISTORY, str(tmp_path / "elsewhere.sqlite"))  # a history without this launch
    assert judged() == without


def test_status_and_the_live_line_say_usual_times_and_the_eta(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, now = _in_progress(tmp_path)
    view = load_run(run)
    known = usual_.known(view)
    assert known is not None and known.starts == 3
    line = status_line(layout(view, now), {}, known)
    assert "tp0 dist.init_process_group 87.0 s (usually 0.3 s, p95 0.3 s, 3 starts)" in line, line
    assert "ready ≈ " in line and "after 'dist.init' ends" in line, line  # past every earlier start: a lower bound
    _, out, _ = cli(capsys, "status", str(run), "--json", "--once")
    doc = json.loads(out)
    assert doc["history"]["starts"] == 3 and doc["history"]["eta_s"] > 0, doc["history"]
    (row,) = [r for r in doc["ranks"] if r["label"] == "tp0"]
    assert row["usual"] == "0.3 s (p95 0.3 s)", row
    # a start in its first step: "ready in ≈ …", the sum of the steps' medians still ahead
    first = synthetic(tmp_path / "runs" / "early", 200, ranks=1, stalled_rank=0)
    steps = [u for u in known.usuals.values() if u.depth == 1 and u.role == "rank"]
    forecast = usual_.eta(load_run(first), T0 + 200 * S - 86 * S, known)
    assert forecast is not None and forecast.late is None and forecast.starts == 3
    assert forecast.remaining_s == pytest.approx(sum(u.median for u in steps[1:]), rel=0.1)
    assert usual_.eta_text(forecast).startswith("ready in ≈ ")
    # when, and within what: each step's p95 (3 equal starts: the same), as a wall-clock time of this host
    assert (
        forecast.p95_s == pytest.approx(sum(u.p95 for u in steps[1:]), rel=0.1)
        and forecast.p95_s >= forecast.remaining_s
    )
    at = T0 + 200 * S - 86 * S
    said = usual_.eta_text(forecast, at)
    assert said.startswith("ready in ≈ ") and ", at ≈ " in said and "(p95 " in said and "; by 3 earlier starts)" in said
    outlook = usual_.outlook(load_run(first), at, known)
    assert outlook is not None and outlook["ready_at"] == pytest.approx(at / S + forecast.remaining_s, abs=0.01)
    assert outlook["p95_s"] == pytest.approx(forecast.p95_s, abs=0.01) and outlook["said"] == said
    # … which is what an orchestrator reads: the start's state carries it, and its line says it
    state = startup.assess(load_run(first), [], at, outlook)
    assert state.state == "starting" and state.predicted["eta_s"] == outlook["eta_s"] and state.line.endswith(said)


def test_the_watchdog_records_a_stalled_start_at_its_first_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(store.ENV_HISTORY, raising=False)
    db = tmp_path / "history.sqlite"  # the run's base directory's
    run = synthetic(tmp_path / "stalled", 0, stalled_rank=1)
    dog = Watchdog(run, out=open(os.devnull, "w"), py_spy=False)
    dog.keeps = True  # a launcher's
    new = dog.step(now_ns=T0)
    assert any(f.alarm for f in new) and dog.keeper is not None and not dog.keeper.final
    assert dog.keeper.wait(10.0)
    assert _starts(db) == [("stalled", "stalled")] and dog.keeper.recorded.outcome == "stalled"
    keep_at_exit_of(dog)  # as the launcher exits: recorded again, the same row
    assert dog.keeper.final and _starts(db) == [("stalled", "stalled")]


def keep_at_exit_of(dog: Watchdog) -> None:
    tic = time.monotonic()
    process_state.STATE.launcher_watchdog = dog
    try:
        lifecycle.keep_at_exit()
    finally:
        process_state.STATE.launcher_watchdog = None
    assert time.monotonic() - tic < lifecycle.EXIT_WAIT_S + 0.5


def test_outcomes_the_caller_knows(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    ok = load_run(synthetic(tmp_path / "ok", 0))
    assert record(ok, db, outcome="interrupted").outcome == "ready"  # a start that was ready was ready
    stalled = load_run(synthetic(tmp_path / "stalled", 1, stalled_rank=1))
    assert record(stalled, db, outcome="interrupted").outcome == "stalled"  # stopped after its stall
    failed = synthetic(tmp_path / "failed", 2, failed_rank=1)
    assert record(load_run(failed), db, outcome="interrupted").outcome == "interrupted"  # Ctrl-C'd ranks die
    journal = failed / "journal" / "node0-2001.jsonl"  # a Ctrl-C: KeyboardInterrupt ends the root
    journal.write_text(journal.read_text().replace('"RuntimeError"', '"KeyboardInterrupt"'))
    assert measure(load_run(failed)).outcome == "interrupted"


def test_what_serving_does_is_not_part_of_the_start(tmp_path: Path) -> None:
    run = synthetic(tmp_path / "r", 0)
    before = {p.key: p.max for p in measure(load_run(run)).phases}
    journal = run / "journal" / "node0-2000.jsonl"
    late = T0 + 5 * S
    attrs = {keys.PHASE: "model.load_weights", keys.AFTER_READY: True}
    with open(journal, "a") as f:  # a weight update an hour after ready
        f.write(
            json.dumps(records.begin(late, "ff" * 8, None, "ab" * 16, "model.load_weights", attrs, "MainThread")) + "\n"
        )
        f.write(json.dumps(records.end(late + 600 * S, "ff" * 8, "ok", {})) + "\n")
    assert {p.key: p.max for p in measure(load_run(run)).phases} == before


# -- the fingerprint, as a launch records it --------------------------------------------------------------


def test_the_fingerprint_is_settled_by_what_the_launcher_records_as_it_starts_its_ranks(tmp_path: Path) -> None:
    run = synthetic(tmp_path / "r", 0)
    before = of_run(load_run(run))
    assert before is not None and before.settled  # an Engine's root that ended: settled
    journal = run / "journal" / "node0-1000.jsonl"
    recorded = {**ARGS, "attention_backend": "triton"}  # what the launcher saw as it started its ranks
    span = {keys.PHASE: "launch.subprocesses", keys.SERVER_ARGS: json.dumps(recorded), keys.MODEL_CONFIG: "c0ffee"}
    with open(journal, "a") as f:
        f.write(
            json.dumps(records.begin(T0 - 29 * S, "ee" * 8, None, "ab" * 16, "launch.subprocesses", span, "M")) + "\n"
        )
    after = of_run(load_run(run))
    assert after is not None and after.settled and after.id != before.id
    assert after.fields["args"]["attention_backend"] == "triton" and after.fields["model"]["config"] == "c0ffee"
    # a server's root, open, before its ranks start: not settled (a reader asks again)
    lines = [json.loads(x) for x in journal.read_text().splitlines()]
    kept = [r for r in lines if r.get("span") != "ee" * 8 and not (r["kind"] == "end")]
    journal.write_text("".join(json.dumps(r) + "\n" for r in kept))
    early = of_run(load_run(run))
    assert early is not None and not early.settled


def test_the_runtime_stamps_torch_and_the_gpu_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = tmp_path / "gpus"
    for bus in ("0000:1b:00.0", "0000:05:00.0"):
        (gpus / bus).mkdir(parents=True)
        (gpus / bus / "information").write_text("Model: \t\t NVIDIA H200\nIRQ:   42\nBus Type:  PCIe\n")
    monkeypatch.setattr(gpu, "DRIVER_GPUS", str(gpus))
    monkeypatch.setattr(gpu, "_state", {})
    monkeypatch.setitem(sys.modules, "torch", type(sys)("torch"))
    sys.modules["torch"].__version__ = "2.9.0+cu128"
    attrs = runtime.machine_attrs(1)
    assert attrs == {keys.TORCH_VERSION: "2.9.0+cu128", keys.DEVICE_MODEL: "NVIDIA H200"}
    monkeypatch.setattr(gpu, "DRIVER_GPUS", str(tmp_path / "none"))
    monkeypatch.setattr(gpu, "_state", {})
    assert keys.DEVICE_MODEL not in runtime.machine_attrs(0)


# -- pre-flight: the estimate from the real launch's history ---------------------------------------------


def test_preflight_estimates_from_the_real_launchs_earlier_starts(tmp_path: Path) -> None:
    base = tmp_path / "runs"
    for i in range(3):  # the real launch, weights read
        assert record(load_run(synthetic(base / f"real{i}", i))) is not None
    # an earlier pre-flight of it (dummy weights, a small KV pool) is not the real launch
    assert record(load_run(synthetic(base / "pre0", 5, args={"load_format": "dummy", "max_total_tokens": 4096})))
    pre = load_run(synthetic(base / "pre1", 10, args={"load_format": "dummy", "max_total_tokens": 4096}))
    before = preflight.earlier_starts(pre)
    assert before is not None and before.starts == 3 and before.weights_s is not None
    text = preflight_plan.estimate(pre, 10**9, 10**9, before).text()
    assert text.startswith(
        f"expected start ≈ {preflight_plan.span(before.median_s)}, as the 3 earlier starts of this launch"
    )
    assert "from this pre-flight ≈ " in text, text
    other = load_run(synthetic(base / "other", 11, ranks=4, args={"load_format": "dummy"}))  # another layout
    assert preflight.earlier_starts(other) is None
    assert preflight_plan.estimate(other, 10**9, 10**9).text().startswith("expected start ≈ ")


def test_phasetrace_run_records_the_start_it_ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``phasetrace run`` records what it watched as the command ends, as its launcher would (a
    stand-in command writes a finished start into the run directory ``run`` made: no SGLang needed)."""
    monkeypatch.delenv(store.ENV_HISTORY, raising=False)
    base = tmp_path / "runs"
    fake = (
        f"import os, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); from pathlib import Path; "
        "from test_history import synthetic; synthetic(Path(os.environ['SGLANG_PHASETRACE_RUN_DIR']), 0)"
    )
    assert main(["run", "--quiet", "--dir", str(base), "--", sys.executable, "-c", fake]) == 0
    (run,) = [p for p in base.iterdir() if p.is_dir()]
    assert _starts(base / "history.sqlite") == [(run.name, "ready")]
