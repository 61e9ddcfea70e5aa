"""The wrappers the engine installs: a few lines each, all tracing behind ``_enter``/``_Active``.

Plain ``functools.wraps`` functions, not proxies: they pickle by qualified name (spawned ranks
may pickle what they reference) and keep ``__wrapped__``. Our code never raises into SGLang:
``_enter`` returns None on any failure and the original runs untraced; SGLang's own exceptions
propagate unchanged (recorded on the span first).
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..tracing import collectives, exporters, keys, runtime, spans, watchdog
from ..tracing.identity import ranks_from_attrs
from .spec import Call, Phase

log = logging.getLogger("sglang_phasetrace")
MARK = "__phasetrace__"
_local = threading.local()
_failed_hooks: set[tuple[str, str]] = set()
_made: list[tuple[Phase, Callable]] = []  # every wrapper made in this process, for restore_copies


def make_wrapper(phase: Phase, func: Callable, target: str, is_method: bool) -> Callable:
    try:
        sig: inspect.Signature | None = inspect.signature(func)
    except (TypeError, ValueError):
        sig = None
    # Collectives run inside model forwards that SGLang may torch.compile during init. Dynamo folds
    # ``torch.compiler.is_compiling()`` to True while tracing, leaving the bare call (no graph
    # break). Looked up on the module at call time: torch may still be importing now.
    torch = sys.modules.get("torch")
    if phase.kind == "collective":
        op = target.rpartition(".")[2].rpartition(":")[2]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if torch is not None and torch.compiler.is_compiling():
                return func(*args, **kwargs)
            entry = _enter_collective(phase, op, sig, is_method, args, kwargs)
            if entry is None:
                return func(*args, **kwargs)
            try:
                return func(*args, **kwargs)
            finally:
                collectives.exit(entry)
    elif phase.kind == "generator":
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            inner = func(*args, **kwargs)
            active = _enter(phase, target, sig, is_method, args, kwargs)  # at the first next()
            if active is None:
                return (yield from inner)
            try:
                for item in inner:
                    active.item(item)
                    yield item
            except BaseException as exc:
                active.exit(None, None if isinstance(exc, GeneratorExit) else exc)
                raise
            active.exit(None, None)
    else:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if torch is not None and torch.compiler.is_compiling():
                return func(*args, **kwargs)
            active = _enter(phase, target, sig, is_method, args, kwargs)
            if active is None:
                return func(*args, **kwargs)
            try:
                result = func(*args, **kwargs)
            except BaseException as exc:
                active.exit(None, exc)
                raise
            active.exit(result, None)
            return result
    setattr(wrapper, MARK, phase.name)
    _made.append((phase, wrapper))
    return wrapper


def restore_copies(predicate: Callable[[Phase], bool]) -> int:
    """Point every module-level copy of a matching wrapper back at its original; return how many.

    ``from X import f`` and ``import *`` run after X was patched copy the wrapper (``torch.distributed``
    re-exports the c10d collectives that way, and SGLang's scheduler loop calls them through it),
    and the engine's undo knows only the copies that existed when it patched. One pass over every
    module namespace (a few tens of ms at 200 k names), so bootstrap runs it on a thread at ready.
    """
    originals = {id(w): (w, w.__wrapped__) for phase, w in _made if predicate(phase)}
    ids = frozenset(originals)
    restored = 0
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        try:
            if type(namespace) is not dict or ids.isdisjoint(map(id, namespace.values())):
                continue  # the common case, checked in C
            for name, value in list(namespace.items()):
                hit = originals.get(id(value))
                if hit is not None and hit[0] is value:
                    namespace[name] = hit[1]
                    restored += 1
        except RuntimeError:  # the namespace changed under us (an import on another thread): skip it
            continue
    return restored


def _hook(phase: Phase, name: str, hook: Callable | None, *args: Any) -> Any:
    """Run a phase hook; a failure costs its attributes only, and is logged once per phase."""
    if hook is None:
        return None
    try:
        return hook(*args)
    except Exception as exc:
        if (phase.name, name) not in _failed_hooks:
            _failed_hooks.add((phase.name, name))
            log.warning("sglang-phasetrace: %s hook of %s failed: %r", name, phase.name, exc)
        return None


def _active_keys() -> set:
    keys_ = getattr(_local, "keys", None)
    if keys_ is None:
        keys_ = _local.keys = set()
    return keys_


def _enter_collective(phase: Phase, op: str, sig: inspect.Signature | None, is_method: bool,
                      args: tuple, kwargs: dict) -> dict | None:
    """Record entering an init collective (no span); None when not recording or on any failure."""
    start = time.perf_counter_ns()
    try:
        rt = runtime.current()
        if rt.ready:  # reached through a copy not (yet) restored at ready: counted, with its cost
            rt.count_runtime_call(phase.name, time.perf_counter_ns() - start)
            return None
        if not rt.started:
            return None
        arguments = dict(sig.bind_partial(*args, **kwargs).arguments) if sig else {}
        attrs = _hook(phase, "enter", phase.enter, Call(arguments, args[0] if is_method and args else None)) or {}
        return collectives.enter(op, str(attrs.get("group", "?")))
    except Exception as exc:
        log.debug("sglang-phasetrace: collective %s not recorded: %r", op, exc)
        return None


def _enter(phase: Phase, target: str, sig: inspect.Signature | None, is_method: bool,
           args: tuple, kwargs: dict) -> _Active | None:
    start = time.perf_counter_ns()
    try:
        rt = runtime.current()
        instance = args[0] if is_method and args else None
        guard = (phase.name, id(instance))
        quiet = rt.ready and phase.after_ready == "skip" and phase.kind in ("call", "generator")
        # re-entry (super() chain, nested alias): the outer span covers it
        if quiet or guard in _active_keys():
            if rt.ready:
                rt.count_runtime_call(phase.name, time.perf_counter_ns() - start)
            return None
        arguments = dict(sig.bind_partial(*args, **kwargs).arguments) if sig else {}
        call = Call(arguments, instance)
        attrs: dict[str, Any] = {keys.PHASE: phase.name, keys.TARGET: target}
        attrs.update(_hook(phase, "enter", phase.enter, call) or {})
        if rt.ready:
            attrs[keys.AFTER_READY] = True
        handle = _start(rt, phase, attrs)
        if handle is None:
            return None
        if call.state.get("progress"):  # an enter hook may say how far the enclosing work is
            handle.progress(**call.state["progress"])
        _active_keys().add(guard)
        return _Active(rt, phase, call, handle, guard, time.perf_counter_ns() - start if rt.ready else None)
    except Exception as exc:
        log.warning("sglang-phasetrace: %s not traced: %r", phase.name, exc)
        return None


def _start(rt: runtime.Runtime, phase: Phase, attrs: dict[str, Any]) -> spans.PhaseSpan | None:
    ranks = ranks_from_attrs(attrs)
    if phase.kind == "rank":
        rt.set_identity(role="rank", **ranks)
        handle = spans.start_phase(rt.identity.rank_name, attrs, start_ns=rt.boot_ns, root=True)
        if handle is not None:  # the time before this rank's first phase: imports, spawn
            boot = spans.start_phase("rank.bootstrap", {keys.PHASE: "rank.bootstrap"},
                                     start_ns=rt.boot_ns, attach=False)
            if boot is not None:
                boot.end()
        return handle
    if phase.kind == "launch" and rt.root is None:
        rt.set_identity(role="launcher", **ranks)
        handle = spans.start_phase("sglang.launch", attrs, start_ns=rt.boot_ns, root=True)
        if handle is not None:
            spans.export_traceparent(handle.span)
            watchdog.start_in_launcher(rt)
        return handle
    if ranks:
        rt.set_identity(**ranks)
    return spans.start_phase(phase.name, attrs, attach=phase.kind != "generator")


class _Active:
    """One traced call in flight. ``runtime_ns``: begun after ready, what tracing has cost it so far
    (the status file shows runtime calls and their cost); None for calls during init."""

    __slots__ = ("call", "guard", "handle", "phase", "rt", "runtime_ns")

    def __init__(self, rt: runtime.Runtime, phase: Phase, call: Call, handle: spans.PhaseSpan,
                 guard: tuple, runtime_ns: int | None = None) -> None:
        self.rt, self.phase, self.call, self.handle, self.guard = rt, phase, call, handle, guard
        self.runtime_ns = runtime_ns

    def item(self, item: Any) -> None:
        start = time.perf_counter_ns()
        event = _hook(self.phase, "each", self.phase.each, self.call, item)
        progress = self.call.state.get("progress")
        if progress:
            self.handle.progress(**progress)
        if event:
            self.handle.event(*event)
        if self.runtime_ns is not None:
            self.runtime_ns += time.perf_counter_ns() - start

    def exit(self, result: Any, exc: BaseException | None) -> None:
        start = time.perf_counter_ns()
        try:
            self._exit(result, exc)
        finally:
            if self.runtime_ns is not None:
                self.rt.count_runtime_call(self.phase.name, self.runtime_ns + time.perf_counter_ns() - start)

    def _exit(self, result: Any, exc: BaseException | None) -> None:
        try:
            _active_keys().discard(self.guard)
            attrs = _hook(self.phase, "exit", self.phase.exit, self.call, result)
            if attrs:
                self.handle.set(attrs)
                ranks = ranks_from_attrs(attrs)
                if ranks:
                    self.rt.set_identity(**ranks)
            owns_root = self.rt.root is self.handle.span
            if self.phase.kind == "launch" and owns_root and exc is None and not self.phase.ends_root:
                self.handle.detach()
                return  # launch_server: the root ends at ready (or as incomplete at exit)
            self.handle.end(exc)
            if exc is not None and owns_root:  # the rank failed: its process is about to be torn down
                exporters.flush(self.rt.provider, 2.0)
            if exc is None and (owns_root or (self.phase.kind == "ready" and self.call.state.get("ready"))):
                self._ready()
            elif self.phase.kind == "ready" and self.rt.root is not None:
                spans.PhaseSpan(self.rt, self.rt.root, None).end(
                    exc or RuntimeError("the server did not become ready (warmup failed)"))
        except Exception as error:
            log.warning("sglang-phasetrace: ending %s failed: %r", self.phase.name, error)

    def _ready(self) -> None:
        root = self.rt.root
        if root is not None and root.is_recording():
            spans.PhaseSpan(self.rt, root, None).end(end_ns=time.time_ns())
        self.rt.mark_ready()
