"""What a waiting rank waits on (``tracing.verdicts.evidence``), read from real processes: a holder of
an exclusive ``flock`` and two waiters blocked on it, a process polling for a lock, a parent waiting
for a busy child named like a compiler, a client blocked in ``recv`` on a server that accepted and
never replies, one whose SYN is dropped by a full accept queue, and processes that end mid-read.

Every process is started here, bounded in time, and killed (children first) when the test ends.
The py-spy dumps of NCCL / CUDA / GIL waits are canned text: no CPU path produces those frames.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
from sglang_phasetrace.tracing.verdicts import evidence, hints
from sglang_phasetrace.tracing.verdicts.evidence import Evidence

pytestmark = [
    pytest.mark.skipif(not Path("/proc/locks").exists(), reason="Linux /proc only"),
    pytest.mark.timeout(120),
]
S = 1_000_000_000
SECRET = "sk-" + "a1B2c3D4e5F6g7H8i9J0kLmN"  # a token shape the redaction knows


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{p}/task/{tid}/children") as f:
                    kids = [int(c) for c in f.read().split()]
                    out += kids
                    todo += kids
    return out


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen]]:
    """Start ``python -c CODE`` (or an argv); every one is killed at the end, its children first
    (so the parent reaps them), then itself, and waited for."""
    started: list[subprocess.Popen] = []

    def start(code: str | list[str], **kw: object) -> subprocess.Popen:
        argv = [sys.executable, "-c", textwrap.dedent(code)] if isinstance(code, str) else code
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]
        started.append(proc)
        return proc

    yield start
    for proc in reversed(started):
        for child in _descendants(proc.pid):
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)
    time.sleep(0.1)
    for proc in reversed(started):
        with contextlib.suppress(OSError):
            proc.kill()
        proc.wait(timeout=10)


def _until(check: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


HOLDER = """
import fcntl, sys, time
f = open(sys.argv[1], "a")
getattr(fcntl, sys.argv[2])(f, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(120)
"""


def _holder(spawn: Callable[..., subprocess.Popen], path: Path, how: str = "flock") -> subprocess.Popen:
    """A process outside the launch holding an exclusive lock on ``path``; a secret in its arguments."""
    script = path.parent / "holder.py"
    script.write_text(HOLDER)
    argv = [sys.executable, str(script), str(path), how, "holder-marker", "--api-key", SECRET]
    proc = spawn(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _waiters_listed(n: int, inode: int) -> Callable[[], bool]:
    def check() -> bool:
        table = evidence.read_locks() or []
        return sum(1 for ln in table if ln.waiting and ln.inode == inode) >= n

    return check


# -- file locks ---------------------------------------------------------------------------------------------


def test_two_ranks_wait_for_an_exclusive_flock_held_outside_the_launch(tmp_path, spawn):
    lock = tmp_path / "flashinfer" / "cached_ops" / "sampling.lock"
    lock.parent.mkdir(parents=True)
    holder = _holder(spawn, lock)
    wait = f"import fcntl\nf = open({str(lock)!r}, 'a')\nfcntl.flock(f, fcntl.LOCK_EX)"
    ranks = {f"tp{i}": spawn(wait) for i in range(2)}
    _until(_waiters_listed(2, lock.stat().st_ino), what="both waiters in /proc/locks")
    launch = {p.pid for p in ranks.values()}
    since = time.time_ns() - 9 * S
    table = evidence.read_locks()
    evs = {label: evidence.read(p.pid, launch_pids=launch, since_ns=since, locks=table) for label, p in ranks.items()}

    for ev in evs.values():
        assert ev.cause == "lock" and not ev.busy and not ev.gone, ev
        (held,) = ev.locks
        assert held.path == str(lock)
        assert (held.kind, held.exclusive, held.how) == ("flock", True, "blocked")
        assert held.holder_pid == holder.pid and held.holder_alive and held.holder_has_it_open
        assert "holder-marker" in (held.holder_cmd or "") and SECRET not in (held.holder_cmd or "")
        assert held.holder_in_launch is False
        assert held.waiters == sorted(launch)
        assert held.device == f"{os.major(lock.stat().st_dev)}:{os.minor(lock.stat().st_dev)}"
        assert ev.main is not None and ev.main.kind == "flock"
        assert ev.main.syscall == "flock" or ev.main.source == "wchan"  # /proc/PID/syscall needs ptrace access
        assert ev.text.startswith(f"waits for an exclusive lock on {lock} held by pid {holder.pid} (`flock`, ")
        assert "not part of this launch" in ev.text and ev.text.endswith("for 9 s"), ev.text

    shared = evidence.shared_cause(evs)
    assert shared is not None and shared.alarm and shared.kind == "lock"
    assert shared.holder_pid == holder.pid and set(shared.pids) == launch | {holder.pid}
    assert shared.text.startswith(f"tp0, tp1 wait for an exclusive lock on {lock} held by pid {holder.pid} (`flock`")
    assert "not part of this launch" in shared.text and shared.text.endswith("for 9 s")

    hint = hints.for_evidence(evs["tp0"])
    assert hint is not None and hint.name == "flashinfer_jit_lock" and "#19583" in hint.source
    assert "slow_load_straggler" in hints.contradicted(evs["tp0"])

    # the same holder, counted in the launch: said so, still one cause
    ev = evidence.read(ranks["tp0"].pid, launch_pids=launch | {holder.pid}, locks=table)
    assert ev.locks[0].holder_in_launch is True and "part of this launch" in ev.text


def test_a_posix_lock_wait_is_named_too(tmp_path, spawn):
    lock = tmp_path / "deep_gemm" / "locks" / "GEMM_NT_n4096_k4096_g1.lock"
    lock.parent.mkdir(parents=True)
    holder = _holder(spawn, lock, how="lockf")
    waiter = spawn(f"import fcntl\nf = open({str(lock)!r}, 'a')\nfcntl.lockf(f, fcntl.LOCK_EX)")
    _until(_waiters_listed(1, lock.stat().st_ino), what="the waiter in /proc/locks")
    ev = evidence.read(waiter.pid)
    assert ev.cause == "lock" and ev.locks[0].kind == "posix" and ev.locks[0].holder_pid == holder.pid
    assert ev.locks[0].path == str(lock)
    assert hints.for_evidence(ev).name == "deepgemm_jit_lock"  # type: ignore[union-attr]


def test_a_rank_polling_for_a_lock_is_named(tmp_path, spawn):
    """``LOCK_NB`` and a sleep in a loop, the descriptor kept open (as sglang's own JIT cache lock
    does): the kernel lists no waiter, but the rank holds the locked file open and sleeps."""
    lock = tmp_path / "torchinductor_user" / "locks" / "abc.lock"
    lock.parent.mkdir(parents=True)
    holder = _holder(spawn, lock)
    poller = spawn(
        f"""
        import fcntl, time
        fd = open({str(lock)!r}, 'a')
        print('polling', flush=True)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.2)
        """,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert poller.stdout is not None and poller.stdout.readline().strip() == "polling"
    ev = _until(lambda: (e := evidence.read(poller.pid)).cause == "lock" and e, what="a polling lock")
    assert isinstance(ev, Evidence)
    (held,) = ev.locks
    assert held.how == "polls" and held.holder_pid == holder.pid and held.path == str(lock)
    assert ev.text.startswith(f"polls for an exclusive lock on {lock} held by pid {holder.pid}")
    assert hints.for_evidence(ev).name == "inductor_cache_lock"  # type: ignore[union-attr]


def test_py_spy_native_frame_of_a_flock_waiter(tmp_path, spawn):
    py_spy = Path(sys.executable).parent / "py-spy"
    if not py_spy.exists():
        pytest.skip("py-spy is not installed")
    lock = tmp_path / "x.lock"
    _holder(spawn, lock)
    waiter = spawn(f"import fcntl\nf = open({str(lock)!r}, 'a')\nfcntl.flock(f, fcntl.LOCK_EX)")
    _until(_waiters_listed(1, lock.stat().st_ino), what="the waiter")
    done = subprocess.run([str(py_spy), "dump", "--native", "--pid", str(waiter.pid)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"py-spy may not read it here: {done.stderr.strip()[:200]}")
    native = evidence.native_frame(done.stdout, waiter.pid)
    assert native is not None and native.kind == "flock" and (native.frame or "").startswith("flock")
    ev = evidence.read(waiter.pid, native=done.stdout)
    assert ev.main is not None and ev.main.source == "py-spy" and ev.main.frame == native.frame


@pytest.mark.parametrize(
    ("frames", "kind", "library"),
    [
        (["flock (libc.so.6)", "fcntl_flock_impl (fcntlmodule.c:297)", "load (jit/core.py:134)"], "flock", None),
        (
            [
                "__futex_abstimed_wait_common (libc.so.6)",
                "pthread_cond_wait@@GLIBC_2.3.2 (libc.so.6)",
                "ncclCommInitRankFunc (libnccl.so.2)",
                "ncclCommInitRank (libnccl.so.2)",
                "c10d::ProcessGroupNCCL::getNCCLComm (libtorch_cuda.so)",
                "all_reduce (torch/distributed/distributed_c10d.py:2050)",
            ],
            "nccl",
            "NCCL (ncclCommInitRank)",
        ),
        (["ioctl (libc.so.6)", "0x7f00 (libcuda.so.1)", "cudaStreamSynchronize (libcudart.so.12)"], "cuda", "CUDA"),
        (["__futex_abstimed_wait_common (libc.so.6)", "take_gil (libpython3.11.so)", "f (x.py:1)"], "gil", None),
        (["__GI___poll (libc.so.6)", "gloo::transport::tcp::Loop::run (libtorch_cpu.so)"], "gloo", "gloo"),
        (
            ["clock_nanosleep (libc.so.6)", "time_sleep (libpython3.11.so)", "acquire (filelock/_api.py:344)"],
            "lock_poll",
            None,
        ),
        (
            ["connect (libc.so.6)", "sock_connect (socketmodule.c:3400)", "create_connection (socket.py:836)"],
            "connect",
            None,
        ),
        (
            ["wait4 (libc.so.6)", "os_waitpid_impl (posixmodule.c:9000)", "wait (subprocess.py:1959)"],
            "wait_child",
            None,
        ),
    ],
)
def test_native_frames_are_classified_in_words(frames, kind, library):
    """Canned ``py-spy dump --native`` text (NCCL, CUDA and GIL waits have no CPU path to plant)."""
    dump = (
        'Process 4242: python -m sglang.launch_server\nPython v3.11.7\n\nThread 4243 (idle): "Thread-1"\n'
        '    clock_nanosleep (libc.so.6)\nThread 4242 (idle): "MainThread"\n'
        + "".join(f"    {f}\n" for f in frames)
        + 'Thread 4244 (idle): "other"\n    epoll_wait (libc.so.6)\n'
    )
    native = evidence.native_frame("=== py-spy dump, with native frames ===\n" + dump, 4242)
    assert native is not None and native.kind == kind, native
    assert native.frame == frames[0].replace("@@GLIBC_2.3.2", "@@GLIBC_2.3.2")
    assert (native.library or "").startswith(library or "") and (library is not None) == (native.library is not None)
    assert native.words


# -- children -----------------------------------------------------------------------------------------------


def test_a_rank_waiting_for_its_busy_compiler_child_is_busy_not_stuck(tmp_path, spawn):
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(f"#!{sys.executable}\nwhile True:\n    pass\n")
    nvcc.chmod(0o700)
    rank = spawn(f"import subprocess\nsubprocess.run([{str(nvcc)!r}, '-c', '/cache/deep_gemm/kernel.cu'])")
    child = _until(lambda: _descendants(rank.pid), what="the compiler child")
    since = time.time_ns() - 70 * S
    best: Evidence | None = None
    for _ in range(5):  # the CPU share over a 1 s window; a loaded host may need another window
        ev = evidence.read(rank.pid, since_ns=since, window_s=1.0)
        if ev.children and (best is None or ev.children[0].cpu_pct > best.children[0].cpu_pct):
            best = ev
        if best is not None and best.children[0].cpu_pct > 50:
            break
    assert best is not None
    top = best.children[0]
    assert top.pid == child[0] and top.name == "nvcc" and top.build == "nvcc (CUDA compiler)"
    assert top.cpu_pct >= evidence.BUSY_PCT and top.cpu_over == "window" and top.age_s > 0 and top.ppid == rank.pid
    if os.getloadavg()[0] < (os.cpu_count() or 1):  # a saturated host gives the loop less than half a core
        assert top.cpu_pct > 50, top
    assert best.busy and best.cause == "child"
    assert best.main is not None and best.main.kind == "wait_child"
    assert best.text.startswith(f"is busy, not stuck: its child compiles: nvcc (pid {top.pid}, CUDA compiler) at ")
    shared = evidence.shared_cause({"tp1": best})
    assert shared is not None and not shared.alarm and shared.kind == "child"
    assert shared.text.startswith("tp1 is busy, not stuck")
    assert hints.for_evidence(best).name == "deepgemm_compile"  # type: ignore[union-attr]

    time.sleep(0.5)
    again = evidence.read(rank.pid, previous=best)  # CPU since the previous read, no sleep in the read
    assert again.children[0].cpu_over == "since_previous" and again.busy


def test_a_lock_held_by_a_busy_rank_is_not_a_stall(tmp_path, spawn):
    """tp0 holds the JIT lock while its child compiles; tp1 waits for the lock: busy, not stuck."""
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(f"#!{sys.executable}\nwhile True:\n    pass\n")
    nvcc.chmod(0o700)
    lock = tmp_path / "flashinfer" / "sampling.lock"
    lock.parent.mkdir()
    tp0 = spawn(
        f"""
        import fcntl, subprocess
        f = open({str(lock)!r}, 'a')
        fcntl.flock(f, fcntl.LOCK_EX)
        subprocess.run([{str(nvcc)!r}])
        """
    )
    _until(lambda: _descendants(tp0.pid), what="tp0's compiler")
    tp1 = spawn(f"import fcntl\nf = open({str(lock)!r}, 'a')\nfcntl.flock(f, fcntl.LOCK_EX)")
    _until(_waiters_listed(1, lock.stat().st_ino), what="tp1 waiting")
    launch = {tp0.pid, tp1.pid}
    evs = {
        "tp0": evidence.read(tp0.pid, launch_pids=launch, window_s=0.5),
        "tp1": evidence.read(tp1.pid, launch_pids=launch),
    }
    assert evs["tp1"].cause == "lock" and evs["tp1"].locks[0].holder_pid == tp0.pid
    assert evs["tp1"].locks[0].holder_in_launch is True
    if not evs["tp0"].busy:
        pytest.skip("the compiler got under 25 % of a core in the window (a loaded host)")
    for idle in ({"tp1"}, None):  # named idle by the caller, or judged from the evidence (tp0 is busy)
        shared = evidence.shared_cause(evs, idle=idle)
        assert shared is not None and not shared.alarm and shared.kind == "lock"
        assert shared.labels == ["tp1"] and f"held by tp0 (pid {tp0.pid}), which is busy, not stuck" in shared.text


# -- sockets ------------------------------------------------------------------------------------------------


def test_a_rank_in_recv_on_a_peer_that_accepted_and_never_replies(spawn):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        client = spawn(
            f"import socket\ns = socket.create_connection(('127.0.0.1', {port}))\ns.sendall(b'GET /')\ns.recv(1)"
        )
        conn, _ = server.accept()
        with conn:
            conn.recv(16)  # what it sent is read: nothing is left queued on either side
            since = time.time_ns() - 10 * S
            ev = _until(
                lambda: (
                    (e := evidence.read(client.pid, since_ns=since, rendezvous=f"127.0.0.1:{port}")).cause == "socket"
                    and e
                ),
                what="the client in recv",
            )
    assert isinstance(ev, Evidence)
    (sock,) = ev.sockets
    assert sock.proto == "tcp" and sock.remote == f"127.0.0.1:{port}" and sock.state == "ESTABLISHED"
    assert sock.rx_queue == 0 and sock.role == "rendezvous"
    assert ev.main is not None and ev.main.kind == "recv"
    assert ev.sockets_from == "the descriptor it waits on" or ev.main.source == "wchan"
    assert re.search(
        rf"on the rendezvous 127\.0\.0\.1:{port} \(connected, nothing received( to read| for \d+ s)\) for 10 s$",
        ev.text,
    ), ev.text
    assert hints.for_evidence(ev).name == "rendezvous_socket"  # type: ignore[union-attr]
    assert "slow_load_straggler" in hints.contradicted(ev)


def test_a_rank_whose_syn_is_dropped_is_connecting(spawn):
    """A listener with a full accept queue drops new SYNs (no root needed): the client stays in SYN_SENT."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        fillers = []
        try:
            for _ in range(3):
                f = socket.socket()
                f.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    f.connect(("127.0.0.1", port))
                fillers.append(f)
            client = spawn(f"import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))")
            since = time.time_ns() - 9 * S
            ev = _until(
                lambda: (
                    (e := evidence.read(client.pid, since_ns=since)).sockets and e.sockets[0].state == "SYN_SENT" and e
                ),
                what="the client in SYN_SENT",
            )
        finally:
            for f in fillers:
                f.close()
    assert isinstance(ev, Evidence)
    sock = ev.sockets[0]
    assert sock.remote == f"127.0.0.1:{port}" and ev.cause == "socket"
    assert ev.main is not None and ev.main.kind == "connect"
    assert f"127.0.0.1:{port} (connecting (SYN_SENT), no answer yet" in ev.text and re.search(
        r"for (9|10) s$", ev.text
    )  # 9 s and the poll
    shared = evidence.shared_cause({"tp0": ev, "tp1": ev})
    assert shared is not None and shared.alarm and shared.text.startswith("tp0, tp1 wait in `connect` on 127.0.0.1")
    elsewhere = msgspec.structs.replace(ev, cause="native", sockets=[])  # a peer that waits on something else
    assert evidence.shared_cause({"tp0": ev, "tp1": elsewhere}) is None
    assert hints.for_evidence(ev, phases={"model.load_weights"}) is None  # not a hub port, not the rendezvous
    hub = msgspec.structs.replace(ev, sockets=[msgspec.structs.replace(sock, remote="10.0.0.5:443")])
    assert hints.for_evidence(hub).name == "hub_or_proxy_socket"  # type: ignore[union-attr]
    assert hints.for_evidence(ev, phases={"dist.init_process_group"}).name == "rendezvous_phase_socket"  # type: ignore[union-attr]


