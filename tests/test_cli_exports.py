"""Exports checked against what their consumers require, and OTLP delivered to a real collector.

Jaeger: every span's process exists, every reference resolves, µs times, one process per rank.
Perfetto: valid trace events, one named process per rank, slices nest, open phases not ended.
OTLP: Rotel (an independent collector, PyPI ``rotel``) decodes every span we send, over
HTTP/protobuf and gRPC, and accepts the OTLP JSON file as-is.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
from cli_fixtures import STALL_PHASE, build_run
from conftest import free_port
from sglang_phasetrace.tracing.cli import main
from sglang_phasetrace.tracing.reader.load import load_run


@pytest.fixture(scope="module", params=["stalled", "same-ids", pytest.param("engine", marks=pytest.mark.sglang)])
def run_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stalled run (open phases, damaged journals), ranks sharing span ids, and a real start."""
    if request.param == "engine":
        return request.getfixturevalue("engine_run").run_dir
    base = tmp_path_factory.mktemp(request.param)
    if request.param == "stalled":
        return build_run(base / "run", ranks=3, spans=30, stalled_rank=1, corrupt=True).path
    return build_run(base / "run", ranks=3, spans=30, same_ids=True).path


def export(run_dir: Path, fmt: str, tmp_path: Path) -> dict:
    out = tmp_path / f"{fmt}.json"
    assert main(["export", str(run_dir), "--format", fmt, "-o", str(out)]) == 0
    return json.loads(out.read_text())


def journal_spans(run_dir: Path) -> tuple[int, dict[str, int]]:
    """Count of spans, and processes by label, straight from the journals."""
    run = load_run(run_dir)
    return sum(len(p.spans) for p in run.processes), {p.label: p.pid for p in run.processes}


def test_jaeger_upload_file(run_dir: Path, tmp_path: Path) -> None:
    doc = export(run_dir, "jaeger", tmp_path)
    total, procs = journal_spans(run_dir)
    spans = [s for trace in doc["data"] for s in trace["spans"]]
    assert len(spans) == total
    run = load_run(run_dir)
    lo = min(s.start for p in run.processes for s in p.spans.values()) // 1000
    hi = max(p.last_t for p in run.processes) // 1000 + 1
    services = set()
    for trace in doc["data"]:
        ids = {s["spanID"] for s in trace["spans"]}
        assert len(ids) == len(trace["spans"]), "span ids are unique within a trace"
        for s in trace["spans"]:
            assert s["traceID"] == trace["traceID"] and s["processID"] in trace["processes"]
            for ref in s["references"]:
                assert ref["refType"] == "CHILD_OF" and ref["traceID"] == trace["traceID"] and ref["spanID"] in ids
            assert lo <= s["startTime"] <= hi and 0 <= s["duration"] <= hi - lo  # microseconds
        services |= {p["serviceName"] for p in trace["processes"].values()}
    assert len(services) == len(procs) and all(any(label in s for s in services) for label in procs)
    # parents follow the journal: a rank's phases hang under that rank's own root
    by_id = {s["spanID"]: s for trace in doc["data"] for s in trace["spans"]}
    for s in spans:
        for ref in s["references"]:
            parent = by_id[ref["spanID"]]
            if s["operationName"].startswith("rank ") or " @ " in s["operationName"]:  # a process's root
                assert parent["operationName"] == "sglang.launch"
            else:
                assert parent["processID"] == s["processID"]


def test_perfetto_trace_events(run_dir: Path, tmp_path: Path) -> None:
    doc = export(run_dir, "perfetto", tmp_path)
    total, procs = journal_spans(run_dir)
    events = doc["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert len(names) == len(procs) and all(
        any(n.startswith((label, f"\u26a0 STALL {label}")) for n in names.values()) for label in procs
    )
    slices = [e for e in events if e["ph"] in ("X", "B")]
    assert len(slices) == total and all(e["pid"] in names for e in slices)
    assert all(isinstance(e["ts"], (int, float)) and e.get("dur", 0) >= 0 for e in slices)
    tracks: dict[tuple, list] = defaultdict(list)
    for e in slices:
        tracks[(e["pid"], e["tid"])].append(e)
    for track in tracks.values():  # slices on one track nest (exactly, in ns)
        stack: list[int] = []
        for e in sorted(track, key=lambda e: (round(e["ts"] * 1000), -round(e.get("dur", 1e18) * 1000))):
            start = round(e["ts"] * 1000)
            end = start + round(e["dur"] * 1000) if e["ph"] == "X" else None
            while stack and stack[-1] is not None and stack[-1] <= start:
                stack.pop()
            assert not stack or stack[-1] is None or (end is not None and end <= stack[-1]), e["name"]
            stack.append(end)
    begun = [e for e in slices if e["ph"] == "B"]
    assert not any(e["ph"] == "E" for e in events)  # what never ended is shown as not ended
    if "stalled" in str(run_dir.parent):
        assert f"\u26a0 STALL {STALL_PHASE}" in {e["name"] for e in begun}  # the culprit's phase, flagged


