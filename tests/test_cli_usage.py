"""The command line as a user of argparse tools expects it (issue 48): one set of names, help that
says what each verb does and returns, and bad values refused with the verb's own usage."""

from __future__ import annotations

import argparse
import ast
import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest
from cli_fixtures import build_run
from conftest import ROOT
from handmade_runs import Proc
from sglang_phasetrace.tracing.cli import VERBS, build_parser, commands, main
from sglang_phasetrace.tracing.verdicts.diagnose import Thresholds


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    got = capsys.readouterr()
    return code, got.out, got.err


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_run(tmp_path_factory.mktemp("usage") / "run", ranks=2, spans=12).path


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser(commands())
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


# -- 2. one set of names, help that matches behaviour -------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "--version")
    assert code == 0 and out.strip() == f"phasetrace {version('sglang-phasetrace')}"


def test_a_bad_option_prints_the_verbs_own_usage(capsys: pytest.CaptureFixture[str], run: Path) -> None:
    code, _, err = cli(capsys, "status", str(run), "--bogus")
    assert code == 2 and err.startswith("usage: phasetrace status") and "--bogus" in err


def test_the_silent_threshold_has_one_name_and_one_stated_default(capsys: pytest.CaptureFixture[str]) -> None:
    parsers = _subparsers()
    helps = {}
    for verb in ("status", "watch"):
        (action,) = [a for a in parsers[verb]._actions if "--silent-after" in a.option_strings]
        assert action.metavar == "S" and action.default is None
        helps[verb] = action.help
    assert helps["status"] == helps["watch"] and "4 heartbeats" in helps["status"]
    assert Thresholds.from_env().silent_s == 4 * Thresholds.from_env().heartbeat_s  # what the help says
    assert "4 heartbeats" in (ROOT / "README.md").read_text().split("_SILENT_S")[1].splitlines()[0]


def test_every_value_in_seconds_is_written_S() -> None:
    for verb, parser in _subparsers().items():
        for a in parser._actions:
            if a.option_strings and a.nargs != 0 and a.type is float:
                assert a.metavar == "S", (verb, a.option_strings, a.metavar)


def _returned_codes(verb: str) -> set[int]:
    """The exit codes a verb's module can return, read from its source: the names it returns."""
    names = {"EXIT_STALLED": {3}, "EXIT_FAILED": {4}, "EXIT_INCOMPLETE": {10}, "complete": {10},
             "STILL_STARTING": {9}, "CODES": {3, 4, 5, 6, 7, 8}}  # fmt: skip
    src = ROOT / "tracing" / "cli" / f"{VERBS[verb][0]}.py"
    found: set[int] = set()
    for node in ast.walk(ast.parse(src.read_text())):
        if isinstance(node, ast.Name) and node.id in names:
            found |= names[node.id]
    return found


def test_each_verbs_help_lists_the_exit_codes_it_returns(capsys: pytest.CaptureFixture[str]) -> None:
    for verb in VERBS:
        if verb == "run":  # returns the command's own
            continue
        _, out, _ = cli(capsys, verb, "--help")
        listed = {int(c) for c in re.findall(r"^\s+(\d+)\s", out.split("exit codes:")[1], re.M)}
        assert listed == {0, 1, 2, 130} | _returned_codes(verb), verb
    _, out, _ = cli(capsys, "probe", "--help")
    assert all(re.search(rf"^\s+{c}\s", out.split("exit codes:")[1], re.M) for c in (7, 8, 9))


def test_docs_cli_is_the_table_the_help_is_made_from() -> None:
    from sglang_phasetrace.tracing.cli import usage

    assert (ROOT / "docs" / "cli.md").read_text() == usage.markdown(build_parser(commands())), (
        "run: .venv/bin/python scripts/cli_doc.py"
    )


def test_each_stated_default_is_the_parsers() -> None:
    for verb, parser in _subparsers().items():
        for a in parser._actions:
            said = re.search(r"\(default ([\d.]+)[);,]", a.help or "")
            if said and a.default is not None:
                assert float(said.group(1)) == float(a.default), (verb, a.option_strings)


