"""The ``phasetrace`` verbs on synthetic runs (every shape) and on one real traced tp=2 CPU start.

Assertions read parsed output (JSON, table rows, the report's embedded data), never whitespace.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_fixtures import FAIL_MESSAGE, PEER_WAIT_PHASE, STALL_PHASE, SyntheticRun, build_run
from conftest import requires_sglang
from sglang_phasetrace.tracing import files as files_module
from sglang_phasetrace.tracing.cli import command as command_module
from sglang_phasetrace.tracing.cli import main
from sglang_phasetrace.tracing.reader import forked_helper, load
from sglang_phasetrace.tracing.reader import view as rundir
from sglang_phasetrace.tracing.render import lane_jobs
from sglang_phasetrace.tracing.render import lanes as lanes_module
from sglang_phasetrace.tracing.render.lanes import Layout, layout
from sglang_phasetrace.tracing.verdicts import diagnose, postmortem
from sglang_phasetrace.tracing.verdicts import findings as findings_module
from sglang_phasetrace.tracing.verdicts.diagnose import Finding

VERBS = ("run", "status", "timeline", "compare", "report", "export", "doctor", "bundle", "env", "preflight")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SyntheticRun]:
    base = tmp_path_factory.mktemp("synthetic")
    return {
        "ok": build_run(base / "ok", ranks=4, spans=40),
        "slow": build_run(base / "slow", ranks=4, spans=40, slow_rank=2),
        "stalled": build_run(base / "stalled", ranks=4, spans=40, stalled_rank=1, corrupt=True),
        "failed": build_run(base / "failed", ranks=3, spans=40, failed_rank=1),
    }


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def rows_by_label(text: str, labels: list[str]) -> dict[str, str]:
    """The first output line starting with each label (timeline rows, table rows)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        first = line.split(maxsplit=1)[0] if line.strip() else ""
        if first in labels and first not in found:
            found[first] = line
    return found


def legend(text: str) -> dict[str, dict[str, str]]:
    """Timeline legend lines ``glyph  phase  spread  [slowest X]  [open in …]`` by phase."""
    out = {}
    for m in re.finditer(r"^  (\S)  (\S+(?: \[\S+\])?)\s+(.+?)(?:  slowest (\S+))?(?:  open in (.+))?$", text, re.M):
        out[m[2]] = {"glyph": m[1], "slowest": m[4] or "", "open": m[5] or ""}
    return out


