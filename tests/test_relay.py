"""The cross-node channel (``tracing.channel.relay``) against real torch ``TCPStore`` masters in other
processes, standing in for world rank 0's: connect before and after the store exists, agreeing on
the launch identity, publish/read among nodes, the master going away, bad payloads, and a real
2-rank gloo process group forming while a relay client is connected to its store. Whatever another
party writes to the store's keys (it has no authentication) is refused with a reason, never raised."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import typing
import zlib
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from conftest import free_port, kill_group
from sglang_phasetrace.tracing.channel import crossnode
from sglang_phasetrace.tracing.channel.node_snapshot import Launch, Record, Snapshot
from sglang_phasetrace.tracing.channel.relay import DECODE_LIMIT, LAUNCH_KEY, PREFIX, Relay, decode, encode, parse_addr
from sglang_phasetrace.tracing.journal import schema
from sglang_phasetrace.tracing.recorder import launch
from test_bad_records import BAD, VALID, broken, line

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
    assert node.read() == {} and node.agree(Launch("a" * 32), Launch) is None
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
    first = Launch("f" * 32, "job-a")
    assert node1.agree(Launch("b" * 32), Launch) is None  # node 0 has not written it: no waiting
    assert node0.agree(first, Launch) == first
    assert node0.agree(Launch("c" * 32), Launch) == first  # a restarted launcher keeps it
    assert node1.agree(Launch("b" * 32), Launch) == first


BAD_LAUNCH = {
    b'{"trace":"zz"}': "regex",  # every process's exporter would parse it as hex
    b'{"trace":"' + b"0" * 32 + b'"}': "regex",  # OTel's invalid trace id
    b'{"trace":"' + b"a" * 32 + rb'","source":"\u001b]52;c;eA==\u0007"}': "source",
    b'{"trace":"' + b"a" * 32 + b'","launch_id":"' + b"x" * 3000 + b'"}': "launch_id",
    b'{"x":' + b"[" * 1500 + b"]" * 1500 + b',"trace":"' + b"a" * 32 + b'"}': "nested too deep",
    b"[" * 5000: "over the",
    b"\xff": "malformed",
}


@pytest.mark.parametrize("stored", list(BAD_LAUNCH), ids=list(BAD_LAUNCH.values()))
def test_a_malformed_launch_identity_is_said_once_and_every_node_keeps_its_own(
    stored: bytes, master: tuple[int, subprocess.Popen[str]], tmp_path: Path
) -> None:
    """Whoever writes ``phasetrace/launch`` first sets the launch's trace id (the agreement is kept):
    a value that is not one is said once and never reaches a node's launch record or launch.json."""
    port, _ = master
    writer = relay(port, 1, 2)
    assert up(writer)
    writer._store.set(LAUNCH_KEY, stored)  # another party with access to the store, first
    warnings: list[str] = []
    node0 = relay(port, 0, 2, warnings)
    assert up(node0)
    for _ in range(2):
        assert node0.agree(Launch("a" * 32), Launch) is None
    (said,) = warnings
    assert said.startswith(f"sglang-phasetrace: cross-node relay to 127.0.0.1:{port}: the launch identity stored")
    assert BAD_LAUNCH[stored] in said and "\x1b" not in said and len(said) < 400, said
    run = tmp_path / "run"
    run.mkdir()
    cross = crossnode.CrossNode(crossnode.Node(1, 2, f"127.0.0.1:{port}"), run, "1" * 32, 2.0, 10.0)
    written: list[dict] = []
    cross.write = written.append
    assert up(cross.relay)
    cross.pass_once()
    assert cross.agreed is None and written == [] and not (run / crossnode.LAUNCH_FILE).exists()
    cross.relay.close()
    writer.close()


