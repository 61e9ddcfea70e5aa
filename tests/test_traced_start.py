"""Acceptance on real SGLang (CPU, tiny local model): what a traced start leaves behind.

Every run here is an unmodified SGLang entry point (``scripts/start_engine.py`` → ``sglang.Engine``,
or ``python -m sglang.launch_server``) started with only ``PYTHONPATH`` pointing at
``sitecustomize_hooks/`` (plus OTEL_* variables where export is under test). Nothing is stood in
for: the journals are read back with ``tracing.reader.load.load_run``, the OTLP receivers decode the
wire format with the official ``opentelemetry-proto`` messages.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import (
    HOOKS,
    OVERLAYS,
    SCRIPTS,
    Ran,
    free_port,
    hook_env,
    kill_group,
    requires_sglang,
    run_dirs,
    run_program,
)
from coverage_resolver import Sources, table_phases, wrapped
from otlp_receiver import OtlpReceiver
from sglang_phasetrace.tracing.reader.load import load_run
from sglang_phasetrace.tracing.reader.view import ProcessRec, RunView, SpanRec

pytestmark = [requires_sglang, pytest.mark.sglang]

START_ENGINE = str(SCRIPTS / "start_engine.py")
EAGLE_ERROR = "EAGLE is not supported in decode attention backend torch_native"
WARNING_PREFIX = "sglang-phasetrace:"
KERNEL_WARMUP = "sglang.srt.model_executor.model_runner:ModelRunner.kernel_warmup"


# -- reading a run -------------------------------------------------------------------------------
def all_spans(run: RunView) -> list[tuple[ProcessRec, SpanRec]]:
    return [(p, s) for p in run.processes for s in p.spans.values()]


def phases(proc: ProcessRec, phase: str) -> list[SpanRec]:
    return [s for s in proc.spans.values() if s.phase == phase]


def one(proc: ProcessRec, phase: str) -> SpanRec:
    found = phases(proc, phase)
    assert len(found) == 1, f"{proc.label}: {len(found)} {phase!r} spans"
    return found[0]


def launcher_of(run: RunView) -> ProcessRec:
    (launcher,) = [p for p in run.processes if p.role == "launcher"]
    return launcher


def ranks_of(run: RunView, count: int) -> list[ProcessRec]:
    ranks = sorted(run.ranks, key=lambda p: p.identity.get("sglang.tp_rank", -1))
    assert [p.identity.get("sglang.tp_rank") for p in ranks] == list(range(count)), [p.label for p in ranks]
    return ranks


def is_under(span: SpanRec, ancestor: SpanRec, by_id: dict[str, SpanRec]) -> bool:
    while span.parent_id is not None:
        if span.parent_id == ancestor.span_id:
            return True
        span = by_id[span.parent_id]
    return False


def check_tree(run: RunView) -> dict[str, SpanRec]:
    """One trace across all processes, unique span ids, every parent in the run, the launcher's
    root the only root, children inside their parents' time ranges (where both ended)."""
    spans = all_spans(run)
    counts = collections.Counter(s.span_id for _, s in spans)
    assert not [i for i, n in counts.items() if n > 1], "span ids repeat across processes"
    by_id = {s.span_id: s for _, s in spans}
    assert len({s.trace_id for _, s in spans}) == 1, "one trace id for the whole launch"
    roots = [s for _, s in spans if s.parent_id is None]
    assert [r.name for r in roots] == ["sglang.launch"]
    for proc, span in spans:
        if span.parent_id is None:
            continue
        parent = by_id.get(span.parent_id)
        assert parent is not None, f"{proc.label}: {span.name} has a parent outside the run"
        assert span.start >= parent.start, f"{proc.label}: {span.name} starts before {parent.name}"
        if span.end is not None and parent.end is not None:
            assert span.end <= parent.end, f"{proc.label}: {span.name} ends after {parent.name}"
    return by_id


