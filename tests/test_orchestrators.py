"""What an orchestrator reads of a start: ``phasetrace probe``'s exit codes and line, the launcher's
start-up endpoint (``/metrics`` in the Prometheus text format, ``/startup``, ``/startup/probe``),
and the predicted ready time. Runs written by hand here (``handmade_runs``); the real parts — a
real traced SGLang start scraped by a real Prometheus server — are in ``test_orchestrators_real.py``.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port
from handmade_runs import NOW, Proc
from prometheus_client.parser import text_string_to_metric_families
from sglang_phasetrace.tracing import keys, process_state
from sglang_phasetrace.tracing import other_processes as procs
from sglang_phasetrace.tracing.cli import main
from sglang_phasetrace.tracing.cli.probe import STILL_STARTING, find_run
from sglang_phasetrace.tracing.journal.layout import STARTUP_FILE
from sglang_phasetrace.tracing.launcher import endpoint
from sglang_phasetrace.tracing.reader.view import RunView
from sglang_phasetrace.tracing.verdicts import startup
from sglang_phasetrace.tracing.verdicts.diagnose import Thresholds
from sglang_phasetrace.tracing.verdicts.findings import live

S = 1_000_000_000


def _ranks(run: Path, *, initialised: bool = True) -> list[Proc]:
    made = [Proc(run, 100 + i, "rank", f"tp{i}", "rank").phase("model.load_weights", 290, 200) for i in range(2)]
    return [p.initialised(100).idle() if initialised else p for p in made]


def _assess(run: Path, alive: dict[int, bool] | None = None, outlook: dict | None = None) -> startup.Startup:
    view = RunView(run).refresh(final=True)
    found = [f for f, _ in live(view, NOW, Thresholds(), {})]
    return startup.assess(view, found, NOW, outlook, alive)


# -- the start's state ----------------------------------------------------------------------------------------


def test_a_start_that_progresses_is_starting_and_says_where_it_waits(tmp_path: Path) -> None:
    Proc(tmp_path, 99, "launcher", "launcher", "launch.server").phase("launch.wait_ranks", 280).write()
    tp0 = Proc(tmp_path, 100, "rank", "tp0", "rank").phase("model.load_weights", 30).loading(5, 8)
    tp0.write()
    s = _assess(
        tmp_path, outlook={"eta_s": 41.0, "p95_s": 55.0, "ready_at": 1.0, "starts": 6, "said": "ready in ≈ 41 s"}
    )
    assert (s.state, s.code) == ("starting", 0)
    assert s.line.startswith("sglang-phasetrace: starting: 1 rank; tp0 in 'model.load_weights' for 30 s (5/8 shards)")
    assert s.line.endswith("; ready in ≈ 41 s"), s.line
    assert s.predicted is not None and s.predicted["eta_s"] == 41.0 and s.predicted["p95_s"] == 55.0
    rows = {r["label"]: r for r in s.processes}
    assert rows["tp0"]["phase"] == "model.load_weights" and rows["tp0"]["progress_done"] == 5
    assert rows["tp0"]["cpu_pct"] == 95.0 and rows["tp0"]["rss"] == 1 << 30
    assert rows["launcher"]["phase"] == "launch.wait_ranks"


def test_a_standing_verdict_is_the_state_and_its_first_line_the_line(tmp_path: Path) -> None:
    launcher = Proc(tmp_path, 99, "launcher", "launcher", "launch.server").phase("server.wait_ready", 30).idle()
    detok = Proc(tmp_path, 98, "detokenizer", "detokenizer", "process").phase("detokenizer.init", 40).idle()
    for p in [launcher, detok, *_ranks(tmp_path)]:
        p.write()
    s = _assess(tmp_path)
    assert (s.state, s.code) == ("stalled", 3)
    assert s.line.startswith("sglang-phasetrace: STALL detokenizer (pid 98) holds the launch"), s.line
    assert s.verdicts == [{"kind": "blocked", "label": "detokenizer", "phase": "detokenizer.init", "line": s.line}]
    assert {r["label"]: r["state"] for r in s.processes}["detokenizer"] == "stalled"


def test_served_is_serving_until_the_launcher_is_gone(tmp_path: Path) -> None:
    Proc(tmp_path, 99, "launcher", "launcher", "launch.server").serving(5).write()
    for p in _ranks(tmp_path):
        p.serving(5).write()
    assert (_assess(tmp_path, {99: True}).state, _assess(tmp_path, {99: True}).code) == ("serving", 0)
    assert (_assess(tmp_path, {99: False}).state, _assess(tmp_path, {99: False}).code) == ("ended", 8)


def test_a_launcher_gone_before_serving_with_nothing_said_is_failed(tmp_path: Path) -> None:
    Proc(tmp_path, 99, "launcher", "launcher", "launch.server").phase("launch.wait_ranks", 20).write()
    s = _assess(tmp_path, {99: False})
    assert (s.state, s.code) == ("failed", 4) and "the launcher (pid 99) ended before the launch served" in s.line


def test_the_state_file_holds_no_process_and_names_its_writer(tmp_path: Path) -> None:
    Proc(tmp_path, 99, "launcher", "launcher", "launch.server").phase("launch.wait_ranks", 20).write()
    doc = json.loads(startup.state_file(_assess(tmp_path)))
    assert "processes" not in doc and doc["state"] == "starting" and doc["code"] == 0
    assert doc["writer"]["pid"] == os.getpid() and doc["writer"]["start_ticks"]


# -- phasetrace probe -----------------------------------------------------------------------------------------


def _probe(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["probe", *argv])
    return code, capsys.readouterr().out.strip()


def _state(run: Path, state: str, line: str, age_s: float = 0.0, pid: int | None = None) -> None:
    """A state file as a launcher's watchdog writes it, ``age_s`` old, by ``pid`` (this process)."""
    s = startup.Startup(state, line, run=str(run), t=time.time_ns() - int(age_s * S))
    doc = json.loads(startup.state_file(s))
    if pid is not None:
        doc["writer"]["pid"] = pid
    (run / STARTUP_FILE).write_text(json.dumps(doc))


