"""The patch engine's hazards, on small local modules (no SGLang needed).

Targets live in fresh modules: ``types.ModuleType`` objects registered in ``sys.modules`` for
late-apply cases, and real ``.py`` files on a temporary ``sys.path`` entry where the import
system itself must run (post-import hooks, "first" candidate order). Spans are read back from the
journal the real tracing runtime writes into a per-test run directory.
"""

from __future__ import annotations

import importlib
import logging
import pickle
import random
import sys
import textwrap
import uuid
import warnings
from pathlib import Path

import pytest
from sglang_phasetrace.patches import PatchEngine, Phase
from sglang_phasetrace.patches.engine import FALLBACK, MISSING, NO_MODULE, NOT_FUNCTION, USED
from sglang_phasetrace.patches.spec import Report
from sglang_phasetrace.patches.wrappers import MARK
from sglang_phasetrace.tracing import keys
from sglang_phasetrace.tracing.reader.load import load_run
from sglang_phasetrace.tracing.reader.view import SpanRec
from sglang_phasetrace.tracing.recorder import runtime

LOGGER = "sglang_phasetrace"


# -- fixtures and helpers ------------------------------------------------------------------------
@pytest.fixture
def run_dir(trace_run_dir: Path) -> Path:
    return trace_run_dir


def spans(run_dir: Path, name: str | None = None) -> list[SpanRec]:
    """This process's spans in start order (optionally one phase); [] when nothing was traced."""
    if not (run_dir / "journal").is_dir():
        return []
    run = load_run(run_dir)
    assert run.problems == []
    found = [s for p in run.processes for s in p.spans.values()]
    return [s for s in found if name is None or s.phase == name]


@pytest.fixture
def file_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``write(source, name=None) -> name``: a real ``.py`` module, importable, not yet imported."""
    folder = tmp_path / "mods"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    names: list[str] = []

    def write(source: str, name: str | None = None) -> str:
        name = name or f"_t_{uuid.uuid4().hex}"
        (folder / f"{name}.py").write_text(textwrap.dedent(source))
        importlib.invalidate_caches()
        names.append(name)
        return name

    yield write
    for name in names:
        sys.modules.pop(name, None)


def engine_for(*phases: Phase) -> tuple[PatchEngine, list[str]]:
    warnings: list[str] = []
    return PatchEngine(phases, warnings.append), warnings


def phase_name() -> str:
    """Unique per test: hook-failure logging is once per phase name and process."""
    return f"test.{uuid.uuid4().hex[:8]}"


TARGET_SOURCE = """
    calls = []

    def load(x):
        calls.append(x)
        return x * 2

    class Runner:
        def step(self, x):
            return ("step", x)
