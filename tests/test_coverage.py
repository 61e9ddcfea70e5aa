"""Coverage across releases, on the real published wheels of SGLang 0.4.0 … 0.5.23 (35 of them).

The wheels are downloaded once with ``pip download --no-deps`` and cached (scripts/coverage.py);
they are read as source, never installed. The static resolution is checked three ways: the
committed docs/coverage.md is what it gives; it agrees with the reference init map (transcribed
below); and on the releases installed here, ``phasetrace doctor`` (which imports SGLang) gives the
same row.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import OVERLAYS, SCRIPTS, requires_sglang
from coverage_resolver import RELEASES, Sources, letter, table_phases
from sglang_phasetrace.patches import PatchEngine, Phase, scheduler
from sglang_phasetrace.patches.engine import USED
from sglang_phasetrace.patches.spec import Call

SCHED = "sglang.srt.managers.scheduler"
MR = "sglang.srt.model_executor.model_runner"
ME = "sglang.srt.model_executor"
SP = "sglang.srt.speculative"


# -- the static resolver follows the engine's rules (checked against the engine, on real imports) --
SYNTHETIC = {
    "pkg/__init__.py": "",
    "pkg/ns/base.py": (  # pkg/ns has no __init__.py: a namespace package, like sglang.srt
        "import functools\n"
        "class Mixin:\n"
        "    def pool(self): pass\n"
        "    @property\n"
        "    def size(self): return 1\n"
        "    @functools.lru_cache\n"
        "    def cached(self): pass\n"
        "def helper(): pass\n"
        "def gen(): yield 1\n"
    ),
    "pkg/ns/runner.py": (
        "from typing import TYPE_CHECKING\n"
        "from .base import Mixin, helper\n"
        "from pkg.ns import base as b\n"
        "if TYPE_CHECKING:\n"
        "    from .base import gen as only_for_types\n"
        "try:\n"
        "    from .missing import nothing\n"
        "except ImportError:\n"
        "    def nothing(): pass\n"
        "class Runner(Mixin):\n"
        "    def __init__(self): pass\n"
        "    class Inner:\n"
        "        async def step(self): pass\n"
        "    made = staticmethod(helper)\n"
        "    @classmethod\n"
        "    def build(cls): pass\n"
        "class Late(b.Mixin): pass\n"
        "alias = helper\n"
        "value = 3\n"
    ),
    "pkg/star.py": "from pkg.ns.base import *\n",
}
SYNTHETIC_TARGETS = [
    "pkg.ns.runner:Runner.__init__",
    "pkg.ns.runner:Runner.pool",
    "pkg.ns.runner:Late.pool",
    "pkg.ns.runner:Runner.size",
    "pkg.ns.runner:Runner.cached",
    "pkg.ns.runner:Runner.Inner.step",
    "pkg.ns.runner:Runner.made",
    "pkg.ns.runner:Runner.build",
    "pkg.ns.runner:helper",
    "pkg.ns.runner:alias",
    "pkg.ns.runner:only_for_types",
    "pkg.ns.runner:nothing",
    "pkg.ns.runner:value",
    "pkg.ns.runner:Runner.gone",
    "pkg.star:gen",
    "pkg.star:Mixin.pool",
    "pkg.ns.base:gen",
    "pkg.ns.nope:f",
    "pkg:ns",
]


def test_sources_resolve_exactly_what_the_engine_resolves(tmp_path, monkeypatch):
    for name, text in SYNTHETIC.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    static = Sources.directory(tmp_path)

    try:  # the engine's dry run imports each module and resolves each target as it would patch it
        plans = PatchEngine([Phase(f"t{i}", (t,)) for i, t in enumerate(SYNTHETIC_TARGETS)]).dry_run()
        answers = {
            p.phase.targets[0]: (static.resolves(p.phase.targets[0]), p.candidates[0].state == USED) for p in plans
        }
    finally:
        for name in [m for m in sys.modules if m == "pkg" or m.startswith("pkg.")]:
            del sys.modules[name]
    assert {t: a for t, a in answers.items() if a[0] != a[1]} == {}
    assert static.resolve("pkg.ns.runner:Late.pool") == "pkg.ns.base:Mixin.pool"
    assert {p.phase.targets[0]: p.candidates[0].defined for p in plans}[
        "pkg.ns.runner:Late.pool"
    ] == "pkg.ns.base:Mixin.pool"  # where the engine found it defined, as the sources say
    assert sum(s for s, _ in answers.values()) == 12  # both ways: some resolve, some do not


def _script():
    spec = importlib.util.spec_from_file_location("coverage_script", SCRIPTS / "coverage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def script():
    return _script()


@pytest.fixture(scope="module")
def releases(script) -> dict[str, Sources]:
    try:
        wheels = script.wheels()  # cached, else downloaded from PyPI
    except RuntimeError as exc:  # offline, or the index refused: the table cannot be recomputed here
        lines = str(exc).strip().splitlines()
        pytest.skip(f"SGLang release wheels not available: {lines[0]} {lines[-1] if len(lines) > 1 else ''}")
    return {v: Sources.wheel(path) for v, path in wheels.items()}


@pytest.fixture(scope="module")
def computed(script, releases):
    return script.compute(releases)


def test_the_committed_table_is_current(script, computed):
    assert script.DOC.read_text(encoding="utf-8") == script.render(*computed), (
        "docs/coverage.md is stale: run python scripts/coverage.py --write"
    )


# The reference map's coverage section (sglang-init-map.md, d.3), transcribed: per row, our phases
# that hold it, its candidates by letter, and one cell per sampled release ('.' = none).
MAP_RELEASES = (
    "0.4.0",
    "0.4.3",
    "0.4.6",
    "0.4.8",
    "0.4.10.post2",
    "0.5.1",
    "0.5.3",
    "0.5.5",
    "0.5.6",
    "0.5.8",
    "0.5.9",
    "0.5.10",
    "0.5.12",
    "0.5.14",
    "0.5.16",
    "0.5.18",
    "0.5.20",
    "0.5.23",
)
PS = "sglang.srt.distributed.parallel_state"
DC = "sglang.srt.distributed.device_communicators"
MAP = {
    "rank_root": ("rank", {"A": f"{SCHED}:Scheduler.__init__"}, "A" * 18),
    "dist_init": (
        "dist.init",
        {
            "A": "sglang.srt.distributed.bootstrap:init_parallel_runtime",
            "B": f"{MR}:ModelRunner.init_torch_distributed",
        },
        "B" * 17 + "A",
    ),
    "dist: init_process_group": ("dist.init_process_group", {"A": f"{PS}:init_distributed_environment"}, "A" * 18),
    "dist: model-parallel groups": ("dist.model_parallel_groups", {"A": f"{PS}:initialize_model_parallel"}, "A" * 18),
    "dist: group ctor": ("dist.group_coordinator", {"A": f"{PS}:GroupCoordinator.__init__"}, "A" * 18),
    "dist: pynccl comm": ("dist.pynccl_comm", {"A": f"{DC}.pynccl:PyNcclCommunicator.__init__"}, "A" * 18),
    "dist: custom AR": (
        "dist.custom_all_reduce",
        {
            "A": f"{DC}.custom_all_reduce_v2:CustomAllReduceV2.__init__",
            "B": f"{DC}.custom_all_reduce:CustomAllreduce.__init__",
        },
        "B" * 11 + "A" * 7,
    ),
    "model_runner ctor": ("model_runner.init", {"A": f"{MR}:ModelRunner.__init__"}, "A" * 18),
    "weight_load": ("model.load_weights", {"A": f"{MR}:ModelRunner.load_model"}, "A" * 18),
    "weight_load: loader": (
        "model.loader",
        {"A": "sglang.srt.model_loader.loader:DefaultModelLoader.load_model"},
        "A" * 18,
    ),
    "weight_load: shard iterator": (
        "model.weights_iterator",
        {"A": "sglang.srt.model_loader.weight_utils:safetensors_weights_iterator"},
        "A" * 18,
    ),
    "kv_cache_alloc": (
        "kv_cache.alloc",
        {
            "A": f"{MR}:ModelRunner.alloc_memory_pool",
            "B": f"{MR}:ModelRunner.init_memory_pool",
            "C": f"{ME}.model_runner_kv_cache_mixin:ModelRunnerKVCacheMixin.init_memory_pool",
        },
        "B" * 9 + "C" * 4 + "A" * 5,
    ),
    "attn_backend_init": (
        "attention.init",
        {"A": f"{MR}:ModelRunner.init_attention_backends", "B": f"{MR}:ModelRunner.init_attention_backend"},
        "B" * 13 + "A" * 5,
    ),
    "graph_capture (phase span)": (
        "graph.init",
        {"A": f"{MR}:ModelRunner.init_cuda_graphs", "B": f"{MR}:ModelRunner.init_device_graphs"},
        "A" * 5 + "B" * 8 + "A" * 5,
    ),
    "graph_capture: decode runner ctor": (
        "graph.runner_init",
        {
            "A": f"{ME}.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner.__init__",
            "B": f"{ME}.cuda_graph_runner:CudaGraphRunner.__init__",
        },
        "B" * 13 + "A" * 5,
    ),
    "graph_capture: decode capture()": (
        "graph.capture",
        {
            "A": f"{ME}.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner.capture",
            "B": f"{ME}.cuda_graph_runner:CudaGraphRunner.capture",
        },
        "B" * 13 + "A" * 5,
    ),
    "graph_capture: per-bs": (
        "graph.capture_shape",
        {
            "A": f"{ME}.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner.capture_one_shape",
            "B": f"{ME}.cuda_graph_runner:CudaGraphRunner.capture_one_batch_size",
        },
        "B" * 13 + "A" * 5,
    ),
    "piecewise/prefill graph": (
        "graph.runner_init",
        {
            "A": f"{ME}.runner.prefill_cuda_graph_runner:PrefillCudaGraphRunner.__init__",
            "B": f"{ME}.piecewise_cuda_graph_runner:PiecewiseCudaGraphRunner.__init__",
        },
        "." * 7 + "B" * 6 + "A" * 5,
    ),
    "draft: worker ctor (v2)": (
        "eagle.worker_init",
        {"A": f"{SP}.eagle_worker_v2:EAGLEWorkerV2.__init__"},
        "." * 7 + "A" * 11,
    ),
    "draft: worker ctor (v1)": (
        "eagle.worker_init",
        {"A": f"{SP}.eagle_worker:EAGLEWorker.__init__"},
        "." + "A" * 12 + "." * 5,
    ),
    "draft: embed/head share": (
        "eagle.init_lm_head eagle.worker_init",
        {"A": f"{SP}.eagle_worker_v2:EagleDraftWorker.init_lm_head", "B": f"{SP}.eagle_worker:EAGLEWorker.__init__"},
        "." + "B" * 6 + "A" * 11,
    ),
    "draft: graphs": (
        "eagle.draft_graphs",
        {
            "A": f"{SP}.eagle_worker_v2:EagleDraftWorker.init_cuda_graphs",
            "B": f"{SP}.eagle_worker:EAGLEWorker.init_cuda_graphs",
        },
        "." + "B" * 6 + "A" * 11,
    ),
    "draft: EAGLE draft graph runner": (
        "eagle.draft_graph_runner",
        {"A": f"{SP}.eagle_draft_cuda_graph_runner:EAGLEDraftCudaGraphRunner.__init__"},
        "." + "A" * 17,
    ),
    "draft: EAGLE draft-extend graph runner": (
        "eagle.draft_graph_runner",
        {"A": f"{SP}.eagle_draft_extend_cuda_graph_runner:EAGLEDraftExtendCudaGraphRunner.__init__"},
        "." * 3 + "A" * 15,
    ),
    "server_ready": (
        "server.wait_ready",
        {"A": "sglang.srt.entrypoints.http_server:_wait_and_warmup", "B": "sglang.srt.server:_wait_and_warmup"},
        "B" + "A" * 17,
    ),
    "main: launch": (
        "launch.subprocesses",
        {
            "A": "sglang.srt.entrypoints.engine:Engine._launch_subprocesses",
            "B": "sglang.srt.entrypoints.engine:_launch_subprocesses",
            "C": "sglang.srt.server:launch_engine",
        },
        "C" + "B" * 10 + "A" * 7,
    ),
}


@pytest.mark.parametrize("row", list(MAP))
def test_agrees_with_the_reference_init_map(row, computed):
    """Where the map names a candidate, that function is what we wrap (named directly, or through
    the class that inherits it: the map's C for kv_cache_alloc is the mixin our B resolves to);
    where the map has none, we wrap none of the row's candidates."""
    _, used, defined = computed
    ours, candidates, cells = MAP[row]
    for release, cell in zip(MAP_RELEASES, cells, strict=True):
        wrapped = {t for phase in ours.split() for t in used[release][phase]}
        reached = wrapped | {defined[release].get(t, t) for t in wrapped}
        if cell == ".":
            assert not reached & set(candidates.values()), (release, reached & set(candidates.values()))
        else:
            assert candidates[cell] in reached, (release, candidates[cell], sorted(wrapped))


def test_a_required_phase_resolves_in_every_release(computed):
    rows, _, _ = computed
    for phase in table_phases():
        if phase.required:
            assert [r for r in RELEASES if rows[r][phase.name] == "·"] == [], phase.name


# -- rank identity across eras -------------------------------------------------------------------
def parameters(sources: Sources, target: str) -> list[str]:
    found = sources.function(target)
    assert found is not None, f"{sources.label}: {target}"
    args = found.node.args
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]


