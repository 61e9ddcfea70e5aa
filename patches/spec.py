"""What a patch is: a phase (one span name) and its ordered candidate targets, as plain data.

A target is ``"module:Qual.name"``. ``mode="first"``: the candidates are alternative names of one
step across SGLang releases, newest first, and only the first that resolves is wrapped.
``mode="all"``: every candidate that resolves is wrapped (sub-steps that exist in some releases).
A target written ``"*:attr"`` is resolved on classes found at run time (the loaded model classes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["call", "generator", "rank", "launch", "ready", "collective"]


@dataclass
class Call:
    """What a wrapper saw, handed to a phase's hooks: bound arguments by name, never by position."""

    arguments: dict[str, Any]
    instance: Any = None  # ``self`` (or ``cls``) for methods, None for functions
    state: dict[str, Any] = field(default_factory=dict)  # scratch shared by the hooks of one call

    def arg(self, name: str, default: Any = None) -> Any:
        return self.arguments.get(name, default)


Hook = Callable[[Call], "dict[str, Any] | None"]
ExitHook = Callable[[Call, Any], "dict[str, Any] | None"]
ItemHook = Callable[[Call, Any], "dict[str, Any] | None"]


@dataclass(frozen=True)
class Phase:
    """One traced step. Hooks return span attributes and must be cheap; they run inside our
    error containment, so a failing hook costs its attributes, never SGLang's call."""

    name: str
    targets: tuple[str, ...]
    mode: Literal["first", "all"] = "first"
    kind: Kind = "call"
    enter: Hook | None = None  # attributes at start (rank keys here set the process identity)
    exit: ExitHook | None = None  # attributes at the end, once the result is known
    each: ItemHook | None = None  # generators: per item; returns an event's attributes, or None
    after_ready: Literal["label", "skip"] = "label"  # when it runs again once the rank is ready
    init_only: bool = False  # unpatched when the process is ready (hot-path targets)
    required: bool = False  # warn at ready if no candidate resolved in this process
    ends_root: bool = False  # "launch": the process root ends when this call returns

    def __post_init__(self) -> None:
        for target in self.targets:
            if target.count(":") != 1:
                raise ValueError(f"phase {self.name}: target {target!r} is not 'module:qualname'")


def split(target: str) -> tuple[str, str]:
    module, _, qualname = target.partition(":")
    return module, qualname
