"""Healthy starts, as users start SGLang, are never an alarm (issue 41.2).

Each configuration starts a real, healthy SGLang on CPU under the hook (the plugin for one) with
the start-up endpoint on, and must show, one after the other in this module's one process:

* the launch reaches *serving*, and no alarm (STALL, DIED, FAILED, NOT STARTED, ROOT CAUSE) is said;
* ``phasetrace probe`` exits 0 while it starts and serves, and ``/startup/probe`` answers 200;
* the history records one start;
* a SIGTERM to the process group afterwards is at most one ``STOPPED`` line, no process shows as
  failed, and ``probe`` says the launch served, then ended (8);
* ``phasetrace preflight`` passes on the same command, where its path to serving differs.

Serving used to be seen only through SGLang's INFO line "ready to roll", which ``--log-level
warning`` never makes; with ``--tokenizer-worker-num 2`` the launcher never warms up at all.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import ROOT, free_port, hook_env, kill_group, requires_sglang
from sglang_phasetrace.tracing.cli import main
from sglang_phasetrace.tracing.reader.load import load_run
from sglang_phasetrace.tracing.render.lanes import layout

pytestmark = [requires_sglang, pytest.mark.sglang]

SERVE_BY_S = 150  # a healthy start serves within this, and says no alarm meanwhile
ALARMS = re.compile(r"sglang-phasetrace: (STALL|DIED|FAILED|NOT STARTED|ROOT CAUSE)\b")
API_KEY = "matrix-key-7f3a"
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Config:
    name: str
    args: tuple[str, ...] = ()  # launch_server arguments beyond the model, device, tp and port
    entry: str = "launch_server"  # launch_server | serve | engine
    plugin: bool = False  # SGLang's plugin entry point only, no PYTHONPATH hook
    tp: int = 2
    env: dict[str, str] = field(default_factory=dict)
    preflight: bool = False  # also pre-flighted (``launch_server`` and ``sglang serve`` only)

    def command(self, model: Path, port: int) -> list[str]:
        if self.entry == "engine":
            return [sys.executable, str(ROOT / "tests" / "programs" / "serve_engine.py"), str(model), "--tp", "2"]
        serve = self.entry == "serve"
        head = [str(BIN / "sglang"), "serve"] if serve else [sys.executable, "-m", "sglang.launch_server"]
        common = ["--model-path", str(model), "--device", "cpu", "--tp-size", str(self.tp)]
        return [*head, *common, "--max-total-tokens", "4096", "--port", str(port), *self.args]


# tp=2 as production runs; the other log levels at tp=1, a cheaper start on the same serving path as
# warning's (CI's time: a start is ≈ 30 s here). Pre-flight where the path to serving differs.
CONFIGS = [
    Config("log-warning", ("--log-level", "warning"), preflight=True),
    Config("log-debug", ("--log-level", "debug"), tp=1),
    Config("log-info", ("--log-level", "info"), tp=1),
    Config("log-error", ("--log-level", "error"), tp=1),
    Config("skip-warmup", ("--skip-server-warmup",), preflight=True),
    Config("api-key", ("--api-key", API_KEY), preflight=True),
    Config("tokenizer-workers", ("--tokenizer-worker-num", "2"), preflight=True),
    Config("dp2", ("--dp-size", "2"), tp=1, preflight=True),
    Config("metrics", ("--enable-metrics",)),
    Config("sglang-serve", ("--log-level", "warning"), entry="serve", preflight=True),
    Config("engine", entry="engine"),
    Config("plugin", ("--log-level", "warning"), plugin=True),
]


def http_status(url: str, headers: dict[str, str] | None = None) -> int | None:
    """The HTTP status of GET ``url`` (1 s, as a Kubernetes probe waits), None when nothing answers."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=1) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return None


def probe(run_dir: Path) -> tuple[int, dict]:
    """``phasetrace probe RUN_DIR --json`` in this process: (exit code, its document)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["probe", str(run_dir), "--json"])
    try:
        return code, json.loads(out.getvalue())
    except ValueError:
        return code, {"raw": out.getvalue()}


def group_gone(proc: subprocess.Popen, timeout: float) -> bool:
    """Every process of ``proc``'s group has ended (``proc`` reaped: a zombie is still in its group)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            proc.poll()
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.5)
    return False


@dataclass
class Started:
    """What one healthy start showed, for the test of its configuration to assert."""

    config: Config
    log: str = ""
    served_s: float | None = None
    probe_codes: set[int] = field(default_factory=set)  # while starting and serving
    http_codes: set[int] = field(default_factory=set)  # /startup/probe while starting and serving
    metrics_codes: tuple[int | None, int | None] = (None, None)  # SGLang's /metrics, ours, once serving
    starts_recorded: int = 0
    outcomes: list[str] = field(default_factory=list)
    ended_code: int | None = None
    states_after: dict[str, str] = field(default_factory=dict)
    stopped_in_s: float | None = None


