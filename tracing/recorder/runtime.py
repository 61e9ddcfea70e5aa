"""The per-process tracing runtime: run directory, journal, private TracerProvider, open phases.

Started lazily, at the first phase of a process (for a rank: ``Scheduler.__init__``, once its
ranks are known), so processes that import SGLang but never start anything write nothing.
Never the global TracerProvider: SGLang's ``--enable-trace`` sets that one.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import Status, StatusCode

from .. import files, keys, other_processes, process_state
from ..journal import records
from ..journal.layout import JOURNAL_DIR, STATUS_DIR
from ..journal.writer import JournalWriter, write_wait_s
from ..redact import redact, redact_text
from . import exporters, gpu, launch, otlp
from .identity import IDENTITY_KEYS, Identity

log = logging.getLogger("sglang_phasetrace")


_UNSET = object()
T = TypeVar("T")


def hexid(value: int | None, width: int = 16) -> str | None:
    return None if value is None else format(value, f"0{width}x")


def new_run_dir() -> Path:
    """A fresh run directory's path (not created): absolute, so children in another cwd share it,
    and not resolved, so a link in place of the base is seen (and refused) when it is created; in
    a base others may write in (``/tmp``), inside this user's private subdirectory (``home``)."""
    base = home(Path(os.environ.get(keys.ENV_BASE_DIR) or keys.DEFAULT_BASE_DIR))
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
    node = launch.node_from_env()
    named = launch.launch_from_env() if node is not None else None
    if named is not None:  # every node of the launch: one directory on a shared filesystem
        run_id = "launch-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in named[0])[:96]
    return Path(os.path.abspath(base / run_id))


def home(base: Path) -> Path:
    """``files.home_of(base)`` (one ``lstat``) on a helper thread, waited for up to the journal's write
    bound: a base on a filesystem that does not answer holds no ``import sglang``; it is ``base``,
    where the run directory then fails to be made, said once."""
    try:
        return _within(write_wait_s(), lambda: files.home_of(base), lambda _: None, base)
    except OSError:
        return base


class TracingOff(Exception):
    """Tracing could not start in this process (said once, naming the path); it stays off."""


def sglang_version() -> str | None:
    module = sys.modules.get("sglang.version") or sys.modules.get("sglang")
    return getattr(module, "__version__", None)


def machine_attrs(gpu_id: int | None) -> dict[str, str]:
    """What the history's launch fingerprint needs to know of this machine, stamped on the resource
    so whoever reads the run later (another host) has it: the torch version, where torch is already
    imported (in every SGLang process by the time tracing starts; never imported here), and the GPU
    model the driver names (``gpu.device_model``: a file read, no NVML)."""
    out = {}
    torch_version = getattr(sys.modules.get("torch"), "__version__", None)
    if torch_version:
        out[keys.TORCH_VERSION] = str(torch_version)
    model = gpu.device_model(gpu_id)
    if model:
        out[keys.DEVICE_MODEL] = model
    return out


class PrivateIdGenerator(IdGenerator):
    """Span and trace ids from the OS, not the global ``random``: SGLang seeds ``random`` with the
    same ``--random-seed`` in every rank, after which OTel's default generator hands every rank the
    same span ids (parents then resolve to the wrong process and collectors drop "duplicates")."""

    _random = random.SystemRandom()

    def __init__(self) -> None:
        self.trace_id: int | None = None  # a multi-node launch named by its environment: every node's

    def generate_span_id(self) -> int:
        while True:
            span_id = self._random.getrandbits(64)
            if span_id:
                return span_id

    def generate_trace_id(self) -> int:
        if self.trace_id is not None:
            return self.trace_id
        while True:
            trace_id = self._random.getrandbits(128)
            if trace_id:
                return trace_id


class OpenPhases:
    """Spans started and not yet ended in this process, with their latest progress."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # RLock: signal handlers may run on a thread holding it
        self.spans: dict[int, Span] = {}
        self.progress: dict[int, dict[str, Any]] = {}

    def add(self, span: Span) -> None:
        with self.lock:
            self.spans[span.get_span_context().span_id] = span

    def remove(self, span: ReadableSpan) -> None:
        with self.lock:
            sid = span.get_span_context().span_id
            self.spans.pop(sid, None)
            self.progress.pop(sid, None)

    def listed(self) -> list[tuple[Span, dict[str, Any]]]:
        """The open phases, outermost first, each with a copy of its latest progress."""
        with self.lock:
            return [(s, dict(self.progress.get(sid, {}))) for sid, s in self.spans.items()]


class StampProcessor(SpanProcessor):
    """Stamps this process's identity (rank, pid, host) on every span as it starts."""

    def __init__(self, identity: Identity) -> None:
        self.identity = identity

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        span.set_attributes(self.identity.attributes())