"""


# -- ordering matrix: import → apply, apply → import, apply twice, unapply -------------------------
def test_import_then_apply_wraps_function_method_and_aliases(run_dir, file_modules):
    tgt = file_modules(TARGET_SOURCE)
    alias = file_modules(f"from {tgt} import load as fetch\nfrom {tgt} import Runner\n")
    mod, user = importlib.import_module(tgt), importlib.import_module(alias)
    original_load, original_step = mod.load, mod.Runner.__dict__["step"]
    fn, meth = phase_name(), phase_name()
    engine, warnings = engine_for(Phase(fn, (f"{tgt}:load",)), Phase(meth, (f"{tgt}:Runner.step",)))

    engine.install()  # modules already imported: the post-import hooks run now (late apply)

    assert mod.load.__wrapped__ is original_load and getattr(mod.load, MARK) == fn
    assert user.fetch is mod.load, "the `from X import f` copy must be replaced too"
    assert mod.Runner.__dict__["step"].__wrapped__ is original_step
    assert user.fetch(3) == 6 and mod.Runner().step(1) == ("step", 1)
    assert [s.status for s in spans(run_dir, fn)] == ["ok"]
    assert [s.status for s in spans(run_dir, meth)] == ["ok"]
    assert warnings == []


def test_apply_then_import_patches_at_import_before_anyone_copies(run_dir, file_modules):
    tgt = file_modules(TARGET_SOURCE)
    alias = file_modules(f"from {tgt} import load as fetch\n")
    fn = phase_name()
    engine, warnings = engine_for(Phase(fn, (f"{tgt}:load",)))
    engine.install()
    assert tgt not in sys.modules

    user = importlib.import_module(alias)  # imports the target first, then copies its name

    mod = sys.modules[tgt]
    assert getattr(mod.load, MARK) == fn and user.fetch is mod.load
    assert engine.resolved() == {fn: [f"{tgt}:load"]}
    assert user.fetch(2) == 4
    assert len(spans(run_dir, fn)) == 1
    assert warnings == []


def test_apply_twice_does_not_double_wrap(run_dir, make_module):
    mod = make_module(TARGET_SOURCE)
    original_load, original_step = mod.load, mod.Runner.__dict__["step"]
    fn, meth = phase_name(), phase_name()
    phases = (Phase(fn, (f"{mod.__name__}:load",)), Phase(meth, (f"{mod.__name__}:Runner.step",)))
    engine, warnings = engine_for(*phases)

    engine.apply_module(mod.__name__)
    once = (mod.load, mod.Runner.__dict__["step"])
    engine.apply_module(mod.__name__)
    engine.install()  # and once more through the post-import hook
    PatchEngine(phases, warnings.append).apply_module(mod.__name__)  # a second engine, same tables

    assert (mod.load, mod.Runner.__dict__["step"]) == once
    assert mod.load.__wrapped__ is original_load
    assert mod.Runner.__dict__["step"].__wrapped__ is original_step
    mod.load(1)
    mod.Runner().step(1)
    assert len(spans(run_dir, fn)) == 1 and len(spans(run_dir, meth)) == 1
    assert warnings == []


def test_unapply_restores_originals_and_aliases(run_dir, make_module):
    mod = make_module(TARGET_SOURCE)
    user = make_module("", fetch=mod.load)  # a `from X import load as fetch` copy
    original_load, original_step = mod.load, mod.Runner.__dict__["step"]
    fn, meth = phase_name(), phase_name()
    engine, _ = engine_for(Phase(fn, (f"{mod.__name__}:load",)), Phase(meth, (f"{mod.__name__}:Runner.step",)))
    engine.apply_module(mod.__name__)
    assert user.fetch is not original_load

    assert engine.unapply() == 2

    assert mod.load is original_load and user.fetch is original_load
    assert mod.Runner.__dict__["step"] is original_step
    assert engine.resolved() == {}
    mod.load(1)
    user.fetch(1)
    mod.Runner().step(1)
    assert spans(run_dir) == []


def test_unapply_with_predicate_only_undoes_matching_phases(run_dir, make_module):
    mod = make_module(TARGET_SOURCE)
    original_load = mod.load
    keep, drop = phase_name(), phase_name()
    engine, _ = engine_for(
        Phase(keep, (f"{mod.__name__}:Runner.step",)), Phase(drop, (f"{mod.__name__}:load",), init_only=True)
    )
    engine.apply_module(mod.__name__)

    assert engine.unapply(lambda phase: phase.init_only) == 1

    assert mod.load is original_load
    assert getattr(mod.Runner.__dict__["step"], MARK) == keep


# -- hazards -------------------------------------------------------------------------------------
def test_late_apply_replaces_from_import_aliases_everywhere(run_dir, make_module):
    mod = make_module(TARGET_SOURCE)
    users = [make_module("", load=mod.load), make_module("", fetch=mod.load, other=len)]
    fn = phase_name()
    engine, warnings = engine_for(Phase(fn, (f"{mod.__name__}:load",)))

    engine.apply_module(mod.__name__)

    assert users[0].load is mod.load and users[1].fetch is mod.load
    assert users[1].other is len
    users[0].load(1)
    users[1].fetch(2)
    assert len(spans(run_dir, fn)) == 2
    assert mod.calls == [1, 2]
    assert warnings == []


def test_value_captured_in_default_argument_is_reported_and_still_works(run_dir, make_module):
    mod = make_module(TARGET_SOURCE)
    user = make_module(
        """
        def run(x, fn=LOAD):
            return fn(x)

        def run_kw(x, *, fn=LOAD):
            return fn(x)
    """,
        LOAD=mod.load,
    )
    fn = phase_name()
    engine, warnings = engine_for(Phase(fn, (f"{mod.__name__}:load",)))

    engine.apply_module(mod.__name__)

    captured = [w for w in warnings if "default argument" in w]
    assert len(captured) == 2
    assert all(f"{mod.__name__}:load" in w for w in captured)
    assert any(
        f"{user.__name__}.run " in w or w.endswith(f"{user.__name__}.run; calls through it are not traced")
        for w in captured
    )
    assert any(f"{user.__name__}.run_kw" in w for w in captured)
    assert user.run(5) == 10 and user.run_kw(6) == 12  # not broken: the original still runs
    assert spans(run_dir, fn) == []  # ... untraced, as reported
    mod.load(1)  # the module attribute is traced
    assert len(spans(run_dir, fn)) == 1


def test_staticmethod_and_classmethod_keep_their_kind(run_dir, make_module):
    mod = make_module("""
        class Loader:
            @staticmethod
            def post(x):
                return ("post", x)

            @classmethod
            def build(cls, x):
                return (cls, x)

        class Sub(Loader):
            pass
    """)
    raw_post, raw_build = mod.Loader.__dict__["post"], mod.Loader.__dict__["build"]
    static, klass = phase_name(), phase_name()
    engine, warnings = engine_for(
        Phase(static, (f"{mod.__name__}:Loader.post",)), Phase(klass, (f"{mod.__name__}:Loader.build",))
    )

    engine.apply_module(mod.__name__)

    assert isinstance(mod.Loader.__dict__["post"], staticmethod)
    assert isinstance(mod.Loader.__dict__["build"], classmethod)
    assert mod.Loader.post(1) == ("post", 1)
    assert mod.Loader().post(2) == ("post", 2), "called on an instance, a staticmethod gets no self"
    assert mod.Loader.build(3) == (mod.Loader, 3)
    assert mod.Sub().build(4) == (mod.Sub, 4)
    assert len(spans(run_dir, static)) == 2 and len(spans(run_dir, klass)) == 2
    assert warnings == []

    engine.unapply()
    assert mod.Loader.__dict__["post"] is raw_post and mod.Loader.__dict__["build"] is raw_build


GEN_SOURCE = """
    events = []

    def weights(n, fail_at=None):
        events.append("started")
        try:
            for i in range(n):
                if i == fail_at:
                    raise KeyError(f"tensor {i}")
                yield (f"w{i}", i)
        finally:
            events.append("finalised")
