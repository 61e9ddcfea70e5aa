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
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import pytest
from cli_fixtures import build_run
from conftest import SCRIPTS, Ran, requires_sglang, run_program
from sglang_phasetrace.tracing import process_state
from sglang_phasetrace.tracing.cli import main
from sglang_phasetrace.tracing.history import History, eta, fingerprint, live, of_run, record, store, usual
from sglang_phasetrace.tracing.history.measure import measure
from sglang_phasetrace.tracing.reader.load import load_run

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


# -- real SGLang: two healthy starts are one launch; another tp size is another ---------------------


@pytest.fixture(scope="module")
def real_starts(
    tiny_model: tuple[Path, Path], engine_run: Ran, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """Two healthy tp=2 ``sglang.Engine`` starts (the suite's shared one, and one more) and one tp=1
    start of the same model, on CPU."""
    assert engine_run.run_dir is not None
    out = {"a": engine_run.run_dir}
    for name, tp in (("b", 2), ("one", 1)):
        base = tmp_path_factory.mktemp(f"history-{name}")
        ran = run_program(
            [str(SCRIPTS / "start_engine.py"), str(tiny_model[0]), "--tp", str(tp), "--no-generate"], base
        )
        assert ran.returncode == 0 and ran.run_dir is not None, ran.stderr[-3000:]
        out[name] = ran.run_dir
    return out


@requires_sglang
@pytest.mark.sglang
def test_two_real_starts_are_one_launch_and_history_lists_both(
    real_starts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "hist" / "history.sqlite"
    monkeypatch.setenv(store.ENV_HISTORY, str(db))
    runs = {name: load_run(path) for name, path in real_starts.items()}
    done = {name: record(run) for name, run in runs.items()}
    assert all(d is not None and d.outcome == "ready" for d in done.values()), done
    fa, fb, fone = (done[n].fingerprint for n in ("a", "b", "one"))  # type: ignore[union-attr]
    assert fa.id == fb.id != fone.id
    assert fa.fields["layout"]["tp"] == 2 and fone.fields["layout"]["tp"] == 1
    assert fa.fields["model"]["config"] and fa.fields["versions"]["sglang"] and fa.fields["device"]["kind"] == "cpu"
    assert record(runs["a"]) is not None  # again: replaced, not added
    # files are private: the directory we made 0700, the database and its WAL files 0600
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in db.parent.iterdir()), list(db.parent.iterdir())

    code, out, err = cli(capsys, "history", "--json")
    assert code == 0, err
    launches = {la["id"]: la for la in json.loads(out)["launches"]}
    two, one = launches[fa.id], launches[fone.id]
    assert two["starts"] == 2 and {s["run_id"] for s in two["recent"]} == {real_starts["a"].name, real_starts["b"].name}
    assert one["starts"] == 1 and one["recent"][0]["run_id"] == real_starts["one"].name
    phases = {p["phase"]: p for p in two["phases"]}
    for key in ("rank", "rank.bootstrap", "model.load_weights", "kv_cache.alloc"):
        assert phases[key]["n"] == 2 and phases[key]["min_s"] <= phases[key]["median_s"] <= phases[key]["max_s"]
    assert two["trend"]["newest"] in (real_starts["a"].name, real_starts["b"].name) and two["trend"]["changes"]
    code, out, _ = cli(capsys, "history", "--fingerprint", fa.id[:6])
    assert code == 0 and real_starts["a"].name in out and real_starts["b"].name in out and "median" in out
    assert real_starts["one"].name not in out and "trend:" in out

    # the tp=1 start has no earlier start of its launch: never compared with the tp=2 ones
    code, out, _ = cli(capsys, "compare", str(real_starts["one"]), "--baseline")
    assert code == 0 and "no earlier start" in out
    code, out, err = cli(capsys, "compare", str(real_starts["b"]), "--baseline", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["fingerprint"]["id"] == fa.id and doc["starts"] == 1
    rows = {r["phase"]: r for r in doc["phases"]}
    assert rows["model.load_weights"]["usual"]["n"] == 1  # only a's: b itself is left out

    # live: how long a phase usually takes, and the ETA of a start that is in its first step
    u = usual(fa.id, "rank.bootstrap")
    assert u is not None and u.n == 2 and u.median > 0
    first = eta(fa.id, {"rank.bootstrap": 0.0})
    assert first is not None and first.starts == 2 and first.remaining_s >= u.median
    steps = [p.phase for p in live.usuals(fa.id).values() if p.depth == 1 and p.role == "rank"]
    done_eta = eta(fa.id, {}, ended=steps)
    assert done_eta is not None and done_eta.remaining_s == 0


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
    code, _, err = cli(capsys, "history", "--dir", str(tmp_path))
    assert code == 1 and "no history here yet" in err
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