def test_otlp_json_shape(run_dir: Path, tmp_path: Path) -> None:
    doc = export(run_dir, "otlp-json", tmp_path)
    total, procs = journal_spans(run_dir)
    spans = [s for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert len(doc["resourceSpans"]) == len(procs) and len(spans) == total
    for s in spans:
        assert re.fullmatch(r"[0-9a-f]{32}", s["traceId"]) and re.fullmatch(r"[0-9a-f]{16}", s["spanId"])
        assert s["kind"] == 1 and s["status"]["code"] in (0, 1, 2)
        assert int(s["startTimeUnixNano"]) <= int(s["endTimeUnixNano"])
    assert len({s["spanId"] for s in spans}) == len(spans)


@pytest.mark.parametrize("long", [False, True])
@pytest.mark.parametrize("how", ["served", "stalled", "failed"])
def test_spans_written_from_a_template_are_the_bytes_of_their_whole_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, long: bool
) -> None:
    """Jaeger and OTLP JSON format most spans in place (ended well: with events or not; ``long``:
    every value counted long, kept as one shared piece); each is, byte for byte, ``dumps`` of the
    span's whole form, which the rest (open, failed, flagged) are written as."""
    from sglang_phasetrace.tracing.render import jaeger, otlp_json
    from sglang_phasetrace.tracing.render.jsonout import dumps
    from sglang_phasetrace.tracing.render.lanes import layout
    from sglang_phasetrace.tracing.render.verdict import marks
    from sglang_phasetrace.tracing.verdicts.findings import findings

    if long:
        monkeypatch.setattr(jaeger, "LONG", 0)
        monkeypatch.setattr(otlp_json, "LONG", 0)
    rank = {"served": {}, "stalled": {"stalled_rank": 1}, "failed": {"failed_rank": 1}}[how]
    lay = layout(load_run(build_run(tmp_path / "run", ranks=3, spans=60, **rank).path))
    flags = marks(lay, findings(lay.run, lay.end))
    arg = (flags.culprit, flags.word, flags.waiting_for, flags.waits_on)
    bars = [bar for lane in lay.lanes for bar in lane.bars]
    shards = any(bar.span.events and bar.span.status == "ok" for bar in bars)  # a template of their own
    assert shards if how != "stalled" else flags.culprit  # stalled before its weights
    for lane in lay.lanes:
        whole: dict[str, list[bytes]] = {}
        for bar in lane.bars:
            whole.setdefault(bar.span.trace_id, []).append(dumps(jaeger._span(bar, f"p{lane.index + 1}", flags)))
        made = [(trace, bytes(chunk)) for trace, chunk in jaeger.lane_spans(lane, arg)]
        assert made == [(trace, b",".join(spans)) for trace, spans in whole.items()]
        ((_, item),) = otlp_json.lane_resource_spans(lane, arg)
        resource = json.loads(bytes(item))["resource"]
        spans = [otlp_json._span(bar, flags) for bar in lane.bars]
        scope = {"scope": otlp_json.SCOPE, "spans": spans}
        assert bytes(item) == dumps({"resource": resource, "scopeSpans": [scope]})


# -- a real collector ----------------------------------------------------------------------------------


def rotel_agent() -> str | None:
    try:
        import rotel
    except ImportError:
        return None
    path = Path(rotel.__file__).parent / "rotel-agent"
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