"""


def _gen_phase(name: str, module: str, each=None) -> Phase:
    return Phase(name, (f"{module}:weights",), kind="generator", each=each)


def test_generator_span_opens_at_first_next_and_ends_at_exhaustion(run_dir, make_module):
    mod = make_module(GEN_SOURCE)
    name = phase_name()
    seen = []
    engine, _ = engine_for(_gen_phase(name, mod.__name__, each=lambda call, item: seen.append(item)))
    engine.apply_module(mod.__name__)

    gen = mod.weights(3)
    assert spans(run_dir, name) == [] and mod.events == [], "nothing runs before the first next()"
    first = next(gen)
    (span,) = spans(run_dir, name)
    assert span.status == "open" and first == ("w0", 0)
    rest = list(gen)

    assert rest == [("w1", 1), ("w2", 2)] and seen == [first, *rest]
    (span,) = spans(run_dir, name)
    assert span.status == "ok" and mod.events == ["started", "finalised"]


def test_generator_closed_early_ends_its_span(run_dir, make_module):
    mod = make_module(GEN_SOURCE)
    name = phase_name()
    engine, _ = engine_for(_gen_phase(name, mod.__name__))
    engine.apply_module(mod.__name__)

    gen = mod.weights(5)
    assert next(gen) == ("w0", 0)
    gen.close()

    (span,) = spans(run_dir, name)
    assert span.status == "ok" and span.end is not None and span.error is None
    assert mod.events == ["started", "finalised"]


def test_generator_exception_propagates_and_is_recorded(run_dir, make_module):
    mod = make_module(GEN_SOURCE)
    name = phase_name()
    engine, _ = engine_for(_gen_phase(name, mod.__name__))
    engine.apply_module(mod.__name__)

    got = []
    with pytest.raises(KeyError, match="tensor 2"):
        for item in mod.weights(5, fail_at=2):
            got.append(item)

    assert got == [("w0", 0), ("w1", 1)]
    (span,) = spans(run_dir, name)
    assert span.status == "error"
    assert span.error["type"] == "KeyError" and "tensor 2" in span.error["message"]


REENTRY_SOURCE = """
    class Base:
        def init(self, draft=None):
            if draft is not None:
                draft.init()
            return "base"

    class Sub(Base):
        def init(self, draft=None):
            return "sub+" + super().init(draft)
