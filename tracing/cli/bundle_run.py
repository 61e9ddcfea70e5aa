"""One run's part of a bug-report bundle (``phasetrace bundle``): its journals, status files and
stack dumps, each redacted and read within a cap, only as regular files inside the run directory
(never through a link; journals as every reader reads them: ``journal.tail.JournalTail``); and
what is made of the read: the timeline as text, the HTML report, the diagnosis, the server arguments
and the per-rank phase table."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from pathlib import Path
from typing import Any

from ..journal.layout import JOURNAL_DIR, STACKS_DIR, STATUS_DIR
from ..journal.tail import JournalTail, _loads, read_regular
from ..journal.writer import dumps
from ..reader.view import RunView
from ..redact import redact, redact_text
from ..render.html_report import render_report
from ..render.lanes import Lane, Layout, layout
from ..render.term import clean
from ..render.timeline_text import render_timeline
from ..render.units import duration
from ..render.verdict import headline, line, rank_lanes, state
from ..verdicts import hints, postmortem
from ..verdicts.findings import by_process, findings, gone_ranks
from .bundle_archive import Bundle
from .command import open_run

MAX_STACK = 1 << 20  # bytes of one stack file kept (its end: the latest dumps)
MAX_STATUS = 1 << 20
TABLE_RANKS = 32  # rows of the per-rank table in SUMMARY.md (all of them in RUN/phases.md)
TABLE_PHASES = 10
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,200}$")


def _files(run: Path, sub: str, suffix: str, bundle: Bundle) -> list[Path]:
    """Regular files ``RUN/sub/*suffix`` of safe names; a linked folder, links and odd names are skipped (said)."""
    folder = run / sub
    try:
        if stat.S_ISLNK(os.lstat(folder).st_mode):
            bundle.missing.append(f"{clean(folder)}: a symbolic link, not followed")
            return []
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    except OSError as exc:
        bundle.missing.append(f"{clean(folder)}: {exc.strerror or exc}")
        return []
    out = []
    for entry in entries:
        if not entry.name.endswith(suffix):
            continue
        if not SAFE_NAME.match(entry.name) or not entry.is_file(follow_symlinks=False):
            bundle.missing.append(f"{clean(redact_text(entry.path))}: not a regular file of a plain name, skipped")
            continue
        out.append(Path(entry.path))
    return out


def _read(path: Path, bundle: Bundle, limit: int = -1, tail: bool = False) -> bytes | None:
    try:
        if tail and limit > 0:
            size_ = os.lstat(path).st_size
            data = read_regular(path, max(0, size_ - limit), limit)
            return (
                (f"[truncated: the first {size_ - limit} bytes are not kept]\n".encode() + data)
                if size_ > limit
                else data
            )
        return read_regular(path, 0, limit)
    except OSError as exc:
        bundle.missing.append(f"{clean(redact_text(str(path)))}: {exc.strerror or exc}")
        return None


def copy_journal(path: Path, bundle: Bundle) -> bytes:
    """The journal at ``path`` redacted, read a piece at a time as readers read it: a line over
    ``journal.tail.LINE_MAX`` and whatever lies past ``journal.tail.journal_max()`` are left out (said in
    SUMMARY.md), so a huge or sparse file costs neither memory nor the archive's size."""
    tail = JournalTail(path)
    data = b"".join(redact_journal(lines) for lines, _ in tail.pieces(final=True))
    bundle.missing += [clean(redact_text(problem)) for problem in tail.problems]
    return data


def redact_journal(lines: list[bytes]) -> bytes:
    """Each line re-written: a record through ``redact``, anything else (a torn line) through ``redact_text``."""
    out = []
    for raw in lines:
        if not raw.strip():
            continue
        try:
            record = _loads(raw)
        except ValueError:
            record = None
        if isinstance(record, dict):
            out.append(dumps(redact(record)))
        else:
            out.append(redact_text(raw.decode("utf-8", "replace")))
    return ("\n".join(out) + "\n").encode("utf-8", "replace") if out else b""


def _redact_json_file(data: bytes) -> bytes:
    try:  # orjson: a depth limit, no NaN (the stdlib's parser recurses, and takes them)
        return (json.dumps(redact(_loads(data)), indent=1, ensure_ascii=False) + "\n").encode()
    except ValueError:
        return redact_text(data.decode("utf-8", "replace"), limit=None).encode()


def server_args(run: RunView) -> list[dict[str, Any]]:
    """Each distinct ``sglang.server_args`` a process recorded (redacted), with the processes that did."""
    seen: dict[str, dict[str, Any]] = {}
    for proc in run.processes:
        for span in proc.spans.values():
            raw = span.attrs.get("sglang.server_args")
            if not isinstance(raw, str):
                continue
            try:
                value: Any = _loads(raw)
            except ValueError:
                value = raw
            value = redact(value)
            key = json.dumps(value, sort_keys=True, default=str)
            entry = seen.setdefault(key, {"processes": [], "server_args": value})
            if proc.label not in entry["processes"]:
                entry["processes"].append(proc.label)
    return list(seen.values())


def _top_phases(lane: Lane) -> dict[str, float]:
    out: dict[str, float] = {}
    for bar in lane.bars:
        if bar.depth == 1:
            out[bar.key] = out.get(bar.key, 0.0) + bar.seconds
    return out


def phase_table(lay: Layout, verdicts: dict[int, Any], limit: int | None) -> str:
    """Markdown: one row per rank (those a verdict names first), state, time, top-level phase durations."""
    lanes = rank_lanes(lay)
    per = {lane.index: _top_phases(lane) for lane in lanes}
    columns: list[str] = []
    for phases in per.values():
        columns += [key for key in phases if key not in columns]
    shown_cols = columns[:TABLE_PHASES]
    ordered = sorted(lanes, key=lambda lane: (lane.proc.pid not in verdicts, lane.index))
    rows = ordered if limit is None else ordered[:limit]

    def cell(value: Any) -> str:
        return clean(redact_text(str(value))).replace("|", "\\|")

    head = ["rank", "host", "pid", "state", "total", "stopped in", *shown_cols]
    out = ["| " + " | ".join(cell(h) for h in head) + " |", "|" + "---|" * len(head)]
    for lane in rows:
        finding = verdicts.get(lane.proc.pid)
        where = lane.where if lane.state not in ("ready", "serving") else None
        values = [
            lane.label,
            lane.proc.host,
            lane.proc.pid,
            state(finding) if finding else lane.state,
            duration(lane.root.seconds) if lane.root else "",
            where.key if where else "",
            *(duration(per[lane.index].get(key)) for key in shown_cols),
        ]
        out.append("| " + " | ".join(cell(v) for v in values) + " |")
    if limit is not None and len(ordered) > limit:
        out.append(f"\n… {len(ordered) - limit} more ranks: every rank is in `phases.md`.")
    if len(columns) > len(shown_cols):
        out.append(f"\n({len(columns) - len(shown_cols)} more top-level phases in `timeline.txt`.)")
    return "\n".join(out) + "\n"


def diagnosis_text(lay: Layout, found: list[Any]) -> list[str]:
    """Verdicts (as of the run's last record) each with its hint, the root cause, then what the
    watchdog recorded during the run."""
    out = []
    for finding in found:
        out.append(line(finding))
        out += hints.for_finding(finding, lay.run)
    root = postmortem.root_cause_line(lay.run, gone_ranks(lay.run))
    if root:
        out.append(root)
    recorded = [(r["t"], proc.label, r) for proc in lay.run.processes for r in proc.diagnoses]
    if recorded:
        out += ["", "recorded during the run (diagnosis records):"]
        for t, teller, r in sorted(recorded, key=lambda x: x[0]):
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t / 1e9))
            out.append(f"  {when} UTC by {teller}: {r.get('finding')}: {r.get('message')}")
    return [clean(redact_text(text)) for text in out] or ["no verdict: no rank stalled, died or failed"]


def collect_run(path: Path, name: str, bundle: Bundle) -> dict[str, Any]:
    """Add one run's members under ``name/``; return what SUMMARY.md says about it."""
    run = open_run(path)
    lay = layout(run, run_end(run))
    found = findings(run, lay.end, gone=gone_ranks(run))
    verdicts = by_process(run, found)
    for file in _files(path, JOURNAL_DIR, ".jsonl", bundle):
        bundle.add(f"{name}/{JOURNAL_DIR}/{file.name}", copy_journal(file, bundle))
    for file in _files(path, STATUS_DIR, ".json", bundle):
        data = _read(file, bundle, MAX_STATUS)
        if data is not None:
            bundle.add(f"{name}/{STATUS_DIR}/{file.name}", _redact_json_file(data))
    for file in _files(path, STACKS_DIR, ".txt", bundle):
        data = _read(file, bundle, MAX_STACK, tail=True)
        if data is not None:
            bundle.add(f"{name}/{STACKS_DIR}/{file.name}", redact_text(data.decode("utf-8", "replace"), limit=None))
    timeline = "\n".join(clean(t.plain).rstrip() for t in render_timeline(lay, width=160, depth=2))
    bundle.add(f"{name}/timeline.txt", redact_text(timeline, limit=None) + "\n")
    bundle.add(f"{name}/report.html", redact_text(render_report(lay, found, verdicts), limit=None))
    diagnosis = diagnosis_text(lay, found)
    bundle.add(f"{name}/diagnosis.txt", "\n".join(diagnosis) + "\n")
    args = server_args(run)
    if args:
        bundle.add(f"{name}/server-args.json", redact_text(json.dumps(args, indent=1, default=str), limit=None) + "\n")
    bundle.add(f"{name}/phases.md", phase_table(lay, verdicts, None))
    if run.problems:
        bundle.add(f"{name}/journal-problems.txt", "\n".join(redact_text(clean(p)) for p in run.problems) + "\n")
    versions = sorted(
        {str(p.resource.get("sglang.version")) for p in run.processes if p.resource.get("sglang.version")}
    )
    return {
        "name": name,
        "headline": clean(redact_text(headline(lay, found)[1])),
        "diagnosis": diagnosis,
        "table": phase_table(lay, verdicts, TABLE_RANKS),
        "sglang": versions,
        "hosts": sorted({p.host for p in run.processes}),
        "processes": len(run.processes),
        "ranks": len(rank_lanes(lay)),
        "problems": len(run.problems),
    }


def run_end(run: RunView) -> int:
    """The run's horizon: its last record (an old run is judged as it ended, not as of today)."""
    return max((p.last_t for p in run.processes), default=time.time_ns())
