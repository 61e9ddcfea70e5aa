"""What a patch is: a phase (one span name) and its ordered candidate targets, as plain data.

A target is ``"module:Qual.name"``. ``mode="first"``: the candidates are alternative names of one
step across SGLang releases, newest first, and only the first that resolves is wrapped.
``mode="all"``: every candidate that resolves is wrapped (sub-steps that exist in some releases).
A target written ``"*:attr"`` is resolved on classes found at run time (the loaded model classes).

What a phase of each kind does when it begins and ends is ``tracing.phases``'s; which fields a
kind reads is its ``USES`` table, and a phase that sets a field its kind ignores fails here, at
import. Hooks return what they mean: a dict of span attributes, or a ``Report`` (attributes plus
progress, an event, readiness).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..tracing.phases import USES, Report

Kind = Literal["call", "generator", "rank", "launch", "ready", "warmup", "collective", "loop"]
HookResult = "dict[str, Any] | Report | None"


class Call:
    """What a wrapper saw, handed to a phase's hooks: the arguments by name (bound on first use,
    never read by position), ``self`` (or ``cls``) for methods, and the target that was called."""

    __slots__ = ("_args", "_arguments", "_kwargs", "_signature", "_state", "instance", "target")

    def __init__(
        self,
        arguments: dict[str, Any] | None = None,
        instance: Any = None,
        target: str = "",
        *,
        signature: inspect.Signature | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        self._arguments, self.instance, self.target = arguments, instance, target
        self._signature, self._args, self._kwargs = signature, args, kwargs
        self._state: dict[str, Any] | None = None

    @property
    def arguments(self) -> dict[str, Any]:
        if self._arguments is None:
            sig = self._signature
            self._arguments = dict(sig.bind_partial(*self._args, **(self._kwargs or {})).arguments) if sig else {}
        return self._arguments

    @property
    def state(self) -> dict[str, Any]:
        """Scratch shared by the hooks of one call (private to them: the lifecycle never reads it)."""
        if self._state is None:
            self._state = {}
        return self._state

    def arg(self, name: str, default: Any = None) -> Any:
        return self.arguments.get(name, default)


Hook = Callable[[Call], HookResult]
ExitHook = Callable[[Call, Any], HookResult]  # (call, result)
ItemHook = Callable[[Call, Any], HookResult]  # (call, item)


@dataclass(frozen=True)
class Phase:
    """One traced step. Hooks must be cheap; they run inside our error containment, so a failing
    hook costs its report, never SGLang's call."""

    name: str
    targets: tuple[str, ...]
    mode: Literal["first", "all"] = "first"
    kind: Kind = "call"
    enter: Hook | None = None  # at start (rank keys among its attributes set the process identity)
    exit: ExitHook | None = None  # at the end, once the result is known
    each: ItemHook | None = None  # generators: per item
    after_ready: Literal["label", "skip"] = "label"  # call/generator: when it runs again once ready
    init_only: bool = False  # unpatched when the process is ready (hot-path targets)
    required: bool = False  # warn at ready if no candidate resolved in this process
    ends_root: bool = False  # launch: the process root ends when this call returns (else at ready)

    def __post_init__(self) -> None:
        def fail(why: str) -> None:
            raise ValueError(f"phase {self.name!r}: {why}")

        if self.kind not in USES:
            fail(f"kind {self.kind!r} is not one of {', '.join(USES)}")
        if self.mode not in ("first", "all"):
            fail(f"mode {self.mode!r} is not 'first' or 'all'")
        if self.after_ready not in ("label", "skip"):
            fail(f"after_ready {self.after_ready!r} is not 'label' or 'skip'")
        given = {
            "exit": self.exit is not None,
            "each": self.each is not None,
            "after_ready": self.after_ready != "label",
            "ends_root": self.ends_root,
        }
        ignored = [name for name, is_set in given.items() if is_set and name not in USES[self.kind]]
        if ignored:
            fail(f"a {self.kind!r} phase ignores {', '.join(ignored)} (see tracing.phases.USES)")
        for target in self.targets:
            if target.count(":") != 1:
                fail(f"target {target!r} is not 'module:qualname'")


def split(target: str) -> tuple[str, str]:
    module, _, qualname = target.partition(":")
    return module, qualname


__all__ = ["Call", "Hook", "Kind", "Phase", "Report", "split"]