class JournalProcessor(SpanProcessor):
    """Writes ``begin`` when a span starts and ``end`` when it ends; keeps the open-phase registry."""

    def __init__(self, writer: JournalWriter, open_phases: OpenPhases) -> None:
        self.writer = writer
        self.open = open_phases
        self.begun: dict[int, dict[str, Any]] = {}  # span id -> attributes its begin record holds
        self.failed = False

    # Never raises: the SDK calls processors in turn without catching, and the exporter comes after.
    def on_start(self, span: Span, parent_context: Any = None) -> None:
        try:
            self._begin(span)
        except Exception as exc:
            self._failed(exc)

    def on_end(self, span: ReadableSpan) -> None:
        try:
            self._end(span)
        except Exception as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        if not self.failed:
            self.failed = True
            log.warning("sglang-phasetrace: journal record not written: %r", exc)

    def _begin(self, span: Span) -> None:
        ctx = span.get_span_context()
        attrs = {k: v for k, v in (span.attributes or {}).items() if k not in IDENTITY_KEYS}
        self.begun[ctx.span_id] = attrs
        self.open.add(span)
        parent = hexid(span.parent.span_id) if span.parent else None
        self.writer.write(
            records.begin(
                span.start_time,
                hexid(ctx.span_id),
                parent,
                hexid(ctx.trace_id, 32),
                span.name,
                attrs,
                threading.current_thread().name,
            )
        )

    def _end(self, span: ReadableSpan) -> None:
        self.open.remove(span)
        attrs = dict(span.attributes or {})
        if attrs.get(keys.INCOMPLETE):
            status = "incomplete"
        elif span.status.status_code is StatusCode.ERROR:
            status = "error"
        else:
            status = "ok"
        error = None
        for event in reversed(span.events):
            if event.name == "exception":
                a = event.attributes or {}
                error = records.error(
                    a.get("exception.type"), a.get("exception.message"), a.get("exception.stacktrace")
                )
                break
        else:
            if status != "ok" and span.status.description:
                error = records.error(None, span.status.description)
        sid = span.get_span_context().span_id
        begun = self.begun.pop(sid, {})
        changed = {k: v for k, v in attrs.items() if k not in IDENTITY_KEYS and begun.get(k, _UNSET) != v}
        self.writer.write(records.end(span.end_time, hexid(sid), status, changed, error))


