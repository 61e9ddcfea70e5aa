"""The viewers over several run directories: one per node of a multi-node launch, merged as one.

Two nodes of a launch (tp=4, two ranks each), each its own run directory as each host writes it:
node 1's spans started under its own trace id and its launcher's ``launch`` record maps that id to
the launch's (node 0's); node 1's clock is 3 s ahead. Assertions read parsed output.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_fixtures import STALL_PHASE, NodeRun, build_node
from sglang_phasetrace.tracing.cli import main
from sglang_phasetrace.tracing.cli.command import open_run
from sglang_phasetrace.tracing.render.lanes import layout
from sglang_phasetrace.tracing.render.otlp_spans import to_sdk_spans

TRACE0 = "0af7651916cd43dd8448eb211c80319c"  # node 0's: the launch's trace id
TRACE1 = "4bf92f3577b34da6a3ce929d0e0e4736"  # node 1's own, before the nodes agreed


def launch(base: Path, name: str, open_rank: int | None = None) -> tuple[NodeRun, NodeRun]:
    node0 = build_node(base / "host0" / name, 0, 2, local_trace=TRACE0, agreed_trace=TRACE0)
    node1 = build_node(
        base / "host1" / f"{name}-n1",
        1,
        2,
        local_trace=TRACE1,
        agreed_trace=TRACE0,
        skew_s=3.0,
        open_rank=open_rank,
    )
    return node0, node1


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> tuple[NodeRun, NodeRun]:
    return launch(tmp_path_factory.mktemp("multinode"), "20261201-120000-ab12cd", open_rank=1)


@pytest.fixture(scope="module")
def dirs(nodes: tuple[NodeRun, NodeRun]) -> list[str]:
    return [str(n.path) for n in nodes]


NAMES = {
    "launcher@node-0",
    "launcher@node-1",
    "tp0@node-0",
    "tp1@node-0",
    "tp2@node-1",
    "tp3@node-1",
}


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_status_merges_both_nodes_with_node_labels(dirs: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    _code, out, err = cli(capsys, "status", *dirs, "--json")
    doc = json.loads(out)
    rows = {r["label"]: r for r in doc["ranks"]}
    assert set(rows) == NAMES, (rows.keys(), err)
    assert doc["runs"] == dirs
    assert {r["node"] for r in rows.values()} == {0, 1}
    assert rows["tp3@node-1"]["state"] != "ready" and rows["tp3@node-1"]["phase"] == STALL_PHASE
    # node 1's clock is 3 s ahead of ours: its open phase began "in the future", shown as 0, not negative
    assert all(r["in_phase_s"] is None or r["in_phase_s"] >= 0 for r in rows.values())
    assert all(r["heartbeat_age_s"] is None or r["heartbeat_age_s"] >= 0 for r in rows.values())
    assert "Traceback" not in err

    _code, out, _ = cli(capsys, "status", *dirs, "--once")
    table = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert NAMES <= table, out


def test_timeline_shows_every_rank_of_both_nodes(dirs: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "timeline", *dirs, "--width", "140")
    assert code == 0, err
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip() and line.split()[0] in NAMES}
    assert set(rows) == NAMES, out
    assert f"open in {STALL_PHASE}" in rows["tp3@node-1"]
    assert "ready" in rows["tp0@node-0"] and "ready" in rows["tp2@node-1"]
    code, out, _ = cli(capsys, "timeline", *dirs, "--depth", "3", "--width", "75")  # the narrowest, nested: no crash
    assert code == 0 and "tp3@node-1" in out


def test_exports_hold_one_trace(dirs: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for fmt in ("jaeger", "otlp-json", "perfetto"):
        assert cli(capsys, "export", *dirs, "--format", fmt, "-o", str(tmp_path / f"{fmt}.json"))[0] == 0

    jaeger = json.loads((tmp_path / "jaeger.json").read_text())
    assert [t["traceID"] for t in jaeger["data"]] == [TRACE0]
    (trace,) = jaeger["data"]
    assert {s["traceID"] for s in trace["spans"]} == {TRACE0}
    services = {p["serviceName"] for p in trace["processes"].values()}
    assert {f"sglang {name}" for name in NAMES} == services
    tags = {p["serviceName"]: {t["key"]: t["value"] for t in p["tags"]} for p in trace["processes"].values()}
    assert tags["sglang tp2@node-1"]["sglang.node_rank"] == 1
    # node 1's rank roots hang under node 1's launcher root, in the one trace
    by_id = {s["spanID"]: s for s in trace["spans"]}
    roots = [s for s in trace["spans"] if s["operationName"].startswith("rank tp2")]
    assert roots and all(by_id[s["references"][0]["spanID"]]["operationName"] == "sglang.launch" for s in roots)
    assert sum(1 for s in trace["spans"] if not s["references"]) == 2  # the two launchers' roots

    otlp = json.loads((tmp_path / "otlp-json.json").read_text())
    spans = [s for rs in otlp["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert {s["traceId"] for s in spans} == {TRACE0}
    nodes = {
        a["value"].get("intValue")
        for rs in otlp["resourceSpans"]
        for a in rs["resource"]["attributes"]
        if a["key"] == "sglang.node_rank"
    }
    assert nodes == {"0", "1"}

    perfetto = json.loads((tmp_path / "perfetto.json").read_text())
    names = [e["args"]["name"] for e in perfetto["traceEvents"] if e["name"] == "process_name"]
    assert {n.split(" ")[0] for n in names} == NAMES
    assert all(e["ts"] >= 0 and e.get("dur", 0) >= 0 for e in perfetto["traceEvents"] if e["ph"] in ("X", "B"))
    assert TRACE1 not in json.dumps(jaeger) + json.dumps(otlp) + json.dumps(perfetto)


def test_endpoint_spans_hold_one_trace(dirs: list[str]) -> None:
    """What ``export --endpoint`` sends: the SDK spans, every one in the launch's trace."""
    spans = to_sdk_spans(layout(open_run(*dirs)))
    assert {format(s.context.trace_id, "032x") for s in spans} == {TRACE0}
    assert all(s.parent is None or s.parent.trace_id == int(TRACE0, 16) for s in spans)