def check_launcher(run: RunView, launch_phase: str, status: str = "ok") -> tuple[ProcessRec, SpanRec]:
    launcher = launcher_of(run)
    root = launcher.root
    assert root is not None and root.name == "sglang.launch" and root.phase == launch_phase
    assert root.status == status, root.error
    assert root.attrs["sglang.tp_size"] == 2
    by_id = {s.span_id: s for _, s in all_spans(run)}
    for phase in ("launch.subprocesses", "launch.wait_ranks"):
        span = one(launcher, phase)
        assert span.status == status and is_under(span, root, by_id)
    return launcher, root


def check_rank_ready(proc: ProcessRec, tp: int) -> SpanRec:
    root = proc.root
    assert root is not None and root.phase == "rank"
    assert re.fullmatch(rf"rank tp{tp} pp0 ep0 @ {re.escape(proc.host)}:{proc.pid}", root.name), root.name
    assert root.status == "ok", root.error
    assert proc.label == f"tp{tp}" and proc.resource["sglang.tp_rank"] == tp
    return root


def check_rank_phases(proc: ProcessRec, tp: int) -> None:
    """Process group, model-parallel groups, weights, KV pool, attention, graphs: all ended ok,
    all inside the rank root."""
    root = proc.root
    by_id = dict(proc.spans)
    for span in proc.spans.values():
        assert span is root or is_under(span, root, by_id), f"{span.name} outside the rank root"

    pg = one(proc, "dist.init_process_group")
    assert pg.status == "ok" and pg.attrs["sglang.backend"] == "gloo"
    assert proc.identity["sglang.world_rank"] == tp and proc.identity["sglang.world_size"] == 2

    groups = one(proc, "dist.model_parallel_groups")
    assert groups.status == "ok" and groups.attrs["sglang.tp_size"] == 2
    coordinators = phases(proc, "dist.group_coordinator")
    assert coordinators and all(s.status == "ok" for s in coordinators)
    names = {s.attrs["sglang.group_name"] for s in coordinators}
    assert {"world", "tp", "pp"} <= names, names
    (tp_group,) = [s for s in coordinators if s.attrs["sglang.group_name"] == "tp"]
    assert is_under(tp_group, groups, by_id)
    assert tp_group.attrs["sglang.group_size"] == 2 and tp_group.attrs["sglang.rank_in_group"] == tp

    weights = one(proc, "model.load_weights")
    assert weights.status == "ok" and weights.attrs["sglang.model_class"] == "LlamaForCausalLM"
    assert weights.attrs["sglang.is_draft"] is False
    iterator = one(proc, "model.weights_iterator")
    assert iterator.status == "ok" and is_under(iterator, weights, by_id)
    assert iterator.attrs["sglang.shards"] == 1 and iterator.attrs["sglang.tensors"] > 0
    (loaded,) = [e for e in iterator.events if e["name"] == "shard_loaded"]
    assert loaded["attrs"] == {
        "shard": "model.safetensors",
        "done": 1,
        "total": 1,
        "tensors": iterator.attrs["sglang.tensors"],
    }

    kv = one(proc, "kv_cache.alloc")
    assert kv.status == "ok" and kv.attrs["sglang.max_total_num_tokens"] == 4096
    assert kv.attrs["sglang.kv_pool"] and kv.attrs["sglang.is_draft"] is False

    attention = one(proc, "attention.init")
    assert attention.status == "ok" and attention.attrs["sglang.attention_backend"]

    graphs = one(proc, "graph.init")  # on CPU: no capture, but the phase runs
    assert graphs.status == "ok"