class Contained(SpanProcessor):
    """The exporter's processor with its exceptions caught (said once): a failing exporter never
    costs a phase its span or its journal records."""

    def __init__(self, inner: SpanProcessor) -> None:
        self.inner = inner
        self.failed = False

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        try:
            self.inner.on_start(span, parent_context)
        except Exception as exc:
            self._failed(exc)

    def on_end(self, span: ReadableSpan) -> None:
        try:
            self.inner.on_end(span)
        except Exception as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        if not self.failed:
            self.failed = True
            log.warning("sglang-phasetrace: span exporter failed: %r", exc)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class Runtime:
    """One per process (reset in a forked child). ``start()`` is idempotent and cheap after the first."""

    def __init__(self, boot_ns: int) -> None:
        self.boot_ns = boot_ns
        self.identity = Identity()
        self.open = OpenPhases()
        self.lock = threading.RLock()
        self.started = False
        self.off: str | None = None  # why tracing could not start here (then it never does)
        self.ready = False  # the start is over: the launch serves (``recorder.serving``); the hot path from here
        self.initialised = False  # a rank's own init is done (``Scheduler.__init__`` returned); it may not serve yet
        self.awaiting: Any = None  # ``serving.Awaiting``: an initialised rank's wait for its launch to serve
        self.announces: Path | None = None  # a launcher: the file it creates when the launch serves
        self.root: Span | None = None
        self.ids = PrivateIdGenerator()
        self.planned_run_dir: str | None = None  # the run directory activation chose (before the launch was known)
        self.run_dir: Path | None = None
        self.journal: JournalWriter | None = None
        self.provider: TracerProvider | None = None
        self.tracer: Any = None
        self._pending: list[dict] = []  # records (warnings) from before the journal existed
        self.on_ready: list[Any] = []  # callables run once this process is ready
        self.services_started = False  # ``recorder.start``: heartbeats, exit flush, stack dumps
        self.runtime_calls: dict[str, list[int]] = {}  # phase -> [calls, ns] of wrappers run after ready
        self._calls_lock = threading.Lock()

    def start(self) -> Runtime:
        """Create the run directory and journal, and the provider; raises ``TracingOff`` (at once,
        every later call) when the run directory cannot be written, said once. What runs beside
        them (heartbeats, the exit flush, stack dumps) is started by ``recorder.start``."""
        if self.started:
            return self
        if self.off is not None:
            raise TracingOff(self.off)
        with self.lock:
            if self.started:
                return self
            if self.off is not None:
                raise TracingOff(self.off)
            run_dir = os.environ.get(keys.ENV_RUN_DIR)
            if not run_dir:
                run_dir = os.environ[keys.ENV_RUN_DIR] = str(new_run_dir())  # children inherit it
            self.run_dir = Path(run_dir)
            resource = self.resource()
            try:
                self.journal = self._open_journal(resource)
            except OSError as exc:
                self._turn_off(exc)
                raise TracingOff(self.off) from None
            self._pending.insert(0, self._identity_record())
            for record in self._pending:
                self.journal.write(record)
            self._pending.clear()
            # Not shut down by the SDK at exit: that joins the export thread for up to 30 s, however
            # long a collector that does not answer holds it; lifecycle flushes with a bound instead.
            provider = TracerProvider(
                resource=resource, sampler=ALWAYS_ON, id_generator=self.ids, shutdown_on_exit=False
            )
            # Neither the journal nor the exporter raises: a failure of one never stops the other.
            provider.add_span_processor(JournalProcessor(self.journal, self.open))
            provider.add_span_processor(StampProcessor(self.identity))
            exporter = exporters.processor_from_env(self.warn)
            if exporter is not None:
                provider.add_span_processor(Contained(exporter))
            self.provider = provider
            self.tracer = provider.get_tracer("sglang-phasetrace", "0.1.0")
            self.started = True
        return self

    def _open_journal(self, resource: Resource) -> JournalWriter:
        """``_make_journal`` on a helper thread, waited for up to the journal's write bound
        (``write_wait_s``): a run directory on a filesystem that does not answer (a
        hard-mounted NFS server gone) turns tracing off here, said once, instead of holding
        SGLang's start. Should the helper come back later, what it made is removed."""
        return _within(write_wait_s(), lambda: self._make_journal(resource), _discard, self.run_dir)

    def _make_journal(self, resource: Resource) -> JournalWriter:
        """The run directory (0700, its base checked before and after: ``files.check_home``), and this
        process's journal holding its first record: a directory that cannot take one record is not used
        at all, but for a full disk, which will: there the record is held back like any later one, and
        written once there is room (the file exists, empty, until then; readers pass it over)."""
        ident, run_dir = self.identity, self.run_dir
        files.check_home(run_dir.parent)
        files.private_dir(run_dir)
        files.check_home(run_dir.parent)  # not swapped for someone else's while we created it
        files.private_dir(run_dir / STATUS_DIR)
        journal = JournalWriter(files.private_dir(run_dir / JOURNAL_DIR) / f"{ident.host}-{ident.pid}.jsonl")
        first = records.process(
            time.time_ns(),
            ident.pid,
            os.getppid(),
            ident.host,
            run_dir.name,
            self.boot_ns,
            dict(resource.attributes),
            start_ticks=other_processes.start_ticks(ident.pid),
            boot_id=other_processes.boot_id(),
        )
        try:
            journal.write_or_raise(first)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                journal.write(first)  # held back (said once, by the launcher for its launch)
                return journal
            _discard(journal)  # empty: no half-made process for readers
            raise OSError(exc.errno, exc.strerror, str(journal.path)) from None
        return journal

    def _turn_off(self, exc: OSError) -> None:
        """One warning naming the path and the reason; nothing kept, nothing retried."""
        if isinstance(exc, files.UnsafeDirectory):
            self.off = f"refusing run directory {self.run_dir}: {exc}"
        elif exc.errno is not None:
            self.off = f"cannot write {exc.filename or self.run_dir}: [Errno {exc.errno}] {exc.strerror}"
        else:
            self.off = f"cannot write {self.run_dir}: {exc}"
        self._pending.clear()
        log.warning("sglang-phasetrace: %s; tracing off in this process", self.off)

    def resource(self) -> Resource:
        attrs = {
            "service.name": os.environ.get("OTEL_SERVICE_NAME") or "sglang",
            keys.RUN_ID: self.run_dir.name if self.run_dir else "",
            **self.identity.attributes(),
            **launch.node_attrs(),
        }
        version = sglang_version()
        if version:
            attrs[keys.SGLANG_VERSION] = version
        attrs.update(machine_attrs(self.identity.ranks.get("gpu")))
        return Resource.create(attrs)

    def _identity_record(self) -> records.Record:
        return records.identity(time.time_ns(), self.identity.label, self.identity.role, self.identity.attributes())

    def set_identity(self, role: str | None = None, **ranks: Any) -> None:
        """Merge newly known ranks/role; journaled once the journal exists (else at its start)."""
        if self.identity.update(role=role, **ranks) and self.journal is not None:
            self.write(self._identity_record())

    def mark_ready(self) -> None:
        """The process root ended well, serving began: send spans now (without waiting) and run the
        ready hooks (the hot-path patches come off, heartbeats leave the journal, the watchdog stops)."""
        if self.ready:
            return
        self.ready = True
        otlp.flush_async(self.provider)
        for callback in self.on_ready:
            try:
                callback()
            except Exception as exc:
                log.warning("sglang-phasetrace: ready hook failed: %r", exc)

    def count_runtime_call(self, phase: str, cost_ns: int) -> None:
        """A patched wrapper ran after ready (while serving): count it, with what tracing added to
        the call, for the status file. Init-only patches are off by then, so this stays empty
        unless something re-runs init work (a re-capture, a weight reload) or a copy escaped."""
        with self._calls_lock:
            entry = self.runtime_calls.setdefault(phase, [0, 0])
            entry[0] += 1
            entry[1] += cost_ns

    def runtime_calls_summary(self) -> dict[str, dict[str, float]]:
        with self._calls_lock:
            return {phase: {"calls": n, "cost_us": round(ns / 1e3, 1)} for phase, (n, ns) in self.runtime_calls.items()}

    def write(self, record: dict) -> None:
        """Journal ``record`` (never raises); held until the journal exists; dropped if it never will."""
        if self.journal is not None:
            self.journal.write(record)
        elif self.off is None and len(self._pending) < 1000:
            self._pending.append(record)

    def warn(self, message: str) -> None:
        """One warning line on stderr (through logging) and a ``warning`` record in the journal."""
        log.warning("sglang-phasetrace: %s", message)
        self.write(records.warning(time.time_ns(), redact(message)))


