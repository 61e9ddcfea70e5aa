"""The journal reader: lines cut by ``kill -9``, corrupt lines (each reported once as
``file:line``), and everything else used; plus a real process killed mid-phase."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import read_journal
from sglang_phasetrace.tracing.journal import records
from sglang_phasetrace.tracing.journal import tail as journal
from sglang_phasetrace.tracing.journal.tail import JournalTail
from sglang_phasetrace.tracing.journal.writer import JournalWriter, dumps
from sglang_phasetrace.tracing.reader.load import load_run
from sglang_phasetrace.tracing.reader.view import RunView

GOOD = [
    records.process(1, 42, None, "h", "r", 0, {}),
    records.begin(2, "a" * 16, None, "f" * 32, "rank tp0", {"sglang.phase": "rank"}, "MainThread"),
    records.begin(3, "b" * 16, "a" * 16, "f" * 32, "kv_cache.alloc", {"sglang.phase": "kv_cache.alloc"}, "MainThread"),
    records.end(4, "b" * 16, "ok", {"sglang.max_total_num_tokens": 4096}),
]


def write_lines(path: Path, lines: list[bytes | str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for line in lines:
            f.write(line.encode() if isinstance(line, str) else line)


def journal_lines(records: list[dict]) -> list[str]:
    return [dumps(r) + "\n" for r in records]


def test_writer_round_trip(tmp_path):
    path = tmp_path / "journal" / "h-1.jsonl"
    writer = JournalWriter(path)
    for record in GOOD:
        writer.write(record)
    writer.write(records.event(5, "b" * 16, "note", {"text": "ünïcode ✓", "set": {1}}))
    writer.close()
    writer.write(records.end(6, "a" * 16, "ok", {}))  # after close: dropped, not raised

    read, problems = read_journal(path)
    assert problems == []
    assert read[:4] == GOOD
    assert read[4]["attrs"] == {"text": "ünïcode ✓", "set": [1]}
    assert len(read) == 5


def test_spans_with_equal_attrs_share_them_after_their_ends_add_more(tmp_path):
    """An ``end`` record's attrs make new ones for its span; spans whose begin and end attrs are
    equal still share one dict (renderers build things once per attrs), and nothing leaks across."""
    written = GOOD[:2]
    for i, extra in enumerate(({"n": 1}, {"n": 1}, {"n": 2})):
        span = f"{i + 1:016x}"
        written += [
            records.begin(5 + i, span, "a" * 16, "f" * 32, "x", {"sglang.phase": "x"}, "MainThread"),
            records.end(9 + i, span, "ok", extra),
        ]
    write_lines(tmp_path / "journal" / "h-42.jsonl", journal_lines(written))
    spans = [s for s in load_run(tmp_path).processes[0].spans.values() if s.name == "x"]
    assert [s.attrs for s in spans] == [
        {"sglang.phase": "x", "n": 1},
        {"sglang.phase": "x", "n": 1},
        {"sglang.phase": "x", "n": 2},
    ]
    assert spans[0].attrs is spans[1].attrs and spans[2].attrs is not spans[0].attrs


def test_truncated_last_line_live_read_waits_final_read_reports(tmp_path):
    path = tmp_path / "journal" / "h-42.jsonl"
    cut = dumps(records.end(5, "a" * 16, "ok", {}))
    write_lines(path, [*journal_lines(GOOD), cut[:17]])  # the last write was cut mid-line

    tail = JournalTail(path)
    assert tail.read() == GOOD, "a live read leaves the unfinished line for later"
    assert tail.problems == []
    with open(path, "ab") as f:  # the writer finishes the line
        f.write((cut[17:] + "\n").encode())
    assert tail.read() == [json.loads(cut)]
    assert tail.problems == []

    write_lines(path, [*journal_lines(GOOD), cut[:17]])  # a process killed with the line half-written
    read, problems = read_journal(path)
    assert read == GOOD
    assert len(problems) == 1 and problems[0].startswith(f"{path}:5: ")


def test_corrupt_line_reported_once_as_file_line_and_the_rest_used(tmp_path):
    run = tmp_path / "run"
    path = run / "journal" / "h-42.jsonl"
    lines = journal_lines(GOOD)
    lines.insert(2, '{"kind": "begin", "t": 2, "span": \n')  # line 3: not JSON
    write_lines(path, lines)

    view = RunView(run).refresh()
    view.refresh()
    with open(path, "a") as f:
        f.write(dumps(records.end(9, "a" * 16, "ok", {})) + "\n")
    view.refresh()
    view.refresh(final=True)

    assert len(view.problems) == 1, view.problems
    assert view.problems[0].startswith(f"{path}:3: not a JSON record")
    (proc,) = view.processes
    assert proc.pid == 42
    assert [s.status for s in proc.spans.values()] == ["ok", "ok"]
    assert proc.spans["b" * 16].attrs["sglang.max_total_num_tokens"] == 4096


def test_unusable_records_each_reported_with_their_line(tmp_path):
    path = tmp_path / "run" / "journal" / "h-42.jsonl"
    write_lines(
        path,
        [
            journal_lines(GOOD)[0],
            "\n",  # blank: skipped, not a problem
            b'{"kind": "begin", "t": 2, "name": "\xff\xfe"}\n',  # not UTF-8
            '["a", "list"]\n',
            '{"kind": "gossip", "t": 3}\n',  # unknown kind
            '{"kind": "begin", "t": "3"}\n',  # t not an integer
            *journal_lines(GOOD[1:]),
        ],
    )
    run = load_run(tmp_path / "run")
    lines = sorted(int(p.split(":")[1]) for p in run.problems)
    assert lines == [3, 4, 5, 6]
    assert all(p.startswith(f"{path}:") for p in run.problems)
    (proc,) = run.processes
    assert [s.name for s in proc.spans.values()] == ["rank tp0", "kv_cache.alloc"]


def test_one_broken_journal_does_not_hide_the_others(tmp_path):
    run = tmp_path / "run"
    write_lines(run / "journal" / "h-42.jsonl", journal_lines(GOOD))
    write_lines(
        run / "journal" / "h-43.jsonl",
        [
            "this is not json\n",
            *journal_lines(
                [
                    dict(GOOD[0], pid=43),
                    records.begin(7, "c" * 16, "a" * 16, "f" * 32, "x", {}, "MainThread"),
                ]
            ),
        ],
    )
    view = load_run(run)
    assert sorted(p.pid for p in view.processes) == [42, 43]
    [problem] = view.problems  # the parser's own words follow the file:line
    assert problem.startswith(f"{run / 'journal' / 'h-43.jsonl'}:1: not a JSON record (JSONDecodeError: ")


def test_journal_of_a_process_killed_mid_phase(tmp_path):
    """A real traced process dies by SIGKILL inside a phase: every record written before is
    there, the phase it was in shows as begun and never ended."""
    program = textwrap.dedent("""
        import os, signal
        from sglang_phasetrace.tracing.recorder import spans
        outer = spans.start_phase("rank tp0", {"sglang.phase": "rank"}, root=True)
        done = spans.start_phase("model.load_weights", {"sglang.phase": "model.load_weights"})
        done.end()
        spans.start_phase("kv_cache.alloc", {"sglang.phase": "kv_cache.alloc"})
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_PHASETRACE", "OTEL_", "TRACEPARENT"))}
    env.update(SGLANG_PHASETRACE_RUN_DIR=str(tmp_path / "run"), SGLANG_PHASETRACE_HEARTBEAT_S="3600")
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr

    run = load_run(tmp_path / "run")
    assert run.problems == []
    (proc,) = run.processes
    by_phase = {s.phase: s for s in proc.spans.values()}
    assert by_phase["model.load_weights"].status == "ok"
    assert by_phase["kv_cache.alloc"].status == "open" and by_phase["kv_cache.alloc"].end is None
    assert by_phase["rank"].status == "open"
    assert proc.current.phase == "kv_cache.alloc"