def start(config: Config, model: Path, base: Path) -> Started:
    """Start ``config`` healthy, watch it until it serves (``SERVE_BY_S``), SIGTERM its group."""
    port, ours = free_port(), free_port()
    run_dir = base / "run"
    env = {"SGLANG_PHASETRACE_RUN_DIR": str(run_dir), "SGLANG_PHASETRACE_HTTP": f"127.0.0.1:{ours}", **config.env}
    if config.plugin:
        env["SGLANG_PHASETRACE"] = "1"
    log = base / "launch.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            config.command(model, port),
            env=hook_env(base, env, hooks=not config.plugin),
            cwd=base,
            stdin=subprocess.PIPE,  # serve_engine.py serves until its input ends
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    seen = Started(config)
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < SERVE_BY_S and proc.poll() is None:
            if (run_dir / "journal").is_dir():
                code, doc = probe(run_dir)
                seen.probe_codes.add(code)
                if (status := http_status(f"http://127.0.0.1:{ours}/startup/probe")) is not None:
                    seen.http_codes.add(status)
                if doc.get("state") == "serving":
                    seen.served_s = time.monotonic() - t0
                    break
            time.sleep(1)
        if seen.served_s is not None:
            time.sleep(3)  # serving a moment: the ranks learn it, nothing is said
            seen.probe_codes.add(probe(run_dir)[0])
            seen.http_codes.add(http_status(f"http://127.0.0.1:{ours}/startup/probe") or 0)
            if config.entry != "engine":
                auth = {"Authorization": f"Bearer {API_KEY}"} if "--api-key" in config.args else {}
                seen.metrics_codes = (
                    http_status(f"http://127.0.0.1:{port}/metrics", auth),
                    http_status(f"http://127.0.0.1:{ours}/metrics"),
                )
        stopped = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        if group_gone(proc, 60):
            seen.stopped_in_s = time.monotonic() - stopped
    finally:
        kill_group(proc.pid)
        proc.wait(timeout=30)
    seen.log = log.read_text(errors="replace")
    history = base / "history.sqlite"
    if history.exists():
        with contextlib.closing(sqlite3.connect(f"file:{history}?mode=ro", uri=True)) as con:
            seen.outcomes = [row[0] for row in con.execute("SELECT outcome FROM starts")]
        seen.starts_recorded = len(seen.outcomes)
    if (run_dir / "journal").is_dir():
        seen.ended_code = probe(run_dir)[0]
        seen.states_after = {lane.label: lane.state for lane in layout(load_run(run_dir)).lanes}
    return seen


@pytest.fixture(scope="module", params=CONFIGS, ids=[c.name for c in CONFIGS])
def started(request: pytest.FixtureRequest, tiny_model: tuple[Path, Path], tmp_path_factory) -> Started:
    """Each configuration started once (pytest orders a module's tests by it: one start at a time)."""
    return start(request.param, tiny_model[0], tmp_path_factory.mktemp(request.param.name))


def said(seen: Started) -> list[str]:
    return [line for line in seen.log.splitlines() if "sglang-phasetrace:" in line]


def test_a_healthy_start_serves_and_says_no_alarm(started: Started) -> None:
    seen, ours = started, said(started)
    assert seen.served_s is not None, f"{seen.config.name}: not serving within {SERVE_BY_S} s\n" + "\n".join(
        ours[-20:] + seen.log.splitlines()[-30:]
    )
    assert not [line for line in ours if ALARMS.search(line)], ours
    assert seen.probe_codes == {0}, (seen.probe_codes, ours)
    assert seen.http_codes == {200}, (seen.http_codes, ours)
    if "--enable-metrics" in seen.config.args:
        assert seen.metrics_codes == (200, 200), seen.metrics_codes  # SGLang's /metrics and ours


def test_a_healthy_start_is_recorded_and_its_stop_is_no_failure(started: Started) -> None:
    seen, ours = started, said(started)
    assert seen.starts_recorded == 1 and seen.outcomes[0] != "failed", (seen.outcomes, ours)
    assert seen.stopped_in_s is not None, "the launch did not end within 60 s of its SIGTERM"
    assert len([line for line in ours if " STOPPED " in line]) <= 1, ours
    assert not [line for line in ours if ALARMS.search(line)], ours
    assert seen.ended_code == 8, (seen.ended_code, ours)  # served, then ended
    assert "failed" not in seen.states_after.values(), seen.states_after


@pytest.mark.parametrize("config", [c for c in CONFIGS if c.preflight], ids=lambda c: c.name)
def test_preflight_passes_on_a_healthy_launch(tiny_model: tuple[Path, Path], tmp_path: Path, config: Config) -> None:
    command = config.command(tiny_model[0], free_port())
    args = [sys.executable, "-m", "sglang_phasetrace.tracing.cli", "preflight", "--", *command]
    proc = subprocess.Popen(
        args, env=hook_env(tmp_path, None, hooks=False), cwd=tmp_path, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        kill_group(proc.pid)
    assert proc.returncode == 0, err[-4000:]
    assert "PASSED after" in err, err[-2000:]
    assert not ALARMS.search(err), err[-2000:]
