"""Journals are untrusted input to the viewers: the HTML report embeds no file outside
RUN_DIR/stacks/ and cannot have its script broken; the terminal gets no escape sequence, from the
viewers, the watchdog (in the launcher and ``phasetrace watch``), ``phasetrace run`` or a logged
warning (issue 29, item 4: every printed line goes through ``redact.printable``).

A synthetic stalled run (``cli_fixtures.build_run``) is given a diagnosis naming ``/etc/passwd``,
``../../x``, a symlink in stacks/ pointing outside and ``/dev/zero``, an oversized stack dump, a
phase named with an OSC 52 sequence, ``<!--`` and ``</script>``, and a rank label carrying
escape sequences and rich markup.
"""

from __future__ import annotations

import io
import json
import logging
import re
import sys
import time
from pathlib import Path

import pytest
from cli_fixtures import HOST, build_run
from sglang_phasetrace.tracing.cli import main
from sglang_phasetrace.tracing.journal import records
from sglang_phasetrace.tracing.reader.load import load_run
from sglang_phasetrace.tracing.recorder import runtime
from sglang_phasetrace.tracing.redact import REDACTED, printable
from sglang_phasetrace.tracing.render.html_report import MAX_STACK, script_json
from sglang_phasetrace.tracing.render.lanes import layout
from sglang_phasetrace.tracing.render.run_text import status_line, summary
from sglang_phasetrace.tracing.render.term import clean
from sglang_phasetrace.tracing.verdicts.diagnose import Thresholds
from sglang_phasetrace.tracing.verdicts.findings import by_process, findings
from sglang_phasetrace.tracing.verdicts.watchdog import Watchdog

OSC52 = "\x1b]52;c;cm0gLXJmIH4K\x07"
EVIL_PHASE = f"evil{OSC52}<!--</script><script>alert(1)</script>\x1b[2J\x9b31m[red]markup[/red]"
EVIL_LABEL = "tp0\x1b[31m\x1b]8;;http://x\x07[bold]lbl[/bold]\x07"
OUTSIDE = "OUTSIDE-FILE-CONTENT-7731"
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _append(path: Path, *records: dict) -> None:
    with path.open("a") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


@pytest.fixture
def hostile_run(tmp_path: Path) -> Path:
    run = build_run(tmp_path / "base" / "runs" / "hostile", ranks=2, spans=30, stalled_rank=1)
    path = run.path
    outside = tmp_path / "outside-secret.txt"
    outside.write_text(OUTSIDE)
    (path.parent.parent / "x").write_text(OUTSIDE)  # what ../../x names from the run directory
    (path / "stacks" / "link.txt").symlink_to(outside)  # a link inside stacks/ to a file outside
    big = path / "stacks" / f"{HOST}-9999.txt"
    big.write_text("OLDEST-LINE\n" + "x" * (MAX_STACK + 1000) + f"\ntoken=bigstack{OUTSIDE[:3]}secret\nNEWEST\n")
    launcher = path / "journal" / f"{HOST}-1000.jsonl"
    pid = run.pids[run.stalled]
    stacks = ["/etc/passwd", "../../x", str(path / "stacks" / "link.txt"), "/dev/zero", str(big), "stacks/../../x"]
    message = f"{OSC52}stalled; Authorization: Bearer diagsecret42"  # our watchdog would have redacted it
    _append(
        launcher,
        records.diagnosis(1, "straggler", run.stalled, pid, "dist.init_process_group", 90.0, message, {}, stacks),
    )
    rank0 = path / "journal" / f"{HOST}-{run.pids['tp0']}.jsonl"
    lines = [json.loads(line) for line in rank0.read_text().splitlines()]
    root = next(r for r in lines if r["kind"] == "begin")
    t = root["t"] + 1000
    _append(  # hostile names and an unredacted secret: what a journal our writers did not make may hold
        rank0,
        records.identity(t, EVIL_LABEL, "rank", {}),
        records.begin(
            t,
            "e" * 16,
            root["span"],
            root["trace"],
            EVIL_PHASE,
            {"sglang.phase": EVIL_PHASE, "note": f"x{OSC52}y"},
            "Main",
        ),
        records.end(t + 10**8, "e" * 16, "ok", {}),
        records.warning(t, f"warn{OSC52} password=warnsecret43"),
    )
    return path


