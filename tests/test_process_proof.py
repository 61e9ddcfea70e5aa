"""Who may be signalled: only a process proven ours. What a journal says (pid, kernel start time,
boot id) anyone on the host can read in ``/proc`` and copy, so a planted journal, another node's
snapshot or a run directory someone else can write must never get a process of this user a
SIGUSR2, a py-spy read or a SIGTERM; a process that writes its own journal (holds it open) in a
private run directory does. What the watchdog writes into a run directory is new files in a checked
``stacks/``, never an append to a file it did not make; a forked child does not dump into its
parent's stack file; pre-flight signals its launch's process group only while the group's id is its own.

The "processes" here are small Python programs (no SGLang: nothing of SGLang is involved in the
proof), each logging the signals it receives instead of dying of them.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sglang_phasetrace.tracing import keys, process_state
from sglang_phasetrace.tracing import other_processes as procs
from sglang_phasetrace.tracing.channel import crossnode, relay
from sglang_phasetrace.tracing.cli import main
from sglang_phasetrace.tracing.journal import records
from sglang_phasetrace.tracing.reader.view import RunView
from sglang_phasetrace.tracing.verdicts.diagnose import Thresholds
from sglang_phasetrace.tracing.verdicts.watchdog import Watchdog

S = 1_000_000_000
TH = Thresholds(heartbeat_s=1.0, silent_s=10, stall_s=600, no_progress_s=600)

# A process of this user: it logs SIGUSR2/SIGTERM instead of dying of them. With a journal
# directory it writes its own journal there (records from a JSON file, its pid and fingerprint
# filled in) and keeps it open, as a traced process does; with a stacks directory it arms
# faulthandler on its own file there, as ``stacks.arm`` does.
PROCESS = textwrap.dedent(
    """
    import faulthandler, json, os, signal, socket, sys, time
    journal_dir, log, stacks_dir, recs = sys.argv[1:5]
    pid, host = os.getpid(), socket.gethostname()
    got = open(log, "a", buffering=1)
    def on(sig, frame):
        got.write(signal.Signals(sig).name + "\\n")
    for sig in (signal.SIGUSR2, signal.SIGTERM):
        signal.signal(sig, on)
    if journal_dir:
        with open(f"/proc/{pid}/stat", "rb") as f:
            ticks = int(f.read().rpartition(b")")[2].split()[19])
        boot = open("/proc/sys/kernel/random/boot_id").read().strip()
        fd = os.open(f"{journal_dir}/{host}-{pid}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        for r in json.load(open(recs)):
            if "pid" in r:
                r["pid"] = pid
            if r["kind"] == "process":
                r.update(host=host, start_ticks=ticks, boot_id=boot)
            os.write(fd, (json.dumps(r) + "\\n").encode())
    if stacks_dir:
        dump = open(f"{stacks_dir}/{host}-{pid}.txt", "a")
        faulthandler.register(signal.SIGUSR2, file=dump, all_threads=False, chain=True)
    print("ready", flush=True)
    time.sleep(120)
    """
)


class Process:
    """``PROCESS`` started; ``signals()`` is what it received."""

    def __init__(self, tmp: Path, name: str, journal_dir: Path | None = None, recs: list | None = None, stacks=None):
        self.log = tmp / f"{name}.signals"
        self.log.touch()
        spec = tmp / f"{name}.json"
        spec.write_text(json.dumps(recs or []))
        argv = [str(journal_dir or ""), str(self.log), str(stacks or ""), str(spec)]
        self.proc = subprocess.Popen([sys.executable, "-c", PROCESS, *argv], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        self.pid = self.proc.pid

    def signals(self) -> list[str]:
        return self.log.read_text().split()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def started(tmp_path: Path) -> Iterator:
    made: list[Process] = []

    def start(name: str, **kw) -> Process:
        made.append(Process(tmp_path, name, **kw))
        return made[-1]

    yield start
    for p in made:
        p.stop()


@pytest.fixture(autouse=True)
def said_afresh() -> Iterator[None]:
    process_state.STATE.said.clear()
    yield
    process_state.STATE.said.clear()


def private_run(tmp_path: Path, name: str = "run", stacks: bool = True) -> Path:
    """A run directory as the runtime makes one: 0700, with ``journal/`` (and ``stacks/``)."""
    run = tmp_path / name
    for sub in ("journal", "stacks")[: 2 if stacks else 1]:
        (run / sub).mkdir(parents=True, mode=0o700)
    run.chmod(0o700)
    return run


def rank_records(pid: int, now: int, node: int | None = None) -> list[dict]:
    """A rank inside a phase, its last heartbeat a minute old: ``silent``."""
    t0 = now - 90 * S
    attrs = {"sglang.tp_rank": 1, "sglang.role": "rank", "sglang.rank": "tp1"}
    if node is not None:
        attrs[keys.NODE_RANK] = node
    root, phase = "a" * 16, "c" * 16
    return [
        records.process(t0, pid, 1, procs.this_host(), "run", t0, {}),
        records.identity(t0, "tp1", "rank", attrs),
        records.begin(t0, root, None, "b" * 32, "rank tp1", {"sglang.phase": "rank"}, "MainThread"),
        records.begin(t0 + S, phase, root, "b" * 32, "model.loader", {"sglang.phase": "model.loader"}, "MainThread"),
        records.heartbeat(now - 60 * S, 1, pid, "tp1", False, 5.0, [], 0.0, 1, 1),
    ]


def launcher_records(pid: int, now: int, node: int | None = None) -> list[dict]:
    attrs = {} if node is None else {keys.NODE_RANK: node}
    t0 = now - 100 * S
    return [
        records.process(t0, pid, 1, procs.this_host(), "run", t0, {}),
        records.identity(t0, "launcher", "launcher", attrs),
    ]


def plant(run: Path, recs: list[dict], pid: int, boot: bool = True) -> None:
    """A journal naming ``pid`` with its real start time (and boot id): what anyone can read."""
    fingerprint = procs.fingerprint(pid) if boot else {"start_ticks": procs.start_ticks(pid)}
    recs = [dict(r, **fingerprint) if r["kind"] == "process" else r for r in recs]
    (run / "journal" / f"{procs.this_host()}-{pid}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def watch(run: Path, env: dict[str, str] | None = None, py_spy: bool = True) -> subprocess.CompletedProcess:
    argv = ["watch", str(run), "--exit-on-stall", "--timeout", "20", *([] if py_spy else ["--no-py-spy"])]
    return subprocess.run(
        [sys.executable, "-m", "sglang_phasetrace.tracing.cli", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=90,
    )


def stacks_of(run: Path, pid: int) -> list[Path]:
    return sorted((run / "stacks").glob(f"*-{pid}*")) if (run / "stacks").is_dir() else []


# -- a planted journal, another node's snapshot, someone else's directory: nothing signalled --------


@pytest.mark.parametrize("boot", [True, False], ids=["with-boot-id", "without-boot-id"])
def test_a_planted_journal_naming_a_process_of_this_user_gets_it_no_signal_and_no_py_spy(
    boot: bool, tmp_path: Path, started
) -> None:
    """Its real pid, start time and boot id, in a private run directory: ``ABORT_AFTER_S=0 phasetrace
    watch`` names the stall, and neither the "rank" gets SIGUSR2 or py-spy nor the "launcher" SIGTERM."""
    rank, launcher = started("rank"), started("launcher")
    run, now = private_run(tmp_path), time.time_ns()
    plant(run, rank_records(rank.pid, now), rank.pid, boot)
    plant(run, launcher_records(launcher.pid, now), launcher.pid, boot)
    done = watch(run, {keys.ENV_ABORT_AFTER: "0"})
    assert done.returncode == 3 and "sglang-phasetrace: STALL rank tp1" in done.stderr, done.stderr
    assert "no launcher of this run is running on this host: nothing signalled" in done.stderr, done.stderr
    time.sleep(0.3)
    assert rank.signals() == [] and launcher.signals() == []
    assert stacks_of(run, rank.pid) == []  # no py-spy read, no request
    assert rank.proc.poll() is None and launcher.proc.poll() is None


def test_another_nodes_snapshot_naming_a_local_process_gets_it_no_signal(tmp_path: Path, started, monkeypatch) -> None:
    """One ``set`` on the launch's store: "node 1" reports this host's processes, with their exact
    pid, start time and boot id. Node 0's watchdog names the stall and signals nobody."""
    rank, launcher = started("rank"), started("launcher")
    now = time.time_ns()
    node1 = private_run(tmp_path, "n1")
    plant(node1, rank_records(rank.pid, now, node=1), rank.pid)
    plant(node1, launcher_records(launcher.pid, now, node=1), launcher.pid)
    snap = crossnode.snapshot(RunView(node1).refresh(), 1, 1, now)
    node0 = private_run(tmp_path, "n0")
    monkeypatch.setenv(keys.ENV_ABORT_AFTER, "0")
    out = io.StringIO()
    dog = Watchdog(node0, TH, out=out, py_spy=True)
    dog.node = 0
    dog.run.set_remote("node-1", crossnode.remote_processes(snap, 0, "node-1"))
    dog.step(now)
    time.sleep(0.3)
    assert rank.signals() == [] and launcher.signals() == [], out.getvalue()
    assert stacks_of(node0, rank.pid) == [] and stacks_of(node1, rank.pid) == []


FORGED = "forged-host"  # a made-up host: a store writer's snapshot passes every check of its own node


def forged_snapshot(tmp_path: Path, pid: int, role: str, now: int, silent: bool) -> bytes:
    """What anyone who can write the launch's store can publish as node 1: one process on a made-up
    host with ``pid`` (a local rank's), a launcher or a rank, silent for a minute or beating now."""
    t0, label = now - 90 * S, "launcher-node1" if role == "launcher" else "tp5"
    attrs = {keys.NODE_RANK: 1} | ({keys.TP_RANK: 5} if role == "rank" else {})
    phase = {"launcher": keys.PHASE_LAUNCH_SERVER, "rank": "rank"}[role]
    recs = [
        records.process(t0, pid, 1, FORGED, "run", t0, {}),
        records.identity(t0, label, role, attrs),
        records.begin(t0, "d" * 16, None, "e" * 32, phase, {keys.PHASE: phase}, "MainThread"),
        records.heartbeat(now - 60 * S if silent else now, 1, pid, label, False, 5.0, [], 0.0, 1, 1),
    ]
    run = tmp_path / "forged"
    (run / "journal").mkdir(parents=True)
    (run / "journal" / f"{FORGED}-{pid}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return relay.encode(crossnode.snapshot(RunView(run).refresh(), 1, 1, now))


def node0_with(run: Path, snapshot: bytes, out: io.StringIO) -> Watchdog:
    """Node 0's watchdog over ``run``, node 1's key in its store holding ``snapshot``."""
    dog = Watchdog(run, TH, out=out, py_spy=False)
    dog.node = 0
    dog.crossnode = crossnode.CrossNode(crossnode.Node(0, 2, "10.0.0.1:29500"), run, "1" * 32, 2.0, 10.0)
    dog.crossnode.inbox = {1: snapshot}
    return dog


def beating(pid: int, now: int) -> list[dict]:
    """``rank_records`` with a heartbeat just now: a rank at work, nothing to say about it."""
    return [*rank_records(pid, now)[:-1], records.heartbeat(now, 2, pid, "tp1", False, 5.0, [], 0.0, 1, 1)]


def test_a_forged_report_sharing_a_local_ranks_pid_gets_that_rank_no_signal(tmp_path: Path, started) -> None:
    """A made-up host's launcher, silent, with the pid of this host's working rank: its stall is said
    (labelled with the node it claims), and nothing of this host is signalled for it."""
    run, now = private_run(tmp_path), time.time_ns()
    rank = started("rank", journal_dir=run / "journal", recs=beating(0, now), stacks=run / "stacks")
    out = io.StringIO()
    dog = node0_with(run, forged_snapshot(tmp_path, rank.pid, "launcher", now, silent=True), out)
    [found] = dog.step(now)
    assert (found.kind, found.label, found.stacks) == ("silent", "launcher-node1", []), out.getvalue()
    assert found.proc is not None and (found.proc.host, found.proc.pid, found.proc.reported) == (
        FORGED,
        rank.pid,
        True,
    )
    assert [p.label for p in dog.involved(found)] == ["launcher-node1"]
    time.sleep(0.3)
    assert rank.signals() == [] and (run / "stacks" / f"{procs.this_host()}-{rank.pid}.txt").read_text() == ""


@pytest.mark.parametrize(
    "role, silent", [("launcher", True), ("rank", False)], ids=["silent-launcher-first", "working-rank-after"]
)
def test_a_local_rank_stalled_gets_its_stacks_whatever_a_report_sharing_its_pid_says(
    role: str, silent: bool, tmp_path: Path, started
) -> None:
    """This host's silent rank is named and its stacks taken, though a forged report names a process
    with its pid: one judged before it (a silent launcher: named first), or one after it (a working
    rank: the one a pid lookup would find last)."""
    run, now = private_run(tmp_path), time.time_ns()
    rank = started("rank", journal_dir=run / "journal", recs=rank_records(0, now), stacks=run / "stacks")
    out = io.StringIO()
    dog = node0_with(run, forged_snapshot(tmp_path, rank.pid, role, now, silent), out)
    found = {f.label: f for f in dog.step(now)}
    assert found["tp1"].kind == "silent" and rank.signals() == ["SIGUSR2"], out.getvalue()
    own = run / "stacks" / f"{procs.this_host()}-{rank.pid}.txt"
    assert str(own) in found["tp1"].stacks and own.read_text().startswith("Stack (most recent call first):")
    assert found["tp1"].proc is not None and found["tp1"].proc.source == str(
        run / "journal" / own.with_suffix(".jsonl").name
    )
    if silent:  # the forged one is said too, with no stacks of anyone
        assert found["launcher-node1"].stacks == []
    assert [p.remote for p in dog.involved(found["tp1"])] == [None]


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777], ids=["world-writable", "group-writable", "sticky"])
def test_watch_refuses_a_run_directory_others_can_write_naming_it(mode: int, tmp_path: Path, started) -> None:
    rank = started("rank")
    run, now = private_run(tmp_path), time.time_ns()
    plant(run, rank_records(rank.pid, now), rank.pid)
    run.chmod(mode)
    done = watch(run, py_spy=False)
    assert done.returncode == 1, done.stderr
    assert f"refusing to watch {run}: {run} is writable by other users (mode {mode:o})" in done.stderr
    assert rank.signals() == [] and stacks_of(run, rank.pid) == []
    run.chmod(0o700)
    (run / "journal").chmod(0o777)
    done = watch(run, py_spy=False)
    assert done.returncode == 1 and f"{run}/journal is writable by other users (mode 777)" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory another user's needs root")
