"""Shared fixtures: a tiny local model, and running programs under the hook like a user would.

Every real-SGLang test starts a fresh interpreter with only ``PYTHONPATH`` pointing at
``sitecustomize_hooks/`` (the activation under test) and a private run directory.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import types
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOOKS = ROOT / "sitecustomize_hooks"
SCRIPTS = ROOT / "scripts"
PLANTS = ROOT / "tests" / "plants"
# Older SGLang releases installed beside the venv's own (scripts/install-cpu.sh, SGLANG_OVERLAYS):
# each is a directory holding only that release's ``sglang`` package, put ahead on PYTHONPATH.
OVERLAYS = {p.name.removeprefix("sglang-"): p for p in sorted((Path(sys.prefix) / "overlays").glob("sglang-*"))}
CPU_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "SGLANG_CPU_OMP_THREADS_BIND": "0|1",
}


def have_sglang() -> bool:
    try:
        import importlib.util

        return importlib.util.find_spec("sglang") is not None
    except ImportError:
        return False


NO_SGLANG = "real sglang is not installed"
requires_sglang = pytest.mark.skipif(not have_sglang(), reason=NO_SGLANG)  # with @pytest.mark.sglang


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str
    run_dir: Path | None

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def hook_env(base_dir: Path, extra: dict[str, str] | None = None, hooks: bool = True) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_PHASETRACE", "OTEL_", "TRACEPARENT"))}
    env.update(CPU_ENV)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOKS) if hooks else "", env.get("PYTHONPATH", "")) if p)
    env["SGLANG_PHASETRACE_DIR"] = str(base_dir)
    env.update(extra or {})
    return env


def free_port() -> int:
    """A free port below the kernel's ephemeral range: a server that binds it a minute later (SGLang
    binds its HTTP port after init) cannot find it taken by an outgoing connection's local port
    meanwhile (gloo, the TCPStore, an OTLP exporter), as one bound from the range could (a CI run
    saw ``[Errno 98] address already in use``). SGLang derives ports from it upwards: room is left."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200 if low > 3072 else 0):
        port = random.randrange(max(1024, low - 12000), low - 1000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # everything below the range in use: as before
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DIST_RANKS = ROOT / "tests" / "programs" / "dist_ranks.py"


def dist_ranks(model: Path, world: int, plant: str, rank: int) -> list[str]:
    """Arguments for tests/programs/dist_ranks.py: ``world`` gloo ranks, ``plant`` in ``rank``."""
    return [
        str(DIST_RANKS),
        str(model),
        "--world",
        str(world),
        "--plant",
        plant,
        "--rank",
        str(rank),
        "--port",
        str(free_port()),
    ]


def run_dirs(base_dir: Path) -> list[Path]:
    return sorted(p for p in base_dir.iterdir() if (p / "journal").is_dir()) if base_dir.is_dir() else []


def run_program(
    args: list[str],
    base_dir: Path,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 240,
    hooks: bool = True,
    cwd: Path | None = None,
) -> Ran:
    """Run ``python args…`` under the hook in its own process group; kill the group on timeout."""
    proc = subprocess.Popen(
        [sys.executable, *args],
        env=hook_env(base_dir, env, hooks),
        cwd=cwd or base_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s:\n{err[-4000:]}") from None
    finally:
        kill_group(proc.pid)
    dirs = run_dirs(base_dir)
    return Ran(proc.returncode, out, err, dirs[-1] if dirs else None)


def wait_for_output(path: Path, pattern: str, timeout: float, proc: subprocess.Popen) -> re.Match[str]:
    """The first match of ``pattern`` in the output file ``path`` of ``proc``, read every 0.5 s until
    ``timeout`` or until ``proc`` ends; an ``AssertionError`` with the output's tail otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, path.read_text(errors="replace"))
        if m is not None:
            return m
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"no {pattern!r} in {path.name}:\n{path.read_text(errors='replace')[-5000:]}")


def kill_group(pgid: int) -> None:
    """SIGKILL a process group that may already be gone."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def end_group(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``'s process group (its own session) and reap ``proc``, 30 s at most."""
    kill_group(proc.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)


@contextlib.contextmanager
def silent_peer() -> Iterator[int]:
    """A loopback TCP peer that accepts every connection and never answers on it (nor closes it): a
    dead proxy, a half-dead collector. Yields its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(server.accept()[0])

    threading.Thread(target=accept, name="silent-peer", daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()
        for conn in held:
            conn.close()


@pytest.fixture(scope="session")
def tiny_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 2-layer Llama and an EAGLE draft for it, random weights, made locally once per session
    (the first test that needs it, and so every SGLang start, carries the ``sglang`` marker)."""
    refuse_unmarked(request)
    if not have_sglang():
        pytest.skip("real sglang is not installed")
    out = tmp_path_factory.mktemp("models")
    target, draft = out / "tiny-llama", out / "tiny-llama-eagle"
    subprocess.run(
        [sys.executable, str(SCRIPTS / "make_tiny_model.py"), str(target), "--draft", str(draft)],
        check=True,
        capture_output=True,
        env={**os.environ, **CPU_ENV},
    )
    return target, draft


@pytest.fixture(scope="session")
def engine_run(tiny_model: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Ran:
    """One real traced start shared by tests that only read its output: ``sglang.Engine`` tp=2 on
    CPU, one generate, shutdown; only PYTHONPATH enables tracing."""
    base = tmp_path_factory.mktemp("engine-run")
    (base / "modules").mkdir()  # each rank's imported modules at ready (``tests/plants``: test_layout.py)
    plant = {"PYTHONPATH": os.pathsep.join((str(HOOKS), str(PLANTS))), "PLANT_MODULES_OUT": str(base / "modules")}
    ran = run_program([str(SCRIPTS / "start_engine.py"), str(tiny_model[0]), "--tp", "2"], base, env=plant)
    assert ran.returncode == 0, ran.stderr[-4000:]
    assert ran.run_dir is not None, "no run directory was written"
    return ran


@pytest.fixture(scope="session", params=["installed", *OVERLAYS])
def live_run(
    request: pytest.FixtureRequest, tiny_model: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Ran:
    """``engine_run`` on the installed SGLang, and the same start on each older release installed
    as an overlay (0.5.9 in CI)."""
    if request.param == "installed":
        return request.getfixturevalue("engine_run")
    base = tmp_path_factory.mktemp(f"engine-run-{request.param}")
    overlay = {"PYTHONPATH": os.pathsep.join((str(HOOKS), str(OVERLAYS[request.param])))}
    ran = run_program(
        [str(SCRIPTS / "start_engine.py"), str(tiny_model[0]), "--tp", "2"], base, env=overlay, timeout=600
    )
    assert ran.returncode == 0, ran.stderr[-4000:]
    assert ran.run_dir is not None, "no run directory was written"
    return ran


@pytest.fixture
def trace_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """In-process tracing: a fresh process state (``tracing.process_state``: runtime, heartbeat,
    collectives, say-once memory…) journaling into ``tmp_path/run`` (journal only, no exporter,
    heartbeats quiet); stopped, closed and reset afterwards, with the signal handlers as they were.
    Read spans back with ``tracing.reader.load.load_run``."""
    from sglang_phasetrace.tracing import process_state

    path = tmp_path / "run"
    monkeypatch.setenv("SGLANG_PHASETRACE_RUN_DIR", str(path))
    monkeypatch.setenv("SGLANG_PHASETRACE_HEARTBEAT_S", "3600")  # one beat at start, then quiet
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "TRACEPARENT"):
        monkeypatch.delenv(name, raising=False)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)}
    process_state.reset()
    yield path
    rt, beat = process_state.STATE.runtime, process_state.STATE.heartbeat
    if beat is not None:
        beat.stop.set()
    if rt is not None and rt.provider is not None:
        rt.provider.shutdown()
    if rt is not None and rt.journal is not None:
        rt.journal.close()
    process_state.reset()
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


@pytest.fixture
def make_module():
    """``make_module(source, **names)``: a fresh ``_t_<hex>`` module holding ``names`` and running
    ``source`` (dedented), registered in ``sys.modules`` for the test and removed after it."""
    made: list[str] = []

    def make(source: str = "", **namespace) -> types.ModuleType:
        name = f"_t_{uuid.uuid4().hex}"
        module = types.ModuleType(name)
        module.__dict__.update(namespace)
        sys.modules[name] = module
        made.append(name)
        exec(compile(textwrap.dedent(source), f"<{name}>", "exec"), module.__dict__)
        return module

    yield make
    for name in made:
        sys.modules.pop(name, None)


def read_journal(path: Path) -> tuple[list[dict], list[str]]:
    """All records of a finished (or abandoned) journal, and its problems as ``file:line: why``."""
    from sglang_phasetrace.tracing.journal.tail import JournalTail

    tail = JournalTail(path)
    return tail.read(final=True), tail.problems


# Fixtures that start real SGLang (or make what it starts on): a test that asks for one, directly
# or through another fixture, is an ``sglang`` test, and says so (``pytest -m "not sglang"``: the
# fast loop of docs/contributing.md).
STARTS_SGLANG = frozenset({"tiny_model", "engine_run", "live_run"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse, at collection, a test that starts SGLang without the ``sglang`` marker; put the
    ``forks`` tests first (``pytest_pyfunc_call``)."""
    items.sort(key=lambda item: item.get_closest_marker("forks") is None)  # stable: otherwise as collected

    def needs(item: pytest.Item) -> bool:
        skips = [m for m in item.iter_markers("skipif") if m.kwargs.get("reason") == NO_SGLANG]
        return bool(skips or STARTS_SGLANG & set(getattr(item, "fixturenames", ())))

    unmarked = [item.nodeid for item in items if needs(item) and item.get_closest_marker("sglang") is None]
    if unmarked:
        raise pytest.UsageError(
            "these tests need real SGLang (@requires_sglang, or a fixture in conftest.STARTS_SGLANG) without "
            "@pytest.mark.sglang: " + ", ".join(unmarked)
        )


# The large-run read forks a helper (``reader.forked_helper``), which it does only in a process where no
# other thread runs. A ``forks`` test is of that path, so it must run in such a process, never skip:
# those tests run first in a session (``pytest_collection_modifyitems``), before any test leaves a
# thread running (a receiver's server, an exporter's worker); should one run all the same (another
# order, a plugin), the test is run again alone in a fresh pytest process, where none may run.
ALONE = "PHASETRACE_TEST_ALONE"


def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if pyfuncitem.get_closest_marker("forks") is None or threading.active_count() == 1:
        return None
    others = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
    if os.environ.get(ALONE):
        pytest.fail(f"threads run in a fresh test process, so it cannot fork: {others}")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", pyfuncitem.nodeid],
        cwd=pyfuncitem.config.rootpath,
        env={**os.environ, ALONE: "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        pytest.fail(f"run alone (threads here: {others}), it failed:\n{done.stdout[-6000:]}{done.stderr[-2000:]}")
    return True  # it ran, and passed, in that process


def refuse_unmarked(request: pytest.FixtureRequest) -> None:
    """The same rule where collection cannot see it (``request.getfixturevalue``, a parametrized
    variant): a fixture of ``STARTS_SGLANG`` fails the test without the ``sglang`` marker that asked
    for it, before SGLang starts."""
    item = getattr(request, "_pyfuncitem", None)
    if item is not None and item.get_closest_marker("sglang") is None:
        pytest.fail(f"{item.nodeid} starts real SGLang ({request.fixturename}) without @pytest.mark.sglang", False)
