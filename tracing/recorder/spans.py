"""Phases as spans: start one, add events and progress, end it ok / with an error / incomplete.

A phase's parent is the current span if there is one, else this process's root (the rank root
or the launch root), else the launcher's span from ``TRACEPARENT`` — so phases run on other
threads, or after the root ended, still land in the one trace of the launch.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .. import keys
from ..journal import records
from ..redact import redact, redact_text
from . import runtime, start

log = logging.getLogger("sglang_phasetrace")
_PROPAGATOR = TraceContextTextMapPropagator()

AttrValue = str | bool | int | float


def clean_attrs(attrs: dict[str, Any] | None) -> dict[str, AttrValue | list]:
    """OTel-legal, redacted attribute values (others become strings; None is dropped)."""
    out: dict[str, Any] = {}
    for key, value in (attrs or {}).items():
        value = redact(value, key)
        if value is None:
            continue
        if isinstance(value, (str, bool, int, float)):
            out[key] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (str, bool, int, float)) for v in value):
            out[key] = list(value)
        else:
            out[key] = str(value)
    return out


def exception_attrs(exc: BaseException) -> dict[str, str]:
    """The OTel ``exception`` event's attributes, redacted (``span.record_exception`` would put the
    message and the traceback, secrets included, into the journal and onto the wire)."""
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable exception>"
    try:
        stack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except Exception:
        stack = ""
    module, qualname = type(exc).__module__, type(exc).__qualname__
    kind = f"{module}.{qualname}" if module and module != "builtins" else qualname  # as OTel names it
    return {
        "exception.type": kind,
        "exception.message": redact_text(message),
        "exception.stacktrace": redact_text(stack),
        "exception.escaped": "False",
    }


def launch_context() -> otel_context.Context | None:
    carrier = {"traceparent": os.environ.get(keys.ENV_TRACEPARENT, "")}
    if not carrier["traceparent"]:
        return None
    return _PROPAGATOR.extract(carrier)


def export_traceparent(span: trace.Span) -> None:
    """Make ``span`` the parent of every rank this process spawns from now on."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    if "traceparent" in carrier:
        os.environ[keys.ENV_TRACEPARENT] = carrier["traceparent"]


class PhaseSpan:
    """A started phase. Every method is safe to call in any state and never raises."""

    __slots__ = ("_token", "rt", "span")

    def __init__(self, rt: runtime.Runtime, span: trace.Span, token: object | None) -> None:
        self.rt, self.span, self._token = rt, span, token

    @property
    def span_id(self) -> int:
        return self.span.get_span_context().span_id

    def set(self, attrs: dict[str, Any]) -> None:
        try:
            self.span.set_attributes(clean_attrs(attrs))
        except Exception:
            log.debug("sglang-phasetrace: set attributes failed", exc_info=True)

    def event(self, name: str, attrs: dict[str, Any] | None = None) -> None:
        try:
            clean = clean_attrs(attrs)
            self.span.add_event(name, clean)
            self.rt.write(records.event(time.time_ns(), runtime.hexid(self.span_id), name, clean))
        except Exception:
            log.debug("sglang-phasetrace: event failed", exc_info=True)

    def progress(self, **fields: Any) -> None:
        """Latest progress (``done``, ``total``, ``unit``…): read by heartbeats, not journaled."""
        with self.rt.open.lock:
            self.rt.open.progress.setdefault(self.span_id, {}).update(fields)

    def end(self, exc: BaseException | None = None, incomplete: str | None = None, end_ns: int | None = None) -> None:
        try:
            self.detach()
            if not self.span.is_recording():  # already ended (e.g. by a signal handler)
                return
            if incomplete:
                runtime.end_incomplete(self.span, incomplete, end_ns)
                return
            if exc is not None:
                attrs = exception_attrs(exc)
                self.span.add_event("exception", attrs)
                description = f"{type(exc).__name__}: {attrs['exception.message']}"
                self.span.set_status(Status(StatusCode.ERROR, description))
            self.span.end(end_time=end_ns)
        except Exception:
            log.debug("sglang-phasetrace: end failed", exc_info=True)

    def detach(self) -> None:
        """Stop being the current span of the context it was started in (it may go on running)."""
        token, self._token = self._token, None
        if token is not None:
            try:
                otel_context.detach(token)
            except Exception:  # ended on another thread or context: nothing to restore
                pass


def _parent_context(rt: runtime.Runtime) -> otel_context.Context | None:
    if trace.get_current_span().get_span_context().is_valid:
        return None  # the current context
    if rt.root is not None:
        return trace.set_span_in_context(rt.root)
    return launch_context()


def start_phase(
    name: str,
    attrs: dict[str, Any] | None = None,
    *,
    start_ns: int | None = None,
    attach: bool = True,
    root: bool = False,
) -> PhaseSpan | None:
    """Start a phase span in this process; ``root=True`` makes it the process root. None on failure."""
    try:
        rt = start.start()
        ctx = launch_context() if root else _parent_context(rt)
        span = rt.tracer.start_span(name, context=ctx, attributes=clean_attrs(attrs), start_time=start_ns)
        if root:
            rt.root = span
        token = otel_context.attach(trace.set_span_in_context(span)) if attach else None
        return PhaseSpan(rt, span, token)
    except runtime.TracingOff:  # said once, when the runtime failed to start
        return None
    except Exception as exc:
        log.warning("sglang-phasetrace: could not start phase %s: %s", name, redact_text(repr(exc)))
        return None
