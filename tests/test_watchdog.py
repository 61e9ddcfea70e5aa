"""Planted stalls in real SGLang init, and what the heartbeats + watchdog report.

Each test plants a real stall (a rank that blocks at a known place), runs the watchdog the way a
user would (in-process over the run directory, as ``phasetrace watch`` does, or inside the
launching process), and asserts the diagnosis: which rank, which phase, who waits in what, and
the stack of the stalled rank. Bounded in time; process groups are killed at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, dist_ranks, hook_env, requires_sglang
from otlp_receiver import OtlpReceiver
from sglang_phasetrace.tracing.cli import main as cli_main
from sglang_phasetrace.tracing.cli.command import EXIT_STALLED
from sglang_phasetrace.tracing.reader.load import load_run
from sglang_phasetrace.tracing.verdicts.diagnose import Thresholds
from sglang_phasetrace.tracing.verdicts.watchdog import Watchdog

pytestmark = [requires_sglang, pytest.mark.sglang]
HB = 1.0


class Launched:
    """A program started under the hook in its own process group, killed on exit."""

    def __init__(self, args: list[str], run_dir: Path, env: dict[str, str] | None = None) -> None:
        self.run_dir = run_dir
        full_env = hook_env(
            run_dir.parent,
            {"SGLANG_PHASETRACE_RUN_DIR": str(run_dir), "SGLANG_PHASETRACE_HEARTBEAT_S": str(HB), **(env or {})},
        )
        self.proc = subprocess.Popen(
            [sys.executable, *args],
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def __enter__(self) -> Launched:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def kill(self) -> tuple[str, str]:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return self.proc.communicate(timeout=30)


def watch_until_finding(run_dir: Path, thresholds: Thresholds, timeout: float) -> tuple[list, float]:
    dog = Watchdog(run_dir, thresholds, out=sys.stderr, py_spy=False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = dog.step() if (run_dir / "journal").is_dir() else []
        if found:
            return found, time.time()
        time.sleep(HB / 2)
    raise AssertionError(f"no finding within {timeout} s")


def dog_step(run_dir: Path, th: Thresholds) -> list:
    return Watchdog(run_dir, th, out=sys.stderr, py_spy=False).step()


def _rank(run_dir: Path, world_rank: int):
    return next(p for p in load_run(run_dir).processes if p.identity.get("sglang.world_rank") == world_rank)


def test_straggler_before_model_parallel_groups_named_with_waiters_and_stack(tmp_path: Path, tiny_model) -> None:
    run_dir = tmp_path / "run"
    th = Thresholds(heartbeat_s=HB, silent_s=30, stall_s=6, no_progress_s=300)
    args = dist_ranks(tiny_model[0], 4, "sleep", 2)
    with Launched(args, run_dir) as launched:
        found, found_at = watch_until_finding(run_dir, th, timeout=180)
        finding = next(f for f in found if f.kind == "straggler")
        straggler = _rank(run_dir, 2)

        assert finding.label == straggler.label == "rank2" and finding.pid == straggler.pid
        assert finding.phase == "dist.init"
        assert set(finding.waiting) == {"rank0", "rank1", "rank3"}
        assert all("new_group" in text and "'WORLD'" in text for text in finding.waiting.values())
        # within 2 heartbeat intervals after the rule's threshold (+1 s for the poll itself)
        stalled_since = straggler.last_progress_t / 1e9
        assert found_at - stalled_since <= th.stall_s + 2 * HB + 1.0, found_at - stalled_since
        stack = Path(finding.stacks[0]).read_text()
        assert "dist_ranks.py" in stack and "in block" in stack and "in planted" in stack

        # the stalled phase is begun and not ended; SIGTERM ends the rank at once (no handler of
        # ours), the phase stays begun-not-ended, and the watchdog names it gone there
        dist_init = next(s for s in straggler.spans.values() if s.phase == "dist.init")
        assert dist_init.status == "open"
        os.kill(straggler.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        gone: list = []
        while time.monotonic() < deadline and not gone:
            gone = [f for f in dog_step(run_dir, th) if f.kind == "died" and f.pid == straggler.pid]
            time.sleep(0.2)
        assert gone and gone[0].phase == "dist.init", gone
        assert _rank(run_dir, 2).spans[dist_init.span_id].status == "open"
        launched.kill()
    diagnosis_free = [p for p in load_run(run_dir).processes if p.diagnoses]
    assert not diagnosis_free  # the in-process watchdog here records nothing into rank journals


def test_blocked_rank_named_within_15_s_at_the_default_settings(tmp_path: Path, tiny_model) -> None:
    """Nothing set (no SGLANG_PHASETRACE_*_S anywhere): the ranks beat at the default interval and the
    watchdog passes at it, as in a launcher; the line says what the rank is doing."""
    run_dir = tmp_path / "run"
    th = Thresholds()
    env = hook_env(run_dir.parent, {"SGLANG_PHASETRACE_RUN_DIR": str(run_dir)})
    proc = subprocess.Popen(
        [sys.executable, *dist_ranks(tiny_model[0], 2, "sleep", 1)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        dog = Watchdog(run_dir, th, out=sys.stderr, py_spy=False)
        deadline, found = time.monotonic() + 180, []
        while not found and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(th.heartbeat_s)
            found = dog.step() if (run_dir / "journal").is_dir() else []
        found_at = time.time()
        assert found, proc.stderr.read()[-3000:] if proc.poll() is not None else "no finding in 180 s"
        [finding] = found
        stalled = _rank(run_dir, 1)
        assert (finding.kind, finding.label, finding.pid) == ("straggler", "rank1", stalled.pid)
        assert found_at - stalled.last_progress_t / 1e9 <= 15, found_at - stalled.last_progress_t / 1e9
        assert finding.message.startswith("rank rank1 (pid ") and " is blocked in 'dist.init' for " in finding.message
        assert "% CPU, sleeping" in finding.message and "rank0 waits in new_group" in finding.message
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)


def test_rank_holding_the_gil_in_c_is_named_silent_with_stack_from_outside(tmp_path: Path, tiny_model) -> None:
    """Watched by the standalone command, ``phasetrace watch RUN_DIR``."""
    run_dir = tmp_path / "run"
    args = dist_ranks(tiny_model[0], 2, "gil", 1)
    with Launched(args, run_dir):
        deadline = time.monotonic() + 120
        while not (run_dir / "journal").is_dir() and time.monotonic() < deadline:
            time.sleep(0.5)
        code = cli_main(
            [
                "watch",
                str(run_dir),
                "--interval",
                str(HB),
                "--silent-after",
                "4",
                "--stall-s",
                "120",
                "--exit-on-stall",
                "--timeout",
                "180",
                "--no-py-spy",
            ]
        )
        assert code == EXIT_STALLED
        silent = _rank(run_dir, 1)
        [watcher] = [p for p in load_run(run_dir).processes if p.role == "watchdog"]
        [diagnosis] = watcher.diagnoses
        assert diagnosis["finding"] == "silent" and diagnosis["label"] == "rank1" and diagnosis["pid"] == silent.pid
        assert "no heartbeat" in diagnosis["message"] and "dist.init" in diagnosis["message"]
        stack = Path(diagnosis["stacks"][0]).read_text()
        assert "in block" in stack and "dist_ranks.py" in stack  # dumped while the GIL was held


def test_slow_phase_that_keeps_making_progress_is_not_reported(tmp_path: Path, tiny_model) -> None:
    run_dir = tmp_path / "run"
    th = Thresholds(heartbeat_s=HB, silent_s=10, stall_s=3, no_progress_s=3)
    args = dist_ranks(tiny_model[0], 2, "slow", 1)
    with Launched(args, run_dir) as launched:
        dog = Watchdog(run_dir, th, out=sys.stderr, py_spy=False)
        findings = []
        while launched.proc.poll() is None:
            if (run_dir / "journal").is_dir():
                findings += dog.step()
            time.sleep(HB / 2)
        _, err = launched.kill()
    assert launched.proc.returncode == 0, err[-3000:]
    assert [f for f in findings if f.alarm] == []  # not an alarm (an estimate, where notices are shown)
    slow = _rank(run_dir, 1)
    loads = [s for s in slow.spans.values() if s.phase == "model.weights_iterator"]
    assert loads and loads[0].duration_ns() / 1e9 > th.stall_s  # it was slow: longer than the threshold
    assert any(hb.get("phases") and any(p.get("progress") for p in hb["phases"]) for hb in slow.heartbeats)


def test_eagle_rank_blocked_in_get_embed_and_head_named_by_launcher_watchdog(tmp_path: Path, tiny_model) -> None:
    """Real sglang.Engine tp=2 with an EAGLE draft; the in-launcher watchdog does the naming, and
    exports the in-flight phases so the stalled one shows in Jaeger (here: an OTLP receiver)."""
    target, draft = tiny_model
    run_dir = tmp_path / "run"
    args = [str(ROOT / "scripts" / "start_engine.py"), str(target), "--tp", "2", "--draft", str(draft)]
    with OtlpReceiver("grpc") as receiver:
        env = {
            "PYTHONPATH": os.pathsep.join([str(ROOT / "sitecustomize_hooks"), str(ROOT / "tests" / "plants")]),
            "PLANT_STALL_TP_RANK": "1",
            "SGLANG_PHASETRACE_STALL_S": "5",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        }
        with Launched(args, run_dir, env) as launched:
            deadline = time.monotonic() + 240
            diagnosis = None
            while diagnosis is None and time.monotonic() < deadline and launched.proc.poll() is None:
                time.sleep(1)
                if (run_dir / "journal").is_dir():
                    launcher = next((p for p in load_run(run_dir).processes if p.role == "launcher"), None)
                    diagnosis = launcher.diagnoses[0] if launcher and launcher.diagnoses else None
            snapshots: list = []
            until = time.monotonic() + 20  # the export follows the diagnosis record
            while diagnosis is not None and not snapshots and time.monotonic() < until:
                time.sleep(0.5)
                snapshots = [s for s in receiver.spans if s.attrs.get("phasetrace.snapshot")]
            _, err = launched.kill()
    assert diagnosis is not None, err[-4000:]
    assert diagnosis["finding"] == "straggler" and diagnosis["label"] == "tp1"
    assert diagnosis["phase"] == "eagle.get_embed_and_head"
    assert "barrier" in diagnosis["waiting"]["tp0"] and "tp:0[0,1]" in diagnosis["waiting"]["tp0"]
    assert "sglang-phasetrace: STALL rank tp1" in err  # the one line on the launcher's stderr
    stack = Path(diagnosis["stacks"][0]).read_text()
    assert "get_embed_and_head (sitecustomize.py:" in stack  # the planted frame, as py-spy names it
    tp0 = next(p for p in load_run(run_dir).ranks if p.label == "tp0")
    assert tp0.current.phase == "eagle.get_embed_and_head"  # rank 0's state: waiting inside the phase
    stalled = [s for s in snapshots if s.name == "eagle.get_embed_and_head" and s.attrs.get("sglang.tp_rank") == 1]
    assert stalled and stalled[0].status == 2 and stalled[0].attrs["phasetrace.incomplete"] is True
    assert stalled[0].resource.get("sglang.tp_rank") == 1  # shown as rank 1's span, in rank 1's trace