def test_exit_records_land_on_the_process_they_name(tmp_path):
    """A watcher's ``exit`` record (how a process ended) lands on the process it is about; an idle
    helper process (no phases, role ``process``) is not listed."""
    run = tmp_path / "run"
    launcher = run / "journal" / "h-1.jsonl"
    write_lines(
        launcher,
        journal_lines([records.process(1, 1, 0, "h", "run", 0, {}), records.identity(1, "launcher", "launcher", {})]),
    )
    write_lines(
        run / "journal" / "h-43.jsonl",
        journal_lines([records.process(3, 43, 1, "h", "run", 0, {}), records.identity(3, "tp1", "rank", {})]),
    )
    write_lines(run / "journal" / "h-44.jsonl", journal_lines([records.process(3, 44, 1, "h", "run", 0, {})]))
    view = RunView(run).refresh()
    assert [p.pid for p in view.processes] == [1, 43]
    with open(launcher, "a") as f:
        f.write(dumps(records.exit(9, 43, "h", "tp1", None, "SIGKILL")) + "\n")
    (tp1,) = view.refresh().ranks
    assert tp1.exit["signal"] == "SIGKILL" and view.problems == []


# -- bounded reads: a line over LINE_MAX, a journal over journal_max(), read a piece at a time ---------


def test_a_line_over_the_cap_is_named_once_and_the_next_lines_read(tmp_path):
    path = tmp_path / "journal" / "h-42.jsonl"
    huge = dumps(records.warning(5, "x" * (3 << 20)))  # 3 MiB: valid, but no record is that long
    write_lines(path, [*journal_lines(GOOD[:2]), huge + "\n", *journal_lines(GOOD[2:])])
    read, problems = read_journal(path)
    assert read == GOOD
    assert problems == [f"{path}:3: a line over 1 MiB (the cap on one journal line)"]

    write_lines(path, [*journal_lines(GOOD[:2]), huge[: 2 << 20]])  # a live read meets it half written
    tail = JournalTail(path)
    assert tail.read() == GOOD[:2] and tail.problems == [problems[0]]
    with open(path, "a") as f:
        f.write(huge[2 << 20 :] + "\n" + "".join(journal_lines(GOOD[2:])))
    assert tail.read() == GOOD[2:] and tail.problems == [problems[0]]  # said once
    with open(path, "a") as f:
        f.write(huge)  # the last line, never ended: a final read says it too
    assert tail.read(final=True) == [] and tail.problems == [problems[0], problems[0].replace(":3:", ":6:")]