def test_watch_refuses_a_run_directory_of_another_user(tmp_path: Path, started) -> None:
    import pwd

    nobody = pwd.getpwnam("nobody").pw_uid
    rank = started("rank")
    run, now = private_run(tmp_path), time.time_ns()
    plant(run, rank_records(rank.pid, now), rank.pid)
    os.chown(run, nobody, -1)
    done = watch(run, py_spy=False)
    assert done.returncode == 1, done.stderr
    assert f"refusing to watch {run}: {run} is owned by uid {nobody}, not by this user (uid 0)" in done.stderr
    assert rank.signals() == []


def test_a_writing_process_in_a_directory_others_can_write_is_not_signalled(
    tmp_path: Path, started, caplog: pytest.LogCaptureFixture
) -> None:
    """Even a process that does write the journal it is named in: the directory is not this user's
    alone (anyone could have put that journal there), so the watchdog says so once and signals nothing."""
    run, now = private_run(tmp_path), time.time_ns()
    rank = started("rank", journal_dir=run / "journal", recs=rank_records(0, now))
    run.chmod(0o777)
    out = io.StringIO()
    with caplog.at_level(logging.WARNING, "sglang_phasetrace"):
        [found] = Watchdog(run, TH, out=out, py_spy=True).step(now)
    assert found.kind == "silent" and found.stacks == [] and rank.signals() == []
    said = [r.getMessage() for r in caplog.records if "signalled" in r.getMessage()]
    assert said == [f"sglang-phasetrace: nothing in this run is signalled: {run} is writable by other users (mode 777)"]


