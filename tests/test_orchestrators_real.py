"""What an orchestrator reads of a real traced SGLang start on CPU (tp=2): a real Prometheus server
(Debian's ``prometheus``, installed by ``scripts/install-test-tools.sh``) scraping the launcher's
start-up endpoint, ``phasetrace probe`` and the endpoint's ``/startup/probe`` through a slow but
busy start, at a planted stall, and an endpoint whose port is taken. Faults are planted through the
hook only (``tests/plants``); every process is bounded in time and its process group killed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import HOOKS, PLANTS, ROOT, end_group, free_port, hook_env, requires_sglang
from sglang_phasetrace.tracing.cli import main
from test_orchestrators import http_get


class Prometheus:
    """A real Prometheus server on loopback scraping ``target`` every second; queried over its HTTP API."""

    def __init__(self, tmp: Path, target: str) -> None:
        exe = shutil.which("prometheus")
        if exe is None:
            pytest.skip("prometheus is not installed (scripts/install-test-tools.sh installs it)")
        self.port = free_port()
        config = tmp / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: sglang-start\n    static_configs: [{{targets: ['{target}']}}]\n"
        )
        self.proc = subprocess.Popen(
            [exe, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=open(tmp / "prometheus.log", "w"), start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while http_get(f"http://127.0.0.1:{self.port}/-/ready", 5.0)[0] != 200:
            assert time.monotonic() < deadline and self.proc.poll() is None, (tmp / "prometheus.log").read_text()
            time.sleep(0.5)

    def query(self, promql: str) -> list[dict]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        code, _, body = http_get(url, 5.0)
        assert code == 200, body
        return json.loads(body)["data"]["result"]

    def close(self) -> None:
        end_group(self.proc)


class Server:
    """``python -m sglang.launch_server`` tp=2 on CPU under the hook and the plants, its own process
    group, its launcher's start-up endpoint on ``http_port``."""

    def __init__(
        self, tmp: Path, model: Path, http_port: int, plant: dict[str, str], engine: bool = False, args: tuple = ()
    ) -> None:
        self.base = tmp / "runs"
        env = hook_env(self.base, {keys: value for keys, value in plant.items()})
        env["PYTHONPATH"] = os.pathsep.join((str(HOOKS), str(PLANTS)))
        env["SGLANG_PHASETRACE_HTTP"] = f"127.0.0.1:{http_port}"
        if engine:
            command = [
                sys.executable,
                str(ROOT / "scripts" / "start_engine.py"),
                str(model),
                "--tp",
                "2",
                "--no-generate",
            ]
        else:
            self.port = free_port()
            command = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--device", "cpu",
                       "--tp-size", "2", "--max-total-tokens", "4096", "--port", str(self.port), *args]  # fmt: skip
        self.err = tmp / "launch.err"
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen(command, env=env, cwd=tmp, stdin=subprocess.DEVNULL, stdout=err,
                                         stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip

    def probe(self, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
        """``phasetrace probe --json`` on the launch's base directory (its newest run), as an exec probe runs it."""
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("SGLANG_PHASETRACE_DIR", str(self.base))
            mp.delenv("SGLANG_PHASETRACE_RUN_DIR", raising=False)
            code = main(["probe", "--json"])
        out = capsys.readouterr().out
        return code, json.loads(out)

    def close(self) -> None:
        end_group(self.proc)


@pytest.fixture
def launched(tmp_path: Path, tiny_model: tuple[Path, Path]) -> Iterator:
    made: list = []

    def start(*args: object, **kw: object) -> Server:
        made.append(Server(tmp_path, tiny_model[0], *args, **kw))  # type: ignore[arg-type]
        return made[-1]

    yield start
    for one in made:
        one.close()


@requires_sglang
@pytest.mark.sglang
@pytest.mark.timeout(500)
def test_prometheus_scrapes_a_slow_start_that_keeps_passing_until_it_serves(
    tmp_path: Path, launched, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every rank computes for 25 s in its weight loading (slow, busy, never stuck): the probe and
    the HTTP probe pass throughout; Prometheus holds each rank's phases and, at the end, "serving"."""
    http = free_port()
    prom = Prometheus(tmp_path, f"127.0.0.1:{http}")
    try:
        server = launched(http, {"PLANT_BUSY_LOAD_S": "25"})
        seen: list[tuple[int, str, int]] = []  # (probe exit code, state, HTTP probe status)
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and server.proc.poll() is None:
            code, doc = server.probe(capsys)
            status = http_get(f"http://127.0.0.1:{http}/startup/probe", 5.0)[0]
            seen.append((code, doc["state"], status))
            if doc["state"] == "serving":
                break
            time.sleep(1.0)
        states = [s for _, s, _ in seen]
        assert states[-1] == "serving" and "starting" in states, seen
        print(f"\nprobe through a slow start: {[(c, s_) for c, s_, _ in seen]}")
        assert all(code == (7 if s == "no_run" else 0) for code, s, _ in seen), seen  # slow is not stuck
        assert all(status in (0, 200) for _, _, status in seen), seen  # 0: the endpoint not open yet
        assert any(status == 200 for _, s, status in seen if s == "starting"), seen
        time.sleep(3)  # a scrape after serving
        loading = prom.query('count by (label) (count_over_time(phasetrace_process_phase{phase="model.loader"}[10m]))')
        assert {r["metric"]["label"] for r in loading} == {"tp0", "tp1"}, loading
        [state] = prom.query('phasetrace_start_state{phasetrace_start_state="serving"}')
        assert state["value"][1] == "1", state
        ranks = prom.query('phasetrace_process_state{role="rank"}')
        assert {r["metric"]["label"]: r["metric"]["state"] for r in ranks} == {"tp0": "serving", "tp1": "serving"}
    finally:
        prom.close()


@requires_sglang
@pytest.mark.sglang
@pytest.mark.timeout(400)
def test_a_planted_stall_fails_the_probe_and_the_http_probe_with_the_verdict(
    launched, capsys: pytest.CaptureFixture[str]
) -> None:
    """At ``--log-level warning``, and with hostile clients on the endpoint from its opening to the
    verdict (300 idle, 20 slowloris, 20 header floods, each reopened once closed: issue 47): every
    HTTP probe is answered within a second, the launcher's threads stay flat and its RSS near, the
    slowloris clients are closed, the endpoint's URL is said once, and the verdict comes as without."""
    bench = _bench_endpoint()
    http = free_port()
    server = launched(http, {"PLANT_STALL_PHASE_TP_RANK": "1"}, args=("--log-level", "warning"))
    deadline = time.monotonic() + 300
    while http_get(f"http://127.0.0.1:{http}/startup/probe", 5.0)[0] == 0:  # the endpoint opens at the launch root
        assert time.monotonic() < deadline and server.proc.poll() is None, server.err.read_text()[-4000:]
        time.sleep(0.2)
    threads0, rss0 = bench.proc_status(server.proc.pid)
    hostile = bench.Hostile(http, idle=300, slow=20, flood=20, seconds=300).start()
    probes: list[float | None] = []
    try:
        code, doc = server.probe(capsys)
        while code in (0, 7) and time.monotonic() < deadline and server.proc.poll() is None:  # 7: no run yet
            probes.append(bench.timed_get(http, "/startup/probe"))
            if len(probes) == 10:
                threads1, rss1 = bench.proc_status(server.proc.pid)
            time.sleep(1.0)
            code, doc = server.probe(capsys)
        if len(probes) < 10:
            threads1, rss1 = bench.proc_status(server.proc.pid)
        closed = dict(hostile.closed_by_server)
    finally:
        hostile.stop()
    print(f"\nunder abuse: probes {[round(t, 3) if t else t for t in probes]}; threads {threads0} -> {threads1}; "
          f"RSS {rss0 >> 20} -> {rss1 >> 20} MiB; closed by the endpoint {closed}")  # fmt: skip
    assert (code, doc["state"]) == (3, "stalled"), doc
    assert all(t is not None and t < 1.0 for t in probes), probes
    assert threads1 - threads0 <= 4 and rss1 - rss0 <= 48 << 20, (threads0, threads1, rss0, rss1)
    assert closed["slow"] >= 20 and closed["flood"] >= 20, closed
    said = [line for line in server.err.read_text().splitlines() if "start-up endpoint" in line]
    assert said == [f"sglang-phasetrace: start-up endpoint on http://127.0.0.1:{http}/metrics"], said
    assert doc["line"].startswith("sglang-phasetrace: STALL rank tp1 (pid ") and "'attention.init'" in doc["line"], doc
    status, _, body = http_get(f"http://127.0.0.1:{http}/startup/probe", 5.0)
    assert status == 503 and body.startswith("sglang-phasetrace: STALL rank tp1 (pid "), body
    _, _, metrics = http_get(f"http://127.0.0.1:{http}/metrics", 5.0)
    assert re.search(r'^phasetrace_start_verdict\{kind="\w+",label="tp1",phase="attention.init"\} 1\.0$', metrics, re.M)


def _bench_endpoint():
    """``scripts/bench_endpoint.py``: its hostile clients and timed requests."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_endpoint", ROOT / "scripts" / "bench_endpoint.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules.setdefault("bench_endpoint", module)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@requires_sglang
@pytest.mark.sglang
@pytest.mark.timeout(400)
def test_an_endpoint_whose_port_is_taken_is_one_warning_and_the_start_goes_on(tmp_path: Path, launched) -> None:
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        engine = launched(port, {}, engine=True)
        assert engine.proc.wait(timeout=300) == 0, engine.err.read_text()[-4000:]
    finally:
        taken.close()
    said = [line for line in engine.err.read_text().splitlines() if "start-up endpoint" in line]
    why = f"cannot listen on 127.0.0.1:{port} (Address already in use)"
    assert len(said) == 1 and said[0].endswith(f"sglang-phasetrace: no start-up endpoint: {why}"), said