def test_probe_answers_from_the_state_file_while_its_writer_runs(tmp_path: Path, capsys) -> None:
    Proc(tmp_path, 99, "launcher", "launcher", "launch.server").phase("launch.wait_ranks", 20).write()
    _state(tmp_path, "starting", "sglang-phasetrace: starting: 2 ranks")
    assert _probe(capsys, str(tmp_path)) == (0, "sglang-phasetrace: starting: 2 ranks")
    _state(tmp_path, "stalled", "sglang-phasetrace: STALL rank tp1 (pid 101) is blocked in 'x' for 9 s")
    assert _probe(capsys, str(tmp_path)) == (3, "sglang-phasetrace: STALL rank tp1 (pid 101) is blocked in 'x' for 9 s")
    for state, code in (("failed", 4), ("not_started", 5), ("stopped", 6), ("serving", 0)):
        _state(tmp_path, state, f"sglang-phasetrace: {state}")
        assert _probe(capsys, str(tmp_path))[0] == code, state


def test_probe_reads_the_journals_when_the_state_file_is_stale_or_its_writer_gone(tmp_path: Path, capsys) -> None:
    """The launcher was SIGKILLed: its state file says "starting", written by a process that is gone;
    its journal (this host's, its pid no longer running) says it ended before the launch served."""
    gone = 2**22 + 7  # no such process
    here = procs.this_host()
    Proc(tmp_path, gone, "launcher", "launcher", "launch.server", 30, host=here, now=time.time_ns()).write()
    _state(tmp_path, "starting", "sglang-phasetrace: starting", pid=gone)
    code, line = _probe(capsys, str(tmp_path))
    assert code == 4 and f"the launcher (pid {gone}) ended before the launch served" in line, line
    _state(tmp_path, "starting", "sglang-phasetrace: starting", age_s=600)  # this process wrote it, 10 min ago
    assert _probe(capsys, str(tmp_path))[0] == 4


