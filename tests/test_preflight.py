"""``phasetrace preflight``: argument rewriting and the estimate's arithmetic (pure), and real tp=2
``sglang.launch_server`` pre-flights on CPU: one passes on a model whose weight files are garbage,
one with a rank planted to stall in ``attention.init`` is stopped and named well before its deadline.
(EAGLE pre-flights cannot pass on CPU: SGLang 0.5.23 itself fails at draft attention init there.)"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_fixtures import build_run
from conftest import ROOT, free_port, hook_env, kill_group, requires_sglang
from sglang_phasetrace.tracing.cli import main
from sglang_phasetrace.tracing.cli.preflight_plan import NotLaunchServer, estimate, rewrite
from sglang_phasetrace.tracing.reader.load import load_run

LAUNCH = ["python", "-m", "sglang.launch_server", "--model-path", "/m", "--tp", "8"]


def test_rewrite_loads_dummy_weights_and_says_so() -> None:
    out = rewrite(LAUNCH)
    assert out.command == [*LAUNCH, "--load-format", "dummy"]
    assert out.changed == ["added --load-format dummy"] and out.model_path == "/m" and out.draft_path is None
    out = rewrite([*LAUNCH, "--load-format=auto", "--cuda-graph-bs", "1", "2"])
    assert out.command == [*LAUNCH, "--load-format=dummy", "--cuda-graph-bs", "1", "2"]
    assert out.changed == ["--load-format auto → dummy"]


def test_rewrite_makes_the_draft_dummy_too_and_keeps_its_settings() -> None:
    spec = ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "/d", "--speculative-num-steps", "3"]
    out = rewrite([*LAUNCH, *spec, "--load-format", "dummy"])
    assert out.command == [*LAUNCH, *spec, "--load-format", "dummy", "--speculative-draft-load-format", "dummy"]
    assert out.changed == ["added --speculative-draft-load-format dummy"] and out.draft_path == "/d"


def test_shrink_lowers_only_the_kv_pool() -> None:
    big = [*LAUNCH, "--max-total-tokens", "1000000", "--cuda-graph-max-bs", "256", "--mem-fraction-static", "0.9"]
    out = rewrite(big, shrink=True)
    assert out.command == [*big[:-5], "4096", *big[-4:], "--load-format", "dummy"]
    assert out.changed == ["added --load-format dummy", "--max-total-tokens 1000000 → 4096"]
    assert rewrite([*LAUNCH, "--max-total-tokens", "2048"], shrink=True).changed == ["added --load-format dummy"]
    assert "added --max-total-tokens 4096" in rewrite(LAUNCH, shrink=True).changed


def test_sglang_serve_is_rewritten_like_launch_server() -> None:
    out = rewrite(["/venv/bin/sglang", "serve", "--model-path", "/m", "--tp", "2"])
    assert out.command == ["/venv/bin/sglang", "serve", "--model-path", "/m", "--tp", "2", "--load-format", "dummy"]
    assert out.model_path == "/m"
    with pytest.raises(NotLaunchServer):
        rewrite(["sglang", "version"])


def test_other_commands_are_refused_with_what_to_do(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(NotLaunchServer):
        rewrite(["python", "my_engine.py"])
    assert main(["preflight", "--", "python", "my_engine.py"]) == 2
    assert 'load_format="dummy"' in capsys.readouterr().err


def test_estimate_arithmetic_on_a_synthetic_run(tmp_path: Path) -> None:
    built = build_run(tmp_path / "run", ranks=2, spans=40)
    run = load_run(built.path)

    def seconds(phase: str) -> float:  # the slowest rank's total in a phase (these do not nest)
        return max(
            sum((s.end - s.start) / 1e9 for s in p.spans.values() if s.phase == phase and s.end) for p in run.ranks
        )

    est = estimate(run, 680 * 10**9, 1.0e9)
    launcher = next(p for p in run.processes if p.role == "launcher")
    first = min(
        [p.boot_t for p in run.processes if p.boot_t] + [s.start for p in run.processes for s in p.spans.values()]
    )
    assert est.launch_s == pytest.approx((launcher.root.end - first) / 1e9)
    assert est.dummy_weights_s == pytest.approx(seconds("model.load_weights"))  # target + draft
    assert est.graphs_s == pytest.approx(seconds("scheduler.init_cuda_graphs"))  # graph.init inside: not twice
    assert est.rest_s == pytest.approx(est.launch_s - est.dummy_weights_s - est.graphs_s)
    assert est.weights_s == pytest.approx(680.0) and est.total_s == pytest.approx(
        680.0 + est.launch_s - est.dummy_weights_s
    )
    assert (
        est.text() == "expected start ≈ 11 min: weights ≈ 11 min (680 GB at ≈ 1.0 GB/s), graphs ≈ 0 s, the rest ≈ 6 s"
    )
    unknown = estimate(run, None, None)
    assert unknown.total_s is None and unknown.text().startswith(
        "expected start: weights unknown (size unknown, read rate not measured)"
    )


def preflight(
    tmp_path: Path,
    model: Path,
    *flags: str,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    extra: tuple[str, ...] = (),
):
    """``phasetrace preflight FLAGS -- python -m sglang.launch_server`` tp=2 on CPU; (rc, stderr, seconds)."""
    command = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--device", "cpu"]
    command += ["--tp-size", "2", "--max-total-tokens", "8192", "--port", str(free_port()), *extra]
    args = [sys.executable, "-m", "sglang_phasetrace.tracing.cli", "preflight", *flags, "--", *command]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        args, env=hook_env(tmp_path, env, hooks=False), cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # it stops the launch's own process group
        _, err = proc.communicate(timeout=60)
        raise AssertionError(f"timed out after {timeout}s:\n{err[-4000:]}") from None
    finally:
        kill_group(proc.pid)
    return proc.returncode, err, time.monotonic() - t0


def no_server_left(tmp_path: Path) -> None:
    (run_dir,) = [p for p in tmp_path.iterdir() if (p / "journal").is_dir()]
    for proc in load_run(run_dir).processes:
        assert not Path(f"/proc/{proc.pid}").exists() or "sglang" not in Path(f"/proc/{proc.pid}/cmdline").read_text()


def garbage_copy(src: Path, dst: Path) -> Path:
    """A copy of a model directory whose weight files are random bytes: a real load fails on them."""
    shutil.copytree(src, dst)
    for shard in dst.glob("*.safetensors"):
        shard.write_bytes(os.urandom(shard.stat().st_size))
    return dst


@requires_sglang
@pytest.mark.sglang
def test_preflight_passes_on_garbage_weights(tmp_path: Path, tiny_model) -> None:
    model = garbage_copy(tiny_model[0], tmp_path / "model")
    rc, err, _ = preflight(tmp_path, model, "--shrink")
    assert rc == 0, err[-4000:]
    assert "changed: added --load-format dummy; --max-total-tokens 8192 → 4096" in err
    assert re.search(r"expected start ≈ \d+ (s|min): weights ≈ \d+ s \([\d.]+ MB at ≈ [\d.]+ GB/s\)", err), err[-2000:]
    assert "PASSED after" in err and "ready; stopped it" in err
    no_server_left(tmp_path)


@requires_sglang
@pytest.mark.sglang
def test_preflight_stops_at_a_planted_stall_naming_rank_and_phase(tmp_path: Path, tiny_model) -> None:
    env = {
        "PYTHONPATH": str(ROOT / "tests" / "plants"),
        "PLANT_STALL_PHASE_TP_RANK": "1",
        "SGLANG_PHASETRACE_STALL_S": "5",
    }
    rc, err, took = preflight(tmp_path, tiny_model[0], "--deadline", "400", "--no-read-rate", env=env)
    assert rc == 3, err[-4000:]
    assert "sglang-phasetrace: STALL rank tp1" in err and "tp0 waits in barrier" in err
    assert "NOT READY: STALLED tp1 in 'attention.init'" in err
    assert took < 200  # at the verdict, not at the deadline
    no_server_left(tmp_path)


@requires_sglang
@pytest.mark.sglang
def test_preflight_not_ready_at_its_deadline_says_where_each_rank_is(tmp_path: Path, tiny_model) -> None:
    """tp1 held in 'attention.init' with every verdict threshold past the deadline: the launch is not
    ready at 60 s (a fast machine is ready in 25 s, a loaded one has its ranks by then)."""
    quiet = {f"SGLANG_PHASETRACE_{name}_S": "3600" for name in ("STALL", "BLOCKED", "SILENT", "NO_PROGRESS")}
    env = {"PYTHONPATH": str(ROOT / "tests" / "plants"), "PLANT_STALL_PHASE_TP_RANK": "1", **quiet}
    rc, err, took = preflight(tmp_path, tiny_model[0], "--deadline", "60", "--no-read-rate", env=env)
    assert rc == 3, err[-4000:]
    assert re.search(r"NOT READY after 60 s: \d+ (rank|process)", err), err[-2000:]
    assert "NOT READY: deadline of 60 s passed" in err and took < 140
    no_server_left(tmp_path)


@requires_sglang
@pytest.mark.sglang
def test_preflight_with_eagle_loads_a_dummy_draft_and_reports_sglangs_cpu_failure(tmp_path: Path, tiny_model) -> None:
    """EAGLE cannot pass on CPU: SGLang 0.5.23 raises in the draft's attention init (torch_native
    has no EAGLE). That is after both weight loads, so reaching it on garbage target *and* draft
    weights shows the draft was dummy too; the pre-flight names the failure and exits 4."""
    model = garbage_copy(tiny_model[0], tmp_path / "model")
    draft = garbage_copy(tiny_model[1], tmp_path / "draft")
    spec = ("--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", str(draft))
    spec += ("--speculative-num-steps", "2", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3")
    rc, err, _ = preflight(tmp_path, model, "--no-read-rate", extra=spec)
    assert rc == 4, err[-4000:]
    assert "changed: added --load-format dummy; added --speculative-draft-load-format dummy" in err
    assert "EAGLE is not supported in decode attention backend torch_native" in err
    assert re.search(r"NOT READY: FAILED tp\d in 'eagle.draft_attention_init'", err), err[-3000:]
    no_server_left(tmp_path)
