"""Tracing through SGLang's own plugin entry point: the package installed, ``SGLANG_PHASETRACE=1``,
no PYTHONPATH hook. Real ``sglang.Engine`` tp=2 with an EAGLE draft on CPU (SGLang 0.5.23 loads
plugins in the launcher and at the top of every rank process).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HOOKS, ROOT, SCRIPTS, hook_env, kill_group, requires_sglang
from sglang_phasetrace.tracing.reader.load import load_run

pytestmark = [requires_sglang, pytest.mark.sglang]
PLANTS = ROOT / "tests" / "plants"


def _start(tiny_model, tmp_path: Path, extra: dict[str, str], draft: bool = True) -> tuple[subprocess.Popen, Path]:
    err = tmp_path / "stderr.txt"
    env = hook_env(tmp_path, {"SGLANG_PHASETRACE_RUN_DIR": str(tmp_path / "run"), **extra}, hooks=False)
    assert str(HOOKS) not in env.get("PYTHONPATH", "")
    with open(err, "w") as f:
        args = [sys.executable, str(SCRIPTS / "start_engine.py"), str(tiny_model[0]), "--tp", "2"]
        args += ["--draft", str(tiny_model[1])] if draft else []  # EAGLE on CPU ends in SGLang's own error
        proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=f, start_new_session=True)
    return proc, err


def test_plugin_names_a_planted_stall_without_pythonpath(tiny_model, tmp_path: Path) -> None:
    proc, err = _start(
        tiny_model, tmp_path, {"SGLANG_PHASETRACE": "1", "PLANT_STALL_TP_RANK": "1", "PYTHONPATH": str(PLANTS)}
    )  # the plant only: not our hook
    try:
        deadline = time.monotonic() + 240
        lines: list[str] = []
        while time.monotonic() < deadline and not lines and proc.poll() is None:
            time.sleep(1)
            lines = [line for line in err.read_text().splitlines() if "sglang-phasetrace: STALL rank tp1" in line]
    finally:
        kill_group(proc.pid)
        proc.wait(30)
    assert lines, err.read_text()[-4000:]
    assert "eagle.get_embed_and_head" in lines[0]
    run = load_run(tmp_path / "run")
    assert sorted(p.label for p in run.ranks) == ["tp0", "tp1"]
    launcher = next(p for p in run.processes if p.role == "launcher")
    assert launcher.root is not None and launcher.root.phase == "launch.engine"
    assert {p.root.trace_id for p in run.ranks} == {launcher.root.trace_id}  # one trace


def test_plugin_is_off_unless_asked(tiny_model, tmp_path: Path) -> None:
    """An image that merely contains the package writes nothing."""
    proc, err = _start(tiny_model, tmp_path, {}, draft=False)
    try:
        proc.wait(240)
    finally:
        kill_group(proc.pid)
    assert proc.returncode == 0, err.read_text()[-3000:]
    assert not (tmp_path / "run").exists() and "sglang-phasetrace" not in err.read_text()
    assert os.listdir(tmp_path) == ["stderr.txt"]