@pytest.mark.parametrize("release", RELEASES)
def test_rank_identity_is_read_in_every_era(release, releases, monkeypatch):
    """Rank arguments of ``Scheduler.__init__`` moved four times and left in 0.5.21: every one
    the release has is read by name; without them, the names we read from the runtime context
    are ones that release publishes."""
    sources = releases[release]
    params = parameters(sources, f"{SCHED}:Scheduler.__init__")
    monkeypatch.delitem(sys.modules, "sglang.srt.runtime_context", raising=False)
    ranks = {p: 10 + i for i, p in enumerate(params) if p.endswith("_rank") or p == "gpu_id"}
    attrs = scheduler.rank_attrs(Call({**ranks, "server_args": None}))
    read_as = {name: key for key, name in scheduler._RANK_ARGS}
    assert set(ranks) <= set(read_as), f"unread rank arguments: {set(ranks) - set(read_as)}"
    assert {name: attrs[read_as[name]] for name in ranks} == ranks
    if "tp_rank" not in params:  # 0.5.21+
        assert sources.resolve("sglang.srt.runtime_context:get_parallel")
        text = sources.text("sglang.srt.runtime_context")
        unpublished = [name for _, name in scheduler._PARALLEL if f'"{name}"' not in text and f"{name}:" not in text]
        assert unpublished == []
    assert {"gpu_id"} <= set(parameters(sources, f"{MR}:ModelRunner.__init__"))