def _discard(journal: JournalWriter) -> None:
    journal.close()
    with contextlib.suppress(OSError):
        os.unlink(journal.path)


def _within(seconds: float, make: Callable[[], T], undo: Callable[[T], None], where: Path | None) -> T:
    """``make()`` on a helper thread, waited for ``seconds``: what it returns or raises, or
    ``OSError(ETIMEDOUT)`` naming ``where`` when it has not returned by then. It may still: then
    ``undo`` gets what it made, since nobody else will use it."""
    lock, done, box = threading.Lock(), threading.Event(), []

    def run() -> None:
        try:
            result: tuple[bool, Any] = (True, make())
        except Exception as exc:
            result = (False, exc)
        with lock:
            late = bool(box)  # the caller gave up and went on
            if not late:
                box.append(result)
                done.set()
        if late and result[0]:
            undo(result[1])

    threading.Thread(target=run, name="phasetrace-open", daemon=True).start()
    done.wait(seconds)
    with lock:
        if not box:
            box.append((False, None))
            raise OSError(errno.ETIMEDOUT, f"no answer within {seconds:g} s", str(where))
    ok, value = box[0]
    if ok:
        return value
    raise value


def end_incomplete(span: Span, reason: str, end_ns: int | None = None) -> None:
    """End ``span`` as *incomplete*: it was still running when its process stopped waiting for it."""
    span.set_attribute(keys.INCOMPLETE, True)
    span.set_status(Status(StatusCode.ERROR, redact_text(reason)))
    span.end(end_time=end_ns)


def current() -> Runtime:
    """This process's runtime (created, not started, on first use; a forked child makes its own)."""
    return process_state.part("runtime", _new_runtime)


def _new_runtime() -> Runtime:
    """Born when the process booted (a forked child: when it was forked), as the boot hook noted it."""
    boot = sys.modules.get("_phasetrace_boot")
    return Runtime(process_state.STATE.boot_ns or getattr(boot, "BOOT_NS", None) or time.time_ns())
