"""The Grafana dashboard shipped in docs (``docs/grafana/phasetrace-startup.json``): every metric its
queries name exists in a real scrape of the launcher's start-up endpoint (``/metrics`` over HTTP,
served by ``launcher.endpoint`` for a hand-made run with a standing verdict, progress and a predicted
ready time), so a renamed series cannot leave a panel empty unnoticed."""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import free_port
from handmade_runs import Proc
from prometheus_client.parser import text_string_to_metric_families
from sglang_phasetrace.tracing.launcher import endpoint
from test_orchestrators import _assess, _get, _ranks

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "phasetrace-startup.json"


def queried(doc: dict) -> set[str]:
    """Every ``phasetrace_…`` series a panel's query names."""
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    assert exprs and all(isinstance(e, str) for e in exprs)
    return {name for e in exprs for name in re.findall(r"\bphasetrace_[a-z0-9_]+\b", e)}


def test_every_metric_the_dashboard_queries_is_in_a_real_scrape(tmp_path: Path) -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and {p["id"] for p in doc["panels"]} == set(range(1, len(doc["panels"]) + 1))
    starting, stalled = tmp_path / "starting", tmp_path / "stalled"
    for run in (starting, stalled):
        run.mkdir()
    launcher = Proc(starting, 99, "launcher", "launcher", "launch.server").phase("launch.wait_ranks", 280)
    tp0 = Proc(starting, 100, "rank", "tp0", "rank").phase("model.load_weights", 30).loading(5, 8)
    for p in (launcher, tp0):
        p.write()
    launcher = Proc(stalled, 99, "launcher", "launcher", "launch.server").phase("server.wait_ready", 30).idle()
    detok = Proc(stalled, 98, "detokenizer", "detokenizer", "process").phase("detokenizer.init", 40).idle()
    for p in [launcher, detok, *_ranks(stalled)]:
        p.write()
    states = [  # a start in progress (its progress, its predicted ready time), then one with a standing verdict
        _assess(starting, outlook={"eta_s": 41.0, "p95_s": 55.0, "said": "ready in ≈ 41 s"}),
        _assess(stalled),
    ]
    assert states[0].predicted and states[1].verdicts
    now = {"state": states[0]}
    port = free_port()
    server = endpoint.serve(("127.0.0.1", port), lambda: now["state"])
    scraped: set[str] = set()
    try:
        for state in states:
            now["state"] = state
            code, _, body = _get(port, "/metrics")
            assert code == 200
            scraped |= {s.name for f in text_string_to_metric_families(body) for s in f.samples}
    finally:
        server.shutdown()
        server.server_close()
    wanted = queried(doc)
    assert {"phasetrace_start_verdict", "phasetrace_process_heartbeat_age_seconds"} <= wanted
    assert wanted - scraped == set(), f"queried but not scraped: {sorted(wanted - scraped)}"
