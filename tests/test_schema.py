"""One schema, one set of names: what the writers write is what ``schema`` defines, and the phase
names readers test (``keys``) are the ones ``patches/`` gives its root and ready phases."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from sglang_phasetrace.patches import MODEL_PHASES, PHASES
from sglang_phasetrace.tracing import keys
from sglang_phasetrace.tracing.journal import schema
from sglang_phasetrace.tracing.recorder import collective_log, heartbeat, runtime, spans
from sglang_phasetrace.tracing.verdicts.diagnose import Finding
from sglang_phasetrace.tracing.verdicts.watchdog import Watchdog

ROOT_KINDS, READY_KINDS = {"rank", "launch"}, {"ready"}


def test_every_root_and_ready_phase_is_named_in_keys() -> None:
    """A new entry point (a ``launch`` phase) or ready phase must be added to ``keys``, or readers
    would never see that process ready (``rundir.ProcessRec.root``, ``phasetrace run``)."""
    phases = (*PHASES, *MODEL_PHASES)
    roots = {p.name for p in phases if p.kind in ROOT_KINDS}
    ready = {p.name for p in phases if p.kind in READY_KINDS}
    # ``process``: the root a helper starts when it is spawned (``phases.adopt``), not a patch
    assert roots | {keys.PHASE_PROCESS} == keys.ROOT_PHASES, "patches' root phases and keys.ROOT_PHASES differ"
    assert ready == keys.READY_PHASES, "patches' ready phases and keys.READY_PHASES differ"


def _fields(kind: str) -> frozenset[str]:
    return schema.FIELDS[kind]  # what readers keep (``schema.trim``)


def test_every_record_the_writers_write_is_in_the_schema(trace_run_dir: Path) -> None:
    """Records from the real writers (runtime, spans, collectives, heartbeat, watchdog): each one
    valid, each field one of its kind's ``schema`` Struct (a field a writer adds must be added there)."""
    root = spans.start_phase("rank tp0", {keys.PHASE: keys.PHASE_RANK}, root=True)
    rt = runtime.current()
    rt.set_identity(role="rank", tp=0)
    phase = spans.start_phase("model.load_weights", {keys.PHASE: "model.load_weights"})
    phase.event("shard_loaded", {"done": 1, "total": 2})
    phase.progress(done=1, total=2, unit="shards")
    entry = collective_log.enter("barrier", "tp:0[0,1]")
    beat = heartbeat.current()
    beat.beat()
    collective_log.exit(entry)
    rt.warn("a warning")
    phase.end(ValueError("bad shard"))
    written: list[dict] = []
    dog = Watchdog(trace_run_dir, out=io.StringIO(), record=written.append, py_spy=False)
    dog.act(Finding("died", "tp1", 999_999, "dist.init", 1.0, "rank tp1 (pid 999999) died"))
    root.end()

    lines = [json.loads(line) for path in (trace_run_dir / "journal").glob("*.jsonl") for line in path.open()]
    status = json.loads(beat.status_path.read_text())
    for record in [*lines, status, *written]:
        assert schema.validate(record) is None, record
        assert set(record) <= _fields(record["kind"]), (record["kind"], set(record) - _fields(record["kind"]))
    kinds = {r["kind"] for r in [*lines, *written]}
    assert kinds >= {"process", "identity", "begin", "event", "end", "collective", "heartbeat", "warning", "diagnosis"}
    assert {"dt_s", "main", "majflt", "io_b", "child_cpu_s"} <= set(status)  # activity figures: in the schema


@pytest.mark.sglang
def test_a_real_start_writes_only_schema_records(engine_run) -> None:
    """The shared tp=2 start: every line of every journal and status file (launcher, ranks, helper
    processes) is a valid record whose fields the schema lists."""
    lines = [
        json.loads(line)
        for path in (engine_run.run_dir / "journal").glob("*.jsonl")
        for line in path.read_text().splitlines()
    ]
    lines += [json.loads(path.read_text()) for path in (engine_run.run_dir / "status").glob("*.json")]
    assert len({r["kind"] for r in lines}) >= 6
    for record in lines:
        assert schema.validate(record) is None, record
        assert set(record) <= _fields(record["kind"]), (record["kind"], set(record) - _fields(record["kind"]))
