"""The verdict first, said once (issue 11.4 and one voice).

The report's first line is the verdict in the watchdog's words; the culprit's stack is shown where
a dump exists. Jaeger, OTLP JSON and Perfetto flag the culprit's phase (that rank only) so it is
seen without expanding anything; the peers waiting for it are not errors. ``phasetrace run`` prints
a verdict only when no process of the run recorded it, and says DIED / ROOT CAUSE itself when the
launcher was killed before its last words. ``phasetrace status`` names died / not-started ranks.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_fixtures import FAIL_MESSAGE, HOST, STALL_PHASE, build_run
from conftest import CPU_ENV, dist_ranks, kill_group, requires_sglang
from opentelemetry.trace import StatusCode
from sglang_phasetrace.tracing.cli import main
from sglang_phasetrace.tracing.journal import records
from sglang_phasetrace.tracing.reader.load import load_run
from sglang_phasetrace.tracing.render.lanes import layout
from sglang_phasetrace.tracing.render.otlp_spans import to_sdk_spans
from sglang_phasetrace.tracing.render.run_text import status_line
from sglang_phasetrace.tracing.verdicts.findings import by_process, findings

S = 1_000_000_000
VERDICT = f"STALL tp1 has been in {STALL_PHASE} for 85 s while 2 peers wait in dist.group_coordinator"


def end_open_phases(journal: Path, t: int, status: str, error: dict | None = None) -> None:
    """End every phase the journal left open, as a process's exit does (no traceback)."""
    lines = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
    ended = {r["span"] for r in lines if r["kind"] == "end"}
    opened = [r["span"] for r in lines if r["kind"] == "begin" and r["span"] not in ended]
    with journal.open("a") as f:
        for span in reversed(opened):
            f.write(json.dumps(records.end(t, span, status, {}, error)) + "\n")


def export(run_dir: Path, fmt: str, tmp_path: Path) -> dict:
    out = tmp_path / f"{fmt}.json"
    assert main(["export", str(run_dir), "--format", fmt, "-o", str(out)]) == 0
    return json.loads(out.read_text())


def test_report_opens_with_the_verdict_and_shows_the_culprits_stack(tmp_path: Path, capsys) -> None:
    run = build_run(tmp_path / "run", ranks=3, spans=30, stalled_rank=1)
    # the launch was then torn down: tp1's phases ended "incomplete" by a signal, without a traceback
    end_open_phases(
        run.path / "journal" / f"{HOST}-{run.pids['tp1']}.jsonl",
        time.time_ns(),
        "incomplete",
        records.error("Signal", "process received SIGTERM"),
    )
    out = tmp_path / "r.html"
    assert main(["report", str(run.path), "-o", str(out)]) == 0
    html = out.read_text()
    body = html.split("<body>", 1)[1]
    assert body.lstrip().startswith(f'<div id="verdict" class="verdict stalled">{VERDICT}'), body[:300]
    assert "INCOMPLETE —" not in html  # the teardown is not the verdict
    finding = html[html.index('<div class="finding" data-rank="tp1"') :]
    finding = finding[: finding.index("</div>")]
    assert '<details class="stack" open data-rank="tp1">' in finding and "init_distributed_environment" in finding
    assert "(no stack recorded)" not in html  # the error row shows the dump instead
    error = html[html.index('<details class="error" open data-rank="tp1">') :]
    assert "init_distributed_environment" in error[: error.index("</details>")]