# -- what is proven: a process that writes its own journal in a private run directory --------------


def test_a_process_writing_its_own_journal_gets_its_stacks_asked_into_new_files(tmp_path: Path, started) -> None:
    """SIGUSR2 reaches it (through its pidfd); its faulthandler dump lands in its own file, which the
    watchdog never writes to; the watchdog's header and ``/proc`` view go to a new request file."""
    run, now = private_run(tmp_path), time.time_ns()
    rank = started("rank", journal_dir=run / "journal", recs=rank_records(0, now), stacks=run / "stacks")
    own = run / "stacks" / f"{procs.this_host()}-{rank.pid}.txt"
    out = io.StringIO()
    [found] = Watchdog(run, TH, out=out, py_spy=False).step(now)
    assert found.kind == "silent" and rank.signals() == ["SIGUSR2"]
    dump, request = map(Path, found.stacks)
    assert dump == own and request.name.startswith(f"{own.stem}-request-")
    assert own.read_text().startswith("Stack (most recent call first):")  # its main thread's
    assert "=== stacks of pid" not in own.read_text()  # only what the process wrote itself
    text = request.read_text()
    assert text.startswith(f"=== stacks of pid {rank.pid} requested at ") and "thread " in text
    assert f"its Python stacks: {own}, from byte 0" in text
    assert oct(request.stat().st_mode & 0o777) == "0o600"
    assert f"; stacks: {own}, {request}" in out.getvalue()


