"""The cross-node channel (``tracing.relay``) against real torch ``TCPStore`` masters in other
processes, standing in for world rank 0's: connect before and after the store exists, agreeing on
the launch identity, publish/read among nodes, the master going away, bad payloads, and a real
2-rank gloo process group forming while a relay client is connected to its store."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import zlib
from collections.abc import Iterator

import pytest
from conftest import free_port, kill_group
from sglang_phasetrace.tracing.relay import PREFIX, Relay, decode, encode, parse_addr

pytestmark = pytest.mark.timeout(120)

MASTER = textwrap.dedent(
    """
    import sys, time
    from torch.distributed import TCPStore
    store = TCPStore("127.0.0.1", int(sys.argv[1]), None, True, wait_for_workers=False)
    print("up", flush=True)
    time.sleep(600)
    """
)
RANK = textwrap.dedent(
    """
    import sys, time, datetime
    import torch, torch.distributed as dist
    rdzv = sys.modules["torch.distributed.rendezvous"]  # the package attribute is a function
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    create = rdzv._create_c10d_store

    def created(*args, **kwargs):  # rank 0's master returns once world_size workers were counted
        store = create(*args, **kwargs)
        print("store", time.time(), flush=True)
        return store

    rdzv._create_c10d_store = created
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )
    print("joined", time.time(), flush=True)
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t)
    dist.barrier()
    print("sum", t.item(), flush=True)
    dist.destroy_process_group()
    """
)


def spawn(code: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[str]) -> None:
    kill_group(proc.pid)
    proc.wait(timeout=10)
    if proc.stdout:
        proc.stdout.close()


@pytest.fixture
def master() -> Iterator[tuple[int, subprocess.Popen[str]]]:
    port = free_port()
    proc = spawn(MASTER, port)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        yield port, proc
    finally:
        stop(proc)


def relay(port: int, node: int, nnodes: int, warnings: list[str] | None = None) -> Relay:
    return Relay(f"127.0.0.1:{port}", node, nnodes, timeout_s=2.0, warn=None if warnings is None else warnings.append)


def up(*nodes: Relay) -> bool:
    """Connect each: torch's client now and then needs a second attempt against a live store."""
    return all(any(node.connect() for _ in range(3)) for node in nodes)


def test_parse_addr() -> None:
    assert parse_addr("10.0.0.1:5000") == ("10.0.0.1", 5000)
    assert parse_addr("tcp://node0.cluster:29500") == ("node0.cluster", 29500)
    assert parse_addr("[fe80::1]:29500") == ("fe80::1", 29500)
    assert parse_addr("tcp://[::1]:1/") == ("::1", 1)
    bad_ones = ("", "host", "host:", ":5000", "host:0", "host:70000", "host:port", "fe80::1:5000", "[::1]5000", "a b:1")
    for bad in bad_ones:
        assert parse_addr(bad) is None, bad


def test_connect_before_the_store_exists_is_quiet_then_connects() -> None:
    port, warnings = free_port(), []
    node = relay(port, 1, 2, warnings)
    start = time.monotonic()
    assert node.connect() is False and not node.connected
    assert time.monotonic() - start < 1.5  # refused at once, not TCPStore's retry loop
    node.publish(b"x")  # no-ops while disconnected
    assert node.read() == {} and node.agree({"id": "a"}) is None
    proc = spawn(MASTER, port)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        assert up(node) and node.connected
        assert node.connect() is True  # idempotent
    finally:
        stop(proc)
    assert warnings == []


def test_agree_first_value_wins_and_other_nodes_see_it(master: tuple[int, subprocess.Popen[str]]) -> None:
    port, _ = master
    node0, node1 = relay(port, 0, 2), relay(port, 1, 2)
    assert up(node0, node1)
    assert node1.agree({"launch": "b"}) is None  # node 0 has not written it: no waiting
    assert node0.agree({"launch": "a", "trace": "f" * 32}) == {"launch": "a", "trace": "f" * 32}
    assert node0.agree({"launch": "c"}) == {"launch": "a", "trace": "f" * 32}  # a restarted launcher keeps it
    assert node1.agree({"launch": "b"}) == {"launch": "a", "trace": "f" * 32}