def check_delivery(run: RunView, receiver: OtlpReceiver, timeout: float = 30) -> None:
    """The receiver got every span the journals show as ended: same ids, names, parents, trace,
    with the process's resource (service.name, role, pid, and tp_rank on ranks)."""
    ended = {s.span_id: (p, s) for p, s in all_spans(run) if s.end is not None}
    missing = receiver.wait_for_spans(set(ended), timeout)
    assert not missing, sorted(f"{ended[i][0].label}:{ended[i][1].name}" for i in missing)
    got = receiver.by_id()
    (trace,) = {s.trace_id for _, s in all_spans(run)}
    assert {s.trace_id for s in receiver.spans} == {trace}
    for span_id, (proc, span) in ended.items():
        r = got[span_id]
        assert (r.name, r.parent_id, r.trace_id) == (span.name, span.parent_id, span.trace_id)
        assert r.attrs.get("sglang.phase") == span.phase
        expected = {2} if span.status in ("error", "incomplete") else {0, 1}  # ERROR; else UNSET or OK
        assert r.status in expected, (span.name, span.status, r.status)
        assert r.resource["service.name"] == "sglang"
        assert r.resource["sglang.role"] == proc.role and r.resource["process.pid"] == proc.pid
        assert r.resource["phasetrace.run_id"] == run.run_id
        if proc.role == "rank":
            assert r.resource["sglang.tp_rank"] == proc.identity["sglang.tp_rank"]


def phasetrace_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if WARNING_PREFIX in line]


# -- Engine, tp=2 (the shared engine_run; and the same start on each older release installed) -----
def test_engine_tp2_launcher_spans(live_run):
    run = load_run(live_run.run_dir)
    assert run.problems == []
    check_launcher(run, "launch.engine")


def test_engine_tp2_every_rank_traces_its_init_and_is_ready(live_run):
    run = load_run(live_run.run_dir)
    for tp, proc in enumerate(ranks_of(run, 2)):
        check_rank_ready(proc, tp)
        check_rank_phases(proc, tp)


def test_engine_tp2_one_trace_nested_correctly(live_run):
    run = load_run(live_run.run_dir)
    by_id = check_tree(run)
    launch = launcher_of(run).root
    for proc in run.ranks:  # ranks join the launcher's trace under its root
        assert by_id[proc.root.parent_id] is launch


def test_engine_tp2_clean_start_has_no_tracer_warnings(live_run):
    """Also on a release that lacks some phases (0.5.9 has no ``Scheduler.init_memory_pools``):
    a phase the release does not have is absent from its trace, not a warning."""
    run = load_run(live_run.run_dir)
    assert [w for p in run.processes for w in p.warnings] == []
    assert phasetrace_lines(live_run.stderr) == []
    # the late-apply alias sweep once read every module attribute's __class__, which made torch
    # print this deprecation warning in every traced process (SGLang alone does not)
    assert "torch.distributed.reduce_op" not in live_run.stderr
    assert len(run_dirs(live_run.run_dir.parent)) == 1, "one launch, one run directory"


def test_engine_tp2_traces_the_phases_of_the_newest_release_that_this_one_has(live_run, engine_run, request):
    """What ran is what the coverage table says: every phase seen on the installed (newest)
    release is seen here too when this release's sources have a target for it, and no phase is
    seen that the table says this release lacks."""
    release = request.node.callspec.params["live_run"]
    root = OVERLAYS[release] if release in OVERLAYS else Path(importlib.util.find_spec("sglang").origin).parents[1]
    sources = Sources.directory(root)
    covered = {p.name for p in table_phases() if wrapped(p, sources.resolves)}
    listed = {p.name for p in table_phases()}

    def seen(ran: Ran) -> set[str]:
        return {s.phase for _, s in all_spans(load_run(ran.run_dir))} & listed

    assert seen(live_run) <= covered, seen(live_run) - covered
    cuda_only = {"graph.warmup"} if sources.resolves(KERNEL_WARMUP) else set()  # ≤0.5.13: called on CUDA only
    assert seen(engine_run) & covered - cuda_only <= seen(live_run), seen(engine_run) & covered - seen(live_run)


# -- OTLP export ---------------------------------------------------------------------------------
def test_engine_tp2_delivers_the_trace_over_otlp_grpc(tiny_model, tmp_path):
    with OtlpReceiver("grpc") as receiver:
        ran = run_program(
            [START_ENGINE, str(tiny_model[0]), "--tp", "2", "--no-generate"],
            tmp_path,
            env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
        )
        assert ran.returncode == 0, ran.stderr[-4000:]
        run = load_run(ran.run_dir)
        assert run.problems == []
        check_launcher(run, "launch.engine")
        for tp, proc in enumerate(ranks_of(run, 2)):
            check_rank_ready(proc, tp)
        check_tree(run)
        check_delivery(run, receiver)
    assert phasetrace_lines(ran.stderr) == []


