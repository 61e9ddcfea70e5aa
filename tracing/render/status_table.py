"""The live per-rank status: where each process is, for how long, how alive, and the verdict.

Figures come from the journal (phase, time in phase) and the latest heartbeat (age, progress,
CPU, memory, GPU, collective). A field the heartbeat does not carry is left blank, never guessed.
Every cell and line is shown through ``term.text``: journals and status files are untrusted input.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from rich.cells import cell_len
from rich.console import Group
from rich.text import Text

from ..verdicts.diagnose import Finding
from .lanes import DONE, Lane, Layout, unreadable_text
from .term import clean, text
from .units import duration, size
from .verdict import state as verdict_state


@dataclass
class StatusRow:
    label: str
    pid: int
    host: str
    # ready | serving | ended | running | failed | incomplete | exited | gone | unreadable | stalled | died |
    # not started | busy | slow
    state: str
    phase: str | None
    in_phase_s: float | None
    heartbeat_age_s: float | None
    progress: str
    cpu_pct: float | None
    rss: int | None
    threads: int | None
    gpu: str
    collective: str
    verdict: str
    node: int | None = None  # the node of a multi-node launch (the label names it too)
    usual: str = ""  # how long its phase took in earlier starts of the launch (``verdicts.usual.short``)
    waits_on: str = ""  # what an idle or named rank waits on, as the OS shows it (``verdicts.evidence``)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def latest_heartbeat(lay: Layout, lane: Lane) -> dict[str, Any] | None:
    """The newer of the status file and the journal's last heartbeat."""
    beats = [b for b in (lay.run.status_file(lane.proc), lane.proc.last_heartbeat) if isinstance(b, dict)]
    return max(beats, key=lambda b: b.get("t", 0)) if beats else None


def _progress(lane: Lane, beat: dict[str, Any] | None) -> str:
    where = lane.where
    items = [p for p in (beat or {}).get("phases") or [] if isinstance(p, dict) and p.get("progress")]
    match = next((p for p in items if where and p.get("span") == where.span.span_id), None)
    progress = (match or (items[-1] if items else {})).get("progress")
    if not progress and where is not None:  # the latest event that counts (e.g. shards loaded)
        progress = next((e["attrs"] for e in reversed(where.span.events) if "done" in e.get("attrs", {})), None)
    if not isinstance(progress, dict) or "done" not in progress:
        return ""
    done, total, unit = progress.get("done"), progress.get("total"), progress.get("unit", "")
    text = f"{done}/{total}" if total else f"{done}"
    if isinstance(done, (int, float)) and isinstance(total, (int, float)) and total:
        text += f" ({100 * done / total:.0f}%)"
    return f"{text} {unit}".strip()


def _gpu(beat: dict[str, Any] | None) -> str:
    g = (beat or {}).get("gpu")
    if not isinstance(g, dict):
        return ""
    parts = []
    if g.get("util") is not None:
        parts.append(f"{g['util']}%")
    if g.get("mem_used") is not None:
        parts.append(size(g["mem_used"]))
    if g.get("power_w") is not None:
        parts.append(f"{g['power_w']:.0f} W")
    if g.get("sm_clock_mhz") is not None:
        parts.append(f"{g['sm_clock_mhz']} MHz")
    return " ".join(parts)


def _collective(beat: dict[str, Any] | None) -> str:
    c = (beat or {}).get("collective")
    if not isinstance(c, dict):
        return ""
    text = " ".join(str(c[k]) for k in ("op", "group") if c.get(k) is not None)
    if c.get("seq") is not None:
        text += f" #{c['seq']}"
    if c.get("since_s") is not None:
        text += f" {duration(c['since_s'])}"
    return text