def test_one_message_prefix(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = cli(capsys, "timeline", str(tmp_path / "nowhere"))
    assert code == 1 and err.startswith("sglang-phasetrace: timeline: ")
    for path in (ROOT / "tracing").rglob("*.py"):
        if path.name == "run.py":  # `phasetrace run`'s own lines, told from the launch's (its docstring)
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            assert not re.search(r"""(?<![-\w])phasetrace(:| \{args\.verb\}:| \w+:)""", line.split("#")[0]) or (
                "usage: phasetrace" in line
            ), f"{path}:{n}: {line.strip()}"


def test_probe_json_has_one_exit_code_and_always_its_processes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = cli(capsys, "probe", "--json", str(tmp_path / "none"))
    doc = json.loads(out)
    assert code == 7 and doc["exit_code"] == 7 and "code" not in doc and doc["processes"] == []
    Proc(tmp_path / "r", 99, "launcher", "launcher", "launch.server").phase("launch.wait_ranks", 20).write()
    code, out, _ = cli(capsys, "probe", "--json", str(tmp_path / "r"))
    doc = json.loads(out)
    assert doc["exit_code"] == code and "code" not in doc and isinstance(doc["processes"], list)
    assert doc["processes"] and doc["processes"][0]["pid"] == 99


def test_times_are_written_one_way(capsys: pytest.CaptureFixture[str], run: Path) -> None:
    _, out, _ = cli(capsys, "timeline", str(run), "--width", "160")
    assert re.findall(r"\d(?:s|ms|µs)\b", out) == []
    assert re.search(r"\|\d+(\.\d+)? s", out)


# -- 3. bad values refused ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["timeline", "RUN", "--width", "10"],
        ["timeline", "RUN", "--width", "-5"],
        ["timeline", "RUN", "--depth", "-1"],
        ["compare", "RUN", "--top", "0"],
        ["compare", "RUN", "--top", "-2"],
        ["history", "--top", "0"],
        ["history", "--limit", "0"],
        ["status", "RUN", "--interval", "0"],
        ["status", "RUN", "--silent-after", "-1"],
        ["watch", "RUN", "--silent-after", "0"],
        ["probe", "RUN", "--wait", "-1"],
        ["export", "RUN", "--timeout", "0"],
        ["run", "--interval", "nan", "--", "true"],
        ["preflight", "--deadline", "0", "--", "true"],
    ],
)
def test_bad_values_are_refused_with_the_verbs_usage(
    capsys: pytest.CaptureFixture[str], run: Path, argv: list[str]
) -> None:
    code, out, err = cli(capsys, *[str(run) if a == "RUN" else a for a in argv])
    option = next(a for a in argv if a.startswith("--") and a != "--")
    assert code == 2 and err.startswith(f"usage: phasetrace {argv[0]}") and option in err, err
    assert out == ""


def _piped(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang_phasetrace.tracing.cli", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )


def test_timeline_honours_COLUMNS_when_piped(run: Path) -> None:
    done = _piped("timeline", str(run), env={"COLUMNS": "100"})
    lines = done.stdout.splitlines()
    chart = [line for line in lines if line.startswith("tp")]
    assert done.returncode == 0 and chart and max(len(line) for line in chart) <= 100, done.stdout


def test_probe_on_a_plain_file_says_it_is_not_a_run_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "f").write_text("x")
    code, out, err = cli(capsys, "probe", str(tmp_path / "f"))
    assert code == 1 and "not a run directory" in err and out == ""


def test_history_json_with_nothing_recorded_is_valid_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = cli(capsys, "history", "--dir", str(tmp_path), "--json")
    assert code == 0 and json.loads(out)["launches"] == []


def test_a_long_lane_label_is_cut_with_a_marker(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    label = "a-launcher-with-a-label-of-forty-chars!!"
    Proc(tmp_path, 99, "launcher", label, "launch.server", host="node0").phase("launch.wait_ranks", 20, 5).write()
    _, out, _ = cli(capsys, "timeline", str(tmp_path), "--width", "160")
    (row,) = [line for line in out.splitlines() if line.startswith("a-launcher")]
    assert label not in row and re.match(r"a-launcher-with-a-label\S*… ", row), row


def _on_a_pty(argv: list[str], env: dict[str, str]) -> bytes:
    """What the CLI writes to a real pseudo-terminal."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdout is the terminal
        os.environ.update(env)
        os.execv(sys.executable, [sys.executable, "-m", "sglang_phasetrace.tracing.cli", *argv])
    out = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 1)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    os.close(fd)
    os.waitpid(pid, 0)
    return out


def test_NO_COLOR_on_a_terminal_prints_no_escape_codes(run: Path, tmp_path: Path) -> None:
    env = {"NO_COLOR": "1", "TERM": "xterm-256color", "COLUMNS": "160"}
    seen = {}
    for argv in (["timeline", str(run)], ["compare", str(run)], ["status", str(run), "--once"],
                 ["history", "--dir", str(tmp_path)]):  # fmt: skip
        out = _on_a_pty(argv, env)
        seen[argv[0]] = out
        assert b"\x1b[" not in out, (argv, out[:400])
    assert b"tp0" in seen["timeline"] and b"tp1" in seen["status"]
    # without NO_COLOR the same terminal gets styles: the test sees a terminal
    assert b"\x1b[" in _on_a_pty(["timeline", str(run)], {"TERM": "xterm-256color", "COLUMNS": "160"})