def test_launch_json_is_used_only_when_it_holds_two_trace_ids(tmp_path: Path) -> None:
    good = {"trace": "a" * 32, "local_trace": "b" * 32}
    (tmp_path / crossnode.LAUNCH_FILE).write_text(json.dumps(good))
    assert launch.mapping_of(tmp_path) == good
    for bad in ({"trace": "zz", "local_trace": "b" * 32}, {"trace": "a" * 32}, [1], {"trace": 5, "local_trace": 6}):
        (tmp_path / crossnode.LAUNCH_FILE).write_text(json.dumps(bad))
        assert launch.mapping_of(tmp_path) is None, bad


def test_publish_and_read_among_three_nodes(master: tuple[int, subprocess.Popen[str]]) -> None:
    port, _ = master
    nodes = [relay(port, k, 3) for k in range(3)]
    assert up(*nodes)
    start = time.monotonic()
    assert nodes[0].read() == {}  # nobody published: returns at once, never waits on missing keys
    assert time.monotonic() - start < 1.0
    nodes[2].publish(encode({"node": 2, "seq": 1}))
    got = nodes[0].read()
    assert list(got) == [2] and decode(got[2], dict) == {"node": 2, "seq": 1}
    nodes[1].publish(encode({"node": 1, "seq": 1}))
    nodes[2].publish(encode({"node": 2, "seq": 2}))  # overwrite
    got = nodes[0].read()
    assert {k: decode(v, dict)["seq"] for k, v in got.items()} == {1: 1, 2: 2}
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
    assert decode(encode(snapshot), dict) == snapshot
    cases = {
        b"not zlib at all": "not zlib",
        encode(snapshot)[:-4]: "truncated",
        encode(snapshot) + b"junk": "trailing",
        zlib.compress(b"\xff\xfe{"): "malformed",
        zlib.compress(b"[1, 2]"): "Expected `object`, got `array`",
        zlib.compress(b"{" + b" " * 5000 + b"}"): "limit",  # a bomb: 5 kB inflated from ~30 bytes
    }
    for data, why in cases.items():
        with pytest.raises(ValueError, match=why):
            decode(data, dict, limit=4096)
    with pytest.raises(ValueError, match="over the"):
        decode(b"x" * 100, dict, limit=64)
    with pytest.raises(ValueError, match="expected bytes"):
        decode("text", dict)  # type: ignore[arg-type]


def _snap(**fields: object) -> bytes:
    """A node-1 snapshot of one process, with ``fields`` replacing the envelope's or, for
    ``records``, the process's records."""
    recs = fields.pop("records", [{"kind": "process", "t": 1, "pid": 4242, "host": "h1"}])
    return encode({"v": 1, "node": 1, "seq": 1, "now": 10, "procs": [{"records": recs}], **fields})