def status_rows(
    lay: Layout,
    now: int,
    verdicts: dict[int, Finding],
    alive: dict[tuple[str, int], bool] | None = None,
) -> list[StatusRow]:
    """``alive``: (host, pid) -> still running, for the processes of this host. ``verdicts`` are by
    pid: where two hosts' processes share one, a verdict goes to the process its label names."""
    rows = []
    pids = Counter(lane.proc.pid for lane in lay.lanes)
    for lane in lay.lanes:
        proc = lane.proc
        beat = latest_heartbeat(lay, lane)
        where = lane.where
        state = lane.state
        running = alive is None or alive.get((proc.host, proc.pid), True)
        if state in ("running", "initialised") and not running:
            state = "gone"
        finding = verdicts.get(proc.pid)
        if finding is not None and pids[proc.pid] > 1 and finding.label and finding.label != proc.label:
            finding = None
        if finding is not None:
            state = verdict_state(finding)
        told = f"{finding.kind}: {finding.message}" if finding is not None else ""
        if proc.unreadable is not None and finding is None:
            told = unreadable_text(proc)
        cpu = beat.get("cpu_s") if beat else None
        interval = beat.get("interval_s") if beat else None
        rows.append(
            StatusRow(
                label=lane.label,
                pid=proc.pid,
                host=proc.host,
                state=state,
                phase=where.key if where is not None and state not in DONE else None,
                in_phase_s=max(  # never negative: another host's clock may be ahead of ours
                    0.0,
                    ((proc.last_t if state in ("gone", "died", "failed") or not running else now) - where.span.start)
                    / 1e9,
                )
                if where is not None and where.open
                else None,
                heartbeat_age_s=max(0.0, (now - beat["t"]) / 1e9) if beat and isinstance(beat.get("t"), int) else None,
                progress=_progress(lane, beat),
                cpu_pct=round(100 * cpu / interval, 1) if isinstance(cpu, (int, float)) and interval else None,
                rss=beat.get("rss") if beat else None,
                threads=beat.get("threads") if beat else None,
                gpu=_gpu(beat),
                collective=_collective(beat),
                verdict=told,
                node=proc.node,
            )
        )
    return rows


STATE_STYLE = {
    "ready": "green",
    "serving": "bold green",
    "initialised": "cyan",
    "running": "",
    "stalled": "bold red",
    "failed": "bold red",
    "died": "bold red",
    "not started": "bold red",
    "incomplete": "red",
    "unreadable": "red",
    "ended": "",
    "gone": "red",
    "exited": "yellow",
    "busy": "yellow",
    "slow": "yellow",
    "unusual": "yellow",
}


COLUMNS = (
    "rank",
    "pid",
    "state",
    "phase",
    "in phase",
    "usually",
    "heartbeat",
    "progress",
    "cpu",
    "rss",
    "threads",
    "gpu",
    "collective",
    "waits on",
)
WAITS_SHOWN = 100  # characters of "waits on" in the table (the JSON and the verdict lines have it whole)
RIGHT = {"pid", "in phase", "heartbeat", "cpu", "rss", "threads"}


def _cells(r: StatusRow) -> tuple[str, ...]:
    return (
        r.label,
        str(r.pid),
        r.state,
        r.phase or "",
        duration(r.in_phase_s),
        r.usual,
        f"{duration(r.heartbeat_age_s)} ago" if r.heartbeat_age_s is not None else "",
        r.progress,
        f"{r.cpu_pct:.0f}%" if r.cpu_pct is not None else "",
        size(r.rss),
        str(r.threads) if r.threads is not None else "",
        r.gpu,
        r.collective,
        r.waits_on if len(r.waits_on) <= WAITS_SHOWN else r.waits_on[: WAITS_SHOWN - 1] + "…",
    )


def status_table(rows: list[StatusRow], title: str) -> Group:
    """Columns no row has a value for (e.g. gpu on a CPU run) are left out. Drawn as rich's ``Table``
    draws ``box.SIMPLE_HEAD`` without edge padding (the same text), one ``Text`` per line: the
    ``Table`` itself measured and rendered a 1024-row table in 0.7 s."""
    cells = [tuple(map(clean, _cells(r))) for r in rows]
    keep = [i for i in range(len(COLUMNS)) if i < 3 or any(c[i] for c in cells)]
    widths = {i: max([cell_len(COLUMNS[i])] + [cell_len(c[i]) for c in cells]) for i in keep}

    def line(values: tuple[str, ...], style: Callable[[int], str]) -> Text:
        out = Text(" ")
        for n, i in enumerate(keep):
            value = values[i]
            gap = " " * (widths[i] - cell_len(value))
            out.append(gap + value if COLUMNS[i] in RIGHT else value + gap, style=style(i))
            out.append("   " if n < len(keep) - 1 else " ")
        return out

    inner = sum(widths.values()) + 3 * (len(keep) - 1)
    lines = [text(title, style="italic"), Text(" " * (inner + 2))]
    lines.append(line(COLUMNS, lambda i: "bold"))
    lines.append(Text(f" {'─' * inner} "))
    for r, row in zip(rows, cells, strict=True):
        state_style = STATE_STYLE.get(r.state, "")
        lines.append(line(row, lambda i, s=state_style: s if i == 2 else ""))
    lines.append(Text(" " * (inner + 2)))
    return Group(*lines)


def verdict_lines(rows: list[StatusRow]) -> list[Text]:
    """The full stall verdicts, one line per rank, under the table."""
    return [text(f"{r.label}: {r.verdict}", style="red") for r in rows if r.verdict]
