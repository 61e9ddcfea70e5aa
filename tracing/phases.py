"""What happens when a phase begins and ends, for each kind of phase: the one place that knows.

``patches/`` describes phases as data (name, kind, hooks) and its wrappers call ``enter(phase,
call)`` when a patched function starts, then ``handle.item(x)`` per item of a generator and
``handle.exit(result, exc)`` at the end. Nothing here imports ``patches/``: a phase and a call are
read through the small protocols below. What each kind does (``USES`` lists the phase fields it
reads; ``patches/spec.py`` refuses, at import, a phase that sets any other):

* ``call``: a span under the current one; ``generator``: the same, opened at the first ``next()``
  and never made current (the consumer runs between items). After ready, ``after_ready="skip"``
  makes them go quiet; otherwise their spans are labelled ``phasetrace.after_ready``.
* ``rank``: the process root ``rank tp1 … @ host:pid`` from process start, and a closed
  ``rank.bootstrap`` span for the time before it (imports, spawn). When its call returns the rank is
  *initialised*; its root ends (it is ready) when its launch serves (``recorder.serving``): at once
  for an ``Engine``, at "ready to roll" for ``launch_server`` (until then: the ``INITIALISED`` event
  on the root, heartbeats in the journal, collectives recorded, watched).
* ``warmup``: a forward pass of an initialised rank whose launch does not serve yet, traced like
  ``call`` (its collectives recorded); untraced before (inside an init phase) and once serving.
* ``launch``: the launcher's root ``sglang.launch`` from process start; ranks spawned from then on
  inherit it (``TRACEPARENT``) and the launcher's watchdog starts. It ends when the call returns
  if the phase ``ends_root`` (``Engine.__init__``), else at server ready (a ``ready`` phase). Either
  way the launch then serves: the root says so (``SERVING``) and its ranks are told.
* ``ready``: when its exit hook reports ``ready``, the launch root ends and the process is ready;
  when the call fails or never saw ready, the launch root ends as an error.
* ``loop``: no span: a process of the launch that is neither a rank nor the launcher (its root
  ``process`` started when it was spawned: ``adopt``) enters its loop: its own start is
  done; it serves when its launch does (like an initialised rank), at once for an ``Engine``.
* ``collective``: no span: a ``collective`` journal record in and out (``tracing.recorder.collective_log``),
  until ready; an initialised rank records only those of its warm-up passes (not its scheduler
  loop's, which polls its peers thousands of times a second).

Hooks run inside containment: one that raises costs its own report only, said once per phase
and hook. ``enter`` never raises: None means "run the call untraced". SGLang's exceptions are
recorded on the span and propagate unchanged (the wrapper re-raises them).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import keys, process_state
from .recorder import collective_log, handover, launch, otlp, runtime, serving, spans
from .recorder.identity import ranks_from_attrs

log = logging.getLogger("sglang_phasetrace")

# kind -> the optional phase fields its lifecycle reads (``name``, ``targets``, ``mode``, ``enter``,
# ``init_only`` and ``required`` mean the same for every kind).
USES: dict[str, frozenset[str]] = {
    "call": frozenset({"exit", "after_ready"}),
    "generator": frozenset({"exit", "each", "after_ready"}),
    "rank": frozenset({"exit"}),
    "launch": frozenset({"exit", "ends_root"}),
    "ready": frozenset({"exit"}),
    "warmup": frozenset({"exit"}),
    "collective": frozenset(),  # its enter hook names the group: ``{"group": ...}``
    "loop": frozenset(),
}
LAUNCH_ROOT = "sglang.launch"
# The launcher's side (``tracing.launcher.lifecycle``), loaded in a process once it becomes a launcher:
# ``bootstrap`` sets it; this module never imports it, so a rank loads no reader or verdict code.
LAUNCHER_SIDE: Callable[[], Any] | None = None
RANK_BOOTSTRAP = "rank.bootstrap"


@dataclass(frozen=True)
class Report:
    """What a hook means, when it means more than span attributes (a plain dict means those)."""

    attrs: Mapping[str, Any] = field(default_factory=dict)  # span attributes
    progress: Mapping[str, Any] | None = None  # how far the phase is (done, total, unit, …): for heartbeats
    event: tuple[str, Mapping[str, Any]] | None = None  # an event on the span (a generator's item)
    ready: bool = False  # a ``ready`` phase's exit: the server said it is ready
    teardown: bool = False  # SGLang is about to kill this process's tree: say now which rank ended first


_NOTHING = Report()


class PhaseSpec(Protocol):
    """What the lifecycle reads of a phase (``patches.spec.Phase``)."""

    name: str
    kind: str
    after_ready: str
    ends_root: bool
    enter: Callable[..., Any] | None
    exit: Callable[..., Any] | None
    each: Callable[..., Any] | None


class CallInfo(Protocol):
    """What the lifecycle reads of a call (``patches.spec.Call``); hooks read the rest."""

    target: str
    instance: Any


def enter(phase: PhaseSpec, call: CallInfo) -> Handle | None:
    """A phase begins; None when it is not traced (quiet after ready, re-entered, or our failure)."""
    start = time.perf_counter_ns()
    try:
        rt = runtime.current()
        if phase.kind == "collective":
            return _enter_collective(rt, phase, call, start)
        if phase.kind == "loop":
            _enter_loop(rt)
            return None
        if phase.kind == "warmup" and not serving.warmup_pass(rt):  # not between init and serving
            if rt.ready:
                rt.count_runtime_call(phase.name, time.perf_counter_ns() - start)
            return None
        guard = (phase.name, id(call.instance))
        in_flight = _in_flight()
        # quiet after ready, or re-entered (a super() chain, a nested alias): the outer span covers it
        if (rt.ready and phase.after_ready == "skip") or guard in in_flight:
            if rt.ready:
                rt.count_runtime_call(phase.name, time.perf_counter_ns() - start)
            return None
        report = _run(phase, "enter", phase.enter, call)
        attrs: dict[str, Any] = {keys.PHASE: phase.name, keys.TARGET: call.target, **report.attrs}
        if report.teardown and process_state.STATE.launcher_watchdog is not None and LAUNCHER_SIDE is not None:
            if alive := LAUNCHER_SIDE().last_words():
                attrs[keys.ALIVE_AT_TEARDOWN] = alive  # these ranks end in the teardown, not before it
        if rt.ready:
            attrs[keys.AFTER_READY] = True
        span = _start(rt, phase, attrs)
        if span is None:
            return None
        if report.progress:
            span.progress(**report.progress)
        in_flight.add(guard)
        if phase.kind == "warmup":  # its collectives are recorded (``_enter_collective``)
            process_state.STATE.local.warmup = getattr(process_state.STATE.local, "warmup", 0) + 1
        return Handle(rt, phase, call, span, guard, time.perf_counter_ns() - start if rt.ready else None)
    except Exception as exc:
        log.warning("sglang-phasetrace: %s not traced: %r", phase.name, exc)
        return None


class Handle:
    """One traced call in flight. ``runtime_ns``: begun after ready, what tracing has cost it so far
    (the status file shows runtime calls and their cost); None for calls during init."""

    __slots__ = ("call", "guard", "phase", "rt", "runtime_ns", "span")

    def __init__(
        self,
        rt: runtime.Runtime,
        phase: PhaseSpec,
        call: CallInfo,
        span: spans.PhaseSpan,
        guard: tuple,
        runtime_ns: int | None = None,
    ) -> None:
        self.rt, self.phase, self.call, self.span, self.guard = rt, phase, call, span, guard
        self.runtime_ns = runtime_ns

    def item(self, item: Any) -> None:
        """A generator phase yielded ``item``."""
        start = time.perf_counter_ns()
        report = _run(self.phase, "each", self.phase.each, self.call, item)
        if report.attrs:
            self.span.set(dict(report.attrs))
        if report.progress:
            self.span.progress(**report.progress)
        if report.event:
            self.span.event(report.event[0], dict(report.event[1]))
        if self.runtime_ns is not None:
            self.runtime_ns += time.perf_counter_ns() - start

    def exit(self, result: Any, exc: BaseException | None) -> None:
        """The call returned ``result`` or raised ``exc`` (a generator: exhausted, closed or raised)."""
        start = time.perf_counter_ns()
        try:
            self._exit(result, exc)
        except Exception as error:
            log.warning("sglang-phasetrace: ending %s failed: %r", self.phase.name, error)
        finally:
            if self.runtime_ns is not None:
                self.rt.count_runtime_call(self.phase.name, self.runtime_ns + time.perf_counter_ns() - start)

    def _exit(self, result: Any, exc: BaseException | None) -> None:
        rt, kind = self.rt, self.phase.kind
        _in_flight().discard(self.guard)
        if kind == "warmup":
            process_state.STATE.local.warmup -= 1
        report = _run(self.phase, "exit", self.phase.exit, self.call, result)
        if report.attrs:
            self.span.set(dict(report.attrs))
            ranks = ranks_from_attrs(report.attrs)
            if ranks:
                rt.set_identity(**ranks)
        owns_root = rt.root is self.span.span
        if kind == "launch" and owns_root and exc is None and not self.phase.ends_root:
            self.span.detach()
            return  # launch_server: the root ends at ready (or as incomplete at exit)
        if kind == "rank" and owns_root and exc is None:
            rt.initialised = True
            marker = serving.marker_of(rt)
            if marker is not None:  # launch_server: initialised; the start ends when the launch serves
                self.span.detach()
                self.span.event(keys.INITIALISED)
                serving.await_launch(rt, marker, lambda since: _ready(rt, end_ns=since))
                return
        if exc is None and owns_root:  # the process's start is over: it serves
            self.span.detach()
            _ready(rt)
            return
        self.span.end(exc)
        if exc is not None and owns_root:  # the process failed: it is about to be torn down
            otlp.flush(rt.provider)
        if exc is None and kind == "ready" and report.ready:
            _ready(rt)
        elif kind == "ready" and rt.root is not None:
            failed = exc or RuntimeError("the server did not become ready (warmup failed)")
            spans.PhaseSpan(rt, rt.root, None).end(failed)


class _Collective:
    """An init collective in flight: its ``collective`` exit record when the call returns."""

    __slots__ = ("entry",)

    def __init__(self, entry: dict[str, Any]) -> None:
        self.entry = entry

    def item(self, item: Any) -> None:
        pass

    def exit(self, result: Any, exc: BaseException | None) -> None:
        try:
            collective_log.exit(self.entry)
        except Exception as error:
            log.debug("sglang-phasetrace: collective exit not recorded: %r", error)


def _enter_collective(rt: runtime.Runtime, phase: PhaseSpec, call: CallInfo, start: int) -> _Collective | None:
    """Recorded only while the process initialises and once tracing started; after ready a call
    reached through a copy not yet restored is counted, with its cost."""
    if rt.ready:
        rt.count_runtime_call(phase.name, time.perf_counter_ns() - start)
        return None
    if not rt.started:
        return None
    if rt.initialised and not getattr(process_state.STATE.local, "warmup", 0):
        return None  # an initialised rank's scheduler loop, between warm-up passes: not init work
    op = call.target.rpartition(".")[2].rpartition(":")[2]
    try:
        group = str(_run(phase, "enter", phase.enter, call).attrs.get("group", "?"))
        entry = collective_log.enter(op, group)
    except Exception as exc:
        log.debug("sglang-phasetrace: collective %s not recorded: %r", op, exc)
        return None
    return None if entry is None else _Collective(entry)


_ADOPT = threading.Lock()


def adopt(rt: runtime.Runtime) -> None:
    """A process of the launch that is neither a rank nor the launcher (the detokenizer, a tokenizer
    worker …: ``handover.role_of`` its ``multiprocessing`` target) gets its role and its root
    ``process``, from its process start: as soon as its target is known (``bootstrap``), or at its
    first phase, whichever comes first (importing SGLang while its target is unpickled takes most of
    its start). Under ``launch_server`` its start ends when the launch serves, whether or not it was
    seen entering its loop. Nothing for any other process."""
    if rt.root is not None:
        return
    target = getattr(multiprocessing.current_process(), "_target", None)
    role = handover.role_of(target) if target is not None else None
    if role is None:
        return
    with _ADOPT:  # the other caller may be starting the root now: its phases wait for it, then hang under it
        if rt.root is not None or rt.identity.role not in ("process", role):
            return
        rt.set_identity(role=role)
        _start_process(rt)


def _start_process(rt: runtime.Runtime) -> None:
    attrs = {keys.PHASE: keys.PHASE_PROCESS, keys.ROLE: rt.identity.role}
    if spans.start_phase(rt.identity.process_name, attrs, start_ns=rt.boot_ns, root=True, attach=False) is None:
        return
    marker = serving.marker_of(rt)
    if marker is not None:
        serving.await_launch(rt, marker, lambda since: _ready(rt, end_ns=since), initialised=False)


def _enter_loop(rt: runtime.Runtime) -> None:
    """The process enters its loop (``loop`` kind): its own start is done (``INITIALISED`` on its
    root); it is ready now, or when its launch serves (``adopt``)."""
    if rt.ready or rt.initialised or rt.root is None or rt.identity.role in ("rank", "launcher", "process"):
        return
    spans.PhaseSpan(rt, rt.root, None).event(keys.INITIALISED)
    rt.initialised = True
    if rt.awaiting is None:
        _ready(rt)


def _start(rt: runtime.Runtime, phase: PhaseSpec, attrs: dict[str, Any]) -> spans.PhaseSpan | None:
    """The span of a phase that begins; the process root (and what comes with it) for root kinds."""
    ranks = ranks_from_attrs(attrs)
    if phase.kind == "rank":
        rt.set_identity(role="rank", **ranks)
        root = spans.start_phase(rt.identity.rank_name, attrs, start_ns=rt.boot_ns, root=True)
        if root is not None:  # the time before this rank's first phase: imports, spawn
            boot = spans.start_phase(RANK_BOOTSTRAP, {keys.PHASE: RANK_BOOTSTRAP}, start_ns=rt.boot_ns, attach=False)
            if boot is not None:
                boot.end()
        return root
    if phase.kind == "launch" and rt.root is None:
        return _launch_root(rt, attrs, attach=True)
    if rt.root is None and os.environ.get(keys.ENV_LAUNCHER):  # spawned by a traced launcher
        adopt(rt)
    if ranks:
        rt.set_identity(**ranks)
    return spans.start_phase(phase.name, attrs, attach=phase.kind != "generator")


def _launch_root(rt: runtime.Runtime, attrs: dict[str, Any], attach: bool) -> spans.PhaseSpan | None:
    """The launcher's root ``sglang.launch``, its ranks' parent (TRACEPARENT), and its watchdog;
    for a node of a multi-node launch, the launch's identity first and the cross-node view after."""
    node = launch.begin(attrs)  # a multi-node launch: which node, and the launch's trace id if known
    if node is not None and node.launch_id is not None:
        rt.ids.trace_id = launch.trace_id_of(node.launch_id)
        if not rt.started and os.environ.get(keys.ENV_RUN_DIR) == rt.planned_run_dir:
            os.environ[keys.ENV_RUN_DIR] = str(runtime.new_run_dir())  # named by the launch: one for all nodes
    rt.set_identity(role="launcher", **ranks_from_attrs(attrs))
    root = spans.start_phase(LAUNCH_ROOT, attrs, start_ns=rt.boot_ns, root=True, attach=attach)
    if root is None:
        return None
    spans.export_traceparent(root.span)
    serves_later = attrs.get(keys.PHASE) == keys.PHASE_LAUNCH_SERVER and (node is None or node.rank == 0)
    serving.tell_ranks(rt, serves_later)
    if LAUNCHER_SIDE is not None:
        workers_serve = (lambda since: _ready(rt, end_ns=since)) if serves_later else None
        LAUNCHER_SIDE().start(rt, node, attrs, lambda: _ready(rt, serves=False), workers_serve)
    return root