def report_data(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="data">(.*?)</script>', html, re.S)
    assert m, "the report embeds its timeline data"
    return json.loads(m[1].replace("<\\/", "</"))


# -- the command line itself ------------------------------------------------------------------------


def test_help_lists_every_verb_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    for verb in VERBS:
        assert re.search(rf"^\s+{verb}\s+\S", out, re.M), f"{verb} missing from --help"
    assert "exit codes" in out
    for verb in VERBS:
        code, out, _ = run_cli(capsys, verb, "--help")
        assert code == 0 and "phasetrace" in out and "usage:" in out


def test_a_viewer_that_exits_next_leaves_the_collector_off(
    runs: dict[str, SyntheticRun], capsys: pytest.CaptureFixture[str]
) -> None:
    """A viewer turns Python's cycle collector off while it reads (one large graph without cycles).
    Where the process exits next (``console``) it stays off: turned on again, the next allocation
    would scan everything the verb made (0.1 s at 1024 ranks) just before the exit. A caller that
    goes on (a test, a library) has it on again."""
    import gc

    path = str(runs["ok"].path)
    assert gc.isenabled()
    try:
        assert main(["timeline", path], exiting=True) == 0
        assert not gc.isenabled()
    finally:
        gc.enable()
        command_module._KEPT.clear()
    assert run_cli(capsys, "timeline", path)[0] == 0
    assert gc.isenabled()


def test_bad_usage_and_bad_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert (
        run_cli(
            capsys,
        )[0]
        == 2
    )
    assert run_cli(capsys, "timeline")[0] == 2
    code, _, err = run_cli(capsys, "timeline", str(tmp_path / "nowhere"))
    assert code == 1 and str(tmp_path / "nowhere") in err and "not a phasetrace run directory" in err
    code, _, err = run_cli(capsys, "compare", str(tmp_path), str(tmp_path), str(tmp_path))
    assert code == 2 and "two" in err


READERS = {
    "status": ["--once"],
    "timeline": [],
    "compare": [],
    "report": ["-o", "-"],
    "export": ["-o", "-"],
    "watch": ["--timeout", "0.2"],
}


def test_every_verb_on_a_bad_run_directory_says_why_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    no_journal = tmp_path / "empty"
    no_journal.mkdir()
    cases = {
        str(tmp_path / "nowhere"): "it does not exist",
        str(a_file): "not a directory",
        str(no_journal): "no journal/ inside",
    }
    for verb, extra in READERS.items():
        for path, why in cases.items():
            code, _, err = run_cli(capsys, verb, path, *extra)
            assert code == 1 and why in err and path in err, (verb, path, err)
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    base = tmp_path / "runs"  # the directory the runs are made in: its newest run is named
    for name in ("20261204-100000-aaaaaa", "20261204-110000-bbbbbb"):
        (base / name / "journal").mkdir(parents=True)
    os.utime(base / "20261204-100000-aaaaaa", (1, 1))
    code, _, err = run_cli(capsys, "timeline", str(base))
    newest = base / "20261204-110000-bbbbbb"
    assert code == 1 and f"no journal/ inside; a directory of runs, the newest: {newest}" in err, err
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked"
        (locked / "journal").mkdir(parents=True)
        locked.chmod(0)
        try:
            code, _, err = run_cli(capsys, "timeline", str(locked))
            assert code == 1 and "Permission denied" in err, err
        finally:
            locked.chmod(0o700)


def test_watch_on_a_run_directory_it_cannot_write_watches_without_recording(
    runs: dict[str, SyntheticRun], capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    shutil.copytree(runs["stalled"].path, run)
    if os.geteuid() == 0:  # root writes anywhere: the file system says no instead

        def read_only(path: Path) -> None:
            raise OSError(errno.EROFS, "Read-only file system", str(path))

        monkeypatch.setattr(command_module, "JournalWriter", read_only)
    else:
        (run / "journal").chmod(0o500)
    try:
        code, _, err = run_cli(capsys, "watch", str(run), "--timeout", "0.5", "--interval", "0.1", "--no-py-spy")
    finally:
        (run / "journal").chmod(0o700)
    assert code in (0, 3) and "Traceback" not in err
    assert err.count("cannot write") == 1 and "watching without recording" in err, err
    assert not [p for p in (run / "journal").iterdir() if p.name.startswith("watch-")]


def test_corrupt_lines_reported_once_with_file_and_line_and_the_rest_used(
    runs: dict[str, SyntheticRun], capsys: pytest.CaptureFixture[str]
) -> None:
    run = runs["stalled"]
    code, out, err = run_cli(capsys, "compare", str(run.path), "--json")
    assert code == 0
    for where in run.broken:
        assert err.count(where + ":") == 1, err
    phases = {p["phase"]: p for p in json.loads(out)["phases"]}
    assert set(phases["rank"]["per_rank_s"]) == set(run.labels)  # the damaged journals still count


def _state(run: rundir.RunView) -> list:
    """Everything a reader uses of each process, comparable."""
    out = []
    for proc in run.processes:
        fields = {k: v for k, v in vars(proc).items() if k != "spans"}
        spans = [tuple(getattr(s, f) for f in s.__struct_fields__) for s in proc.spans.values()]
        out.append((fields, spans))
    return out


def _bars(lay: Layout) -> list:
    return [
        (lane.label, lane.state, [(b.uid, b.depth, b.key, b.span.start, b.end, b.span.status) for b in lane.bars])
        for lane in lay.lanes
    ]


@pytest.mark.forks
@pytest.mark.parametrize("name", ["stalled", "failed"])
def test_a_large_run_read_on_two_cores_is_the_same_run(
    runs: dict[str, SyntheticRun], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI reads a large run with a forked child (the last journals): the same processes, spans
    and ``file:line`` problems as read in one process; a child that fails changes nothing either."""
    path = runs[name].path
    serial = load.load_run(path)
    monkeypatch.setattr(load.Child, "MIN_BYTES", 0)
    monkeypatch.setattr(load.Child, "SHARE", 0.75)  # the child reads the damaged journals too
    started: list[load.Child] = []
    start = load.Child.start

    def spy(journals: list[Path], final: bool, shallow: int | None = None) -> load.Child | None:
        child = start(journals, final, shallow)
        started.append(child)
        return child

    monkeypatch.setattr(load.Child, "start", staticmethod(spy))
    parallel = load.load_run(path, parallel=True)
    assert started and started[0] is not None and 0 < started[0].first < len(list((path / "journal").iterdir()))
    assert parallel.problems == serial.problems
    if name == "stalled":  # a problem the child found comes back with its file:line
        assert any(problem.startswith(str(p)) for p in started[0].journals for problem in parallel.problems)
    assert _state(parallel) == _state(serial)
    assert [r.path for _, r in parallel._tails.values()] == [r.path for _, r in serial._tails.values()]

    for depth in (0, 1, 2):  # a timeline's read: the child sends only what is drawn, the same lanes
        shallow = load.load_run(path, parallel=True, shallow=depth)
        assert _bars(layout(shallow, depth=depth)) == _bars(layout(serial, depth=depth))
        assert shallow.problems == serial.problems

    def broken(path: Path, final: bool, shallow: int | None = None) -> tuple:
        raise RuntimeError("the child fails")

    monkeypatch.setattr(load, "_pack", broken)  # runs in the child: it exits 1, the parent reads all
    again = load.load_run(path, parallel=True)
    assert again.problems == serial.problems and _state(again) == _state(serial)


def _what_verdicts_read(run: rundir.RunView, phases: set[str]) -> list:
    """Per rank, every answer the verdicts take from its spans (``diagnose``, ``postmortem``,
    ``hints``, ``verdicts.findings``): where it is or was between phases, how often each phase ended and
    when last, its latest span of each phase with its ancestors, where it was at its end, progress."""
    out = []
    for proc in run.ranks:
        now = proc.last_t + 60 * 10**9
        latest = {}
        for span in proc.spans.values():
            latest[span.phase] = span
        chains = {}
        for phase, span in latest.items():
            chain: list[tuple] = []
            while span is not None and len(chain) < 64:  # a hand-made journal's span may be its own parent
                chain.append((span.span_id, span.phase, span.status, span.end))
                span = proc.spans.get(span.parent_id) if span.parent_id else None
            chains[phase] = chain
        out.append(
            (
                proc.label,
                diagnose._where(proc, now),
                {phase: proc.ended(phase) for phase in sorted(phases)},
                chains,
                [postmortem._innermost_at(proc, t) for t in (proc.last_t, proc.last_t + 10**9)],
                diagnose.progress_estimate(proc, proc.heartbeats, now),
                postmortem._error_phase(proc),
            )
        )
    return out


@pytest.mark.forks
@pytest.mark.parametrize("name", ["ok", "stalled", "failed"])
def test_a_shallow_two_core_read_gives_the_verdicts_a_whole_read_gives(
    runs: dict[str, SyntheticRun], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``status`` reads a large run shallow (the child sends back only what is drawn): what every
    verdict reads of a rank's spans is still there, so status says what the watchdog says."""
    path = runs[name].path
    serial = load.load_run(path)
    phases = {s.phase for p in serial.processes for s in p.spans.values()}
    monkeypatch.setattr(load.Child, "MIN_BYTES", 0)
    monkeypatch.setattr(load.Child, "SHALLOW_SHARE", 0.75)
    for depth in (0, 1):
        shallow = load.load_run(path, parallel=True, shallow=depth)
        sent = sum(len(p.spans) for p in shallow.processes)
        assert sent < sum(len(p.spans) for p in serial.processes)  # some were left out
        assert _what_verdicts_read(shallow, phases) == _what_verdicts_read(serial, phases)
        end = max(p.last_t for p in serial.processes)
        for now in (end, end + 120 * 10**9):
            said = [(f.kind, f.label, f.phase, f.message) for f in findings_module.findings(shallow, now)]
            assert said == [(f.kind, f.label, f.phase, f.message) for f in findings_module.findings(serial, now)]


def _outputs(capsys: pytest.CaptureFixture[str], path: Path, out: Path) -> list:
    """What compare, export (Jaeger), report and timeline write for the run at ``path``."""
    code, compared, _ = run_cli(capsys, "compare", str(path), "--json")
    assert code == 0
    drawn = [run_cli(capsys, "timeline", str(path), "--width", "140", "--depth", str(d)) for d in (0, 2)]
    assert all(code == 0 for code, _, _ in drawn)
    assert run_cli(capsys, "export", str(path), "--format", "jaeger", "-o", str(out / "jaeger.json"))[0] == 0
    code, piped, _ = run_cli(capsys, "export", str(path), "--format", "jaeger", "-o", "-")
    assert code == 0
    assert run_cli(capsys, "report", str(path), "-o", str(out / "r.html"))[0] == 0
    jaeger = (out / "jaeger.json").read_bytes()
    return [compared, jaeger, piped, (out / "r.html").read_bytes(), *(o for _, o, _ in drawn)]


@pytest.mark.parametrize(
    "how", ["split", "child fails", "child dies", "child fails writing", "child dies writing", "ids repeat"]
)
@pytest.mark.forks
def test_a_split_run_renders_the_same_as_one_read_in_one_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """compare, export, report and timeline have a forked child lay out and render the lanes of the journals
    it read (it sends back only what verdicts read; a Jaeger file's spans of its lanes it writes
    there itself): the same bytes as one process makes, also when the child fails or dies midway
    (writing too), or when span ids repeat across ranks (then it sends all)."""
    run = build_run(tmp_path / "run", ranks=6, spans=60, stalled_rank=4, same_ids=how == "ids repeat")
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    alone = _outputs(capsys, run.path, tmp_path / "one")
    monkeypatch.setattr(load.Child, "MIN_BYTES", 0)
    monkeypatch.setattr(load.Child, "SPLIT_SHARE", 0.6)
    splits: list[rundir.RunView] = []
    load_run = load.load_run

    def spy(*args: Any, **kwargs: Any) -> rundir.RunView:
        view = load_run(*args, **kwargs)
        splits.append(view)
        return view

    monkeypatch.setattr(command_module, "load_run", spy)
    jobs = forked_helper.JOBS  # what the helper runs: as forked with this process's registry
    if how == "child fails":  # it answers each with an error
        monkeypatch.setitem(jobs, forked_helper.ref(lane_jobs._part_job), _fails)
        monkeypatch.setitem(jobs, forked_helper.ref(lane_jobs._part_hold), _fails)
    if how == "child dies":
        monkeypatch.setitem(jobs, forked_helper.ref(lanes_module._part_prepare), _dies)
    if how.endswith("writing"):
        monkeypatch.setitem(jobs, forked_helper.ref(lane_jobs._part_write), _fails if "fails" in how else _dies)
    assert _outputs(capsys, run.path, tmp_path / "two") == alone
    assert [view.split is None for view in splits] == [how == "ids repeat"] * 6
    if how == "split":  # the child did its part of each, the Jaeger file's writing included
        assert not any(view.split.lost for view in splits)
    if how in ("child fails", "child dies"):
        assert all(view.split.lost for view in splits)
    if how.endswith("writing"):  # the Jaeger file's: the child was asked to write, and failed
        assert [view.split.lost for view in splits] == [False, False, False, True, False, False]


@pytest.mark.forks
def test_long_values_are_written_from_one_copy_with_the_same_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every export format keeps a long attrs value as one shared piece (``files.Gathered``, written
    by ``pwritev``, here and in a split run's child; a rank root's server arguments are 20 KB): with
    every value counted long, the files and the piped output are the bytes made without it."""
    from sglang_phasetrace.tracing.render import jaeger, otlp_json, perfetto

    run = build_run(tmp_path / "run", ranks=6, spans=60, stalled_rank=4)

    def exports(out: Path) -> list[bytes]:
        out.mkdir()
        got = []
        for fmt in ("jaeger", "otlp-json", "perfetto"):
            assert run_cli(capsys, "export", str(run.path), "--format", fmt, "-o", str(out / fmt))[0] == 0
            code, piped, _ = run_cli(capsys, "export", str(run.path), "--format", fmt, "-o", "-")
            assert code == 0
            got += [(out / fmt).read_bytes(), piped.encode()]
        return got

    plain = exports(tmp_path / "plain")
    for module in (jaeger, otlp_json, perfetto):
        monkeypatch.setattr(module, "LONG", 0)
    monkeypatch.setattr(load.Child, "MIN_BYTES", 0)
    gathered = []
    real = lane_jobs.pwrite_all
    monkeypatch.setattr(lane_jobs, "pwrite_all", lambda fd, data, at: (gathered.append(type(data)), real(fd, data, at)))
    assert exports(tmp_path / "gathered") == plain
    assert files_module.Gathered in gathered  # this process's pieces (the child's are written in the child)


@pytest.mark.parametrize(
    "items",
    [
        [b"a"],
        [(b"h", b"L", b"t")],
        [b"a", (b"h", b"L", b"t"), b"b"],
        [(b"h", b"L", b"t"), (b"H", b"M", b"T")],
        [b"a", b"b", (b"h", b"L", b"t")],
        [(b"h", b"L", b"t"), b"a", b"b"],
        [],
    ],
)
def test_list_items_is_the_items_joined(items: list) -> None:
    from sglang_phasetrace.tracing.render.jsonout import list_items

    got = list_items(items)
    assert bytes(got) == b",".join(x if type(x) is bytes else b"".join(x) for x in items)
    assert any(type(x) is tuple for x in items) == isinstance(got, files_module.Gathered)


def _fails(*args: Any) -> None:
    raise RuntimeError("the child fails")


def _dies(*args: Any) -> None:
    os._exit(1)


def test_a_secret_in_a_phase_key_is_redacted_by_every_verb_that_shows_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """compare lays a run out without redacting attributes (it shows none): the keys it shows
    are redacted all the same, as timeline's and the report's are."""
    run = build_run(tmp_path / "run", ranks=2, spans=12)
    secret = "hf_abcdefghijklmnopqrstuvwxyz0123"
    for journal in (run.path / "journal").glob("*.jsonl"):
        journal.write_text(
            journal.read_text().replace('"sglang.group_name":"tp"', f'"sglang.group_name":"tp {secret}"')
        )
    for argv in (["compare", "--json"], ["compare"], ["timeline", "--depth", "4", "--width", "200"]):
        code, out, _err = run_cli(capsys, argv[0], str(run.path), *argv[1:])
        assert code == 0 and "[REDACTED]" in out and secret not in out and "abcdefghij" not in out, (argv, out)


# -- timeline ------------------------------------------------------------------------------------------


def test_timeline_rows_open_phases_and_slowest(
    runs: dict[str, SyntheticRun], capsys: pytest.CaptureFixture[str]
) -> None:
    run = runs["stalled"]
    code, out, _ = run_cli(capsys, "timeline", str(run.path), "--width", "140", "--depth", "2")
    assert code == 0
    rows = rows_by_label(out, ["launcher", *run.labels])
    assert set(rows) == {"launcher", *run.labels}
    assert f"open in {STALL_PHASE}" in rows["tp1"]
    for peer in set(run.labels) - {"tp1"}:
        assert f"open in {PEER_WAIT_PHASE} [tp]" in rows[peer]
    assert all(">" in row for row in rows.values())
    phases = legend(out)
    assert "tp1" in phases[STALL_PHASE]["open"]

    slow = runs["slow"]
    code, out, _ = run_cli(capsys, "timeline", str(slow.path), "--width", "140")
    rows, phases = rows_by_label(out, slow.labels), legend(out)
    item = phases["scheduler.init_tp_worker"]
    assert item["slowest"] == slow.slow
    chart = lambda row: row.split(maxsplit=1)[1]  # noqa: E731
    assert item["glyph"].upper() in chart(rows[slow.slow])
    assert all(item["glyph"].upper() not in chart(rows[r]) for r in slow.labels if r != slow.slow)


def test_timeline_failed_rank(runs: dict[str, SyntheticRun], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "timeline", str(runs["failed"].path), "--width", "120")
    assert code == 0
    assert "failed in model.load_weights" in rows_by_label(out, ["tp1"])["tp1"]


# -- compare -------------------------------------------------------------------------------------------


def test_compare_ranks_sorted_by_skew(runs: dict[str, SyntheticRun], capsys: pytest.CaptureFixture[str]) -> None:
    run = runs["slow"]
    code, out, _ = run_cli(capsys, "compare", str(run.path), "--json")
    assert code == 0
    phases = json.loads(out)["phases"]
    skews = [p["skew_s"] for p in phases]
    assert skews == sorted(skews, reverse=True)
    by = {p["phase"]: p for p in phases}
    weights = by["model.weights_iterator"]
    assert weights["slowest"] == run.slow and weights["ranks"] == 4
    assert weights["skew_s"] == pytest.approx(weights["max_s"] - weights["min_s"])
    # one rank loads two models: target and draft are told apart, not summed
    assert {"model.load_weights", "model.load_weights [draft]", "dist.group_coordinator [tp]"} <= set(by)
    assert by["graph.capture_bs"]["count"] > 1  # repeats of one variant are summed, and counted

    code, out, _ = run_cli(capsys, "compare", str(run.path))
    table = rows_by_label(out, ["model.weights_iterator"])["model.weights_iterator"]
    assert run.slow in table.split()


def test_compare_two_runs(runs: dict[str, SyntheticRun], capsys: pytest.CaptureFixture[str]) -> None:
    a, b = runs["ok"], runs["slow"]
    code, out, _ = run_cli(capsys, "compare", str(a.path), str(b.path), "--json")
    assert code == 0
    phases = json.loads(out)["phases"]
    weights = [abs(p["delta_s"]) if p["delta_s"] is not None else max((p["a"] or p["b"])["max_s"], 0) for p in phases]
    assert weights == sorted(weights, reverse=True)
    by = {p["phase"]: p for p in phases}
    w = by["model.weights_iterator"]
    assert w["delta_s"] == pytest.approx(w["b"]["max_s"] - w["a"]["max_s"]) and w["delta_s"] > 1

    stalled = runs["stalled"]
    code, out, _ = run_cli(capsys, "compare", str(a.path), str(stalled.path), "--json")
    by = {p["phase"]: p for p in json.loads(out)["phases"]}
    assert by["kv_cache.alloc"]["b"] is None and by["kv_cache.alloc"]["delta_s"] is None  # only in A
    assert by[STALL_PHASE]["b"]["open"] == ["tp1"]

    code, out, _ = run_cli(capsys, "compare", str(a.path), str(b.path))
    assert (
        code == 0
        and "model.weights_iterator" in out
        and "+" in rows_by_label(out, ["model.weights_iterator"])["model.weights_iterator"]
    )


# -- status --------------------------------------------------------------------------------------------


def test_status_stalled_run_exits_nonzero(runs: dict[str, SyntheticRun], capsys: pytest.CaptureFixture[str]) -> None:
    run = runs["stalled"]
    code, out, _ = run_cli(capsys, "status", str(run.path), "--json")
    assert code == 3
    ranks = {r["label"]: r for r in json.loads(out)["ranks"]}
    stuck = ranks["tp1"]
    assert stuck["state"] == "stalled" and stuck["phase"] == STALL_PHASE
    assert stuck["verdict"].startswith("straggler:") and "peers wait" in stuck["verdict"]
    assert stuck["heartbeat_age_s"] > 60 and stuck["rss"] == 2_500_000_000 and stuck["threads"] == 12
    assert stuck["progress"] == "1/2 (50%) groups" and stuck["collective"].startswith("barrier tp #4")
    assert stuck["gpu"] == ""  # not in the heartbeat: blank, never made up
    assert any(f["label"] == "tp1" and f["kind"] == "straggler" for f in json.loads(out)["findings"])
    code, out, _ = run_cli(capsys, "status", str(run.path), "--once")
    assert code == 3
    assert "stalled" in rows_by_label(out, ["tp1"])["tp1"]
    assert re.search(r"^tp1: straggler: .*peers wait", out, re.M)


def test_status_ready_and_failed(runs: dict[str, SyntheticRun], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "status", str(runs["ok"].path), "--json")
    assert code == 0 and {r["state"] for r in json.loads(out)["ranks"]} == {"ready"}
    code, out, _ = run_cli(capsys, "status", str(runs["ok"].path))  # live: stops, nothing will change
    assert code == 0 and rows_by_label(out, ["tp3"])["tp3"].split()[:3] == ["tp3", "2003", "ready"]
    code, out, _ = run_cli(capsys, "status", str(runs["failed"].path), "--json")
    ranks = {r["label"]: r for r in json.loads(out)["ranks"]}
    assert code == 4 and ranks["tp1"]["state"] == "failed" and ranks["tp1"]["phase"] == "model.load_weights"


def test_status_verdict_from_analysis_without_diagnosis_record(
    runs: dict[str, SyntheticRun], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = runs["ok"]
    seen = []

    def analyze(view, now_ns, thresholds, notices=False, read=None):
        seen.append(now_ns)
        return [Finding("silent", "tp2", run.pids["tp2"], "kv_cache.alloc", 42.0, "no heartbeat for 42 s")]

    monkeypatch.setattr(findings_module, "analyze", analyze)
    code, out, _ = run_cli(capsys, "status", str(run.path), "--json")
    ranks = {r["label"]: r for r in json.loads(out)["ranks"]}
    assert seen and code == 3
    assert ranks["tp2"]["state"] == "stalled" and ranks["tp2"]["verdict"] == "silent: no heartbeat for 42 s"
    assert ranks["tp0"]["state"] == "ready"


# -- report --------------------------------------------------------------------------------------------


def test_report_highlights_the_stalled_rank(
    runs: dict[str, SyntheticRun], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run = runs["stalled"]
    out_file = tmp_path / "r.html"
    code, out, _ = run_cli(capsys, "report", str(run.path), "-o", str(out_file))
    assert code == 0 and str(out_file) in out
    html = out_file.read_text()
    body = html.split("<body>", 1)[1]  # the first line is the verdict, as the watchdog says it
    assert re.match(
        r'\s*<div id="verdict" class="verdict stalled">STALL tp1 has been in '
        + re.escape(STALL_PHASE)
        + r" for 85 s while 3 peers wait",
        body,
    ), body[:300]
    assert "<title>STALL tp1 — " in html
    assert 'class="finding" data-rank="tp1"' in html
    assert "init_distributed_environment" in html  # the stack dump is embedded
    assert all(f"<td>{peer}</td><td>{PEER_WAIT_PHASE}</td>" in html for peer in ("tp0", "tp2", "tp3"))
    data = report_data(html)
    lanes = {lane["label"]: lane for lane in data["lanes"]}
    assert lanes["tp1"]["state"] == "stalled" and lanes["tp1"]["where"] == STALL_PHASE
    assert lanes["tp1"]["verdict"].startswith("straggler")
    open_bars = [b for b in lanes["tp1"]["bars"] if b[6] & 1]
    assert {data["keys"][b[3]] for b in open_bars} == {"rank", "dist.init", STALL_PHASE}
    assert not re.search(r'(src|href)="(https?:)?//', html) and "@import" not in html  # self-contained


def test_report_failed_run_shows_the_error(
    runs: dict[str, SyntheticRun], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, _ = run_cli(capsys, "report", str(runs["failed"].path), "-o", str(tmp_path / "f.html"))
    html = (tmp_path / "f.html").read_text()
    assert (
        code == 0
        and 'class="verdict failed">FAILED rank tp1 (pid 2001) failed: RuntimeError: '
        + FAIL_MESSAGE
        + " in &#x27;model.load_weights&#x27;"
        in html
    )
    assert FAIL_MESSAGE in html and 'class="error" open data-rank="tp1"' in html


# -- on a real traced start ----------------------------------------------------------------------------


@pytest.mark.sglang
def test_real_run_every_reader(engine_run, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    run_dir = str(engine_run.run_dir)
    ranks = ["tp0", "tp1"]

    code, out, err = run_cli(capsys, "timeline", run_dir, "--width", "140", "--depth", "2")
    assert code == 0 and "skipped" not in err
    rows = rows_by_label(out, ["launcher", *ranks])
    assert set(rows) == {"launcher", *ranks} and all(rows[r].rstrip().endswith("ready") for r in ranks)
    phases = legend(out)
    assert {"rank.bootstrap", "scheduler.init_tp_worker", "dist.init_process_group"} <= set(phases)
    boot = phases["rank.bootstrap"]
    assert boot["slowest"] in ranks
    other = next(r for r in ranks if r != boot["slowest"])
    assert boot["glyph"].upper() in rows[boot["slowest"]] and boot["glyph"].upper() not in rows[other].split()[1]

    code, out, _ = run_cli(capsys, "compare", run_dir, "--json")
    phases = {p["phase"]: p for p in json.loads(out)["phases"]}
    for name in ("rank", "dist.init", "model.load_weights", "kv_cache.alloc", "dist.group_coordinator [tp]"):
        assert set(phases[name]["per_rank_s"]) == set(ranks) and phases[name]["open"] == [], name
    assert set(phases["launch.engine"]["per_rank_s"]) == {"launcher"}
    code, out, _ = run_cli(capsys, "compare", run_dir, run_dir, "--json")
    assert code == 0 and all(p["delta_s"] == 0 for p in json.loads(out)["phases"])

    code, out, _ = run_cli(capsys, "status", run_dir, "--json")
    doc = json.loads(out)
    rows = {r["label"]: r for r in doc["ranks"]}
    assert code == 0 and set(rows) == {"launcher", *ranks, "detokenizer"}  # every process of the launch
    # it served, and its processes have exited since: ended, not ready (issue 41.3)
    assert all(rows[r]["state"] == "ended" and rows[r]["verdict"] == "" for r in ["launcher", *ranks, "detokenizer"])
    assert doc["ended"]["t"] > 0 and doc["ended"]["how"], doc["ended"]  # a teardown, or "not recorded"
    for r in ranks:  # a heartbeat was written: its figures are shown; GPU fields stay blank on CPU
        if rows[r]["heartbeat_age_s"] is not None:
            assert rows[r]["rss"] > 0 and rows[r]["threads"] > 0 and rows[r]["gpu"] == ""

    report = tmp_path / "real.html"
    assert run_cli(capsys, "report", run_dir, "-o", str(report))[0] == 0
    html = report.read_text()
    assert 'class="verdict ended">ENDED — the launch served, then ended' in html and "2 ranks were ready" in html
    data = report_data(html)
    lanes = {lane["label"]: lane for lane in data["lanes"]}
    assert set(lanes) == {"launcher", *ranks, "detokenizer"} and all(len(lanes[r]["bars"]) > 10 for r in ranks)
    assert "<td>model.load_weights</td>" in html


@pytest.mark.sglang
@requires_sglang
def test_doctor_on_installed_sglang() -> None:
    both = (
        "import sys; from sglang_phasetrace.tracing.cli import main; code = main(['doctor', '--json']); "
        "print('\\n=====', flush=True); sys.exit(code or main(['doctor']))"
    )  # one import of SGLang
    done = subprocess.run([sys.executable, "-c", both], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    as_json, table = done.stdout.split("\n=====\n")
    report = json.loads(as_json)
    phases = {p["phase"]: p for p in report["phases"]}
    assert report["sglang"] and report["missing_required"] == []
    assert phases["rank"]["status"] == "ok" and phases["rank"]["required"]
    assert phases["rank"]["targets"][0]["state"] == "used"
    runtime = [p for p in report["phases"] if p["targets"] and p["targets"][0]["target"].startswith("*:")]
    assert runtime and all(p["status"] == "run time" for p in runtime)
    assert "every required phase resolves" in table and "resolved on the model classes" in table
    assert rows_by_label(table, ["rank"])["rank"].split()[1:4] == ["first", "yes", "ok"]


def test_watch_honours_every_threshold_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``phasetrace watch`` makes its thresholds as ``status`` does: every variable, flags over them."""
    from sglang_phasetrace.tracing.cli import watch as watch_cli
    from sglang_phasetrace.tracing.verdicts.diagnose import Thresholds

    made: list[Thresholds] = []

    def watchdog(run_dir: object, th: Thresholds, **kw: object) -> None:
        made.append(th)
        raise RuntimeError("made")  # the verb says it and returns: nothing is watched

    values = {"HEARTBEAT": 3, "SILENT": 13, "STALL": 31, "NO_PROGRESS": 121, "BLOCKED": 9, "BUSY": 61}
    for name, value in values.items():
        monkeypatch.setenv(f"SGLANG_PHASETRACE_{name}_S", str(value))
    monkeypatch.setattr(watch_cli, "Watchdog", watchdog)
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "journal").mkdir(mode=0o700)
    main(["watch", str(run)])
    main(["watch", str(run), "--stall-s", "40"])
    assert made == [Thresholds(3, 13, 31, 121, 9, 61), Thresholds(3, 13, 40, 121, 9, 61)]