def post_generate(port: int, api_key: str) -> dict | None:
    body = json.dumps({"text": "Hello", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/generate",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read()) if response.status == 200 else None
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return None


def test_launch_server_delivers_the_trace_over_otlp_http(tiny_model, tmp_path):
    """``python -m sglang.launch_server`` (tp=2, with an --api-key), OTLP over HTTP: ready when it
    answers /generate, then SIGTERM. The launch root ends ok at "ready to roll", the receiver got
    every ended span, and the API key is nowhere in the journals or the exported spans."""
    api_key = "phasetrace-test-" + os.urandom(8).hex()
    port = free_port()
    out, err = tmp_path / "server.out", tmp_path / "server.err"
    with OtlpReceiver("http/protobuf") as receiver, open(out, "w") as stdout, open(err, "w") as stderr:
        env = hook_env(
            tmp_path, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
        )
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sglang.launch_server",
                "--model-path",
                str(tiny_model[0]),
                "--device",
                "cpu",
                "--tp-size",
                "2",
                "--max-total-tokens",
                "4096",
                "--port",
                str(port),
                "--api-key",
                api_key,
            ],
            env=env,
            cwd=tmp_path,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        try:
            answer, deadline = None, time.monotonic() + 240
            while answer is None and server.poll() is None and time.monotonic() < deadline:
                answer = post_generate(port, api_key)
                if answer is None:
                    time.sleep(1)
            assert answer is not None and answer["meta_info"]["completion_tokens"] == 2, err.read_text()[-4000:]
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
        finally:
            kill_group(server.pid)
            server.wait(timeout=30)
        (run_dir,) = run_dirs(tmp_path)
        run = load_run(run_dir)
        assert run.problems == []
        launcher, root = check_launcher(run, "launch.server")
        ready = one(launcher, "server.wait_ready")
        assert ready.status == "ok" and ready.attrs["sglang.server_ready"] is True
        assert ready.parent_id == root.span_id and ready.end <= root.end
        for tp, proc in enumerate(ranks_of(run, 2)):
            check_rank_ready(proc, tp)
            check_rank_phases(proc, tp)
        check_tree(run)
        check_delivery(run, receiver)
        exported = repr(receiver.spans)

    assert json.loads(root.attrs["sglang.server_args"])["api_key"] == "[REDACTED]"
    for journal in (run_dir / "journal").iterdir():
        assert api_key not in journal.read_text(), journal
    assert api_key not in exported
    assert [w for p in run.processes for w in p.warnings] == []
    assert phasetrace_lines(err.read_text()) == []


# -- a failing start: EAGLE on CPU ---------------------------------------------------------------
def test_eagle_on_cpu_fails_in_draft_attention_and_the_journal_says_where(tiny_model, tmp_path):
    """SGLang stops with its own error on CPU; every rank's journal shows the draft init up to the
    failure, the raising rank's failing phase carries the error. SGLang's SIGQUIT handler SIGKILLs
    the tree: the launcher's last words name the failed rank and the root cause first; its phases
    stay begun-not-ended. The other rank is SIGKILLed mid-phase, so for it only begins are asserted."""
    model, draft = tiny_model
    ran = run_program([START_ENGINE, str(model), "--tp", "2", "--draft", str(draft), "--no-generate"], tmp_path)
    assert ran.returncode != 0
    assert EAGLE_ERROR in ran.stderr
    run = load_run(ran.run_dir)
    assert run.problems == [], "nothing lost or torn"
    check_tree(run)

    ranks = ranks_of(run, 2)
    for proc in ranks:
        for phase in (
            "eagle.draft_worker_init",
            "eagle.get_embed_and_head",
            "eagle.set_embed_and_head",
            "eagle.init_lm_head",
        ):
            assert phases(proc, phase), f"{proc.label}: no {phase} begin"
        loads = {
            s.attrs["sglang.is_draft"]: s.attrs.get("sglang.model_class") for s in phases(proc, "model.load_weights")
        }
        assert loads == {False: "LlamaForCausalLM", True: "LlamaForCausalLMEagle"}

    # Both ranks usually raise; the first SIGQUITs the launcher, which SIGKILLs the process tree,
    # so the other may die while its exception is still unwinding through the outer phases.
    raised = [p for p in ranks if any(s.end is not None for s in phases(p, "eagle.draft_attention_init"))]
    assert raised, "the rank that raised records the failing phase"
    for proc in raised:
        (failing,) = phases(proc, "eagle.draft_attention_init")
        assert failing.status == "error"
        assert failing.error["type"] == "ValueError" and failing.error["message"] == EAGLE_ERROR
    first = [p for p in ranks if p.root.end is not None]
    assert first, "the rank whose failure stopped the launch ended its rank root"
    for proc in first:
        assert proc.root.status == "error" and proc.root.error["message"] == EAGLE_ERROR
        assert proc.open_spans == [], "the exception unwound through every phase: all ended"
        assert {s.phase for s in proc.spans.values() if s.status == "error"} == {
            "rank",
            "scheduler.init_attention_backends",
            "eagle.draft_attention_init",
        }

    launcher = launcher_of(run)
    assert launcher.root.name == "sglang.launch"
    managers = ("tokenizer_manager.init", "template_manager.init")  # its own init, done before the failure
    assert {s.status for s in launcher.spans.values() if s.phase not in managers} == {
        "open"
    }  # SIGKILLed by SGLang's own teardown
    assert {s.phase for s in launcher.spans.values()} >= {"launch.engine", "launch.subprocesses", "launch.wait_ranks"}
    ours = phasetrace_lines(ran.stderr)
    assert any(line.startswith("sglang-phasetrace: FAILED rank tp") and EAGLE_ERROR in line for line in ours), ours
    assert any("ROOT CAUSE rank tp" in line for line in ours), ours


# -- a renamed target ----------------------------------------------------------------------------
RENAMED = "sglang.srt.model_executor.model_runner:ModelRunner.alloc_memory_pool_renamed"


def test_renamed_target_is_one_warning_and_sglang_still_starts(tiny_model, tmp_path):
    """Simulates "SGLang renamed the method": a site's own sitecustomize (chained after ours, on
    PYTHONPATH after the hooks dir) replaces kv_cache.alloc's candidates with a name that does not
    exist, before SGLang is imported, in every process."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        textwrap.dedent(f"""
        import dataclasses
        import sglang_phasetrace.patches as patches

        patches.PHASES = tuple(dataclasses.replace(p, targets=({RENAMED!r},)) if p.name == "kv_cache.alloc" else p
                               for p in patches.PHASES)
    """)
    )
    ran = run_program(
        [START_ENGINE, str(tiny_model[0]), "--tp", "1"],
        tmp_path,
        env={"PYTHONPATH": os.pathsep.join([str(HOOKS), str(site)]), "SGLANG_CPU_OMP_THREADS_BIND": "0"},
    )

    assert ran.returncode == 0, ran.stderr[-4000:]
    assert "engine ready" in ran.stdout and "generated 4 tokens" in ran.stdout
    (line,) = phasetrace_lines(ran.stderr)
    assert "'kv_cache.alloc'" in line and RENAMED in line
    run = load_run(ran.run_dir)
    (rank,) = ranks_of(run, 1)
    assert len(rank.warnings) == 1 and "'kv_cache.alloc'" in rank.warnings[0] and RENAMED in rank.warnings[0]
    assert [w for p in run.processes if p is not rank for w in p.warnings] == []
    assert phases(rank, "kv_cache.alloc") == []
    assert one(rank, "scheduler.init_memory_pools").status == "ok"  # the rest is still traced
    check_rank_ready(rank, 0)
    check_tree(run)
