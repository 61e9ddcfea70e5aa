"""The journal's records, as writers make them: one constructor per kind. The schema readers check
them against, and the list of kinds and fields, is ``journal.schema``. Stdlib only: every traced
process imports it."""

from __future__ import annotations

from typing import Any

SCHEMA_VERSION = 1


Record = dict[str, Any]


def process(
    t: int,
    pid: int,
    ppid: int | None,
    host: str,
    run_id: str,
    boot_t: int | None,
    resource: dict[str, Any],
    *,
    start_ticks: int | None = None,
    boot_id: str | None = None,
) -> Record:
    return {
        "v": SCHEMA_VERSION,
        "kind": "process",
        "t": t,
        "pid": pid,
        "ppid": ppid,
        "host": host,
        "run_id": run_id,
        "boot_t": boot_t,
        "resource": resource,
        "start_ticks": start_ticks,
        "boot_id": boot_id,
    }


def identity(t: int, label: str, role: str, attrs: dict[str, Any]) -> Record:
    return {"kind": "identity", "t": t, "label": label, "role": role, "attrs": attrs}


def begin(t: int, span: str, parent: str | None, trace: str, name: str, attrs: dict[str, Any], thread: str) -> Record:
    return {
        "kind": "begin",
        "t": t,
        "span": span,
        "parent": parent,
        "trace": trace,
        "name": name,
        "attrs": attrs,
        "thread": thread,
    }


def event(t: int, span: str, name: str, attrs: dict[str, Any]) -> Record:
    return {"kind": "event", "t": t, "span": span, "name": name, "attrs": attrs}


def end(t: int, span: str, status: str, attrs: dict[str, Any], error: dict[str, Any] | None = None) -> Record:
    record: Record = {"kind": "end", "t": t, "span": span, "status": status, "attrs": attrs}
    if error is not None:
        record["error"] = error
    return record


def error(exc_type: str | None, message: str | None, stack: str | None = None) -> dict[str, Any]:
    """The ``error`` of an ``end`` record."""
    return {"type": exc_type, "message": message, "stack": stack}


def heartbeat(
    t: int,
    seq: int,
    pid: int,
    label: str,
    ready: bool,
    interval_s: float,
    phases: list[dict[str, Any]],
    cpu_s: float,
    rss: int,
    threads: int,
    *,
    collective: dict[str, Any] | None = None,
    collectives: dict[str, int] | None = None,
    runtime_calls: dict[str, Any] | None = None,
    gpu: dict[str, Any] | None = None,
    dt_s: float | None = None,
    main: dict[str, Any] | None = None,
    majflt: int | None = None,
    io_b: int | None = None,
    child_cpu_s: float | None = None,
) -> Record:
    """Empty ``collective``/``collectives``/``runtime_calls``/``gpu`` are left out; activity
    figures (``dt_s`` …) when known, zeros included (a zero says "idle", absence "cannot tell")."""
    record: Record = {
        "kind": "heartbeat",
        "t": t,
        "seq": seq,
        "pid": pid,
        "label": label,
        "ready": ready,
        "interval_s": interval_s,
        "phases": phases,
        "cpu_s": cpu_s,
        "rss": rss,
        "threads": threads,
    }
    for key, value in (
        ("collective", collective),
        ("collectives", collectives),
        ("runtime_calls", runtime_calls),
        ("gpu", gpu),
    ):
        if value:
            record[key] = value
    for key, value in (
        ("dt_s", dt_s),
        ("main", main),
        ("majflt", majflt),
        ("io_b", io_b),
        ("child_cpu_s", child_cpu_s),
    ):
        if value is not None:
            record[key] = value
    return record


def unwritten(heartbeat: Record, trouble: dict[str, Any]) -> Record:
    """The status file's copy of ``heartbeat`` when journal writes fail (``JournalWriter.trouble``)."""
    return {**heartbeat, "journal_unwritten": trouble}


def collective(
    t: int, edge: str, op: str, group: str, seq: int, *, span: str | None = None, dur_s: float | None = None
) -> Record:
    record: Record = {"kind": "collective", "t": t, "edge": edge, "op": op, "group": group, "seq": seq}
    if edge == "enter":
        record["span"] = span
    if dur_s is not None:
        record["dur_s"] = dur_s
    return record


def diagnosis(
    t: int,
    finding: str,
    label: str,
    pid: int,
    phase: str | None,
    since_s: float,
    message: str,
    waiting: dict[str, str],
    stacks: list[str],
    *,
    evidence: dict[str, dict[str, Any]] | None = None,
) -> Record:
    """``evidence``: label -> what that rank waits on (``journal.waits_on.Evidence`` as builtins)."""
    record = {
        "kind": "diagnosis",
        "t": t,
        "finding": finding,
        "label": label,
        "pid": pid,
        "phase": phase,
        "since_s": since_s,
        "message": message,
        "waiting": waiting,
        "stacks": stacks,
    }
    if evidence:
        record["evidence"] = evidence
    return record


def warning(t: int, message: str) -> Record:
    return {"kind": "warning", "t": t, "message": message}


def exit(t: int, pid: int, host: str, label: str, code: int | None, signal: str | None) -> Record:
    return {"kind": "exit", "t": t, "pid": pid, "host": host, "label": label, "code": code, "signal": signal}


def launch(
    t: int,
    trace: str,
    *,
    local_trace: str | None,
    launch_id: str | None,
    source: str,
    node_rank: int,
    nnodes: int,
    rendezvous: str | None,
) -> Record:
    return {
        "kind": "launch",
        "t": t,
        "trace": trace,
        "local_trace": local_trace,
        "launch_id": launch_id,
        "source": source,
        "node_rank": node_rank,
        "nnodes": nnodes,
        "rendezvous": rendezvous,
    }
