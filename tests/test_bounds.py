"""Bounds on what a writer holds and a reader trusts, sized to a real 1024-rank run (issue 35.6): one
journal record (``writer.RECORD_MAX``: what readers take), the records held back while a disk does
not answer (``writer.HELD_BYTES``), the root-cause diagnosis of a 1024-rank stall (it fits), and a
run's index (``index.INDEX_MAX``: twice a 1024-rank x 261-span run's 63.7 MB). Past each, one warning
naming the path, and nothing of SGLang's is held or lost."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_fixtures import build_run
from conftest import read_journal
from sglang_phasetrace.tracing import files, process_state
from sglang_phasetrace.tracing.cli import main
from sglang_phasetrace.tracing.journal import records, schema
from sglang_phasetrace.tracing.journal import writer as journal_writer
from sglang_phasetrace.tracing.journal.tail import LINE_MAX
from sglang_phasetrace.tracing.journal.writer import RECORD_MAX, JournalWriter, dumps
from sglang_phasetrace.tracing.reader import index, load
from sglang_phasetrace.tracing.reader.view import RunView
from sglang_phasetrace.tracing.verdicts.diagnose import Finding
from sglang_phasetrace.tracing.verdicts.voice import WAITING_BYTES, diagnosis_record


@pytest.fixture(autouse=True)
def said_afresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    process_state.STATE.said.clear()
    monkeypatch.setattr(index, "_SAID", set())
    yield
    process_state.STATE.said.clear()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sglang_phasetrace" and r.levelno >= logging.WARNING]


# -- one record ------------------------------------------------------------------------------------


def test_a_record_over_what_readers_take_is_not_written_and_said_once_naming_the_journal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "journal" / "h-1.jsonl"
    writer = JournalWriter(path)
    assert RECORD_MAX == LINE_MAX  # a writer writes no line its readers refuse
    huge = {f"sglang.attr_{i}": "x" * 16_000 for i in range(80)}  # 80 fields, each within redaction's cap
    with caplog.at_level(logging.WARNING, "sglang_phasetrace"):
        assert writer.write(records.warning(1, "before"))
        assert not writer.write(records.event(2, "a" * 16, "too much", huge))
        assert not writer.write(records.event(3, "a" * 16, "too much again", huge))
        assert writer.write(records.warning(4, "after"))
    writer.close()
    written, problems = read_journal(path)
    assert problems == [] and [r["t"] for r in written] == [1, 4]
    (said,) = warnings_of(caplog)
    assert said.startswith("sglang-phasetrace: a event record of ") and str(path) in said and "1 MiB" in said


class Full:
    """``files.write_all`` on a full disk: nothing written, ENOSPC (until ``free``)."""

    def __init__(self) -> None:
        self.full = True

    def __call__(self, fd: int, data: bytes) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write_all(fd, data)


real_write_all = files.write_all


def test_records_held_back_keep_at_most_held_bytes_and_the_newest(tmp_path: Path, monkeypatch) -> None:
    """A full disk: 64 records of 200 KB each (12.8 MB) are held in at most ``HELD_BYTES`` (here
    1 MiB), the oldest dropped and counted; once the disk has room the newest are written in order
    with the note of the gap."""
    monkeypatch.setattr(journal_writer, "HELD_BYTES", 1 << 20)
    path = tmp_path / "p.jsonl"
    writer = JournalWriter(path)
    full = Full()
    monkeypatch.setattr(files, "write_all", full)
    for t in range(1, 65):
        assert not writer.write(records.warning(t, "x" * 200_000))
    held = writer.trouble()
    assert held is not None and held["held"] == 5 and held["dropped"] == 59
    assert writer._bytes <= 1 << 20
    full.full = False
    assert writer.flush()
    written, problems = read_journal(path)
    assert problems == [] and [r["t"] for r in written[:5]] == [60, 61, 62, 63, 64]
    assert "59 dropped" in written[5]["message"]
    writer.close()


# -- the largest record a 1024-rank launch writes ----------------------------------------------------


def test_the_root_cause_of_a_1024_rank_world_barrier_stall_fits_one_record() -> None:
    """tp3 silent, its 1023 peers waiting in a barrier of the world group, whose name lists every
    member (~4 KB): all of them in ``waiting`` made a 4.2 MB record no reader takes. The record keeps
    the peers that fit ``WAITING_BYTES`` and says how many more; a reader takes it."""
    group = f"world:0[{','.join(map(str, range(1024)))}]"
    waiting = {f"tp{r % 8}-dp{r // 8}": f"barrier #5 on group '{group}' since 40 s" for r in range(1024) if r != 3}
    finding = Finding("silent", "tp3-dp0", 4242, "dist.init", 40.0, "rank tp3-dp0 is silent … " * 600)
    finding.waiting = waiting
    line = (dumps(diagnosis_record(finding)) + "\n").encode()
    assert 64_000 < len(line) < 128_000 < RECORD_MAX, len(line)
    record = diagnosis_record(finding)
    assert schema.validate(record) is None
    kept = record["waiting"]
    assert list(kept)[:-1] == list(waiting)[: len(kept) - 1] and sum(map(len, kept)) < WAITING_BYTES
    assert kept["…"] == f"{len(waiting) - (len(kept) - 1)} more peers wait (not kept in this record)"
    small = {f"tp{r}": "barrier #5 on group 'tp:0[0..7]' since 40 s" for r in range(1, 8)}
    finding.waiting = small
    assert diagnosis_record(finding)["waiting"] == small  # a usual one is kept whole


# -- the index ---------------------------------------------------------------------------------------


def test_an_index_over_the_bound_is_neither_read_nor_written_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capsys
) -> None:
    """An index past ``INDEX_MAX`` (a planted one, or a run past twice 1024 ranks' worth) is not
    read, and a writer does not write one no reader would take: one warning naming it per process."""
    run = build_run(tmp_path / "run", ranks=4, spans=40).path
    [written] = index.write(RunView(run).refresh(), True, load._levels, load._shallow)
    size = written.stat().st_size
    assert index.open_index(run) is not None
    monkeypatch.setattr(index, "INDEX_MAX", size - 1)
    with caplog.at_level(logging.WARNING, "sglang_phasetrace"):
        assert index.open_index(run) is None and index.open_index(run) is None  # the one there: not read
        (said,) = warnings_of(caplog)
        assert said.startswith(f"sglang-phasetrace: index {written} not used (it is over ") and "MiB" in said
        monkeypatch.setattr(index, "_SAID", set())  # another process: one that would write it
        written.unlink()
        for _ in range(2):
            assert index.write(RunView(run).refresh(), True, load._levels, load._shallow) == []
    (said,) = warnings_of(caplog)[1:]
    assert said.startswith(f"sglang-phasetrace: index {written} not written (") and "MiB a reader takes" in said
    assert not written.exists()
    assert main(["status", str(run), "--once"]) == 0  # the journals are read
    assert "tp0" in capsys.readouterr().out
