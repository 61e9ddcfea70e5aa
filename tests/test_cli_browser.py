"""The HTML report rendered by headless Chromium: the rank lanes are drawn, the stalled rank is
highlighted, and nothing is fetched from the network. Screenshots are kept in test-artifacts/."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from cli_fixtures import STALL_PHASE, build_run
from sglang_phasetrace.tracing.cli import main

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not installed (scripts/install-test-tools.sh installs it)")
    return exe


def browse(page: Path, tmp_path: Path, *args: str) -> str:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"  # fresh per launch
    done = subprocess.run(
        [
            chromium(),
            *FLAGS,
            f"--user-data-dir={profile}",
            "--window-size=1400,1000",
            "--virtual-time-budget=5000",
            *args,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Lanes(HTMLParser):
    """Lanes in the rendered DOM: rank -> {state, bars}."""

    def __init__(self) -> None:
        super().__init__()
        self.lanes: dict[str, dict] = {}
        self.current: str | None = None
        self.stops: dict[str, str] = {}
        self._stop: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if "lane" in classes and a.get("data-rank"):
            self.current = a["data-rank"]
            self.lanes[self.current] = {"state": a.get("data-state"), "bars": 0, "phases": set()}
        elif "bar" in classes and self.current:
            self.lanes[self.current]["bars"] += 1
            self.lanes[self.current]["phases"].add(a.get("data-phase"))
        elif "stop" in classes and self.current:
            self._stop = self.current

    def handle_data(self, data: str) -> None:
        if self._stop:
            self.stops[self._stop] = data
            self._stop = None


def render(run_dir: Path, name: str, tmp_path: Path) -> Lanes:
    page = tmp_path / f"{name}.html"
    assert main(["report", str(run_dir), "-o", str(page)]) == 0
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / f"report-{name}.png"
    shot.unlink(missing_ok=True)
    browse(page, tmp_path, f"--screenshot={shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    dom = Lanes()
    dom.feed(browse(page, tmp_path, "--dump-dom"))
    return dom


def test_report_lanes_render_for_a_stalled_run(tmp_path: Path) -> None:
    run = build_run(tmp_path / "stalled", ranks=4, spans=40, stalled_rank=2)
    dom = render(run.path, "synthetic-stalled", tmp_path)
    assert set(dom.lanes) == {"launcher", *run.labels}
    assert all(lane["bars"] > 0 for lane in dom.lanes.values())
    assert dom.lanes["tp2"]["state"] == "stalled" and STALL_PHASE in dom.lanes["tp2"]["phases"]
    assert {dom.lanes[r]["state"] for r in run.labels if r != "tp2"} == {"running"}
    assert re.search(rf"stalled in {re.escape(STALL_PHASE)}", dom.stops["tp2"])


@pytest.mark.sglang
def test_report_lanes_render_for_a_real_run(engine_run, tmp_path: Path) -> None:
    dom = render(engine_run.run_dir, "engine-tp2", tmp_path)
    assert {"launcher", "tp0", "tp1", "detokenizer"} == set(dom.lanes)  # every process of the launch
    assert {"process", "detokenizer.init"} <= dom.lanes["detokenizer"]["phases"]
    for rank in ("tp0", "tp1"):
        assert dom.lanes[rank]["state"] == "ready"
        assert {"rank", "model.load_weights", "dist.init"} <= dom.lanes[rank]["phases"]