def test_abort_after_sends_sigterm_only_to_a_launcher_its_own_journal_proves(
    tmp_path: Path, started, monkeypatch
) -> None:
    run, now = private_run(tmp_path), time.time_ns()
    plant(run, rank_records(4_000_000, now), 4_000_000)  # a rank not running: a stall to act on
    planted = started("planted")
    plant(run, launcher_records(planted.pid, now), planted.pid)
    launcher = started("launcher", journal_dir=run / "journal", recs=launcher_records(0, now))
    monkeypatch.setenv(keys.ENV_ABORT_AFTER, "0")
    out = io.StringIO()
    Watchdog(run, TH, out=out, py_spy=False).step(now)
    deadline = time.monotonic() + 5
    while not launcher.signals() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert launcher.signals() == ["SIGTERM"] and planted.signals() == [], out.getvalue()
    assert f"sending SIGTERM to the launcher (pid {launcher.pid})" in out.getvalue()


def test_the_proof_wants_the_boot_id_and_the_journal_held_open(tmp_path: Path, started) -> None:
    run, now = private_run(tmp_path), time.time_ns()
    writer = started("writer", journal_dir=run / "journal", recs=launcher_records(0, now))
    stranger = started("stranger")
    host, ticks, boot = procs.this_host(), procs.start_ticks(writer.pid), procs.boot_id()
    journal = run / "journal" / f"{host}-{writer.pid}.jsonl"
    with procs.pin(writer.pid, host, ticks, boot, journal) as target:
        assert target is not None and target.fd is not None and target.running()
    assert procs.pin(writer.pid, host, ticks, None, journal) is None  # no boot id: no proof
    assert procs.why_not_ours(writer.pid, host, ticks, None, journal) == "no boot id of this boot recorded"
    assert procs.pin(writer.pid, host, ticks + 1, boot, journal) is None
    planted = run / "journal" / f"{host}-{stranger.pid}.jsonl"
    planted.write_text("{}\n")
    stranger_ticks = procs.start_ticks(stranger.pid)
    assert procs.why_not_ours(stranger.pid, host, stranger_ticks, boot, planted) == f"it does not write {planted}"
    assert procs.pin(stranger.pid, host, stranger_ticks, boot, journal) is None  # not its journal's name