def test_exports_flag_the_culprits_phase_only(tmp_path: Path, capsys) -> None:
    run = build_run(tmp_path / "run", ranks=3, spans=30, stalled_rank=1)
    line = VERDICT

    jaeger = export(run.path, "jaeger", tmp_path)["data"]
    spans = [s for trace in jaeger for s in trace["spans"]]
    services = {pid: p["serviceName"] for trace in jaeger for pid, p in trace["processes"].items()}

    def tags(span: dict) -> dict:
        return {t["key"]: t["value"] for t in span["tags"]}

    [culprit] = [s for s in spans if "phasetrace.verdict" in tags(s)]
    assert culprit["operationName"] == STALL_PHASE and services[culprit["processID"]].endswith(" tp1")
    assert tags(culprit)["error"] is True and tags(culprit)["phasetrace.verdict"] == line
    assert tags(culprit)["otel.status_code"] == "ERROR" and culprit["warnings"][0] == line
    assert [s for s in spans if tags(s).get("error")] == [culprit]  # waiting peers are not errors
    waiting = {
        services[s["processID"]].split()[-1]: tags(s)["phasetrace.waiting_for"]
        for s in spans
        if "phasetrace.waiting_for" in tags(s)
    }
    assert set(waiting) == {"tp0", "tp2"} and all(w.startswith("tp1 (") for w in waiting.values())

    otlp = export(run.path, "otlp-json", tmp_path)
    by_status = [
        (rs["resource"], s)
        for rs in otlp["resourceSpans"]
        for s in rs["scopeSpans"][0]["spans"]
        if s["status"]["code"] == 2
    ]
    [(resource, span)] = by_status
    assert span["name"] == STALL_PHASE and span["status"]["message"] == line
    assert {"key": "sglang.rank", "value": {"stringValue": "tp1"}} in resource["attributes"]
    assert {"key": "phasetrace.verdict", "value": {"stringValue": line}} in span["attributes"]

    perfetto = export(run.path, "perfetto", tmp_path)
    events = perfetto["traceEvents"]
    flagged = [e for e in events if e["ph"] in ("B", "X") and e["name"].startswith("\u26a0")]
    assert [e["name"] for e in flagged] == [f"\u26a0 STALL {STALL_PHASE}"] and flagged[0]["ph"] == "B"
    assert flagged[0]["args"]["phasetrace.verdict"] == line and flagged[0]["cat"].startswith("phasetrace.verdict")
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names[flagged[0]["pid"]].startswith("\u26a0 STALL tp1 ")
    assert sum(n.startswith("\u26a0") for n in names.values()) == 1
    assert {
        e["args"]["phasetrace.waiting_for"].split()[0] for e in events if "phasetrace.waiting_for" in e.get("args", {})
    } == {"tp1"}
    assert perfetto["otherData"]["verdict"] == line

    view = load_run(run.path)
    lay = layout(view)
    errors = [s for s in to_sdk_spans(lay, findings(view, lay.end)) if s.status.status_code is StatusCode.ERROR]
    assert [(s.name, s.status.description) for s in errors] == [(STALL_PHASE, line)]


def test_a_failed_rank_is_flagged_where_it_failed(tmp_path: Path, capsys) -> None:
    run = build_run(tmp_path / "run", ranks=2, spans=30, failed_rank=1)
    spans = [s for trace in export(run.path, "jaeger", tmp_path)["data"] for s in trace["spans"]]
    flagged = [s for s in spans if any(t["key"] == "phasetrace.verdict" for t in s["tags"])]
    assert [s["operationName"] for s in flagged] == ["model.load_weights"]
    verdict = next(t["value"] for t in flagged[0]["tags"] if t["key"] == "phasetrace.verdict")
    assert verdict.startswith(f"FAILED rank tp1 (pid {run.pids['tp1']}) failed: RuntimeError: {FAIL_MESSAGE}")