# -- processes that end, files that cannot be read ----------------------------------------------------------


def test_a_process_that_exits_mid_read_costs_details_not_an_exception(tmp_path, spawn, monkeypatch):
    lock = tmp_path / "x.lock"
    _holder(spawn, lock)
    waiter = spawn(f"import fcntl\nf = open({str(lock)!r}, 'a')\nfcntl.flock(f, fcntl.LOCK_EX)")
    _until(_waiters_listed(1, lock.stat().st_ino), what="the waiter")
    real = evidence.locks.waited_for

    def end_it_first(*args, **kwargs):  # between reading its main thread and its locks, it ends
        waiter.kill()
        waiter.wait(timeout=10)
        return real(*args, **kwargs)

    monkeypatch.setattr(evidence.locks, "waited_for", end_it_first)
    ev = evidence.read(waiter.pid)
    assert ev.gone and ev.cause == "gone" and ev.text == "ended before or while it was read"
    assert ev.main is not None and ev.main.kind == "flock"  # read before it ended: kept
    assert ev.children == [] and ev.sockets == []
    json.dumps(msgspec.to_builtins(ev))  # still a whole record


def test_a_process_already_gone_or_a_zombie_or_another_with_its_pid(spawn):
    done = spawn("pass")
    _until(lambda: evidence.proc.zombie(done.pid), what="a zombie")
    assert evidence.read(done.pid).gone  # ended, not reaped
    done.wait()
    assert evidence.read(done.pid).cause == "gone"  # reaped: nothing at that pid
    alive = spawn("import time; time.sleep(60)")
    ticks = evidence.proc.start_ticks(alive.pid)
    assert ticks is not None and evidence.read(alive.pid, start_ticks=ticks + 1).gone  # a recycled pid