def test_node_without_launch_record_keeps_its_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A node that never learnt the launch's id (no ``launch`` record): its spans stay, under their own."""
    a = build_node(tmp_path / "a", 0, 2, local_trace=TRACE0, agreed_trace=TRACE0)
    b = build_node(tmp_path / "b", 1, 2, local_trace=TRACE1, agreed_trace=None)
    assert cli(capsys, "export", str(a.path), str(b.path), "-o", str(tmp_path / "j.json"))[0] == 0
    traces = json.loads((tmp_path / "j.json").read_text())["data"]
    assert {t["traceID"]: len(t["spans"]) > 0 for t in traces} == {TRACE0: True, TRACE1: True}


def test_report_renders_both_nodes(dirs: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_file = tmp_path / "r.html"
    code, _out, err = cli(capsys, "report", *dirs, "-o", str(out_file))
    assert code == 0, err
    html = out_file.read_text()
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', html, re.S)[1])
    assert {lane["label"] for lane in data["lanes"]} == NAMES
    assert all(b[0] >= 0 and b[1] >= 0 for lane in data["lanes"] for b in lane["bars"])
    assert "20261201-120000-ab12cd+20261201-120000-ab12cd-n1" in html


def test_compare_two_multinode_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a0, a1 = launch(tmp_path / "a", "run-a")
    b0, b1 = launch(tmp_path / "b", "run-b")
    side_a, side_b = f"{a0.path},{a1.path}", f"{b0.path},{b1.path}"
    code, out, err = cli(capsys, "compare", side_a, side_b, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["a"] == side_a and doc["phases"]
    code, out, err = cli(capsys, "compare", side_a, "--json")  # one multi-node run: across its four ranks
    assert code == 0, err
    stats = {p["phase"]: p for p in json.loads(out)["phases"]}
    assert set(stats["model.load_weights"]["per_rank_s"]) == {"tp0@node-0", "tp1@node-0", "tp2@node-1", "tp3@node-1"}


def test_a_missing_directory_is_a_clean_error(
    dirs: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = str(tmp_path / "node7-run")
    for argv in (
        ["status", dirs[0], missing, "--once"],
        ["timeline", dirs[0], missing],
        ["report", dirs[0], missing, "-o", "-"],
        ["export", missing, dirs[1], "-o", "-"],
        ["compare", f"{dirs[0]},{missing}"],
    ):
        code, _out, err = cli(capsys, *argv)
        assert code == 1 and f"{missing}: not a phasetrace run directory (it does not exist)" in err, (argv, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_one_directory_given_twice_is_read_once(dirs: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    _code, out, _ = cli(capsys, "status", dirs[0], dirs[0] + "/", "--json")
    labels = [r["label"] for r in json.loads(out)["ranks"]]
    assert sorted(labels) == ["launcher@node-0", "tp0@node-0", "tp1@node-0"]
