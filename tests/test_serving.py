"""The start ends when the server serves (issue 26.1).

For ``launch_server`` a rank whose ``Scheduler.__init__`` returned is *initialised*, not serving:
until SGLang's "ready to roll" (after the warm-up request) it beats into its journal, records its
warm-up passes' collectives, traces each forward pass as ``server.warmup`` and is watched; then its
root ends (``phasetrace.serving``), the hot-path patches come off and its heartbeats leave the
journal. The launcher tells it through the environment (which file to wait for) and that file.
For an ``Engine`` a rank serves once initialised, as before. In-process first (the lifecycle, the
reader's states, the verdict's words); then real ``launch_server`` starts on CPU: a rank stuck in
its first warm-up forward while its peer waits in the forward's real all-reduce, and a healthy one.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import HOOKS, free_port, hook_env, kill_group, read_journal, requires_sglang, run_dirs
from sglang_phasetrace.patches import PatchEngine, Phase
from sglang_phasetrace.patches import server as server_patches
from sglang_phasetrace.patches.model_runner import _forward
from sglang_phasetrace.patches.spec import Call, Report
from sglang_phasetrace.tracing import keys
from sglang_phasetrace.tracing.cli import main
from sglang_phasetrace.tracing.journal import records
from sglang_phasetrace.tracing.reader.load import load_run
from sglang_phasetrace.tracing.reader.view import RunView
from sglang_phasetrace.tracing.recorder import heartbeat, runtime, serving
from sglang_phasetrace.tracing.render.lanes import layout
from sglang_phasetrace.tracing.render.verdict import headline
from sglang_phasetrace.tracing.verdicts import postmortem
from sglang_phasetrace.tracing.verdicts.diagnose import Thresholds, analyze

S = 1_000_000_000
Mode = enum.IntEnum("ForwardMode", "EXTEND DECODE IDLE")


class Batch:
    def __init__(self, mode: Mode, size: int) -> None:
        self.forward_mode, self.batch_size = mode, size


RANK_SOURCE = """
calls = []
def all_reduce():
    calls.append("all_reduce")
class Scheduler:
    def __init__(self, tp_rank):
        all_reduce()  # an init collective
class Runner:
    is_draft_worker = False
    def forward(self, forward_batch):
        all_reduce()  # the model's tensor-parallel all-reduce
        return forward_batch.batch_size