class Rotel:
    """Rotel on loopback logging every decoded span (ids and names) to a file we read back."""

    def __init__(self, agent: str, workdir: Path, signal: str = "traces") -> None:
        self.grpc, self.http = free_port(), free_port()
        self.log = workdir / "rotel.out"
        self.proc = subprocess.Popen(
            [
                agent,
                "start",
                "--otlp-grpc-endpoint",
                f"127.0.0.1:{self.grpc}",
                "--otlp-http-endpoint",
                f"127.0.0.1:{self.http}",
                "--exporter",
                "blackhole",
                "--debug-log",
                signal,
                "--debug-log-verbosity",
                "detailed",
                "--pid-file",
                str(workdir / "rotel.pid"),
                "--log-file",
                str(workdir / "rotel.log"),
            ],
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.http), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise AssertionError(f"rotel did not listen: {self.log.read_text()[-2000:]}")

    def span_ids(self) -> list[str]:
        return re.findall(r"^\s+ID\s+:\s+([0-9a-f]{16})\s*$", self.log.read_text(errors="replace"), re.M)

    def wait_for(self, count: int, timeout: float = 20) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(self.span_ids()) < count:
            time.sleep(0.2)
        return self.span_ids()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def rotel(tmp_path: Path):
    agent = rotel_agent()
    if agent is None:
        pytest.skip("the Rotel collector is not installed (scripts/install-test-tools.sh installs it)")
    collector = Rotel(agent, tmp_path)
    yield collector
    collector.stop()


def test_collector_decodes_every_span(
    run_dir: Path, rotel: Rotel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = {s["spanID"] for t in export(run_dir, "jaeger", tmp_path)["data"] for s in t["spans"]}
    assert main(["export", str(run_dir), "--endpoint", f"http://127.0.0.1:{rotel.http}"]) == 0
    assert f"sent {len(expected)} spans" in capsys.readouterr().out
    seen = rotel.wait_for(len(expected))
    assert sorted(seen) == sorted(expected), "HTTP/protobuf: each span decoded once"

    assert main(["export", str(run_dir), "--endpoint", f"127.0.0.1:{rotel.grpc}", "--protocol", "grpc"]) == 0
    seen = rotel.wait_for(2 * len(expected))
    assert sorted(seen) == sorted(list(expected) * 2), "gRPC: each span decoded once more"

    body = json.dumps(export(run_dir, "otlp-json", tmp_path)).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{rotel.http}/v1/traces", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200
    seen = rotel.wait_for(3 * len(expected))
    assert sorted(seen) == sorted(list(expected) * 3), "OTLP JSON file: accepted and every span decoded"


def test_collector_down_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = build_run(tmp_path / "run", ranks=1, spans=5)
    port = free_port()
    code = main(["export", str(run.path), "--endpoint", f"http://127.0.0.1:{port}", "--timeout", "1"])
    assert code == 1 and f"127.0.0.1:{port}" in capsys.readouterr().err


@pytest.mark.skipif(not shutil.which("bash"), reason="needs bash")
def test_install_script_installs_what_is_missing_and_then_nothing(tmp_path: Path) -> None:
    """scripts/install-test-tools.sh run twice against stand-ins for apt-get, sudo and the venv's
    python that log each call: the first run installs the tools, the second finds them and runs
    no installer (nothing is downloaded: the stand-ins only create what an install would)."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "install-test-tools.sh"
    assert script.is_file() and os.access(script, os.X_OK)
    bin_dir, venv, log = tmp_path / "bin", tmp_path / "venv", tmp_path / "calls.log"
    (venv / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    for tool in ("dirname", "id", "chmod", "touch"):  # the script's and the stand-ins' only commands
        (bin_dir / tool).symlink_to(shutil.which(tool))
    stand_ins = {
        bin_dir / "sudo": 'exec "$@"',
        bin_dir / "apt-get": f'echo "apt-get $*" >> {log}\n'
        f'case " $* " in *" install "*) for t in chromium prometheus initdb; do printf "#!/bin/sh\\n" > {bin_dir}/$t; '
        f"chmod +x {bin_dir}/$t; done;; esac",
        venv / "bin" / "python": f'if [ "$1" = -m ]; then echo "python $*" >> {log}; touch {venv}/rotel; exit 0; fi\n'
        f"[ -f {venv}/rotel ]",  # the script's "is rotel-agent there" check
    }
    for path, body in stand_ins.items():
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    env = {"PATH": str(bin_dir), "VENV": str(venv), "HOME": str(tmp_path), "PG_LIB": str(tmp_path / "no-pg")}

    bash = shutil.which("bash")
    first = subprocess.run([bash, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    assert log.read_text().splitlines() == [
        "apt-get update -q",
        "apt-get install -y -q --no-install-recommends chromium prometheus postgresql",
        "python -m pip install -q rotel",
    ]
    again = subprocess.run([bash, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert len(log.read_text().splitlines()) == 3, "the second run installed something again"
    assert "chromium: present" in again.stdout and "rotel: present" in again.stdout
    assert "prometheus: present" in again.stdout and "postgresql: present" in again.stdout