# -- item 5: a symbolic link at stacks/ --------------------------------------------------------------


def test_a_link_at_stacks_is_not_written_through_and_said_once(
    tmp_path: Path, started, caplog: pytest.LogCaptureFixture
) -> None:
    run, now = private_run(tmp_path, stacks=False), time.time_ns()
    rank = started("rank", journal_dir=run / "journal", recs=rank_records(0, now))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    precious = elsewhere / f"{procs.this_host()}-{rank.pid}.txt"
    precious.write_text("precious\n")
    (run / "stacks").symlink_to(elsewhere)
    out = io.StringIO()
    with caplog.at_level(logging.WARNING, "sglang_phasetrace"):
        [found] = Watchdog(run, TH, out=out, py_spy=True).step(now)
    assert found.kind == "silent" and found.stacks == []
    assert sorted(p.name for p in elsewhere.iterdir()) == [precious.name] and precious.read_text() == "precious\n"
    said = [r.getMessage() for r in caplog.records if "stacks" in r.getMessage()]
    assert said == [f"sglang-phasetrace: stacks not written: {run}/stacks is a symbolic link"], said
    assert "STALL" in out.getvalue() or "SILENT" in out.getvalue() or "tp1" in out.getvalue()


# -- item 10: fork, and pre-flight's process group ---------------------------------------------------