"""


def rank_engine(mod) -> PatchEngine:
    m = mod.__name__
    engine = PatchEngine(
        [
            Phase(keys.PHASE_RANK, (f"{m}:Scheduler.__init__",), kind="rank", enter=lambda call: {keys.TP_RANK: 0}),
            Phase(keys.PHASE_WARMUP, (f"{m}:Runner.forward",), kind="warmup", enter=_forward, init_only=True),
            Phase("collective.t", (f"{m}:all_reduce",), kind="collective", init_only=True),
        ]
    )
    engine.apply_module(m)
    runtime.current().on_ready.append(lambda: engine.unapply(lambda phase: phase.init_only))  # as bootstrap does
    return engine


def journal(run_dir: Path) -> list[dict]:
    (path,) = (run_dir / "journal").glob("*.jsonl")
    lines, problems = read_journal(path)
    assert problems == []
    return lines


def state(run_dir: Path) -> str:
    lay = layout(load_run(run_dir))
    (lane,) = lay.lanes
    return lane.state


def serve(run_dir: Path, name: str = "serving-launcher", t: int | None = None) -> Path:
    """What the launcher writes when its launch serves (since ``t``)."""
    marker = run_dir / name
    marker.write_text(json.dumps({"t": t, "pid": 1}) if t else "{}")
    marker.chmod(0o600)
    return marker


# -- in-process: a rank's start, initialised then serving ------------------------------------------
def test_a_launch_server_rank_is_initialised_and_watched_until_its_launch_serves(
    trace_run_dir: Path, make_module, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(keys.ENV_SERVING, "serving-launcher")
    mod = make_module(RANK_SOURCE)
    rank_engine(mod)
    rt = runtime.current()
    assert mod.Runner().forward(Batch(Mode.EXTEND, 1)) == 1  # a pass inside init: the init phase covers it
    mod.Scheduler(0)
    assert rt.initialised and not rt.ready
    assert state(trace_run_dir) == "initialised"
    mod.all_reduce()  # the scheduler loop between passes polls its peers: not recorded
    assert mod.Runner().forward(Batch(Mode.EXTEND, 1)) == 1
    assert mod.Runner().forward(Batch(Mode.DECODE, 1)) == 1
    heartbeat.current().beat()

    lines = journal(trace_run_dir)
    begins = {r["span"]: r for r in lines if r["kind"] == "begin"}
    warmups = [r for r in begins.values() if r["name"] == keys.PHASE_WARMUP]
    assert [(r["attrs"][keys.FORWARD_MODE], r["attrs"][keys.BATCH_SIZE]) for r in warmups] == [
        ("extend", 1),
        ("decode", 1),
    ]
    colls = [r for r in lines if r["kind"] == "collective" and r["edge"] == "enter"]
    assert [r["seq"] for r in colls] == [1, 2, 3]  # init's, then one per warm-up pass: none from the loop
    assert {r["span"] for r in colls[1:]} == {r["span"] for r in warmups}
    (root,) = [r for r in begins.values() if r["attrs"][keys.PHASE] == keys.PHASE_RANK]
    assert [r["name"] for r in lines if r["kind"] == "event" and r["span"] == root["span"]] == [keys.INITIALISED]
    assert not [r for r in lines if r["kind"] == "end" and r["span"] == root["span"]]
    assert [r["ready"] for r in lines if r["kind"] == "heartbeat"][-1] is False  # still in the journal

    served_at = time.time_ns()
    serve(trace_run_dir, t=served_at)
    time.sleep(0.01)
    heartbeat.current().beat()  # the heartbeat thread looks once a beat
    assert rt.ready
    assert mod.Runner.forward.__name__ == "forward" and not hasattr(mod.Runner.forward, "__wrapped__")
    mod.Runner().forward(Batch(Mode.DECODE, 8))  # serving: the original, no span, no record
    heartbeat.current().beat()
    after = journal(trace_run_dir)
    (end,) = [r for r in after if r["kind"] == "end" and r["span"] == root["span"]]
    assert end["status"] == "ok" and end["attrs"][keys.SERVING] is True
    assert end["t"] == served_at  # when the launch began to serve, not when this rank noticed
    beats = [r for r in after if r["kind"] == "heartbeat"]
    assert all(b["t"] <= end["t"] for b in beats), "heartbeats leave the journal once serving"
    assert len([r for r in after if r["kind"] == "begin" and r["name"] == keys.PHASE_WARMUP]) == 2
    assert rt.runtime_calls == {}
    assert state(trace_run_dir) == "ready"


def test_the_first_pass_after_serving_sees_it_before_the_heartbeat(
    trace_run_dir: Path, make_module, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(keys.ENV_SERVING, "serving-launcher")
    mod = make_module(RANK_SOURCE)
    rank_engine(mod)
    rt = runtime.current()
    mod.Scheduler(0)
    runner = mod.Runner()
    serve(trace_run_dir)
    assert runner.forward(Batch(Mode.EXTEND, 4)) == 4  # one lstat: the launch serves; untraced, counted
    assert rt.ready and rt.awaiting is None
    assert {phase: c["calls"] for phase, c in rt.runtime_calls_summary().items()} == {keys.PHASE_WARMUP: 1}
    assert not [r for r in journal(trace_run_dir) if r["kind"] == "begin" and r["name"] == keys.PHASE_WARMUP]


def test_an_engine_rank_serves_once_initialised_and_traces_no_pass(
    trace_run_dir: Path, make_module, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(keys.ENV_SERVING, raising=False)
    mod = make_module(RANK_SOURCE)
    rank_engine(mod)
    mod.Scheduler(0)
    rt = runtime.current()
    assert rt.initialised and rt.ready
    mod.Runner().forward(Batch(Mode.EXTEND, 1))
    lines = journal(trace_run_dir)
    assert not [r for r in lines if r["kind"] == "begin" and r["name"] == keys.PHASE_WARMUP]
    assert not [r for r in lines if r["kind"] == "event"]  # no "initialised": it serves at once
    (end,) = [r for r in lines if r["kind"] == "end" and keys.SERVING in r["attrs"]]
    assert end["status"] == "ok"
    assert state(trace_run_dir) == "ready"


def test_a_rank_that_exits_right_after_its_launch_served_ends_its_start_served(
    trace_run_dir: Path, make_module, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped within a beat of "ready to roll" (no beat, no pass since): at exit it looks once more,
    before the exit hook would end its root as incomplete."""
    monkeypatch.setenv(keys.ENV_SERVING, "serving-launcher")
    registered = []
    monkeypatch.setattr(serving.atexit, "register", registered.append)
    mod = make_module(RANK_SOURCE)
    rank_engine(mod)
    mod.Scheduler(0)
    assert registered[-1] is serving._look_at_exit and not runtime.current().ready  # after the exit hook's
    serve(trace_run_dir, t=time.time_ns())
    registered[-1]()  # atexit runs the last registered first
    assert runtime.current().ready and state(trace_run_dir) == "ready"