def test_a_journal_over_the_cap_is_read_up_to_it_and_said_once(tmp_path, monkeypatch):
    path = tmp_path / "journal" / "h-42.jsonl"
    lines = journal_lines(GOOD) * 100  # 400 lines, ~160 bytes each
    write_lines(path, lines)
    monkeypatch.setenv(journal.ENV_JOURNAL_MAX, str(10_000 / 2**20))  # 10 000 bytes
    fits = next(i for i in range(len(lines)) if sum(map(len, lines[: i + 1])) > 10_000)
    tail = JournalTail(path)
    assert len(tail.read()) == fits
    assert tail.problems == [
        f"{path}:{fits + 1}: the rest of this journal, past {10_000 / 2**20:g} MiB (the cap on what is read of one "
        "journal; set SGLANG_PHASETRACE_JOURNAL_MAX_MB to a number of MiB to read more)"
    ]
    assert tail.read(final=True) == [] and len(tail.problems) == 1
    monkeypatch.setenv(journal.ENV_JOURNAL_MAX, "1")
    assert len(read_journal(path)[0]) == 400


def test_reading_a_piece_at_a_time_gives_what_one_read_would(tmp_path, monkeypatch):
    """Lines of every length around the caps (made small here), read whole or as they are appended
    in random pieces: the same records, each long line said once, nothing read past the cap."""
    monkeypatch.setattr(journal, "LINE_MAX", 400)
    monkeypatch.setattr(journal, "READ_BYTES", 500)
    rng = random.Random(29)
    for _ in range(30):
        cap = rng.choice([None, rng.randrange(500, 20_000)])
        if cap is None:
            monkeypatch.delenv(journal.ENV_JOURNAL_MAX, raising=False)
        else:
            monkeypatch.setenv(journal.ENV_JOURNAL_MAX, str(cap / 2**20))
        path = tmp_path / f"h-{rng.randrange(10**9)}.jsonl"
        sizes = [rng.choice([0, 10, 300, 380, 399, 1500]) for _ in range(60)]  # a line: ~40 bytes + this
        lines = [dumps(records.warning(i + 1, "m" * n)) for i, n in enumerate(sizes)]
        data = "".join(line + "\n" for line in lines)
        unended = rng.random() < 0.5  # the last line without its newline (a final read takes it)
        if unended:
            data = data[:-1]
        end = len(data.encode()) if cap is None else int(cap / 2**20 * 2**20)  # bytes read
        expected, long, at = [], [], 0
        for n, line in enumerate(lines, 1):
            start, at = at, at + len(line) + 1  # ``at``: past its newline
            if at - (unended and n == len(lines)) > end:  # the cap cuts it: said long if it showed that much
                long += [n] if len(line) > 400 and end - start > 400 else []
                break
            (long if len(line) > 400 else expected).append(n)
        path.write_bytes(b"")
        tail = JournalTail(path)
        got, raw = [], data.encode()
        cuts = sorted(rng.sample(range(1, len(raw)), 5))
        for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True):
            with open(path, "ab") as f:
                f.write(raw[a:b])
            got += tail.read(final=b == len(raw))
        assert [r["t"] for r in got] == expected, cap
        said = [int(p.split(":")[1]) for p in tail.problems if "a line over" in p]
        assert said == long, (cap, tail.problems)
        capped = cap is not None and end < len(raw)
        assert sum("the rest of this journal" in p for p in tail.problems) == capped
        whole = JournalTail(path)
        assert whole.read(final=True) == got and whole.problems == tail.problems
