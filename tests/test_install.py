"""A real install: the built wheel in a fresh virtual environment that already has SGLang.

The fresh venv sees this venv's packages (SGLang, torch, OTel…) as a second site directory, but
not its editable install of this project: ``sglang_phasetrace`` comes only from the wheel. Then a
user's path: ``phasetrace env`` gives the PYTHONPATH line, and a real SGLang program started with
it is traced. The metadata is checked as packaging users would (``twine check``).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import CPU_ENV, ROOT, free_port, requires_sglang

pytestmark = [requires_sglang, pytest.mark.sglang]
SITE = Path(sysconfig.get_paths()["purelib"])


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (path,) = out.glob("sglang_phasetrace-*.whl")
    return path


@pytest.fixture(scope="module")
def fresh_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # SGLang and the rest from this venv (a path entry, so its editable install of us is not seen);
    # the CPU-only stand-ins this test machine needs to import SGLang at all (scripts/cpu_env).
    (site / "zz_sglang_env.pth").write_text(
        f"{SITE}\n{ROOT / 'scripts' / 'cpu_env' / 'site'}\nimport _sglang_cpu_shims\n"
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--no-deps",
            "-q",
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    return venv


def test_wheel_holds_the_package_the_hook_and_the_license(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "sglang_phasetrace/sitecustomize_hooks/sitecustomize.py" in names
    assert "sglang_phasetrace/tracing/cli/__init__.py" in names
    assert not [n for n in names if n.startswith(("tests/", "scripts/"))]
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_metadata_passes_twine_check(wheel: Path) -> None:
    pytest.importorskip("twine")
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(wheel)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_installed_wheel_traces_a_real_sglang_program_via_phasetrace_env(fresh_venv: Path, tmp_path: Path) -> None:
    python, phasetrace = fresh_venv / "bin" / "python", fresh_venv / "bin" / "phasetrace"
    where = subprocess.run(
        [str(python), "-c", "import sglang_phasetrace; print(sglang_phasetrace.__path__[0])"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    ).stdout.strip()
    assert where.startswith(str(fresh_venv)), where  # the wheel's copy, not this checkout

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_PHASETRACE", "PYTHONPATH"))}
    line = subprocess.run(
        [str(phasetrace), "env", "--dir", str(tmp_path / "runs")], check=True, capture_output=True, text=True, env=env
    ).stdout
    exports = dict(shlex.split(part.removeprefix("export "))[0].split("=", 1) for part in line.splitlines())
    assert exports["PYTHONPATH"].split(os.pathsep)[0].startswith(str(fresh_venv))
    program = [
        str(python),
        str(ROOT / "tests" / "programs" / "dist_ranks.py"),
        str(_tiny_model_dir(tmp_path)),
        "--world",
        "2",
        "--plant",
        "none",
        "--port",
        str(free_port()),
    ]
    done = subprocess.run(
        program, env={**env, **CPU_ENV, **exports}, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # dist_ranks has no SGLang launcher to share one run directory: each rank starts its own
    run_dirs = sorted((tmp_path / "runs").iterdir())
    journals = [j for d in run_dirs for j in (d / "journal").glob("*.jsonl")]
    assert len(journals) == 2, journals  # both ranks traced
    for run_dir in run_dirs:
        assert subprocess.run([str(phasetrace), "status", str(run_dir)], env=env, capture_output=True).returncode == 0


def _tiny_model_dir(tmp_path: Path) -> Path:
    """dist_ranks only reads the config: a tiny local model made by the project's script."""
    out = tmp_path / "model"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_tiny_model.py"), str(out)],
        check=True,
        capture_output=True,
        env={**os.environ, **CPU_ENV},
    )
    return out
