"""The wrappers the engine installs: the call, with ``tracing.phases`` told when a phase begins and ends.

Plain ``functools.wraps`` functions, not proxies: they pickle by qualified name (spawned ranks
may pickle what they reference) and keep ``__wrapped__``. Our code never raises into SGLang:
``phases.enter`` returns None on any failure of ours and the original runs untraced; SGLang's own
exceptions propagate unchanged (recorded on the span first).
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

from ..tracing import phases
from .spec import Call, Phase

MARK = "__phasetrace__"  # on every wrapper: the name of its phase


def make_wrapper(phase: Phase, func: Callable, target: str, is_method: bool) -> Callable:
    try:
        sig: inspect.Signature | None = inspect.signature(func)
    except (TypeError, ValueError):
        sig = None

    def call_of(args: tuple, kwargs: dict) -> Call:
        instance = args[0] if is_method and args else None
        return Call(None, instance, target, signature=sig, args=args, kwargs=kwargs)

    if phase.kind == "generator":

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            inner = func(*args, **kwargs)
            handle = phases.enter(phase, call_of(args, kwargs))  # at the first next()
            if handle is None:
                return (yield from inner)
            try:
                for item in inner:
                    handle.item(item)
                    yield item
            except BaseException as exc:
                handle.exit(None, None if isinstance(exc, GeneratorExit) else exc)
                raise
            handle.exit(None, None)
    else:
        # Inside a torch.compile'd region (SGLang compiles model forwards, which call collectives,
        # during init) Dynamo folds ``torch.compiler.is_compiling()`` to True: the bare call, no
        # graph break. ``torch`` is the module as imported when the target was wrapped, if it was.
        torch = sys.modules.get("torch")

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if torch is not None and torch.compiler.is_compiling():
                return func(*args, **kwargs)
            handle = phases.enter(phase, call_of(args, kwargs))
            if handle is None:
                return func(*args, **kwargs)
            try:
                result = func(*args, **kwargs)
            except BaseException as exc:
                handle.exit(None, exc)
                raise
            handle.exit(result, None)
            return result

    setattr(wrapper, MARK, phase.name)
    return wrapper