HEAD = b'{"v":1,"node":1,"seq":1,"now":10,"procs":'
# What another party may write under phasetrace/node/1: each is refused by the schema with a reason
# (decode raises ValueError, never RecursionError, AttributeError, OverflowError, MemoryError).
MALFORMED = {
    "deep": zlib.compress(HEAD + b"[" * 200_000 + b"]" * 200_000 + b"}", 9),  # ~430 bytes on the wire
    "deep-unknown": zlib.compress(b'{"x":' + b"[" * 200_000 + b"]" * 200_000 + b"," + HEAD[1:] + b"[]}", 9),
    "procs-int": _snap(procs=[1]),
    "records-int": _snap(records=[1]),
    "label": _snap(records=[{"kind": "identity", "t": 1, "label": "x" * 16_000}]),
    "attrs": _snap(records=[{"kind": "identity", "t": 1, "attrs": {str(i): i for i in range(5000)}}]),
    "attr-nested": _snap(records=[{"kind": "identity", "t": 1, "attrs": {"a": {"b": 1}}}]),
    "kind": _snap(records=[{"kind": "\u001b[2J" * 50, "t": 1}]),
    "t-str": _snap(records=[{"kind": "process", "t": "1", "pid": 1}]),
    "t-negative": _snap(records=[{"kind": "process", "t": -1, "pid": 1}]),
    "t-huge": _snap(records=[{"kind": "process", "t": 1 << 80, "pid": 1}]),
    "pid-bool": _snap(records=[{"kind": "process", "t": 1, "pid": True}]),
    "pid-zero": _snap(records=[{"kind": "process", "t": 1, "pid": 0}]),
    "since-inf": zlib.compress(
        HEAD + b'[{"records":[{"kind":"heartbeat","t":1,"seq":1,"phases":[{"since_s":1e400}]}]}]}'
    ),
    "since-huge": _snap(records=[{"kind": "heartbeat", "t": 1, "seq": 1, "phases": [{"since_s": 1e308}]}]),
    "nan": zlib.compress(HEAD + b'[{"records":[{"kind":"heartbeat","t":1,"seq":1,"cpu_s":NaN}]}]}'),
    "span-id": _snap(records=[{"kind": "begin", "t": 1, "span": "zz", "name": "x"}]),
    "ended": zlib.compress(HEAD + b'[{"records":[],"ended":{"attention.init":["1",-5]}}]}'),
    "version": _snap(v=2),
    "node-range": _snap(node=-1),
    "now-float": _snap(now=1.5),
    "not-object": zlib.compress(b'"snapshot"'),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_decode_refuses_a_snapshot_the_schema_does_not_allow(name: str) -> None:
    data = MALFORMED[name]
    with pytest.raises(ValueError) as caught:
        decode(data, Snapshot)
    why = str(caught.value)
    assert why and len(why) <= 200 and all(c.isprintable() for c in why), why
    if name == "deep":
        assert len(data) < 500, len(data)


def test_decode_keeps_a_snapshot_the_schema_allows_and_skips_fields_it_does_not_know() -> None:
    data = _snap(records=[{"kind": "process", "t": 1, "pid": 4242, "host": "h1", "newer_field": {"a": [1]}}])
    snap = decode(data, Snapshot)
    assert snap.node == 1 and snap.procs[0].records[0].pid == 4242
    assert msgspec.to_builtins(snap.procs[0].records) == [{"kind": "process", "t": 1, "pid": 4242, "host": "h1"}]


SENT = {cls.__struct_config__.tag: cls for cls in typing.get_args(Record)}  # the kinds a snapshot holds


@pytest.mark.parametrize("kind", sorted(SENT))
def test_the_snapshot_schema_hands_on_no_record_the_journal_refuses(kind: str) -> None:
    """On the journal's corpus of bad records: what the schema takes passes ``schema.validate``
    (readers rely on it), and a breakage in a field the schema keeps is refused."""

    def taken(record: dict) -> dict | None:
        try:
            return msgspec.to_builtins(msgspec.json.decode(line(record).encode(), type=Record))
        except (msgspec.DecodeError, RecursionError):
            return None

    assert schema.validate(taken(VALID[kind])) is None
    kept = {"kind", "t", *(f.encode_name for f in msgspec.structs.fields(SENT[kind]))}
    for bad, (name, _) in zip(broken(kind), BAD[kind], strict=True):
        got = taken(bad)
        assert got is None or schema.validate(got) is None, (kind, name, got)
        assert got is None or name not in kept, (kind, name, got)


def test_the_largest_payload_allowed_decodes_in_well_under_a_second() -> None:
    big = encode({"v": 1, "node": 1, "seq": 1, "now": 1, "procs": [], "x": "a" * (DECODE_LIMIT - 100)})
    start = time.monotonic()
    assert decode(big, Snapshot).procs == []
    assert time.monotonic() - start < 1.0


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
        launch = Launch("e" * 32, "x")
        assert node0.agree(launch, Launch) == launch and node1.agree(Launch("1" * 32), Launch) == launch
        node1.publish(encode({"node": 1}))
        assert decode(node0.read()[1], dict) == {"node": 1}
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