def _script_data(page: str) -> str:
    start = page.index('<script type="application/json" id="data">') + len('<script type="application/json" id="data">')
    return page[start : page.index("</script>", start)]


def test_report_embeds_only_stack_files_inside_the_run(hostile_run: Path, capsys):
    out = hostile_run / "report.html"
    assert main(["report", str(hostile_run), "-o", str(out)]) == 0
    capsys.readouterr()
    page = out.read_text()
    assert OUTSIDE not in page, "a file outside RUN_DIR/stacks was embedded"
    assert "root:x:0:0" not in page and "\x00" not in page
    assert "init_process_group" in page and "Thread 0x00007f" in page, "the real stack dump is embedded"
    assert "[truncated: the first" in page and "NEWEST" in page and "OLDEST-LINE" not in page
    assert len(page) < 4 * MAX_STACK
    assert "diagsecret42" not in page and "warnsecret43" not in page and "bigstack" not in page
    assert REDACTED in page


def test_report_script_cannot_be_broken(hostile_run: Path, capsys):
    out = hostile_run / "report.html"
    assert main(["report", str(hostile_run), "-o", str(out)]) == 0
    capsys.readouterr()
    page = out.read_text()
    data = _script_data(page)
    assert "<" not in data, "no '<' inside the embedded JSON: no </script>, no <!--"
    decoded = json.loads(data)
    assert EVIL_PHASE in decoded["keys"], "the phase name survives as data"
    assert page.count("</script>") == 2 and "<script>alert" not in page
    assert script_json({"a": "<!--</script>"}) == '{"a":"\\u003c!--\\u003c/script>"}'


def test_report_reads_no_device_and_follows_no_link(hostile_run: Path):
    from sglang_phasetrace.tracing.render.html_report import read_stack

    stacks = hostile_run / "stacks"
    assert read_stack(hostile_run, stacks / "link.txt") is None
    assert read_stack(hostile_run, Path("/dev/zero")) is None
    assert read_stack(hostile_run, stacks / ".." / ".." / "x") is None
    (stacks / "fifo.txt").unlink(missing_ok=True)
    import os

    os.mkfifo(stacks / "fifo.txt")
    assert read_stack(hostile_run, stacks / "fifo.txt") is None, "a FIFO neither blocks nor is read"
    assert "init_process_group" in read_stack(hostile_run, next(stacks.glob(f"{HOST}-2001.txt")))


@pytest.mark.parametrize(
    "argv",
    [
        ["timeline", "--width", "160", "--depth", "2"],
        ["status", "--once"],
        ["compare"],
        ["compare", "SELF"],
        ["compare", "--json"],
        ["status", "--json"],
    ],
)
def test_terminal_output_has_no_control_characters(hostile_run: Path, capsys, argv):
    args = [a.replace("SELF", str(hostile_run)) for a in argv]
    main([args[0], str(hostile_run), *args[1:]])
    captured = capsys.readouterr()
    for stream in (captured.out, captured.err):
        assert not CONTROL.findall(stream.replace("\n", "")), repr(CONTROL.findall(stream.replace("\n", ""))[:5])
        assert "\x1b" not in stream
    if argv[0] == "timeline":
        assert "[red]markup[/red]" in captured.out, "rich markup is shown, not interpreted"
        assert "evil<!--</script>" in captured.out, "the readable rest of the name is kept"