@pytest.mark.parametrize("planted", ["link", "directory"])
def test_a_planted_marker_is_not_believed(
    trace_run_dir: Path, make_module, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, planted: str
) -> None:
    monkeypatch.setenv(keys.ENV_SERVING, "serving-launcher")
    mod = make_module(RANK_SOURCE)
    rank_engine(mod)
    mod.Scheduler(0)
    if planted == "link":
        (tmp_path / "elsewhere").write_text("{}")
        (trace_run_dir / "serving-launcher").symlink_to(tmp_path / "elsewhere")
    else:
        (trace_run_dir / "serving-launcher").mkdir()
    heartbeat.current().beat()
    mod.Runner().forward(Batch(Mode.EXTEND, 1))
    assert not runtime.current().ready and state(trace_run_dir) == "initialised"


def test_a_launch_that_never_says_it_serves_costs_a_bounded_number_of_traced_passes(
    trace_run_dir: Path, make_module, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(keys.ENV_SERVING, "serving-launcher")
    monkeypatch.setattr(serving, "MAX_WARMUP_PASSES", 3)
    mod = make_module(RANK_SOURCE)
    rank_engine(mod)
    mod.Scheduler(0)
    with caplog.at_level(logging.WARNING, logger="sglang_phasetrace"):
        for _ in range(6):
            mod.Runner().forward(Batch(Mode.DECODE, 1))
    assert runtime.current().ready
    said = [r.getMessage() for r in caplog.records if "forward passes" in r.getMessage()]
    assert len(said) == 1 and "serving-launcher is missing" in said[0]
    assert len([r for r in journal(trace_run_dir) if r["kind"] == "begin" and r["name"] == keys.PHASE_WARMUP]) == 3


# -- in-process: the launcher's side ------------------------------------------------------------------
def launcher_module(make_module):
    return make_module("def launch():\n    return 'serving'\ndef wait():\n    return 'up'\ndef engine():\n    pass\n")


def test_launch_server_tells_its_ranks_and_announces_serving(
    trace_run_dir: Path, make_module, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(keys.ENV_WATCHDOG, "0")
    monkeypatch.setenv(keys.ENV_TRACEPARENT, "")
    monkeypatch.delenv(keys.ENV_SERVING, raising=False)
    mod = launcher_module(make_module)
    PatchEngine(
        [
            Phase(keys.PHASE_LAUNCH_SERVER, (f"{mod.__name__}:launch",), kind="launch"),
            Phase(keys.PHASE_WAIT_READY, (f"{mod.__name__}:wait",), kind="ready", exit=lambda c, r: Report(ready=True)),
        ]
    ).apply_module(mod.__name__)
    mod.launch()
    name = os.environ[keys.ENV_SERVING]  # what the ranks it spawns inherit
    assert name.startswith("serving-") and "/" not in name and not (trace_run_dir / name).exists()
    mod.wait()
    deadline = time.monotonic() + 10
    while not (trace_run_dir / name).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (trace_run_dir / name).stat().st_mode & 0o777 == 0o600
    run = load_run(trace_run_dir)
    (launcher,) = run.processes
    assert launcher.ready and launcher.serving and layout(run).lanes[0].state == "serving"


def test_an_engine_launcher_removes_an_inherited_variable(
    trace_run_dir: Path, make_module, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(keys.ENV_WATCHDOG, "0")
    monkeypatch.setenv(keys.ENV_TRACEPARENT, "")
    monkeypatch.setenv(keys.ENV_SERVING, "serving-an-outer-launch")
    mod = launcher_module(make_module)
    PatchEngine(
        [Phase(keys.PHASE_LAUNCH_ENGINE, (f"{mod.__name__}:engine",), kind="launch", ends_root=True)]
    ).apply_module(mod.__name__)
    mod.engine()
    assert keys.ENV_SERVING not in os.environ
    (launcher,) = load_run(trace_run_dir).processes
    assert launcher.serving


# -- readers: the states, and the verdict's words on a warm-up stall (synthetic journals) -----------
def warmup_stall(path: Path, now: int) -> None:
    """tp0 waits in all_reduce #3 of its first warm-up pass; tp1 sits in its own pass, blocked,
    two all-reduces behind; the launcher waits for "ready to roll". Another host's processes (the
    OS is not asked about them)."""
    (path / "journal").mkdir(parents=True)
    (path / "status").mkdir()
    trace = "ab" * 16
    t0 = now - 60 * S

    def write(pid: int, label: str, role: str, lines: list[dict]) -> None:
        head = [
            records.process(t0, pid, 1, "elsewhere", path.name, t0, {}),
            records.identity(t0, label, role, {keys.TP_RANK: pid - 2000} if role == "rank" else {}),
        ]
        with open(path / "journal" / f"elsewhere-{pid}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in head + lines)

    write(
        1000,
        "launcher",
        "launcher",
        [
            records.begin(t0, "1" * 16, None, trace, "sglang.launch", {keys.PHASE: keys.PHASE_LAUNCH_SERVER}, "Main"),
            records.begin(
                now - 30 * S, "2" * 16, "1" * 16, trace, "server.wait_ready", {keys.PHASE: "server.wait_ready"}, "w"
            ),
        ],
    )
    group = "tp:0[0,1]"
    for tp in (0, 1):
        pid, root, fwd = 2000 + tp, f"{tp + 3}" * 16, f"{tp + 5}" * 16
        lines = [
            records.begin(t0, root, "1" * 16, trace, f"rank tp{tp}", {keys.PHASE: keys.PHASE_RANK}, "Main"),
            records.event(now - 40 * S, root, keys.INITIALISED, {}),
            records.begin(
                now - 20 * S,
                fwd,
                root,
                trace,
                keys.PHASE_WARMUP,
                {keys.PHASE: keys.PHASE_WARMUP, keys.FORWARD_MODE: "extend", keys.BATCH_SIZE: 1},
                "Main",
            ),
        ]
        for seq in (1, 2, 3)[: 3 if tp == 0 else 1]:
            lines.append(records.collective(now - 20 * S + seq, "enter", "all_reduce", group, seq, span=fwd))
            if seq < 3:
                lines.append(records.collective(now - 20 * S + seq + 1, "exit", "all_reduce", group, seq, dur_s=0.0))
        for k in range(12):  # blocked: asleep, no CPU, every 2 s
            t = now - 22 * S + k * 2 * S
            lines.append(
                records.heartbeat(
                    t, k, pid, f"tp{tp}", False, 2.0, [], 0.01, 1 << 28, 8, dt_s=2.0, main={"state": "S", "cpu_s": 0.0}
                )
            )
        write(pid, f"tp{tp}", "rank", lines)


def test_a_rank_stuck_in_its_first_warmup_pass_is_named_with_the_pass_and_its_waiting_peer(tmp_path: Path) -> None:
    now = time.time_ns()
    warmup_stall(tmp_path / "run", now)
    run = RunView(tmp_path / "run").refresh()
    tp0, tp1 = run.ranks
    assert tp0.initialised and tp1.initialised and not tp0.ready and not tp1.ready
    found = [f for f in analyze(run, now, Thresholds()) if f.kind == "straggler"]
    assert len(found) == 1 and found[0].label == "tp1" and found[0].phase == keys.PHASE_WARMUP
    assert re.search(
        r"rank tp1 \(pid 2001\) is blocked in 'server\.warmup' \(forward extend, bs 1\) for \d+ s .*: "
        r"tp0 waits in all_reduce #3 on group 'tp:0\[0,1\]'",
        found[0].message,
    ), found[0].message
    lay = layout(run, now)
    states = {lane.label: (lane.state, lane.where.key if lane.where else None) for lane in lay.lanes}
    assert states == {
        "launcher": ("running", "server.wait_ready"),
        "tp0": ("initialised", keys.PHASE_WARMUP),
        "tp1": ("initialised", keys.PHASE_WARMUP),
    }
    assert headline(lay, [])[1].startswith("RUNNING — 2 of 2 ranks initialised, the launch not serving")


def test_a_rank_whose_warmup_pass_raised_is_named_failed_in_it(tmp_path: Path) -> None:
    """SGLang's rank process catches an exception of its scheduler loop and ends, its root (the
    start) still open: the failed pass is where it failed, not 'rank'."""
    now = time.time_ns()
    warmup_stall(tmp_path / "run", now)
    with open(tmp_path / "run" / "journal" / "elsewhere-2000.jsonl", "a") as f:
        error = records.error("AttributeError", "no attribute 'x'")
        f.write(json.dumps(records.end(now - 5 * S, "5" * 16, "error", {}, error)) + "\n")
    with open(tmp_path / "run" / "journal" / "elsewhere-1000.jsonl", "a") as f:
        f.write(json.dumps(records.exit(now - 4 * S, 2000, "elsewhere", "tp0", 1, None)) + "\n")
    run = RunView(tmp_path / "run").refresh()
    (ending,) = postmortem.findings(run, {})
    assert (ending.kind, ending.label, ending.phase) == ("failed", "tp0", keys.PHASE_WARMUP)
    assert "AttributeError: no attribute 'x'" in ending.message and "'server.warmup'" in ending.message


def test_status_timeline_and_exports_say_initialised_and_serving(tmp_path: Path, capsys) -> None:
    now = time.time_ns()
    warmup_stall(tmp_path / "run", now)
    assert main(["status", str(tmp_path / "run"), "--once", "--json"]) in (0, 1, 2, 3)
    rows = {r["label"]: r for r in json.loads(capsys.readouterr().out)["ranks"]}
    assert rows["tp0"]["state"] == "initialised" and rows["tp0"]["phase"] == keys.PHASE_WARMUP
    assert rows["tp1"]["state"] in ("initialised", "stalled") and rows["launcher"]["state"] == "running"
    assert main(["timeline", str(tmp_path / "run"), "--width", "140"]) == 0
    out = capsys.readouterr().out
    assert "initialised, open in server.warmup" in out
    out_file = tmp_path / "jaeger.json"
    assert main(["export", str(tmp_path / "run"), "--format", "jaeger", "-o", str(out_file)]) == 0
    spans = [s for t in json.loads(out_file.read_text())["data"] for s in t["spans"]]
    roots = [s for s in spans if s["operationName"].startswith("rank tp")]
    assert roots and all(
        any(f["value"] == keys.INITIALISED for log in s["logs"] for f in log["fields"]) for s in roots
    ), roots[0]["logs"]
    trace = json.loads(out_file.read_text())["data"][0]
    tagged = {
        p["serviceName"].split()[-1]: {t["key"]: t["value"] for t in p["tags"]} for p in trace["processes"].values()
    }
    assert tagged["tp0"][keys.PROCESS_STATE] == "initialised" and tagged["launcher"][keys.PROCESS_STATE] == "running"
    assert main(["export", str(tmp_path / "run"), "--format", "otlp-json", "-o", str(out_file)]) == 0
    resources = [
        {a["key"]: a["value"] for a in r["resource"]["attributes"]}
        for r in json.loads(out_file.read_text())["resourceSpans"]
    ]
    assert {r[keys.PROCESS_STATE]["stringValue"] for r in resources} == {"running", "initialised"}
    assert main(["export", str(tmp_path / "run"), "--format", "perfetto", "-o", str(out_file)]) == 0
    events = json.loads(out_file.read_text())["traceEvents"]
    assert sorted(e["args"]["labels"] for e in events if e["name"] == "process_labels") == [
        "initialised",
        "initialised",
        "running",
    ]
    page = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "run"), "-o", str(page)]) == 0
    data = re.search(r'<script type="application/json" id="data">(.*?)</script>', page.read_text(), re.S)
    lanes = {lane["label"]: lane for lane in json.loads(data.group(1))["lanes"]}
    assert lanes["tp0"]["state"] == "initialised" and lanes["tp0"]["where"] == keys.PHASE_WARMUP


# -- real SGLang: launch_server tp=2 on CPU ------------------------------------------------------------
# tp1 sleeps at the top of its first ModelRunner.forward (inside our span: this plant is patched
# first, our wrapper wraps it); tp0 then waits in the forward's real all-reduce (gloo).
FORWARD_PLANT = """
import functools, os, time
import wrapt

@wrapt.when_imported("sglang.srt.model_executor.model_runner")
def _plant(module):
    original = module.ModelRunner.forward
    first = []

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        if not first and not self.is_draft_worker:
            from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_rank

            first.append(1)
            if get_tensor_model_parallel_rank() == int(os.environ["PLANT_FORWARD_TP_RANK"]):
                time.sleep(600)  # bounded; the test kills the process group long before
        return original(self, *args, **kwargs)

    module.ModelRunner.forward = forward
"""


class Server:
    """``python -m sglang.launch_server --tp 2`` under the hook, in its own process group."""

    def __init__(self, model: Path, base: Path, env: dict[str, str] | None = None) -> None:
        self.base, self.port = base, free_port()
        self.err = base / "server.err"
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "sglang.launch_server",
                    "--model-path",
                    str(model),
                    "--device",
                    "cpu",
                    "--tp-size",
                    "2",
                    "--max-total-tokens",
                    "4096",
                    "--port",
                    str(self.port),
                ],
                env=hook_env(base, {"SGLANG_PHASETRACE_RUN_DIR": str(base / "run"), **(env or {})}),
                cwd=base,
                stdout=err,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        kill_group(self.proc.pid)
        self.proc.wait(timeout=30)

    def lines(self, prefix: str = "sglang-phasetrace:") -> list[str]:
        return [line for line in self.err.read_text(errors="replace").splitlines() if line.startswith(prefix)]

    def wait_for(self, found, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            value = found()
            if value:
                return value
            time.sleep(0.5)
        raise AssertionError(f"{what}: not within {timeout} s\n{self.err.read_text(errors='replace')[-4000:]}")

    def generate(self) -> dict | None:
        body = json.dumps({"text": "Hello", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/generate", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read()) if response.status == 200 else None
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return None


def rank_statuses(run_dir: Path) -> dict[str, dict]:
    out = {}
    for path in (run_dir / "status").glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if record.get("label", "").startswith("tp"):
            out[record["label"]] = record
    return out


@requires_sglang
@pytest.mark.sglang
def test_a_rank_stuck_in_the_warmup_forward_is_named_within_seconds(tiny_model, tmp_path: Path) -> None:
    """tp1 blocks in its first ModelRunner.forward (the warm-up request's), tp0 waits for it in the
    forward's all-reduce: the launcher names tp1 in 'server.warmup' at the default settings, and
    ``status`` shows both ranks initialised, the launch not serving."""
    plants = tmp_path / "plants"
    plants.mkdir()
    (plants / "sitecustomize.py").write_text(FORWARD_PLANT)
    env = {"PYTHONPATH": os.pathsep.join([str(HOOKS), str(plants)]), "PLANT_FORWARD_TP_RANK": "1"}
    with Server(tiny_model[0], tmp_path, env) as server:
        run_dir = tmp_path / "run"

        def stuck() -> float | None:  # tp1's warm-up pass began (journal time, ns)
            if not (run_dir / "journal").is_dir():
                return None
            run = load_run(run_dir)
            tp1 = [p for p in run.ranks if p.label == "tp1"]
            spans = [s for s in tp1[0].spans.values() if s.phase == keys.PHASE_WARMUP] if tp1 else []
            return spans[0].start if spans else None

        began = server.wait_for(stuck, 240, "tp1's first warm-up pass")
        stall = server.wait_for(
            lambda: [line for line in server.lines() if " STALL " in line and "tp1" in line], 90, "the STALL line"
        )
        said_at = time.time_ns()
        assert len(stall) == 1, stall
        assert "'server.warmup' (forward extend, bs 1)" in stall[0], stall
        assert re.search(r"tp0 waits in all_reduce #\d+ on group 'tp:0\[0,1\]'", stall[0]), stall
        latency = (said_at - began) / S
        print(f"\nwarm-up stall named {latency:.1f} s after tp1's pass began: {stall[0]}")
        assert latency < 30, latency

        assert main(["status", str(run_dir), "--once", "--json"]) != 0
        run = load_run(run_dir)
        tp0, tp1 = sorted(run.ranks, key=lambda p: p.label)
        assert tp0.initialised and tp1.initialised and not tp0.ready and not tp1.ready
        launcher = next(p for p in run.processes if p.role == "launcher")
        assert not launcher.ready and not launcher.serving
        assert "ready to roll" not in server.err.read_text(errors="replace")
        lay = layout(run)
        states = {lane.label: lane.state for lane in lay.lanes if lane.label in ("launcher", "tp0", "tp1")}
        assert states == {"launcher": "running", "tp0": "initialised", "tp1": "initialised"}
        beats = rank_statuses(run_dir)
        assert all(time.time_ns() - beats[tp]["t"] < 10 * S for tp in ("tp0", "tp1")), "still beating"
        assert all(beats[tp]["ready"] is False for tp in ("tp0", "tp1"))


@requires_sglang
@pytest.mark.sglang
def test_a_healthy_launch_server_serves_then_its_ranks_go_quiet(tiny_model, tmp_path: Path) -> None:
    """The warm-up passes are phases of each rank; at "ready to roll" the ranks' starts end
    (``phasetrace.serving``), their heartbeats leave the journal, and requests call no wrapper."""
    with Server(tiny_model[0], tmp_path, {"SGLANG_PHASETRACE_HEARTBEAT_S": "0.5"}) as server:
        run_dir = tmp_path / "run"
        server.wait_for(lambda: "ready to roll" in server.err.read_text(errors="replace"), 240, "ready to roll")

        def served() -> list | None:
            run = load_run(run_dir)  # its journals exist: SGLang said "ready to roll"
            ranks = [p for p in run.ranks]
            return ranks if len(ranks) == 2 and all(p.ready for p in ranks) else None

        server.wait_for(served, 30, "both ranks serving")

        def statuses(fresh_after: int = 0) -> dict[str, dict] | None:
            found = rank_statuses(run_dir)
            ok = len(found) == 2 and all(r["ready"] and r["t"] > fresh_after for r in found.values())
            return found if ok else None

        # a status written after both were found serving: a collective still inside its wrapper as
        # the rank switched (counted when it ends) is in it, not in what the requests are held to
        switched = time.time_ns()
        before = server.wait_for(lambda: statuses(switched), 10, "status files saying ready")
        for _ in range(3):
            assert server.generate() is not None
        asked = time.time_ns()
        after = server.wait_for(lambda: statuses(asked), 10, "fresh heartbeats")
        for label in ("tp0", "tp1"):
            assert after[label].get("runtime_calls", {}) == before[label].get("runtime_calls", {}), label
            assert keys.PHASE_WARMUP not in after[label].get("runtime_calls", {}), label
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=60)

    run = load_run(run_dirs(tmp_path)[0])
    assert run.problems == []
    launcher = next(p for p in run.processes if p.role == "launcher")
    assert launcher.serving and layout(run).lanes[0].state == "serving"
    serve_t = launcher.root.end
    for proc in run.ranks:
        root = proc.root
        assert root.status == "ok" and root.attrs[keys.SERVING] is True, proc.label
        (initialised,) = [e["t"] for e in root.events if e["name"] == keys.INITIALISED]
        passes = [s for s in proc.spans.values() if s.phase == keys.PHASE_WARMUP]
        assert passes and all(initialised < s.start and s.end <= root.end for s in passes), proc.label
        assert (passes[0].attrs[keys.FORWARD_MODE], passes[0].attrs[keys.BATCH_SIZE]) == ("extend", 1)
        assert serve_t <= root.end, "a rank serves once its launch does"
        beats = [hb["t"] for hb in proc.heartbeats]
        assert beats and max(beats) <= root.end + S, "no heartbeat in the journal once serving"
        assert all(s.end is not None and s.end <= root.end + S for s in proc.spans.values()), proc.label


# -- serving is what SGLang does, not what it logs (issue 41.1) ----------------------------------------
def _warmup_call(make_module, status: str | None) -> tuple[Call, object]:
    """A ``_wait_and_warmup`` call in a module shaped like SGLang's HTTP server: its tokenizer
    manager's ``server_status`` (a ``ServerStatus`` member), or a release without one."""
    module = make_module(
        """
        import enum, types
        ServerStatus = enum.Enum("ServerStatus", "Up Starting UnHealthy")
        _global_state = None
        """
    )
    if status is not None:
        module._global_state = types.SimpleNamespace(
            tokenizer_manager=types.SimpleNamespace(server_status=module.ServerStatus[status])
        )
    return Call({}, None, f"{module.__name__}:_wait_and_warmup"), module


@pytest.mark.parametrize(
    ("status", "level", "logged", "ready"),
    [
        ("Up", logging.WARNING, False, True),  # --log-level warning: no "ready to roll" record is made
        ("Up", logging.ERROR, False, True),
        ("Up", logging.INFO, True, True),
        ("Starting", logging.INFO, False, False),  # the warm-up failed (SGLang tears the launch down)
        ("Starting", logging.WARNING, False, "skipped"),  # 0.4.10.post2's --skip-server-warmup: not set Up
        ("UnHealthy", logging.INFO, True, False),  # disaggregated warm-up failed: logged, yet not up
        (None, logging.INFO, True, True),  # 0.4.0-0.4.10: no status; the line
        (None, logging.INFO, False, False),
        (None, logging.WARNING, False, True),  # ... or the return, where the line could not be made
    ],
)
def test_the_server_is_ready_when_sglang_says_it_is_up_at_any_log_level(
    make_module, status: str | None, level: int, logged: bool, ready: bool | str
) -> None:
    call, module = _warmup_call(make_module, status)
    if ready == "skipped":
        call.arguments["server_args"], ready = types.SimpleNamespace(skip_server_warmup=True), True
    logger = logging.getLogger(module.__name__)
    logger.setLevel(level)
    try:
        server_patches._watch_ready(call)
        if logged:
            logger.warning(server_patches.READY_MESSAGE)  # whatever level lets it through here
        report = server_patches._ready_seen(call, None)
    finally:
        logger.setLevel(logging.NOTSET)
    assert report.ready is ready
    assert report.attrs[keys.SERVER_READY] is ready
    assert logger.filters == []
    if status is not None:
        assert report.attrs["sglang.server_status"] == status


def test_a_launch_serves_when_all_its_tokenizer_workers_came_up(tmp_path: Path) -> None:
    """``--tokenizer-worker-num 2``: each worker warms the server up, the launcher never does; the
    launch serves once as many as it starts came up (a worker uvicorn replaced does not count)."""
    from handmade_runs import NOW, Proc
    from sglang_phasetrace.tracing.other_processes import this_host
    from sglang_phasetrace.tracing.verdicts.watchdog import served_by_workers

    run_dir = tmp_path / "run"
    host = this_host()

    def worker(pid: int, up: bool | None, ago: float = 1) -> None:
        proc = Proc(run_dir, pid, "tokenizer", f"tokenizer-{pid}", keys.PHASE_PROCESS, 30, host=host)
        proc.phase(keys.PHASE_WAIT_READY, 20)
        if up is not None:
            span = proc.records[-1]["span"]
            proc.records.append(records.end(NOW - int(ago * S), span, "ok", {keys.SERVER_READY: up}))
        proc.write()

    launcher = Proc(run_dir, 10, "launcher", "launcher", keys.PHASE_LAUNCH_SERVER, 40, host=host)
    launcher.records[-1]["attrs"][keys.TOKENIZER_WORKERS] = 2
    launcher.write()
    first, second, replaced = os.getpid(), os.getppid(), 2**22 + 7  # two running, one gone
    worker(first, True, ago=3)
    assert served_by_workers(load_run(run_dir)) is None  # one of two
    worker(replaced, None)  # died in its start: uvicorn replaced it
    worker(second, None)
    assert served_by_workers(load_run(run_dir)) is None  # one still warms up
    worker(second, True, ago=2)
    assert served_by_workers(load_run(run_dir)) == NOW - 2 * S  # the last one up
    worker(second, False)
    assert served_by_workers(load_run(run_dir)) is None  # one failed: the launch does not serve