def test_publish_and_read_among_three_nodes(master: tuple[int, subprocess.Popen[str]]) -> None:
    port, _ = master
    nodes = [relay(port, k, 3) for k in range(3)]
    assert up(*nodes)
    start = time.monotonic()
    assert nodes[0].read() == {}  # nobody published: returns at once, never waits on missing keys
    assert time.monotonic() - start < 1.0
    nodes[2].publish(encode({"node": 2, "seq": 1}))
    got = nodes[0].read()
    assert list(got) == [2] and decode(got[2]) == {"node": 2, "seq": 1}
    nodes[1].publish(encode({"node": 1, "seq": 1}))
    nodes[2].publish(encode({"node": 2, "seq": 2}))  # overwrite
    got = nodes[0].read()
    assert {k: decode(v)["seq"] for k, v in got.items()} == {1: 1, 2: 2}
    nodes[0].publish(encode({"node": 0}))
    assert sorted(nodes[1].read()) == [0, 2]  # every node may read; never its own key


def test_master_gone_disconnects_warns_once_and_reconnects(master: tuple[int, subprocess.Popen[str]]) -> None:
    port, proc = master
    warnings: list[str] = []
    node0, node1 = relay(port, 0, 2, warnings), relay(port, 1, 2)
    assert up(node0, node1)
    node1.publish(encode({"seq": 1}))
    assert 1 in node0.read()
    kill_group(proc.pid)
    proc.wait(timeout=10)
    start = time.monotonic()
    for _ in range(3):  # the first op that notices drops the connection; later ones are no-ops
        assert node0.read() == {}
        node0.publish(b"x")
    assert time.monotonic() - start < 5.0
    assert not node0.connected
    assert node0.connect() is False  # nothing listens any more: quiet
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"sglang-phasetrace: cross-node relay to 127.0.0.1:{port}: ")
    assert "Traceback" not in warnings[0] and "frame #" not in warnings[0]
    # A new store at the same address (a relaunch): connect again, same problem not warned twice.
    again = spawn(MASTER, port)
    try:
        assert again.stdout is not None and again.stdout.readline().strip() == "up"
        assert up(node0) and node0.read() == {}
    finally:
        stop(again)
    assert node0.read() == {} and len(warnings) == 1


def test_decode_rejects_garbage_and_oversized_data() -> None:
    snapshot = {"v": 1, "node": 3, "procs": [[{"kind": "process", "pid": 1}]]}
    assert decode(encode(snapshot)) == snapshot
    cases = {
        b"not zlib at all": "not zlib",
        encode(snapshot)[:-4]: "truncated",
        encode(snapshot) + b"junk": "trailing",
        zlib.compress(b"\xff\xfe{"): "not JSON",
        zlib.compress(b"[1, 2]"): "not a JSON object",
        zlib.compress(b"{" + b" " * 5000 + b"}"): "limit",  # a bomb: 5 kB inflated from ~30 bytes
    }
    for data, why in cases.items():
        with pytest.raises(ValueError, match=why):
            decode(data, limit=4096)
    with pytest.raises(ValueError, match="over the"):
        decode(b"x" * 100, limit=64)
    with pytest.raises(ValueError, match="expected bytes"):
        decode("text")  # type: ignore[arg-type]


def test_a_real_process_group_forms_while_relays_use_its_store() -> None:
    """The relay's client never counts as a worker: rank 0 still waits for rank 1 (it would return
    from ``init_process_group`` early if our connections were counted), then the group forms and a
    barrier and an all-reduce work, with our keys beside the group's."""
    port = free_port()
    rank0 = spawn(RANK, 0, port)
    rank1 = None
    try:
        node0, node1 = relay(port, 0, 2), relay(port, 1, 2)
        deadline = time.monotonic() + 60
        while not up(node0, node1):
            assert time.monotonic() < deadline, "rank 0 never created the store"
            time.sleep(0.2)
        assert node0.agree({"launch": "x"}) == {"launch": "x"} and node1.agree({}) == {"launch": "x"}
        node1.publish(encode({"node": 1}))
        assert decode(node0.read()[1]) == {"node": 1}
        time.sleep(1.0)
        assert rank0.poll() is None  # still waiting for rank 1: our two clients were not counted
        rank1_started = time.time()
        rank1 = spawn(RANK, 1, port)
        outs = {}
        for rank, proc in ((0, rank0), (1, rank1)):
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0, (rank, out)
            outs[rank] = dict(line.split(" ", 1) for line in out.splitlines())
        assert float(outs[0]["store"]) >= rank1_started  # the master counted rank 1, not us
        assert outs[0]["sum"] == outs[1]["sum"] == "3.0"
        assert PREFIX.endswith("/")
    finally:
        for proc in (rank0, rank1):
            if proc is not None:
                stop(proc)