# -- serving, from SGLang's state across releases (issue 41.1) ---------------------------------------------
@pytest.mark.parametrize("release", RELEASES)
def test_serving_is_read_from_sglangs_server_status_where_the_release_has_one(release, releases):
    """``patches.server._ready_seen`` reads ``_global_state.tokenizer_manager.server_status`` in the
    module of the ``_wait_and_warmup`` it wraps: every release that sets ``ServerStatus.Up`` sets it
    there, on the warm-up's success and on ``--skip-server-warmup``'s path; the others still log the
    ready line the fallback looks for."""
    from sglang_phasetrace.patches import server

    sources = releases[release]
    module = next(t for t in (f"{server.HTTP}", "sglang.srt.server") if sources.function(f"{t}:_wait_and_warmup"))
    text = sources.text(module)
    assert server.READY_MESSAGE in text
    if "ServerStatus" not in text:  # 0.4.0 to 0.4.10: the line, or the return where it cannot be made
        assert release.startswith("0.4."), release
        return
    assert "_global_state.tokenizer_manager.server_status = ServerStatus.Up" in text
    assert re.search(r"^_global_state\b", text, re.M), "the module global the hook reads"
    warmup = sources.function(f"{module}:_wait_and_warmup")
    body = ast.get_source_segment(text, warmup.node) or ""
    if "ServerStatus.Up" not in body:  # 0.4.10.post2: Starting on the skip path, read with server_args
        assert release == "0.4.10.post2" and "server_args.skip_server_warmup" in body, release