def test_status_names_dead_and_never_started_ranks(tmp_path: Path, capsys) -> None:
    """tp1 was SIGKILLed in its stalled phase (the launcher recorded how), tp3 never reached its
    first phase: ``died`` and ``not started``, not ``running``; tp1's death is the first verdict."""
    run = build_run(tmp_path / "run", ranks=3, spans=30, stalled_rank=1)
    launcher = run.path / "journal" / f"{HOST}-{run.pids['launcher']}.jsonl"
    kept = [line for line in launcher.read_text().splitlines() if '"diagnosis"' not in line]
    now = time.time_ns()
    kept.append(json.dumps(records.exit(now - 80 * S, run.pids["tp1"], HOST, "tp1", None, "SIGKILL")))
    launcher.write_text("\n".join(kept) + "\n")
    late = run.path / "journal" / f"{HOST}-2003.jsonl"
    late.write_text(
        "\n".join(
            json.dumps(r)
            for r in (
                records.process(now - 60 * S, 2003, 1000, HOST, run.path.name, now - 60 * S, {}),
                records.identity(now - 60 * S, "tp3", "rank", {"sglang.tp_rank": 3}),
            )
        )
        + "\n"
    )
    code = main(["status", str(run.path), "--json"])
    doc = json.loads(capsys.readouterr().out)
    ranks = {r["label"]: r for r in doc["ranks"]}
    assert code == 4, doc["findings"]
    assert ranks["tp1"]["state"] == "died" and ranks["tp1"]["phase"] == STALL_PHASE
    assert ranks["tp1"]["verdict"].startswith("died: rank tp1 (pid 2001) was killed by SIGKILL")
    assert ranks["tp3"]["state"] == "not started"
    assert doc["findings"][0]["label"] == "tp1"
    view = load_run(run.path)
    lay = layout(view, now)
    line = status_line(lay, by_process(view, findings(view, now)))
    assert "DIED: tp1" in line and "NOT STARTED: tp3" in line and "STALLED" not in line


# -- phasetrace run: one voice ------------------------------------------------------------------------------

# A launcher of this host with one real rank process (tp1) that it SIGKILLs in 'model.loader'. "recorded":
# its watchdog says DIED and ROOT CAUSE (printed and recorded as a launcher's would be) and it exits after
# its last words. "killed": the launcher is itself SIGKILLed before saying anything.
VOICE = r"""
import json, os, signal, socket, subprocess, sys, time
from pathlib import Path
from sglang_phasetrace.tracing.journal import records
run = Path(os.environ["SGLANG_PHASETRACE_RUN_DIR"])
(run / "journal").mkdir(parents=True, exist_ok=True)
host, me, mode = socket.gethostname(), os.getpid(), sys.argv[1]
files = {}
def write(pid, record):
    f = files.setdefault(pid, open(run / "journal" / f"{host}-{pid}.jsonl", "a"))
    f.write(json.dumps(record) + "\n"); f.flush()
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
now, trace, root = time.time_ns, "ab" * 16, "1" * 16
write(me, records.process(now(), me, None, host, run.name, None, {}))
write(me, records.identity(now(), "launcher", "launcher", {}))
write(me, records.begin(now(), root, None, trace, "sglang.launch", {"sglang.phase": "launch.engine"}, "MainThread"))
write(rank.pid, records.process(now(), rank.pid, None, host, run.name, None, {}))
write(rank.pid, records.identity(now(), "tp1", "rank", {}))
write(rank.pid, records.begin(now(), "2" * 16, root, trace, "rank tp1", {"sglang.phase": "rank"}, "MainThread"))
write(rank.pid, records.begin(now(), "3" * 16, "2" * 16, trace, "model.loader", {"sglang.phase": "model.loader"},
                              "MainThread"))
time.sleep(1.5)
rank.kill(); rank.wait()
time.sleep(1.0)  # phasetrace run sees the rank gone while this launcher still runs
if mode == "killed":
    os.kill(me, signal.SIGKILL)
message = f"rank tp1 (pid {rank.pid}) was killed by SIGKILL (likely the OOM killer) in 'model.loader' after 2 s"
print(f"sglang-phasetrace: DIED {message}", file=sys.stderr, flush=True)
write(me, records.exit(now(), rank.pid, host, "tp1", None, "SIGKILL"))
write(me, records.diagnosis(now(), "died", "tp1", rank.pid, "model.loader", 2.0, message, {}, []))
print(f"sglang-phasetrace: ROOT CAUSE {message}", file=sys.stderr, flush=True)
write(me, records.end(now(), root, "incomplete", {}, records.error(None, "process exited")))
time.sleep(1.0)
sys.exit(1)
"""


@pytest.fixture
def voice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for key in [k for k in os.environ if k.startswith("SGLANG_PHASETRACE")]:
        monkeypatch.delenv(key)
    script = tmp_path / "voice.py"
    script.write_text(VOICE)
    return script