def traced_env(run: Path, **more: str) -> dict[str, str]:
    """This environment without our settings, then tracing into ``run`` (and ``more``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_PHASETRACE")}
    return {**env, "SGLANG_PHASETRACE_RUN_DIR": str(run), **more}


FORKED = textwrap.dedent(
    """
    import os, signal, sys, time
    from sglang_phasetrace.tracing.recorder import start
    start.start()
    traced = sys.argv[1] == "traced"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        if traced:
            start.start()  # a child that traces: its own journal, its own dump file
        os.write(w, b"x")
        time.sleep(30)
        os._exit(0)
    os.read(r, 1)
    os.kill(pid, signal.SIGUSR2)
    time.sleep(1.0)
    _, status = os.waitpid(pid, os.WNOHANG)
    print(pid, "alive" if _ == 0 else os.waitstatus_to_exitcode(status), flush=True)
    if _ == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    """
)


@pytest.mark.parametrize("child", ["traced", "untraced"])
def test_a_forked_child_never_dumps_into_its_parents_stack_file(child: str, tmp_path: Path) -> None:
    """SIGUSR2 to a forked child: the parent's file gets nothing. A child that traces dumps into its
    own file; one that does not ends of SIGUSR2 as it would untraced (SIGUSR2's default action)."""
    run = tmp_path / "run"
    env = traced_env(run, SGLANG_PHASETRACE_HEARTBEAT_S="3600")
    done = subprocess.run(
        [sys.executable, "-c", FORKED, child], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    pid, how = done.stdout.split()
    parent = [p for p in (run / "stacks").iterdir() if not p.name.endswith(f"-{pid}.txt")]
    assert len(parent) == 1 and parent[0].read_text() == "", parent[0].read_text()
    mine = run / "stacks" / f"{procs.this_host()}-{pid}.txt"
    if child == "traced":
        assert how == "alive" and "File " in mine.read_text()
    else:
        assert how == str(-signal.SIGUSR2) and not mine.exists()


BUSY = textwrap.dedent(
    """
    import threading, time
    from sglang_phasetrace.tracing.recorder import start

    def churn():
        while True:
            sum(1 for _ in range(64))

    def main_waits():
        print("ready", flush=True)
        time.sleep(60)

    start.start()
    for _ in range(2):
        threading.Thread(target=churn, daemon=True).start()
    main_waits()
    """
)


@pytest.mark.parametrize("aim", ["pidfd", "tgkill"])
def test_stack_dumps_never_crash_a_traced_process_whose_threads_run(aim: str, tmp_path: Path, monkeypatch) -> None:
    """Twenty dumps asked in the first second of each of three traced processes, while their threads
    run Python (tracing's own start, two busy threads): each lives on, and each dump is its main
    thread's. When faulthandler read every thread, 21 of 30 such processes died of SIGSEGV.
    ``tgkill``: a kernel before 6.9, whose pidfd cannot aim a signal at one thread."""
    if aim == "tgkill":
        real = signal.pidfd_send_signal

        def before_6_9(fd: int, sig: int, siginfo: object = None, flags: int = 0) -> None:
            if flags:
                raise OSError(errno.EINVAL, "Invalid argument")
            real(fd, sig, siginfo, flags)

        monkeypatch.setattr(signal, "pidfd_send_signal", before_6_9)
    for n in range(3):
        run = tmp_path / f"run{n}"
        busy = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True, env=traced_env(run))
        try:
            assert busy.stdout is not None and busy.stdout.readline() == "ready\n"
            with procs.Pinned(busy.pid, os.pidfd_open(busy.pid)) as target:
                for _ in range(20):
                    assert target.send_to_main_thread(signal.SIGUSR2)
                    time.sleep(0.01)
            time.sleep(0.2)
            assert busy.poll() is None, f"process {n} ended: {busy.returncode}"
            dumps = (run / "stacks" / f"{procs.this_host()}-{busy.pid}.txt").read_text()
            blocks = dumps.split("Stack (most recent call first):\n")
            assert blocks[0] == "" and len(blocks) > 1 and all("in main_waits" in b for b in blocks[1:]), dumps
        finally:
            busy.kill()
            busy.wait()


def test_preflight_signals_its_group_only_while_the_leader_holds_its_id(tmp_path: Path, monkeypatch) -> None:
    """The launch's leader exits at once, leaving a process of its group behind: pre-flight SIGTERMs
    the group while the leader is still unreaped (a zombie: the group's id cannot be reused), sends no
    SIGKILL once the group is empty, and reaps the leader after."""
    fake = tmp_path / "sglang" / "launch_server.py"
    fake.parent.mkdir()
    left = tmp_path / "left.pid"
    fake.write_text(
        textwrap.dedent(
            f"""
            import subprocess, sys
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            open({str(left)!r}, "w").write(str(child.pid))
            sys.exit(1)
            """
        )
    )
    sent: list[tuple[int, int, bool]] = []
    real_killpg = os.killpg

    def spy(pgid: int, sig: int) -> None:
        sent.append((pgid, sig, os.path.exists(f"/proc/{pgid}")))
        real_killpg(pgid, sig)

    monkeypatch.setattr(os, "killpg", spy)
    monkeypatch.delenv("SGLANG_PHASETRACE_RUN_DIR", raising=False)
    model = tmp_path / "model"
    model.mkdir()
    argv = ["preflight", "--no-read-rate", "--deadline", "60", "--dir", str(tmp_path / "runs"), "--quiet", "--"]
    rc = main([*argv, sys.executable, str(fake), "--model-path", str(model)])
    assert rc == 4
    orphan = int(left.read_text())
    assert not procs.alive(orphan)
    assert sent and all(alive for _, _, alive in sent), sent  # the leader's id held at every signal
    assert signal.SIGKILL not in [sig for _, sig, _ in sent], sent  # the group was empty: no SIGKILL
    leader = sent[0][0]
    assert not os.path.exists(f"/proc/{leader}")  # reaped after