# -- the live row: doctor imports the installed release --------------------------------------------
@pytest.mark.sglang
@requires_sglang
@pytest.mark.parametrize("release", ["installed", *OVERLAYS])
def test_doctor_prints_this_releases_row_of_the_table(release, computed):
    env = {"PYTHONPATH": str(OVERLAYS[release])} if release in OVERLAYS else {}
    done = subprocess.run(
        [sys.executable, "-m", "sglang_phasetrace.tracing.cli", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**_clean_env(), **env},
    )
    report = json.loads(done.stdout)
    rows, used, _ = computed
    version = report["sglang"]
    assert version == release if release in OVERLAYS else version in RELEASES
    unimportable = {t["target"] for p in report["phases"] for t in p["targets"] if t["state"] == "import error"}
    for phase in table_phases():
        if report["coverage_row"][phase.name] != rows[version][phase.name]:
            # the sources define it, but importing the module fails on every machine (0.5.9's
            # multi_layer_eagle_worker evaluates an annotation only imported under TYPE_CHECKING)
            live = set(report["coverage_row"][phase.name].split("+"))
            static_only = [
                t for i, t in enumerate(phase.targets) if t in used[version][phase.name] and letter(i) not in live
            ]
            assert static_only and set(static_only) <= unimportable, (phase.name, static_only)


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("SGLANG_PHASETRACE")}