def run_voice(script: Path, mode: str, base: Path, capfd) -> tuple[int, str]:
    """``phasetrace run`` over the stand-in; its stderr and the launcher's, as a terminal shows them."""
    code = main(["run", "--dir", str(base), "--interval", "0.2", "--", sys.executable, str(script), mode])
    return code, capfd.readouterr().err


def test_run_repeats_no_verdict_the_launcher_said(voice: Path, tmp_path: Path, capfd) -> None:
    code, err = run_voice(voice, "recorded", tmp_path / "runs", capfd)
    assert code == 1
    assert err.count("sglang-phasetrace:") == 2, err  # the launcher's DIED and ROOT CAUSE, nothing of ours
    assert err.count("DIED rank tp1") == 1 and err.count("ROOT CAUSE") == 1
    died = err.index("sglang-phasetrace: DIED rank tp1")
    assert died < err.index("phasetrace:   tp1        died"), err  # the verdict first, the table after
    assert "STALLED" not in err and "FAILED —" not in err


def test_run_says_what_a_killed_launcher_could_not(voice: Path, tmp_path: Path, capfd) -> None:
    code, err = run_voice(voice, "killed", tmp_path / "runs", capfd)
    assert code == 128 + signal.SIGKILL
    lines = [line for line in err.splitlines() if line.startswith("sglang-phasetrace:")]
    assert len(lines) == 2, err
    assert re.match(
        r"sglang-phasetrace: DIED rank tp1 \(pid \d+\) is gone .* in 'model.loader' after \d+ s$", lines[0]
    ), lines
    assert lines[1].startswith("sglang-phasetrace: ROOT CAUSE rank tp1 (pid ")
    assert err.index(lines[1]) < err.index("the command was killed by SIGKILL (exit status 137)")


# -- a real stalled start ----------------------------------------------------------------------------------


@requires_sglang
@pytest.mark.sglang
def test_real_stall_under_phasetrace_run_said_once_and_flagged(tmp_path: Path, tiny_model) -> None:
    """Real SGLang distributed init on gloo, rank1 blocked before its model-parallel groups, under
    ``phasetrace run`` at the default thresholds: one STALL line, the report opens with it, the
    Jaeger export marks rank1's phase as the error and rank0's as waiting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_PHASETRACE", "OTEL_", "TRACEPARENT"))}
    env.update(CPU_ENV)
    cli = "import sys; from sglang_phasetrace.tracing.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            cli,
            "run",
            "--quiet",
            "--dir",
            str(tmp_path / "runs"),
            "--",
            sys.executable,
            *dist_ranks(tiny_model[0], 2, "sleep", 1),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not any(line.startswith("phasetrace: perfetto:") for line in seen):
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line.rstrip("\n"))
    finally:
        kill_group(proc.pid)
        proc.communicate(timeout=30)
    said = [line for line in seen if line.startswith("sglang-phasetrace:")]
    assert len(said) == 1 and said[0].startswith("sglang-phasetrace: STALL rank rank1 (pid "), "\n".join(seen)
    assert " is blocked in 'dist.init' for " in said[0] and "rank0 waits in " in said[0]
    assert not any("STALLED —" in line for line in seen)
    run_dir = next((tmp_path / "runs").iterdir())
    body = (run_dir / "report.html").read_text().split("<body>", 1)[1]
    assert body.lstrip().startswith('<div id="verdict" class="verdict stalled">STALL rank rank1 (pid ')
    spans = [s for t in json.loads((run_dir / "export-jaeger.json").read_text())["data"] for s in t["spans"]]
    tags = [{t["key"]: t["value"] for t in s["tags"]} for s in spans]
    errors = [(s["operationName"], t.get("sglang.rank")) for s, t in zip(spans, tags, strict=True) if t.get("error")]
    assert len(errors) == 1 and errors[0][0] == "dist.init", errors
    assert any(t.get("phasetrace.waiting_for", "").startswith("rank1 (") for t in tags)