def test_an_unreadable_syscall_file_falls_back_to_the_wait_channel(tmp_path, spawn, monkeypatch):
    lock = tmp_path / "x.lock"
    holder = _holder(spawn, lock)
    waiter = spawn(f"import fcntl\nf = open({str(lock)!r}, 'a')\nfcntl.flock(f, fcntl.LOCK_EX)")
    _until(_waiters_listed(1, lock.stat().st_ino), what="the waiter")
    real_open = open

    def no_syscall(path, *args, **kwargs):  # as for a reader without ptrace access to it
        if str(path).endswith("/syscall"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(evidence.proc, "open", no_syscall, raising=False)
    ev = evidence.read(waiter.pid)
    assert ev.main is not None and ev.main.source == "wchan" and ev.main.kind == "flock", ev.main
    assert any(u.startswith("system call: permission denied") for u in ev.unread)
    assert ev.cause == "lock" and ev.locks[0].holder_pid == holder.pid  # /proc/locks still names both


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to drop to another user")
def test_a_reader_of_another_user_still_names_the_lock_and_its_holder(tmp_path, spawn):
    """``phasetrace status`` run by another user: no descriptors, no system call, no wait channel;
    ``/proc/locks`` and the holder's command line are world-readable."""
    lock = tmp_path / "x.lock"
    holder = _holder(spawn, lock)
    waiter = spawn(f"import fcntl\nf = open({str(lock)!r}, 'a')\nfcntl.flock(f, fcntl.LOCK_EX)")
    _until(_waiters_listed(1, lock.stat().st_ino), what="the waiter")
    code = (
        "import json, msgspec\nfrom sglang_phasetrace.tracing.verdicts import evidence\n"
        f"print(json.dumps(msgspec.to_builtins(evidence.read({waiter.pid}))))"
    )
    argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")
    if done.returncode != 0:
        pytest.skip(f"cannot run the reader as another user here: {done.stderr.strip()[-300:]}")
    ev = evidence.from_builtins(json.loads(done.stdout))
    assert ev is not None and ev.cause == "lock", ev
    (held,) = ev.locks
    assert held.holder_pid == holder.pid and "holder-marker" in (held.holder_cmd or "") and held.path is None
    assert held.inode == lock.stat().st_ino and held.holder_has_it_open is None
    assert (
        f"lock on inode {held.inode} of device {held.device} (no access to its path) held by pid {holder.pid}"
        in ev.text
    )
    assert any("permission denied" in u for u in ev.unread) and ev.main is not None and ev.main.kind == "unknown"


# -- values -------------------------------------------------------------------------------------------------


def test_parse_locks_reads_every_kind_and_nested_waiters():
    text = (
        "1: FLOCK  ADVISORY  WRITE 4242 fe:00:2146865 0 EOF\n"
        "1: -> FLOCK  ADVISORY  WRITE 4243 fe:00:2146865 0 EOF\n"
        "1:  -> FLOCK  ADVISORY  WRITE 4244 fe:00:2146865 0 EOF\n"
        "2: POSIX  ADVISORY  READ 17 00:2e:8 0 EOF\n"
        "3: OFDLCK ADVISORY  WRITE -1 08:01:99 0 100\n"
        "garbage line\n"
    )
    lines = evidence.parse_locks(text)
    assert [(ln.id, ln.waiting, ln.kind, ln.exclusive, ln.pid) for ln in lines] == [
        (1, False, "flock", True, 4242),
        (1, True, "flock", True, 4243),
        (1, True, "flock", True, 4244),
        (2, False, "posix", False, 17),
        (3, False, "ofd", True, -1),
    ]
    assert lines[0].device == "254:0" and lines[0].inode == 2146865 and lines[4].device == "8:1"


def test_evidence_round_trips_and_bounds_what_another_node_sends(tmp_path, spawn):
    lock = tmp_path / "x.lock"
    _holder(spawn, lock)
    waiter = spawn(f"import fcntl\nf = open({str(lock)!r}, 'a')\nfcntl.flock(f, fcntl.LOCK_EX)")
    _until(_waiters_listed(1, lock.stat().st_ino), what="the waiter")
    ev = evidence.read(waiter.pid, since_ns=time.time_ns())
    wire = json.loads(json.dumps(msgspec.to_builtins(ev)))
    assert evidence.from_builtins(wire) == ev
    assert evidence.from_builtins({**wire, "text": "x" * 5000}) is None
    assert evidence.from_builtins({**wire, "pid": -1}) is None
    assert evidence.from_builtins({**wire, "unread": ["u"] * 100}) is None


def test_every_contradicted_hint_is_a_phase_hint():
    names = {p.name for p in hints.HINTS if p.cause is None}
    for cause, contradicted in hints.CONTRADICTS.items():
        assert contradicted <= names, (cause, contradicted - names)
    assert len({h.name for h in hints.HINTS}) == len(hints.HINTS)
    assert all(h.source and h.cause in (None, "lock", "child", "socket") for h in hints.HINTS)


def test_looks_like_build():
    assert evidence.looks_like_build("cc1plus", ["/usr/lib/gcc/cc1plus", "-quiet"]) == "cc1plus (C/C++ compiler)"
    assert evidence.looks_like_build("python3", ["python3", "-m", "sglang.compile_deep_gemm"]) == "DeepGEMM pre-compile"
    assert evidence.looks_like_build("python", ["python", "-m", "torch._inductor.compile_worker"]) is not None
    assert evidence.looks_like_build("ninja", ["ninja", "-v"]) == "ninja (build tool)"
    assert evidence.looks_like_build("python3", ["python3", "train.py"]) is None