def test_probe_finds_the_run_as_the_cli_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    base = tmp_path / "runs"
    base.mkdir()
    monkeypatch.delenv(keys.ENV_RUN_DIR, raising=False)
    monkeypatch.setenv(keys.ENV_BASE_DIR, str(base))
    code, line = _probe(capsys)
    assert code == 7 and line == f"sglang-phasetrace: no run in {base} yet"
    old, new = base / "20261206-100000-aaaaaa", base / "20261206-110000-bbbbbb"
    for run in (old, new):
        (run / "journal").mkdir(parents=True)
    os.utime(old, (1, 1))
    assert find_run(None) == new and find_run(str(base)) == new and find_run(str(old)) == old
    monkeypatch.setenv(keys.ENV_RUN_DIR, str(old))
    assert find_run(None) == old


def test_probe_wait_returns_at_the_verdict_or_when_its_time_runs_out(tmp_path: Path, capsys) -> None:
    Proc(tmp_path, 99, "launcher", "launcher", "launch.server").phase("launch.wait_ranks", 20).write()
    _state(tmp_path, "starting", "sglang-phasetrace: starting")
    tic = time.monotonic()
    assert _probe(capsys, "--wait", "1.5", str(tmp_path))[0] == STILL_STARTING
    assert 1.4 < time.monotonic() - tic < 4
    _state(tmp_path, "serving", "sglang-phasetrace: the launch serves")
    assert _probe(capsys, "--wait", "60", str(tmp_path)) == (0, "sglang-phasetrace: the launch serves")


def test_probe_json_is_the_state_with_its_exit_code(tmp_path: Path, capsys) -> None:
    Proc(tmp_path, 99, "launcher", "launcher", "launch.server").phase("launch.wait_ranks", 20).write()
    _state(tmp_path, "stalled", "sglang-phasetrace: STALL x")
    code, out = _probe(capsys, "--json", str(tmp_path))
    doc = json.loads(out)
    assert code == 3 and doc["state"] == "stalled" and doc["exit_code"] == 3 and "writer" not in doc


# -- the start-up endpoint ------------------------------------------------------------------------------------


