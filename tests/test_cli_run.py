"""``phasetrace run -- <command…>``: the hook and a fresh run directory reach the command, the
status line and summary appear, report and exports are written, the exit code comes back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, SCRIPTS, kill_group
from sglang_phasetrace.tracing.cli import main

# A stand-in launch: records its environment, writes a launcher and two rank journals the way
# traced processes do (phases begin, then end), and exits with the code it is given.
FAKE_LAUNCH = r"""
import json, os, sys, time
from pathlib import Path
run = Path(os.environ["SGLANG_PHASETRACE_RUN_DIR"])
(run / "env.json").write_text(json.dumps({"PYTHONPATH": os.environ.get("PYTHONPATH", "")}))
fail = sys.argv[1] == "fail"
files = {}
def write(pid, record):
    record.setdefault("t", time.time_ns())
    f = files.setdefault(pid, open(run / "journal" / f"h-{pid}.jsonl", "a"))
    f.write(json.dumps(record) + "\n"); f.flush()
(run / "journal").mkdir(parents=True, exist_ok=True)
trace, root = "ab" * 16, "1" * 16
write(1, {"kind": "process", "pid": 1, "host": "h"})
write(1, {"kind": "identity", "label": "launcher", "role": "launcher"})
write(1, {"kind": "begin", "span": root, "parent": None, "trace": trace, "name": "sglang.launch",
          "attrs": {"sglang.phase": "launch.engine"}})
for r in (0, 1):
    pid = 10 + r
    write(pid, {"kind": "process", "pid": pid, "host": "h"})
    write(pid, {"kind": "identity", "label": f"tp{r}", "role": "rank"})
    write(pid, {"kind": "begin", "span": f"{pid:016x}", "parent": root, "trace": trace, "name": f"rank tp{r}",
                "attrs": {"sglang.phase": "rank"}})
    write(pid, {"kind": "begin", "span": f"{pid + 100:016x}", "parent": f"{pid:016x}", "trace": trace,
                "name": "model.load_weights", "attrs": {"sglang.phase": "model.load_weights"}})
time.sleep(1.5)
for r in (0, 1):
    pid, bad = 10 + r, fail and r == 1
    error = {"error": {"type": "RuntimeError", "message": "weights are corrupt"}} if bad else {}
    write(pid, {"kind": "end", "span": f"{pid + 100:016x}", "status": "error" if bad else "ok", **error})
    write(pid, {"kind": "end", "span": f"{pid:016x}", "status": "error" if bad else "ok"})
if not fail:
    write(1, {"kind": "end", "span": root, "status": "ok"})
time.sleep(1.0)
sys.exit(int(sys.argv[2]))
"""


@pytest.fixture
def fake_launch(tmp_path: Path) -> Path:
    script = tmp_path / "fake_launch.py"
    script.write_text(FAKE_LAUNCH)
    return script


def only_run_dir(base: Path) -> Path:
    dirs = [p for p in base.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def test_run_ready(fake_launch: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "runs"
    code = main(["run", "--dir", str(base), "--interval", "0.2", "--", sys.executable, str(fake_launch), "ok", "0"])
    err = capsys.readouterr().err
    run_dir = only_run_dir(base)
    assert code == 0
    env = json.loads((run_dir / "env.json").read_text())
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT / "sitecustomize_hooks")
    assert f"tracing into {run_dir}" in err
    assert "2 ranks: tp0 model.load_weights" in err  # the live line while ranks load
    assert "READY — 2 ranks ready" in err
    for name in ("report.html", "export-jaeger.json", "export-perfetto.json"):
        assert f": {run_dir / name}" in err and (run_dir / name).stat().st_size > 0
    assert json.loads((run_dir / "export-jaeger.json").read_text())["data"][0]["spans"]


def test_run_failure_keeps_exit_code(fake_launch: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "runs"
    code = main(["run", "--dir", str(base), "--interval", "0.2", "--", sys.executable, str(fake_launch), "fail", "3"])
    err = capsys.readouterr().err
    run_dir = only_run_dir(base)
    assert code == 3
    # no process of the run recorded a verdict (no watchdog in this launcher): phasetrace run says it, once,
    # in the watchdog's words, then its table; the root cause at the end (the launcher never got to say it)
    verdict = "sglang-phasetrace: FAILED rank tp1 (pid 11) failed: RuntimeError: weights are corrupt in 'model.load_"
    assert err.count(verdict) == 1 and err.count("sglang-phasetrace:") == 2, err
    assert err.index(verdict) < err.index("phasetrace:   tp1        failed")
    assert "sglang-phasetrace: ROOT CAUSE rank tp1 (pid 11) failed" in err and "FAILED —" not in err
    assert "the command exited with 3" in err
    assert "FAILED rank tp1" in (run_dir / "report.html").read_text()


def test_run_command_that_cannot_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "runs"
    assert main(["run", "--dir", str(base), "--", str(tmp_path / "missing-program")]) == 127
    assert "cannot start" in capsys.readouterr().err and not list(base.iterdir())
    assert main(["run"]) == 2


@pytest.mark.sglang
def test_the_readme_main_job_a_real_traced_start_then_its_timeline(tmp_path: Path) -> None:
    """README command 1 as a user runs it: ``scripts/demo.py`` makes a tiny model, starts
    ``sglang.Engine(tp_size=2)`` through ``phasetrace run``, generates, then prints the run's timeline
    (the newest run directory: the base directory also holds the history database)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_PHASETRACE", "OTEL_", "TRACEPARENT"))}
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "demo.py"), "--dir", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    base = tmp_path / "runs"
    run_dir = only_run_dir(base)
    assert (base / "history.sqlite").is_file()  # the start was remembered
    assert "READY — 2 ranks ready" in done.stderr
    assert {p.name for p in (run_dir / "journal").iterdir()} and (run_dir / "report.html").is_file()
    said = [line.split()[1:3] for line in done.stderr.splitlines() if line.startswith("phasetrace:")]
    assert ["tp0", "ready"] in said and ["tp1", "ready"] in said
    assert f"trace: journal {run_dir / 'journal'}/" in done.stdout
    lanes = {line.split()[0] for line in done.stdout.splitlines() if line.strip()}
    assert {"launcher", "tp0", "tp1", "legend"} <= lanes, done.stdout[-3000:]


