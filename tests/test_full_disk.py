"""A launch whose run directory's filesystem fills up during its start: SGLang serves as
untraced; one line says so for the whole launch (its launcher's: no rank's, not the history's);
``phasetrace status`` says what each journal lacks; once there is room again, every record a
process held back is written, with a note of the gap, and the run reads as a whole start.

The filesystem is a real tmpfs (root may mount one here; elsewhere the test skips with the reason),
filled to its last byte once every process of the launch traces into it: a 64 KiB one left to fill
by itself is full before the ranks start or after they are ready, as the machine's speed has it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import kill_group, read_journal, requires_sglang, run_dirs
from sglang_phasetrace.tracing.cli import main
from sglang_phasetrace.tracing.reader.load import load_run
from test_file_safety import fill, tmpfs
from test_hot_path import HEARTBEAT_S, Served  # its engine beats this often


def status_json(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    main(["status", str(run_dir), "--once", "--json"])
    return json.loads(capsys.readouterr().out)


def wait_until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(HEARTBEAT_S / 2)
    return found


@requires_sglang
@pytest.mark.sglang
def test_a_launch_on_a_full_disk_serves_says_it_once_and_writes_what_it_held_once_there_is_room(
    tiny_model: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err_path = tmp_path / "engine.err"
    with tmpfs(tmp_path / "runs", size="1m") as base, open(err_path, "w") as err:
        server = Served.start(tiny_model[0], base, tmp_path, err)
        proc = server.proc
        try:
            # every process of the launch traces (launcher, tp0, tp1, detokenizer): then the disk fills
            run_dir = wait_until(lambda: next(iter(run_dirs(base)), None), 300, "a run directory")
            wait_until(lambda: len(list((run_dir / "status").glob("*.json"))) >= 4, 300, "four status files")
            filler = fill(base)

            assert server.answer(timeout=300).get("ready")  # SGLang serves, as untraced
            assert server.ask("generate 1")["tokens"][0] > 0

            # one line for the launch, by the launcher; none per rank, none for the history
            said = [line for line in err_path.read_text().splitlines() if "sglang-phasetrace" in line]
            full = [line for line in said if "[Errno 28]" in line or "full" in line]
            assert len(full) == 1, said
            assert f"cannot write {run_dir}/" in full[0] and "every process of this launch" in full[0]
            assert " TP" not in full[0].split("sglang-phasetrace")[0]  # not a rank's log prefix

            # what is missing, and that it is held, not lost
            missing = wait_until(
                lambda: [m for m in status_json(run_dir, capsys)["missing"] if m.startswith(("tp0:", "tp1:"))],
                30,
                "the ranks' status files saying what their journals lack",
            )
            assert all("held in its memory" in m and "[Errno 28]" in m for m in missing), missing
            assert any("its filesystem is full" in m for m in status_json(run_dir, capsys)["missing"])

            filler.unlink()  # room again: the next beat of each process writes what it held
            wait_until(lambda: status_json(run_dir, capsys)["missing"] == [], 30, "the held records written")
            view = load_run(run_dir)
            ranks = {p.label: p for p in view.processes if p.role == "rank"}
            assert set(ranks) == {"tp0", "tp1"} and all(p.ready for p in ranks.values())
            assert all(any("written late" in w for w in p.warnings) for p in ranks.values())
            for journal in (run_dir / "journal").glob("*.jsonl"):
                assert read_journal(journal)[1] == [], journal  # whole lines only

            proc.stdin.close()  # serve_engine shuts the engine down at end of input
            assert proc.wait(timeout=120) == 0
        finally:
            kill_group(proc.pid)
            proc.wait(timeout=30)