def test_run_summary_and_status_line_are_clean(hostile_run: Path):
    run = load_run(hostile_run)
    lay = layout(run)
    found = findings(run, lay.end)
    lines = [status_line(lay, by_process(run, found)), *summary(lay, found, by_process(run, found))]
    assert lines and all(not CONTROL.search(line) for line in lines), lines


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("a\x1b]52;c;QUJD\x07b", "ab"),
        ("a\x1b]52;c;QUJD\x1b\\b", "ab"),
        ("a\x1b[2J\x1b[31mb", "ab"),
        ("a\x9b31mb", "ab"),
        ("a\x9d8;;x\x9cb", "ab"),
        ("a\x1bPq#0\x1b\\b", "ab"),
        ("a\x1b(Bb", "ab"),
        ("a\tb\nc\r", "a b c "),
        ("a\x00\x07\x08\x7fb", "ab"),
        ("a\u202eb\u2066c", "abc"),
        ("plain [bold]text[/bold] µs", "plain [bold]text[/bold] µs"),
        ("a\x1b]0;unterminated", "a"),
    ],
)
def test_clean(raw, shown):
    assert clean(raw) == shown


# -- every line we print: the watchdog, `phasetrace watch`, `phasetrace run`, logged warnings ----------
CSI_2J = "\x1b[2J"
EVIL_MESSAGE = f"boom{OSC52} password=evilsecret44{CSI_2J} end"
S = 1_000_000_000
TH = Thresholds(heartbeat_s=5, silent_s=15, stall_s=30, no_progress_s=120, blocked_s=30, busy_s=60)


def _clean_lines(text: str, repr_ok: bool = False) -> None:
    """No escape, no control character, no secret; no OSC 52 payload unless ``%r`` wrote it as text."""
    assert "\x1b" not in text and "\x9b" not in text and "\x07" not in text, repr(text[:2000])
    assert not CONTROL.findall(text.replace("\n", "")), repr(text[:2000])
    assert "evilsecret44" not in text, text
    assert repr_ok or "cm0gLXJmIH4K" not in text, text