def http_get(url: str, timeout: float = 10.0) -> tuple[int, str, str]:
    """(status, content type, body); (0, "", "") when nothing answers (yet)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()
    except OSError:
        return 0, "", ""


def _get(port: int, path: str) -> tuple[int, str, str]:
    return http_get(f"http://127.0.0.1:{port}{path}")


def test_the_endpoint_serves_metrics_the_state_and_the_probe(tmp_path: Path) -> None:
    launcher = Proc(tmp_path, 99, "launcher", "launcher", "launch.server").phase("launch.wait_ranks", 280)
    tp0 = Proc(tmp_path, 100, "rank", "tp0", "rank").phase("model.load_weights", 30).loading(5, 8)
    for p in (launcher, tp0):
        p.write()
    state = {"now": _assess(tmp_path, outlook={"eta_s": 41.0, "p95_s": 55.0, "said": "ready in ≈ 41 s"})}
    port = free_port()
    server = endpoint.serve(("127.0.0.1", port), lambda: state["now"])
    try:
        code, kind, body = _get(port, "/metrics")
        assert code == 200 and kind.startswith("text/plain; version=0.0.4")
        families = {f.name: f for f in text_string_to_metric_families(body)}
        [st] = [s for s in families["phasetrace_start_state"].samples if s.value == 1]
        assert st.labels == {"phasetrace_start_state": "starting"}
        assert families["phasetrace_start_predicted_ready_seconds"].samples[0].value == 41.0
        phases = {s.labels["label"]: s.labels["phase"] for s in families["phasetrace_process_phase"].samples}
        assert phases == {"launcher": "launch.wait_ranks", "tp0": "model.load_weights"}
        done = {s.labels["label"]: s.value for s in families["phasetrace_process_progress_done"].samples}
        assert done == {"tp0": 5.0}
        code, kind, body = _get(port, "/startup")
        doc = json.loads(body)
        assert code == 200 and kind == "application/json" and doc["state"] == "starting" and doc["code"] == 0
        assert {r["label"] for r in doc["processes"]} == {"launcher", "tp0"}
        assert _get(port, "/startup/probe")[0] == 200
        state["now"] = startup.Startup("stalled", "sglang-phasetrace: STALL rank tp0 …")
        code, _, body = _get(port, "/startup/probe")
        assert (code, body) == (503, "sglang-phasetrace: STALL rank tp0 …\n")
        assert _get(port, "/nothing")[0] == 404
    finally:
        server.shutdown()
        server.server_close()


def test_a_port_in_use_is_one_warning_and_the_launch_goes_on(monkeypatch, caplog) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    monkeypatch.setenv(keys.ENV_HTTP, f"127.0.0.1:{port}")
    monkeypatch.setattr(process_state, "STATE", process_state.ProcessState())
    monkeypatch.setattr(endpoint, "process_state", process_state)

    class Dog:
        startup = None

    try:
        with caplog.at_level(logging.WARNING, logger="sglang_phasetrace"):
            assert endpoint.open_from_env(Dog()) is None  # type: ignore[arg-type]
            assert endpoint.open_from_env(Dog()) is None  # type: ignore[arg-type]
    finally:
        taken.close()
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        f"sglang-phasetrace: no start-up endpoint: cannot listen on 127.0.0.1:{port} (Address already in use)"
    ]


@pytest.mark.parametrize(
    ("value", "addr"),
    [("9464", ("127.0.0.1", 9464)), (":9464", ("127.0.0.1", 9464)), ("0.0.0.0:80", ("0.0.0.0", 80)),
     ("[::1]:9464", ("::1", 9464)), ("host:1", ("host", 1)), ("x", None), ("1:99999", None), ("", None)],
)  # fmt: skip
def test_the_address_is_loopback_unless_given(value: str, addr: tuple[str, int] | None) -> None:
    assert endpoint.parse(value) == addr


# -- small conventions: --json on every table, one frame off a terminal, no escape codes ------------------------


def test_status_off_a_terminal_prints_one_frame_of_a_start_that_goes_on(tmp_path: Path) -> None:
    """A script gating on ``phasetrace status RUN`` (stdout a pipe) never waits on a launch that is
    still starting or stalled: one frame, no escape code, and the exit code says where it stands."""
    here, now = procs.this_host(), time.time_ns()
    Proc(tmp_path, os.getpid(), "launcher", "launcher", "launch.server", 30, host=here, now=now).write()
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TERM")}
    tic = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "sglang_phasetrace.tracing.cli", "status", str(tmp_path)],
        capture_output=True, text=True, timeout=60, env={**env, "NO_COLOR": "1"},
    )  # fmt: skip
    assert time.monotonic() - tic < 30 and "launcher" in out.stdout, out
    assert "\x1b" not in out.stdout + out.stderr


def test_every_verb_that_prints_a_table_has_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Proc(tmp_path, 99, "launcher", "launcher", "launch.server").phase("launch.wait_ranks", 20).write()
    Proc(tmp_path, 100, "rank", "tp0", "rank").phase("model.load_weights", 30).write()
    assert main(["timeline", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    lanes = {lane["label"]: lane for lane in doc["lanes"]}
    assert set(lanes) == {"launcher", "tp0"}
    assert [p["phase"] for p in lanes["tp0"]["phases"]] == ["rank", "model.load_weights"]
    assert lanes["tp0"]["phases"][1]["end_s"] is None and lanes["tp0"]["phases"][1]["status"] == "open"
    from sglang_phasetrace.tracing.cli import commands

    tables = {"status", "timeline", "compare", "history", "doctor", "probe"}
    for verb in commands():
        if verb.name in tables:
            parser = argparse.ArgumentParser()
            verb.add_arguments(parser)
            assert any("--json" in a.option_strings for a in parser._actions), verb.name


# -- the launch's other processes, named at the blocked bound (issue 41.4) ---------------------------------
def _verdicts(run: Path, now: int = NOW) -> list:
    view = RunView(run).refresh(final=True)
    return [f for f, _ in live(view, now, Thresholds(), {}) if f.alarm]


def test_a_helper_asleep_in_an_init_that_waits_for_no_one_is_named_at_the_bound(tmp_path: Path) -> None:
    """The detokenizer asleep in its init while the ranks still load: named once idle for the blocked
    bound (8 s), not once the ranks are initialised and idle too (that was 19 s on CPU)."""
    Proc(tmp_path, 99, "launcher", "launcher", "launch.server").phase("launch.wait_ranks", 20).idle().write()
    for i in range(2):
        Proc(tmp_path, 100 + i, "rank", f"tp{i}", "rank").phase("model.load_weights", 12).loading(3, 8).write()
    Proc(tmp_path, 98, "detokenizer", "detokenizer", "process").phase("detokenizer.init", 9).idle(9).write()
    [f] = _verdicts(tmp_path)
    assert (f.kind, f.label, f.phase) == ("blocked", "detokenizer", "detokenizer.init")
    assert f.message.startswith(
        "detokenizer (pid 98) is blocked in 'detokenizer.init' for 9 s: it has not entered its loop, idle (0 % CPU"
    ), f.message
    assert "the launcher waits in 'launch.wait_ranks'" in f.message, f.message


def test_a_helper_idle_for_less_than_the_bound_runnable_or_waiting_for_its_ranks_is_not_named(
    tmp_path: Path,
) -> None:
    def run(name: str, phase: str, idle_s: float, state: str = "S") -> Path:
        path = tmp_path / name
        Proc(path, 99, "launcher", "launcher", "launch.engine").phase("launch.wait_ranks", 20).idle().write()
        Proc(path, 100, "rank", "tp0", "rank").phase("model.load_weights", 12).loading(3, 8).write()
        helper = Proc(path, 98, "helper", "dp-controller" if "dp" in phase else "detokenizer", "process")
        helper.phase(phase, idle_s).idle(idle_s)
        for r in helper.records:
            if r["kind"] == "heartbeat":
                r["main"]["state"] = state
        helper.write()
        return path

    assert _verdicts(run("short", "detokenizer.init", 6)) == []  # under the bound
    assert _verdicts(run("starved", "detokenizer.init", 12, state="R")) == []  # a busy host starves it: runnable
    assert _verdicts(run("dp", "dp_controller.init", 30)) == []  # it waits for its ranks, which load


def test_the_watchdog_looks_again_in_a_moment_while_a_process_nears_the_bound(tmp_path: Path) -> None:
    from sglang_phasetrace.tracing.verdicts.watchdog import SOON_S, Watchdog

    now = time.time_ns()
    Proc(tmp_path, 98, "detokenizer", "detokenizer", "process", now=now).phase("detokenizer.init", 7).write()
    dog = Watchdog(tmp_path, Thresholds(), out=io.StringIO(), py_spy=False)
    dog.run.refresh()
    assert dog.pause(0.01) == SOON_S  # 7 s quiet: within a beat of the 8 s bound
    assert dog.pause(0.4) == 0.8  # never more often than twice what a pass costs
    Proc(tmp_path, 98, "detokenizer", "detokenizer", "process", now=now).phase("detokenizer.init", 1).write()
    dog.run = RunView(tmp_path)
    dog.run.refresh()
    assert dog.pause(0.01) == 2.0  # far from it: the heartbeat interval


def test_a_dp_controller_whose_ranks_still_import_holds_nothing(tmp_path: Path) -> None:
    """``--dp 2``: the DP controller waits in its init for the ranks it spawned, which import (no rank
    journal has a root yet); its busy child is work, not a stall (a false STALL in the healthy matrix)."""
    from sglang_phasetrace.tracing.journal.waits_on import Child, Evidence

    Proc(tmp_path, 99, "launcher", "launcher", "launch.server").phase("launch.wait_ranks", 40).idle().write()
    Proc(tmp_path, 97, "dp-controller", "dp-controller", "process").phase("dp_controller.init", 30).idle(30).write()
    Proc(tmp_path, 98, "detokenizer", "detokenizer", "process").phase("detokenizer.loop", 29).idle().write()
    child = Child(pid=300, ppid=97, name="python", cmd="python", cpu_pct=44.0, cpu_over="window", cpu_s=4.0,
                  sampled=NOW / S, started=NOW / S - 9, age_s=9.0, state="R")  # fmt: skip
    busy = Evidence(
        pid=97, t=NOW, cause="child", busy=True, text="is busy, not stuck: its child works", children=[child]
    )
    view = RunView(tmp_path).refresh(final=True)
    found = [f for f, _ in live(view, NOW, Thresholds(), {}, read=lambda p: busy if p.pid == 97 else None)]
    assert [f for f in found if f.alarm] == [], found


# -- nothing trusted that another user wrote or could have written -------------------------------------------


@pytest.mark.parametrize("where", ["run", "journal", "state"])
def test_probe_refuses_a_run_or_state_file_others_can_write_in_one_line(where: str, tmp_path: Path, capsys) -> None:
    """A planted "serves" in a directory others may write (0777) is refused, not believed: exit 1, one line."""
    Proc(tmp_path, 99, "launcher", "launcher", "launch.server").phase("launch.wait_ranks", 20).write()
    _state(tmp_path, "serving", "sglang-phasetrace: the launch serves (planted)")
    target = {"run": tmp_path, "journal": tmp_path / "journal", "state": tmp_path / STARTUP_FILE}[where]
    target.chmod(0o777 if where != "state" else 0o666)
    code = main(["probe", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 1 and out == "", out
    mode = "666" if where == "state" else "777"
    assert (
        err
        == f"sglang-phasetrace: probe: refusing to read {tmp_path}: {target} is writable by other users (mode {mode})\n"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory another user's needs root")
def test_probe_and_status_refuse_a_run_directory_of_another_user(tmp_path: Path, capsys) -> None:
    import pwd

    uid = pwd.getpwnam("nobody").pw_uid
    Proc(tmp_path, 99, "launcher", "launcher", "launch.server").phase("launch.wait_ranks", 20).write()
    _state(tmp_path, "serving", "sglang-phasetrace: the launch serves (planted)")
    os.chown(tmp_path, uid, -1)
    why = f"refusing to read {tmp_path}: {tmp_path} is owned by uid {uid}, not by this user (uid {os.geteuid()})"
    for verb in ("probe", "status", "timeline"):
        code = main([verb, str(tmp_path)])
        out, err = capsys.readouterr()
        assert (code, out, err) == (1, "", f"sglang-phasetrace: {verb}: {why}\n"), verb
    os.chown(tmp_path, os.geteuid(), -1)
    (tmp_path / STARTUP_FILE).chmod(0o600)
    os.chown(tmp_path / STARTUP_FILE, uid, -1)
    assert main(["probe", str(tmp_path)]) == 1
    assert "is owned by uid" in capsys.readouterr().err


def test_every_label_value_is_bounded_with_a_visible_marker_and_stays_distinct() -> None:
    """A 5000-character process label (escaped correctly, but a 5 kB label) is cut to LABEL_MAX with
    ``…`` and a digest: two labels that differ past the cut are still two series."""
    import re

    from sglang_phasetrace.tracing.render import prometheus

    long1, long2 = "tp" + "x" * 5000, "tp" + "x" * 4999 + "y"
    rows = [{"label": lab, "role": "rank", "state": "starting", "phase": "p" * 300, "rss": 1} for lab in (long1, long2)]
    verdict = {"kind": "silent" * 50, "label": long1, "phase": '"\\' * 400, "line": "x"}
    s = startup.Startup("stalled", "x", run_id="r" * 999, processes=rows, verdicts=[verdict])
    body = prometheus.text(prometheus.registry(lambda: s)).decode()
    families = {f.name: f for f in text_string_to_metric_families(body)}
    values = [v for f in families.values() for smp in f.samples for v in smp.labels.values()]
    assert values and max(len(v) for v in values) == prometheus.LABEL_MAX, max(len(v) for v in values)
    cut = [v for v in values if len(v) == prometheus.LABEL_MAX]
    assert all(re.search(r"…[0-9a-f]{8}$", v) for v in cut), cut
    assert len({smp.labels["label"] for smp in families["phasetrace_process_state"].samples}) == 2
