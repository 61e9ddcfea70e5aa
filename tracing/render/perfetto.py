"""Chrome/Perfetto trace-event JSON: one process track per rank, named, phases as slices.

Finished phases are complete (``X``) events; a phase that never ended is a lone ``B`` (begin)
event, which Perfetto and chrome://tracing show as "did not end". Timestamps are microseconds
from the run's first span (the absolute start is in ``otherData``), so nesting is exact. The
verdict's culprit phase (its rank only) is named ``⚠ STALL <phase>`` (the verdict's word), in category
``phasetrace.verdict``, colored ``terrible``, the verdict in its args; waiting peers are not
marked, their open phase's args say ``phasetrace.waiting_for``. The verdict is in ``otherData``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from ..reader.forked_helper import job
from ..verdicts.diagnose import Finding
from .jaeger import _TEXTS, VERDICT_ATTR, WAITING_ATTR
from .jsonout import LONG, dumps, list_items

try:  # numbers and text never fail it: ``jsonout.dumps`` without its fallback, per span
    from orjson import dumps as _fast
except ImportError:  # pragma: no cover
    _fast = dumps
from .lane_jobs import Held, lanes_held, resolve
from .lanes import Lane, Layout
from .verdict import Marks, marks

VERDICT_CATEGORY = "phasetrace.verdict"


def _args(attrs: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, (str, int, float, bool)) or v is None else str(v) for k, v in attrs.items()}


def to_perfetto(lay: Layout, found: list[Finding] | None = None) -> dict[str, Any]:
    """``found``: the run's verdicts (``verdicts.findings``), root cause first; its culprit is flagged.
    The document ``perfetto_chunks`` writes, as a value."""
    return json.loads(b"".join(resolve(perfetto_chunks(lay, found))))


def perfetto_chunks(lay: Layout, found: list[Finding] | None = None) -> Iterator[bytes | Held]:
    """``to_perfetto``'s document as compact JSON (``jsonout.dumps`` of it), each lane's events made
    by the process holding its spans (``lanes_held``: a split run's child writes its own into the file)."""
    flags = marks(lay, found or [])
    arg = (lay.start, flags.culprit, flags.word, flags.waiting_for, flags.waits_on)
    yield b'{"traceEvents":['
    for n, pieces in enumerate(lanes_held(lay, lane_events, arg)):
        if n:
            yield b","
        for _, chunk in pieces:
            yield chunk
    other = {
        "run": lay.run.run_id,
        "start_unix_ns": lay.start,
        **({"verdict": next(iter(flags.culprit.values()))} if flags.culprit else {}),
    }
    yield b'],"displayTimeUnit":"ms","otherData":' + dumps(other) + b"}"


@job
def lane_events(lane: Lane, arg: tuple) -> list[tuple[int, bytes]]:
    """The lane's trace events, as JSON list items (``lanes_map``: in the process holding its spans)."""
    start, culprit, word, waiting_for, waits_on = arg
    flags = Marks(culprit, word, waiting_for, waits_on)
    proc = lane.proc
    pid = lane.index + 1
    flagged = f"\u26a0 {flags.word} " if any(b.uid in flags.culprit for b in lane.bars) else ""  # seen collapsed
    events: list[dict[str, Any] | bytes | tuple[bytes, bytes, bytes]] = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": pid,
            "args": {"name": f"{flagged}{lane.label} ({proc.host}:{proc.pid})"},
        },
        {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": lane.index}},
        {"ph": "M", "name": "process_labels", "pid": pid, "args": {"labels": lane.state}},  # initialised, serving …
    ]
    marked = flags.culprit.keys() | flags.waiting_for.keys() | flags.waits_on.keys()
    texts = _TEXTS
    threads: dict[str, int] = {}
    for bar in lane.bars:
        s = bar.span
        tid = threads.get(s.thread)
        if tid is None:
            tid = threads[s.thread] = len(threads) + 1
            events.append(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": s.thread or "thread"}}
            )
        aid, end, cat = bar.attrs_id, s.end, s.phase
        if (
            end is not None
            and not s.error
            and not s.events
            and aid >= 0
            and type(cat) is str
            and not (marked and bar.uid in marked)
        ):
            key = (aid, s.status)
            args = _ok_args.get(key)
            if args is None:
                if len(_ok_args) > 100_000:
                    _ok_args.clear()
                plain = _args(s.attrs)
                plain["status"] = s.status
                args = _ok_args[key] = dumps(plain)
            fields = (
                texts[s.name],
                texts[cat],
                _fast({"ts": (s.start - start) / 1000, "dur": (bar.end - s.start) / 1000})[1:-1],
                pid,
                tid,
            )
            events.append(_X_EVENT % (*fields, args) if len(args) < LONG else (_X_HEAD % fields, args, b"}"))
            continue
        args = _args(s.attrs)
        args["status"] = s.status
        if s.error:
            args["error"] = str(s.error.get("message") or s.error.get("type"))
        if bar.uid in flags.waiting_for:
            args[WAITING_ATTR] = flags.waiting_for[bar.uid]
        args.update(flags.waits_on.get(bar.uid, {}))
        event = {
            "name": s.name,
            "cat": s.phase,
            "ph": "X",
            "ts": (s.start - start) / 1000,
            "dur": (bar.end - s.start) / 1000,
            "pid": pid,
            "tid": tid,
            "args": args,
        }
        verdict = flags.culprit.get(bar.uid)
        if verdict:
            args[VERDICT_ATTR] = verdict
            event.update(name=f"\u26a0 {flags.word} {s.phase}", cat=f"{VERDICT_CATEGORY},{s.phase}", cname="terrible")
        if bar.open:
            del event["dur"]
            event["ph"] = "B"
        events.append(event)
        events.extend(
            {
                "name": e.get("name") or "event",
                "ph": "i",
                "s": "t",
                "pid": pid,
                "tid": tid,
                "ts": (e["t"] - start) / 1000,
                "args": _args(e.get("attrs") or {}),
            }
            for e in s.events
        )
    return [(0, list_items([dumps(e) if type(e) is dict else e for e in events]))]


# A phase that ended well with nothing to flag (most of them): ``dumps`` of its event, byte for
# byte, its args' JSON made once per ``Bar.attrs_id`` and status, the rest formatted in place.
_X_EVENT = b'{"name":%b,"cat":%b,"ph":"X",%b,"pid":%d,"tid":%d,"args":%b}'
_X_HEAD = _X_EVENT.removesuffix(b"%b}")  # before long args (``jsonout.list_items``)
_ok_args: dict[tuple[int, str], bytes] = {}