def _hostile_journals(run: Path, now: int) -> None:
    """Two ranks on another host: one stalled (silent) in a phase named with escapes, under a label
    with escapes; one failed in it with an exception message holding escapes and a secret."""
    (run / "journal").mkdir(parents=True, exist_ok=True)
    for world in (0, 1):
        pid = 100 + world
        root, phase = f"{world:x}{1:015x}", f"{world:x}{2:015x}"
        label = EVIL_LABEL if world == 0 else f"tp1{CSI_2J}"
        journal = [
            records.process(now - 300 * S, pid, None, "other", run.name, None, {}),
            records.identity(now - 300 * S, label, "rank", {}),
            records.begin(now - 300 * S, root, None, "a" * 32, "rank", {}, "MainThread"),
            records.begin(now - 100 * S, phase, root, "a" * 32, EVIL_PHASE, {}, "MainThread"),
        ]
        if world == 0:
            journal.append(records.heartbeat(now - 60 * S, 1, pid, label, False, TH.heartbeat_s, [], 0.0, 0, 1))
        else:
            error = records.error("RuntimeError", EVIL_MESSAGE)
            journal += [
                records.end(now - 90 * S, phase, "error", {}, error),
                records.end(now - 90 * S, root, "error", {}, error),
            ]
        (run / "journal" / f"other-{pid}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in journal))


def test_printable_redacts_and_cleans():
    assert printable(f"a{OSC52}b{CSI_2J}c\x9b31md\ne") == "abcd e"
    assert printable("pass\x1b[0mword=split45secret") == f"password={REDACTED}", "an escape cannot split a key"
    assert printable("x" * 100_000).count("x") < 17_000 and "characters cut" in printable("x" * 100_000)


def test_watchdog_lines_are_clean(tmp_path: Path):
    now = time.time_ns()
    _hostile_journals(tmp_path, now)
    out = io.StringIO()
    found = Watchdog(tmp_path, TH, out=out, py_spy=False).step(now)
    printed = out.getvalue()
    assert found and "STALL rank tp0" in printed, printed
    _clean_lines(printed)
    assert "evil<!--</script>" in printed, "the readable rest of the phase name is kept"


def test_phasetrace_watch_output_is_clean(tmp_path: Path, capsys):
    _hostile_journals(tmp_path, time.time_ns())
    main(["watch", str(tmp_path), "--timeout", "0.5", "--interval", "0.1", "--no-py-spy"])
    captured = capsys.readouterr()
    assert "sglang-phasetrace:" in captured.err, captured.err
    _clean_lines(captured.out + captured.err)


# A stand-in launch (as in test_cli_run.py) whose rank fails in a phase named with escapes, under a
# label with escapes, with a message holding escapes and a secret: what `phasetrace run` prints of it.
HOSTILE_LAUNCH = r"""
import json, os, sys, time
from pathlib import Path
from sglang_phasetrace.tracing.journal import records
run = Path(os.environ["SGLANG_PHASETRACE_RUN_DIR"])
(run / "journal").mkdir(parents=True, exist_ok=True)
phase, label, message = json.loads(sys.argv[1])
def write(pid, record):
    with open(run / "journal" / f"h-{pid}.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
now, trace = time.time_ns, "ab" * 16
write(1, records.process(now(), 1, None, "h", run.name, None, {}))
write(1, records.identity(now(), "launcher", "launcher", {}))
write(1, records.begin(now(), "0" * 16, None, trace, "sglang.launch", {"sglang.phase": "launch.engine"}, "MainThread"))
write(11, records.process(now(), 11, 1, "h", run.name, None, {}))
write(11, records.identity(now(), label, "rank", {}))
write(11, records.begin(now(), "1" * 16, "0" * 16, trace, "rank", {"sglang.phase": "rank"}, "MainThread"))
write(11, records.begin(now(), "2" * 16, "1" * 16, trace, phase, {"sglang.phase": phase}, "MainThread"))
time.sleep(1.0)
error = records.error("RuntimeError", message)
write(11, records.end(now(), "2" * 16, "error", {}, error))
write(11, records.end(now(), "1" * 16, "error", {}, error))
time.sleep(0.5)
sys.exit(3)
"""


def test_phasetrace_run_lines_are_clean(tmp_path: Path, capsys):
    script = tmp_path / "hostile_launch.py"
    script.write_text(HOSTILE_LAUNCH)
    args = json.dumps([EVIL_PHASE, EVIL_LABEL, EVIL_MESSAGE])
    base = tmp_path / "runs"
    code = main(["run", "--dir", str(base), "--interval", "0.2", "--", sys.executable, str(script), args])
    err = capsys.readouterr().err
    assert code == 3
    assert "sglang-phasetrace: FAILED" in err and "ROOT CAUSE" in err, err
    _clean_lines(err)


def test_logged_warnings_are_clean(trace_run_dir, caplog):
    caplog.set_level(logging.WARNING, logger="sglang_phasetrace")
    runtime.current().start().warn(f"exporter {EVIL_LABEL} failed: {EVIL_MESSAGE}")
    log = logging.getLogger("sglang_phasetrace")
    log.warning("sglang-phasetrace: %s not traced: %s", EVIL_PHASE, EVIL_MESSAGE)
    log.warning("sglang-phasetrace: %s failed: %r", EVIL_PHASE, RuntimeError(EVIL_MESSAGE))
    messages = [r.getMessage() for r in caplog.records if r.name == "sglang_phasetrace"]
    assert len(messages) == 3 and all(m.startswith("sglang-phasetrace: ") for m in messages), messages
    _clean_lines("\n".join(messages[:2]))
    _clean_lines(messages[2], repr_ok=True)  # repr() already wrote the escapes as text
    assert "characters cut" in printable(EVIL_MESSAGE * 2000)