# -- phasetrace run never orphans its command, whatever fails inside phasetrace --------------------


def test_run_dir_that_is_a_file_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = tmp_path / "a-file"
    base.write_text("")
    marker = tmp_path / "ran"
    code = main(["run", "--dir", str(base), "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
    err = capsys.readouterr().err
    assert code == 1 and f"cannot create a run directory under {base}" in err and "Traceback" not in err
    assert not marker.exists()


def test_a_crashing_summary_is_said_once_and_the_command_still_waited_for(
    fake_launch: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sglang_phasetrace.tracing.cli import run as run_module

    def summary(*args: object) -> list[str]:
        raise RuntimeError("rendering bug")

    monkeypatch.setattr(run_module, "summary", summary)
    base = tmp_path / "runs"
    tic = time.monotonic()
    code = main(["run", "--dir", str(base), "--interval", "0.2", "--", sys.executable, str(fake_launch), "ok", "5"])
    err = capsys.readouterr().err
    assert code == 5 and time.monotonic() - tic >= 2.5  # the command ran to its own end
    assert err.count("internal error") == 1 and "RuntimeError('rendering bug')" in err, err
    assert "still waiting for the command" in err  # it failed at the ready milestone, 1 s before the exit
    run_dir = only_run_dir(base)
    assert (run_dir / "report.html").stat().st_size > 0  # the files are still written


def test_a_crashing_live_view_stops_but_the_command_runs_to_its_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sglang_phasetrace.tracing.cli import run as run_module

    monkeypatch.setattr(run_module.Run, "look", lambda *a, **k: 1 / 0)
    marker = tmp_path / "done"
    script = f"import time, pathlib; time.sleep(2); pathlib.Path({str(marker)!r}).write_text('x')"
    code = main(["run", "--dir", str(tmp_path / "runs"), "--interval", "0.1", "--", sys.executable, "-c", script])
    err = capsys.readouterr().err
    assert code == 0 and marker.exists()
    assert err.count("internal error in the live status: ZeroDivisionError") == 1, err


SLEEPER = r"""
import os, signal, sys, time
from pathlib import Path
Path(sys.argv[1]).write_text(str(os.getpid()))
time.sleep(120)
"""


def start_run(tmp_path: Path, ignore_hup: bool = False) -> tuple[subprocess.Popen, int]:
    """``phasetrace run`` in its own session (no terminal) over a command that sleeps; returns it and
    the command's pid."""
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    pid_file = tmp_path / "pid"
    # as under nohup, or as a shell starts it: a test runner started under nohup or in the background
    # passes an ignored SIGHUP, SIGINT down, which phasetrace keeps ignoring
    prelude = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"signal.signal(signal.SIGHUP, signal.{'SIG_IGN' if ignore_hup else 'SIG_DFL'}); "
    )
    program = (
        f"{prelude}import sys; from sglang_phasetrace.tracing.cli import main; "
        f"sys.exit(main(['run', '--quiet', '--dir', {str(tmp_path / 'runs')!r}, '--', sys.executable, "
        f"{str(tmp_path / 'sleeper.py')!r}, {str(pid_file)!r}]))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", program],
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc, int(pid_file.read_text())


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_to_phasetrace_run_goes_to_the_command_and_its_status_comes_back(
    tmp_path: Path, sig: signal.Signals
) -> None:
    proc, child = start_run(tmp_path)
    try:
        proc.send_signal(sig)  # to phasetrace only, as `kill PID` or `docker stop` would
        code = proc.wait(timeout=30)
        assert gone(child)
        assert code == 128 + sig, proc.communicate()  # Python dies of an uncaught SIGINT by SIGINT too
    finally:
        kill_group(proc.pid)


def test_an_ignored_hangup_stays_ignored(tmp_path: Path) -> None:
    proc, child = start_run(tmp_path, ignore_hup=True)  # as under nohup
    try:
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert proc.poll() is None and not gone(child)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM and gone(child)
    finally:
        kill_group(proc.pid)