"""


def test_super_chain_to_a_patched_base_gives_one_span(run_dir, make_module):
    mod = make_module(REENTRY_SOURCE)
    name = phase_name()
    engine, _ = engine_for(Phase(name, (f"{mod.__name__}:Base.init", f"{mod.__name__}:Sub.init"), mode="all"))
    engine.apply_module(mod.__name__)

    assert mod.Sub().init() == "sub+base"
    assert len(spans(run_dir, name)) == 1
    assert mod.Base().init() == "base"
    assert len(spans(run_dir, name)) == 2


def test_target_and_draft_instances_each_get_a_span(run_dir, make_module):
    mod = make_module(REENTRY_SOURCE)
    name = phase_name()
    engine, _ = engine_for(Phase(name, (f"{mod.__name__}:Base.init",)))
    engine.apply_module(mod.__name__)

    target, draft = mod.Base(), mod.Base()
    target.init(draft)  # the draft runner is built inside the target's call (H8)

    outer, inner = spans(run_dir, name)
    assert inner.parent_id == outer.span_id
    assert outer.status == inner.status == "ok"


def test_inherited_method_is_patched_on_the_named_class_only(run_dir, make_module):
    mod = make_module("""
        class Base:
            def load(self):
                return type(self).__name__

        class Child(Base):
            pass
    """)
    original = mod.Base.__dict__["load"]
    name = phase_name()
    engine, _ = engine_for(Phase(name, (f"{mod.__name__}:Child.load",)))
    engine.apply_module(mod.__name__)

    assert "load" in vars(mod.Child) and mod.Base.__dict__["load"] is original
    assert mod.Base().load() == "Base"
    assert spans(run_dir, name) == []
    assert mod.Child().load() == "Child"
    assert len(spans(run_dir, name)) == 1

    engine.unapply()
    assert "load" not in vars(mod.Child) and mod.Child.load is original


def test_first_mode_takes_the_first_candidate_even_if_a_later_module_is_imported_first(run_dir, file_modules):
    first = file_modules("def step():\n    return 'first'\n")
    second = file_modules("def step():\n    return 'second'\n")
    name = phase_name()
    engine, warnings = engine_for(Phase(name, (f"{first}:step", f"{second}:step")))
    engine.install()
    assert first not in sys.modules and second not in sys.modules

    later = importlib.import_module(second)

    assert first in sys.modules, "the engine decides the earlier candidate before settling"
    assert getattr(sys.modules[first].step, MARK, None) == name
    assert not hasattr(later.step, MARK)
    assert engine.resolved() == {name: [f"{first}:step"]}
    assert warnings == []


def test_first_mode_falls_back_to_a_later_candidate_when_earlier_ones_cannot_resolve(run_dir, make_module):
    mod = make_module("def new_name():\n    return 1\n")
    missing_module = f"_t_{uuid.uuid4().hex}_absent"
    name = phase_name()
    engine, warnings = engine_for(
        Phase(name, (f"{missing_module}:step", f"{mod.__name__}:old_name", f"{mod.__name__}:new_name"))
    )
    engine.install()

    assert engine.resolved() == {name: [f"{mod.__name__}:new_name"]}
    assert getattr(mod.new_name, MARK) == name
    assert warnings == []


def test_missing_target_is_reported_once(run_dir, make_module):
    mod = make_module(TARGET_SOURCE)
    name = phase_name()
    engine, warnings = engine_for(
        Phase(name, (f"{mod.__name__}:Runner.step_renamed", f"{mod.__name__}:gone"), required=True)
    )

    engine.install()
    engine.apply_module(mod.__name__)
    engine.report_unresolved(engine.phases[0])  # the ready-time check, too

    assert len(warnings) == 1
    assert name in warnings[0] and f"{mod.__name__}:Runner.step_renamed" in warnings[0]
    assert engine.resolved() == {}
    assert mod.Runner().step(1) == ("step", 1)


def test_missing_target_default_warning_goes_to_the_log(run_dir, make_module, caplog):
    mod = make_module(TARGET_SOURCE)
    name = phase_name()
    engine = PatchEngine((Phase(name, (f"{mod.__name__}:gone",), required=True),))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        engine.apply_module(mod.__name__)
        engine.apply_module(mod.__name__)
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1 and lines[0].startswith("sglang-phasetrace: ") and name in lines[0]


def test_optional_phase_absent_from_this_release_is_silent(run_dir, make_module):
    """A release without an optional step (``Scheduler.init_memory_pools`` before 0.5.14) is
    normal: its trace lacks the phase, and nothing is printed."""
    mod = make_module(TARGET_SOURCE)
    engine, warnings = engine_for(Phase(phase_name(), (f"{mod.__name__}:gone", "no_such_module_x:f")))

    engine.apply_module(mod.__name__)

    assert warnings == [] and engine.resolved() == {}


@pytest.mark.parametrize("where", ["enter", "exit"])
def test_exception_in_a_hook_is_logged_and_the_call_proceeds(run_dir, make_module, caplog, where):
    mod = make_module(TARGET_SOURCE)
    name = phase_name()

    def broken(*args):
        raise RuntimeError(f"broken {where} hook")

    engine, _ = engine_for(Phase(name, (f"{mod.__name__}:load",), **{where: broken}))
    engine.apply_module(mod.__name__)

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert mod.load(21) == 42
        assert mod.load(1) == 2

    assert mod.calls == [21, 1]
    failures = [r.getMessage() for r in caplog.records if f"broken {where} hook" in r.getMessage()]
    assert len(failures) == 1, "logged once per phase, not per call"
    assert name in failures[0] and where in failures[0]
    assert [s.status for s in spans(run_dir, name)] == ["ok", "ok"], "the hook costs its attributes only"


def test_exception_in_a_generator_item_hook_is_logged_and_iteration_proceeds(run_dir, make_module, caplog):
    mod = make_module(GEN_SOURCE)
    name = phase_name()

    def broken(call, item):
        raise ValueError("bad item hook")

    engine, _ = engine_for(_gen_phase(name, mod.__name__, each=broken))
    engine.apply_module(mod.__name__)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert list(mod.weights(3)) == [("w0", 0), ("w1", 1), ("w2", 2)]
    assert sum("bad item hook" in r.getMessage() for r in caplog.records) == 1
    assert [s.status for s in spans(run_dir, name)] == ["ok"]


def test_tracing_failure_is_logged_and_the_call_runs_untraced(run_dir, make_module, caplog, monkeypatch):
    mod = make_module(TARGET_SOURCE)
    name = phase_name()
    engine, _ = engine_for(Phase(name, (f"{mod.__name__}:load",)))
    engine.apply_module(mod.__name__)

    def no_runtime():
        raise OSError("run directory not writable")

    monkeypatch.setattr(runtime, "current", no_runtime)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert mod.load(4) == 8
    assert any("run directory not writable" in r.getMessage() for r in caplog.records)


def test_exception_in_the_wrapped_function_propagates_unchanged_and_is_recorded(run_dir, make_module):
    mod = make_module("""
        class Boom(Exception):
            pass

        ERROR = Boom("kv pool does not fit")

        def alloc():
            raise ERROR
    """)
    name = phase_name()
    engine, _ = engine_for(Phase(name, (f"{mod.__name__}:alloc",)))
    engine.apply_module(mod.__name__)

    with pytest.raises(mod.Boom) as caught:
        mod.alloc()

    assert caught.value is mod.ERROR
    assert caught.traceback[-1].name == "alloc", "the original frame is where it was raised"
    (span,) = spans(run_dir, name)
    assert span.status == "error"
    assert span.error["type"] == f"{mod.__name__}.Boom"  # OTel qualifies non-builtin types
    assert span.error["message"] == "kv pool does not fit"
    assert "kv pool does not fit" in (span.error.get("stack") or "")


def test_wrapper_keeps_metadata_and_pickles_by_qualified_name(run_dir, file_modules):
    tgt = importlib.import_module(file_modules(TARGET_SOURCE))
    original = tgt.load
    engine, _ = engine_for(Phase(phase_name(), (f"{tgt.__name__}:load",)))
    engine.apply_module(tgt.__name__)

    assert tgt.load is not original
    assert (tgt.load.__name__, tgt.load.__qualname__, tgt.load.__module__) == ("load", "load", tgt.__name__)
    assert tgt.load.__wrapped__ is original
    assert pickle.loads(pickle.dumps(tgt.load)) is tgt.load  # spawned ranks may pickle targets


def test_alias_sweep_does_not_trip_objects_that_warn_on_attribute_access(run_dir, make_module):
    """Late apply sweeps every module; some module attributes warn on any attribute read
    (``torch.distributed.reduce_op``). The sweep must not touch them: under ``-W error`` the warning
    would abort the patch, otherwise it lands on the traced program's stderr."""
    mod = make_module(TARGET_SOURCE)
    make_module(
        """
        import warnings

        class Deprecated:
            def __getattribute__(self, key):
                warnings.warn("`reduce_op` is deprecated", FutureWarning, stacklevel=2)
                return object.__getattribute__(self, key)

        reduce_op = Deprecated()
    """,
        load=mod.load,
    )
    name = phase_name()
    engine, warnings_ = engine_for(Phase(name, (f"{mod.__name__}:load",)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine.apply_module(mod.__name__)
    assert getattr(mod.load, MARK) == name
    assert warnings_ == []


def test_span_ids_do_not_follow_the_global_random_seed(run_dir):
    """SGLang seeds ``random`` with the same seed in every rank; span ids must still differ."""
    from sglang_phasetrace.tracing.recorder import spans as spans_

    ids = []
    for _ in range(2):
        random.seed(1234)
        span = spans_.start_phase("seeded", {"sglang.phase": "seeded"})
        span.end()
        ids.append(span.span_id)
    assert ids[0] != ids[1]
    trace_ids = {s.trace_id for s in spans(run_dir, "seeded")}
    assert len(spans(run_dir, "seeded")) == 2 and len(trace_ids) >= 1


def test_model_classes_found_at_run_time_are_patched_once_along_their_hierarchy(run_dir, make_module):
    """``"*:attr"`` targets (embed/head sharing) are wrapped on each loaded model class; a draft
    class inheriting the target class's method is not wrapped a second time."""
    mod = make_module("""
        class Target:
            def get_embed_and_head(self):
                return ("embed", "head")

        class Draft(Target):
            pass

        class Other:
            def get_embed_and_head(self):
                return ("e", "h")
    """)
    name = phase_name()
    engine, warnings = engine_for()
    phase = Phase(name, ("*:get_embed_and_head", "*:get_embed_and_head_for_draft"), mode="all")

    engine.patch_class(mod.Target, (phase,))
    engine.patch_class(mod.Draft, (phase,))
    engine.patch_class(mod.Other, (phase,))
    engine.patch_class(mod.Target, (phase,))

    assert "get_embed_and_head" not in vars(mod.Draft)
    assert getattr(mod.Target.__dict__["get_embed_and_head"], MARK) == name
    assert getattr(mod.Other.__dict__["get_embed_and_head"], MARK) == name
    assert mod.Draft().get_embed_and_head() == ("embed", "head")
    assert mod.Other().get_embed_and_head() == ("e", "h")
    assert [s.attrs["phasetrace.target"] for s in spans(run_dir, name)] == [
        f"{mod.__name__}:Target.get_embed_and_head",
        f"{mod.__name__}:Other.get_embed_and_head",
    ]
    assert warnings == []


# -- after the process is ready ------------------------------------------------------------------
def test_runs_after_ready_are_labelled_or_skipped_and_init_only_patches_come_off(run_dir, make_module):
    """A re-capture after ready gets a labelled span; ``after_ready="skip"`` phases go quiet; the
    init-only (hot-path) patches are removed at ready, as bootstrap does."""
    mod = make_module("def recapture(): return 1\ndef probe(): return 2\ndef hot(): return 3\n")
    engine = PatchEngine(
        [
            Phase("t.recapture", (f"{mod.__name__}:recapture",)),
            Phase("t.probe", (f"{mod.__name__}:probe",), after_ready="skip"),
            Phase("t.hot", (f"{mod.__name__}:hot",), init_only=True),
        ]
    )
    engine.apply_module(mod.__name__)
    original_hot = mod.hot.__wrapped__
    assert (mod.recapture(), mod.probe(), mod.hot()) == (1, 2, 3)
    rt = runtime.current()
    rt.on_ready.append(lambda: engine.unapply(lambda phase: phase.init_only))
    rt.mark_ready()
    assert (mod.recapture(), mod.probe(), mod.hot()) == (1, 2, 3)
    assert mod.hot is original_hot
    before, after = spans(run_dir, "t.recapture")
    assert "phasetrace.after_ready" not in before.attrs and after.attrs["phasetrace.after_ready"] is True
    assert len(spans(run_dir, "t.probe")) == 1 and len(spans(run_dir, "t.hot")) == 1


def test_collective_wrapper_stays_out_of_torch_compile_graphs(run_dir, make_module):
    """SGLang may torch.compile model forwards during init (graph capture), and those call the
    collectives we record: inside a compiled region our wrapper must be the bare call."""
    torch = pytest.importorskip("torch")
    from sglang_phasetrace.tracing.recorder import spans as span_api

    mod = make_module("def all_reduce(x):\n    return x * 2\n")
    PatchEngine([Phase("t.collective", (f"{mod.__name__}:all_reduce",), kind="collective")]).apply_module(mod.__name__)
    span_api.start_phase("graph.capture")  # recording is on: the process is initialising
    compiled = torch.compile(lambda x: mod.all_reduce(x) + 1, fullgraph=True, backend="eager")
    assert compiled(torch.ones(2)).tolist() == [3.0, 3.0]  # fullgraph: any graph break would raise
    assert mod.all_reduce(torch.ones(1)).tolist() == [2.0]  # eager calls are still recorded
    [proc] = load_run(run_dir).processes
    assert proc.coll_counts == {"?": 1}


# -- the spec: what each kind may set, checked at import ----------------------------------------------
def _hook(*args):
    return None


@pytest.mark.parametrize(
    ("kind", "flags", "ignored"),
    [
        ("rank", {"after_ready": "skip"}, "after_ready"),
        ("collective", {"exit": _hook}, "exit"),
        ("collective", {"after_ready": "skip"}, "after_ready"),
        ("call", {"each": _hook}, "each"),
        ("call", {"ends_root": True}, "ends_root"),
        ("ready", {"ends_root": True, "each": _hook}, "each, ends_root"),
    ],
)
def test_a_flag_the_kind_ignores_is_refused_naming_the_phase(kind, flags, ignored):
    with pytest.raises(ValueError, match=rf"phase 't\.bad': a '{kind}' phase ignores {ignored}"):
        Phase("t.bad", ("m:f",), kind=kind, **flags)


@pytest.mark.parametrize("flags", [{"kind": "span"}, {"mode": "any"}, {"after_ready": "drop"}, {"targets": ("m.f",)}])
def test_a_malformed_phase_is_refused_naming_it(flags):
    with pytest.raises(ValueError, match=r"phase 't\.bad': "):
        Phase(**{"name": "t.bad", "targets": ("m:f",), **flags})


# -- hooks report what they mean ---------------------------------------------------------------------
def test_generator_hooks_report_progress_and_events(run_dir, make_module):
    mod = make_module(GEN_SOURCE)
    name = phase_name()

    def each(call, item):
        done = item[1] + 1
        return Report(progress={"done": done, "total": 3}, event=("item", {"done": done}) if done == 3 else None)

    engine, _ = engine_for(
        Phase(
            name,
            (f"{mod.__name__}:weights",),
            kind="generator",
            enter=lambda call: Report(attrs={"t.n": call.arg("n")}, progress={"done": 0}),
            each=each,
            exit=lambda call, result: {"t.done": True},
        )
    )
    engine.apply_module(mod.__name__)
    gen = mod.weights(3)
    next(gen)
    [(_, progress)] = [(s, p) for s, p in runtime.current().open.listed() if s.name == name]
    assert progress == {"done": 1, "total": 3}  # heartbeats read it from here
    list(gen)
    (span,) = spans(run_dir, name)
    assert span.attrs["t.n"] == 3 and span.attrs["t.done"] is True
    assert [(e["name"], e["attrs"]) for e in span.events] == [("item", {"done": 3})]


@pytest.mark.parametrize("ready", [True, False])
def test_a_ready_phase_ends_the_launch_root_as_it_reports(run_dir, make_module, monkeypatch, ready):
    """launch_server's root outlives its call (the server runs on); the ready phase ends it, well
    when it reports ready (then the process is ready), as an error when it does not."""
    monkeypatch.setenv(keys.ENV_WATCHDOG, "0")
    monkeypatch.setenv(keys.ENV_TRACEPARENT, "")  # the launch root exports its own: restored after
    mod = make_module("def launch():\n    return 'serving'\ndef wait():\n    return 'up'\n")
    engine, _ = engine_for(
        Phase(keys.PHASE_LAUNCH_SERVER, (f"{mod.__name__}:launch",), kind="launch"),
        Phase(
            keys.PHASE_WAIT_READY,
            (f"{mod.__name__}:wait",),
            kind="ready",
            exit=lambda call, result: Report(attrs={"sglang.server_ready": ready}, ready=ready),
        ),
    )
    engine.apply_module(mod.__name__)
    rt = runtime.current()
    assert mod.launch() == "serving"
    (root,) = spans(run_dir, keys.PHASE_LAUNCH_SERVER)
    assert root.name == "sglang.launch" and root.status == "open" and not rt.ready
    assert mod.wait() == "up"
    (root,) = spans(run_dir, keys.PHASE_LAUNCH_SERVER)
    assert rt.ready is ready and root.status == ("ok" if ready else "error")
    assert [s.attrs["sglang.server_ready"] for s in spans(run_dir, keys.PHASE_WAIT_READY)] == [ready]


# -- the dry run (phasetrace doctor asks the engine) ----------------------------------------------------
def test_dry_run_says_what_the_engine_would_wrap_and_patches_nothing(make_module):
    mod = make_module("""
        class Base:
            def load(self): pass
            @property
            def size(self): return 1
        class Child(Base):
            def later(self): pass
    """)
    m = mod.__name__
    phase = Phase(
        "t.plan", ("no_such_module_x:f", f"{m}:Child.gone", f"{m}:Child.size", f"{m}:Child.load", f"{m}:Child.later")
    )
    engine = PatchEngine([phase])
    (plan,) = engine.dry_run()
    assert [(c.state, c.defined) for c in plan.candidates] == [
        (NO_MODULE, None),
        (MISSING, None),
        (NOT_FUNCTION, None),
        (USED, f"{m}:Base.load"),
        (FALLBACK, f"{m}:Child.later"),
    ]
    assert plan.wrapped == [f"{m}:Child.load"] and plan.cell == "D" and plan.status == "ok"
    assert "load" not in vars(mod.Child) and not hasattr(mod.Base.load, MARK) and engine.applied == {}
    (every,) = PatchEngine([Phase("t.all", phase.targets, mode="all")]).dry_run()
    assert every.cell == "D+E" and [c.state for c in every.candidates][3:] == [USED, USED]