def start_launch_root(phase: str, ends_when_ranks_ready: bool, attrs: dict[str, Any] | None = None) -> None:
    """The launcher's root, when tracing starts inside SGLang's entry point (the plugin path: the
    ``launch`` wrapper is not on the stack; ``attrs``: what the plugin read of the server args). It
    ends at "ready to roll" as usual for ``launch_server``; for the engine, once the launcher's
    watchdog sees every rank ready."""
    rt = runtime.current()
    if rt.root is not None:
        return
    _launch_root(rt, {**(attrs or {}), keys.PHASE: phase}, attach=False)
    dog = process_state.STATE.launcher_watchdog
    if dog is not None and ends_when_ranks_ready and dog.when_ranks_ready is None:
        dog.when_ranks_ready = lambda: _ready(rt)


def _ready(rt: runtime.Runtime, serves: bool = True, end_ns: int | None = None) -> None:
    """The process is ready: its root ends well (saying that serving began, where it did; a rank
    that learnt it from its launcher: when the launch began to serve), a launcher tells its ranks,
    and the ready hooks run (``Runtime.mark_ready``)."""
    root = rt.root
    end_ns = time.time_ns() if end_ns is None else max(end_ns, getattr(root, "start_time", None) or 0)
    if root is not None and root.is_recording():
        if serves:
            root.set_attribute(keys.SERVING, True)
        spans.PhaseSpan(rt, root, None).end(end_ns=end_ns)
    if serves:
        serving.announce(rt, end_ns)
    rt.mark_ready()


def _run(phase: PhaseSpec, name: str, hook: Callable[..., Any] | None, *args: Any) -> Report:
    """Run a phase hook; a failure costs its report only, and is said once per phase and hook."""
    if hook is None:
        return _NOTHING
    try:
        value = hook(*args)
        if value is None:
            return _NOTHING
        if isinstance(value, Report):
            return value
        if isinstance(value, Mapping):
            return Report(attrs=value)
        raise TypeError(f"returned {type(value).__name__}, not a dict of attributes or a Report")
    except Exception as exc:
        if process_state.say_once(("hook", phase.name, name)):
            log.warning("sglang-phasetrace: %s hook of %s failed: %r", name, phase.name, exc)
        return _NOTHING


def _in_flight() -> set[tuple[str, int]]:
    """This thread's phases in flight, as (phase, id(instance)): the re-entry guard."""
    local = process_state.STATE.local
    try:
        return local.phases
    except AttributeError:
        local.phases = set()
        return local.phases
