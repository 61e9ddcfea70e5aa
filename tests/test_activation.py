"""Activation through ``PYTHONPATH=sitecustomize_hooks``: free for processes that never import
SGLang, chained to the ``sitecustomize`` it shadows, and switched off by ``SGLANG_PHASETRACE=0``.

Every test runs a fresh interpreter the way a user would (``conftest.run_program``); programs
report what they saw as JSON in a file, so that their stdout/stderr can be required empty.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from conftest import HOOKS, requires_sglang, run_dirs, run_program
from sglang_phasetrace.patches.wrappers import MARK

PROBE = """
import json, os, sys

def report(path, **extra):
    data = {
        "otel": sorted(m for m in sys.modules if m.startswith("opentelemetry")),
        "wrapt": sorted(m for m in sys.modules if m == "wrapt" or m.startswith("wrapt.")),
        "ours": sorted(m for m in sys.modules if m.startswith("sglang_phasetrace")),
        "finders": [type(f).__name__ for f in sys.meta_path],
        "other_sitecustomize": os.environ.get("OTHER_SITECUSTOMIZE_RAN"),
        **extra,
    }
    with open(path, "w") as f:
        json.dump(data, f)
"""


def program(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "program.py"
    path.write_text(PROBE + textwrap.dedent(body))
    return path


@pytest.fixture
def other_sitecustomize(tmp_path: Path) -> Path:
    """A folder with its own ``sitecustomize.py`` (as a venv or distro would have), whose side
    effect the program can see."""
    folder = tmp_path / "other-site"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITECUSTOMIZE_RAN'] = __file__\n")
    return folder


def test_process_that_never_imports_sglang_pays_nothing(tmp_path, other_sitecustomize):
    base = tmp_path / "runs"
    base.mkdir()
    path = program(
        tmp_path,
        """
        report(sys.argv[1] + ".start")
        import email.mime.text, http.client, json, sqlite3, xml.dom.minidom  # ordinary imports
        try:
            import sglang_not_a_real_module  # a name that only starts with "sglang"
        except ImportError:
            pass
        report(sys.argv[1])
    """,
    )
    out = tmp_path / "report.json"
    ran = run_program(
        [str(path), str(out)],
        base,
        env={"PYTHONPATH": os.pathsep.join([str(HOOKS), str(other_sitecustomize)])},
        timeout=60,
    )

    assert ran.returncode == 0, ran.stderr
    assert (ran.stdout, ran.stderr) == ("", ""), "no output at all"
    for report in (json.loads(Path(f"{out}.start").read_text()), json.loads(out.read_text())):
        assert report["otel"] == [] and report["wrapt"] == [] and report["ours"] == []
        assert "_FirstSglangImport" in report["finders"], "armed, waiting for `import sglang`"
        assert report["other_sitecustomize"] == str(other_sitecustomize / "sitecustomize.py")
    assert run_dirs(base) == [] and not any(base.iterdir())


def test_failing_shadowed_sitecustomize_is_one_warning_not_a_crash(tmp_path):
    folder = tmp_path / "broken-site"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text("raise RuntimeError('broken site setup')\n")
    path = program(tmp_path, "report(sys.argv[1])\n")
    out = tmp_path / "report.json"
    ran = run_program(
        [str(path), str(out)], tmp_path, env={"PYTHONPATH": os.pathsep.join([str(HOOKS), str(folder)])}, timeout=60
    )
    assert ran.returncode == 0 and ran.stdout == ""
    lines = ran.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sglang-phasetrace: ") and "broken site setup" in lines[0]
    assert "_FirstSglangImport" in json.loads(out.read_text())["finders"]


IMPORT_SGLANG = f"""
    import sglang
    import sglang.srt.managers.scheduler as scheduler
    import sglang.srt.model_executor.model_runner as model_runner
    import sglang.srt.distributed.parallel_state as parallel_state

    targets = {{
        "Scheduler.__init__": scheduler.Scheduler.__init__,
        "ModelRunner.load_model": model_runner.ModelRunner.load_model,
        "ModelRunner.alloc_memory_pool": model_runner.ModelRunner.alloc_memory_pool,
        "init_distributed_environment": parallel_state.init_distributed_environment,
    }}
    report(sys.argv[1], marks={{name: getattr(f, {MARK!r}, None) for name, f in targets.items()}})
"""


@requires_sglang
@pytest.mark.sglang
@pytest.mark.parametrize("switch", ["0", "1"])
def test_sglang_phasetrace_switch(tmp_path, switch):
    """``SGLANG_PHASETRACE=0``: SGLang imports untouched, nothing of ours loaded, no run dir.
    ``=1`` (the control, same probe): the targets are patched at import, and importing alone
    still writes nothing (the runtime starts at a process's first phase)."""
    base = tmp_path / "runs"
    base.mkdir()
    out = tmp_path / "report.json"
    ran = run_program(
        [str(program(tmp_path, IMPORT_SGLANG)), str(out)], base, env={"SGLANG_PHASETRACE": switch}, timeout=180
    )

    assert ran.returncode == 0, ran.stderr[-4000:]
    report = json.loads(out.read_text())
    if switch == "0":
        assert report["ours"] == [] and "_FirstSglangImport" not in report["finders"]
        assert set(report["marks"].values()) == {None}
    else:
        assert report["marks"] == {
            "Scheduler.__init__": "rank",
            "ModelRunner.load_model": "model.load_weights",
            "ModelRunner.alloc_memory_pool": "kv_cache.alloc",
            "init_distributed_environment": "dist.init_process_group",
        }
        assert "_FirstSglangImport" not in report["finders"], "the one-shot finder removed itself"
    assert "sglang-phasetrace" not in ran.stderr
    assert run_dirs(base) == []
